//! `flashseek gpu-check`: every CUDA op against the CPU reference on fresh random inputs
//! (NMSE and max-abs error, tolerance NMSE ≤ 1e-4 per op as issue 5 states), plus CUDA-event
//! timings (median of repeats after warm-up) of decode-shaped linear layers on DeepSeek-V4-Flash
//! shapes, as achieved GB/s, and of the prefill-shaped tensor-core linear (gemm.cu) as TFLOP/s next
//! to the f32 GEMV kernel. `--only tc` runs only the tensor-core checks and timings.

use super::gpu::{GemmTile, Gpu, GpuMatrix, GpuWeight};
use super::CudaError;
use crate::cpu::ops;
use crate::cpu::rope::Rope;
use crate::testing::{fnv1a64, uniform};
use crate::weights::Matrix;
use flashseek_model::config::{RopeParams, Yarn};
use flashseek_model::quant;
use serde_json::{json, Value};

/// Per-op tolerance on NMSE.
pub const NMSE_TOL: f64 = 1e-4;

/// NMSE bound for the tensor-core linear with split activations (`Gpu::linear_tc(.., split)`).
pub const SPLIT_NMSE_TOL: f64 = 1e-8;

/// Deterministic uniform values in [−scale, scale) for input `key` under `seed`.
pub fn random(seed: u64, key: &str, n: usize, scale: f64) -> Vec<f32> {
    let k = fnv1a64(&format!("{seed}:{key}"));
    (0..n as u64).map(|i| (uniform(k, i) * scale) as f32).collect()
}

/// `(NMSE, max |a − b|, max |b|)`.
pub fn errors(got: &[f32], reference: &[f32]) -> (f64, f64, f64) {
    let mut num = 0f64;
    let mut den = 0f64;
    let mut max_abs = 0f64;
    let mut ref_max = 0f64;
    for (a, b) in got.iter().zip(reference) {
        let d = *a as f64 - *b as f64;
        num += d * d;
        den += (*b as f64) * (*b as f64);
        max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d.abs() });
        ref_max = ref_max.max((*b as f64).abs());
    }
    (if got.len() == reference.len() { num / den.max(1e-300) } else { f64::INFINITY }, max_abs, ref_max)
}

/// Prints and appends one check record; returns whether it passed (NMSE ≤ [`NMSE_TOL`], all finite).
pub fn record(ops_out: &mut Vec<Value>, op: &str, shape: Value, got: &[f32], reference: &[f32]) -> bool {
    record_tol(ops_out, op, shape, got, reference, NMSE_TOL)
}

/// [`record`] with its own NMSE bound `tol`.
pub fn record_tol(ops_out: &mut Vec<Value>, op: &str, shape: Value, got: &[f32], reference: &[f32], tol: f64) -> bool {
    let (nmse, max_abs, ref_max) = errors(got, reference);
    let pass = nmse <= tol && got.iter().all(|v| v.is_finite());
    println!("{op:<28} {shape:<28} nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e}, tol {tol:.0e})  {}", if pass { "ok" } else { "FAIL" });
    ops_out.push(json!({"op": op, "shape": shape, "nmse": nmse, "max_abs": max_abs, "ref_max": ref_max, "tolerance_nmse": tol, "pass": pass}));
    pass
}

/// `groups` FP8 weights of `[r, gin]` for the grouped output projection's checks, group g's values
/// [`random`]`(seed, "{key}.{g}", …, 0.08)`: the device weights and their CPU-side dequantized
/// matrices (for [`grouped_linear_cpu`]).
///
/// Errors: as [`weight`].
pub(crate) fn fp8_group_weights(gpu: &Gpu, seed: u64, key: &str, groups: usize, r: usize, gin: usize) -> Result<(Vec<GpuWeight>, Vec<Matrix>), CudaError> {
    let mut ws = Vec::with_capacity(groups);
    let mut cpu_ws = Vec::with_capacity(groups);
    for g in 0..groups {
        let (gw, cpu_w) = weight(gpu, "fp8", &random(seed, &format!("{key}.{g}"), r * gin, 0.08), r, gin)?;
        ws.push(gw);
        cpu_ws.push(cpu_w);
    }
    Ok((ws, cpu_ws))
}

/// The CPU's grouped output projection (spec §4.7) for the checks: for each group g, columns
/// g·gin .. of the `t` rows of `x` (`[t, G·gin]`, gin = `ws[g].cols`) through `ws[g]`
/// (`ops::linear`) into columns g·r .. of the result `[t, G·r]` (r = `ws[g].rows`; every group
/// one shape).
pub(crate) fn grouped_linear_cpu(x: &[f32], t: usize, ws: &[Matrix]) -> Vec<f32> {
    let groups = ws.len();
    let (Some(w0), true) = (ws.first(), t > 0) else { return Vec::new() };
    let (r, gin) = (w0.rows, w0.cols);
    let mut out = vec![0f32; t * groups * r];
    for (g, w) in ws.iter().enumerate() {
        let xg: Vec<f32> = (0..t).flat_map(|ti| x[(ti * groups + g) * gin..(ti * groups + g + 1) * gin].to_vec()).collect();
        for (ti, row) in ops::linear(&xg, w).chunks(r).enumerate() {
            out[(ti * groups + g) * r..(ti * groups + g + 1) * r].copy_from_slice(row);
        }
    }
    out
}

/// Builds a weight in `format` from f32 values; returns it and the CPU-side dequantized matrix.
pub(crate) fn weight(gpu: &Gpu, format: &str, vals: &[f32], rows: usize, cols: usize) -> Result<(GpuWeight, Matrix), CudaError> {
    let q = |e: quant::QuantError| CudaError::Unsupported { what: "quantize", detail: e.to_string() };
    let (data, deq) = match format {
        "f32" => (GpuMatrix::F32(gpu.upload(vals)?), vals.to_vec()),
        "bf16" => {
            let bits: Vec<u16> = vals.iter().map(|v| quant::f32_to_bf16(*v)).collect();
            let deq = bits.iter().map(|b| quant::bf16_to_f32(*b)).collect();
            (GpuMatrix::Bf16(gpu.upload(&bits)?), deq)
        }
        "fp8" => {
            let (w, s) = quant::quantize_fp8_blocked(vals, rows, cols, 128).map_err(q)?;
            let deq = quant::dequant_fp8_blocked(&w, rows, cols, quant::BlockScales::Ue8m0(&s), 128).map_err(q)?;
            (GpuMatrix::Fp8 { w: gpu.upload(&w)?, scales: gpu.upload(&s)? }, deq)
        }
        "fp4" => {
            let (w, s) = quant::quantize_fp4_grouped(vals, rows, cols, 32).map_err(q)?;
            let deq = quant::dequant_fp4_grouped(&w, rows, cols, &s, 32).map_err(q)?;
            (GpuMatrix::Fp4 { w: gpu.upload(&w)?, scales: gpu.upload(&s)?, fold: super::ops_q8::fp4_fold_exact(&s, cols) }, deq)
        }
        other => return Err(CudaError::Unsupported { what: "weight format", detail: other.into() }),
    };
    Ok((GpuWeight { rows, cols, data }, Matrix { rows, cols, data: deq }))
}

/// What [`run`] does.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Timed repeats per measurement.
    pub repeats: usize,
    /// Skip the parity checks (timings only, e.g. under a profiler).
    pub skip_checks: bool,
    /// Only time weights whose label contains this text.
    pub only: Option<String>,
    /// Golden models folder for the end-to-end checks (skipped when None).
    pub goldens: Option<std::path::PathBuf>,
    /// Greedy steps compared per golden model.
    pub greedy_steps: usize,
    /// A checkpoint in stored formats (e.g. the embedded default model) to check end to end.
    pub stored_model: Option<std::path::PathBuf>,
    /// Token counts of the Flash-shaped MoE layer timings.
    pub moe_tokens: Vec<usize>,
    /// Checkpoint for the switch parity matrix (`check_switches`; run with `only = "switches"` or
    /// after the model checks when set).
    pub switch_model: Option<std::path::PathBuf>,
}

