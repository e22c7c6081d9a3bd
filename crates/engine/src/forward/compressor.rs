//! KV compressors: HCA (spec §4.8, non-overlapping, ratio m) and CSA (spec §4.9, overlapping
//! width 2m / stride m; also the indexer's key compressor, §4.10 step 1).
//! Source: HF `DeepseekV4HCACompressor` / `DeepseekV4CSACompressor`, OFF-M `Compressor`.

use crate::cpu::ops::{linear, rms_norm};
use crate::cpu::rope::Rope;
use crate::weights::CompressorWeights;

/// Per-token projections of a compressor: `kv = W_kv a_t`, `logit = W_gate a_t + ape[slot]`
/// (the position bias is added in f32, as the reference does), each `[T, out]` where
/// `out = width` (HCA) or `2·width` (CSA: A half = dims 0..width, B half = width..2·width).
pub struct Projected {
    /// `[T, out]` values.
    pub kv: Vec<f32>,
    /// `[T, out]` biased gate logits.
    pub logit: Vec<f32>,
    /// `out`.
    pub out: usize,
}

/// Projects `a` (`[T, d]`, tokens at absolute positions `pos0..pos0+T`) through a compressor.
/// The slot of a token (its index inside its window) is `pos mod ratio`.
pub fn project(w: &CompressorWeights, a: &[f32], pos0: usize) -> Projected {
    let out = w.wkv.rows;
    let ratio = w.ape.rows;
    let kv = linear(a, &w.wkv);
    let mut logit = linear(a, &w.wgate);
    for (t, row) in logit.chunks_mut(out).enumerate() {
        let bias = w.ape.row((pos0 + t) % ratio);
        for (g, b) in row.iter_mut().zip(bias) {
            *g += *b;
        }
    }
    Projected { kv, logit, out }
}

/// Pools one compressed entry from its slots, per channel: `Σ_i softmax_i(logit_i)·kv_i` over
/// the given `(kv, logit)` rows (each `width` long), then RMSNorm and RoPE at `pos` (the first
/// token of the window: `entry_index · ratio`). Returns the `[width]` entry.
pub fn pool(slots: &[(&[f32], &[f32])], norm: &[f32], eps: f64, rope: &Rope, pos: usize) -> Vec<f32> {
    let width = norm.len();
    let mut out = vec![0f32; width];
    for (ch, o) in out.iter_mut().enumerate() {
        let mx = slots.iter().map(|(_, g)| g[ch] as f64).fold(f64::NEG_INFINITY, f64::max);
        let mut num = 0f64;
        let mut den = 0f64;
        for (kv, g) in slots {
            let e = (g[ch] as f64 - mx).exp();
            num += e * kv[ch] as f64;
            den += e;
        }
        *o = (num / den) as f32;
    }
    rms_norm(&mut out, norm, eps);
    rope.apply(&mut out, pos, false);
    out
}

/// The slots of entry `w` from projected rows (`rows(t)` returns the `(kv, logit)` rows of the
/// token at absolute position `t`): HCA uses the `ratio` tokens of window `w`; CSA uses the A halves
/// of window `w−1` (absent for `w = 0`) and the B halves of window `w`.
pub fn window_slots<'a>(
    w: usize,
    ratio: usize,
    width: usize,
    overlap: bool,
    rows: impl Fn(usize) -> (&'a [f32], &'a [f32]),
) -> Vec<(&'a [f32], &'a [f32])> {
    let mut slots = Vec::with_capacity(2 * ratio);
    if overlap {
        if w > 0 {
            for i in 0..ratio {
                let (kv, g) = rows((w - 1) * ratio + i);
                slots.push((&kv[..width], &g[..width]));
            }
        }
        for i in 0..ratio {
            let (kv, g) = rows(w * ratio + i);
            slots.push((&kv[width..2 * width], &g[width..2 * width]));
        }
    } else {
        for i in 0..ratio {
            slots.push(rows(w * ratio + i));
        }
    }
    slots
}
