//! gpu-check entries for sampling on the device (issue 5 §3, switch `SAMPLE_ON_DEVICE`):
//!
//! - `logits_top k=…`: [`Gpu::logits_top`] against [`TopLogits::from_row`] on vocabulary-sized rows
//!   with many ties, masked tokens, both zeros, a NaN / `+inf` row and an all-masked row: the same
//!   unmasked count, the same first non-finite index, the same candidates (ids and value bits) in the
//!   same order. Exact by design (integer radix select under the sampler's total order).
//! - `generate on-device sampling …` ([`generate_checks`]): whole generations through
//!   [`generate`] on a GPU session give the same tokens with the switch on and off, for greedy and
//!   seeded top-k / top-p / min-p sampling (the sampler's own test shows the same equality on the
//!   CPU, `sampler::tests::top_logits_sample_like_the_full_row`).

use super::check::{flag_record, switch_scope};
use super::gpu::Gpu;
use super::model::GpuModel;
use super::session::GpuSession;
use super::CudaError;
use crate::generate::generate;
use crate::sampler::{Sampler, SamplingParams, TopLogits};
use crate::testing::formula_ids;
use serde_json::{json, Value};
use std::ops::ControlFlow;

/// Rows of `vocab` logits: quantized values (many ties), masked entries and signed zeros; row 1
/// has NaN and `+inf`, row 2 is entirely masked, row 3 has only three unmasked tokens.
fn rows(seed: u64, vocab: usize) -> Vec<Vec<f32>> {
    let base = super::check::random(seed, "sample.rows", 4 * vocab, 6.0);
    let mut rows: Vec<Vec<f32>> = base
        .chunks(vocab)
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(i, &v)| match i % 23 {
                    0 => f32::NEG_INFINITY,
                    1 => -0.0,
                    2 => 0.0,
                    _ => (v * 8.0).round() / 8.0,
                })
                .collect()
        })
        .collect();
    rows[1][77] = f32::NAN;
    rows[1][5000] = f32::INFINITY;
    rows[2].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
    rows[3].iter_mut().enumerate().for_each(|(i, v)| {
        if ![9usize, 4000, 100_000].contains(&i) {
            *v = f32::NEG_INFINITY
        }
    });
    rows
}

/// The device's top-k selection against the host reference.
pub fn run(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let vocab = 129_280;
    let rows = rows(seed, vocab);
    let flat: Vec<f32> = rows.concat();
    let dev = gpu.upload(&flat)?;
    let mut all = true;
    for k in [1usize, 40, 1024] {
        let got = gpu.logits_top(&dev, rows.len(), vocab, k)?;
        let mut differing = Vec::new();
        for (r, (g, row)) in got.iter().zip(&rows).enumerate() {
            let want = TopLogits::from_row(row, k);
            let same_cand = g.cand.len() == want.cand.len() && g.cand.iter().zip(&want.cand).all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
            let same = g.vocab == want.vocab && g.unmasked == want.unmasked && g.non_finite.map(|x| x.0) == want.non_finite.map(|x| x.0) && same_cand;
            if !same {
                differing.push(r);
            }
        }
        all &= flag_record(out, &format!("logits_top k={k}"), json!({"rows": rows.len(), "vocab": vocab, "differing_rows": differing}), differing.is_empty());
    }
    Ok(all)
}

/// Generations on a GPU session of `gm` with `SAMPLE_ON_DEVICE` on and off: the same tokens for
/// greedy and for seeded sampling with top-k (plus top-p, min-p).
pub fn generate_checks(gpu: &Gpu, gm: &GpuModel, seed: u64, name: &str, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let vocab = gm.config.vocab_size;
    let prompt = formula_ids(seed + 21, 9, vocab);
    let steps = 24;
    let params = [
        ("greedy", SamplingParams::greedy()),
        ("top_k 40, top_p 0.9, T 0.8", SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, seed: Some(5), ..SamplingParams::default() }),
        ("top_k 3, min_p 0.1, T 1.3", SamplingParams { temperature: 1.3, top_k: 3, min_p: 0.1, seed: Some(6), ..SamplingParams::default() }),
    ];
    let bad = |e: String| CudaError::Unsupported { what: "generate check", detail: e };
    let mut all = true;
    for (label, p) in params {
        let mut runs = Vec::new();
        for on in ["on", "off"] {
            let tokens = switch_scope(&[("SAMPLE_ON_DEVICE", on)], || -> Result<Vec<u32>, CudaError> {
                let mut session = GpuSession::new(gpu, gm, prompt.len() + steps + 1).map_err(|e| bad(e.to_string()))?;
                let mut sampler = Sampler::new(p.clone(), &prompt).map_err(|e| bad(e.to_string()))?;
                let mut toks = Vec::new();
                generate(&mut session, &prompt, &mut sampler, steps, |s| {
                    toks.push(s.token);
                    ControlFlow::Continue(())
                })
                .map_err(|e| bad(e.to_string()))?;
                Ok(toks)
            })?;
            runs.push(tokens);
        }
        let same = runs[0] == runs[1] && runs[0].len() == steps;
        all &= flag_record(out, &format!("generate on-device sampling {name} {label}"), json!({"steps": steps, "tokens_equal": same, "tokens": runs[0]}), same);
    }
    Ok(all)
}
