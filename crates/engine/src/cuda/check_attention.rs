//! gpu-check entries for the attention family, each against the CPU reference on fresh random
//! inputs drawn with [`random`] on DeepSeek-V4-Flash shapes, with Flash's compress rope
//! (θ 160000 + YaRN factor 16, L0 65536, β 32/1):
//!
//! - `sparse_attention_f32` vs [`attention::attend`] (H 64, c 512, rope 64, window 128) for queries
//!   at positions 198..202, 4998..5001, 1000..1040, 37..42 (windows shorter than 128) and 0 (one
//!   query), with sliding (no compressed keys), HCA (ratio 128, every visible entry, both identity
//!   and explicit lists) and CSA (ratio 4, the indexer-style list:
//!   every visible entry below 512, else 512 of them; also with out-of-range entries the kernels
//!   must skip) candidates and random sinks; the streaming
//!   kernels on the same cases (split-bf16 at [`SPLIT_NMSE_TOL`], fast exp, and on sm_90a the bf16
//!   kernels of `MLA_BF16`, precise and fast exp, at `BF16_ATT_NMSE_TOL`, also against the split
//!   and the precise bf16 kernel, and the precise one at `BF16_EMU_NMSE_TOL` against
//!   [`attention::attend_bf16`], the CPU replay of its numerics; the candidate-split bf16 kernel of
//!   `MLA_BF16_CAND_SPLIT` at `BF16_ATT_NMSE_TOL` against the CPU, the split and the bf16 kernel), their
//!   split-plane or bf16 output, fused q norm and mask path bit for bit;
//! - `add_position_bias_f32` vs the f32 add of [`compressor::project`], and the pooled entries
//!   (`compressor_pool_f32` + `rms_norm_f32` + `rope_positions_f32`) vs
//!   [`compressor::window_slots`] + [`compressor::pool`], for CSA (ratio 4, width 512, overlap) and
//!   HCA (ratio 128), from entry 0 and from a later partial chunk with a row base offset;
//! - `indexer_scores_f32` vs [`indexer::score`] (64 heads × 128, N 600) including the −inf mask,
//!   and `indexer_topk_f32` (k 512 and 16) vs the same selection rule applied to the GPU's own f32
//!   scores (must be identical) and vs [`indexer::select`] on the f64 reference scores (identical up
//!   to boundary near-ties, which are reported); plus a tie-heavy synthetic score test (N 5000).
//!
//! Index-set comparisons are exact records: they pass only with zero mismatches.

use super::check::{differing_bits, differing_values, flag_record, random, record, record_tol, SPLIT_NMSE_TOL};

/// NMSE bound of the fast-exp streaming kernel (`MLA_STREAM_FAST_EXP`) against the CPU and the
/// precise streaming kernel: `__expf` is within 2 + 1.2·|x| ulp of `expf` (CUDA programming guide,
/// intrinsic functions) for the arguments the online softmax takes (x ≤ 0; large |x| only for
/// terms too small to matter), so the bound is the split-bf16 one's order; a failure here means
/// the variant is broken, not slightly imprecise.
const FAST_EXP_NMSE_TOL: f64 = 1e-8;

/// NMSE bound of the bf16 streaming kernel (`MLA_BF16`) against the CPU and the split kernel: Q,
/// K=V and P rounded to bf16 (relative error ≤ 2⁻⁹ each, about 2⁻⁹/√3 rms) give output errors of
/// order 1e-3 relative, NMSE ~1e-6; the bound leaves two orders of magnitude, while a broken
/// layout or pipeline gives NMSE ~1.
const BF16_ATT_NMSE_TOL: f64 = 1e-4;

/// NMSE bound of the bf16 streaming kernel against [`attention::attend_bf16`], the CPU replay of
/// its numerics: they differ in the order of the f32 sums only, which moves a logit by ~1e-7
/// relative and so flips the bf16 rounding of a few weights P (~2.5e-4 of them; each by 2⁻⁸
/// relative): NMSE of order 1e-9. A kernel that skipped a rounding (of Q, K=V or P) or mishandled
/// the tiles' running max would sit near the 1e-5 of the exact comparison.
const BF16_EMU_NMSE_TOL: f64 = 1e-7;
use super::gpu::{Gpu, MultiOut};
use super::ops_attention::{hca_candidates, AttentionKernel, AttentionOut, AttentionQuery, hca_offsets, topk_offsets, visible_entries, AttentionShape, CompressedKeys, IndexerShape, PoolShape};
use super::CudaError;
use crate::cpu::rope::Rope;
use crate::forward::{attention, compressor, indexer};
use cudarc::driver::CudaSlice;
use flashseek_model::config::{RopeParams, Yarn};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Flash's compress rope: θ 160000 + YaRN (factor 16, L0 65536, β 32/1), 64 dims (spec §3.2).
pub(crate) fn flash_compress_rope() -> Rope {
    let yarn = Yarn { factor: 16.0, original_max_position_embeddings: 65536.0, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0, truncate: true };
    Rope::new(&RopeParams { theta: 160000.0, yarn: Some(yarn) }, 64)
}

/// Prints and appends an exact-comparison record (index sets, masks): passes only when
/// `mismatches == 0`.
fn record_exact(out: &mut Vec<Value>, op: &str, shape: Value, mismatches: usize, compared: usize, extra: Value) -> bool {
    let pass = mismatches == 0;
    println!("{op:<28} {shape:<28} exact: {mismatches} mismatches of {compared}  {extra}  {}", if pass { "ok" } else { "FAIL" });
    out.push(json!({"op": op, "shape": shape, "exact": true, "mismatches": mismatches, "compared": compared, "detail": extra, "pass": pass}));
    pass
}

/// Runs the attention-family checks, appending one record per op to `out`; returns whether all passed.
pub fn run(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let rope = flash_compress_rope();
    let inv = gpu.upload(rope.inv_freq())?;
    let mut all = true;
    all &= check_attention(gpu, seed, out, &rope, &inv)?;
    all &= check_compressor(gpu, seed, out, &rope, &inv)?;
    all &= check_linear_multi(gpu, seed, out)?;
    all &= check_indexer(gpu, seed, out)?;
    all &= check_indexer_stream(gpu, seed, out)?;
    all &= check_wo_a_fp8(gpu, seed, out)?;
    Ok(all)
}

