//! gpu-check entries for the FP8-activation linear layers (`TC_LINEAR=fp8`, [`super::ops_q8`]):
//! DeepSeek's official numerics (spec §6, §10.1) against the CPU in the same numerics.
//!
//! - `act_roundtrip_fp8`: the GPU quantize-dequantize against `Numerics::act_in` (the CPU's
//!   `act_quant_fp8_roundtrip`), bit for bit, on rows whose 128-blocks span magnitudes 2^-20…2^12,
//!   a width with a shorter last block (200), Flash's 4096, and 16,384 rows of 4096 (several turns
//!   of the kernel's grid-stride loop).
//! - `linear_q8 <fmt> <weight>`: [`Gpu::linear_q8`] against `linear(act_in(x), W)` in f64 on Flash
//!   shapes and odd ones (outputs not a multiple of 128, tokens not a multiple of 128), FP8 and FP4
//!   weights. Tolerance NMSE ≤ [`Q8_NMSE_TOL`] (the tensor cores' summation order and precision).
//! - `linear_official <fmt> fallback`: the paths without the FP8 kernel (few tokens, bf16 weights,
//!   FP4 whose scales do not fold) against the same reference.
//! - `linear_q8 repeatable`: two runs give the same bits.
//! - `linear_lt <weight>` (switch `FP8_CUBLASLT`): cuBLASLt's block-scaled FP8 GEMM against the same
//!   reference and tolerance, and (informational) against gemm_q8.cu.
//! - `linear_official_bf16 <weight>` (switch `WQ_B_BF16_OUT`): the bf16-output product against the
//!   CPU's rounded to bf16 and against the f32 output rounded (≤ 1 ulp; bit for bit off cuBLASLt).
//! - `linear_official fused quant …` (switch `LINEAR_FUSED_QUANT`): the small-batch official linear
//!   in one launch against the copy + roundtrip + gemv, bit for bit, and against the CPU.
//!
//! Timings ([`timings`]): the FP8 GEMM (activation quantisation included) next to cuBLASLt's, the bf16 and
//! split tensor-core GEMMs at prefill shapes, TFLOP/s against the machine's ~1,450 FP8 dense.

use super::check::{differing_bits, differing_values, errors, flag_record, median_ms, random, switch_on_off_ms, switch_scope, weight};
use super::check_moe::Q8_NMSE_TOL;
use super::gpu::{Gpu, GpuMatrix, GpuWeight};
use super::CudaError;
use crate::cpu::ops;
use crate::forward::Numerics;
use crate::weights::Matrix;
use flashseek_model::quant;
use serde_json::{json, Value};

const OFFICIAL: Numerics = Numerics { act_quant_fp8: true, kv_fp8: false, indexer_fp4: false };

/// Activations whose 128-feature blocks have very different magnitudes (so every block gets its own
/// scale, from 2^-20 to 2^12).
fn spread_activations(seed: u64, key: &str, t: usize, k: usize) -> Vec<f32> {
    let mut x = random(seed, key, t * k, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        let block = (i % k) / 128 + (i / k) * 3;
        *v *= 2f32.powi((block % 33) as i32 - 20);
    }
    x
}

fn record_q8(out: &mut Vec<Value>, op: &str, shape: Value, got: &[f32], reference: &[f32], hf: Option<&[f32]>) -> bool {
    let (nmse, max_abs, ref_max) = errors(got, reference);
    let pass = nmse <= Q8_NMSE_TOL && got.iter().all(|v| v.is_finite());
    let hf_nmse = hf.map(|h| errors(got, h).0);
    println!(
        "{op:<44} {shape:<22} nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e}, tol {Q8_NMSE_TOL:.0e}){}  {}",
        hf_nmse.map(|v| format!("  vs HF numerics {v:.2e}")).unwrap_or_default(),
        if pass { "ok" } else { "FAIL" }
    );
    out.push(json!({"op": op, "shape": shape, "nmse": nmse, "max_abs": max_abs, "ref_max": ref_max, "tolerance_nmse": Q8_NMSE_TOL,
        "reference": "cpu linear(act_in(x)) in f64, Numerics { act_quant_fp8 }", "nmse_vs_hf_numerics": hf_nmse, "pass": pass}));
    pass
}

