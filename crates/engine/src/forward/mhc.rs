//! Manifold-constrained hyper-connections, spec §4.2 (pre, with Sinkhorn) and §4.3 (post).
//! Source: HF `DeepseekV4HyperConnection`, OFF-K `hc_split_sinkhorn_kernel`.

use crate::cpu::ops::{dot, rms_factor, sigmoid};
use crate::weights::HcWeights;

/// The mixing coefficients of one token for one sub-block.
#[derive(Debug, Clone)]
pub struct HcMix {
    /// `post_j = 2σ(α1·m_post_j + b)`, n entries.
    pub post: Vec<f64>,
    /// Doubly-stochastic `C[j][k]`, row-major n×n.
    pub comb: Vec<f64>,
}

/// mHC pre for one token: from its streams `x` ([n, d] row-major) returns the sub-block input
/// `u = Σ_j pre_j X[j]` ([d], f32) and the post/comb coefficients.
///
/// `eps` is `rms_norm_eps` (the flattened input's RMS factor); `hc_eps` the Sinkhorn/pre eps.
pub fn hc_pre(w: &HcWeights, x: &[f32], n: usize, iters: usize, eps: f64, hc_eps: f64) -> (Vec<f32>, HcMix) {
    let d = x.len() / n;
    // HF normalises the flattened streams first (result in f32), then projects.
    let r = rms_factor(x, eps);
    let normed: Vec<f32> = x.iter().map(|v| (*v as f64 * r) as f32).collect();
    let m: Vec<f64> = (0..w.fn_.rows).map(|i| dot(&normed, w.fn_.row(i))).collect();
    let m: Vec<f64> = m.iter().map(|v| *v as f32 as f64).collect();
    let (a0, a1, a2) = (w.scale[0] as f64, w.scale[1] as f64, w.scale[2] as f64);
    let b = |i: usize| w.base[i] as f64;
    let pre: Vec<f64> = (0..n).map(|j| sigmoid(m[j] * a0 + b(j)) + hc_eps).collect();
    let post: Vec<f64> = (0..n).map(|j| 2.0 * sigmoid(m[n + j] * a1 + b(n + j))).collect();
    let mut comb = vec![0f64; n * n];
    for j in 0..n {
        let row: Vec<f64> = (0..n).map(|k| m[2 * n + j * n + k] * a2 + b(2 * n + j * n + k)).collect();
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        for k in 0..n {
            comb[j * n + k] = e[k] / s + hc_eps;
        }
    }
    let col_norm = |c: &mut [f64]| {
        for k in 0..n {
            let s: f64 = (0..n).map(|j| c[j * n + k]).sum();
            for j in 0..n {
                c[j * n + k] /= s + hc_eps;
            }
        }
    };
    col_norm(&mut comb);
    for _ in 1..iters {
        for j in 0..n {
            let s: f64 = comb[j * n..(j + 1) * n].iter().sum();
            for k in 0..n {
                comb[j * n + k] /= s + hc_eps;
            }
        }
        col_norm(&mut comb);
    }
    let u: Vec<f32> = (0..d)
        .map(|i| (0..n).map(|j| pre[j] * x[j * d + i] as f64).sum::<f64>() as f32)
        .collect();
    (u, HcMix { post, comb })
}

/// mHC post for one token, in place on its streams `x` ([n, d]):
/// `X'[k] = post_k·y + Σ_j C[j][k]·X[j]` (the sum runs over C's first index).
pub fn hc_post(mix: &HcMix, x: &mut [f32], y: &[f32], n: usize) {
    let d = y.len();
    let old = x.to_vec();
    for k in 0..n {
        for i in 0..d {
            let mut s = mix.post[k] * y[i] as f64;
            for j in 0..n {
                s += mix.comb[j * n + k] * old[j * d + i] as f64;
            }
            x[k * d + i] = s as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Matrix;

    #[test]
    fn sinkhorn_is_doubly_stochastic() {
        let n = 4;
        let d = 8;
        let fn_ = Matrix { rows: 24, cols: n * d, data: (0..24 * n * d).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect() };
        let w = HcWeights { fn_, base: (0..24).map(|i| (i as f32 / 12.0) - 1.0).collect(), scale: vec![1.0, 0.7, 1.3] };
        let x: Vec<f32> = (0..n * d).map(|i| ((i * 13 % 29) as f32 / 7.0) - 2.0).collect();
        let (_, mix) = hc_pre(&w, &x, n, 20, 1e-6, 1e-6);
        for j in 0..n {
            let row: f64 = mix.comb[j * n..(j + 1) * n].iter().sum();
            let col: f64 = (0..n).map(|i| mix.comb[i * n + j]).sum();
            assert!((row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-5, "row {row} col {col}");
        }
        assert!(mix.post.iter().all(|p| *p > 0.0 && *p < 2.0));
    }

    #[test]
    fn post_uses_transposed_comb() {
        // n=2, d=1: X'[k] = post_k y + Σ_j C[j][k] X[j].
        let mix = HcMix { post: vec![1.0, 0.5], comb: vec![0.9, 0.1, 0.2, 0.8] };
        let mut x = vec![10.0f32, 20.0];
        hc_post(&mix, &mut x, &[2.0], 2);
        assert_eq!(x, vec![2.0 + 0.9 * 10.0 + 0.2 * 20.0, 1.0 + 0.1 * 10.0 + 0.8 * 20.0]);
    }
}
