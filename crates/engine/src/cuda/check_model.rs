//! End-to-end GPU vs CPU parity (issue 5 item 5): on the golden models of
//! `tests/fixtures/goldens` (weights rebuilt from their formula), compare per-layer streams and
//! logits of the one-shot forward, chunked prefill + decode, and greedy generation.

use super::check::{differing_bits, errors, flag_record, record, NMSE_TOL};
use super::gpu::Gpu;
use super::model::{decode_step_gpu, forward_chunk_gpu, GpuModel, GpuSequence};
use super::CudaError;
use crate::forward::{forward, forward_chunk, ForwardOptions, LogitsFor};
use crate::state::SequenceState;
use crate::testing::{argmax, formula_ids, FormulaSource};
use crate::weights::ModelWeights;
use flashseek_model::config::Ds4Config;
use serde_json::{json, Value};
use std::path::Path;


fn top1_agreement(a: &[f32], b: &[f32], vocab: usize) -> f64 {
    let rows = a.len() / vocab;
    let same = (0..rows).filter(|r| argmax(&a[r * vocab..(r + 1) * vocab]) == argmax(&b[r * vocab..(r + 1) * vocab])).count();
    same as f64 / rows.max(1) as f64
}

/// Greedy generation of `steps` tokens after `prompt` on the CPU and on the GPU (both fed the CPU's
/// tokens): whether the chosen tokens are equal, and the worst per-step logits NMSE.
fn greedy_compare(gpu: &Gpu, gm: &GpuModel, w: &ModelWeights, prompt: &[u32], steps: usize) -> Result<(bool, f64), CudaError> {
    let bad = |e: crate::forward::ForwardError| CudaError::Unsupported { what: "greedy check", detail: e.to_string() };
    let opts = ForwardOptions::default();
    let mut cst = SequenceState::new(&w.config, None);
    let mut cl = forward_chunk(w, &mut cst, prompt, LogitsFor::Last, &opts).map_err(bad)?.logits;
    let mut gseq = GpuSequence::new(gpu, gm, prompt.len() + steps + 1)?;
    let mut gl = forward_chunk_gpu(gpu, gm, &mut gseq, prompt, LogitsFor::Last, false)?.logits;
    let mut same = true;
    let mut worst = 0f64;
    for _ in 0..steps {
        let a = argmax(&cl) as u32;
        same &= argmax(&gl) as u32 == a;
        worst = worst.max(errors(&gl, &cl).0);
        cl = forward_chunk(w, &mut cst, &[a], LogitsFor::Last, &opts).map_err(bad)?.logits;
        gl = decode_step_gpu(gpu, gm, &mut gseq, a)?;
    }
    Ok((same, worst))
}

/// Every buffer of a state (K=V rows, compressor rows and entries, layer by layer) in one vector,
/// with its layout (pos, then per buffer its length) for an exact structural comparison.
fn flatten_state(st: &SequenceState) -> (Vec<f32>, Vec<usize>) {
    let mut vals = Vec::new();
    let mut layout = vec![st.pos];
    for l in &st.layers {
        let mut bufs = vec![l.kv.as_slice()];
        for c in [&l.compressor, &l.indexer].into_iter().flatten() {
            bufs.extend([c.kv.as_slice(), c.logit.as_slice(), &c.entries[..]]);
        }
        for b in bufs {
            layout.push(b.len());
            vals.extend_from_slice(b);
        }
    }
    (vals, layout)
}