/// Runs the checks; appends records to `out`, returns whether all passed.
pub fn run(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    // Quantize-dequantize, bit for bit.
    // (16384, 4096): 524,288 (row, block) units, about 8 per warp of the capped grid (132·64 blocks):
    // several turns of act_quant_fp8's grid-stride loop.
    for (t, k) in [(37usize, 200usize), (64, 4096), (3, 128), (16384, 4096)] {
        let x = spread_activations(seed, &format!("q8.rt.{k}"), t, k);
        let cpu = OFFICIAL.act_in(&x, k).into_owned();
        let mut dx = gpu.upload(&x)?;
        gpu.act_roundtrip(&mut dx, t, k)?;
        let got = gpu.download(&dx)?;
        let differ = differing_bits(&got, &cpu);
        all &= flag_record(out, "act_roundtrip_fp8 vs cpu bits", json!({"shape": [t, k], "differing_values": differ, "of": cpu.len()}), differ == 0);
    }
    // The shared expert's down-projection input quantized from gate and up (act_quant_swiglu)
    // against swiglu then act_quant: the same bytes and scale bits. Values up to 2^12 against a
    // limit of 7 (both clamps taken), a NaN gate and a NaN up value, widths not multiples of 4 /
    // 128, several grid-stride turns at 8,192 × 2,048.
    for (t, k) in [(37usize, 203usize), (130, 2048), (8192, 2048)] {
        let mut g = spread_activations(seed, &format!("q8.swiglu.g.{k}"), t, k);
        let mut u = spread_activations(seed, &format!("q8.swiglu.u.{k}"), t, k);
        g[k + 5] = f32::NAN;
        u[2 * k + 9] = f32::NAN;
        let limit = 7.0f32;
        let (dg, du) = (gpu.upload(&g)?, gpu.upload(&u)?);
        let fused = gpu.act_quant_swiglu(&dg, &du, limit, t, k)?;
        let mut dh = gpu.upload(&vec![0f32; t * k])?;
        gpu.swiglu(&dg, &du, &mut dh, t * k, limit)?;
        let sep = gpu.act_quant(&dh, t, k)?;
        let (fq, sq) = (gpu.download(&fused.q)?, gpu.download(&sep.q)?);
        let (fs, ss) = (gpu.download(&fused.sa)?, gpu.download(&sep.sa)?);
        let bytes = differing_values(&fq, &sq);
        let scales = differing_bits(&fs, &ss);
        let layout = (fused.rows, fused.kp, fused.tiled) == (sep.rows, sep.kp, sep.tiled);
        all &= flag_record(
            out,
            "act_quant swiglu vs swiglu then act_quant bits",
            json!({"shape": [t, k], "differing_bytes": bytes, "of": sq.len(), "differing_scales": scales, "of_scales": ss.len(), "same_layout": layout}),
            bytes == 0 && scales == 0 && layout,
        );
    }
    // The FP8 GEMM.
    let shapes: &[(&str, &str, usize, usize, usize)] = &[
        ("fp8", "attn.wq_b", 32768, 1024, 200),
        ("fp8", "attn.wo_b", 4096, 8192, 130),
        ("fp8", "attn.wq_a", 1024, 4096, 2048),
        ("fp8", "odd [300, 256]", 300, 256, 77),
        ("fp4", "expert.w1", 2048, 4096, 200),
        ("fp4", "expert.w2", 4096, 2048, 64),
        ("fp4", "odd [200, 384]", 200, 384, 129),
    ];
    for (fmt, name, rows, cols, t) in shapes {
        let vals = random(seed, &format!("q8.w.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, *rows, *cols)?;
        let x = spread_activations(seed, &format!("q8.x.{name}"), *t, *cols);
        let reference = ops::linear(&OFFICIAL.act_in(&x, *cols), &cpu_w);
        let hf = ops::linear(&x, &cpu_w);
        let dx = gpu.upload(&x)?;
        let qa = gpu.act_quant(&dx, *t, *cols)?;
        // Both kernel families: mma.sync (FP8_WGMMA=off) and wgmma (on, the default).
        let mut sync_out = Vec::new();
        for wg in ["off", "on"] {
            let got = switch_scope(&[("FP8_WGMMA", wg), ("FP8_CUBLASLT", "off")], || -> Result<Vec<f32>, CudaError> {
                let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                gpu.linear_q8(&qa, &gw, &mut dy, *t)?;
                gpu.download(&dy)
            })?;
            let kname = if wg == "on" { "linear_w8" } else { "linear_q8" };
            all &= record_q8(out, &format!("{kname} {fmt} {name}"), json!([t, rows, cols]), &got, &reference, Some(&hf));
            if wg == "off" {
                sync_out = got;
            } else {
                let (nmse, max_abs, _) = errors(&got, &sync_out);
                println!("linear_w8 {fmt} {name} vs linear_q8 (informational): nmse {nmse:.3e} max_abs {max_abs:.3e}");
                out.push(json!({"op": format!("linear_w8 {fmt} {name} vs linear_q8"), "nmse": nmse, "max_abs": max_abs, "informational": true}));
            }
        }
        let got = sync_out;
        if *name == "attn.wq_b" {
            let mut again = gpu.zeros::<f32>(t * rows)?;
            switch_scope(&[("FP8_WGMMA", "off"), ("FP8_CUBLASLT", "off")], || gpu.linear_q8(&qa, &gw, &mut again, *t))?;
            let same = differing_bits(&gpu.download(&again)?, &got) == 0;
            all &= flag_record(out, "linear_q8 repeatable", json!({"shape": [t, rows, cols], "bitwise_equal": same}), same);
            let (mut a, mut b) = (gpu.zeros::<f32>(t * rows)?, gpu.zeros::<f32>(t * rows)?);
            switch_scope(&[("FP8_CUBLASLT", "off")], || {
                gpu.linear_q8(&qa, &gw, &mut a, *t)?;
                gpu.linear_q8(&qa, &gw, &mut b, *t)
            })?;
            let same = differing_bits(&gpu.download(&a)?, &gpu.download(&b)?) == 0;
            all &= flag_record(out, "linear_w8 repeatable", json!({"shape": [t, rows, cols], "bitwise_equal": same}), same);
        }
        // Few tokens: quantize-dequantize + the exact kernels.
        let small = 5usize;
        let mut dy = gpu.zeros::<f32>(small * rows)?;
        gpu.linear_official(&dx, &gw, &mut dy, small)?;
        all &= record_q8(out, &format!("linear_official {fmt} {name} T=5"), json!([small, rows, cols]), &gpu.download(&dy)?, &reference[..small * rows], None);
    }
    all &= lt_checks(gpu, seed, out)?;
    all &= official_bf16_checks(gpu, seed, out)?;
    all &= fused_quant_checks(gpu, seed, out)?;
    // Fallbacks at prefill token counts: bf16 weights, and FP4 whose group scales span 9+ binades.
    let (rows, cols, t) = (256usize, 512usize, 130usize);
    let x = spread_activations(seed, "q8.fb.x", t, cols);
    let xq = OFFICIAL.act_in(&x, cols).into_owned();
    let dx = gpu.upload(&x)?;
    {
        let vals = random(seed, "q8.fb.bf16", rows * cols, 0.1);
        let (gw, cpu_w) = weight(gpu, "bf16", &vals, rows, cols)?;
        let mut dy = gpu.zeros::<f32>(t * rows)?;
        gpu.linear_official(&dx, &gw, &mut dy, t)?;
        all &= record_q8(out, "linear_official bf16 fallback", json!([t, rows, cols]), &gpu.download(&dy)?, &ops::linear(&xq, &cpu_w), None);
    }
    {
        let w4: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 7 + i / 13) as u8).collect();
        let s4: Vec<u8> = (0..rows * cols / 32).map(|i| [110u8, 121, 127, 101][i % 4]).collect();
        let fold = super::ops_q8::fp4_fold_exact(&s4, cols);
        let deq = quant::dequant_fp4_grouped(&w4, rows, cols, &s4, 32).map_err(|e| CudaError::Unsupported { what: "dequantize", detail: e.to_string() })?;
        let gw = GpuWeight { rows, cols, data: GpuMatrix::Fp4 { w: gpu.upload(&w4)?, scales: gpu.upload(&s4)?, fold } };
        let mut dy = gpu.zeros::<f32>(t * rows)?;
        gpu.linear_official(&dx, &gw, &mut dy, t)?;
        all &= flag_record(out, "fp4 scales spanning 26 binades are not folded", json!({"fold": fold}), !fold);
        all &= record_q8(out, "linear_official fp4 unfoldable fallback", json!([t, rows, cols]), &gpu.download(&dy)?, &ops::linear(&xq, &Matrix { rows, cols, data: deq }), None);
    }
    Ok(all)
}