/// `WO_A_FP8`: [`Gpu::grouped_linear_lt_fp8`] on act_quant_fp8's bytes and scales of a random
/// attention output `[t, G·gin]`, 8 groups of FP8 `[256, 512]` at 300 tokens, against the CPU in
/// the same numerics (the output quantize-dequantized per 128 values by
/// `act_quant_fp8_roundtrip`, then f64 sums with the dequantized weights per group): NMSE within
/// `Q8_NMSE_TOL`, as the FP8 linears' records; it must run on cuBLASLt (every group) and repeat
/// bit for bit. Then on the Flash shape (8 groups of `[1024, 4096]`, 8,192 tokens) against the
/// bf16 product of the output rounded to bf16 (`MLA_BF16`'s path: NMSE reported), both GEMMs
/// timed (CUDA events, median of 5 after a warm-up; the conversions to planes and to e4m3 not
/// included: the attention kernel writes either).
fn check_wo_a_fp8(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    use super::check::{errors, fp8_group_weights, grouped_linear_cpu, weight};
    use super::check_moe::Q8_NMSE_TOL;
    if !gpu.lt_available() {
        out.push(json!({"op": "wo_a fp8", "skipped": "cuBLASLt unavailable", "informational": true}));
        return Ok(true);
    }
    let mut all = true;
    let (groups, r, gin, t) = (8usize, 256usize, 512usize, 300usize);
    let o = random(seed, "wo_a8.o", t * groups * gin, 1.0);
    let mut xr = o.clone();
    flashseek_model::quant::act_quant_fp8_roundtrip(&mut xr, 128).map_err(|e| CudaError::Unsupported { what: "wo_a fp8 check", detail: e.to_string() })?;
    let (ws, cpu_ws) = fp8_group_weights(gpu, seed, "wo_a8.w", groups, r, gin)?;
    let want = grouped_linear_cpu(&xr, t, &cpu_ws);
    let qa = gpu.act_quant(&gpu.upload(&o)?, t, groups * gin)?;
    let mut dz = gpu.upload(&vec![f32::NAN; t * groups * r])?;
    let done = gpu.grouped_linear_lt_fp8(&qa.q, &qa.sa, &ws, &mut dz, t)?;
    let got = gpu.download(&dz)?;
    let (nmse, max_abs, _) = errors(&got, &want);
    let ok = done == groups && nmse <= Q8_NMSE_TOL && got.iter().all(|v| v.is_finite());
    println!("wo_a fp8 [8 × {r}, {gin}] T={t}: {done} of {groups} groups on cuBLASLt, nmse {nmse:.3e} max_abs {max_abs:.3e} vs the CPU (tol {Q8_NMSE_TOL:.0e})  {}", if ok { "ok" } else { "FAIL" });
    all &= flag_record(out, &format!("wo_a fp8 [8 × {r}, {gin}] vs cpu"), json!({"shape": [t, groups, r, gin], "groups_run": done, "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_NMSE_TOL}), ok);
    let mut again = gpu.upload(&vec![f32::NAN; t * groups * r])?;
    gpu.grouped_linear_lt_fp8(&qa.q, &qa.sa, &ws, &mut again, t)?;
    let same = differing_bits(&gpu.download(&again)?, &got) == 0;
    all &= flag_record(out, &format!("wo_a fp8 [8 × {r}, {gin}] repeatable"), json!({"bitwise_equal": same}), same);

    // The Flash shape: against the bf16 product (MLA_BF16's wo_a) and timed.
    let (r, gin, t) = (1024usize, 4096usize, 8192usize);
    let mut ws = Vec::new();
    for g in 0..groups {
        ws.push(weight(gpu, "fp8", &random(seed, &format!("wo_a8.flash.w.{g}"), r * gin, (3.0 / gin as f64).sqrt()), r, gin)?.0);
    }
    let d_o = gpu.upload(&random(seed, "wo_a8.flash.o", t * groups * gin, 1.0))?;
    let qa = gpu.act_quant(&d_o, t, groups * gin)?;
    let (xb, _, kp) = gpu.bf16_planes(&d_o, t, groups * gin, false)?;
    let mut z8 = gpu.zeros::<f32>(t * groups * r)?;
    let mut zb = gpu.zeros::<f32>(t * groups * r)?;
    let done8 = gpu.grouped_linear_lt_fp8(&qa.q, &qa.sa, &ws, &mut z8, t)?;
    let doneb = gpu.grouped_linear_lt_planes(&xb, None, kp, &ws, &mut zb, t)?;
    let (a, b) = (gpu.download(&z8)?, gpu.download(&zb)?);
    let (nmse, max_abs, _) = errors(&a, &b);
    let ms8 = super::check::median_ms(gpu, 5, || gpu.grouped_linear_lt_fp8(&qa.q, &qa.sa, &ws, &mut z8, t).map(|_| ()))?;
    let msb = super::check::median_ms(gpu, 5, || gpu.grouped_linear_lt_planes(&xb, None, kp, &ws, &mut zb, t).map(|_| ()))?;
    let tf = |ms: f64| 2.0 * (t * groups * r * gin) as f64 / (ms * 1e-3) / 1e12;
    println!("time wo_a grouped [8 × {r}, {gin}] T={t}: fp8 (WO_A_FP8) {ms8:.3} ms {:.0} TFLOP/s | bf16 {msb:.3} ms {:.0} TFLOP/s; fp8 vs bf16 nmse {nmse:.3e} max_abs {max_abs:.3e}", tf(ms8), tf(msb));
    let ran = done8 == groups && doneb == groups;
    all &= flag_record(out, &format!("wo_a fp8 [8 × {r}, {gin}] ran"), json!({"tokens": t, "fp8_groups_run": done8, "bf16_groups_run": doneb}), ran);
    out.push(json!({"op": "wo_a fp8 vs bf16 (Flash shape)", "tokens": t, "nmse": nmse, "max_abs": max_abs, "fp8_ms": ms8, "bf16_ms": msb, "fp8_tflop_per_s": tf(ms8), "bf16_tflop_per_s": tf(msb), "informational": true}));
    Ok(all)
}

/// Times the attention kernels on a Flash prefill chunk: `tokens` queries at position `pos0`, 64
/// heads of 512, window 128 plus 512 compressed entries per query (CSA shape); the bf16 kernels
/// also on an HCA and a sliding-window layer's shapes at `pos0 − tokens`; the candidate-split
/// kernel in the serving configuration's form (bf16 raw queries, e4m3 output) on all three; then
/// the indexer. CUDA
/// events, median of `repeats` after a warm-up; each timed call includes what the kernel's entry
/// point does per call (for the bf16 kernels, the bf16 copies of the f32 K=V rows).
pub fn timings(gpu: &Gpu, seed: u64, repeats: usize, tokens: usize, pos0: usize) -> Result<Vec<Value>, CudaError> {
    const H: usize = 64;
    const C: usize = 512;
    const WINDOW: usize = 128;
    const TOPK: usize = 512;
    let rope = flash_compress_rope();
    let inv = gpu.upload(rope.inv_freq())?;
    let kv_base = (pos0 + 1).saturating_sub(WINDOW);
    let kv_rows = pos0 + tokens - kv_base;
    let n_entries = (pos0 + tokens) / 4;
    let dq = gpu.upload(&random(seed, "attn_time.q", tokens * H * C, 1.0))?;
    let dkv = gpu.upload(&random(seed, "attn_time.kv", kv_rows * C, 1.0))?;
    let dentries = gpu.upload(&random(seed, "attn_time.entries", n_entries.max(1) * C, 1.0))?;
    let dsinks = gpu.upload(&random(seed, "attn_time.sinks", H, 1.0))?;
    let mut off = vec![0i32];
    let mut idx = Vec::new();
    let mut cands = 0usize;
    for t in 0..tokens {
        let vis = visible_entries(pos0 + t, 4, n_entries);
        let k = vis.min(TOPK);
        idx.extend((0..k).map(|j| (j * vis / k.max(1)) as i32));
        off.push(idx.len() as i32);
        cands += k + WINDOW.min(pos0 + t + 1);
    }
    let (doff, didx) = (gpu.upload(&off)?, gpu.upload(&idx)?);
    let ck = CompressedKeys { entries: &dentries, offsets: &doff, indices: Some(&didx), mask: None };
    // The mask path of DIRECT_INDEXER_TOPK=off (mask built once here; its build is timed apart).
    let mask = gpu.topk_mask(&doff, &didx, tokens, n_entries.max(1))?;
    let dvis = gpu.upload(&hca_offsets(pos0, tokens, 4, n_entries)?)?;
    let ck_mask = CompressedKeys { entries: &dentries, offsets: &dvis, indices: None, mask: Some(&mask) };
    let shape = AttentionShape { tokens, heads: H, head_dim: C, pos0, window: WINDOW, kv_base };
    let mut dout = gpu.zeros::<f32>(tokens * H * C)?;
    let flops = 4.0 * (H * C) as f64 * cands as f64;
    let mut rows = Vec::new();
    let mut kernels = vec![(AttentionKernel::Exact, false), (AttentionKernel::Stream, false), (AttentionKernel::StreamFastExp, false), (AttentionKernel::Stream, true)];
    if gpu.attention_bf16_ok() {
        kernels.extend([(AttentionKernel::StreamBf16, false), (AttentionKernel::StreamBf16, true)]);
    }
    if gpu.attention_cand_split_ok() {
        kernels.extend([(AttentionKernel::StreamBf16Cand, false), (AttentionKernel::StreamBf16Cand, true)]);
    }
    for (kernel, masked) in kernels {
        let keys = if masked { &ck_mask } else { &ck };
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.sparse_attention_into(AttentionQuery::Normed(&dq), &dkv, Some(keys), &dsinks, &inv, &rope, &mut AttentionOut::F32(&mut dout), &shape, kernel))?;
        let tf = flops / (ms * 1e-3) / 1e12;
        let path = if masked { "mask" } else { "lists" };
        println!("time sparse_attention {kernel:?} ({path}) T={tokens} pos0={pos0} (window 128 + 512 selected) {ms:.2} ms  {tf:.1} TFLOP/s");
        rows.push(json!({"op": "sparse_attention", "kernel": format!("{kernel:?}"), "path": path, "tokens": tokens, "pos0": pos0, "heads": H, "head_dim": C, "candidates": cands, "median_ms": ms, "tflop_per_s": tf}));
    }
    // The other layer kinds' shapes for the bf16 kernels (bf16 output, as the serving
    // configuration runs them), for the `tokens` queries before this chunk's (at p0 = pos0 −
    // tokens: by default the last quarter of an 8K prompt): an HCA layer's (window 128 + every
    // entry of ratio 128 below the position: at most 64 below 8,192, so that the candidate-split
    // kernel's last step has an empty block) and a sliding-window layer's (window 128 alone, one
    // step).
    {
        let n = tokens * H * C;
        // SAFETY: the kernel writes all n values; nothing reads them.
        let mut out16 = unsafe { gpu.scratch::<u16>(n) }?;
        // The CSA chunk's rows, keys and shape (shadowed below by the previous chunk's).
        let (csa_kv, csa_shape) = (&dkv, &shape);
        let p0 = pos0.saturating_sub(tokens);
        let kv_base = (p0 + 1).saturating_sub(WINDOW);
        let kv_rows = p0 + tokens - kv_base;
        let dkv = gpu.upload(&random(seed, "attn_time.kv_prev", kv_rows * C, 1.0))?;
        let shape = AttentionShape { tokens, heads: H, head_dim: C, pos0: p0, window: WINDOW, kv_base };
        let hca_entries = (p0 + tokens) / 128;
        let dhca = gpu.upload(&random(seed, "attn_time.hca", hca_entries.max(1) * C, 1.0))?;
        let dhoff = gpu.upload(&hca_offsets(p0, tokens, 128, hca_entries)?)?;
        let hk = CompressedKeys { entries: &dhca, offsets: &dhoff, indices: None, mask: None };
        let hca_cands: usize = (0..tokens).map(|t| visible_entries(p0 + t, 128, hca_entries) + WINDOW.min(p0 + t + 1)).sum();
        let win_cands: usize = (0..tokens).map(|t| WINDOW.min(p0 + t + 1)).sum();
        let mut bf16_kernels = Vec::new();
        if gpu.attention_bf16_ok() {
            bf16_kernels.push(AttentionKernel::StreamBf16);
        }
        if gpu.attention_cand_split_ok() {
            bf16_kernels.push(AttentionKernel::StreamBf16Cand);
        }
        for kernel in bf16_kernels {
            for (layer, keys, c) in [("hca", Some(&hk), hca_cands), ("sliding", None, win_cands)] {
                let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.sparse_attention_into(AttentionQuery::Normed(&dq), &dkv, keys, &dsinks, &inv, &rope, &mut AttentionOut::Bf16(&mut out16), &shape, kernel))?;
                let tf = 4.0 * (H * C) as f64 * c as f64 / (ms * 1e-3) / 1e12;
                println!("time sparse_attention {kernel:?} ({layer}, bf16 out) T={tokens} pos0={p0} ({:.1} candidates per query) {ms:.3} ms  {tf:.1} TFLOP/s", c as f64 / tokens as f64);
                rows.push(json!({"op": "sparse_attention", "kernel": format!("{kernel:?}"), "layer": layer, "output": "bf16", "tokens": tokens, "pos0": p0, "heads": H, "head_dim": C, "candidates": c, "median_ms": ms, "tflop_per_s": tf}));
            }
        }
        // The serving configuration's form of the candidate-split kernel (MLA_BF16_CAND_SPLIT with
        // MLA_FUSED_Q_NORM, WQ_B_BF16_OUT and WO_A_FP8): raw queries as bf16 bits normed and rotated
        // while staged, the output as e4m3 bytes with 1 × 128 scales; the three layer kinds' shapes.
        if gpu.attention_cand_split_ok() {
            let kernel = AttentionKernel::StreamBf16Cand;
            let qb: Vec<u16> = random(seed, "attn_time.q_raw_bf16", n, 1.0).iter().map(|&v| flashseek_model::quant::f32_to_bf16(v)).collect();
            let dqb = gpu.upload(&qb)?;
            // SAFETY: the kernel writes all n bytes and n / 128 scales; nothing reads them.
            let mut q8 = unsafe { gpu.scratch::<u8>(n) }?;
            let mut s8 = unsafe { gpu.scratch::<f32>(n / 128) }?;
            let csa_cands = cands;
            for (layer, kv, keys, sh, c) in [("csa", csa_kv, Some(&ck), csa_shape, csa_cands), ("hca", &dkv, Some(&hk), &shape, hca_cands), ("sliding", &dkv, None, &shape, win_cands)] {
                let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || {
                    gpu.sparse_attention_into(AttentionQuery::RawBf16 { q: &dqb, eps: 1e-6 }, kv, keys, &dsinks, &inv, &rope, &mut AttentionOut::Fp8 { q: &mut q8, scales: &mut s8 }, sh, kernel)
                })?;
                let tf = 4.0 * (H * C) as f64 * c as f64 / (ms * 1e-3) / 1e12;
                println!(
                    "time sparse_attention {kernel:?} ({layer}, serving: bf16 raw q, fp8 out) T={tokens} pos0={} ({:.1} candidates per query) {ms:.3} ms  {tf:.1} TFLOP/s",
                    sh.pos0,
                    c as f64 / tokens as f64
                );
                rows.push(json!({"op": "sparse_attention", "kernel": format!("{kernel:?}"), "layer": layer, "path": match keys { Some(k) if k.indices.is_some() => "lists", Some(_) => "identity", None => "window only" }, "query": "raw bf16 (fused q norm)", "output": "fp8", "tokens": tokens, "pos0": sh.pos0, "heads": H, "head_dim": C, "candidates": c, "median_ms": ms, "tflop_per_s": tf}));
            }
        }
    }
    // MLA_SPLIT_OUT: the streaming kernel writing the split bf16 planes instead of f32.
    {
        let n = tokens * H * C;
        // SAFETY: the kernel writes both planes' n values; nothing reads them.
        let mut planes = unsafe { gpu.scratch::<u16>(2 * n) }?;
        let mut streams = vec![AttentionKernel::Stream];
        if gpu.attention_bf16_ok() {
            streams.push(AttentionKernel::StreamBf16);
        }
        if gpu.attention_cand_split_ok() {
            streams.push(AttentionKernel::StreamBf16Cand);
        }
        for kernel in streams {
            // The split kernel writes both planes, the bf16 one its bf16 output (the hi plane).
            let output = if kernel.is_bf16() { "bf16" } else { "split planes" };
            let mut run = |query: AttentionQuery<'_>| -> Result<(), CudaError> {
                let mut o = if kernel.is_bf16() { AttentionOut::Bf16(&mut planes) } else { AttentionOut::SplitPlanes { planes: &mut planes, plane: n } };
                gpu.sparse_attention_into(query, &dkv, Some(&ck), &dsinks, &inv, &rope, &mut o, &shape, kernel)
            };
            let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || run(AttentionQuery::Normed(&dq)))?;
            let tf = flops / (ms * 1e-3) / 1e12;
            println!("time sparse_attention {kernel:?} (lists, {output} out) T={tokens} pos0={pos0} (window 128 + 512 selected) {ms:.2} ms  {tf:.1} TFLOP/s");
            rows.push(json!({"op": "sparse_attention", "kernel": format!("{kernel:?}"), "path": "lists", "output": output, "tokens": tokens, "pos0": pos0, "heads": H, "head_dim": C, "candidates": cands, "median_ms": ms, "tflop_per_s": tf}));
            // MLA_FUSED_Q_NORM: the same from raw queries (the kernel norms and rotates them), and the
            // pass over the queries it removes.
            let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || run(AttentionQuery::Raw { q: &dq, eps: 1e-6 }))?;
            let tf = flops / (ms * 1e-3) / 1e12;
            println!("time sparse_attention {kernel:?} (lists, {output} out, fused q norm) T={tokens} pos0={pos0} (window 128 + 512 selected) {ms:.2} ms  {tf:.1} TFLOP/s");
            rows.push(json!({"op": "sparse_attention", "kernel": format!("{kernel:?}"), "path": "lists", "output": output, "query": "raw (fused q norm)", "tokens": tokens, "pos0": pos0, "heads": H, "head_dim": C, "candidates": cands, "median_ms": ms, "tflop_per_s": tf}));
        }
        // SAFETY: rms_norm_rope writes all n values; nothing reads them.
        let mut qn = unsafe { gpu.scratch::<f32>(n) }?;
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.rms_norm_rope(&dq, None, &mut qn, tokens, H, C, 1e-6, &inv, &rope, pos0))?;
        println!("time rms_norm_rope (per-head q RMSNorm + RoPE: the pass MLA_FUSED_Q_NORM removes) T={tokens} {ms:.3} ms");
        rows.push(json!({"op": "rms_norm_rope", "tokens": tokens, "heads": H, "head_dim": C, "median_ms": ms}));
    }
    let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.topk_mask(&doff, &didx, tokens, n_entries.max(1)).map(|_| ()))?;
    println!("time topk_mask T={tokens} entries={n_entries} {ms:.3} ms (allocation + zeroing + scatter)");
    rows.push(json!({"op": "topk_mask", "tokens": tokens, "entries": n_entries, "median_ms": ms}));
    // Indexer scores for the same chunk at 128K context (32,768 visible entries of 128).
    let (ih, ihd, ipos0) = (64usize, 128usize, 131072 - tokens);
    let n = (ipos0 + tokens) / 4;
    let dq = gpu.upload(&random(seed, "idx_time.q", tokens * ih * ihd, 1.0))?;
    let dk = gpu.upload(&random(seed, "idx_time.k", n * ihd, 1.0))?;
    let dw = gpu.upload(&random(seed, "idx_time.w", tokens * ih, 0.1))?;
    let mut dsc = gpu.zeros::<f32>(tokens * n)?;
    let ishape = IndexerShape { tokens, heads: ih, head_dim: ihd, n_entries: n, ratio: 4, pos0: ipos0 };
    let visible: f64 = (0..tokens).map(|t| visible_entries(ipos0 + t, 4, n) as f64).sum();
    let flops = 2.0 * (ih * ihd) as f64 * visible;
    for tc in [false, true] {
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_scores_with(&dq, &dk, &dw, &mut dsc, &ishape, tc))?;
        let tf = flops / (ms * 1e-3) / 1e12;
        println!("time indexer_scores {} T={tokens} entries={n} {ms:.2} ms  {tf:.1} TFLOP/s", if tc { "tc " } else { "f32" });
        rows.push(json!({"op": "indexer_scores", "kernel": if tc { "tc" } else { "f32" }, "tokens": tokens, "entries": n, "median_ms": ms, "tflop_per_s": tf}));
    }
    // The whole selection (top-512): scores matrix + radix top-k vs the fused streaming kernel.
    let off = topk_offsets(ipos0, tokens, 4, n, TOPK)?;
    let doff = gpu.upload(&off)?;
    let mut didx = gpu.zeros::<i32>((off[tokens] as usize).max(1))?;
    let ms_topk = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk(&dsc, &doff, &mut didx, &ishape, TOPK))?;
    let ms_stream = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_stream(&dq, &dk, &dw, &doff, &mut didx, &ishape, TOPK))?;
    if gpu.arch == "sm_90a" {
        // INDEXER_WGMMA: the key split included (as in the forward).
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_wgmma(&dq, &dk, &dw, &doff, &mut didx, &ishape, TOPK))?;
        let tf = flops / (ms * 1e-3) / 1e12;
        println!("time indexer_topk_wgmma T={tokens} entries={n} {ms:.2} ms {tf:.1} TFLOP/s (incl. the key split) | indexer_topk_stream {ms_stream:.2} ms");
        rows.push(json!({"op": "indexer_topk_wgmma", "kernel": "fused wgmma", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms, "tflop_per_s": tf}));
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_scores_wgmma(&dq, &dk, &dw, &mut dsc, &ishape))?;
        let tf = flops / (ms * 1e-3) / 1e12;
        println!("time indexer_scores wgmma T={tokens} entries={n} {ms:.2} ms  {tf:.1} TFLOP/s (incl. the key split)");
        rows.push(json!({"op": "indexer_scores", "kernel": "wgmma", "tokens": tokens, "entries": n, "median_ms": ms, "tflop_per_s": tf}));
    }
    // INDEXER_FP8: the quantisation of queries and keys included (as in the forward).
    let ms_fp8 = super::check::median_ms(gpu, repeats.clamp(1, 10), || {
        let q8 = gpu.act_quant(&dq, tokens * ih, ihd)?;
        let k8 = gpu.act_quant(&dk, n, ihd)?;
        gpu.indexer_topk_stream_fp8(&q8, &k8, &dw, &doff, &mut didx, &ishape, TOPK)
    })?;
    println!("time indexer_topk_stream_fp8 T={tokens} entries={n} {ms_fp8:.2} ms {:.1} TFLOP/s (incl. quantisation)", flops / (ms_fp8 * 1e-3) / 1e12);
    rows.push(json!({"op": "indexer_topk_stream_fp8", "kernel": "fused fp8", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms_fp8, "tflop_per_s": flops / (ms_fp8 * 1e-3) / 1e12}));
    if gpu.arch == "sm_90a" {
        // INDEXER_FP8 with INDEXER_WGMMA: the quantisation (keys in the tiled layout) included.
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || {
            let q8 = gpu.act_quant(&dq, tokens * ih, ihd)?;
            let k8t = gpu.act_quant_layout(&dk, n, ihd, true)?;
            gpu.indexer_topk_wgmma_fp8(&q8, &k8t, &dw, &doff, &mut didx, &ishape, TOPK)
        })?;
        let tf = flops / (ms * 1e-3) / 1e12;
        println!("time indexer_topk_wgmma_fp8 T={tokens} entries={n} {ms:.2} ms {tf:.1} TFLOP/s (incl. quantisation) | indexer_topk_stream_fp8 {ms_fp8:.2} ms");
        rows.push(json!({"op": "indexer_topk_wgmma_fp8", "kernel": "fused wgmma fp8", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms, "tflop_per_s": tf}));
        let q8 = gpu.act_quant(&dq, tokens * ih, ihd)?;
        let k8t = gpu.act_quant_layout(&dk, n, ihd, true)?;
        let ms = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_wgmma_fp8(&q8, &k8t, &dw, &doff, &mut didx, &ishape, TOPK))?;
        println!("time indexer_topk_wgmma_fp8 kernel alone T={tokens} entries={n} {ms:.2} ms {:.1} TFLOP/s", flops / (ms * 1e-3) / 1e12);
        rows.push(json!({"op": "indexer_topk_wgmma_fp8", "kernel": "kernel alone (operands quantized once)", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms, "tflop_per_s": flops / (ms * 1e-3) / 1e12}));
        // What the selection costs: the same pipeline writing the scores instead (268 MB), and
        // selecting the top 16 (fewer candidates and cuts once the threshold is high).
        let ms_sc = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_scores_wgmma_fp8(&q8, &k8t, &dw, &mut dsc, &ishape))?;
        let off16 = topk_offsets(ipos0, tokens, 4, n, 16)?;
        let doff16 = gpu.upload(&off16)?;
        let mut didx16 = gpu.zeros::<i32>((off16[tokens] as usize).max(1))?;
        let ms16 = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_wgmma_fp8(&q8, &k8t, &dw, &doff16, &mut didx16, &ishape, 16))?;
        println!("time indexer_scores_wgmma_fp8 T={tokens} entries={n} {ms_sc:.2} ms (scores written, no selection) | indexer_topk_wgmma_fp8 k=16 {ms16:.2} ms");
        rows.push(json!({"op": "indexer_scores_wgmma_fp8", "kernel": "scores only", "tokens": tokens, "entries": n, "median_ms": ms_sc}));
        rows.push(json!({"op": "indexer_topk_wgmma_fp8", "kernel": "kernel alone, k = 16", "tokens": tokens, "entries": n, "k": 16, "median_ms": ms16}));
    }
    // The shortest chunks the streaming paths take (INDEXER_STREAM_MIN_TOKENS): the score matrix
    // + radix top-k, indexer_topk_stream and indexer_topk_wgmma at 256 … 1,024 tokens, same context.
    for t_small in [256usize, 512, 1024] {
        let p0 = 131072 - t_small;
        let shp = IndexerShape { tokens: t_small, heads: ih, head_dim: ihd, n_entries: n, ratio: 4, pos0: p0 };
        let off = topk_offsets(p0, t_small, 4, n, TOPK)?;
        let doff = gpu.upload(&off)?;
        let mut didx = gpu.zeros::<i32>((off[t_small] as usize).max(1))?;
        let mut dsc_small = gpu.zeros::<f32>(t_small * n)?;
        let ms_matrix = super::check::median_ms(gpu, repeats.clamp(1, 10), || {
            gpu.indexer_scores_with(&dq, &dk, &dw, &mut dsc_small, &shp, true)?;
            gpu.indexer_topk(&dsc_small, &doff, &mut didx, &shp, TOPK)
        })?;
        let ms_st = super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_stream(&dq, &dk, &dw, &doff, &mut didx, &shp, TOPK))?;
        let ms_wg = if gpu.arch == "sm_90a" { super::check::median_ms(gpu, repeats.clamp(1, 10), || gpu.indexer_topk_wgmma(&dq, &dk, &dw, &doff, &mut didx, &shp, TOPK))? } else { f64::NAN };
        println!("time indexer selection T={t_small} entries={n}: score matrix + top-k {ms_matrix:.2} ms | indexer_topk_stream {ms_st:.2} ms | indexer_topk_wgmma {ms_wg:.2} ms");
        rows.push(json!({"op": "indexer_selection_short_chunk", "tokens": t_small, "entries": n, "k": TOPK, "matrix_ms": ms_matrix, "stream_ms": ms_st, "wgmma_ms": ms_wg}));
    }
    let score_mb = (tokens * n * 4) as f64 / 1e6;
    println!("time indexer_topk T={tokens} entries={n} radix over the score matrix {ms_topk:.2} ms (+ scores above, {score_mb:.0} MB matrix) | fused streaming {ms_stream:.2} ms {:.1} TFLOP/s (no matrix)", flops / (ms_stream * 1e-3) / 1e12);
    rows.push(json!({"op": "indexer_topk", "kernel": "radix over scores", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms_topk, "score_matrix_mb": score_mb}));
    rows.push(json!({"op": "indexer_topk_stream", "kernel": "fused", "tokens": tokens, "entries": n, "k": TOPK, "median_ms": ms_stream, "tflop_per_s": flops / (ms_stream * 1e-3) / 1e12}));
    Ok(rows)
}

