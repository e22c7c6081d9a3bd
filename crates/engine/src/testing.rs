//! Deterministic random weights shared with `scripts/make_goldens.py` (`formula_values`,
//! `formula_tid2eid`, `formula_ids`): a counter-based generator keyed by the canonical tensor name,
//! so a model too large to commit is rebuilt here bit for bit from its config and seed.
//!
//! Value of element `i` (0-based) of tensor `name`: `z = splitmix64_finalize(fnv1a64("{seed}:{name}") +
//! (i+1)·0x9E3779B97F4A7C15)`, `u = (2·(z >> 40) + 1)/2^24 − 1 ∈ [−1, 1)`, `v = offset + scale·u`
//! (f64, then rounded to f32), with `(offset, scale)` from [`value_rule`].

use crate::weights::{TensorSource, WeightsError};

/// FNV-1a, 64-bit.
pub fn fnv1a64(text: &str) -> u64 {
    let mut h: u64 = 0xCBF29CE484222325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001B3);
    }
    h
}

/// Element `i` of the uniform stream of `key`, in [−1, 1).
pub fn uniform(key_hash: u64, i: u64) -> f64 {
    let mut z = key_hash.wrapping_add((i + 1).wrapping_mul(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^= z >> 31;
    (2.0 * (z >> 40) as f64 + 1.0) / 16777216.0 - 1.0
}

/// `(offset, scale)` of a canonical tensor's values (mirrors `value_rule` in the script).
pub fn value_rule(name: &str, shape: &[usize]) -> (f64, f64) {
    let fan_in = *shape.last().unwrap_or(&1) as f64;
    if name.ends_with("norm.weight") {
        (1.0, 0.25)
    } else if name.ends_with("attn_sink") {
        (0.0, 2.0)
    } else if name.ends_with(".ape") {
        (0.0, 1.0)
    } else if name.ends_with("_base") {
        (0.0, 0.5)
    } else if name.ends_with("_scale") && shape.len() == 1 {
        (1.0, 0.5)
    } else if name.ends_with("gate.bias") {
        (0.0, 0.1)
    } else if name == "embed.weight" {
        (0.0, 1.0)
    } else {
        (0.0, (3.0 / fan_in).sqrt())
    }
}

/// The values of tensor `name` with `shape` under `seed`.
pub fn formula_values(seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let (off, scale) = value_rule(name, shape);
    let key = fnv1a64(&format!("{seed}:{name}"));
    let n: usize = shape.iter().product();
    use rayon::prelude::*;
    (0..n as u64).into_par_iter().map(|i| (off + scale * uniform(key, i)) as f32).collect()
}

/// A `[vocab, k]` hash-routing table: per row, k distinct experts drawn in order, repeats rejected.
pub fn formula_tid2eid(seed: u64, name: &str, vocab: usize, k: usize, n_experts: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(vocab * k);
    for r in 0..vocab {
        let mut chosen: Vec<i64> = Vec::with_capacity(k);
        let mut j = 0;
        while chosen.len() < k {
            let u = uniform(fnv1a64(&format!("{seed}:{name}:{r}:{j}")), 0);
            let e = (((u + 1.0) * 0.5 * n_experts as f64) as usize % n_experts) as i64;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
            j += 1;
        }
        out.extend(chosen);
    }
    out
}

/// Token ids of golden case `length` (mirrors `formula_ids`).
pub fn formula_ids(seed: u64, length: usize, vocab: usize) -> Vec<u32> {
    let key = fnv1a64(&format!("{seed}:ids:{length}"));
    (0..length as u64).map(|i| (((uniform(key, i) + 1.0) * 0.5 * vocab as f64) as usize % vocab) as u32).collect()
}

/// A [`TensorSource`] that generates every tensor from the formula.
pub struct FormulaSource {
    /// Generator seed.
    pub seed: u64,
    /// Routed experts (for tid2eid).
    pub n_experts: usize,
}

impl TensorSource for FormulaSource {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        Ok(formula_values(self.seed, name, shape))
    }
    fn load_i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightsError> {
        match shape {
            [vocab, k] => Ok(formula_tid2eid(self.seed, name, *vocab, *k, self.n_experts)),
            _ => Err(WeightsError::Value { name: name.into(), msg: format!("expected a 2-D table, asked for {shape:?}") }),
        }
    }
}

/// Normalised mean squared error of `got` against `reference`: Σ(got − ref)² / Σ ref², in f64 (the
/// tests' tolerance measure; an all-zero reference divides by 1e-300).
pub fn nmse(got: &[f32], reference: &[f32]) -> f64 {
    let (num, den) = got.iter().zip(reference).fold((0f64, 0f64), |(n, d), (x, y)| (n + (*x as f64 - *y as f64).powi(2), d + (*y as f64).powi(2)));
    num / den.max(1e-300)
}

/// Index of the largest value (the first on ties; NaN never wins): greedy decoding in the checks.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_range_and_determinism() {
        let k = fnv1a64("1:x");
        for i in 0..1000 {
            let u = uniform(k, i);
            assert!((-1.0..1.0).contains(&u));
            assert_eq!(u, uniform(k, i));
        }
        assert_eq!(fnv1a64(""), 0xCBF29CE484222325);
        assert_eq!(fnv1a64("a"), 0xAF63DC4C8601EC8C);
    }

    #[test]
    fn tid2eid_rows_are_distinct() {
        let t = formula_tid2eid(3, "layers.0.ffn.gate.tid2eid", 50, 4, 6);
        for row in t.chunks(4) {
            let mut r = row.to_vec();
            r.sort();
            r.dedup();
            assert_eq!(r.len(), 4);
            assert!(row.iter().all(|e| (0..6).contains(e)));
        }
    }
}