/// `LINEAR_FUSED_QUANT`: [`Gpu::linear_official`] below 64 tokens with the gemv quantizing its
/// input as it stages it ([`Gpu::linear_gemv_q`]) against the same call with the switch off (a
/// copy, [`Gpu::act_roundtrip`], the gemv), bit for bit — every weight format, 1 / 3 / 8 / 63
/// tokens, Flash's decode widths (1,024 … 8,192, the staged tile's limit), block magnitudes from
/// 2^-20 to 2^12 and one block holding a NaN — and against the CPU's `linear(act_in(x), W)` (NMSE
/// ≤ [`Q8_NMSE_TOL`]). A shape past the staged tile is declined (the three launches run).
fn fused_quant_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let cases: &[(&str, &str, usize, usize, usize, bool)] = &[
        ("fp8", "attn.wq_b rows", 4096, 1024, 1, false),
        ("fp8", "attn.wo_b", 4096, 8192, 1, false),
        ("fp8", "attn.wq_a", 1024, 4096, 1, true),
        ("fp4", "expert.w1", 2048, 4096, 1, false),
        ("fp8", "shared.w2", 4096, 2048, 3, false),
        ("bf16", "bf16 [512, 1024]", 512, 1024, 8, false),
        ("f32", "f32 [256, 1024]", 256, 1024, 8, true),
        ("fp8", "odd [300, 128]", 300, 128, 63, false),
        ("fp8", "declined [256, 4096]", 256, 4096, 3, false),
    ];
    for (fmt, name, rows, cols, t, nan) in cases {
        let (rows, cols, t) = (*rows, *cols, *t);
        let vals = random(seed, &format!("q8.fq.w.{name}"), rows * cols, (3.0 / cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, fmt, &vals, rows, cols)?;
        let mut x = spread_activations(seed, &format!("q8.fq.x.{name}"), t, cols);
        if *nan {
            // One block of the last token holds a NaN: its outputs are NaN on both paths.
            x[(t - 1) * cols + 130] = f32::NAN;
        }
        let dx = gpu.upload(&x)?;
        let takes = Gpu::linear_gemv_q_takes(t, &gw);
        let run = |sw: &'static str| -> Result<Vec<f32>, CudaError> {
            // (LINEAR_GEMV_MMA off: its FP8 shapes would take the tensor-core gemv either way.)
            switch_scope(&[("LINEAR_FUSED_QUANT", sw), ("LINEAR_GEMV_MMA", "off")], || {
                let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                gpu.linear_official(&dx, &gw, &mut dy, t)?;
                gpu.download(&dy)
            })
        };
        let (fused, apart) = (run("on")?, run("off")?);
        let differ = differing_bits(&fused, &apart);
        let expect_takes = t.min(8) * cols <= 8192;
        all &= flag_record(
            out,
            &format!("linear_official fused quant {fmt} {name} T={t} bits"),
            json!({"shape": [t, rows, cols], "differing_values": differ, "of": apart.len(), "vs": "copy + act_roundtrip + gemv (LINEAR_FUSED_QUANT=off)", "fused": takes, "nan_block": nan}),
            differ == 0 && takes == expect_takes,
        );
        if !nan {
            let reference = ops::linear(&OFFICIAL.act_in(&x, cols), &cpu_w);
            all &= record_q8(out, &format!("linear_official fused quant {fmt} {name} T={t} vs cpu"), json!([t, rows, cols]), &fused, &reference, None);
        }
    }
    Ok(all)
}