/// The output `kernel` writes for the grouped output projection: the split planes (hi at 0, lo at
/// `plane`), or for the bf16 kernels the bf16 output alone.
fn planes_out(kernel: AttentionKernel, planes: &mut CudaSlice<u16>, plane: usize) -> AttentionOut<'_> {
    if kernel.is_bf16() {
        AttentionOut::Bf16(planes)
    } else {
        AttentionOut::SplitPlanes { planes, plane }
    }
}

/// Candidate source of an attention check case.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// Window only (sliding layer).
    Sliding,
    /// HCA, identity lists (no index buffer).
    HcaIdentity,
    /// HCA, explicit CSR lists.
    HcaExplicit,
    /// CSA, explicit indexer-style lists.
    Csa,
    /// CSA lists with entries every kernel must skip: −1 first, the uploaded entry count and 7 past
    /// it last (the lists path only: the mask path never sees such entries).
    CsaOutOfRange,
}

fn check_attention(gpu: &Gpu, seed: u64, out: &mut Vec<Value>, rope: &Rope, inv: &CudaSlice<f32>) -> Result<bool, CudaError> {
    const H: usize = 64;
    const C: usize = 512;
    const WINDOW: usize = 128;
    const TOPK: usize = 512;
    // The q RMSNorm epsilon of DeepSeek-V4 (config rms_norm_eps).
    const Q_EPS: f32 = 1e-6;
    let mut all = true;
    let sinks = random(seed, "attn.sinks", H, 2.0);
    let dsinks = gpu.upload(&sinks)?;
    // (37, 5) and (0, 1): windows shorter than 128 (the candidate-split kernel's 64-candidate blocks
    // then hold window rows and entries together), the second a single query as in decode.
    for (pos0, tokens) in [(198usize, 4usize), (4998, 3), (1000, 40), (37, 5), (0, 1)] {
        // Raw rows from a few positions before the first window (exercises the base offset).
        let kv_base = (pos0 + 1).saturating_sub(WINDOW).saturating_sub(3);
        let kv_rows = pos0 + tokens - kv_base;
        let kv = random(seed, &format!("attn.kv.{pos0}"), kv_rows * C, 1.7);
        let q = random(seed, &format!("attn.q.{pos0}"), tokens * H * C, 1.7);
        let (dq, dkv) = (gpu.upload(&q)?, gpu.upload(&kv)?);
        // Raw queries (a wq_b output) and their per-head RMSNorm + RoPE (MLA_FUSED_Q_NORM's check).
        let q_raw = random(seed, &format!("attn.q_raw.{pos0}"), tokens * H * C, 3.0);
        let dq_raw = gpu.upload(&q_raw)?;
        // WQ_B_BF16_OUT: the raw queries rounded to bf16, as bits and widened to f32.
        let q_raw_bf16: Vec<u16> = q_raw.iter().map(|&v| flashseek_model::quant::f32_to_bf16(v)).collect();
        let dq_raw_bf16 = gpu.upload(&q_raw_bf16)?;
        let dq_raw_widened = gpu.upload(&q_raw_bf16.iter().map(|&b| flashseek_model::quant::bf16_to_f32(b)).collect::<Vec<f32>>())?;
        let mut dq_normed = gpu.zeros::<f32>(tokens * H * C)?;
        gpu.rms_norm_rope(&dq_raw, None, &mut dq_normed, tokens, H, C, Q_EPS, inv, rope, pos0)?;
        for keys_kind in [Keys::Sliding, Keys::HcaIdentity, Keys::HcaExplicit, Keys::Csa, Keys::CsaOutOfRange] {
            let ratio = match keys_kind {
                Keys::Sliding => 1,
                Keys::HcaIdentity | Keys::HcaExplicit => 128,
                Keys::Csa | Keys::CsaOutOfRange => 4,
            };
            let n_entries = match keys_kind {
                Keys::Sliding => 0,
                _ => (pos0 + tokens) / ratio,
            };
            let entries = random(seed, &format!("attn.entries.{pos0}.{ratio}"), n_entries.max(1) * C, 1.7);
            // Per-query compressed lists (ascending entry indices).
            let lists: Vec<Vec<usize>> = (0..tokens)
                .map(|t| {
                    let vis = visible_entries(pos0 + t, ratio, n_entries);
                    match keys_kind {
                        Keys::Sliding => Vec::new(),
                        Keys::HcaIdentity | Keys::HcaExplicit => (0..vis).collect(),
                        Keys::Csa | Keys::CsaOutOfRange if vis <= TOPK => (0..vis).collect(),
                        Keys::Csa | Keys::CsaOutOfRange => {
                            let r = random(seed, &format!("attn.pick.{pos0}.{t}"), vis, 1.0);
                            let mut order: Vec<usize> = (0..vis).collect();
                            order.sort_by(|a, b| r[*b].total_cmp(&r[*a]).then(a.cmp(b)));
                            let mut pick = order[..TOPK].to_vec();
                            pick.sort_unstable();
                            pick
                        }
                    }
                })
                .collect();
            // CPU reference: window rows in position order, then the list's entries.
            let keys_of = |t: usize| -> Vec<&[f32]> {
                let mut keys: Vec<&[f32]> = attention::window_range(pos0 + t, WINDOW).map(|j| &kv[(j - kv_base) * C..(j - kv_base + 1) * C]).collect();
                keys.extend(lists[t].iter().map(|e| &entries[e * C..(e + 1) * C]));
                keys
            };
            let cpu: Vec<f32> = (0..tokens).into_par_iter().flat_map_iter(|t| attention::attend(&q[t * H * C..(t + 1) * H * C], &keys_of(t), &sinks, C, rope, pos0 + t)).collect();
            // GPU: each kernel on the lists; on CSA also through the mask path (DIRECT_INDEXER_TOPK=off).
            let shape = AttentionShape { tokens, heads: H, head_dim: C, pos0, window: WINDOW, kv_base };
            let dentries = gpu.upload(&entries[..n_entries.max(1) * C])?;
            let n_listed: usize = lists.iter().map(Vec::len).sum();
            let (off, idx) = match keys_kind {
                Keys::Sliding => (Vec::new(), Vec::new()),
                Keys::HcaIdentity => (hca_offsets(pos0, tokens, ratio, n_entries)?, Vec::new()),
                Keys::HcaExplicit => hca_candidates(pos0, tokens, ratio, n_entries)?,
                Keys::Csa | Keys::CsaOutOfRange => {
                    // The kernels read as many entries as were uploaded (at least one row).
                    let uploaded = n_entries.max(1) as i32;
                    let mut off = vec![0i32];
                    let mut idx = Vec::new();
                    for l in &lists {
                        let skip = matches!(keys_kind, Keys::CsaOutOfRange);
                        if skip {
                            idx.push(-1);
                        }
                        idx.extend(l.iter().map(|e| *e as i32));
                        if skip {
                            idx.extend([uploaded, uploaded + 7]);
                        }
                        off.push(idx.len() as i32);
                    }
                    (off, idx)
                }
            };
            // (Sliding has no lists and HCA identity no indices: upload one placeholder value.)
            let nonempty = |v: &Vec<i32>| if v.is_empty() { vec![0] } else { v.clone() };
            let (doff, didx) = (gpu.upload(&nonempty(&off))?, gpu.upload(&nonempty(&idx))?);
            let run_query_to = |query: AttentionQuery<'_>, kernel: AttentionKernel, masked: bool, dout: &mut AttentionOut<'_>| -> Result<(), CudaError> {
                match keys_kind {
                    Keys::Sliding => gpu.sparse_attention_into(query, &dkv, None, &dsinks, inv, rope, dout, &shape, kernel),
                    Keys::HcaIdentity => {
                        let ck = CompressedKeys { entries: &dentries, offsets: &doff, indices: None, mask: None };
                        gpu.sparse_attention_into(query, &dkv, Some(&ck), &dsinks, inv, rope, dout, &shape, kernel)
                    }
                    Keys::HcaExplicit | Keys::Csa | Keys::CsaOutOfRange if !masked => {
                        let ck = CompressedKeys { entries: &dentries, offsets: &doff, indices: Some(&didx), mask: None };
                        gpu.sparse_attention_into(query, &dkv, Some(&ck), &dsinks, inv, rope, dout, &shape, kernel)
                    }
                    Keys::HcaExplicit | Keys::Csa | Keys::CsaOutOfRange => {
                        let mask = gpu.topk_mask(&doff, &didx, tokens, n_entries.max(1))?;
                        let vis = gpu.upload(&hca_offsets(pos0, tokens, ratio, n_entries)?)?;
                        let ck = CompressedKeys { entries: &dentries, offsets: &vis, indices: None, mask: Some(&mask) };
                        gpu.sparse_attention_into(query, &dkv, Some(&ck), &dsinks, inv, rope, dout, &shape, kernel)
                    }
                }
            };
            let run_to = |kernel: AttentionKernel, masked: bool, dout: &mut AttentionOut<'_>| run_query_to(AttentionQuery::Normed(&dq), kernel, masked, dout);
            let run = |kernel: AttentionKernel, masked: bool| -> Result<Vec<f32>, CudaError> {
                let mut dout = gpu.zeros::<f32>(tokens * H * C)?;
                run_to(kernel, masked, &mut AttentionOut::F32(&mut dout))?;
                gpu.download(&dout)
            };
            let detail = json!({"T": tokens, "H": H, "c": C, "pos0": pos0, "ratio": ratio, "entries": n_entries, "listed": n_listed});
            let mut stream = Vec::new();
            let mut kernels = vec![AttentionKernel::Exact, AttentionKernel::Stream, AttentionKernel::StreamFastExp];
            if gpu.attention_bf16_ok() {
                kernels.extend([AttentionKernel::StreamBf16, AttentionKernel::StreamBf16FastExp]);
            }
            if gpu.attention_cand_split_ok() {
                kernels.push(AttentionKernel::StreamBf16Cand);
            }
            let mut bf16 = Vec::new();
            for kernel in kernels {
                let got = run(kernel, false)?;
                all &= match kernel {
                    AttentionKernel::Exact => record(out, &format!("sparse_attention {keys_kind:?}"), detail.clone(), &got, &cpu),
                    AttentionKernel::Stream => record_tol(out, &format!("sparse_attention_stream {keys_kind:?}"), detail.clone(), &got, &cpu, SPLIT_NMSE_TOL),
                    AttentionKernel::StreamFastExp => {
                        // Reported against the CPU and against the precise streaming kernel.
                        let vs_cpu = record_tol(out, &format!("sparse_attention_fast_exp {keys_kind:?}"), detail.clone(), &got, &cpu, FAST_EXP_NMSE_TOL);
                        vs_cpu & record_tol(out, &format!("sparse_attention_fast_exp vs stream {keys_kind:?}"), detail.clone(), &got, &stream, FAST_EXP_NMSE_TOL)
                    }
                    AttentionKernel::StreamBf16FastExp => {
                        // Against the CPU and the precise bf16 kernel, at the bf16 bound: a few-ulp
                        // change of an exponential can move P's bf16 rounding by one step.
                        let vs_cpu = record_tol(out, &format!("sparse_attention_bf16_fast_exp {keys_kind:?}"), detail.clone(), &got, &cpu, BF16_ATT_NMSE_TOL);
                        vs_cpu & record_tol(out, &format!("sparse_attention_bf16_fast_exp vs bf16 {keys_kind:?}"), detail.clone(), &got, &bf16, BF16_ATT_NMSE_TOL)
                    }
                    AttentionKernel::StreamBf16Cand => {
                        // MLA_BF16's numerics class with another tiling (64-candidate blocks, P of
                        // one block rescaled before its bf16 rounding, exp2): against the CPU, the
                        // split kernel and sparse_attention_wg at the bf16 bound.
                        let vs_cpu = record_tol(out, &format!("sparse_attention_bf16_cand {keys_kind:?}"), detail.clone(), &got, &cpu, BF16_ATT_NMSE_TOL);
                        let vs_stream = record_tol(out, &format!("sparse_attention_bf16_cand vs stream {keys_kind:?}"), detail.clone(), &got, &stream, BF16_ATT_NMSE_TOL);
                        vs_cpu & vs_stream & record_tol(out, &format!("sparse_attention_bf16_cand vs bf16 {keys_kind:?}"), detail.clone(), &got, &bf16, BF16_ATT_NMSE_TOL)
                    }
                    AttentionKernel::StreamBf16 => {
                        // OFF-K's numerics: against the CPU and against the split kernel, then
                        // against the CPU's replay of those numerics (attend_bf16).
                        let vs_cpu = record_tol(out, &format!("sparse_attention_bf16 {keys_kind:?}"), detail.clone(), &got, &cpu, BF16_ATT_NMSE_TOL);
                        let vs_stream = record_tol(out, &format!("sparse_attention_bf16 vs stream {keys_kind:?}"), detail.clone(), &got, &stream, BF16_ATT_NMSE_TOL);
                        let replay: Vec<f32> = (0..tokens)
                            .into_par_iter()
                            .flat_map_iter(|t| attention::attend_bf16(&q[t * H * C..(t + 1) * H * C], &keys_of(t), &sinks, C, rope, pos0 + t, attention::BF16_ATTENTION_TILE))
                            .collect();
                        vs_cpu & vs_stream & record_tol(out, &format!("sparse_attention_bf16 vs replay {keys_kind:?}"), detail.clone(), &got, &replay, BF16_EMU_NMSE_TOL)
                    }
                };
                if kernel == AttentionKernel::Stream {
                    stream = got.clone();
                }
                if kernel == AttentionKernel::StreamBf16 {
                    bf16 = got.clone();
                }
                if kernel != AttentionKernel::Exact {
                    // MLA_SPLIT_OUT: the kernel's split bf16 planes against gemm_x_bf16's split of
                    // its own f32 output, bit for bit. The lo plane starts 64 values past the hi
                    // plane's end and 64 more follow it: every value of those gaps must keep its
                    // sentinel (no write outside the planes, the lo plane placed by `plane`). The
                    // bf16 kernels: their bf16 output against the hi plane, the rest untouched.
                    let (n, gap) = (tokens * H * C, 64usize);
                    let mut dplanes = gpu.upload(&vec![0x7fc1u16; 2 * n + 2 * gap])?;
                    run_to(kernel, false, &mut planes_out(kernel, &mut dplanes, n + gap))?;
                    let planes = gpu.download(&dplanes)?;
                    let (xb, tp, kp) = gpu.bf16_planes(&gpu.upload(&got)?, tokens, H * C, true)?;
                    let want = gpu.download(&xb)?;
                    let hi = (0..n).filter(|&i| planes[i] != want[i]).count();
                    let (lo, outside) = if kernel.is_bf16() {
                        (0, planes[n..].iter().filter(|&&v| v != 0x7fc1).count())
                    } else {
                        let lo = (0..n).filter(|&i| planes[n + gap + i] != want[tp * kp + i]).count();
                        (lo, planes[n..n + gap].iter().chain(&planes[2 * n + gap..]).filter(|&&v| v != 0x7fc1).count())
                    };
                    let differing = hi + lo + outside;
                    let what = if kernel.is_bf16() {
                        "bits vs gemm_x_bf16's hi plane of the f32 output (the output rounded to bf16), sentinels in every value after it"
                    } else {
                        "bits vs gemm_x_bf16's split of the f32 output (hi and lo planes), sentinels in the 64-value gaps around the lo plane"
                    };
                    all &= record_exact(out, &format!("sparse_attention split planes {kernel:?} {keys_kind:?}"), detail.clone(), differing, 2 * n + 2 * gap, json!(what));
                    if kernel == AttentionKernel::StreamBf16Cand {
                        // WO_A_FP8: the kernel's e4m3 output and scales against act_quant_fp8 on its
                        // own f32 output (`got`), bit for bit; sentinels after both buffers' ends.
                        let kb = n / 128;
                        let mut dq8 = gpu.upload(&vec![0xa5u8; n + gap])?;
                        let mut dsc = gpu.upload(&vec![f32::NAN; kb + gap])?;
                        run_to(kernel, false, &mut AttentionOut::Fp8 { q: &mut dq8, scales: &mut dsc })?;
                        let (q8, sc) = (gpu.download(&dq8)?, gpu.download(&dsc)?);
                        let qa = gpu.act_quant(&gpu.upload(&got)?, tokens, H * C)?;
                        let (wq8, wsc) = (gpu.download(&qa.q)?, gpu.download(&qa.sa)?);
                        let differing = (0..n).filter(|&i| q8[i] != wq8[i]).count()
                            + (0..kb).filter(|&i| sc[i].to_bits() != wsc[i].to_bits()).count()
                            + q8[n..].iter().filter(|&&v| v != 0xa5).count()
                            + sc[kb..].iter().filter(|v| !v.is_nan()).count();
                        all &= record_exact(out, &format!("sparse_attention_wc fp8 out bits {keys_kind:?}"), detail.clone(), differing, n + kb + 2 * gap, json!("e4m3 bytes and 1 × 128 scales vs act_quant_fp8 on the kernel's f32 output, sentinels after both"));
                    }

                    // MLA_FUSED_Q_NORM: the kernel normalising and rotating raw queries itself must
                    // give the bits of rms_norm_rope's output fed to it, f32 and split-plane output.
                    let f32_from = |query: AttentionQuery<'_>| -> Result<Vec<f32>, CudaError> {
                        let mut dout = gpu.upload(&vec![f32::NAN; n])?;
                        run_query_to(query, kernel, false, &mut AttentionOut::F32(&mut dout))?;
                        gpu.download(&dout)
                    };
                    let normed = f32_from(AttentionQuery::Normed(&dq_normed))?;
                    let fused = f32_from(AttentionQuery::Raw { q: &dq_raw, eps: Q_EPS })?;
                    let planes_from = |query: AttentionQuery<'_>| -> Result<Vec<u16>, CudaError> {
                        let mut dplanes = gpu.upload(&vec![0x7fc1u16; 2 * n])?;
                        run_query_to(query, kernel, false, &mut planes_out(kernel, &mut dplanes, n))?;
                        gpu.download(&dplanes)
                    };
                    let planes_normed = planes_from(AttentionQuery::Normed(&dq_normed))?;
                    let planes_fused = planes_from(AttentionQuery::Raw { q: &dq_raw, eps: Q_EPS })?;
                    let differing = differing_bits(&fused, &normed) + planes_fused.iter().zip(&planes_normed).filter(|(a, b)| a != b).count();
                    let finite = normed.iter().all(|v| v.is_finite());
                    all &= record_exact(out, &format!("sparse_attention fused q norm {kernel:?} {keys_kind:?}"), detail.clone(), differing + usize::from(!finite), 3 * n, json!(if kernel.is_bf16() { "bits vs rms_norm_rope's queries (f32 output, then the bf16 output)" } else { "bits vs rms_norm_rope's queries (f32 output, then both split planes)" }));
                    // WQ_B_BF16_OUT: bf16 raw queries give the bits of their exact widening fed as
                    // f32 raw queries (both output forms).
                    let wide = f32_from(AttentionQuery::Raw { q: &dq_raw_widened, eps: Q_EPS })?;
                    let from_bf16 = f32_from(AttentionQuery::RawBf16 { q: &dq_raw_bf16, eps: Q_EPS })?;
                    let planes_wide = planes_from(AttentionQuery::Raw { q: &dq_raw_widened, eps: Q_EPS })?;
                    let planes_bf16 = planes_from(AttentionQuery::RawBf16 { q: &dq_raw_bf16, eps: Q_EPS })?;
                    let differing = differing_bits(&from_bf16, &wide) + planes_bf16.iter().zip(&planes_wide).filter(|(a, b)| a != b).count();
                    let finite = wide.iter().all(|v| v.is_finite());
                    // The rounding must show (else the bf16 path could be reading the f32 queries).
                    let rounded = from_bf16 != fused;
                    all &= record_exact(out, &format!("sparse_attention fused q norm bf16 {kernel:?} {keys_kind:?}"), detail.clone(), differing + usize::from(!finite), 3 * n, json!("bits vs the same queries widened to f32 and given as f32 raw queries (f32 output, then the plane / bf16 output)"));
                    all &= flag_record(out, &format!("sparse_attention fused q norm bf16 {kernel:?} {keys_kind:?} differs from unrounded"), json!({"differs_from_f32_queries": rounded}), rounded);
                }
                if matches!(keys_kind, Keys::Csa | Keys::HcaExplicit) && !matches!(kernel, AttentionKernel::StreamFastExp | AttentionKernel::StreamBf16FastExp) {
                    // The mask path must give the lists' bits.
                    let masked = run(kernel, true)?;
                    let differing = differing_bits(&masked, &got);
                    all &= record_exact(out, &format!("sparse_attention_mask {kernel:?} {keys_kind:?}"), detail.clone(), differing, got.len(), json!("bits vs the index lists"));
                }
            }
        }
    }
    Ok(all)
}

