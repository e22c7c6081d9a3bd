//! Interleaved partial RoPE with optional YaRN (spec §3.2), reproducing transformers'
//! float32 frequency and angle computation (`DeepseekV4RotaryEmbedding`, `_compute_yarn_parameters`)
//! so positions far from zero round the same way as the reference.

use flashseek_model::config::RopeParams;

/// Per-pair inverse frequencies for one rope parameter set.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Rotated dims (the trailing slice of each head), even.
    pub dim: usize,
    inv_freq: Vec<f32>,
    attention_factor: f64,
}

impl Rope {
    /// Builds the `dim/2` inverse frequencies of `params` for `dim` rope dims.
    ///
    /// Plain rope: `f_i = 1 / θ^(2i/dim)`. YaRN: the correction range
    /// `[floor(d·ln(L0/(2π·β_fast))/(2 ln θ)), ceil(d·ln(L0/(2π·β_slow))/(2 ln θ))]`, a linear ramp `r_i`
    /// over it, and `f_i' = (f_i/factor)·r_i + f_i·(1 − r_i)`; all in f32 like transformers.
    pub fn new(params: &RopeParams, dim: usize) -> Self {
        let half = dim / 2;
        let base = params.theta as f32;
        let pos_freqs: Vec<f32> = (0..half).map(|i| base.powf((2 * i) as f32 / dim as f32)).collect();
        let (inv_freq, attention_factor) = match params.yarn {
            None => (pos_freqs.iter().map(|p| 1.0f32 / p).collect(), 1.0),
            Some(y) => {
                let corr = |rot: f64| {
                    (dim as f64 * (y.original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * params.theta.ln())
                };
                let (mut low, mut high) = (corr(y.beta_fast), corr(y.beta_slow));
                if y.truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim as f64 - 1.0);
                if low == high {
                    high += 0.001;
                }
                let factor = y.factor as f32;
                let inv = (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                        let extrap_factor = 1.0 - ramp;
                        let extrap = 1.0f32 / pos_freqs[i];
                        let interp = 1.0f32 / (factor * pos_freqs[i]);
                        interp * (1.0 - extrap_factor) + extrap * extrap_factor
                    })
                    .collect();
                (inv, y.attention_factor)
            }
        };
        Rope { dim, inv_freq, attention_factor }
    }

    /// The inverse frequencies (f32, `dim/2` entries).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Rotates the trailing `self.dim` channels of `head` at position `pos`: pairs `(2i, 2i+1)`,
    /// `x'[2i] = x[2i]cos φ − x[2i+1] sin φ`, `x'[2i+1] = x[2i+1] cos φ + x[2i] sin φ`, with
    /// `φ = pos·f_i` computed in f32. `inverse` uses −φ (spec §4.6 output de-rotation).
    pub fn apply(&self, head: &mut [f32], pos: usize, inverse: bool) {
        let n = head.len();
        let tail = &mut head[n - self.dim..];
        let p = pos as f32;
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = (p * f) as f64;
            let c = (angle.cos() as f32) as f64 * self.attention_factor;
            let mut s = (angle.sin() as f32) as f64 * self.attention_factor;
            if inverse {
                s = -s;
            }
            let (a, b) = (tail[2 * i] as f64, tail[2 * i + 1] as f64);
            tail[2 * i] = (a * c - b * s) as f32;
            tail[2 * i + 1] = (b * c + a * s) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashseek_model::config::Yarn;

    #[test]
    fn flash_yarn_ramp_bounds() {
        // Spec §3.2: with d=64, θ=160000, L0=65536, β 32/1 → low 15, high 25: i ≤ 15 keep f_i,
        // i ≥ 25 become f_i/16.
        let y = Yarn { factor: 16.0, original_max_position_embeddings: 65536.0, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0, truncate: true };
        let r = Rope::new(&RopeParams { theta: 160000.0, yarn: Some(y) }, 64);
        let plain = Rope::new(&RopeParams { theta: 160000.0, yarn: None }, 64);
        for i in 0..32 {
            let (a, b) = (r.inv_freq()[i], plain.inv_freq()[i]);
            if i <= 15 {
                assert_eq!(a, b, "i={i}");
            } else if i >= 25 {
                assert!(((a * 16.0) / b - 1.0).abs() < 1e-6, "i={i}");
            } else {
                assert!(a < b && a > b / 16.0, "i={i}");
            }
        }
    }

    #[test]
    fn rotation_and_inverse() {
        let r = Rope::new(&RopeParams { theta: 10000.0, yarn: None }, 4);
        let mut h = vec![9.0f32, 1.0, 0.0, 0.5, -2.0];
        let orig = h.clone();
        r.apply(&mut h, 7, false);
        assert_eq!(h[0], 9.0); // nope dim untouched
        // pair 0 has f=1: angle 7.
        let (c, s) = ((7f32 as f64).cos(), (7f32 as f64).sin());
        assert!((h[1] as f64 - (c - 0.0 * s)).abs() < 1e-6);
        assert!((h[2] as f64 - (0.0 * c + s)).abs() < 1e-6);
        r.apply(&mut h, 7, true);
        for (a, b) in h.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}