/// Runs every check and timing; returns the JSON report and whether all checks passed.
pub fn run(gpu: &Gpu, seed: u64, opts: &CheckOptions) -> Result<(Value, bool), CudaError> {
    let repeats = opts.repeats.max(1);
    let mut out = Vec::new();
    let mut all = true;
    // `--only tc…` limits the run to the tensor-core linear (gemm.cu): its checks and timings.
    let tc_only = opts.only.as_deref().is_some_and(|o| o.starts_with("tc"));
    // `--only moe…` limits it to the grouped MoE (ops_moe.rs): its parity matrix and layer timings.
    let moe_only = opts.only.as_deref().is_some_and(|o| o.starts_with("moe"));
    // `--only switches`: only the switch parity matrix (needs `switch_model`).
    if opts.only.as_deref().is_some_and(|o| o.starts_with("switch")) {
        if let Some(dir) = &opts.switch_model {
            all &= super::check_switches::run(gpu, dir, opts.greedy_steps.min(16), &mut out)?;
        }
        return Ok((report(gpu, seed, all, out, Vec::new()), all));
    }
    // `--only wo_a` (or `gemv`): the grouped output projection below 64 tokens, strided against
    // gathered, and the one-token gemvs' row prefetch (LINEAR_T1_PREFETCH).
    if matches!(opts.only.as_deref(), Some("wo_a" | "gemv")) {
        let (ok, timings) = grouped_wo_a(gpu, seed, repeats, &mut out)?;
        all &= ok;
        return Ok((report(gpu, seed, all, out, timings), all));
    }
    // `--only q8`: the FP8-activation linear layers (official numerics, TC_LINEAR=fp8).
    if opts.only.as_deref().is_some_and(|o| o.starts_with("q8")) {
        if !opts.skip_checks {
            all &= super::check_q8::run(gpu, seed, &mut out)?;
            all &= super::check_moe::run_official(gpu, seed, &mut out)?;
        }
        let timings = super::check_q8::timings(gpu, seed, repeats)?;
        return Ok((report(gpu, seed, all, out, timings), all));
    }
    if moe_only {
        if !opts.skip_checks {
            all &= super::check_moe::run(gpu, seed, &mut out)?;
        }
        let timings = super::check_moe::timings(gpu, seed, repeats, &opts.moe_tokens)?;
        all &= super::check_moe::timing_checks_pass(&timings);
        return Ok((report(gpu, seed, all, out, timings), all));
    }
    // `--only mhc`: the mHC kernels, the row norms and RoPE (checks against the CPU, batch
    // invariance) and their timings at a Flash prefill chunk (the largest `moe_tokens`, default 8,192).
    if opts.only.as_deref().is_some_and(|o| o.starts_with("mhc")) {
        if !opts.skip_checks {
            all &= norm_rope_checks(gpu, seed, &mut out)?;
            all &= super::check_mhc::run(gpu, seed, &mut out)?;
        }
        let t = opts.moe_tokens.iter().copied().max().unwrap_or(8192).max(1);
        let timings = super::check_mhc::timings(gpu, seed, repeats, t)?;
        return Ok((report(gpu, seed, all, out, timings), all));
    }
    // `--only sample`: sampling on the device (top-k selection; generations need the goldens).
    if opts.only.as_deref().is_some_and(|o| o.starts_with("sampl")) {
        all &= super::check_sample::run(gpu, seed, &mut out)?;
        return Ok((report(gpu, seed, all, out, Vec::new()), all));
    }
    // `--only att…`: the attention family (attention incl. the mask path and fast exp, compressors,
    // indexer incl. the fused top-k) and its timings.
    if opts.only.as_deref().is_some_and(|o| o.starts_with("att")) {
        if !opts.skip_checks {
            all &= super::check_attention::run(gpu, seed, &mut out)?;
        }
        let timings = super::check_attention::timings(gpu, seed, repeats, 2048, 8192)?;
        return Ok((report(gpu, seed, all, out, timings), all));
    }
    if !opts.skip_checks {
        all &= tc_checks(gpu, seed, &mut out)?;
        all &= super::check_q8::run(gpu, seed, &mut out)?;
    }
    if !opts.skip_checks && !tc_only {

    all &= norm_rope_checks(gpu, seed, &mut out)?;

    // Linear layers in every stored format on Flash shapes (spec §2), several token counts.
    let shapes: &[(&str, &str, usize, usize)] = &[
        ("fp8", "attn.wq_a", 1024, 4096),
        ("fp8", "attn.wq_b", 32768, 1024),
        ("fp8", "attn.wo_b", 4096, 8192),
        ("fp4", "expert.w1", 2048, 4096),
        ("fp4", "expert.w2", 4096, 2048),
        ("bf16", "compressor.wkv", 1024, 4096),
        ("f32", "hc_attn_fn", 24, 16384),
    ];
    for (fmt, name, rows, cols) in shapes {
        let vals = random(seed, &format!("lin.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, *rows, *cols)?;
        for t in [1usize, 5, 16] {
            let x = random(seed, &format!("lin.x.{name}.{t}"), t * cols, 1.0);
            let cpu = ops::linear(&x, &cpu_w);
            let dx = gpu.upload(&x)?;
            let mut dy = gpu.zeros::<f32>(t * rows)?;
            gpu.linear(&dx, &gw, &mut dy, t)?;
            all &= record(&mut out, &format!("linear_{fmt} {name}"), json!([t, rows, cols]), &gpu.download(&dy)?, &cpu);
        }
    }

    let (ok, wo_a_timings) = grouped_wo_a(gpu, seed, repeats, &mut out)?;
    all &= ok;
    out.extend(wo_a_timings.into_iter().map(|mut v| {
        v["informational"] = json!(true);
        v
    }));

    all &= super::check_attention::run(gpu, seed, &mut out)?;
    all &= super::check_mhc::run(gpu, seed, &mut out)?;
    all &= super::check_moe::run(gpu, seed, &mut out)?;
    all &= super::check_sample::run(gpu, seed, &mut out)?;
    if let Some(g) = &opts.goldens {
        all &= super::check_model::run(gpu, g, opts.greedy_steps, &mut out)?;
    }
    if let Some(dir) = &opts.stored_model {
        all &= super::check_model::run_stored(gpu, dir, opts.greedy_steps.min(32), &mut out)?;
    }
    if let Some(dir) = &opts.switch_model {
        all &= super::check_switches::run(gpu, dir, opts.greedy_steps.min(16), &mut out)?;
    }
    }

    // Timings: decode (T=1) linear layers, CUDA events, median of `repeats` after warm-up.
    // Several copies of each weight are rotated so that repeats do not hit a warm L2 (50 MB).
    let mut timings = Vec::new();
    // Each is also timed as all copies back to back between one pair of events (per launch: the
    // total / copies), which leaves out the GPU's wait for each launch.
    let timed: &[(&str, &str, usize, usize, usize)] = &[
        ("fp8", "attn.wq_b (x8 copies)", 32768, 1024, 8),
        ("fp8", "attn.wo_a", 8192, 4096, 4),
        ("fp8", "attn.wo_b (x4)", 4096, 8192, 4),
        ("fp8", "attn.wq_a (x16)", 1024, 4096, 16),
        ("fp8", "shared w1 (x16)", 2048, 4096, 16),
        ("fp4", "6 experts w1 (x16)", 2048, 4096, 16),
        ("fp4", "6 experts w2 (x16)", 4096, 2048, 16),
        ("bf16", "compressor wkv (x16)", 1024, 4096, 16),
        ("bf16", "head (vocab 129280)", 129280, 4096, 1),
    ];
    for (fmt, name, rows, cols, copies) in timed {
        if opts.only.as_ref().is_some_and(|o| !name.contains(o.as_str()) && !fmt.contains(o.as_str())) {
            continue;
        }
        let mut ws = Vec::new();
        let mut bytes = 0usize;
        for c in 0..*copies {
            let vals = random(seed, &format!("time.{name}.{c}"), rows * cols, (3.0 / *cols as f64).sqrt());
            let (gw, _) = weight(gpu, fmt, &vals, *rows, *cols)?;
            bytes = match *fmt {
                "fp8" => rows * cols + rows.div_ceil(128) * cols.div_ceil(128),
                "fp4" => rows * cols / 2 + rows * cols / 32,
                "bf16" => rows * cols * 2,
                _ => rows * cols * 4,
            };
            ws.push(gw);
        }
        let x = gpu.upload(&random(seed, "time.x", *cols, 1.0))?;
        let mut y = gpu.zeros::<f32>(*rows)?;
        for w in ws.iter().cycle().take(3 * ws.len()) {
            gpu.linear(&x, w, &mut y, 1)?;
        }
        gpu.sync()?;
        let mut times = Vec::new();
        for i in 0..repeats {
            let w = &ws[i % ws.len()];
            let start = gpu.record_event()?;
            gpu.linear(&x, w, &mut y, 1)?;
            let end = gpu.record_event()?;
            times.push(super::gpu::elapsed_s(&start, &end)? * 1e3);
        }
        let single_ms = median(&mut times);
        let gbps = bytes as f64 / (single_ms * 1e-3) / 1e9;
        let batched_ms = median_ms(gpu, repeats.div_ceil(ws.len()).max(3), || {
            for w in &ws {
                gpu.linear(&x, w, &mut y, 1)?;
            }
            Ok(())
        })? / ws.len() as f64;
        let batched_gbps = bytes as f64 / (batched_ms * 1e-3) / 1e9;
        println!(
            "time linear_{fmt} {name:<24} T=1 [{rows}x{cols}] median {:.1} us  {gbps:.0} GB/s  ({:.0}% of 4.2 TB/s); back to back {:.1} us  {batched_gbps:.0} GB/s  ({:.0}%)",
            single_ms * 1e3,
            gbps / 42.0,
            batched_ms * 1e3,
            batched_gbps / 42.0
        );
        timings.push(json!({"op": format!("linear_{fmt}"), "weight": name, "rows": rows, "cols": cols, "tokens": 1,
            "weight_bytes": bytes, "median_us": single_ms * 1e3, "gb_per_s": gbps, "fraction_of_4_2_tb_s": gbps / 4200.0, "repeats": repeats,
            "back_to_back_us": batched_ms * 1e3, "back_to_back_gb_per_s": batched_gbps}));
    }
    if opts.only.is_none() || tc_only {
        timings.extend(tc_timings(gpu, seed, repeats)?);
        timings.extend(super::check_q8::timings(gpu, seed, repeats)?);
    }
    if opts.only.is_none() {
        let moe = super::check_moe::timings(gpu, seed, repeats, &opts.moe_tokens)?;
        all &= super::check_moe::timing_checks_pass(&moe);
        timings.extend(moe);
    }
    if opts.only.is_none() {
        timings.extend(super::check_attention::timings(gpu, seed, repeats, 2048, 8192)?);
    }
    Ok((report(gpu, seed, all, out, timings), all))
}

/// The JSON report of a run (every `--only` variant): device, NVRTC, seed, verdict, records, timings.
fn report(gpu: &Gpu, seed: u64, all: bool, ops: Vec<Value>, timings: Vec<Value>) -> Value {
    json!({
        "gpu": gpu.ctx.name().unwrap_or_default(),
        "arch": gpu.arch,
        "nvrtc": super::nvrtc::version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_default(),
        "seed": seed,
        "kernel_defines": super::nvrtc::kernel_defines_in_effect(),
        "all_pass": all,
        "ops": ops,
        "timings": timings,
    })
}

/// The median of `v` (sorted in place; the upper middle value for an even count), NaN when empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Median time in ms of `f` over `repeats` runs (after one warm-up), CUDA events around each.
pub(crate) fn median_ms(gpu: &Gpu, repeats: usize, mut f: impl FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
    f()?;
    gpu.sync()?;
    let mut times = Vec::new();
    for _ in 0..repeats.max(1) {
        let start = gpu.record_event()?;
        f()?;
        let end = gpu.record_event()?;
        times.push(super::gpu::elapsed_s(&start, &end)? * 1e3);
    }
    Ok(median(&mut times))
}

/// [`median_ms`] of `f` with the on/off switch `name` on, then off: `(on_ms, off_ms)`.
pub(crate) fn switch_on_off_ms(gpu: &Gpu, repeats: usize, name: &str, mut f: impl FnMut() -> Result<(), CudaError>) -> Result<(f64, f64), CudaError> {
    let on = switch_scope(&[(name, "on")], || median_ms(gpu, repeats, &mut f))?;
    let off = switch_scope(&[(name, "off")], || median_ms(gpu, repeats, &mut f))?;
    Ok((on, off))
}

/// How many values of `a` and `b` differ in their bits (a length difference counts each missing
/// value): 0 is the "same bits" the checks promise.
pub(crate) fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count() + a.len().abs_diff(b.len())
}

/// How many values of `a` and `b` differ (`!=`; a length difference counts each missing value):
/// [`differing_bits`] for bytes, indices and other exact types.
pub(crate) fn differing_values<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

/// RMSNorm (both kernels: rows of ≤ 1,024 values one warp per row, wider ones one block per row),
/// RoPE and its inverse, and the fused per-head norm + RoPE, against the CPU (spec §3.1, §3.2, §4.6);
/// plus the norm's batch invariance (a row's bits alone = in a batch).
fn norm_rope_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    // The CPU reference: rows of n, weighted by w or unweighted.
    let cpu_norm = |x: &[f32], w: &[f32], n: usize, weighted: bool| {
        let mut y = x.to_vec();
        if weighted {
            ops::rms_norm(&mut y, w, 1e-6);
        } else {
            ops::rms_norm_unweighted(&mut y, n, 1e-6);
        }
        y
    };
    // RMSNorm: weighted over the hidden size, unweighted per head (spec §3.1).
    for (rows, n, weighted) in [(64usize, 4096usize, true), (64 * 64, 512, false), (7, 1000, true), (9, 128, true), (5, 1030, true), (3, 130, false)] {
        let x = random(seed, &format!("norm.x.{n}"), rows * n, 3.0);
        let w: Vec<f32> = random(seed, &format!("norm.w.{n}"), n, 0.5).iter().map(|v| 1.0 + v).collect();
        let cpu = cpu_norm(&x, &w, n, weighted);
        let dx = gpu.upload(&x)?;
        let dw = gpu.upload(&w)?;
        let mut dy = gpu.zeros::<f32>(rows * n)?;
        gpu.rms_norm(&dx, weighted.then_some(&dw), &mut dy, rows, n, 1e-6)?;
        all &= record(out, if weighted { "rms_norm" } else { "rms_norm_unweighted" }, json!([rows, n]), &gpu.download(&dy)?, &cpu);
    }

    // RoPE with Flash's compress rope (θ 160000 + YaRN) and its inverse (spec §3.2, §4.6).
    let yarn = Yarn { factor: 16.0, original_max_position_embeddings: 65536.0, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0, truncate: true };
    let rope = Rope::new(&RopeParams { theta: 160000.0, yarn: Some(yarn) }, 64);
    let (tokens, heads, hd, pos0) = (16usize, 64usize, 512usize, 100_000usize);
    let x = random(seed, "rope.x", tokens * heads * hd, 2.0);
    let inv = gpu.upload(rope.inv_freq())?;
    // Also rows not a multiple of the kernel's rows per block (8 at 32 pairs): 3 tokens × 3 heads of 128.
    let ragged = random(seed, "rope.x.ragged", 3 * 3 * 128, 2.0);
    for (name, x, tokens, heads, hd, pos0, inverse) in [("rope", &x, tokens, heads, hd, pos0, false), ("rope_inverse", &x, tokens, heads, hd, pos0, true), ("rope ragged", &ragged, 3, 3, 128, 7, false)] {
        let mut cpu = x.clone();
        for (i, head) in cpu.chunks_mut(hd).enumerate() {
            rope.apply(head, pos0 + i / heads, inverse);
        }
        let mut dx = gpu.upload(x)?;
        gpu.rope(&mut dx, &inv, &rope, tokens, heads, hd, pos0, inverse)?;
        all &= record(out, name, json!([tokens, heads, hd, pos0]), &gpu.download(&dx)?, &cpu);
    }

    // The fused norm + RoPE: the per-head q norm (unweighted, 64 heads), the kv norm (weighted, 1
    // head), and a rotated slice starting inside a float4 ((n − rope_dim) % 4 == 2: RoPE on 62 of 128).
    let rope62 = Rope::new(&RopeParams { theta: 10000.0, yarn: None }, 62);
    let inv62 = gpu.upload(rope62.inv_freq())?;
    let cases = [("heads=64", &rope, &inv, tokens, 64usize, hd, pos0, false), ("heads=1", &rope, &inv, tokens, 1, hd, pos0, true), ("rope 62 of 128", &rope62, &inv62, 5, 3, 128, 77, false)];
    for (label, rope, inv, tokens, heads, hd, pos0, weighted) in cases {
        let x = random(seed, &format!("normrope.x.{label}"), tokens * heads * hd, 3.0);
        let w: Vec<f32> = random(seed, "normrope.w", hd, 0.5).iter().map(|v| 1.0 + v).collect();
        let mut cpu = cpu_norm(&x, &w, hd, weighted);
        for (i, row) in cpu.chunks_mut(hd).enumerate() {
            rope.apply(row, pos0 + i / heads, false);
        }
        let dx = gpu.upload(&x)?;
        let dw = gpu.upload(&w)?;
        let mut dy = gpu.zeros::<f32>(tokens * heads * hd)?;
        gpu.rms_norm_rope(&dx, weighted.then_some(&dw), &mut dy, tokens, heads, hd, 1e-6, inv, rope, pos0)?;
        let got = gpu.download(&dy)?;
        all &= record(out, &format!("rms_norm+rope {label}"), json!([tokens, heads, hd, pos0]), &got, &cpu);
        // Same bits as the two kernels one after the other (the shared rotation expression).
        let mut dz = gpu.zeros::<f32>(tokens * heads * hd)?;
        gpu.rms_norm(&dx, weighted.then_some(&dw), &mut dz, tokens * heads, hd, 1e-6)?;
        gpu.rope(&mut dz, inv, rope, tokens, heads, hd, pos0, false)?;
        let differ = differing_bits(&got, &gpu.download(&dz)?);
        all &= flag_record(out, &format!("rms_norm+rope {label} bits"), json!({"differing_values": differ, "of": got.len(), "vs": "rms_norm then rope"}), differ == 0);
        // Batch invariance: the first token's rows alone give the same bits.
        let mut d1 = gpu.zeros::<f32>(heads * hd)?;
        gpu.rms_norm_rope(&dx, weighted.then_some(&dw), &mut d1, 1, heads, hd, 1e-6, inv, rope, pos0)?;
        let differ = differing_bits(&got[..heads * hd], &gpu.download(&d1)?);
        all &= flag_record(out, &format!("rms_norm+rope {label} T=1 bits"), json!({"differing_values": differ, "of": heads * hd, "vs": format!("the same rows in a batch of {tokens} tokens")}), differ == 0);
    }
    Ok(all)
}