fn check_compressor(gpu: &Gpu, seed: u64, out: &mut Vec<Value>, rope: &Rope, inv: &CudaSlice<f32>) -> Result<bool, CudaError> {
    const WIDTH: usize = 512;
    const EPS: f64 = 1e-6;
    let mut all = true;
    // (name, ratio, overlap, cases (row_base, tokens, e0, n_entries)): from entry 0, and a later
    // chunk whose rows start at a window boundary and end with an incomplete window.
    type Case = (usize, usize, usize, usize);
    let families: [(&str, usize, bool, [Case; 2]); 2] = [
        ("csa", 4, true, [(0, 4 * 9 + 2, 0, 9), (4 * 5000, 4 * 6 + 3, 5001, 5)]),
        ("hca", 128, false, [(0, 2 * 128 + 50, 0, 2), (128 * 40, 2 * 128 + 7, 40, 2)]),
    ];
    for (name, ratio, overlap, cases) in families {
        let ow = if overlap { 2 * WIDTH } else { WIDTH };
        let ape = random(seed, &format!("comp.{name}.ape"), ratio * ow, 1.0);
        let norm: Vec<f32> = random(seed, &format!("comp.{name}.norm"), WIDTH, 0.25).iter().map(|v| 1.0 + v).collect();
        let (dape, dnorm) = (gpu.upload(&ape)?, gpu.upload(&norm)?);
        for (row_base, tokens, e0, n_entries) in cases {
            let kv = random(seed, &format!("comp.{name}.kv.{row_base}"), tokens * ow, 1.0);
            let raw = random(seed, &format!("comp.{name}.gate.{row_base}"), tokens * ow, 2.0);
            // Position bias: the f32 add of compressor::project.
            let mut logit = raw.clone();
            for (t, row) in logit.chunks_mut(ow).enumerate() {
                let slot = (row_base + t) % ratio;
                for (g, b) in row.iter_mut().zip(&ape[slot * ow..(slot + 1) * ow]) {
                    *g += *b;
                }
            }
            let dkv = gpu.upload(&kv)?;
            let mut dlogit = gpu.upload(&raw)?;
            gpu.add_position_bias(&mut dlogit, &dape, tokens, ratio, row_base)?;
            all &= record(out, &format!("add_position_bias {name}"), json!([tokens, ow, ratio, row_base]), &gpu.download(&dlogit)?, &logit);

            // Entries: softmax pooling, RMSNorm, RoPE at e·ratio.
            let (kvr, lgr): (&[f32], &[f32]) = (&kv, &logit);
            let rows = move |p: usize| {
                let r = p - row_base;
                (&kvr[r * ow..(r + 1) * ow], &lgr[r * ow..(r + 1) * ow])
            };
            let cpu: Vec<f32> = (e0..e0 + n_entries)
                .flat_map(|e| {
                    let slots = compressor::window_slots(e, ratio, WIDTH, overlap, rows);
                    compressor::pool(&slots, &norm, EPS, rope, e * ratio)
                })
                .collect();
            let shape = PoolShape { ratio, width: WIDTH, overlap, row_base, e0, n_entries };
            let mut dout = gpu.zeros::<f32>(n_entries * WIDTH)?;
            gpu.compress_entries(&dkv, &dlogit, &dnorm, EPS as f32, inv, rope, &shape, &mut dout)?;
            all &= record(
                out,
                &format!("compress_entries {name}"),
                json!({"ratio": ratio, "width": WIDTH, "overlap": overlap, "row_base": row_base, "tokens": tokens, "e0": e0, "entries": n_entries}),
                &gpu.download(&dout)?,
                &cpu,
            );
        }
    }
    Ok(all)
}

