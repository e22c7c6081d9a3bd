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

/// Candidates per tile of the GPU's bf16 streaming attention (`ATC_TILE` in attention.cu), whose
/// online softmax [`attend_bf16`] replays.
pub const BF16_ATTENTION_TILE: usize = 32;

/// [`attend`] in DeepSeek's own attention numerics (OFF-K `sparse_attn_kernel`, spec §0; the GPU's
/// `MLA_BF16`, `sparse_attention_wg`), replaying that kernel's arithmetic: `q` and the K=V rows
/// rounded to bf16 (nearest even); per tile of `tile` candidates in order, the logits
/// `l = f32(q·k)·scale` (products of the bf16 values summed in f64, rounded to f32; `scale` =
/// f32(c^−1/2)), the running max `m` (starting at the sink), the rescale `corr = exp(m_old − m_new)`
/// and the weights `p = exp(l − m)` in f32 — `p` rounded to bf16 where it multiplies the rows,
/// unrounded in the denominator, which starts at 1 (the sink's term) — then `o / den` and the
/// inverse RoPE at `pos`. The kernel differs in the order of its f32 sums only (a test tolerance,
/// not bits). Shapes as [`attend`]; `tile` ≥ 1.
pub fn attend_bf16(q: &[f32], keys: &[&[f32]], sinks: &[f32], c: usize, rope: &Rope, pos: usize, tile: usize) -> Vec<f32> {
    use flashseek_model::quant::{bf16_to_f32, f32_to_bf16};
    let b = |x: f32| bf16_to_f32(f32_to_bf16(x));
    let h = sinks.len();
    let scale = (c as f64).powf(-0.5) as f32;
    let kb: Vec<Vec<f32>> = keys.iter().map(|k| k.iter().map(|&x| b(x)).collect()).collect();
    let mut out = vec![0f32; h * c];
    for head in 0..h {
        let qh: Vec<f32> = q[head * c..(head + 1) * c].iter().map(|&x| b(x)).collect();
        let mut m = sinks[head];
        let mut den = 1f64;
        let mut o = vec![0f64; c];
        for chunk in kb.chunks(tile.max(1)) {
            let l: Vec<f32> = chunk.iter().map(|k| (qh.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32) * scale).collect();
            let m_new = l.iter().copied().fold(m, f32::max);
            let corr = if m_new == m { 1f32 } else { (m - m_new).exp() };
            m = m_new;
            den *= corr as f64;
            o.iter_mut().for_each(|v| *v *= corr as f64);
            for (li, k) in l.iter().zip(chunk) {
                let p = (li - m).exp();
                den += p as f64;
                let pb = b(p) as f64;
                for (v, kv) in o.iter_mut().zip(k) {
                    *v += pb * *kv as f64;
                }
            }
        }
        let oh = &mut out[head * c..(head + 1) * c];
        for (d, v) in oh.iter_mut().zip(&o) {
            *d = (v / den) as f32;
        }
        rope.apply(oh, pos, true);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::nmse;
    use flashseek_model::config::RopeParams;

    fn values(seed: u64, n: usize, amp: f32) -> Vec<f32> {
        (0..n as u64).map(|i| crate::testing::uniform(seed, i) as f32 * amp).collect()
    }

    /// One key, one head: `o = bf16(p)·bf16(k) / (exp(sink − m) + p)` with `m = max(sink, l)`, by
    /// hand; and the bf16 numerics stay within bf16 rounding of the exact attention, whatever the
    /// tile (the tile only changes which running max P is rounded against).
    #[test]
    fn bf16_attention_replays_the_kernel_numerics() {
        let c = 64;
        let rope = Rope::new(&RopeParams { theta: 10000.0, yarn: None }, 0);
        let b = |x: f32| flashseek_model::quant::bf16_to_f32(flashseek_model::quant::f32_to_bf16(x));
        let (q, k) = (values(1, c, 1.5), values(2, c, 1.5));
        for sink in [-3.0f32, 0.5, 4.0] {
            let got = attend_bf16(&q, &[&k], &[sink], c, &rope, 7, 32);
            let l = (q.iter().zip(&k).map(|(x, y)| b(*x) as f64 * b(*y) as f64).sum::<f64>() as f32) * (c as f64).powf(-0.5) as f32;
            let m = sink.max(l);
            let p = (l - m).exp();
            let den = (sink - m).exp() as f64 + p as f64;
            let want: Vec<f32> = k.iter().map(|kv| (b(p) as f64 * b(*kv) as f64 / den) as f32).collect();
            assert!(nmse(&got, &want) < 1e-12, "sink {sink}: {}", nmse(&got, &want));
        }
        let (h, n) = (4, 200);
        let q = values(3, h * c, 2.0);
        let rows = values(4, n * c, 2.0);
        let keys: Vec<&[f32]> = rows.chunks(c).collect();
        let sinks = values(5, h, 2.0);
        let exact = attend(&q, &keys, &sinks, c, &rope, 11);
        let tiled = attend_bf16(&q, &keys, &sinks, c, &rope, 11, BF16_ATTENTION_TILE);
        let one = attend_bf16(&q, &keys, &sinks, c, &rope, 11, n);
        let (vs_exact, vs_one) = (nmse(&tiled, &exact), nmse(&tiled, &one));
        println!("bf16 attention: nmse vs exact {vs_exact:.3e}, tile 32 vs one tile {vs_one:.3e}");
        assert!(vs_exact > 1e-9 && vs_exact < 1e-4, "{vs_exact}");
        assert!(vs_one < 1e-4, "{vs_one}");
    }
}