/// Issue 5 §4, the GPU sequence state against the CPU's (spec §5):
/// - download: the state after a GPU chunked prefill equals the CPU state of the same prefix (same
///   layout exactly, values within [`NMSE_TOL`]);
/// - upload: a CPU state with a small retention limit (rows before its base dropped) continued on
///   the GPU gives the CPU one-shot logits of the rest;
/// - snapshot/restore: a snapshot taken after the prefix, then a truncation and other tokens that
///   overwrite its rows, then restore: the continuation's logits are bitwise those straight after
///   the prefix.
#[allow(clippy::too_many_arguments)]
fn state_checks(gpu: &Gpu, gm: &GpuModel, w: &ModelWeights, ids: &[u32], prefill: usize, seed: u64, name: &str, cpu_logits: &[f32], out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let bad = |e: crate::forward::ForwardError| CudaError::Unsupported { what: "state check", detail: e.to_string() };
    let (len, vocab, opts) = (ids.len(), w.config.vocab_size, ForwardOptions::default());
    let mut all = true;
    // Download.
    let mut cst = SequenceState::new(&w.config, None);
    forward_chunk(w, &mut cst, &ids[..prefill], LogitsFor::None, &opts).map_err(bad)?;
    let mut seq = GpuSequence::new(gpu, gm, len + 1)?;
    for chunk in ids[..prefill].chunks(7) {
        forward_chunk_gpu(gpu, gm, &mut seq, chunk, LogitsFor::None, false)?;
    }
    let (gv, glayout) = flatten_state(&seq.to_host(gpu, gm)?);
    let (cv, clayout) = flatten_state(&cst);
    all &= flag_record(out, &format!("model {name} state layout"), json!({"prefix": prefill, "buffers": clayout.len() - 1}), glayout == clayout);
    all &= record(out, &format!("model {name} state download"), json!({"prefix": prefill, "values": cv.len()}), &gv, &cv);
    // Upload of a retention-trimmed CPU state, continued on the GPU.
    let retention = 3;
    let mut rst = SequenceState::new(&w.config, Some(retention));
    forward_chunk(w, &mut rst, &ids[..prefill], LogitsFor::None, &opts).map_err(bad)?;
    let mut useq = GpuSequence::from_host(gpu, gm, &rst, len + 1)?;
    let mut got = Vec::new();
    for id in &ids[prefill..] {
        got.extend(decode_step_gpu(gpu, gm, &mut useq, *id)?);
    }
    all &= record(out, &format!("model {name} state upload"), json!({"prefix": prefill, "retention": retention, "decoded": len - prefill}), &got, &cpu_logits[prefill * vocab..]);
    // Fork (the server's prefix sharing, GpuBackend::fork_sequence): a prefix copied into a new
    // sequence, truncated to its first half and continued gives the CPU's one-shot logits; the
    // source is left as it was.
    let mut src = GpuSequence::new(gpu, gm, len + 1)?;
    forward_chunk_gpu(gpu, gm, &mut src, &ids[..prefill], LogitsFor::None, false)?;
    let half = prefill / 2;
    let mut fork = GpuSequence::new(gpu, gm, len + 1)?;
    fork.restore(gpu, gm, &src)?;
    fork.truncate(gm, half)?;
    let got = forward_chunk_gpu(gpu, gm, &mut fork, &ids[half..], LogitsFor::All, false)?.logits;
    all &= record(out, &format!("model {name} fork"), json!({"prefix": prefill, "forked_at": half}), &got, &cpu_logits[half * vocab..]);
    let rest = forward_chunk_gpu(gpu, gm, &mut src, &ids[prefill..], LogitsFor::All, false)?.logits;
    all &= record(out, &format!("model {name} fork source"), json!({"prefix": prefill}), &rest, &cpu_logits[prefill * vocab..]);
    // Snapshot, overwrite, restore.
    let mut seq = GpuSequence::new(gpu, gm, 2 * len + 1)?;
    forward_chunk_gpu(gpu, gm, &mut seq, &ids[..prefill], LogitsFor::None, false)?;
    let snap = seq.snapshot(gpu, gm)?;
    let decode_rest = |seq: &mut GpuSequence| -> Result<Vec<f32>, CudaError> {
        let mut v = Vec::new();
        for id in &ids[prefill..] {
            v.extend(decode_step_gpu(gpu, gm, seq, *id)?);
        }
        Ok(v)
    };
    let first = decode_rest(&mut seq)?;
    seq.truncate(gm, prefill / 2)?;
    forward_chunk_gpu(gpu, gm, &mut seq, &formula_ids(seed + 11, prefill + 5, vocab), LogitsFor::None, false)?;
    seq.restore(gpu, gm, &snap)?;
    let again = decode_rest(&mut seq)?;
    let differing = differing_bits(&first, &again);
    all &= flag_record(
        out,
        &format!("model {name} snapshot/restore"),
        json!({"prefix": prefill, "overwritten_from": prefill / 2, "decoded": len - prefill, "differing_logits": differing}),
        differing == 0 && !first.is_empty(),
    );
    Ok(all)
}