/// `COMPRESSOR_FUSED_DECODE`: [`Gpu::linear_multi_into`] on a CSA layer's five compressor weights
/// (wkv and wgate [1,024, 4,096] with a ratio-4 position bias, the indexer compressor's [256, 4,096]
/// pair likewise, weights_proj [64, 4,096] without) against one [`Gpu::linear`] per weight, then
/// [`Gpu::add_position_bias`], copied into place: bitwise equal at 1, 3 and 9 tokens (the one-token,
/// prefetching and eight-token forms), f32 and bf16 weights, LINEAR_T1_PREFETCH on and off, at a
/// position past the start of the outputs (the values before it untouched); plus the times of both
/// at one token.
fn check_linear_multi(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    const K: usize = 4096;
    const RATIO: usize = 4;
    let rows = [1024usize, 1024, 256, 256, 64];
    let biased = [false, true, false, true, false];
    let mut all = true;
    for fmt in ["bf16", "f32"] {
        let mut ws = Vec::new();
        let mut apes = Vec::new();
        for (i, (&r, &b)) in rows.iter().zip(&biased).enumerate() {
            let vals = random(seed, &format!("multi.{fmt}.w{i}"), r * K, 0.05);
            ws.push(super::check::weight(gpu, fmt, &vals, r, K)?.0);
            apes.push(if b { Some(gpu.upload(&random(seed, &format!("multi.ape{i}"), RATIO * r, 1.0))?) } else { None });
        }
        for prefetch in ["on", "off"] {
            for t in [1usize, 3, 9] {
                let pos0 = 4 * 7 + 2;
                let x = gpu.upload(&random(seed, &format!("multi.x.{t}"), t * K, 1.0))?;
                // Reference: one linear per weight, the bias pass, a copy into place.
                let mut want = Vec::new();
                let r = crate::switches::scoped(&[("LINEAR_T1_PREFETCH", prefetch)], || -> Result<(), CudaError> {
                    for (w, ape) in ws.iter().zip(&apes) {
                        let mut y = gpu.zeros::<f32>(t * w.rows)?;
                        gpu.linear(&x, w, &mut y, t)?;
                        if let Some(ape) = ape {
                            gpu.add_position_bias(&mut y, ape, t, RATIO, pos0)?;
                        }
                        want.push(gpu.download(&y)?);
                    }
                    Ok(())
                });
                r.map_err(|e| CudaError::Unsupported { what: "check", detail: e.to_string() })??;
                // Fused: each output at pos0 of a buffer whose earlier values are a sentinel.
                let mut bufs: Vec<CudaSlice<f32>> = Vec::new();
                for w in &ws {
                    bufs.push(gpu.upload(&vec![-7.0f32; (pos0 + t) * w.rows])?);
                }
                let r = crate::switches::scoped(&[("LINEAR_T1_PREFETCH", prefetch)], || -> Result<(), CudaError> {
                    let mut outs: Vec<MultiOut<'_>> = ws
                        .iter()
                        .zip(bufs.iter_mut())
                        .zip(&apes)
                        .map(|((w, y), ape)| MultiOut { w, y, at: pos0 * w.rows, bias: ape.as_ref().map(|a| (a, RATIO)) })
                        .collect();
                    gpu.linear_multi_into(&x, t, &mut outs, pos0)
                });
                r.map_err(|e| CudaError::Unsupported { what: "check", detail: e.to_string() })??;
                let (mut differing, mut compared, mut touched) = (0usize, 0usize, 0usize);
                for ((w, buf), want) in ws.iter().zip(&bufs).zip(&want) {
                    let got = gpu.download(buf)?;
                    let (before, rows_out) = got.split_at(pos0 * w.rows);
                    differing += differing_bits(rows_out, want);
                    compared += want.len();
                    touched += before.iter().filter(|v| **v != -7.0).count();
                }
                all &= record_exact(
                    out,
                    &format!("linear_multi_into {fmt} T={t} bits"),
                    json!({"rows": rows, "cols": K, "ratio": RATIO, "pos0": pos0, "linear_t1_prefetch": prefetch}),
                    differing + touched,
                    compared,
                    json!({"vs": "one linear per weight, add_position_bias on the gates, copied into place", "values_before_pos0_changed": touched}),
                );
            }
        }
        // One token, the default switches: five linears + two bias passes (copies not counted)
        // against the one launch.
        let t = 1usize;
        let x = gpu.upload(&random(seed, "multi.x.time", K, 1.0))?;
        let mut ys: Vec<CudaSlice<f32>> = ws.iter().map(|w| gpu.zeros_owned::<f32>(w.rows)).collect::<Result<_, _>>()?;
        let unfused = super::check::median_ms(gpu, 50, || {
            for ((w, ape), y) in ws.iter().zip(&apes).zip(ys.iter_mut()) {
                gpu.linear(&x, w, y, t)?;
                if let Some(ape) = ape {
                    gpu.add_position_bias(y, ape, t, RATIO, 5)?;
                }
            }
            Ok(())
        })?;
        let fused = super::check::median_ms(gpu, 50, || {
            let mut outs: Vec<MultiOut<'_>> = ws.iter().zip(ys.iter_mut()).zip(&apes).map(|((w, y), ape)| MultiOut { w, y, at: 0, bias: ape.as_ref().map(|a| (a, RATIO)) }).collect();
            gpu.linear_multi_into(&x, t, &mut outs, 5)
        })?;
        let bytes: usize = ws.iter().map(|w| w.rows * K * if fmt == "bf16" { 2 } else { 4 }).sum();
        println!("time linear_multi_into {fmt} T=1 (CSA compressors) one launch {:.1} us ({:.0} GB/s) | five linears + two bias passes {:.1} us", fused * 1e3, bytes as f64 / (fused * 1e-3) / 1e9, unfused * 1e3);
        out.push(json!({"op": format!("time linear_multi_into {fmt} T=1"), "fused_ms": fused, "unfused_ms": unfused, "weight_bytes": bytes}));
    }
    Ok(all)
}

