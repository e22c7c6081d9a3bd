//! `flashseek gpu-bench`: the current GPU forward on DeepSeek-V4-Flash shapes with random weights
//! in the official precision (FP8 attention and shared experts, FP4 routed experts, BF16
//! embeddings/head/compressors), on the first `layers` layers of the Flash schedule. Measures cold
//! prefill and batch-1 decode with CUDA events (medians of repeats after warm-up), a per-stage
//! breakdown against the machine's ceilings, and a labelled linear estimate for 43 layers.

use super::check::{median, switch_scope};
use super::gpu::Gpu;
use super::gpu::{elapsed_s, StageTimes};
use super::model::{decode_step_gpu, forward_chunk_gpu, prefill_gpu, GpuModel, GpuSequence, StageCost};
use super::upload::RandomOfficialSource;
use super::CudaError;
use crate::forward::LogitsFor;
use crate::testing::formula_ids;
use flashseek_model::config::Ds4Config;
use serde_json::{json, Value};
use std::time::Instant;

/// The Flash config (spec §1.1, §1.2) cut to its first `layers` layers.
pub fn flash_config(layers: usize) -> Ds4Config {
    let mut v = flashseek_model::config::flash_official_json();
    let layers = layers.clamp(1, 43);
    v["num_hidden_layers"] = layers.into();
    v["num_nextn_predict_layers"] = 0.into();
    if let Some(r) = v["compress_ratios"].as_array_mut() {
        r.truncate(layers);
    }
    Ds4Config::from_json(&v).expect("the Flash config is valid")
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Flash layers to instantiate (ignored with `config`).
    pub layers: usize,
    /// Another model config (e.g. the one a transformers comparison uses) instead of Flash.
    pub config: Option<Ds4Config>,
    /// Prompt lengths (cold prefill, then decode at that context).
    pub contexts: Vec<usize>,
    /// Tokens per prefill chunk (None: [`crate::switches::prefill_chunk_tokens`]).
    pub chunk: Option<usize>,
    /// Decode steps timed after each prefill (median reported).
    pub decode_steps: usize,
    /// Cold prefills per context (fresh sequence each; median reported) for contexts up to 32,768
    /// tokens; longer contexts run once.
    pub prefill_repeats: usize,
    /// Skip larger contexts once a prefill took longer than this many seconds.
    pub max_prefill_secs: f64,
    /// Break the profiled prefill's MoE stage into its sub-stages (`moe:route`, then on the grouped
    /// FP8 path, `TC_LINEAR=fp8`: `moe:group+gather`, `moe:gate_up`, `moe:down`,
    /// `moe:shared+combine`; on the other paths `moe:experts`) and report each MoE layer's routing
    /// ([`routing_stats`]). The "moe" row stays their sum. The profiled repeat is one of the timed
    /// ones: its extra events and expert-id copies (one small device copy per MoE layer) are inside
    /// its time.
    pub moe_detail: bool,
}

/// Measured device ceilings of the H200 this project benchmarks on (task statement): HBM read
/// bandwidth, dense bf16 and FP8 tensor-core rates.
pub const CEILING_BYTES_PER_S: f64 = 4.2e12;
/// Dense bf16 tensor-core rate (FLOP/s).
pub const CEILING_BF16_FLOPS: f64 = 800e12;
/// Dense FP8 tensor-core rate (FLOP/s).
pub const CEILING_FP8_FLOPS: f64 = 1450e12;