/// `LINEAR_GEMV_MMA`: [`Gpu::linear_official`] on FP8 weights at 1, 3 and 8 tokens with each
/// 128-value block's products on the tensor cores ([`Gpu::linear_gemv_mma`], every split of the
/// blocks over warps that Flash's decode linears take, rows past the last tile, block magnitudes
/// from 2^-20 to 2^12, one block holding a NaN) against the CPU's `linear(act_in(x), W)` (NMSE ≤
/// [`Q8_NMSE_TOL`]) and against the switch off (the CUDA-core gemv of `LINEAR_FUSED_QUANT`: NMSE ≤
/// [`Q8_NMSE_TOL`], NaN where it is NaN); a width not a multiple of 256 declined. Timings at one
/// token on Flash's FP8 decode linears, on and off.
pub(crate) fn gemv_mma_checks(gpu: &Gpu, seed: u64, repeats: usize, out: &mut Vec<Value>) -> Result<(bool, Vec<Value>), CudaError> {
    let mut all = true;
    let mut timings = Vec::new();
    // (weight, rows, cols, timed at T = 1)
    let cases: &[(&str, usize, usize, bool)] = &[
        ("attn.wq_a", 1024, 4096, true),
        ("attn.wkv", 512, 4096, true),
        ("attn.wq_b", 32768, 1024, true),
        ("attn.wo_b", 4096, 8192, true),
        ("indexer.wq_b", 8192, 1024, true),
        ("shared.w1", 2048, 4096, true),
        ("shared.w2", 4096, 2048, true),
        ("odd [1001, 512]", 1001, 512, false),
        ("odd [40, 768]", 40, 768, false),
        ("declined [256, 384]", 256, 384, false),
    ];
    for (name, rows, cols, timed) in cases {
        let (rows, cols) = (*rows, *cols);
        let vals = random(seed, &format!("q8.mma.w.{name}"), rows * cols, (3.0 / cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, "fp8", &vals, rows, cols)?;
        for t in [1usize, 3, 8] {
            let mut x = spread_activations(seed, &format!("q8.mma.x.{name}.{t}"), t, cols);
            let nan = t == 3 && rows == 1001;
            if nan {
                x[cols + 130] = f32::NAN;  // token 1's second block
            }
            let dx = gpu.upload(&x)?;
            let takes = Gpu::linear_gemv_mma_takes(t, &gw);
            let expect = cols.is_multiple_of(256) && t * (cols + 16) <= 32_768;
            let run = |sw: &'static str| -> Result<Vec<f32>, CudaError> {
                switch_scope(&[("LINEAR_GEMV_MMA", sw)], || {
                    let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
                    gpu.linear_official(&dx, &gw, &mut dy, t)?;
                    gpu.download(&dy)
                })
            };
            let (mma, off) = (run("on")?, run("off")?);
            let label = format!("linear_official mma fp8 {name} T={t}");
            let ks = super::gpu::gemv_mma_ksplit(rows, cols);
            if nan {
                // NaN exactly where the CUDA-core gemv has NaN (token 1's rows), finite elsewhere.
                let same = mma.iter().zip(&off).all(|(a, b)| a.is_nan() == b.is_nan());
                let rows_nan = (0..t).all(|j| mma[j * rows..(j + 1) * rows].iter().all(|v| v.is_nan() == (j == 1)));
                all &= flag_record(out, &format!("{label} nan block"), json!({"nan_where_off_nan": same, "only_token_1": rows_nan, "mma": takes}), same && rows_nan && takes);
                continue;
            }
            let reference = ops::linear(&OFFICIAL.act_in(&x, cols), &cpu_w);
            all &= record_q8(out, &format!("{label} vs cpu"), json!([t, rows, cols]), &mma, &reference, None);
            let (nmse, max_abs, _) = errors(&mma, &off);
            let ok = takes == expect && nmse <= Q8_NMSE_TOL && mma.iter().all(|v| v.is_finite());
            all &= flag_record(out, &format!("{label} vs LINEAR_GEMV_MMA=off"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_NMSE_TOL, "mma": takes, "k_split": ks}), ok);
        }
        if *timed {
            let dx = gpu.upload(&spread_activations(seed, &format!("q8.mma.tx.{name}"), 1, cols))?;
            let mut dy = gpu.zeros::<f32>(rows)?;
            let (on, off) = switch_on_off_ms(gpu, repeats, "LINEAR_GEMV_MMA", || gpu.linear_official(&dx, &gw, &mut dy, 1))?;
            let bytes = super::model::weight_bytes(&gw);
            let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
            println!("time linear official T=1 fp8 {name:<14} [{rows}x{cols}]  mma (k-split {}) {:.1} us {:.0} GB/s | off {:.1} us {:.0} GB/s", super::gpu::gemv_mma_ksplit(rows, cols), on * 1e3, gbs(on), off * 1e3, gbs(off));
            timings.push(json!({"op": "linear official T=1, LINEAR_GEMV_MMA", "format": "fp8", "weight": name, "rows": rows, "cols": cols, "weight_bytes": bytes, "k_split": super::gpu::gemv_mma_ksplit(rows, cols), "mma_us": on * 1e3, "mma_gb_per_s": gbs(on), "off_us": off * 1e3, "off_gb_per_s": gbs(off), "repeats": repeats}));
        }
    }
    Ok((all, timings))
}