/// The reference selection rule (higher score first by total order, ties to the lower index; all
/// visible entries when at most `k`), ascending.
fn select_rule(scores: &[f32], visible: usize, k: usize) -> Vec<usize> {
    if visible <= k {
        return (0..visible).collect();
    }
    let mut order: Vec<usize> = (0..visible).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
    let mut chosen = order[..k].to_vec();
    chosen.sort_unstable();
    chosen
}

/// Entries in exactly one of two index lists.
fn differing(a: &[usize], b: &[usize]) -> Vec<usize> {
    let (sa, sb): (BTreeSet<usize>, BTreeSet<usize>) = (a.iter().copied().collect(), b.iter().copied().collect());
    sa.symmetric_difference(&sb).copied().collect()
}

/// Runs a selection kernel, `launch(offsets, idx)`, for `shape` and `k` into fresh device lists
/// ([`topk_offsets`]) and returns them per query.
fn gpu_lists(
    gpu: &Gpu,
    shape: &IndexerShape,
    k: usize,
    launch: impl FnOnce(&CudaSlice<i32>, &mut CudaSlice<i32>) -> Result<(), CudaError>,
) -> Result<Vec<Vec<usize>>, CudaError> {
    let off = topk_offsets(shape.pos0, shape.tokens, shape.ratio, shape.n_entries, k)?;
    let doff = gpu.upload(&off)?;
    let mut didx = gpu.zeros::<i32>((off[shape.tokens] as usize).max(1))?;
    launch(&doff, &mut didx)?;
    let idx = gpu.download(&didx)?;
    Ok((0..shape.tokens).map(|t| idx[off[t] as usize..off[t + 1] as usize].iter().map(|v| *v as usize).collect()).collect())
}

/// Runs the GPU top-k on device scores and returns the per-query lists.
fn gpu_topk(gpu: &Gpu, dscores: &CudaSlice<f32>, shape: &IndexerShape, k: usize) -> Result<Vec<Vec<usize>>, CudaError> {
    gpu_lists(gpu, shape, k, |off, idx| gpu.indexer_topk(dscores, off, idx, shape, k))
}

/// The fused streaming selection ([`Gpu::indexer_topk_stream`], or with `wgmma`
/// [`Gpu::indexer_topk_wgmma`]) as per-query lists.
fn gpu_topk_stream(gpu: &Gpu, dq: &CudaSlice<f32>, dkeys: &CudaSlice<f32>, dw: &CudaSlice<f32>, shape: &IndexerShape, k: usize, wgmma: bool) -> Result<Vec<Vec<usize>>, CudaError> {
    gpu_lists(gpu, shape, k, |off, idx| if wgmma { gpu.indexer_topk_wgmma(dq, dkeys, dw, off, idx, shape, k) } else { gpu.indexer_topk_stream(dq, dkeys, dw, off, idx, shape, k) })
}

/// `INDEXER_FP8` on wgmma, exact: [`Gpu::indexer_topk_wgmma_fp8`]'s lists must equal
/// [`Gpu::indexer_topk`] run on [`Gpu::indexer_scores_wgmma_fp8`]'s scores of the same quantized
/// operands (the same template, the same arithmetic per score: the selection alone is compared, bit
/// for bit, on every case the exact kernels are checked on — cuts, ties, short rows). `ks`: the k
/// values; records `indexer_topk_wgmma_fp8 exact (<case>)`.
#[allow(clippy::too_many_arguments)]
fn check_fp8_wgmma_lists(gpu: &Gpu, out: &mut Vec<Value>, case: &str, dq: &CudaSlice<f32>, dkeys: &CudaSlice<f32>, dw: &CudaSlice<f32>, shape: &IndexerShape, ks: &[usize]) -> Result<bool, CudaError> {
    let q8 = gpu.act_quant(dq, shape.tokens * shape.heads, shape.head_dim)?;
    let k8t = gpu.act_quant_layout(dkeys, shape.n_entries, shape.head_dim, true)?;
    let mut dsc = gpu.zeros::<f32>(shape.tokens * shape.n_entries)?;
    gpu.indexer_scores_wgmma_fp8(&q8, &k8t, dw, &mut dsc, shape)?;
    let mut all = true;
    for &k in ks {
        let want = gpu_topk(gpu, &dsc, shape, k)?;
        let got = gpu_lists(gpu, shape, k, |off, idx| gpu.indexer_topk_wgmma_fp8(&q8, &k8t, dw, off, idx, shape, k))?;
        let (bad, compared) = list_mismatches(&got, &want);
        let sh = json!({"T": shape.tokens, "N": shape.n_entries, "k": k, "pos0": shape.pos0, "ratio": shape.ratio});
        all &= record_exact(out, &format!("indexer_topk_wgmma_fp8 exact ({case})"), sh, bad, compared, json!("lists vs indexer_scores_wgmma_fp8 + indexer_topk"));
    }
    Ok(all)
}

/// Positions where two sets of per-query lists differ (a length difference counts each missing
/// entry), and the entries of `want`.
fn list_mismatches(got: &[Vec<usize>], want: &[Vec<usize>]) -> (usize, usize) {
    let bad = got.iter().zip(want).map(|(g, w)| differing_values(g, w)).sum();
    (bad, want.iter().map(Vec::len).sum())
}

