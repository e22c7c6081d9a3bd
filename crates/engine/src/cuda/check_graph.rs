//! Parity of decode steps run as CUDA graphs (switch `DECODE_CUDA_GRAPH`, [`super::graph`]) with the
//! same steps launched kernel by kernel: a graph records the same kernels with the same arguments,
//! so the logits must be bitwise equal. Checked on one sequence (prefill, then decode steps), and on
//! two sequences at different positions decoded in turns (the kept executable graphs are updated
//! from one sequence's step to the other's, as in the server's scheduler), with the host time per
//! step of both ways.

use super::check::{differing_bits, flag_record, median, switch_scope};
use super::gpu::Gpu;
use super::model::{decode_step_gpu, forward_chunk_gpu, GpuModel, GpuSequence};
use super::CudaError;
use crate::forward::LogitsFor;
use crate::testing::formula_ids;
use serde_json::{json, Value};
use std::time::Instant;

/// Switch values of the compared runs: the grouped MoE at decode sizes in both (the per-expert path
/// synchronises every layer and cannot be captured), graphs on or off.
fn graph_switches(on: bool) -> [(&'static str, &'static str); 3] {
    [("MOE_GROUPED", "on"), ("MOE_GROUPED_DECODE", "on"), ("DECODE_CUDA_GRAPH", if on { "on" } else { "off" })]
}

/// Prefill `prefix` tokens into each of the sequences (prefix lengths `prefixes`), then decode
/// `steps` tokens in each, sequence after sequence per step; returns all decode logits in that
/// order and the median host time per decode step (seconds).
fn run(gpu: &Gpu, gm: &GpuModel, ids: &[u32], prefixes: &[usize], steps: usize) -> Result<(Vec<f32>, f64), CudaError> {
    let mut seqs = Vec::new();
    for &p in prefixes {
        let mut s = GpuSequence::new(gpu, gm, p + steps + 1)?;
        forward_chunk_gpu(gpu, gm, &mut s, &ids[..p], LogitsFor::None, false)?;
        seqs.push((s, p));
    }
    let mut logits = Vec::new();
    let mut times = Vec::new();
    for i in 0..steps {
        for (s, p) in seqs.iter_mut() {
            let t = Instant::now();
            let l = decode_step_gpu(gpu, gm, s, ids[*p + i])?;
            times.push(t.elapsed().as_secs_f64());
            logits.extend(l);
        }
    }
    Ok((logits, median(&mut times)))
}

/// The graph parity records for model `name` (`seed` picks the token ids): one sequence with a
/// `prefix`-token prefill and `steps` decode steps, then two sequences (prefixes `prefix` and
/// `prefix / 2 + 1`) in turns. Passes when the logits are bitwise equal, every graph step was
/// launched as a graph and no capture was abandoned.
///
/// Errors: device errors, an invalid switch override (a programming error).
pub fn graph_checks(gpu: &Gpu, gm: &GpuModel, seed: u64, name: &str, prefix: usize, steps: usize, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    if !super::model::moe_graph_capable(gpu, gm)? {
        // f32 experts (the golden models) take the per-expert MoE, which cannot be captured.
        println!("graph {name}: not capturable (some MoE layer runs one expert at a time), skipped");
        return Ok(true);
    }
    let vocab = gm.config.vocab_size;
    let ids = formula_ids(seed + 31, prefix + steps + 1, vocab);
    let mut all = true;
    for prefixes in [vec![prefix], vec![prefix, prefix / 2 + 1]] {
        let plain = switch_scope(&graph_switches(false), || run(gpu, gm, &ids, &prefixes, steps))?;
        let before = gpu.graph.stats();
        let graphed = switch_scope(&graph_switches(true), || run(gpu, gm, &ids, &prefixes, steps))?;
        let after = gpu.graph.stats();
        let differing = differing_bits(&plain.0, &graphed.0);
        let launched = after.launched - before.launched;
        let expected = (steps * prefixes.len()) as u64;
        let detail = json!({
            "sequences": prefixes.len(), "prefixes": prefixes, "steps": steps,
            "differing_logits": differing, "logits": plain.0.len(),
            "graphs_launched": launched, "updated": after.updated - before.updated,
            "instantiated": after.instantiated - before.instantiated, "abandoned": after.abandoned - before.abandoned,
            "host_ms_per_step_plain": plain.1 * 1e3, "host_ms_per_step_graph": graphed.1 * 1e3,
            "graph_pool_bytes": gpu.graph.pool.bytes(), "broken": gpu.graph.broken(),
        });
        all &= flag_record(out, &format!("graph {name} decode ×{}", prefixes.len()), detail, differing == 0 && !plain.0.is_empty() && launched == expected && after.abandoned == before.abandoned);
    }
    Ok(all)
}
