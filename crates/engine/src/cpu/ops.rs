//! Dense CPU primitives (spec §3): dot products, linear layers, RMSNorm, activations.
//!
//! Every reduction accumulates in f64 in a fixed order: four interleaved partial sums over the
//! input index, combined as `(s0 + s1) + (s2 + s3)`. Work is split across threads only along
//! independent outputs, never inside a sum, so results are bitwise identical for any thread count.

use crate::weights::Matrix;
use rayon::prelude::*;

/// `Σ_i a[i]·b[i]` in f64 with the fixed four-lane order described in the module docs.
/// `a` and `b` must have the same length (checked in debug builds; callers pass equal slices).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let mut s = [0f64; 4];
    let chunks = n / 4;
    for k in 0..chunks {
        let i = 4 * k;
        s[0] += a[i] as f64 * b[i] as f64;
        s[1] += a[i + 1] as f64 * b[i + 1] as f64;
        s[2] += a[i + 2] as f64 * b[i + 2] as f64;
        s[3] += a[i + 3] as f64 * b[i + 3] as f64;
    }
    for i in 4 * chunks..n {
        s[i - 4 * chunks] += a[i] as f64 * b[i] as f64;
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// `y[t, o] = Σ_i x[t, i] · w[o, i]` for `x` = `[t, w.cols]` row-major; returns `[t, w.rows]` f32.
///
/// Parallel over outputs; each output is one [`dot`], so the result does not depend on threading.
pub fn linear(x: &[f32], w: &Matrix) -> Vec<f32> {
    linear_rows(x, w.cols, &w.data, w.rows)
}

/// [`linear`] on a raw `[rows, cols]` weight slice.
pub fn linear_rows(x: &[f32], cols: usize, w: &[f32], rows: usize) -> Vec<f32> {
    assert!(cols > 0 && x.len().is_multiple_of(cols) && w.len() == rows * cols, "linear: shape mismatch");
    let t = x.len() / cols;
    let mut y = vec![0f32; t * rows];
    if t * rows * cols < 1 << 16 {
        for (ti, yr) in y.chunks_mut(rows).enumerate() {
            let xr = &x[ti * cols..(ti + 1) * cols];
            for (o, v) in yr.iter_mut().enumerate() {
                *v = dot(xr, &w[o * cols..(o + 1) * cols]) as f32;
            }
        }
        return y;
    }
    // Split along the weight rows for reuse of each row across tokens.
    const ROW_BLOCK: usize = 16;
    let blocks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(ROW_BLOCK))
        .into_par_iter()
        .map(|b| {
            let r0 = b * ROW_BLOCK;
            let r1 = (r0 + ROW_BLOCK).min(rows);
            let mut out = vec![0f32; t * (r1 - r0)];
            for ti in 0..t {
                let xr = &x[ti * cols..(ti + 1) * cols];
                for o in r0..r1 {
                    out[ti * (r1 - r0) + (o - r0)] = dot(xr, &w[o * cols..(o + 1) * cols]) as f32;
                }
            }
            (r0, out)
        })
        .collect();
    for (r0, out) in blocks {
        let width = out.len() / t.max(1);
        for ti in 0..t {
            y[ti * rows + r0..ti * rows + r0 + width].copy_from_slice(&out[ti * width..(ti + 1) * width]);
        }
    }
    y
}

/// Weighted RMSNorm of each `weight.len()`-wide row of `x`, in place (spec §3.1):
/// `x ← γ ⊙ x / sqrt(mean(x²) + eps)`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f64) {
    let n = weight.len();
    for row in x.chunks_mut(n) {
        let r = rms_factor(row, eps);
        for (v, g) in row.iter_mut().zip(weight) {
            *v = (*g as f64 * (*v as f64 * r)) as f32;
        }
    }
}

/// Unweighted RMSNorm of each `width`-wide row of `x`, in place (spec §3.1).
pub fn rms_norm_unweighted(x: &mut [f32], width: usize, eps: f64) {
    for row in x.chunks_mut(width) {
        let r = rms_factor(row, eps);
        for v in row.iter_mut() {
            *v = (*v as f64 * r) as f32;
        }
    }
}

/// `(mean(x²) + eps)^(-1/2)` in f64.
pub fn rms_factor(x: &[f32], eps: f64) -> f64 {
    let ms = dot(x, x) / x.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// `σ(x) = 1 / (1 + e^(−x))`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `silu(x) = x·σ(x)` (spec §3.3).
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `softplus(x) = ln(1 + e^x)`, linear above 20 as in torch (spec §3.3).
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_exact_on_small_integers_and_thread_independent() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32 - 2.0).collect();
        let expect: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
        assert_eq!(dot(&a, &b), expect);
        // linear: the parallel path equals the serial formula bit for bit.
        let w = Matrix { rows: 300, cols: 300, data: (0..90000).map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5).collect() };
        let x: Vec<f32> = (0..600).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.0).collect();
        let y = linear(&x, &w);
        for t in 0..2 {
            for o in 0..300 {
                assert_eq!(y[t * 300 + o], dot(&x[t * 300..(t + 1) * 300], w.row(o)) as f32);
            }
        }
    }

    #[test]
    fn rms_norm_matches_formula() {
        let mut x = vec![3.0f32, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let r = 1.0 / (12.5f64).sqrt();
        assert_eq!(x, vec![(3.0 * r) as f32, (8.0 * r) as f32]);
    }

    #[test]
    fn softplus_matches_torch_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f64::consts::LN_2).abs() < 1e-15);
    }
}
