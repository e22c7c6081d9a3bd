//! Final head (spec §4.12): hyper-head collapse of the streams (no Sinkhorn), final RMSNorm, LM head.
//! Source: HF `DeepseekV4HyperHead` + `norm` + `lm_head`, OFF-M `ParallelHead`.

use crate::cpu::ops::{dot, linear, rms_factor, rms_norm, sigmoid};
use crate::weights::ModelWeights;

/// Collapses one token's streams `x` (`[n, d]`) to `h = Σ_j π_j X[j]`,
/// `π = σ(α·(Φ_head · x̄/rms) + b) + hc_eps`, then RMSNorm(norm). Returns `[d]`.
pub fn collapse(w: &ModelWeights, x: &[f32]) -> Vec<f32> {
    let c = &w.config;
    let n = c.hc_mult;
    let d = c.hidden_size;
    let r = rms_factor(x, c.rms_norm_eps);
    let normed: Vec<f32> = x.iter().map(|v| (*v as f64 * r) as f32).collect();
    let alpha = w.hc_head_scale[0] as f64;
    let pi: Vec<f64> = (0..n)
        .map(|j| {
            let m = dot(&normed, w.hc_head_fn.row(j)) as f32 as f64;
            sigmoid(m * alpha + w.hc_head_base[j] as f64) + c.hc_eps
        })
        .collect();
    let mut h: Vec<f32> = (0..d).map(|i| (0..n).map(|j| pi[j] * x[j * d + i] as f64).sum::<f64>() as f32).collect();
    rms_norm(&mut h, &w.norm, c.rms_norm_eps);
    h
}

/// Logits `[T, vocab]` of collapsed hidden states `h` (`[T, d]`).
pub fn logits(w: &ModelWeights, h: &[f32]) -> Vec<f32> {
    linear(h, &w.head)
}