/// Runs `f` with switch overrides (errors from the registry become check errors).
pub(crate) fn switch_scope<R>(overrides: &[(&str, &str)], f: impl FnOnce() -> Result<R, CudaError>) -> Result<R, CudaError> {
    crate::switches::scoped(overrides, f).map_err(|e| CudaError::Unsupported { what: "switch", detail: e.to_string() })?
}

/// `LINEAR_CUBLASLT`: cuBLASLt's bf16 GEMMs on the split planes ([`Gpu::linear_split_lt`]) against
/// the CPU (tolerance [`SPLIT_NMSE_TOL`], as gemm.cu's split kernels) and, informationally, against
/// gemm.cu; formats and shapes it must decline (FP4, K not a multiple of 16, outputs narrower than
/// [`super::cublaslt::LT_MIN_ROWS`]); the grouped output projection ([`Gpu::grouped_linear_lt`],
/// strided rows) against the CPU per group.
fn lt_split_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let shapes: &[(&str, &str, usize, usize, usize, bool)] = &[
        ("fp8", "attn.wq_b", 32768, 1024, 1000, true),
        ("fp8", "attn.wo_b", 4096, 8192, 300, true),
        ("bf16", "compressor.wkv", 1024, 4096, 2048, true),
        ("fp8", "ragged", 1000, 1040, 257, true),
        ("fp4", "expert.w1", 2048, 4096, 300, false),
        ("bf16", "ragged", 1030, 776, 300, false),
        ("bf16", "indexer.weights_proj", 64, 4096, 300, false),
    ];
    for (fmt, name, rows, cols, t, takes) in shapes {
        let vals = random(seed, &format!("lt2.{fmt}.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, *rows, *cols)?;
        let x = random(seed, &format!("lt2.x.{fmt}.{name}"), t * cols, 1.0);
        let dx = gpu.upload(&x)?;
        let (xb, tp, kp) = gpu.bf16_planes(&dx, *t, *cols, true)?;
        let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
        let ran = gpu.linear_split_lt(&xb, Some(tp * kp), kp, 0, &gw, &mut dy, *rows, 0, *t)?;
        if !takes {
            all &= flag_record(out, &format!("linear_split_lt {fmt} {name} declined"), json!({"shape": [t, rows, cols], "ran": ran}), !ran);
            continue;
        }
        println!("linear_split_lt {fmt} {name}: cuBLASLt {}", if ran { "ran" } else { "unavailable (fallback)" });
        out.push(json!({"op": format!("linear_split_lt {fmt} {name} ran"), "cublaslt_ran": ran, "informational": true}));
        if !ran {
            continue;
        }
        let got = gpu.download(&dy)?;
        let (nmse, max_abs, _) = errors(&got, &ops::linear(&x, &cpu_w));
        let ok = nmse <= SPLIT_NMSE_TOL && got.iter().all(|v| v.is_finite());
        all &= flag_record(out, &format!("linear_split_lt {fmt} {name}"), json!({"shape": [t, rows, cols], "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": SPLIT_NMSE_TOL}), ok);
        let mut dk = gpu.zeros::<f32>(t * rows)?;
        switch_scope(&[("LINEAR_CUBLASLT", "off")], || gpu.linear_tc(&dx, &gw, &mut dk, *t, None, true))?;
        let (nmse, max_abs, _) = errors(&got, &gpu.download(&dk)?);
        println!("linear_split_lt {fmt} {name} vs gemm.cu split (informational): nmse {nmse:.3e} max_abs {max_abs:.3e}");
        // cuBLAS documents bitwise reproducibility on one GPU model and library version: checked.
        let mut again = gpu.zeros::<f32>(t * rows)?;
        gpu.linear_split_lt(&xb, Some(tp * kp), kp, 0, &gw, &mut again, *rows, 0, *t)?;
        let same = differing_bits(&gpu.download(&again)?, &got) == 0;
        all &= flag_record(out, &format!("linear_split_lt {fmt} {name} repeatable"), json!({"bitwise_equal": same}), same);
        out.push(json!({"op": format!("linear_split_lt {fmt} {name} vs gemm.cu split"), "nmse": nmse, "max_abs": max_abs, "informational": true}));
    }
    // The grouped output projection: G groups of [r, gin] over o [t, G·gin].
    let (groups, gin, r, t) = (8usize, 512usize, 256usize, 300usize);
    let o = random(seed, "lt2.o", t * groups * gin, 1.0);
    let (ws, cpu_ws) = fp8_group_weights(gpu, seed, "lt2.woa", groups, r, gin)?;
    let want = grouped_linear_cpu(&o, t, &cpu_ws);
    let mut dz = gpu.upload(&vec![f32::NAN; t * groups * r])?;
    if gpu.grouped_linear_lt(&gpu.upload(&o)?, &ws, &mut dz, t, true)? == groups {
        let got = gpu.download(&dz)?;
        let (nmse, max_abs, _) = errors(&got, &want);
        let ok = nmse <= SPLIT_NMSE_TOL && got.iter().all(|v| v.is_finite());
        all &= flag_record(out, "grouped_linear_lt fp8 [8 × 256, 512]", json!({"shape": [t, groups, r, gin], "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": SPLIT_NMSE_TOL}), ok);
    }
    Ok(all)
}

/// The grouped output projection `wo_a` (spec §4.7; Flash: 8 groups of FP8 [1024, 4096]) below 64
/// tokens: [`Gpu::grouped_linear_gemv`] (switch `WO_A_STRIDED`: each group's gemv reads its
/// columns of the attention output and writes its columns of z in place) against
/// [`Gpu::grouped_linear_gather`] (gather, gemv, scatter per group) bit for bit at T = 1, 3, 17 and
/// 63, and both against the CPU (`ops::linear` per group on the dequantized weights, NMSE within
/// [`NMSE_TOL`]); then both timed at T = 1 (median of `repeats` after a warm-up, CUDA events).
/// Returns whether every check passed and the timings.
///
/// Errors: launch and transfer failures.
fn grouped_wo_a(gpu: &Gpu, seed: u64, repeats: usize, out: &mut Vec<Value>) -> Result<(bool, Vec<Value>), CudaError> {
    let (groups, r, gin) = (8usize, 1024usize, 4096usize);
    let mut ws = Vec::new();
    let mut cpu_ws = Vec::new();
    for g in 0..groups {
        let vals = random(seed, &format!("wo_a.{g}"), r * gin, (3.0 / gin as f64).sqrt());
        let (w, c) = weight(gpu, "fp8", &vals, r, gin)?;
        ws.push(w);
        cpu_ws.push(c);
    }
    let table = super::gpu::GpuGroupTable::build(gpu, &ws)?;
    let mut all = flag_record(out, "wo_a group table", json!({"built": table.is_some()}), table.is_some());
    for t in [1usize, 3, 17, 63] {
        let o = random(seed, &format!("wo_a.o.{t}"), t * groups * gin, 1.0);
        let d_o = gpu.upload(&o)?;
        let mut zg = gpu.zeros::<f32>(t * groups * r)?;
        gpu.grouped_linear_gather(&d_o, &ws, 0, &mut zg, t, gin)?;
        let mut zs = gpu.zeros::<f32>(t * groups * r)?;
        let ran = gpu.grouped_linear_gemv(&d_o, &ws, 0, &mut zs, t, gin, None)?;
        let mut z1 = gpu.zeros::<f32>(t * groups * r)?;
        let ran1 = gpu.grouped_linear_gemv(&d_o, &ws, 0, &mut z1, t, gin, table.as_ref())?;
        let (a, b, c) = (gpu.download(&zg)?, gpu.download(&zs)?, gpu.download(&z1)?);
        let differing = |u: &[f32], v: &[f32]| u.iter().zip(v).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        let (d_s, d_1) = (differing(&a, &b), differing(&a, &c));
        all &= flag_record(out, "wo_a strided vs gather bits", json!({"tokens": t, "ran": ran, "differing": d_s, "compared": a.len()}), ran && d_s == 0);
        all &= flag_record(out, "wo_a one launch vs gather bits", json!({"tokens": t, "ran": ran1, "differing": d_1, "compared": a.len()}), ran1 && d_1 == 0);
        let mut cpu = vec![0f32; t * groups * r];
        for (g, w) in cpu_ws.iter().enumerate() {
            for ti in 0..t {
                let x = &o[(ti * groups + g) * gin..(ti * groups + g + 1) * gin];
                let y = ops::linear(x, w);
                cpu[(ti * groups + g) * r..(ti * groups + g + 1) * r].copy_from_slice(&y);
            }
        }
        all &= record(out, "wo_a strided vs cpu", json!([t, groups * r, groups * gin]), &b, &cpu);
    }
    // T = 1, each path timed alone (the weights, 32 MB, stay in L2 between repeats: launch and
    // fixed costs are what differ).
    let o = gpu.upload(&random(seed, "wo_a.time", groups * gin, 1.0))?;
    let mut z = gpu.zeros::<f32>(groups * r)?;
    let gather = median_ms(gpu, repeats, || gpu.grouped_linear_gather(&o, &ws, 0, &mut z, 1, gin))?;
    let strided = median_ms(gpu, repeats, || gpu.grouped_linear_gemv(&o, &ws, 0, &mut z, 1, gin, None).map(|_| ()))?;
    let one = median_ms(gpu, repeats, || gpu.grouped_linear_gemv(&o, &ws, 0, &mut z, 1, gin, table.as_ref()).map(|_| ()))?;
    println!("time wo_a grouped T=1 [8 x {r}x{gin}]  gather/gemv/scatter {:.1} us | strided gemv per group {:.1} us | one launch {:.1} us", gather * 1e3, strided * 1e3, one * 1e3);
    let mut timings = vec![json!({"op": "wo_a grouped", "tokens": 1, "groups": groups, "rows": r, "cols": gin, "gather_us": gather * 1e3, "strided_us": strided * 1e3, "one_launch_us": one * 1e3, "weight_bytes": groups * r * gin, "repeats": repeats})];
    // LINEAR_T1_PREFETCH on the one-launch grouped gemv: the same bits, and its time.
    let run1 = |sw: &'static str| -> Result<Vec<f32>, CudaError> {
        switch_scope(&[("LINEAR_T1_PREFETCH", sw)], || {
            let mut z = gpu.upload(&vec![f32::NAN; groups * r])?;
            gpu.grouped_linear_gemv(&o, &ws, 0, &mut z, 1, gin, table.as_ref())?;
            gpu.download(&z)
        })
    };
    let differ = differing_bits(&run1("on")?, &run1("off")?);
    all &= flag_record(out, "wo_a one launch T=1 prefetch bits", json!({"differing": differ, "compared": groups * r, "vs": "LINEAR_T1_PREFETCH=off"}), differ == 0);
    let (pf, plain) = switch_on_off_ms(gpu, repeats, "LINEAR_T1_PREFETCH", || gpu.grouped_linear_gemv(&o, &ws, 0, &mut z, 1, gin, table.as_ref()).map(|_| ()))?;
    let wbytes = (groups * r * gin) as f64;
    println!("time wo_a grouped T=1 one launch  prefetch {:.1} us {:.0} GB/s | off {:.1} us {:.0} GB/s", pf * 1e3, wbytes / (pf * 1e-3) / 1e9, plain * 1e3, wbytes / (plain * 1e-3) / 1e9);
    timings.push(json!({"op": "wo_a grouped one launch, LINEAR_T1_PREFETCH", "tokens": 1, "prefetch_us": pf * 1e3, "off_us": plain * 1e3, "weight_bytes": wbytes, "repeats": repeats}));
    let (ok, t1) = t1_prefetch(gpu, seed, repeats, out)?;
    all &= ok;
    timings.extend(t1);
    let (ok, mma) = super::check_q8::gemv_mma_checks(gpu, seed, repeats, out)?;
    all &= ok;
    timings.extend(mma);
    Ok((all, timings))
}