/// The per-stage table: measured ms (per call when `calls` > 1), share of the total, analytical
/// work, achieved rates and the time as a fraction of the stage's floor
/// `max(FLOPs / bf16 rate, bytes / bandwidth)` (and of the FP8-rate floor, the official numerics').
fn stage_table(times: &StageTimes, costs: &[(&'static str, StageCost)], calls: usize) -> Vec<Value> {
    let total: f64 = times.iter().map(|(_, ms, _)| ms).sum();
    times
        .iter()
        .map(|(name, ms, marks)| {
            let ms_per = ms / calls.max(1) as f64;
            let mut row = json!({"stage": name, "ms": ms_per, "fraction_of_total": ms / total.max(1e-12), "marks": marks});
            if let Some((_, c)) = costs.iter().find(|(n, _)| n == name) {
                let secs = ms_per * 1e-3;
                let floor_bf16 = (c.flops / CEILING_BF16_FLOPS).max(c.bytes / CEILING_BYTES_PER_S);
                let floor_fp8 = (c.flops / CEILING_FP8_FLOPS).max(c.bytes / CEILING_BYTES_PER_S);
                row["flops"] = json!(c.flops);
                row["bytes"] = json!(c.bytes);
                row["tflop_per_s"] = json!(c.flops / secs / 1e12);
                row["gb_per_s"] = json!(c.bytes / secs / 1e9);
                row["floor_ms_bf16"] = json!(floor_bf16 * 1e3);
                row["fraction_of_floor_bf16"] = json!(floor_bf16 / secs);
                row["fraction_of_floor_fp8"] = json!(floor_fp8 / secs);
            }
            row
        })
        .collect()
}

/// Moves the MoE sub-stages (`moe:…`, [`BenchOptions::moe_detail`]) out of `times`, adding their
/// time to the "moe" row (created where the first sub-stage stood if missing); other repeated
/// names merge. Returns the sub-stages as they came (a name repeated in `times` stays repeated;
/// [`Gpu::profile_finish`] has merged them already).
fn split_moe_detail(times: &mut StageTimes) -> StageTimes {
    let mut detail: StageTimes = Vec::new();
    let mut kept: StageTimes = Vec::new();
    for (name, ms, marks) in times.drain(..) {
        if name.starts_with("moe:") {
            detail.push((name, ms, marks));
            match kept.iter_mut().find(|(n, _, _)| *n == "moe") {
                Some(m) => m.1 += ms,
                None => kept.push(("moe", ms, 0)),
            }
        } else {
            match kept.iter_mut().find(|(n, _, _)| *n == name) {
                Some(m) => {
                    m.1 += ms;
                    m.2 += marks;
                }
                None => kept.push((name, ms, marks)),
            }
        }
    }
    *times = kept;
    detail
}

/// One MoE layer's routing from its expert ids (`[t, k]`, values in 0..`e`; others ignored): pairs,
/// experts used, the most and the mean pairs per expert, their coefficient of variation over the
/// `e` experts, for grouped tiles of 256, 128 and 64 rows the tile count Σ⌈count/rows⌉ and the
/// share of tile rows holding a pair (pairs / (tiles · rows)), and `wide_256`: how many 256-row
/// tiles hold at most 128 pairs (an expert's last; the tiles in which `moe_wt` leaves a multiply
/// warpgroup idle — the wide units tried for them are on branch `exp/moe-wt-wide`,
/// `bench/moe_wt_variants_h200.log`), and `odd_256`: how many experts' last 256-row tile has an odd
/// number (1 or 3) of 64-row sub-tiles holding pairs (tiles in which one of `moe_wt`'s multiply
/// warpgroups multiplies a sub-tile fewer than the other; the column split tried for them, 490e607's
/// `GWT_ODD_SPLIT`, was slower: the same log).
pub fn routing_stats(ids: &[i32], e: usize) -> Value {
    let mut count = vec![0usize; e.max(1)];
    let mut pairs = 0usize;
    for &x in ids {
        if x >= 0 && (x as usize) < e {
            count[x as usize] += 1;
            pairs += 1;
        }
    }
    let mean = pairs as f64 / e.max(1) as f64;
    let var = count.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / e.max(1) as f64;
    let tiles = |rows: usize| {
        let n: usize = count.iter().map(|c| c.div_ceil(rows)).sum();
        json!({"rows": rows, "tiles": n, "filled": if n == 0 { 0.0 } else { pairs as f64 / (n * rows) as f64 }})
    };
    json!({
        "pairs": pairs,
        "experts_used": count.iter().filter(|&&c| c > 0).count(),
        "max_per_expert": count.iter().copied().max().unwrap_or(0),
        "mean_per_expert": mean,
        "cv": if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
        "tiles": [tiles(256), tiles(128), tiles(64)],
        // An expert's last 256-row tile holds (c − 1) % 256 + 1 of its c pairs: at most 128.
        "wide_256": count.iter().filter(|&&c| c > 0 && (c - 1) % 256 < 128).count(),
        "odd_256": count.iter().filter(|&&c| c > 0 && ((c - 1) % 256 + 1).div_ceil(64) % 2 == 1).count(),
    })
}

fn add_costs(acc: &mut Vec<(&'static str, StageCost)>, more: Vec<(&'static str, StageCost)>) {
    for (n, c) in more {
        match acc.iter_mut().find(|(m, _)| *m == n) {
            Some((_, a)) => {
                a.flops += c.flops;
                a.bytes += c.bytes;
            }
            None => acc.push((n, c)),
        }
    }
}

fn print_moe_detail(rows: &[Value]) {
    for r in rows {
        let f = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        println!("  prefill   {:<20} {:9.2} ms {:5.1}% of moe", r["stage"].as_str().unwrap_or(""), f("ms"), 100.0 * f("fraction_of_moe"));
    }
}

fn print_routing(routing: &[Value]) {
    for (i, r) in routing.iter().enumerate() {
        let tiles: Vec<String> = r["tiles"].as_array().map(|a| a.iter().map(|t| format!("{}×{} ({:.0}% filled)", t["tiles"], t["rows"], 100.0 * t["filled"].as_f64().unwrap_or(0.0))).collect()).unwrap_or_default();
        println!(
            "  routing {i:>3}: {} pairs, {} experts, max {} mean {:.1} cv {:.2}; tiles {}; {} of the 256-row tiles ≤ 128 rows, {} of an odd number of 64-row sub-tiles",
            r["pairs"],
            r["experts_used"],
            r["max_per_expert"],
            r["mean_per_expert"].as_f64().unwrap_or(0.0),
            r["cv"].as_f64().unwrap_or(0.0),
            tiles.join(", "),
            r["wide_256"],
            r["odd_256"]
        );
    }
}

fn print_stages(label: &str, rows: &[Value]) {
    for r in rows {
        let f = |k: &str| r.get(k).and_then(Value::as_f64);
        print!("  {label} {:<12} {:9.2} ms {:5.1}%", r["stage"].as_str().unwrap_or(""), f("ms").unwrap_or(0.0), 100.0 * f("fraction_of_total").unwrap_or(0.0));
        if let (Some(tf), Some(gb), Some(fl), Some(f8)) = (f("tflop_per_s"), f("gb_per_s"), f("fraction_of_floor_bf16"), f("fraction_of_floor_fp8")) {
            // Both floors: the bf16 one alone read over 100 % for FP8 GEMMs (TC_LINEAR=fp8).
            print!("  {tf:7.1} TFLOP/s {gb:8.0} GB/s  {:5.1}% of the bf16 floor, {:5.1}% of the fp8 floor", 100.0 * fl, 100.0 * f8);
        }
        println!();
    }
}

/// Runs the benchmark; returns the JSON report.
pub fn run(gpu: &Gpu, opts: &BenchOptions) -> Result<Value, CudaError> {
    let cfg = opts.config.clone().unwrap_or_else(|| flash_config(opts.layers));
    let chunk = opts.chunk.unwrap_or_else(crate::switches::prefill_chunk_tokens);
    let t = Instant::now();
    let model = GpuModel::upload_with(gpu, &cfg, &RandomOfficialSource::new(&cfg, 7))?;
    gpu.sync()?;
    let upload_s = t.elapsed().as_secs_f64();
    let (free, total) = gpu.ctx.mem_get_info().unwrap_or((0, 0));
    println!("uploaded {} layers in {upload_s:.1} s; device memory used {:.1} GiB of {:.1}", cfg.num_hidden_layers, (total - free) as f64 / (1u64 << 30) as f64, total as f64 / (1u64 << 30) as f64);
    let n = cfg.num_hidden_layers as f64;
    // Warm-up: one short prefill and four decode steps (first launches, allocator and graph-pool
    // growth, first graph instantiations).
    {
        let w = chunk.clamp(1, 2048);
        let ids = formula_ids(1, w + 4, cfg.vocab_size);
        let mut s = GpuSequence::new(gpu, &model, w + 5)?;
        forward_chunk_gpu(gpu, &model, &mut s, &ids[..w], LogitsFor::Last, false)?;
        for id in &ids[w..] {
            decode_step_gpu(gpu, &model, &mut s, *id)?;
        }
        gpu.sync()?;
    }
    let mut rows = Vec::new();
    for &ctx in &opts.contexts {
        // Decode ids: the timed steps, as many again without graphs (when they are on), and the
        // profiled steps.
        let decode_ids = 2 * opts.decode_steps + PROFILED_DECODE_STEPS;
        let ids = formula_ids(ctx as u64, ctx + decode_ids, cfg.vocab_size);
        let chunks = super::model::prefill_chunks(&ids[..ctx], chunk);
        let repeats = if ctx <= 32768 { opts.prefill_repeats.max(1) } else { 1 };
        let mut prefill_times = Vec::new();
        let mut seq = None;
        let mut prefill_stages = Vec::new();
        let (mut moe_detail_rows, mut routing): (Vec<Value>, Vec<Value>) = (Vec::new(), Vec::new());
        for r in 0..repeats {
            let mut s = GpuSequence::new(gpu, &model, ctx + decode_ids + 1)?;
            let profile = r + 1 == repeats;
            gpu.sync()?;
            if profile {
                gpu.profile_start();
                if opts.moe_detail {
                    gpu.moe_detail_start();
                }
            }
            let a = gpu.record_event()?;
            let done = prefill_gpu(gpu, &model, &mut s, &ids[..ctx], chunk);
            let b = gpu.record_event();
            // MoE detail stops with the prefill, whether or not it succeeded.
            let kept = (profile && opts.moe_detail).then(|| gpu.moe_detail_finish());
            done?;
            prefill_times.push(elapsed_s(&a, &b?)?);
            if profile {
                let mut times = gpu.profile_finish()?;
                if let Some(kept) = kept {
                    let detail = split_moe_detail(&mut times);
                    let moe_ms: f64 = detail.iter().map(|(_, ms, _)| ms).sum();
                    moe_detail_rows = detail.iter().map(|(n, ms, marks)| json!({"stage": n, "ms": ms, "fraction_of_moe": ms / moe_ms.max(1e-12), "marks": marks})).collect();
                    routing = kept?.iter().map(|v| routing_stats(v, cfg.n_routed_experts)).collect();
                }
                let mut costs = Vec::new();
                let mut pos = 0;
                for (i, c) in chunks.iter().enumerate() {
                    add_costs(&mut costs, model.stage_costs(c.len(), pos, usize::from(i + 1 == chunks.len())));
                    pos += c.len();
                }
                prefill_stages = stage_table(&times, &costs, 1);
            }
            seq = Some(s);
        }
        let Some(mut seq) = seq else { continue };
        let prefill_s = median(&mut prefill_times);
        let mut next = ctx;
        let graphs = super::model::decode_graphs_enabled(gpu);
        let before = gpu.graph.stats();
        let decode_s = time_decode(gpu, &model, &mut seq, &ids[next..next + opts.decode_steps])?;
        let after = gpu.graph.stats();
        next += opts.decode_steps;
        let graph_steps = after.launched - before.launched;
        let captures = (after.updated + after.instantiated) - (before.updated + before.instantiated);
        let capture_ms = if captures > 0 { Some((after.capture_s - before.capture_s) / captures as f64 * 1e3) } else { None };
        // With graphs on: the same number of steps launched kernel by kernel, for the comparison.
        let plain_s = if graphs {
            let s = switch_scope(&[("DECODE_CUDA_GRAPH", "off")], || time_decode(gpu, &model, &mut seq, &ids[next..next + opts.decode_steps]))?;
            next += opts.decode_steps;
            Some(s)
        } else {
            None
        };
        // Stages of a few more steps (profiling records events between the kernels, so these run
        // without graphs).
        gpu.profile_start();
        for id in &ids[next..next + PROFILED_DECODE_STEPS] {
            decode_step_gpu(gpu, &model, &mut seq, *id)?;
        }
        let times = gpu.profile_finish()?;
        let decode_stages = stage_table(&times, &model.stage_costs(1, ctx, 1), PROFILED_DECODE_STEPS);
        println!(
            "context {ctx:>6}: prefill {prefill_s:.2} s ({:.0} tok/s; 43-layer estimate {:.0}), decode {:.2} ms/token ({:.1} tok/s; 43-layer estimate {:.1})",
            ctx as f64 / prefill_s,
            ctx as f64 / (prefill_s * 43.0 / n),
            decode_s * 1e3,
            1.0 / decode_s,
            1.0 / (decode_s * 43.0 / n)
        );
        print_stages("prefill", &prefill_stages);
        if opts.moe_detail {
            print_moe_detail(&moe_detail_rows);
            print_routing(&routing);
        }
        if let Some(p) = plain_s {
            println!(
                "context {ctx:>6}: decode with CUDA graphs {:.2} ms/token ({graph_steps} of {} steps as graphs; host capture {:.2} ms each, {} instantiations), without {:.2} ms/token",
                decode_s * 1e3,
                opts.decode_steps,
                capture_ms.unwrap_or(f64::NAN),
                after.instantiated - before.instantiated,
                p * 1e3
            );
        }
        print_stages("decode ", &decode_stages);
        rows.push(json!({
            "context": ctx,
            "layers_measured": cfg.num_hidden_layers,
            "prefill_s": prefill_s,
            "prefill_repeats": prefill_times.len(),
            "prefill_tok_s": ctx as f64 / prefill_s,
            "prefill_tok_s_43_layer_estimate": ctx as f64 / (prefill_s * 43.0 / n),
            "prefill_chunk": chunk,
            "prefill_stages": prefill_stages,
            "decode_ms_per_token": decode_s * 1e3,
            "decode_tok_s": 1.0 / decode_s,
            "decode_tok_s_43_layer_estimate": 1.0 / (decode_s * 43.0 / n),
            "decode_steps": opts.decode_steps,
            "decode_cuda_graph": graphs,
            "decode_steps_as_graphs": graph_steps,
            "decode_graph_host_capture_ms_mean": capture_ms,
            "decode_graph_instantiations": after.instantiated - before.instantiated,
            "decode_ms_per_token_without_graph": plain_s.map(|p| p * 1e3),
            "decode_stages_per_token": decode_stages,
            "decode_stages_note": "from PROFILED_DECODE_STEPS further steps with CUDA events between stages (launched without graphs)",
        }));
        if opts.moe_detail {
            if let Some(row) = rows.last_mut() {
                row["prefill_moe_detail"] = json!(moe_detail_rows);
                row["moe_routing"] = json!(routing);
                row["moe_routing_note"] = json!("one entry per MoE layer call of the profiled prefill (chunk by chunk, layer by layer): routing_stats of its expert ids");
            }
        }
        if prefill_s > opts.max_prefill_secs {
            println!("stopping: prefill took {prefill_s:.1} s (> {} s)", opts.max_prefill_secs);
            break;
        }
    }
    let switches: Vec<Value> = crate::switches::SWITCHES.iter().map(|s| json!({"name": s.name, "value": crate::switches::value(s.name)})).collect();
    Ok(json!({
        "gpu": gpu.ctx.name().unwrap_or_default(),
        "arch": gpu.arch,
        "model": "DeepSeek-V4-Flash shapes, random weights in official precision (FP8 e4m3 + ue8m0 attention/shared, FP4 e2m1 routed experts, BF16 embeddings/head/compressors)",
        "layers_measured": cfg.num_hidden_layers,
        "upload_s": upload_s,
        "switches": switches,
        "timing": "CUDA events around the prefill chunks (median of fresh cold prefills) and around each decode step including its logits download (median; with DECODE_CUDA_GRAPH the capture and launch are inside); stages from CUDA events at stage boundaries (last prefill repeat; separate profiled decode steps)",
        "ceilings": {"bytes_per_s": CEILING_BYTES_PER_S, "bf16_flops": CEILING_BF16_FLOPS, "fp8_flops": CEILING_FP8_FLOPS, "source": "task statement: this H200 measured ~4.2 TB/s read, ~800 TFLOP/s bf16, ~1,450 TFLOP/s fp8 dense"},
        "floor_note": "fraction_of_floor = max(FLOPs / rate, bytes / bandwidth) / measured time; FLOPs and bytes from GpuModel::stage_costs (analytical)",
        "estimate_note": "43-layer figures scale the measured time linearly by 43/layers: an estimate, not a measurement",
        "runs": rows,
    }))
}

/// Decode steps profiled for the stage breakdown (after the timed ones).
pub const PROFILED_DECODE_STEPS: usize = 4;

/// Median seconds per decode step over `ids` (CUDA events around each step, including its logits
/// download).
fn time_decode(gpu: &Gpu, model: &GpuModel, seq: &mut GpuSequence, ids: &[u32]) -> Result<f64, super::CudaError> {
    let mut steps = Vec::with_capacity(ids.len());
    for id in ids {
        let a = gpu.record_event()?;
        decode_step_gpu(gpu, model, seq, *id)?;
        let b = gpu.record_event()?;
        steps.push(elapsed_s(&a, &b)?);
    }
    Ok(median(&mut steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-call times, shares of the total, achieved rates and floors come out of the stage table
    /// as the formulas say; stages without a cost model carry time only.
    #[test]
    fn stage_table_computes_rates_and_floors() {
        let times: StageTimes = vec![("moe", 30.0, 3), ("mhc+norms", 10.0, 3)];
        let costs = vec![("moe", StageCost { flops: 8e11, bytes: 4.2e9 })];
        let t = stage_table(&times, &costs, 2);
        assert_eq!(t.len(), 2);
        let moe = &t[0];
        assert_eq!(moe["ms"].as_f64(), Some(15.0));
        assert!((moe["fraction_of_total"].as_f64().unwrap() - 0.75).abs() < 1e-12);
        // 8e11 FLOP in 15 ms = 53.3 TFLOP/s; floor max(1 ms compute at 800 TF/s, 1 ms of bytes) = 1 ms.
        assert!((moe["tflop_per_s"].as_f64().unwrap() - 8e11 / 0.015 / 1e12).abs() < 1e-9);
        assert!((moe["floor_ms_bf16"].as_f64().unwrap() - 1.0).abs() < 1e-9);
        assert!((moe["fraction_of_floor_bf16"].as_f64().unwrap() - 1.0 / 15.0).abs() < 1e-12);
        assert!(t[1].get("tflop_per_s").is_none());
        let mut acc = Vec::new();
        add_costs(&mut acc, costs.clone());
        add_costs(&mut acc, costs);
        assert_eq!(acc[0].1.flops, 1.6e12);
    }

    /// The MoE sub-stages leave the table with their time added to "moe" (in its place, marks
    /// unchanged), other repeated stages merge, and the sub-stages come back in order.
    #[test]
    fn moe_detail_folds_into_moe() {
        let mut times: StageTimes = vec![("mhc+norms", 1.0, 2), ("moe", 0.125, 1), ("moe:route", 0.5, 1), ("moe:gate_up", 3.0, 1), ("mhc+norms", 2.0, 3), ("moe:route", 0.25, 1)];
        let detail = split_moe_detail(&mut times);
        assert_eq!(times, vec![("mhc+norms", 3.0, 5), ("moe", 3.875, 1)]);
        assert_eq!(detail, vec![("moe:route", 0.5, 1), ("moe:gate_up", 3.0, 1), ("moe:route", 0.25, 1)]);
        let mut no_moe: StageTimes = vec![("head", 1.0, 1), ("moe:down", 2.0, 1)];
        split_moe_detail(&mut no_moe);
        assert_eq!(no_moe, vec![("head", 1.0, 1), ("moe", 2.0, 0)]);
    }

    /// Counts, spread and tile fill of a small routing: 4 experts, 10 pairs (5, 3, 2, 0) plus an id
    /// out of range.
    #[test]
    fn routing_stats_counts_tiles() {
        let ids = [0, 0, 1, 0, 2, 1, 0, 2, 0, 1, 7];
        let r = routing_stats(&ids, 4);
        assert_eq!(r["pairs"], 10);
        assert_eq!(r["experts_used"], 3);
        assert_eq!(r["max_per_expert"], 5);
        assert_eq!(r["mean_per_expert"].as_f64(), Some(2.5));
        // Deviations 2.5, 0.5, -0.5, -2.5: variance 3.25.
        assert!((r["cv"].as_f64().unwrap() - 3.25f64.sqrt() / 2.5).abs() < 1e-12);
        // 64-row tiles: one per used expert, 10 of 192 rows filled.
        assert_eq!(r["tiles"][2]["tiles"], 3);
        assert!((r["tiles"][2]["filled"].as_f64().unwrap() - 10.0 / 192.0).abs() < 1e-12);
        let many: Vec<i32> = (0..600).map(|i| i % 2).collect();
        let r = routing_stats(&many, 2);
        // 300 pairs each: ⌈300/256⌉ = 2 tiles of 256 per expert.
        assert_eq!(r["tiles"][0]["tiles"], 4);
        assert_eq!(r["cv"].as_f64(), Some(0.0));
        // Each expert's last 256-row tile holds 300 − 256 = 44 pairs: two wide tiles.
        assert_eq!(r["wide_256"], 2);
        // 5, 3, 2 pairs: every expert's only tile is wide.
        assert_eq!(routing_stats(&ids, 4)["wide_256"], 3);
        let full: Vec<i32> = vec![0; 256 + 129];
        assert_eq!(routing_stats(&full, 1)["wide_256"], 0, "a last tile of 129 pairs is not wide");
        let edge: Vec<i32> = vec![0; 256 + 128];
        assert_eq!(routing_stats(&edge, 1)["wide_256"], 1, "128 pairs are");
        // Odd live sub-tiles in the last 256-row tile: 5, 3, 2 pairs are one sub-tile each; 300
        // pairs leave 44 (one); 385 leave 129 (three); 384 leave 128 (two); 256 fill four.
        assert_eq!(routing_stats(&ids, 4)["odd_256"], 3);
        assert_eq!(routing_stats(&many, 2)["odd_256"], 2);
        assert_eq!(routing_stats(&full, 1)["odd_256"], 1);
        assert_eq!(routing_stats(&edge, 1)["odd_256"], 0);
        assert_eq!(routing_stats(&vec![0; 256], 1)["odd_256"], 0);
        assert_eq!(routing_stats(&vec![0; 192], 1)["odd_256"], 1);
    }
}