/// `INDEXER_STREAM_TOPK` and (sm_90a) `INDEXER_WGMMA`: each fused kernel's lists must equal
/// `indexer_scores_tc` + `indexer_topk` exactly (same entries, same order), and the wgmma scores
/// `indexer_scores_tc`'s bit for bit — random keys, keys whose scores rise or fall with the index
/// (every key enters the buffer: a cut every ~1,400 keys), identical keys (every score ties: the
/// lowest indices win), with k = 16, 512 and the largest k; N = 20,000 so the buffer is cut many
/// times, and T = 5 (a block's second token missing) at positions where the visible counts differ.
fn check_indexer_stream(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    // INDEXER_WGMMA's kernels exist on sm_90a only.
    let wgmma = gpu.arch == "sm_90a";
    const HEADS: usize = 64;
    const HD: usize = 128;
    const RATIO: usize = 4;
    const N: usize = 20_000;
    let mut all = true;
    let (tokens, pos0) = (5usize, RATIO * N - 6);
    let wscale = (HEADS as f64).powf(-0.5);
    let q = random(seed, "idxs.q", tokens * HEADS * HD, 1.7);
    let weights: Vec<f32> = random(seed, "idxs.w", tokens * HEADS, 1.0).iter().map(|v| (*v as f64 * wscale) as f32).collect();
    let (dq, dw) = (gpu.upload(&q)?, gpu.upload(&weights)?);
    let u = random(seed, "idxs.u", HD, 1.0);
    let shape = IndexerShape { tokens, heads: HEADS, head_dim: HD, n_entries: N, ratio: RATIO, pos0 };
    for kind in ["random", "monotone", "identical"] {
        let keys: Vec<f32> = match kind {
            "random" => random(seed, "idxs.keys", N * HD, 1.7),
            // Scores s_j·C_t: rising in j for C_t > 0, falling for C_t < 0.
            "monotone" => (0..N).flat_map(|j| u.iter().map(move |x| x * (1.0 + j as f32 / N as f32))).collect(),
            _ => (0..N).flat_map(|_| u.iter().copied()).collect(),
        };
        let dkeys = gpu.upload(&keys)?;
        let mut dscores = gpu.zeros::<f32>(tokens * N)?;
        gpu.indexer_scores_with(&dq, &dkeys, &dw, &mut dscores, &shape, true)?;
        if wgmma {
            all &= check_wgmma_score_bits(gpu, out, &format!("{kind} keys"), (&dq, &dkeys, &dw, &dscores), &shape)?;
        }
        for k in [16usize, 512, super::ops_attention::INDEXER_STREAM_MAX_K] {
            let want = gpu_topk(gpu, &dscores, &shape, k)?;
            let got = gpu_topk_stream(gpu, &dq, &dkeys, &dw, &shape, k, false)?;
            let (bad, compared) = list_mismatches(&got, &want);
            all &= record_exact(out, &format!("indexer_topk_stream ({kind} keys)"), json!({"T": tokens, "N": N, "k": k, "pos0": pos0}), bad, compared, json!("lists vs indexer_scores_tc + indexer_topk"));
            if wgmma {
                let got = gpu_topk_stream(gpu, &dq, &dkeys, &dw, &shape, k, true)?;
                let (bad, compared) = list_mismatches(&got, &want);
                all &= record_exact(out, &format!("indexer_topk_wgmma ({kind} keys)"), json!({"T": tokens, "N": N, "k": k, "pos0": pos0}), bad, compared, json!("lists vs indexer_scores_tc + indexer_topk"));
            }
        }
        if wgmma {
            all &= check_fp8_wgmma_lists(gpu, out, &format!("{kind} keys"), &dq, &dkeys, &dw, &shape, &[16, 512, super::ops_attention::INDEXER_STREAM_MAX_K])?;
        }
        if kind == "random" {
            all &= check_indexer_fp8(gpu, out, "random keys", &q, &weights, &keys, (&dq, &dkeys, &dw, &dscores), &shape, &[16, 512])?;
        }
    }
    // Short rows: every visible entry (identity lists) and a tail past the keys that exist.
    // (66, 2): the pair's first token sees 16 entries (identity list at k = 16), its second 17
    // (selected) — one block with one selecting and one non-selecting token.
    for (pos0, tokens, n) in [(60usize, 3usize, 600usize), (66, 2, 600), (2385, 6, 600), (1001, 5, 600)] {
        let keys = random(seed, &format!("idxs.short.{pos0}"), n * HD, 1.7);
        let q = random(seed, &format!("idxs.short.q.{pos0}"), tokens * HEADS * HD, 1.7);
        let w: Vec<f32> = random(seed, &format!("idxs.short.w.{pos0}"), tokens * HEADS, 1.0).iter().map(|v| (*v as f64 * wscale) as f32).collect();
        let (dq, dw, dkeys) = (gpu.upload(&q)?, gpu.upload(&w)?, gpu.upload(&keys)?);
        let shape = IndexerShape { tokens, heads: HEADS, head_dim: HD, n_entries: n, ratio: RATIO, pos0 };
        let mut dscores = gpu.zeros::<f32>(tokens * n)?;
        gpu.indexer_scores_with(&dq, &dkeys, &dw, &mut dscores, &shape, true)?;
        if wgmma {
            all &= check_wgmma_score_bits(gpu, out, "short rows", (&dq, &dkeys, &dw, &dscores), &shape)?;
            all &= check_fp8_wgmma_lists(gpu, out, "short rows", &dq, &dkeys, &dw, &shape, &[16, 512])?;
        }
        for k in [16usize, 512] {
            let want = gpu_topk(gpu, &dscores, &shape, k)?;
            for wg in [false, true] {
                if wg && !wgmma {
                    continue;
                }
                let got = gpu_topk_stream(gpu, &dq, &dkeys, &dw, &shape, k, wg)?;
                let (bad, compared) = list_mismatches(&got, &want);
                let op = if wg { "indexer_topk_wgmma (short rows)" } else { "indexer_topk_stream (short rows)" };
                all &= record_exact(out, op, json!({"T": tokens, "N": n, "k": k, "pos0": pos0}), bad, compared, json!("lists vs indexer_scores_tc + indexer_topk"));
            }
        }
    }
    // INDEXER_WGMMA over many blocks and at the edges of its tile and block arithmetic:
    // - 1,030 tokens (258 blocks, the last with 2 tokens), visible counts 1,792 … 2,049 of
    //   N = 2,100 (every block streams 29–33 tiles through the 4-stage ring, 8 stages for the FP8
    //   kernel), k = 512 and 1,800
    //   (the first ~32 tokens get identity lists, the rest select);
    // - N = 2,048 (a multiple of 64: the last tile ends the split keys exactly) with the last of 7
    //   tokens seeing every key (the forward's usual case) and a last block of 3 selecting tokens;
    // - ratio 1: the four tokens of a block differ by one visible key each, N = 1,000 reached by
    //   the last of 9 tokens.
    if wgmma {
        for (tokens, n, pos0, ratio, ks, label) in [
            (1030usize, 2100usize, 7168usize, RATIO, [512usize, 1800], "many blocks"),
            (7, 2048, RATIO * 2048 - 7, RATIO, [16, 512], "N = 2048, last token sees all"),
            (9, 1000, 991, 1, [16, 512], "ratio 1"),
        ] {
            let keys = random(seed, &format!("idxs.edge.keys.{label}"), n * HD, 1.7);
            let q = random(seed, &format!("idxs.edge.q.{label}"), tokens * HEADS * HD, 1.7);
            let w: Vec<f32> = random(seed, &format!("idxs.edge.w.{label}"), tokens * HEADS, 1.0).iter().map(|v| (*v as f64 * wscale) as f32).collect();
            let (dq, dw, dkeys) = (gpu.upload(&q)?, gpu.upload(&w)?, gpu.upload(&keys)?);
            let shape = IndexerShape { tokens, heads: HEADS, head_dim: HD, n_entries: n, ratio, pos0 };
            let mut dscores = gpu.zeros::<f32>(tokens * n)?;
            gpu.indexer_scores_with(&dq, &dkeys, &dw, &mut dscores, &shape, true)?;
            all &= check_wgmma_score_bits(gpu, out, label, (&dq, &dkeys, &dw, &dscores), &shape)?;
            all &= check_indexer_fp8(gpu, out, label, &q, &w, &keys, (&dq, &dkeys, &dw, &dscores), &shape, &ks)?;
            all &= check_fp8_wgmma_lists(gpu, out, label, &dq, &dkeys, &dw, &shape, &ks)?;
            for k in ks {
                let want = gpu_topk(gpu, &dscores, &shape, k)?;
                let got = gpu_topk_stream(gpu, &dq, &dkeys, &dw, &shape, k, true)?;
                let (bad, compared) = list_mismatches(&got, &want);
                all &= record_exact(out, &format!("indexer_topk_wgmma ({label})"), json!({"T": tokens, "N": n, "k": k, "pos0": pos0, "ratio": ratio}), bad, compared, json!("lists vs indexer_scores_tc + indexer_topk"));
            }
        }
    }
    Ok(all)
}

/// `INDEXER_WGMMA`'s scores ([`Gpu::indexer_scores_wgmma`]) bit for bit against
/// `indexer_scores_tc`'s (`dev.3`, from the same queries, keys and weights): the same three
/// products per 16 dims in the same order on both kinds of tensor-core instruction.
fn check_wgmma_score_bits(
    gpu: &Gpu,
    out: &mut Vec<Value>,
    case: &str,
    dev: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    shape: &IndexerShape,
) -> Result<bool, CudaError> {
    let (dq, dkeys, dw, dtc) = dev;
    let mut dwg = gpu.zeros::<f32>(shape.tokens * shape.n_entries)?;
    gpu.indexer_scores_wgmma(dq, dkeys, dw, &mut dwg, shape)?;
    let (a, b) = (gpu.download(&dwg)?, gpu.download(dtc)?);
    let bad = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    let shape_json = json!({"T": shape.tokens, "N": shape.n_entries, "pos0": shape.pos0});
    Ok(record_exact(out, &format!("indexer_scores_wgmma bits ({case})"), shape_json, bad, a.len(), json!("scores vs indexer_scores_tc, bit for bit (−inf past visible included)")))
}