/// `LINEAR_T1_PREFETCH`: the one-token gemvs with the next row's loads issued before the current
/// row is reduced (`_t1p`) against `_t1`, bit for bit — every weight format, both entries, row counts that are not multiples
/// of the warps' rows (the last rows of a warp's group past N), the exact gemv ([`Gpu::linear_gemv`])
/// and the official one ([`Gpu::linear_official`]: `_q` with `LINEAR_FUSED_QUANT`) — and against the
/// CPU. Timings at T = 1 on Flash's decode linears (the weights re-read from L2 between repeats when
/// they fit its 50 MB: what differs is how much of each row is in flight).
fn t1_prefetch(gpu: &Gpu, seed: u64, repeats: usize, out: &mut Vec<Value>) -> Result<(bool, Vec<Value>), CudaError> {
    let mut all = true;
    let cases: &[(&str, &str, usize, usize)] = &[
        ("fp8", "attn.wq_b", 32768, 1024),
        ("fp8", "attn.wo_b", 4096, 8192),
        ("fp8", "attn.wq_a", 1024, 4096),
        ("fp8", "shared.w2", 4096, 2048),
        ("fp8", "odd [1001, 384]", 1001, 384),
        ("fp4", "expert.w1", 2048, 4096),
        ("fp4", "odd [77, 8192]", 77, 8192),
        ("bf16", "compressor.wkv", 1024, 4096),
        ("bf16", "odd [333, 1024]", 333, 1024),
        ("f32", "gate [256, 4096]", 256, 4096),
        ("f32", "odd [100, 512]", 100, 512),
    ];
    let mut timings = Vec::new();
    for (fmt, name, rows, cols) in cases {
        let (rows, cols) = (*rows, *cols);
        let vals = random(seed, &format!("t1pf.w.{name}"), rows * cols, (3.0 / cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, rows, cols)?;
        let x = random(seed, &format!("t1pf.x.{name}"), cols, 1.0);
        let dx = gpu.upload(&x)?;
        for official in [false, true] {
            let run = |sw: &'static str| -> Result<Vec<f32>, CudaError> {
                // (LINEAR_GEMV_MMA off: the official FP8 gemv is the prefetching one compared here.)
                switch_scope(&[("LINEAR_T1_PREFETCH", sw), ("LINEAR_GEMV_MMA", "off")], || {
                    let mut dy = gpu.upload(&vec![f32::NAN; rows])?;
                    if official {
                        gpu.linear_official(&dx, &gw, &mut dy, 1)?;
                    } else {
                        gpu.linear_gemv(&dx, &gw, &mut dy, 1)?;
                    }
                    gpu.download(&dy)
                })
            };
            let (pf, off) = (run("on")?, run("off")?);
            let differ = differing_bits(&pf, &off);
            let path = if official { "official" } else { "exact" };
            all &= flag_record(
                out,
                &format!("linear {path} T=1 prefetch {fmt} {name} bits"),
                json!({"shape": [1, rows, cols], "differing_values": differ, "of": rows, "vs": "LINEAR_T1_PREFETCH=off (_t1)", "finite": pf.iter().all(|v| v.is_finite())}),
                differ == 0 && pf.iter().all(|v| v.is_finite()),
            );
            if !official {
                all &= record(out, &format!("linear T=1 prefetch {fmt} {name} vs cpu"), json!([1, rows, cols]), &pf, &ops::linear(&x, &cpu_w));
            }
        }
        if !name.starts_with("odd") {
            let mut dy = gpu.zeros::<f32>(rows)?;
            let (on, off) = switch_on_off_ms(gpu, repeats, "LINEAR_T1_PREFETCH", || gpu.linear_gemv(&dx, &gw, &mut dy, 1))?;
            let bytes = super::model::weight_bytes(&gw);
            let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
            println!("time linear T=1 {fmt} {name:<16} [{rows}x{cols}]  prefetch {:.1} us {:.0} GB/s | off {:.1} us {:.0} GB/s", on * 1e3, gbs(on), off * 1e3, gbs(off));
            timings.push(json!({"op": "linear T=1, LINEAR_T1_PREFETCH", "format": fmt, "weight": name, "rows": rows, "cols": cols, "weight_bytes": bytes, "prefetch_us": on * 1e3, "prefetch_gb_per_s": gbs(on), "off_us": off * 1e3, "off_gb_per_s": gbs(off), "repeats": repeats}));
        }
    }
    Ok((all, timings))
}

