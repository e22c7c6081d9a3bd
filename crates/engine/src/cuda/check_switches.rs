//! The switch parity matrix (issue 6 §7; issue 5 item 5's full-width model): every switch of
//! [`crate::switches`] turned on alone (the others off) and off alone (the others at their
//! defaults), plus all off and all on, each run end to end on the GPU against the exact CPU
//! reference on one full-width random model in official precision ([`full_width_parity_config`]):
//! logits NMSE and top-1 agreement of a 200-token prefill, and greedy decoding (`steps` tokens after
//! a 100-token prompt, the GPU fed the CPU's tokens) with equal tokens. Configurations the design
//! promises to give the same bits (MoE fusion, tile height, persistent grid) are also compared bit
//! for bit with the all-on run. `TC_LINEAR=bf16` is not exact by design: its rows are reported,
//! not judged. `TC_LINEAR=fp8` rows (DeepSeek's official numerics) are compared with the CPU in those
//! numerics and reported, not judged (see the comment in [`run`]) — except a row that promises the
//! official all-on run's bits (`MOE_FP8_WS=off`), judged on those bits. At this model's 200-token
//! prefill the grouped MoE takes 64-row tiles, which `MOE_FP8_WS` leaves to `moe_w8`: that row
//! checks the switch's plumbing, the kernel itself is checked by `gpu-check --only moe`.

use super::check::{differing_bits, errors, NMSE_TOL};
use super::gpu::Gpu;
use super::model::{decode_step_gpu, forward_chunk_gpu, GpuModel, GpuSequence};
use super::CudaError;
use crate::forward::{forward, forward_chunk, ForwardOptions, LogitsFor};
use crate::state::SequenceState;
use crate::switches::{configurations, scoped, Role};
use crate::testing::{argmax, formula_ids};
use crate::weights::ModelWeights;
use flashseek_model::config::Ds4Config;
use serde_json::{json, Value};
use std::path::Path;

/// A greedy trajectory: each step's chosen token and the logits it was chosen from.
type Trajectory = Vec<(u32, Vec<f32>)>;

/// Folder (under the cache root) of the full-width parity model; bump when its config changes.
pub const FULL_WIDTH_MODEL_DIR: &str = "parity-full-width-v1";
/// Generator seed of its weights.
pub const FULL_WIDTH_MODEL_SEED: u64 = 20261130;

/// DeepSeek-V4-Flash widths (spec §1.1: hidden 4096, 64 heads × 512 with 64 rope, q/o ranks 1024,
/// 8 output groups, window 128, indexer 64 × 128 top-512, mHC 4 × 20, 256 experts top-6, vocab
/// 129,280) on the first 4 Flash layers (sliding, sliding, CSA, HCA; 3 hash-routed), official
/// precision (FP8 attention/shared, FP4 experts, BF16 embeddings/head), with the routed and shared
/// experts' width cut from 2048 to 256 so that the CPU reference (f32 copies of every weight) fits
/// in memory and runs in seconds.
pub fn full_width_parity_config() -> Ds4Config {
    let mut v = flashseek_model::config::flash_official_json();
    v["num_hidden_layers"] = 4.into();
    v["num_nextn_predict_layers"] = 0.into();
    v["moe_intermediate_size"] = 256.into();
    if let Some(r) = v["compress_ratios"].as_array_mut() {
        r.truncate(4);
    }
    Ds4Config::from_json(&v).expect("the parity config is valid")
}

