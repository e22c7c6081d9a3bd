//! Attention of one layer (spec §4.5–§4.7): low-rank query with per-head unweighted RMSNorm, the
//! single shared K=V head, partial interleaved RoPE, window + compressed keys under one softmax with
//! a per-head sink, inverse RoPE on the output, grouped low-rank output projection.
//! Source: HF `DeepseekV4Attention` + `eager_attention_forward`, OFF-M `Attention`.

use crate::cpu::ops::{dot, linear, linear_rows, rms_norm, rms_norm_unweighted};
use crate::cpu::rope::Rope;
use crate::forward::Numerics;
use crate::weights::LayerWeights;
use flashseek_model::config::Ds4Config;
use rayon::prelude::*;

/// Query-side projections of a run of tokens.
pub struct QueryProj {
    /// `qr = RMSNorm(W_qa a; q_norm)`, `[T, q_lora_rank]` (also the indexer's input).
    pub qr: Vec<f32>,
    /// `[T, H, c]`, per-head normed and rotated.
    pub q: Vec<f32>,
}

/// Projects queries for tokens at positions `pos0..` (spec §4.5).
pub fn project_queries(cfg: &Ds4Config, lw: &LayerWeights, a: &[f32], pos0: usize, rope: &Rope, num: &Numerics) -> QueryProj {
    let c = cfg.head_dim;
    let h = cfg.num_attention_heads;
    let mut qr = linear(&num.act_in(a, lw.wq_a.cols), &lw.wq_a);
    rms_norm(&mut qr, &lw.q_norm, cfg.rms_norm_eps);
    let mut q = linear(&num.act_in(&qr, lw.wq_b.cols), &lw.wq_b);
    rms_norm_unweighted(&mut q, c, cfg.rms_norm_eps);
    for (i, head) in q.chunks_mut(c).enumerate() {
        rope.apply(head, pos0 + i / h, false);
    }
    QueryProj { qr, q }
}

/// The raw K=V rows of tokens at positions `pos0..` (spec §4.5): `RoPE(RMSNorm(W_kv a; kv_norm))`,
/// then the official FP8 round trip of the nope dims if enabled. `[T, c]`.
pub fn project_kv(cfg: &Ds4Config, lw: &LayerWeights, a: &[f32], pos0: usize, rope: &Rope, num: &Numerics) -> Vec<f32> {
    let c = cfg.head_dim;
    let mut kv = linear(&num.act_in(a, lw.wkv.cols), &lw.wkv);
    rms_norm(&mut kv, &lw.kv_norm, cfg.rms_norm_eps);
    for (i, row) in kv.chunks_mut(c).enumerate() {
        rope.apply(row, pos0 + i, false);
        num.kv_roundtrip(row, cfg.nope_head_dim());
    }
    kv
}

/// Attention of one query token over its candidate keys (spec §4.6), all heads, followed by the
/// inverse RoPE at the query position. `q` is `[H, c]`; `keys` the candidate K=V rows (each `[c]`),
/// window rows first then compressed rows. Returns `[H, c]`.
pub fn attend(q: &[f32], keys: &[&[f32]], sinks: &[f32], c: usize, rope: &Rope, pos: usize) -> Vec<f32> {
    let h = sinks.len();
    let scale = (c as f64).powf(-0.5);
    let mut out = vec![0f32; h * c];
    let mut logits = vec![0f64; keys.len()];
    for head in 0..h {
        let qh = &q[head * c..(head + 1) * c];
        for (l, k) in logits.iter_mut().zip(keys) {
            *l = dot(qh, k) * scale;
        }
        let sink = sinks[head] as f64;
        let mx = logits.iter().cloned().fold(sink, f64::max);
        let mut den = (sink - mx).exp();
        for l in logits.iter_mut() {
            *l = (*l - mx).exp();
            den += *l;
        }
        let o = &mut out[head * c..(head + 1) * c];
        for (i, ov) in o.iter_mut().enumerate() {
            let mut s = 0f64;
            for (p, k) in logits.iter().zip(keys) {
                s += p * k[i] as f64;
            }
            *ov = (s / den) as f32;
        }
        rope.apply(o, pos, true);
    }
    out
}

/// Grouped low-rank output projection (spec §4.7) of `o` (`[T, H·c]`): group g's heads go through
/// rows `g·r..(g+1)·r` of `wo_a` (block-diagonal), then `wo_b` mixes the `g·r` features. `[T, d]`.
pub fn output_projection(cfg: &Ds4Config, lw: &LayerWeights, o: &[f32], num: &Numerics) -> Vec<f32> {
    let groups = cfg.o_groups;
    let r = cfg.o_lora_rank;
    let gin = lw.wo_a.cols;
    let t = o.len() / (groups * gin);
    let mut z = vec![0f32; t * groups * r];
    let per_group: Vec<Vec<f32>> = (0..groups)
        .into_par_iter()
        .map(|g| {
            let xg: Vec<f32> = (0..t).flat_map(|ti| o[(ti * groups + g) * gin..(ti * groups + g + 1) * gin].iter().copied()).collect();
            linear_rows(&xg, gin, &lw.wo_a.data[g * r * gin..(g + 1) * r * gin], r)
        })
        .collect();
    for (g, zg) in per_group.iter().enumerate() {
        for ti in 0..t {
            z[(ti * groups + g) * r..(ti * groups + g + 1) * r].copy_from_slice(&zg[ti * r..(ti + 1) * r]);
        }
    }
    linear(&num.act_in(&z, lw.wo_b.cols), &lw.wo_b)
}

/// The window of query position `pos`: key positions `[pos+1−window, pos]` clipped at 0.
pub fn window_range(pos: usize, window: usize) -> std::ops::Range<usize> {
    (pos + 1).saturating_sub(window)..pos + 1
}