/// Prints and appends a pass/fail record without an NMSE.
pub(crate) fn flag_record(out: &mut Vec<Value>, op: &str, detail: Value, ok: bool) -> bool {
    println!("{op:<28} {detail}  {}", if ok { "ok" } else { "FAIL" });
    out.push(json!({"op": op, "detail": detail, "pass": ok}));
    ok
}

/// The tensor-core linear (gemm.cu, `Gpu::linear_tc`) against the CPU reference on the dequantized
/// weights: every format on Flash shapes and on ragged shapes (T, N not multiples of the tiles, K not
/// a multiple of 32), T ∈ {64, 200, 1000}, every block tile, output poisoned with NaN first; the
/// `Gpu::linear` dispatch at T = 200; the wgmma tiles (sm_90a, `BF16_WGMMA`) bit for bit against
/// the Large mma.sync tile (measured equal on H200); bitwise repeatability; and an exact decode
/// check of every FP8 and FP4 byte under several scales (one-hot activations pick single weights).
fn tc_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let shapes: &[(&str, &str, usize, usize)] = &[
        ("fp8", "attn.wq_b", 32768, 1024),
        ("fp8", "attn.wo_b", 4096, 8192),
        ("fp4", "expert.w1", 2048, 4096),
        ("bf16", "compressor.wkv", 1024, 4096),
        ("f32", "ragged", 300, 1004),
        ("fp8", "ragged", 1000, 1040),
        ("fp4", "ragged", 1000, 2080),
        ("bf16", "ragged", 1030, 776),
        // Ragged in T and N with K a multiple of 64: the wgmma tile runs these too.
        ("fp8", "ragged n", 1000, 1088),
        ("fp4", "ragged n", 1000, 2112),
        ("bf16", "ragged n", 1030, 832),
    ];
    const TS: [usize; 3] = [64, 200, 1000];
    let tmax = TS[TS.len() - 1];
    for (fmt, name, rows, cols) in shapes {
        let vals = random(seed, &format!("tc.{fmt}.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, *rows, *cols)?;
        let x = random(seed, &format!("tc.x.{fmt}.{name}"), tmax * cols, 1.0);
        // Reference for the largest T; smaller T use its leading rows.
        let cpu = ops::linear(&x, &cpu_w);
        let dx = gpu.upload(&x)?;
        for t in TS {
            let reference = &cpu[..t * rows];
            // The Large tile's outputs (bf16, split): the wgmma tiles must give the same bits.
            let mut large: [Option<Vec<f32>>; 2] = [None, None];
            for tile in GemmTile::ALL {
                if tile.is_wgmma() && !gpu.bf16_wgmma(fmt, *cols) {
                    continue;
                }
                let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                gpu.linear_tc(&dx, &gw, &mut dy, t, Some(tile), false)?;
                let got = gpu.download(&dy)?;
                all &= record(out, &format!("linear_tc_{fmt} {name} {tile:?}"), json!([t, rows, cols]), &got, reference);
                let mut outputs = vec![got];
                if *fmt != "f32" {
                    // Split activations: near-f32 accuracy is the point, so a much tighter bound.
                    let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                    gpu.linear_tc(&dx, &gw, &mut dy, t, Some(tile), true)?;
                    let got = gpu.download(&dy)?;
                    let (nmse, max_abs, _) = errors(&got, reference);
                    let ok = nmse <= SPLIT_NMSE_TOL && got.iter().all(|v| v.is_finite());
                    all &= flag_record(out, &format!("linear_tc_{fmt}_x2 {name} {tile:?}"), json!({"shape": [t, rows, cols], "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": SPLIT_NMSE_TOL}), ok);
                    outputs.push(got);
                }
                for (p, got) in outputs.into_iter().enumerate() {
                    if tile == GemmTile::Large {
                        large[p] = Some(got);
                    } else if let (true, Some(want)) = (tile.is_wgmma(), &large[p]) {
                        let differ = differing_bits(&got, want);
                        let x2 = if p == 1 { "_x2" } else { "" };
                        all &= flag_record(out, &format!("linear_tc_{fmt}{x2} {name} {tile:?} bits"), json!({"shape": [t, rows, cols], "differing_values": differ, "of": got.len(), "vs": "Large (mma.sync)"}), differ == 0);
                    }
                }
            }
            if t == 200 {
                let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                gpu.linear(&dx, &gw, &mut dy, t)?;
                all &= record(out, &format!("linear_{fmt} {name} dispatch"), json!([t, rows, cols]), &gpu.download(&dy)?, reference);
            }
        }
        if *name == "attn.wq_b" {
            for split in [false, true] {
                let mut a = gpu.zeros::<f32>(tmax * rows)?;
                let mut b = gpu.zeros::<f32>(tmax * rows)?;
                gpu.linear_tc(&dx, &gw, &mut a, tmax, None, split)?;
                gpu.linear_tc(&dx, &gw, &mut b, tmax, None, split)?;
                let same = differing_bits(&gpu.download(&a)?, &gpu.download(&b)?) == 0;
                all &= flag_record(out, "linear_tc repeatable", json!({"format": fmt, "split": split, "shape": [tmax, rows, cols], "bitwise_equal": same}), same);
            }
        }
    }

    all &= lt_split_checks(gpu, seed, out)?;
    all &= linear_multi_checks(gpu, seed, out)?;

    // Exact decode: x[t, k] = (k == t), so y[t, n] = W[n, t] with no rounding anywhere.
    let (t, k) = (128usize, 128usize);
    let mut onehot = vec![0f32; t * k];
    for i in 0..t {
        onehot[i * k + i] = 1.0;
    }
    let dx = gpu.upload(&onehot)?;
    let q = |e: quant::QuantError| CudaError::Unsupported { what: "dequantize", detail: e.to_string() };
    // FP8: every byte but the NaNs 0x7F/0xFF (not reproduced on this path), row blocks with scales
    // 2^-27, 2^-8 and 2^13 (the last takes the two-multiply branch).
    let rows = 384;
    let w8: Vec<u8> = (0..rows * k).map(|i| ((i / k) * 7 + i % k) as u8).map(|b| if b & 0x7f == 0x7f { 0 } else { b }).collect();
    let s8 = vec![100u8, 119, 140];
    let d8 = quant::dequant_fp8_blocked(&w8, rows, k, quant::BlockScales::Ue8m0(&s8), 128).map_err(q)?;
    let g8 = GpuWeight { rows, cols: k, data: GpuMatrix::Fp8 { w: gpu.upload(&w8)?, scales: gpu.upload(&s8)? } };
    // FP4: every byte, group scales from 2^-127 (bf16 subnormal) to 2^123.
    let rows4 = 256;
    let w4: Vec<u8> = (0..rows4 * k / 2).map(|i| ((i / (k / 2)) + i % (k / 2)) as u8).collect();
    let s4: Vec<u8> = (0..rows4 * k / 32).map(|i| [0u8, 1, 60, 127, 200, 250][i % 6]).collect();
    let d4 = quant::dequant_fp4_grouped(&w4, rows4, k, &s4, 32).map_err(q)?;
    let g4 = GpuWeight { rows: rows4, cols: k, data: GpuMatrix::Fp4 { w: gpu.upload(&w4)?, scales: gpu.upload(&s4)?, fold: super::ops_q8::fp4_fold_exact(&s4, k) } };
    for (fmt, gw, deq, rows) in [("fp8", &g8, d8, rows), ("fp4", &g4, d4, rows4)] {
        let cpu = ops::linear(&onehot, &Matrix { rows, cols: k, data: deq });
        for (tile, split) in GemmTile::ALL.iter().map(|t| (*t, false)).chain([(GemmTile::Large, true), (GemmTile::Wgmma, true), (GemmTile::WgmmaWide, true)]) {
            if tile.is_wgmma() && !gpu.bf16_wgmma(fmt, k) {
                continue;
            }
            let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
            gpu.linear_tc(&dx, gw, &mut dy, t, Some(tile), split)?;
            let got = gpu.download(&dy)?;
            let bad = got.iter().zip(&cpu).filter(|(a, b)| a.to_bits() != b.to_bits() && !(**a == 0.0 && **b == 0.0)).count();
            let x2 = if split { "_x2" } else { "" };
            all &= flag_record(out, &format!("linear_tc_{fmt}{x2} exact decode {tile:?}"), json!({"shape": [t, rows, k], "mismatches": bad}), bad == 0);
        }
    }
    Ok(all)
}

/// `Gpu::linear_multi` (one activation conversion for several weights: the compressors' `wkv` and
/// `wgate`, in a CSA layer with the indexer compressor's and `weights_proj`) against one
/// `Gpu::linear` per weight, bit for bit: bf16 weights of 512, 384 and 64 rows (the last as narrow
/// as `weights_proj`, below cuBLASLt's `LT_MIN_ROWS`) on 300 tokens of 1,024 inputs with split
/// activations (`LINEAR_CUBLASLT` on and off) and with `TC_LINEAR=bf16`, and the 384-row one as
/// FP8; each record says that the shared conversion ran (`gpu::linear_multi_shares`), which a
/// record that passes needs. The last record puts a 384-row f32 weight (the f32 kernel's, as an
/// f32 `weights_proj` would be) between the two bf16 ones: those two still share one conversion
/// and the f32 one runs alone (its `sharing` field names the sharing weights; `shared_conversion`
/// comes from `linear_multi_shares` on the pairs, the route-and-width rule `linear_multi` applies
/// to each weight against the first tensor-core one). Then `COMPRESSOR_BF16`'s
/// `Gpu::linear_multi_planes` (the hi plane alone) against the CPU's product of the bf16-rounded
/// input ([`SPLIT_NMSE_TOL`]) with `LINEAR_CUBLASLT` on and off, and against the split products
/// (reported).
fn linear_multi_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (k, r1, r2, r3, t) = (1024usize, 512usize, 384usize, 64usize, 300usize);
    let (w1, m1) = weight(gpu, "bf16", &random(seed, "multi.w1", r1 * k, 0.05), r1, k)?;
    let (w2, m2) = weight(gpu, "bf16", &random(seed, "multi.w2", r2 * k, 0.05), r2, k)?;
    let (w3, m3) = weight(gpu, "bf16", &random(seed, "multi.w3", r3 * k, 0.05), r3, k)?;
    let (w8, _) = weight(gpu, "fp8", &random(seed, "multi.w8", r2 * k, 0.05), r2, k)?;
    let (wf, _) = weight(gpu, "f32", &random(seed, "multi.wf", r2 * k, 0.05), r2, k)?;
    let hx = random(seed, "multi.x", t * k, 1.0);
    let dx = gpu.upload(&hx)?;
    let mut all = true;
    for (label, overrides, second) in [
        ("split, LINEAR_CUBLASLT=on", [("TC_LINEAR", "split"), ("LINEAR_CUBLASLT", "on")], &w2),
        ("split, LINEAR_CUBLASLT=off", [("TC_LINEAR", "split"), ("LINEAR_CUBLASLT", "off")], &w2),
        ("TC_LINEAR=bf16", [("TC_LINEAR", "bf16"), ("LINEAR_CUBLASLT", "on")], &w2),
        ("split, bf16 and fp8 weights", [("TC_LINEAR", "split"), ("LINEAR_CUBLASLT", "on")], &w8),
        ("split, an f32 weight between bf16 ones", [("TC_LINEAR", "split"), ("LINEAR_CUBLASLT", "on")], &wf),
    ] {
        let (a, b, shared) = switch_scope(&overrides, || {
            // With an f32 weight, only the two bf16 ones share (the f32 one is not for linear_tc).
            let shared = if std::ptr::eq(second, &wf) {
                super::gpu::linear_multi_shares(t, [&w1, second]).is_none() && super::gpu::linear_multi_shares(t, [&w1, &w3]).is_some()
            } else {
                super::gpu::linear_multi_shares(t, [&w1, second, &w3]).is_some()
            };
            let mut a1 = gpu.upload(&vec![f32::NAN; t * r1])?;
            let mut a2 = gpu.upload(&vec![f32::NAN; t * r2])?;
            let mut a3 = gpu.upload(&vec![f32::NAN; t * r3])?;
            gpu.linear_multi(&dx, t, &mut [(&w1, &mut a1), (second, &mut a2), (&w3, &mut a3)])?;
            let mut b1 = gpu.upload(&vec![f32::NAN; t * r1])?;
            let mut b2 = gpu.upload(&vec![f32::NAN; t * r2])?;
            let mut b3 = gpu.upload(&vec![f32::NAN; t * r3])?;
            gpu.linear(&dx, &w1, &mut b1, t)?;
            gpu.linear(&dx, second, &mut b2, t)?;
            gpu.linear(&dx, &w3, &mut b3, t)?;
            Ok(([gpu.download(&a1)?, gpu.download(&a2)?, gpu.download(&a3)?].concat(), [gpu.download(&b1)?, gpu.download(&b2)?, gpu.download(&b3)?].concat(), shared))
        })?;
        let differ = differing_bits(&a, &b);
        let finite = a.iter().all(|v| v.is_finite());
        all &= flag_record(out, &format!("linear_multi {label} bits"), json!({"shape": [t, [r1, r2, r3], k], "differing_values": differ, "of": a.len(), "vs": "one linear per weight", "finite": finite, "shared_conversion": shared, "sharing": if std::ptr::eq(second, &wf) { "the first and third weights" } else { "all three weights" }}), differ == 0 && finite && shared);
    }
    // COMPRESSOR_BF16 (Gpu::linear_multi_planes with hi_only): the products of the bf16-rounded
    // input against the CPU's (ops::linear of the same bf16 values: what the GEMMs multiply, so the
    // split linears' tolerance), cuBLASLt's GEMMs (LINEAR_CUBLASLT on; the 64-row weight below its
    // LT_MIN_ROWS on gemm.cu's kernel) and gemm.cu's alone; and against the split products (the
    // switch's error, reported).
    let xh: Vec<f32> = hx.iter().map(|v| quant::bf16_to_f32(quant::f32_to_bf16(*v))).collect();
    let want: Vec<f32> = [&m1, &m2, &m3].iter().flat_map(|m| ops::linear(&xh, m)).collect();
    for lt in ["on", "off"] {
        let (got, split) = switch_scope(&[("TC_LINEAR", "split"), ("LINEAR_CUBLASLT", lt)], || {
            let mut ys = Vec::new();
            for hi_only in [true, false] {
                let mut a1 = gpu.upload(&vec![f32::NAN; t * r1])?;
                let mut a2 = gpu.upload(&vec![f32::NAN; t * r2])?;
                let mut a3 = gpu.upload(&vec![f32::NAN; t * r3])?;
                gpu.linear_multi_planes(&dx, t, &mut [(&w1, &mut a1), (&w2, &mut a2), (&w3, &mut a3)], hi_only)?;
                ys.push([gpu.download(&a1)?, gpu.download(&a2)?, gpu.download(&a3)?].concat());
            }
            let split = ys.pop().unwrap_or_default();
            Ok((ys.pop().unwrap_or_default(), split))
        })?;
        let (nmse_split, max_abs_split, _) = errors(&got, &split);
        all &= record_tol(out, &format!("linear_multi COMPRESSOR_BF16 LINEAR_CUBLASLT={lt} vs cpu"), json!({"shape": [t, [r1, r2, r3], k], "vs": "ops::linear of the bf16-rounded input", "vs_split_nmse": nmse_split, "vs_split_max_abs": max_abs_split}), &got, &want, SPLIT_NMSE_TOL);
        println!("linear_multi COMPRESSOR_BF16 LINEAR_CUBLASLT={lt}: vs the split products nmse {nmse_split:.3e} max_abs {max_abs_split:.3e}");
    }
    Ok(all)
}

