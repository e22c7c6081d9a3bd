//! Lightning indexer (spec §4.10): scores `I_{t,w} = Σ_h ω_{t,h}·ReLU(q^I_{t,h}·K^I_w)` and keeps the
//! top-k visible compressed entries per query. Source: HF `DeepseekV4Indexer`, OFF-M `Indexer`.

use crate::cpu::ops::{dot, linear};
use crate::cpu::rope::Rope;
use crate::forward::Numerics;
use crate::weights::IndexerWeights;
use flashseek_model::quant;

/// Index queries and head weights for a run of tokens.
pub struct IndexQueries {
    /// Indexer heads.
    pub heads: usize,
    /// Indexer head dim.
    pub head_dim: usize,
    /// `[T, heads, head_dim]`, compress-RoPE applied (and the official rotation + FP4 if enabled).
    pub q: Vec<f32>,
    /// `[T, heads]`: `W_iw a_t · heads^{-1/2}`.
    pub weights: Vec<f32>,
}

/// Builds the queries of tokens at positions `pos0..` from `qr` (`[T, q_lora_rank]`, the normed
/// query residual) and `a` (`[T, d]`, the attention input).
pub fn queries(w: &IndexerWeights, qr: &[f32], a: &[f32], pos0: usize, rope: &Rope, num: &Numerics) -> IndexQueries {
    let heads = w.weights_proj.rows;
    let head_dim = w.wq_b.rows / heads;
    let qr_in = num.act_in(qr, w.wq_b.cols);
    let mut q = linear(&qr_in, &w.wq_b);
    for (i, head) in q.chunks_mut(head_dim).enumerate() {
        rope.apply(head, pos0 + i / heads, false);
        if num.indexer_fp4 {
            num.indexer_roundtrip(head);
        }
    }
    let scale = (heads as f64).powf(-0.5);
    let weights = linear(a, &w.weights_proj).iter().map(|v| (*v as f64 * scale) as f32).collect();
    IndexQueries { heads, head_dim, q, weights }
}

/// Official numerics on index keys (spec §10.3), in place on `[N, head_dim]`.
pub fn simulate_keys(keys: &mut [f32], head_dim: usize, num: &Numerics) {
    if num.indexer_fp4 {
        for k in keys.chunks_mut(head_dim) {
            num.indexer_roundtrip(k);
        }
    }
}

/// Score of key `key` (`[head_dim]`) for query token `t`:
/// `Σ_h ω_{t,h} · ReLU(q_{t,h}·k) · head_dim^{-1/2}`, accumulated in f64 over heads in order.
pub fn score(iq: &IndexQueries, t: usize, key: &[f32]) -> f64 {
    let scale = (iq.head_dim as f64).powf(-0.5);
    let mut s = 0f64;
    for h in 0..iq.heads {
        let off = (t * iq.heads + h) * iq.head_dim;
        let qk = (dot(&iq.q[off..off + iq.head_dim], key) as f32).max(0.0) as f64 * scale;
        s += iq.weights[t * iq.heads + h] as f64 * qk;
    }
    s
}

/// The entries query token `t` (absolute position `pos`) attends on a CSA layer of ratio `ratio`
/// with `keys` (`[N, head_dim]`, N entries so far): all visible ones (`w < (pos+1)/ratio`) when
/// there are at most `topk`, else the `topk` best by [`score`] (ties: the lower index wins).
/// Returned in ascending entry order.
pub fn select(iq: &IndexQueries, t: usize, pos: usize, ratio: usize, keys: &[f32], topk: usize) -> Vec<usize> {
    let n = keys.len() / iq.head_dim;
    let visible = ((pos + 1) / ratio).min(n);
    if visible <= topk {
        return (0..visible).collect();
    }
    let mut scored: Vec<(f64, usize)> = (0..visible)
        .map(|w| (score(iq, t, &keys[w * iq.head_dim..(w + 1) * iq.head_dim]), w))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = scored[..topk].iter().map(|s| s.1).collect();
    chosen.sort_unstable();
    chosen
}

/// Convenience for tests and reports: the official rotation + FP4 on one vector (spec §10.3).
pub fn roundtrip(v: &mut [f32]) -> Result<(), quant::QuantError> {
    quant::indexer_hadamard_fp4_roundtrip(v, 32)
}