/// A bf16 value's place on a number line of bf16 bit patterns (±0 both 0), for ulp distances.
fn bf16_ord(b: u16) -> i32 {
    let m = i32::from(b & 0x7fff);
    if b & 0x8000 != 0 {
        -m
    } else {
        m
    }
}

/// `WQ_B_BF16_OUT`: [`Gpu::linear_official_bf16`] on FP8 weights, with cuBLASLt's bf16-output GEMM
/// (`FP8_CUBLASLT` on, ≥ 256 tokens) and without (the f32 product rounded on the device): against
/// the CPU's official-numerics product rounded to bf16 (NMSE ≤ [`Q8_NMSE_TOL`]), against the f32
/// output of [`Gpu::linear_official`] rounded on the host (at most 1 bf16 ulp apart, NMSE ≤
/// 1e-5; bit for bit where both come from the same f32 product, i.e. without cuBLASLt), and
/// repeatable.
fn official_bf16_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let shapes: &[(&str, usize, usize, usize)] = &[("attn.wq_b", 32768, 1024, 1000), ("attn.wq_b", 32768, 1024, 300), ("attn.wq_b decode", 32768, 1024, 3), ("[384, 384]", 384, 384, 257)];
    for (name, rows, cols, t) in shapes {
        let vals = random(seed, &format!("bf16out.w.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, cpu_w) = weight(gpu, "fp8", &vals, *rows, *cols)?;
        let x = spread_activations(seed, &format!("bf16out.x.{name}.{t}"), *t, *cols);
        let reference: Vec<f32> = ops::linear(&OFFICIAL.act_in(&x, *cols), &cpu_w).iter().map(|&v| quant::bf16_to_f32(quant::f32_to_bf16(v))).collect();
        let dx = gpu.upload(&x)?;
        for lt in ["on", "off"] {
            let (got, f32_out, again) = switch_scope(&[("FP8_CUBLASLT", lt)], || -> Result<_, CudaError> {
                let mut dyb = gpu.upload(&vec![0x7fc1u16; t * rows])?;
                gpu.linear_official_bf16(&dx, &gw, &mut dyb, *t)?;
                let got = gpu.download(&dyb)?;
                let mut dy = gpu.zeros::<f32>(t * rows)?;
                gpu.linear_official(&dx, &gw, &mut dy, *t)?;
                let mut again = gpu.upload(&vec![0x7fc1u16; t * rows])?;
                gpu.linear_official_bf16(&dx, &gw, &mut again, *t)?;
                Ok((got, gpu.download(&dy)?, gpu.download(&again)?))
            })?;
            if lt == "on" && *t >= super::cublaslt::LT_MIN_TOKENS {
                // Whether cuBLASLt's bf16-output GEMM itself ran: required wherever its f32-output
                // GEMM runs (cuBLASLt declines some shapes for both, e.g. 257 tokens).
                let qa = gpu.act_quant(&dx, *t, *cols)?;
                let mut d16 = gpu.zeros::<u16>(t * rows)?;
                let ran = gpu.linear_lt_bf16(&qa, &gw, &mut d16, *t)?;
                let mut d32 = gpu.zeros::<f32>(t * rows)?;
                let ran_f32 = gpu.linear_lt(&qa, &gw, &mut d32, *t)?;
                let same = ran && gpu.download(&d16)? == got;
                all &= flag_record(out, &format!("linear_official_bf16 {name} T={t} cuBLASLt bf16 out ran"), json!({"ran": ran, "f32_out_ran": ran_f32, "bitwise_equal_to_linear_official_bf16": same}), ran == ran_f32 && (!ran || same));
            }
            let widened: Vec<f32> = got.iter().map(|&b| quant::bf16_to_f32(b)).collect();
            all &= record_q8(out, &format!("linear_official_bf16 {name} FP8_CUBLASLT={lt}"), json!([t, rows, cols]), &widened, &reference, None);
            let rounded: Vec<u16> = f32_out.iter().map(|&v| quant::f32_to_bf16(v)).collect();
            let max_ulp = got.iter().zip(&rounded).map(|(&a, &b)| (bf16_ord(a) - bf16_ord(b)).unsigned_abs()).max().unwrap_or(0);
            let differing = got.iter().zip(&rounded).filter(|(a, b)| a != b).count();
            let (nmse, _, _) = errors(&widened, &rounded.iter().map(|&b| quant::bf16_to_f32(b)).collect::<Vec<f32>>());
            // Without cuBLASLt (or below its 256 tokens) both come from the same f32 product.
            let same_product = lt == "off" || *t < super::cublaslt::LT_MIN_TOKENS;
            let ok = max_ulp <= 1 && nmse <= 1e-5 && (!same_product || differing == 0);
            all &= flag_record(
                out,
                &format!("linear_official_bf16 {name} FP8_CUBLASLT={lt} vs f32 output rounded"),
                json!({"shape": [t, rows, cols], "differing_values": differing, "of": got.len(), "max_ulp": max_ulp, "nmse": nmse, "bitwise_expected": same_product,
                    "tolerance": "≤ 1 bf16 ulp and NMSE ≤ 1e-5 (0 differing where both round the same f32 product)"}),
                ok,
            );
            all &= flag_record(out, &format!("linear_official_bf16 {name} FP8_CUBLASLT={lt} repeatable"), json!({"bitwise_equal": again == got}), again == got);
        }
    }
    Ok(all)
}

/// `FP8_CUBLASLT`: cuBLASLt's block-scaled FP8 GEMM ([`Gpu::linear_lt`]) against the CPU in official
/// numerics (tolerance [`Q8_NMSE_TOL`], as gemm_q8.cu) and, informationally, against gemm_q8.cu's
/// wgmma kernel; token counts not a multiple of 16 included. Whether cuBLASLt ran is recorded (it
/// falls back where the library is missing or older than 12.9); a shape it cannot take (outputs not
/// a multiple of 128) must fall back.
fn lt_checks(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let shapes: &[(&str, usize, usize, usize)] = &[
        ("attn.wq_b", 32768, 1024, 1000),
        ("attn.wo_b", 4096, 8192, 300),
        ("attn.wkv", 512, 4096, 2048),
        ("attn.wq_a", 1024, 4096, 257),
        ("[512, 256]", 512, 256, 1000),
        ("[384, 384]", 384, 384, 1000),
        ("[256, 640]", 256, 640, 1000),
    ];
    for (name, rows, cols, t) in shapes {
        // Every 128 × 128 block gets its own scale (magnitudes 2^-3 … 2^3), so the scale layout matters.
        let mut vals = random(seed, &format!("lt.w.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        for (i, v) in vals.iter_mut().enumerate() {
            let (r, c) = (i / cols, i % cols);
            *v *= 2f32.powi(((r / 128) * 5 + (c / 128) * 3) as i32 % 7 - 3);
        }
        let (gw, cpu_w) = weight(gpu, "fp8", &vals, *rows, *cols)?;
        let x = spread_activations(seed, &format!("lt.x.{name}"), *t, *cols);
        let reference = ops::linear(&OFFICIAL.act_in(&x, *cols), &cpu_w);
        let qa = gpu.act_quant(&gpu.upload(&x)?, *t, *cols)?;
        let mut dy = gpu.upload(&vec![f32::NAN; t * rows])?;
        let ran = gpu.linear_lt(&qa, &gw, &mut dy, *t)?;
        out.push(json!({"op": format!("linear_lt {name} ran"), "shape": [t, rows, cols], "cublaslt_ran": ran, "informational": true}));
        println!("linear_lt fp8 {name}: cuBLASLt {}", if ran { "ran" } else { "unavailable (fallback)" });
        if !ran {
            continue;
        }
        let got = gpu.download(&dy)?;
        all &= record_q8(out, &format!("linear_lt fp8 {name}"), json!([t, rows, cols]), &got, &reference, None);
        let mut dw = gpu.zeros::<f32>(t * rows)?;
        switch_scope(&[("FP8_CUBLASLT", "off")], || gpu.linear_q8(&qa, &gw, &mut dw, *t))?;
        let (nmse, max_abs, _) = errors(&got, &gpu.download(&dw)?);
        println!("linear_lt fp8 {name} vs linear_w8 (informational): nmse {nmse:.3e} max_abs {max_abs:.3e}");
        let mut again = gpu.zeros::<f32>(t * rows)?;
        gpu.linear_lt(&qa, &gw, &mut again, *t)?;
        let same = differing_bits(&gpu.download(&again)?, &got) == 0;
        all &= flag_record(out, &format!("linear_lt fp8 {name} repeatable"), json!({"bitwise_equal": same}), same);
        out.push(json!({"op": format!("linear_lt fp8 {name} vs linear_w8"), "nmse": nmse, "max_abs": max_abs, "informational": true}));
    }
    // Outputs not a multiple of 128: not taken (the caller's kernel runs).
    let (rows, cols, t) = (300usize, 256usize, 300usize);
    let (gw, _) = weight(gpu, "fp8", &random(seed, "lt.odd", rows * cols, 0.1), rows, cols)?;
    let qa = gpu.act_quant(&gpu.upload(&random(seed, "lt.odd.x", t * cols, 1.0))?, t, cols)?;
    let mut dy = gpu.zeros::<f32>(t * rows)?;
    let ran = gpu.linear_lt(&qa, &gw, &mut dy, t)?;
    all &= flag_record(out, "linear_lt declines [300, 256]", json!({"ran": ran}), !ran);
    Ok(all)
}

/// Prefill-shaped timings: the FP8 GEMM (with its activation quantisation) next to the bf16 and
/// split GEMMs of gemm.cu on the same weights, TFLOP/s = 2·T·N·K / time.
pub fn timings(gpu: &Gpu, seed: u64, repeats: usize) -> Result<Vec<Value>, CudaError> {
    let timed: &[(&str, &str, usize, usize, usize)] = &[
        ("fp8", "attn.wq_b", 32768, 1024, 8192),
        ("fp8", "attn.wo_b", 4096, 8192, 8192),
        ("fp8", "attn.wq_a", 1024, 4096, 8192),
        ("fp8", "shared.w1", 2048, 4096, 8192),
        ("fp4", "expert.w1", 2048, 4096, 8192),
        ("fp8", "attn.wq_b", 32768, 1024, 2048),
    ];
    let mut rows_out = Vec::new();
    // act_quant_fp8 alone at a 32,768-token chunk's shapes: the attention / FFN input (4,096),
    // wo_b's input (8,192), and the routed experts' down input in the tiled layout (6 rows per
    // token, 2,048). GB/s of the bytes read and written (x f32, q e4m3, one f32 scale per 128)
    // against the machine's ~4.2 TB/s; the kernel define AQ_WIDE_INDEX (1: 64-bit task indices) is
    // what kernel_defines records.
    for (t, k, tiled) in [(32768usize, 4096usize, false), (32768, 8192, false), (6 * 32768, 2048, true)] {
        let dx = gpu.upload(&random(seed, "q8time.aq.x", t * k, 1.0))?;
        let ms = median_ms(gpu, repeats, || gpu.act_quant_layout(&dx, t, k, tiled).map(|_| ()))?;
        let bytes = (t * k * 4 + t * k + t * k.div_ceil(128) * 4) as f64;
        let gbs = bytes / (ms * 1e-3) / 1e9;
        println!("time act_quant T={t} [{k}]{}  {ms:.3} ms  {gbs:.0} GB/s", if tiled { " tiled" } else { "" });
        rows_out.push(json!({"op": "act_quant", "rows": t, "tokens": if tiled { t / 6 } else { t }, "cols": k, "tiled": tiled, "ms": ms, "gb_per_s": gbs, "repeats": repeats}));
    }
    // The shared expert's down input at a Flash prefill chunk (8,192 × 2,048): swiglu then
    // act_quant against act_quant_swiglu (bytes moved: g and u read, h written and read back).
    {
        let (t, k) = (8192usize, 2048usize);
        let dg = gpu.upload(&random(seed, "q8time.swiglu.g", t * k, 2.0))?;
        let du = gpu.upload(&random(seed, "q8time.swiglu.u", t * k, 2.0))?;
        let mut dh = gpu.zeros::<f32>(t * k)?;
        let sep = median_ms(gpu, repeats, || {
            gpu.swiglu(&dg, &du, &mut dh, t * k, 7.0)?;
            gpu.act_quant(&dh, t, k).map(|_| ())
        })?;
        let fused = median_ms(gpu, repeats, || gpu.act_quant_swiglu(&dg, &du, 7.0, t, k).map(|_| ()))?;
        println!("time q8 swiglu+act_quant T={t} [{k}]  swiglu then act_quant {sep:.3} ms | act_quant_swiglu {fused:.3} ms");
        rows_out.push(json!({"op": "act_quant_swiglu", "tokens": t, "cols": k, "separate_ms": sep, "fused_ms": fused, "repeats": repeats}));
    }
    // LINEAR_FUSED_QUANT at decode (T = 1) on Flash's official linears: one launch against the
    // copy, roundtrip and gemv (GB/s of weight bytes against the machine's ~4.2 TB/s).
    for (fmt, name, rows, cols) in [("fp8", "attn.wq_a", 1024usize, 4096usize), ("fp8", "attn.wq_b", 32768, 1024), ("fp8", "attn.wo_b", 4096, 8192), ("fp8", "shared.w2", 4096, 2048)] {
        let vals = random(seed, &format!("q8time.t1.{name}"), rows * cols, (3.0 / cols as f64).sqrt());
        let (gw, _) = weight(gpu, fmt, &vals, rows, cols)?;
        let dx = gpu.upload(&random(seed, "q8time.t1.x", cols, 1.0))?;
        let mut dy = gpu.zeros::<f32>(rows)?;
        let (fused, apart) = switch_on_off_ms(gpu, repeats, "LINEAR_FUSED_QUANT", || gpu.linear_official(&dx, &gw, &mut dy, 1))?;
        let bytes = super::model::weight_bytes(&gw);
        let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
        println!("time q8 official T=1 {fmt} {name:<10} [{rows}x{cols}]  fused quant {fused:.4} ms {:.0} GB/s | copy + roundtrip + gemv {apart:.4} ms {:.0} GB/s", gbs(fused), gbs(apart));
        rows_out.push(json!({"op": "linear_official_t1", "weight": name, "format": fmt, "tokens": 1, "rows": rows, "cols": cols, "weight_bytes": bytes,
            "fused_quant_ms": fused, "fused_quant_gb_per_s": gbs(fused), "apart_ms": apart, "apart_gb_per_s": gbs(apart), "repeats": repeats}));
    }
    for (fmt, name, rows, cols, t) in timed {
        let vals = random(seed, &format!("q8time.{name}"), rows * cols, (3.0 / *cols as f64).sqrt());
        let (gw, _) = weight(gpu, fmt, &vals, *rows, *cols)?;
        let dx = gpu.upload(&random(seed, "q8time.x", t * cols, 1.0))?;
        let mut dy = gpu.zeros::<f32>(t * rows)?;
        let flops = 2.0 * (*t * *rows * *cols) as f64;
        let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
        let q8 = switch_scope(&[("FP8_CUBLASLT", "off")], || median_ms(gpu, repeats, || gpu.linear_official(&dx, &gw, &mut dy, *t)))?;
        let qa = gpu.act_quant(&dx, *t, *cols)?;
        let gemm = switch_scope(&[("FP8_CUBLASLT", "off")], || median_ms(gpu, repeats, || gpu.linear_q8(&qa, &gw, &mut dy, *t)))?;
        let sync = switch_scope(&[("FP8_WGMMA", "off"), ("FP8_CUBLASLT", "off")], || median_ms(gpu, repeats, || gpu.linear_q8(&qa, &gw, &mut dy, *t)))?;
        let lt = if *fmt == "fp8" && gpu.linear_lt(&qa, &gw, &mut dy, *t)? {
            Some(median_ms(gpu, repeats, || gpu.linear_lt(&qa, &gw, &mut dy, *t).map(|_| ()))?)
        } else {
            None
        };
        // WQ_B_BF16_OUT: the official linear (quantisation included) with f32 and with bf16 output.
        let (off_f32, off_bf16) = if *fmt == "fp8" {
            let mut dyb = gpu.zeros::<u16>(t * rows)?;
            let a = median_ms(gpu, repeats, || gpu.linear_official(&dx, &gw, &mut dy, *t))?;
            let b = median_ms(gpu, repeats, || gpu.linear_official_bf16(&dx, &gw, &mut dyb, *t))?;
            println!("time q8 {fmt} {name:<10} T={t:<5} [{rows}x{cols}]  official f32 out {a:.3} ms {:.0} TF/s | bf16 out (WQ_B_BF16_OUT) {b:.3} ms {:.0} TF/s", tf(a), tf(b));
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let bf16 = median_ms(gpu, repeats, || gpu.linear_tc(&dx, &gw, &mut dy, *t, None, false))?;
        let split = switch_scope(&[("LINEAR_CUBLASLT", "off")], || median_ms(gpu, repeats, || gpu.linear_tc(&dx, &gw, &mut dy, *t, None, true)))?;
        println!(
            "time q8 {fmt} {name:<10} T={t:<5} [{rows}x{cols}]  fp8 wgmma {q8:.3} ms {:.0} TF/s (GEMM alone {gemm:.3} ms {:.0} TF/s, {:.0}% of 1450) | fp8 mma.sync {sync:.3} ms {:.0} TF/s | bf16 {bf16:.3} ms {:.0} TF/s | split {split:.3} ms {:.0} TF/s{}",
            tf(q8),
            tf(gemm),
            100.0 * tf(gemm) / 1450.0,
            tf(sync),
            tf(bf16),
            tf(split),
            lt.map(|ms| format!(" | cuBLASLt {ms:.3} ms {:.0} TF/s ({:.0}% of 1450, scale layouts included)", tf(ms), 100.0 * tf(ms) / 1450.0)).unwrap_or_default()
        );
        rows_out.push(json!({"op": format!("linear_q8_{fmt}"), "weight": name, "tokens": t, "rows": rows, "cols": cols, "flop": flops,
            "fp8_ms": q8, "fp8_tflops": tf(q8), "fp8_gemm_only_ms": gemm, "fp8_gemm_only_tflops": tf(gemm), "fraction_of_1450_tflops": tf(gemm) / 1450.0, "mma_sync_ms": sync, "mma_sync_tflops": tf(sync),
            "bf16_ms": bf16, "bf16_tflops": tf(bf16), "split_ms": split, "split_tflops": tf(split), "cublaslt_ms": lt, "cublaslt_tflops": lt.map(tf),
            "official_f32_out_ms": off_f32, "official_bf16_out_ms": off_bf16, "repeats": repeats}));
    }
    Ok(rows_out)
}