/// Prefill-shaped timings of the tensor-core linear (each block tile and the automatic choice) next
/// to the f32 GEMV kernel on the same shape, as TFLOP/s = 2·T·N·K / time.
fn tc_timings(gpu: &Gpu, seed: u64, repeats: usize) -> Result<Vec<Value>, CudaError> {
    let timed: &[(&str, &str, usize, usize, usize)] = &[
        ("fp8", "attn.wq_b", 32768, 1024, 2048),
        ("fp8", "attn.wq_b", 32768, 1024, 8192),
        ("fp8", "attn.wo_b", 4096, 8192, 2048),
        ("fp8", "attn.wq_a", 1024, 4096, 2048),
        ("fp4", "expert.w1", 2048, 4096, 2048),
        ("bf16", "compressor.wkv", 1024, 4096, 2048),
        ("f32", "f32 4096x4096", 4096, 4096, 2048),
        ("fp8", "attn.wq_a", 1024, 4096, 64),
        ("fp8", "attn.wq_b", 32768, 1024, 200),
        ("fp8", "attn.wq_b", 32768, 1024, 64),
    ];
    let mut rows_out = Vec::new();
    for (fmt, name, rows, cols, t) in timed {
        let vals = random(seed, &format!("tctime.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, _) = weight(gpu, fmt, &vals, *rows, *cols)?;
        let dx = gpu.upload(&random(seed, "tctime.x", t * cols, 1.0))?;
        let mut dy = gpu.zeros::<f32>(t * rows)?;
        let flops = 2.0 * (*t * *rows * *cols) as f64;
        let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
        let mut entry = json!({"op": format!("linear_tc_{fmt}"), "weight": name, "tokens": t, "rows": rows, "cols": cols, "flop": flops});
        let auto = gpu.auto_tile(*t, *rows, fmt, *cols);
        let mut line = format!("time tc {fmt} {name:<15} T={t:<5} [{rows}x{cols}]  auto={auto:?}");
        let mut best = f64::INFINITY;
        let tiles: Vec<GemmTile> = GemmTile::ALL.into_iter().filter(|tile| !tile.is_wgmma() || gpu.bf16_wgmma(fmt, *cols)).collect();
        for &tile in &tiles {
            let ms = median_ms(gpu, repeats, || gpu.linear_tc(&dx, &gw, &mut dy, *t, Some(tile), false))?;
            best = best.min(ms);
            line += &format!("  {tile:?} {:.3} ms {:.0} TF/s", ms, tf(ms));
            entry[format!("{tile:?}_ms")] = json!(ms);
            entry[format!("{tile:?}_tflops")] = json!(tf(ms));
        }
        if *fmt != "f32" {
            line += "  | split";
            for &tile in &tiles {
                let ms = median_ms(gpu, repeats, || gpu.linear_tc(&dx, &gw, &mut dy, *t, Some(tile), true))?;
                line += &format!(" {tile:?} {:.3} ms {:.0} TF/s", ms, tf(ms));
                entry[format!("split_{tile:?}_ms")] = json!(ms);
                entry[format!("split_{tile:?}_tflops")] = json!(tf(ms));
            }
        }
        if *fmt == "fp8" || *fmt == "bf16" {
            let (xb, tp, kp) = gpu.bf16_planes(&dx, *t, *cols, true)?;
            if *t >= super::cublaslt::LT_MIN_TOKENS && gpu.linear_split_lt(&xb, Some(tp * kp), kp, 0, &gw, &mut dy, *rows, 0, *t)? {
                let ms = median_ms(gpu, repeats, || switch_scope(&[("LINEAR_CUBLASLT", "on")], || gpu.linear_tc(&dx, &gw, &mut dy, *t, None, true)))?;
                line += &format!("  | split cuBLASLt {ms:.3} ms {:.0} TF/s (conversions included)", tf(ms));
                entry["split_cublaslt_ms"] = json!(ms);
                entry["split_cublaslt_tflops"] = json!(tf(ms));
            }
        }
        // The f32 GEMV path is slow at these sizes: few repeats.
        let gemv_ms = median_ms(gpu, repeats.min(3), || gpu.linear_gemv(&dx, &gw, &mut dy, *t))?;
        let auto_ms = entry[format!("{auto:?}_ms")].as_f64().unwrap_or(f64::NAN);
        line += &format!("  | gemv {:.3} ms {:.1} TF/s  (auto {:.1}x faster; best tile {:.1}x)", gemv_ms, tf(gemv_ms), gemv_ms / auto_ms, gemv_ms / best);
        println!("{line}");
        entry["auto"] = json!(format!("{auto:?}"));
        entry["auto_ms"] = json!(auto_ms);
        entry["auto_tflops"] = json!(tf(auto_ms));
        entry["gemv_ms"] = json!(gemv_ms);
        entry["gemv_tflops"] = json!(tf(gemv_ms));
        entry["speedup_vs_gemv"] = json!(gemv_ms / auto_ms);
        entry["repeats"] = json!(repeats);
        rows_out.push(entry);
    }
    Ok(rows_out)
}