/// Runs the matrix on the checkpoint in `dir` (written by [`full_width_parity_config`] or any
/// stored-format model); appends records to `out`, returns whether every judged row passed.
pub fn run(gpu: &Gpu, dir: &Path, steps: usize, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let bad = |e: String| CudaError::Unsupported { what: "switch matrix", detail: format!("{}: {e}", dir.display()) };
    let t0 = std::time::Instant::now();
    let cfg = Ds4Config::from_file(dir).map_err(|e| bad(e.to_string()))?;
    let ck = flashseek_model::checkpoint::Checkpoint::open(dir).map_err(|e| bad(e.to_string()))?;
    let w = ModelWeights::load(&cfg, &ck).map_err(|e| bad(e.to_string()))?;
    let gm = GpuModel::upload_with(gpu, &cfg, &super::upload::StoredSource(&ck))?;
    let vocab = cfg.vocab_size;
    let (len, prompt_len) = (200usize, 100usize);
    let ids = formula_ids(99, len, vocab);
    let prompt = formula_ids(5, prompt_len, vocab);
    // CPU references (HF numerics, and DeepSeek's official activation quantisation for
    // TC_LINEAR=fp8): one-shot logits, then a greedy trajectory (tokens and per-step logits).
    let reference = |fopts: ForwardOptions| -> Result<(Vec<f32>, Trajectory), CudaError> {
        let cpu = forward(&w, &ids, &fopts).map_err(|e| bad(e.to_string()))?.logits;
        let mut cst = SequenceState::new(&w.config, None);
        let mut cl = forward_chunk(&w, &mut cst, &prompt, LogitsFor::Last, &fopts).map_err(|e| bad(e.to_string()))?.logits;
        let mut trajectory = Vec::with_capacity(steps);
        for _ in 0..steps {
            let tok = argmax(&cl) as u32;
            trajectory.push((tok, cl.clone()));
            cl = forward_chunk(&w, &mut cst, &[tok], LogitsFor::Last, &fopts).map_err(|e| bad(e.to_string()))?.logits;
        }
        Ok((cpu, trajectory))
    };
    let hf_ref = reference(ForwardOptions::default())?;
    let official_opts = ForwardOptions { numerics: crate::forward::Numerics { act_quant_fp8: true, ..Default::default() }, ..ForwardOptions::default() };
    let official_ref = reference(official_opts)?;
    // Official numerics round every §10.1 GEMM input to e4m3: a rounding difference before a
    // quantisation point can move a value by a whole e4m3 step, which the next one amplifies
    // (forward::tests::official_numerics_amplify_last_bit_differences; on H200 the first layer
    // already differs by ~4e-4). So TC_LINEAR=fp8 rows are reported with their per-layer NMSE and
    // the gap between the two CPU numerics; their parity is judged per GEMM and per MoE layer.
    let official_streams = forward(&w, &ids, &ForwardOptions { record_streams: true, ..official_opts }).map_err(|e| bad(e.to_string()))?.layer_streams;
    let numerics_gap = errors(&official_ref.0, &hf_ref.0).0;
    println!("switch matrix: CPU official numerics vs CPU HF numerics: logits nmse {numerics_gap:.3e}");
    println!("switch matrix: model {} ({} layers, hidden {}, {} experts), CPU reference in {:.1} s", dir.display(), cfg.num_hidden_layers, cfg.hidden_size, cfg.n_routed_experts, t0.elapsed().as_secs_f64());
    let mut all = true;
    let mut all_on_logits: Option<Vec<f32>> = None;
    let mut official_all_on_logits: Option<Vec<f32>> = None;
    for crate::switches::Configuration { label, overrides, role, exact, official, same_bits_as_all_on: same_bits, .. } in configurations() {
        let (cpu, trajectory) = if official { (&official_ref.0, &official_ref.1) } else { (&hf_ref.0, &hf_ref.1) };
        let run = || -> Result<(Vec<f32>, bool, f64, Vec<f64>), CudaError> {
            let mut seq = GpuSequence::new(gpu, &gm, len + 1)?;
            let logits = forward_chunk_gpu(gpu, &gm, &mut seq, &ids, LogitsFor::All, false)?.logits;
            let mut gseq = GpuSequence::new(gpu, &gm, prompt_len + steps + 1)?;
            let mut gl = forward_chunk_gpu(gpu, &gm, &mut gseq, &prompt, LogitsFor::Last, false)?.logits;
            let (mut same, mut worst) = (true, 0f64);
            for (tok, cpu_step) in trajectory {
                same &= argmax(&gl) as u32 == *tok;
                worst = worst.max(errors(&gl, cpu_step).0);
                gl = decode_step_gpu(gpu, &gm, &mut gseq, *tok)?;
            }
            let layers: Vec<f64> = if official {
                let mut seq = GpuSequence::new(gpu, &gm, len + 1)?;
                let g = forward_chunk_gpu(gpu, &gm, &mut seq, &ids, LogitsFor::Last, true)?;
                g.layer_streams.iter().zip(&official_streams).map(|(a, b)| errors(a, b).0).collect()
            } else {
                Vec::new()
            };
            Ok((logits, same, worst, layers))
        };
        let t = std::time::Instant::now();
        let (logits, same, worst, layer_nmse) = scoped(&overrides, run).map_err(|e| bad(e.to_string()))??;
        let (nmse, max_abs, _) = errors(&logits, cpu);
        let rows = len;
        let agree = (0..rows).filter(|r| argmax(&logits[r * vocab..(r + 1) * vocab]) == argmax(&cpu[r * vocab..(r + 1) * vocab])).count() as f64 / rows as f64;
        let finite = logits.iter().all(|v| v.is_finite());
        let mut pass = finite && (!exact || (nmse <= NMSE_TOL && agree >= 0.99 && same && worst <= NMSE_TOL));
        let mut bits = Value::Null;
        if role == Role::AllOn {
            all_on_logits = Some(logits.clone());
        }
        if role == Role::OfficialAllOn {
            official_all_on_logits = Some(logits.clone());
        }
        if same_bits {
            let reference = if official { official_all_on_logits.as_ref() } else { all_on_logits.as_ref() };
            let differ = reference.map(|a| differing_bits(a, &logits));
            bits = json!(differ);
            pass &= differ == Some(0);
        }
        // Judged: exact configurations, and any that promises bits (an official one: its bits only).
        let judged_run = exact || same_bits;
        let judged = if judged_run { if pass { "ok" } else { "FAIL" } } else { "reported" };
        println!(
            "switches {label:<40} logits nmse {nmse:.3e} max_abs {max_abs:.3e} top-1 {:.1}%  greedy {steps}: {}  worst step nmse {worst:.3e}{}  ({:.1} s)  {judged}",
            100.0 * agree,
            if same { "equal" } else { "DIFFER" },
            if same_bits { format!("  bits vs {}all-on: {bits} differ", if official { "official " } else { "" }) } else if official { format!("  layer streams nmse {:?} (CPU numerics gap {numerics_gap:.2e})", layer_nmse.iter().map(|v| format!("{v:.2e}")).collect::<Vec<_>>()) } else { String::new() },
            t.elapsed().as_secs_f64()
        );
        out.push(json!({
            "op": format!("switches {label}"), "overrides": overrides.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>(),
            "prefill_tokens": len, "logits_nmse": nmse, "logits_max_abs": max_abs, "top1_agreement": agree,
            "greedy_steps": steps, "greedy_prompt": prompt_len, "greedy_tokens_equal": same, "greedy_worst_step_nmse": worst,
            "differing_bits_vs_all_on": bits, "bits_reference": crate::switches::bits_reference(same_bits, official), "exactness_promised": exact,
            "reference": if official { "cpu, official numerics (act_quant_fp8)" } else { "cpu, HF numerics" },
            "layer_streams_nmse": layer_nmse, "cpu_official_vs_hf_logits_nmse": if official { json!(numerics_gap) } else { Value::Null },
            "judged_on": if official && same_bits { "logits bits equal to the official all-on run's" } else if official { "reported: e4m3 rounding amplifies last-bit differences end to end; judged per GEMM (q8 records) and per MoE layer (moe_q8 records)" } else if exact { "logits NMSE, top-1 ≥ 99%, greedy tokens equal" } else { "reported" },
            "tolerance_nmse": NMSE_TOL, "pass": if judged_run { pass } else { finite },
        }));
        if judged_run {
            all &= pass;
        }
    }
    // Decode steps as CUDA graphs on the full-width model (bitwise equal to the same steps without).
    all &= super::check_graph::graph_checks(gpu, &gm, 99, "full-width", prompt_len, steps.max(8), out)?;
    Ok(all)
}