/// Runs the model-level checks on every golden under `goldens` (each `NAME/model/config.json` and
/// `NAME/meta.json` with its seed). `steps` greedy tokens are compared on models with a vocabulary
/// below 100k.
pub fn run(gpu: &Gpu, goldens: &Path, steps: usize, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let mut names: Vec<_> = std::fs::read_dir(goldens)
        .map_err(|e| CudaError::Unsupported { what: "goldens", detail: format!("{}: {e}", goldens.display()) })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    names.sort();
    for dir in names {
        let name = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let bad = |e: String| CudaError::Unsupported { what: "goldens", detail: format!("{name}: {e}") };
        let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
        let seed = meta["seed"].as_u64().ok_or_else(|| bad("meta.json has no seed".into()))?;
        let cfg = Ds4Config::from_file(&dir.join("model")).map_err(|e| bad(e.to_string()))?;
        let w = ModelWeights::load(&cfg, &FormulaSource { seed, n_experts: cfg.n_routed_experts }).map_err(|e| bad(e.to_string()))?;
        let fsrc = FormulaSource { seed, n_experts: cfg.n_routed_experts };
        let gm = GpuModel::upload_with(gpu, &cfg, &super::upload::F32Source(&fsrc))?;
        let vocab = cfg.vocab_size;
        let len = meta["lengths"].as_array().and_then(|l| l.iter().filter_map(|v| v.as_u64()).max()).unwrap_or(16) as usize;
        let ids = formula_ids(seed, len, vocab);
        // One-shot: per-layer streams and logits.
        let cpu = forward(&w, &ids, &ForwardOptions { record_streams: true, ..Default::default() }).map_err(|e| bad(e.to_string()))?;
        let mut seq = GpuSequence::new(gpu, &gm, len + steps + 1)?;
        let g = forward_chunk_gpu(gpu, &gm, &mut seq, &ids, LogitsFor::All, true)?;
        for (l, (a, b)) in g.layer_streams.iter().zip(&cpu.layer_streams).enumerate() {
            all &= record(out, &format!("model {name} layer {l} streams"), json!([len]), a, b);
        }
        all &= record(out, &format!("model {name} logits"), json!([len, vocab]), &g.logits, &cpu.logits);
        let agree = top1_agreement(&g.logits, &cpu.logits, vocab);
        all &= flag_record(out, &format!("model {name} top-1"), json!({"agreement": agree, "positions": len}), agree >= 0.99);
        // Chunked prefill (chunk 7) then decode, against the CPU one-shot logits.
        let prefill = (len * 2 / 3).max(1);
        let mut seq = GpuSequence::new(gpu, &gm, len + 1)?;
        let mut got = Vec::new();
        for chunk in ids[..prefill].chunks(7) {
            got.extend(forward_chunk_gpu(gpu, &gm, &mut seq, chunk, LogitsFor::All, false)?.logits);
        }
        for id in &ids[prefill..] {
            got.extend(decode_step_gpu(gpu, &gm, &mut seq, *id)?);
        }
        all &= record(out, &format!("model {name} chunked+decode"), json!({"len": len, "chunk": 7, "prefill": prefill}), &got, &cpu.logits);
        // Truncate and continue equals a fresh prefix.
        let cut = prefill / 2;
        seq.truncate(&gm, cut)?;
        let tail = formula_ids(seed + 7, 9, vocab);
        let gt = forward_chunk_gpu(gpu, &gm, &mut seq, &tail, LogitsFor::All, false)?.logits;
        let mut fresh = ids[..cut].to_vec();
        fresh.extend(&tail);
        let ct = forward(&w, &fresh, &ForwardOptions::default()).map_err(|e| bad(e.to_string()))?.logits;
        all &= record(out, &format!("model {name} truncate"), json!({"cut": cut, "tail": 9}), &gt, &ct[cut * vocab..]);
        all &= state_checks(gpu, &gm, &w, &ids, prefill, seed, &name, &cpu.logits, out)?;
        all &= super::check_sample::generate_checks(gpu, &gm, seed, &name, out)?;
        all &= super::check_graph::graph_checks(gpu, &gm, seed, &name, prefill, 24, out)?;
        // Greedy generation: same tokens as the CPU.
        if vocab < 100_000 && steps > 0 {
            let (same, worst) = greedy_compare(gpu, &gm, &w, &formula_ids(seed + 3, 12, vocab), steps)?;
            all &= flag_record(out, &format!("model {name} greedy {steps}"), json!({"tokens_equal": same, "worst_step_nmse": worst, "tolerance_nmse": NMSE_TOL}), same && worst <= NMSE_TOL);
        }
    }
    Ok(all)
}