/// `INDEXER_FP8`: the FP8 streaming selection ([`Gpu::indexer_topk_stream_fp8`] and on sm_90a
/// [`Gpu::indexer_topk_wgmma_fp8`]) against the selection rule on the CPU's f64 scores of the same
/// quantize-dequantized queries and keys (`act_quant_fp8_roundtrip`, bit-identical to the GPU's
/// quantisation), allowing only boundary near ties (|s − s_k| ≤ 1e-5·max|s|, for the wgmma kernel
/// at least twice its largest score error on the same inputs: `mma.sync` accumulates the e4m3
/// products in f32 (none of its swaps needed more on H200), wgmma with its own narrower internal
/// alignment (about 1e-4 of the largest score)); the agreement with the
/// exact selection (split-bf16 scores: `dev.3`, `indexer_scores_tc`'s) is reported with each record, and for the wgmma
/// kernel the entries its lists differ from `indexer_topk_stream_fp8`'s. On sm_90a the wgmma
/// kernel's scores ([`Gpu::indexer_scores_wgmma_fp8`]) are held to the CPU's at NMSE ≤
/// [`INDEXER_FP8_SCORES_NMSE_TOL`] (FP8 products are exact; the tensor cores' accumulation is not).
#[allow(clippy::too_many_arguments)]
fn check_indexer_fp8(
    gpu: &Gpu,
    out: &mut Vec<Value>,
    case: &str,
    q: &[f32],
    weights: &[f32],
    keys: &[f32],
    dev: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    shape: &IndexerShape,
    ks: &[usize],
) -> Result<bool, CudaError> {
    let (dq, dkeys, dw, dscores) = dev;
    let IndexerShape { tokens, heads, head_dim: hd, n_entries: n, ratio, pos0 } = *shape;
    let wgmma = gpu.arch == "sm_90a";
    let bad_q = |e: flashseek_model::quant::QuantError| CudaError::Unsupported { what: "check_indexer_fp8", detail: e.to_string() };
    let mut qd = q.to_vec();
    flashseek_model::quant::act_quant_fp8_roundtrip(&mut qd, hd).map_err(bad_q)?;
    let mut kd = keys.to_vec();
    flashseek_model::quant::act_quant_fp8_roundtrip(&mut kd, hd).map_err(bad_q)?;
    let iq = indexer::IndexQueries { heads, head_dim: hd, q: qd, weights: weights.to_vec() };
    let ref_scores: Vec<f64> = (0..tokens * n)
        .into_par_iter()
        .map(|i| {
            let (t, j) = (i / n, i % n);
            if j < visible_entries(pos0 + t, ratio, n) {
                indexer::score(&iq, t, &kd[j * hd..(j + 1) * hd])
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let q8 = gpu.act_quant(dq, tokens * heads, hd)?;
    let k8 = gpu.act_quant(dkeys, n, hd)?;
    let k8t = if wgmma { Some(gpu.act_quant_layout(dkeys, n, hd, true)?) } else { None };
    let shape_json = |k: usize| json!({"T": tokens, "N": n, "k": k, "pos0": pos0, "ratio": ratio});
    let mut all = true;
    // The wgmma kernel's largest score error on these inputs (its selection may swap entries whose
    // scores lie within twice of it of the k-th).
    let mut wg_err = 0f64;
    if let Some(k8t) = &k8t {
        let mut dwg = gpu.zeros::<f32>(tokens * n)?;
        gpu.indexer_scores_wgmma_fp8(&q8, k8t, dw, &mut dwg, shape)?;
        let got = gpu.download(&dwg)?;
        // −inf past the visible entries must match exactly; the finite scores by NMSE.
        let (mut g, mut r, mut inf_bad) = (Vec::new(), Vec::new(), 0usize);
        for (a, b) in got.iter().zip(&ref_scores) {
            if b.is_finite() {
                g.push(*a);
                r.push(*b as f32);
                wg_err = wg_err.max((*a as f64 - b).abs());
            } else {
                inf_bad += usize::from(*a != f32::NEG_INFINITY);
            }
        }
        all &= super::check::record_tol(out, &format!("indexer_scores_wgmma_fp8 ({case})"), json!({"T": tokens, "N": n, "pos0": pos0, "ratio": ratio}), &g, &r, INDEXER_FP8_SCORES_NMSE_TOL);
        // The band below is twice this error: bound it hard, so that a localised scoring bug cannot
        // widen the band that should catch it.
        let amax = r.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        let ok = wg_err <= INDEXER_FP8_SCORES_MAX_ABS_REL * amax;
        all &= super::check::flag_record(out, &format!("indexer_scores_wgmma_fp8 max-abs ({case})"), json!({"max_abs": wg_err, "max_score": amax, "bound": INDEXER_FP8_SCORES_MAX_ABS_REL * amax}), ok);
        all &= record_exact(out, &format!("indexer_scores_wgmma_fp8 mask ({case})"), json!({"T": tokens, "N": n, "pos0": pos0}), inf_bad, got.len() - g.len(), json!("entries past the visible ones must be -inf"));
    }
    for &k in ks {
        let exact = gpu_topk(gpu, dscores, shape, k)?;
        // (name, whether it is the wgmma kernel, its lists)
        let mut kernels = vec![("indexer_topk_stream_fp8", false, gpu_lists(gpu, shape, k, |off, idx| gpu.indexer_topk_stream_fp8(&q8, &k8, dw, off, idx, shape, k))?)];
        if let Some(k8t) = &k8t {
            kernels.push(("indexer_topk_wgmma_fp8", true, gpu_lists(gpu, shape, k, |off, idx| gpu.indexer_topk_wgmma_fp8(&q8, k8t, dw, off, idx, shape, k))?));
        }
        for (name, wg, got_lists) in &kernels {
            let wg = *wg;
            let (mut unexplained, mut near_ties, mut shared, mut compared) = (0usize, 0usize, 0usize, 0usize);
            for (t, (ex, got)) in exact.iter().zip(got_lists).enumerate() {
                let row = &ref_scores[t * n..(t + 1) * n];
                let vis = visible_entries(pos0 + t, ratio, n);
                let mut order: Vec<usize> = (0..vis).collect();
                order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
                let mut want = order[..k.min(vis)].to_vec();
                want.sort_unstable();
                compared += want.len();
                unexplained += usize::from(got.windows(2).any(|p| p[0] >= p[1]));
                let kth = want.iter().map(|w| row[*w]).fold(f64::INFINITY, f64::min);
                let amax = row.iter().filter(|s| s.is_finite()).fold(0f64, |m, s| m.max(s.abs()));
                let band = if wg { (1e-5 * amax).max(2.0 * wg_err) } else { 1e-5 * amax };
                for w in differing(got, &want) {
                    if row.get(w).is_some_and(|s| (s - kth).abs() <= band) {
                        near_ties += 1;
                    } else {
                        unexplained += 1;
                    }
                }
                let exact_set: BTreeSet<usize> = ex.iter().copied().collect();
                shared += got.iter().filter(|g| exact_set.contains(g)).count();
            }
            let agreement = shared as f64 / compared.max(1) as f64;
            let mut detail = json!({"near_tie_swaps": near_ties, "agreement_with_exact_selection": agreement});
            if wg {
                // Entries in one list and not the other, over all tokens (each swap counts 2).
                let differ: usize = got_lists.iter().zip(&kernels[0].2).map(|(a, b)| differing(a, b).len()).sum();
                detail["entries_in_one_list_only_vs_indexer_topk_stream_fp8"] = json!(differ);
                detail["near_tie_band_floor"] = json!(2.0 * wg_err);
            }
            all &= record_exact(out, &format!("{name} ({case})"), shape_json(k), unexplained, compared, detail);
        }
    }
    Ok(all)
}

/// NMSE bound of [`Gpu::indexer_scores_wgmma_fp8`]'s scores against the CPU's f64 scores of the same
/// quantized values: the e4m3 products are exact, the FP8 tensor cores' accumulation is not full
/// f32 (DeepSeek-V3 report §3.3.2: about 14 bits retained); measured 1.1e-8 … 1.5e-8 on H200
/// (15c1d3c).
const INDEXER_FP8_SCORES_NMSE_TOL: f64 = 1e-7;

/// Largest error of [`Gpu::indexer_scores_wgmma_fp8`]'s scores allowed, relative to the largest
/// score (measured 1.3e-4 … 1.4e-4 on H200 at 15c1d3c).
const INDEXER_FP8_SCORES_MAX_ABS_REL: f64 = 5e-4;

fn check_indexer(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    const HEADS: usize = 64;
    const HD: usize = 128;
    const RATIO: usize = 4;
    const N: usize = 600;
    let mut all = true;
    let keys = random(seed, "idx.keys", N * HD, 1.7);
    let dkeys = gpu.upload(&keys)?;
    let wscale = (HEADS as f64).powf(-0.5);
    // Positions 2385..2391 see 596–597 of the 600 entries (so the mask is exercised); 60..62 see 15.
    // Each case on the f32 kernel, the tensor-core one (odd T: a block's second token missing) and
    // on sm_90a the wgmma one (T = 5, 6: a block of 4 tokens with 1 or 2 more).
    let wgmma = gpu.arch == "sm_90a";
    // (0, 3): no token sees an entry (rows of −inf; the wgmma kernel's block returns before its ring).
    let mut cases = vec![(2385usize, 6usize, "f32"), (60, 2, "f32"), (2385, 6, "tc"), (60, 2, "tc"), (1001, 5, "tc"), (0, 3, "tc")];
    if wgmma {
        cases.extend([(2385usize, 6usize, "wgmma"), (60, 2, "wgmma"), (1001, 5, "wgmma"), (0, 3, "wgmma")]);
    }
    for (pos0, tokens, kernel) in cases {
        let kname = match kernel {
            "tc" => "indexer_scores_tc",
            "wgmma" => "indexer_scores_wgmma",
            _ => "indexer_scores",
        };
        let q = random(seed, &format!("idx.q.{pos0}"), tokens * HEADS * HD, 1.7);
        let weights: Vec<f32> = random(seed, &format!("idx.w.{pos0}"), tokens * HEADS, 1.0).iter().map(|v| (*v as f64 * wscale) as f32).collect();
        let (dq, dw) = (gpu.upload(&q)?, gpu.upload(&weights)?);
        let iq = indexer::IndexQueries { heads: HEADS, head_dim: HD, q, weights };
        let shape = IndexerShape { tokens, heads: HEADS, head_dim: HD, n_entries: N, ratio: RATIO, pos0 };
        let mut dscores = gpu.zeros::<f32>(tokens * N)?;
        if kernel == "wgmma" {
            gpu.indexer_scores_wgmma(&dq, &dkeys, &dw, &mut dscores, &shape)?;
        } else {
            gpu.indexer_scores_with(&dq, &dkeys, &dw, &mut dscores, &shape, kernel == "tc")?;
        }
        let got = gpu.download(&dscores)?;
        if kernel == "tc" {
            // INDEXER_TC_DECODE_TILES: fewer keys per block, the same tile code per key.
            let mut base = gpu.zeros::<f32>(tokens * N)?;
            gpu.indexer_scores_tc_kb(&dq, &dkeys, &dw, &mut base, &shape, 512)?;
            let base = gpu.download(&base)?;
            for kb in [64usize, 128] {
                let mut d = gpu.zeros::<f32>(tokens * N)?;
                gpu.indexer_scores_tc_kb(&dq, &dkeys, &dw, &mut d, &shape, kb)?;
                let differing = differing_bits(&gpu.download(&d)?, &base);
                all &= record_exact(out, &format!("indexer_scores_tc kb {kb} vs 512 bits"), json!({"T": tokens, "N": N, "pos0": pos0}), differing, base.len(), json!("bitwise equal, masked entries included"));
            }
        }
        // Visible scores vs the reference; the rest must be −inf.
        let (mut g, mut r) = (Vec::new(), Vec::new());
        let mut ref_scores = vec![f64::NEG_INFINITY; tokens * N];
        let mut mask_bad = 0usize;
        for t in 0..tokens {
            let vis = visible_entries(pos0 + t, RATIO, N);
            for w in 0..N {
                let v = got[t * N + w];
                if w < vis {
                    let s = indexer::score(&iq, t, &keys[w * HD..(w + 1) * HD]);
                    ref_scores[t * N + w] = s;
                    g.push(v);
                    r.push(s as f32);
                } else if v != f32::NEG_INFINITY {
                    mask_bad += 1;
                }
            }
        }
        let shape_json = json!({"T": tokens, "heads": HEADS, "hd": HD, "N": N, "ratio": RATIO, "pos0": pos0});
        all &= record(out, kname, shape_json.clone(), &g, &r);
        all &= record_exact(out, &format!("{kname} mask"), shape_json.clone(), mask_bad, tokens * N - g.len(), json!("masked entries must be -inf"));

        for k in [512usize, 16] {
            let sel = gpu_topk(gpu, &dscores, &shape, k)?;
            // (1) Exact: the same rule on the GPU's own f32 scores.
            let mut bad = 0usize;
            let mut compared = 0usize;
            for (t, st) in sel.iter().enumerate() {
                let vis = visible_entries(pos0 + t, RATIO, N);
                let want = select_rule(&got[t * N..(t + 1) * N], vis, k);
                compared += want.len();
                bad += differing(st, &want).len() + usize::from(st.windows(2).any(|p| p[0] >= p[1]));
            }
            let sj = json!({"T": tokens, "N": N, "k": k, "pos0": pos0});
            all &= record_exact(out, &format!("indexer_topk (gpu scores of {kname})"), sj.clone(), bad, compared, json!("rule applied to the GPU's f32 scores"));
            // (2) Against indexer::select on the f64 reference scores: differences are allowed only at
            // boundary near-ties (|s − s_k| ≤ 1e-5·max|s|), which f32 rounding can swap.
            let (mut unexplained, mut near_ties) = (0usize, 0usize);
            for (t, st) in sel.iter().enumerate() {
                let want = indexer::select(&iq, t, pos0 + t, RATIO, &keys, k);
                let diff = differing(st, &want);
                if diff.is_empty() {
                    continue;
                }
                let row = &ref_scores[t * N..(t + 1) * N];
                let kth = want.iter().map(|w| row[*w]).fold(f64::INFINITY, f64::min);
                let amax = row.iter().filter(|s| s.is_finite()).fold(0f64, |m, s| m.max(s.abs()));
                for w in diff {
                    // An index outside the row (a broken kernel) is never a near tie.
                    if row.get(w).is_some_and(|s| (s - kth).abs() <= 1e-5 * amax) {
                        near_ties += 1;
                    } else {
                        unexplained += 1;
                    }
                }
            }
            all &= record_exact(out, &format!("indexer_topk (reference, {kname})"), sj, unexplained, compared, json!({"near_tie_swaps": near_ties}));
        }
    }

    // Tie-heavy synthetic scores (values on a coarse grid, so many exact ties at the k-th place),
    // N 5000 (many compaction rounds): the GPU selection must equal the rule exactly.
    let (n, tokens, pos0) = (5000usize, 3usize, 19990usize);
    let scores: Vec<f32> = random(seed, "idx.tie.scores", tokens * n, 3.0).iter().map(|v| v.round()).collect();
    let dscores = gpu.upload(&scores)?;
    let shape = IndexerShape { tokens, heads: HEADS, head_dim: HD, n_entries: n, ratio: RATIO, pos0 };
    for k in [16usize, 512, 3000] {
        let sel = gpu_topk(gpu, &dscores, &shape, k)?;
        let mut bad = 0usize;
        let mut compared = 0usize;
        for (t, st) in sel.iter().enumerate() {
            let want = select_rule(&scores[t * n..(t + 1) * n], visible_entries(pos0 + t, RATIO, n), k);
            compared += want.len();
            bad += differing(st, &want).len() + usize::from(st.windows(2).any(|p| p[0] >= p[1]));
        }
        all &= record_exact(out, "indexer_topk (ties)", json!({"T": tokens, "N": n, "k": k, "pos0": pos0}), bad, compared, json!("scores on a 7-value grid"));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_rule_is_the_reference_rule() {
        // The rule the top-k records apply to GPU scores equals indexer::select on the same scores.
        let (heads, hd, n, ratio) = (4usize, 8usize, 40usize, 4usize);
        let keys = random(3, "t.keys", n * hd, 1.0);
        let q = random(3, "t.q", 2 * heads * hd, 1.0);
        let weights = random(3, "t.w", 2 * heads, 0.5);
        let iq = indexer::IndexQueries { heads, head_dim: hd, q, weights };
        for (t, pos) in [(0usize, 150usize), (1, 30)] {
            let vis = visible_entries(pos, ratio, n);
            let scores: Vec<f32> = (0..n).map(|w| indexer::score(&iq, t, &keys[w * hd..(w + 1) * hd]) as f32).collect();
            for k in [1usize, 5, 16, 64] {
                assert_eq!(select_rule(&scores, vis, k), indexer::select(&iq, t, pos, ratio, &keys, k), "t {t} k {k}");
            }
        }
        assert_eq!(select_rule(&[1.0, 2.0, 2.0, 0.0, 2.0], 5, 2), vec![1, 2]);
        assert_eq!(differing(&[1, 2, 5], &[2, 5, 7]), vec![1, 7]);
    }
}