/// GPU with the checkpoint's stored formats (FP8/FP4/BF16 dequantized in the kernels) against the
/// CPU reference on the same checkpoint (dequantized on load): per-layer streams, logits, and
/// `steps` greedy tokens. Used on the embedded default model, which is written in DeepSeek's
/// official layout and precision.
pub fn run_stored(gpu: &Gpu, dir: &Path, steps: usize, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let bad = |e: String| CudaError::Unsupported { what: "stored-format model", detail: format!("{}: {e}", dir.display()) };
    let cfg = Ds4Config::from_file(dir).map_err(|e| bad(e.to_string()))?;
    let ck = flashseek_model::checkpoint::Checkpoint::open(dir).map_err(|e| bad(e.to_string()))?;
    let w = ModelWeights::load(&cfg, &ck).map_err(|e| bad(e.to_string()))?;
    let gm = GpuModel::upload_with(gpu, &cfg, &super::upload::StoredSource(&ck))?;
    let vocab = cfg.vocab_size;
    let len = 200;
    let ids = formula_ids(99, len, vocab);
    let cpu = forward(&w, &ids, &ForwardOptions { record_streams: true, ..Default::default() }).map_err(|e| bad(e.to_string()))?;
    let mut seq = GpuSequence::new(gpu, &gm, len + steps + 16)?;
    let g = forward_chunk_gpu(gpu, &gm, &mut seq, &ids, LogitsFor::All, true)?;
    let mut all = true;
    for (l, (a, b)) in g.layer_streams.iter().zip(&cpu.layer_streams).enumerate() {
        all &= record(out, &format!("stored-format layer {l} streams"), json!([len]), a, b);
    }
    all &= record(out, "stored-format logits", json!([len, vocab]), &g.logits, &cpu.logits);
    let agree = top1_agreement(&g.logits, &cpu.logits, vocab);
    all &= flag_record(out, "stored-format top-1", json!({"agreement": agree, "positions": len}), agree >= 0.99);
    let (same, worst) = greedy_compare(gpu, &gm, &w, &formula_ids(5, 12, vocab), steps)?;
    all &= super::check_graph::graph_checks(gpu, &gm, 5, "stored-format", 150, 16, out)?;
    all &= flag_record(out, &format!("stored-format greedy {steps}"), json!({"tokens_equal": same, "worst_step_nmse": worst}), same && worst <= NMSE_TOL);
    Ok(all)
}
