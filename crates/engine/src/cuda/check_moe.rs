//! gpu-check entries for the grouped MoE (issue 6 §5, [`Gpu::moe_experts_grouped`]).
//!
//! Parity matrix, for routed experts in bf16, FP8 and FP4 (shared expert FP8), 16 experts, top-6,
//! d 512, inter 256, 1,000 tokens whose routing gives experts 0, 1, 2, 9, 16, 64 and 1,000 tokens
//! (and ~545 to the other nine), slot order shuffled per token:
//! - `moe_grouped <fmt> <act> vs cpu`: every switch variant (all on; fused SwiGLU off; 64-row and
//!   128-row tiles; persistent off; a grid of 7 blocks, each walking many work units) against `forward::moe::moe` (exact numerics) on the dequantized
//!   weights. Tolerance: NMSE ≤ 1e-8 with split activations ([`super::check::SPLIT_NMSE_TOL`]),
//!   ≤ 5e-4 with bf16 activations (issue 6's bound; bf16 rounds x to 8 bits).
//! - `moe_grouped … bits`: every variant gives the same bits as the all-on one (the design promises
//!   it: each output is one block's fixed-order accumulation whatever the grid, tile or fusion).
//! - `moe_grouped … vs per-expert`: against the per-expert GPU path ([`Gpu::moe_experts`]), NMSE.
//! - `moe_grouped <fmt> <act> BF16_WGMMA=off vs cpu` / `… bits`: the mma.sync kernels (the variants
//!   above run on the wgmma ones by default, sm_90a) against the same reference and tolerance, and
//!   bit for bit against all on (measured equal on H200: each 16-wide slice is one tensor-core dot
//!   product in either family).
//! - `moe_grouped … masked`: all routing weights 0 → the output equals the shared expert's alone,
//!   bit for bit (masked routes contribute exact zeros).
//! - `moe_grouped fp4 split MOE_BF16_WS=off bits`: the 128-row-tile FP4 split kernels without warp
//!   specialisation (`moe_wb`) give the all-on (`moe_wbs`) bits (`moe_wbs_ran` says whether it ran).
//! - `moe_grouped fp4 split scales > 128 …`: every third weight row 2^12 times larger, so that scale
//!   bytes above 128 (`moe_wbs`'s second multiply) mix with smaller ones in a warp: against the CPU,
//!   and bit for bit `MOE_BF16_WS=off` and a grid of 7 blocks against all on.
//! - `moe_grouped inter 192 …`: experts of 192 hidden units (output widths that are not multiples
//!   of the tiles, a down projection ending in half an FP8 scale block): all on, both tiles, fusion
//!   off, `BF16_WGMMA=off` and (FP4, split) `MOE_BF16_WS=off` against the CPU and bit for bit
//!   against all on.
//!
//! Official numerics (`TC_LINEAR=fp8`, [`Gpu::moe_experts_grouped_q8`]), FP4 and FP8 experts:
//! - `moe_q8 <fmt> <variant> vs cpu`: against `forward::moe::moe` with `Numerics { act_quant_fp8 }`
//!   (the same quantisation in f64 arithmetic). Tolerance NMSE ≤ [`Q8_MOE_NMSE_TOL`]: the FP8
//!   tensor cores sum products in their own order and precision, and an activation that lands on
//!   the other side of an e4m3 rounding boundary moves by one e4m3 step.
//! - `moe_q8 … bits` (every variant equals all-on), `moe_q8 <fmt> per-expert vs cpu` (the per-expert
//!   path under `TC_LINEAR=fp8`), `moe_q8 <fmt> masked` (γ = 0 → the official shared expert alone,
//!   which quantizes its input itself while the grouped path hands it the routed experts' bytes).
//! - `moe_q8 <fmt> MOE_FP8_WS=off bits`: the 128-row-tile kernels without warp specialisation
//!   (`moe_w8`) give the all-on (`moe_ws`) bits.
//! - `moe_q8 fp4 MOE_FP8_WT=off bits`: the 128-row tiles (`moe_ws`) give the all-on bits of the
//!   256-row tiles (`moe_wt`; `moe_wt_ran` must be true: 375 pairs per expert on average).
//! - `moe_q8 grouped h quantisation …`: the down projection's input quantized only on the rows a
//!   tile reads ([`Gpu::act_quant_grouped`]: below the grouped row count, and in the tiled layout not
//!   in a sub-tile of padding alone) equals the quantisation of every row there, byte for byte, and
//!   leaves every other row as its buffers were filled.
//! - `moe_q8 fp4 block scales` / `moe_q8 fp4 scales > 128 … block scales`: `fp4_block_smax`'s
//!   tables byte for byte against the host's rule, and its verdict (tables for the parity layer;
//!   none for the layer whose rows 2^12 apart share blocks, which keeps 128-row tiles).
//!
//! Timings (`timings`): one MoE layer at Flash shapes (256 FP4 experts of [2048, 4096], FP8 shared
//! expert, top-6, random routing) for several token counts: per-expert path vs grouped with each
//! switch off alone (and `BF16_WGMMA=off`: the mma.sync kernels), CUDA events, median after
//! warm-up, with TFLOP/s of the routed experts. With them three checks per token count,
//! `moe_q8 flash T=… MOE_FP8_WS=off bits` (`moe_ws` against `moe_w8`) and `moe_grouped flash T=…
//! MOE_BF16_WS=off bits` (`moe_wbs` against `moe_wb`), 128-row tiles forced, and `moe_q8 flash T=…
//! MOE_FP8_WT=off bits` (`moe_wt` with 256-row tiles forced against `moe_ws`, which also needs
//! some expert whose last 256-row tile has an odd number of live 64-row sub-tiles,
//! `experts_odd_last_tile`, so that tiles with a warpgroup idle for a sub-tile are covered): rows with `"pass"`,
//! folded into gpu-check's verdict by [`timing_checks_pass`].

use super::check::{differing_bits, errors, flag_record, median_ms, random, record, switch_scope, weight, SPLIT_NMSE_TOL};
use super::check_mhc::{config, moe_layer};
use super::gpu::{Gpu, GpuMatrix, GpuWeight};
use super::ops_mhc::{GpuExpert, GpuMoeLayer, GpuRouter};
use super::ops_moe::MoeOptions;
use super::CudaError;
use crate::forward::moe::{self, Route};
use crate::forward::Numerics;
use crate::weights::{ExpertWeights, Matrix, RouterWeights};
use flashseek_model::config::ScoringFunc;
use flashseek_model::quant;
use serde_json::{json, Value};

/// NMSE bound for the grouped MoE with bf16 activations (issue 6 §5).
pub const GROUPED_BF16_NMSE_TOL: f64 = 5e-4;

/// NMSE bound for one FP8-activation GEMM against the CPU in the same official numerics (the
/// tensor cores' own summation order and precision).
pub const Q8_NMSE_TOL: f64 = 1e-5;

/// NMSE bound for a chain of them (the MoE: gate/up → SwiGLU → quantize → down), where an
/// activation that lands on the other side of an e4m3 rounding boundary moves by a whole e4m3 step
/// (issue 5's per-op bound).
pub const Q8_MOE_NMSE_TOL: f64 = 1e-4;

/// The designed routing: `t` tokens × top-`k` over `e` experts with the listed per-expert counts for
/// experts 0.. (expert 6 takes every token), the rest spread over experts 7..; slots shuffled.
fn designed_routes(seed: u64, t: usize, k: usize, e: usize) -> Vec<Route> {
    // (expert, first token, count) of the special experts; expert 0 gets none.
    let special: [(usize, usize, usize); 5] = [(1, 0, 1), (2, 1, 2), (3, 3, 9), (4, 12, 16), (5, 28, 64)];
    let w = random(seed, "moe_grouped.gamma", t * k, 1.0);
    (0..t)
        .map(|ti| {
            let mut ex = vec![6usize];
            for &(x, a, c) in &special {
                if ti >= a && ti < a + c {
                    ex.push(x);
                }
            }
            let mut j = 0;
            while ex.len() < k {
                let x = 7 + (ti + j) % (e - 7);
                if !ex.contains(&x) {
                    ex.push(x);
                }
                j += 1;
            }
            // Deterministic shuffle of the slot order.
            let r = crate::testing::fnv1a64(&format!("{seed}:perm{ti}")) as usize;
            ex.rotate_left(r % k);
            if r & 64 != 0 {
                ex.swap(0, k - 1);
            }
            let weights = (0..k).map(|s| 0.25 + w[ti * k + s].abs() as f64).collect();
            Route { experts: ex, weights }
        })
        .collect()
}

/// Random weights `[rows, cols]` of magnitude ~sqrt(3 / cols), row r scaled by `gain(r)`.
fn gained(seed: u64, key: &str, rows: usize, cols: usize, gain: &dyn Fn(usize) -> f64) -> Vec<f32> {
    let mut w = random(seed, key, rows * cols, (3.0 / cols as f64).sqrt());
    for (r, row) in w.chunks_mut(cols).enumerate() {
        let g = gain(r) as f32;
        row.iter_mut().for_each(|v| *v *= g);
    }
    w
}

/// One random expert in `fmt` (weights of magnitude ~sqrt(3 / fan-in), row r scaled by `gain(r)`).
fn expert_in(gpu: &Gpu, seed: u64, key: &str, fmt: &str, d: usize, inter: usize, gain: &dyn Fn(usize) -> f64) -> Result<(GpuExpert, ExpertWeights), CudaError> {
    let (w1, c1) = weight(gpu, fmt, &gained(seed, &format!("{key}.w1"), inter, d, gain), inter, d)?;
    let (w2, c2) = weight(gpu, fmt, &gained(seed, &format!("{key}.w2"), d, inter, gain), d, inter)?;
    let (w3, c3) = weight(gpu, fmt, &gained(seed, &format!("{key}.w3"), inter, d, gain), inter, d)?;
    Ok((GpuExpert { w1, w2, w3 }, ExpertWeights { w1: c1, w2: c2, w3: c3 }))
}

/// A MoE layer of `e` random experts in `fmt` (d × inter, keys `<key>.e<x>`, weight row r scaled by
/// `gain(r)`) and an FP8 shared expert (`<key>.shared`), on the GPU and as the CPU reference's weights
/// (no gate: the checks route by hand).
#[allow(clippy::too_many_arguments)]
fn test_layer(gpu: &Gpu, seed: u64, key: &str, fmt: &str, e: usize, d: usize, inter: usize, gain: &dyn Fn(usize) -> f64) -> Result<(GpuMoeLayer, crate::weights::LayerWeights), CudaError> {
    let mut g_experts = Vec::new();
    let mut c_experts = Vec::new();
    for x in 0..e {
        let (g, c) = expert_in(gpu, seed, &format!("{key}.e{x}"), fmt, d, inter, gain)?;
        g_experts.push(g);
        c_experts.push(c);
    }
    let (g_shared, c_shared) = expert_in(gpu, seed, &format!("{key}.shared"), "fp8", d, inter, &|_| 1.0)?;
    let layer = GpuMoeLayer {
        gate: GpuWeight { rows: 0, cols: 0, data: GpuMatrix::F32(gpu.zeros_owned::<f32>(1)?) },
        router: GpuRouter::Score { bias: gpu.zeros_owned::<f32>(e)? },
        shared: g_shared,
        experts: g_experts,
        tables: std::sync::OnceLock::new(),
    };
    let none = Matrix { rows: 0, cols: 0, data: Vec::new() };
    Ok((layer, moe_layer(none, RouterWeights::Score { bias: vec![0.0; e] }, c_shared, c_experts)))
}

/// The named variants of the parity matrix: all on, then each switch off alone, and both tiles.
fn variants() -> Vec<(&'static str, MoeOptions)> {
    let on = MoeOptions::ALL_ON;
    vec![
        ("all on", on),
        ("fused off", MoeOptions { fused_swiglu: false, ..on }),
        ("tile 64", MoeOptions { force_tile_rows: Some(64), ..on }),
        ("tile 128", MoeOptions { force_tile_rows: Some(128), ..on }),
        ("persistent off", MoeOptions { persistent: false, ..on }),
        ("grid of 7 blocks", MoeOptions { max_blocks: Some(7), ..on }),
        ("tile 64 unfused, one block per unit", MoeOptions { force_tile_rows: Some(64), fused_swiglu: false, persistent: false, ..on }),
    ]
}

/// Runs the parity matrix; appends records to `out`, returns whether all passed.
pub fn run(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (t, d, inter, e, k) = (1000usize, 512usize, 256usize, 16usize, 6usize);
    let Designed { cfg, f, routes32, ids, gammas } = designed(seed);
    let mut counts = vec![0usize; e];
    for x in &ids {
        counts[*x as usize] += 1;
    }
    println!("moe_grouped routing: tokens per expert {counts:?}");
    let df = gpu.upload(&f)?;
    let dids = gpu.upload(&ids)?;
    let dw = gpu.upload(&gammas)?;
    let dzero = gpu.zeros::<f32>(t * k)?;
    for fmt in ["fp4", "fp8", "bf16"] {
        let (layer, lw) = test_layer(gpu, seed, &format!("moe_grouped.{fmt}"), fmt, e, d, inter, &|_| 1.0)?;
        let y_ref = moe::moe(&cfg, &lw, &f, &routes32, &Numerics::default());
        let per_expert = gpu.download(&*gpu.moe_experts(&cfg, &layer, &df, t, &ids, &dw, false)?)?;
        let shape = json!({"tokens": t, "d": d, "inter": inter, "experts": e, "top_k": k, "tokens_per_expert": counts});
        for split in [true, false] {
            let act = if split { "split" } else { "bf16" };
            let tol = if split { SPLIT_NMSE_TOL } else { GROUPED_BF16_NMSE_TOL };
            let mut first: Option<Vec<f32>> = None;
            for (vname, opts) in variants() {
                let got = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dw, split, opts)?)?;
                all &= vs_cpu(out, &format!("moe_grouped {fmt} {act} {vname} vs cpu"), &shape, &got, &y_ref, tol);
                match &first {
                    None => first = Some(got),
                    Some(f0) => {
                        let differ = differing_bits(f0, &got);
                        all &= flag_record(out, &format!("moe_grouped {fmt} {act} {vname} bits"), json!({"differing_values": differ, "of": got.len(), "vs": "all on"}), differ == 0);
                    }
                }
            }
            let f0 = first.unwrap_or_default();
            // The mma.sync kernels (BF16_WGMMA=off; where the wgmma ones run, they are the default)
            // against the same reference, and how far the two families are apart.
            if gpu.bf16_wgmma(fmt, d) && gpu.bf16_wgmma(fmt, inter) {
                let sync = switch_scope(&[("BF16_WGMMA", "off")], || gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dw, split, MoeOptions::ALL_ON))?;
                let sync = gpu.download(&sync)?;
                all &= vs_cpu(out, &format!("moe_grouped {fmt} {act} BF16_WGMMA=off vs cpu"), &shape, &sync, &y_ref, tol);
                // Measured on H200: the wgmma kernels give the mma.sync kernels' bits (each 16-wide
                // slice is one tensor-core dot product either way, hi before lo): asserted.
                let differ = differing_bits(&f0, &sync);
                all &= flag_record(out, &format!("moe_grouped {fmt} {act} BF16_WGMMA=off bits"), json!({"differing_values": differ, "of": sync.len(), "vs": "all on"}), differ == 0);
                // The warp-specialised kernels (MOE_BF16_WS, on by default: FP4, split, 128-row tiles —
                // all on above ran on them) against moe_wb: the same MMAs on the same values.
                if fmt == "fp4" && split {
                    let wb = switch_scope(&[("MOE_BF16_WS", "off")], || gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dw, split, MoeOptions::ALL_ON))?;
                    let differ = differing_bits(&f0, &gpu.download(&wb)?);
                    let ran = wbs_runs(gpu, d, inter, t * k, e, MoeOptions::ALL_ON);
                    all &= flag_record(out, &format!("moe_grouped {fmt} {act} MOE_BF16_WS=off bits"), json!({"differing_values": differ, "of": f0.len(), "vs": "all on", "moe_wbs_ran": ran}), differ == 0);
                }
            }
            let (nmse, max_abs, _) = errors(&f0, &per_expert);
            println!("moe_grouped {fmt} {act} vs per-expert GPU path: nmse {nmse:.3e} max_abs {max_abs:.3e}");
            out.push(json!({"op": format!("moe_grouped {fmt} {act} vs per-expert"), "shape": shape, "nmse": nmse, "max_abs": max_abs, "informational": true}));
            if split {
                all &= record(out, &format!("moe_grouped {fmt} per-expert vs cpu"), shape.clone(), &per_expert, &y_ref);
            }
            // Decode sizes (MOE_GROUPED_DECODE): the first 1 and 3 tokens alone, with the defaults
            // (FP4: the f32 gemvs of MOE_DECODE_GEMV) and on the grouped GEMMs.
            if split {
                let grouped_only = MoeOptions { decode_gemv: None, ..MoeOptions::ALL_ON };
                for ts in [1usize, 3] {
                    let (fs, is, ws) = (gpu.upload(&f[..ts * d])?, gpu.upload(&ids[..ts * k])?, gpu.upload(&gammas[..ts * k])?);
                    let want = moe::moe(&cfg, &lw, &f[..ts * d], &routes32[..ts], &Numerics::default());
                    for (label, opts) in [("", MoeOptions::ALL_ON), (" MOE_DECODE_GEMV=off", grouped_only)] {
                        let gemv = gpu.moe_tables(&layer)?.is_some_and(|tb| super::ops_moe::gemv_runs(tb, ts * k, opts));
                        let got = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &fs, ts, &is, &ws, true, opts)?)?;
                        let (nmse, max_abs, _) = errors(&got, &want);
                        let ok = nmse <= SPLIT_NMSE_TOL && got.iter().all(|v| v.is_finite());
                        all &= flag_record(out, &format!("moe_grouped {fmt} split T={ts}{label} vs cpu"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": SPLIT_NMSE_TOL, "gemv_ran": gemv}), ok && (gemv == (fmt == "fp4" && label.is_empty())));
                    }
                }
                if fmt == "fp4" {
                    // The f32 gemvs forced on all 6,000 pairs, against the CPU; γ = 0 gives the shared expert's bits.
                    let forced = MoeOptions { decode_gemv: Some(usize::MAX), ..MoeOptions::ALL_ON };
                    let got = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dw, true, forced)?)?;
                    all &= vs_cpu(out, "moe_grouped fp4 gemv f32 vs cpu", &shape, &got, &y_ref, SPLIT_NMSE_TOL);
                    let masked = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dzero, true, forced)?)?;
                    let shared = gpu.download(&*gpu.shared_expert(&layer, &df, None, t, d, cfg.swiglu_limit as f32, false)?)?;
                    let differ = differing_bits(&masked, &shared);
                    all &= flag_record(out, "moe_grouped fp4 gemv f32 masked", json!({"differing_values": differ, "of": shared.len(), "vs": "shared expert alone"}), differ == 0);
                }
            }
            // Masked routes: γ = 0 everywhere → exactly the shared expert.
            let masked = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dzero, split, MoeOptions::ALL_ON)?)?;
            let shared = gpu.download(&*gpu.shared_expert(&layer, &df, None, t, d, cfg.swiglu_limit as f32, false)?)?;
            let differ = differing_bits(&masked, &shared);
            all &= flag_record(out, &format!("moe_grouped {fmt} {act} masked"), json!({"differing_values": differ, "of": shared.len(), "vs": "shared expert alone"}), differ == 0);
        }
    }
    all &= run_grouping(gpu, seed, out)?;
    all &= run_grouped_quant(gpu, seed, out)?;
    all &= run_large_scales(gpu, seed, &cfg, &f, &routes32, &dids, &dw, out)?;
    all &= run_ragged(gpu, seed, &cfg, &f, &routes32, &dids, &dw, out)?;
    all &= run_q8(gpu, seed, &cfg, &f, &routes32, &dids, &dw, &ids, out)?;
    all &= run_gemv_flash_widths(gpu, seed, out)?;
    Ok(all)
}

/// The grouping kernels (moe.cu `moe_group_scan` / `moe_group_plan`) against
/// [`crate::cuda::ops_moe::group_reference`], array for array: random expert ids (one in 50 outside
/// 0 … E − 1, belonging to no expert) for pair counts below, at and across the scan's 1,024-pair
/// chunks, the Flash shapes of an 8,192-token chunk (256 experts, top-6, tiles of 256 and 128) and of
/// a 32,768-token one, the most experts the grouping takes; one pair; every id outside (no rows);
/// one expert for all (whole warp steps of one expert, its rows across many tiles and chunks).
fn run_grouping(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    // (pairs, top-k, experts, tile, ids: 0 random with one in 50 outside, 1 all outside, 2 all one expert)
    let shapes = [(6usize, 6usize, 256usize, 64usize, 0u8), (1000, 4, 16, 64, 0), (1024, 8, 16, 128, 0), (4097, 1, 7, 64, 0), (8192 * 6, 6, 256, 256, 0), (8192 * 6, 6, 256, 128, 0), (32768 * 6, 6, 256, 256, 0), (3000, 3, 1024, 64, 0), (1, 1, 256, 256, 0), (2000, 2, 8, 64, 1), (2500, 1, 4, 64, 2)];
    for (tk, k, e, bm, kind) in shapes {
        let mut ids: Vec<i32> = (0..tk).map(|i| (crate::testing::fnv1a64(&format!("{seed}:group:{tk}:{i}")) % e as u64) as i32).collect();
        for (i, x) in ids.iter_mut().enumerate() {
            let h = crate::testing::fnv1a64(&format!("{seed}:group-out:{tk}:{i}"));
            *x = match kind {
                1 => if i % 2 == 0 { -1 } else { (e + i % 5) as i32 },
                2 => (e / 2) as i32,
                _ if h.is_multiple_of(50) => if h.is_multiple_of(100) { -1 } else { (e + (h as usize % 7)) as i32 },
                _ => *x,
            };
        }
        let got = gpu.moe_group_download(&ids, k, e, bm)?;
        let want = crate::cuda::ops_moe::group_reference(&ids, k, e, bm);
        let ok = got == want;
        let differ = |a: &[i32], b: &[i32]| a.len().abs_diff(b.len()) + a.iter().zip(b).filter(|(x, y)| x != y).count();
        all &= flag_record(
            out,
            &format!("moe grouping (pairs {tk}, top-{k}, {e} experts, tile {bm}{})", ["", ", no id routed", ", one expert"][kind as usize]),
            json!({"rows": want.row_tok.len(), "items": want.items.len() / 2, "differing": {"offsets": differ(&got.offsets, &want.offsets), "items": differ(&got.items, &want.items), "row_tok": differ(&got.row_tok, &want.row_tok), "row_dst": differ(&got.row_dst, &want.row_dst)}, "vs": "group_reference on the host"}),
            ok,
        );
        if tk == 8192 * 6 && bm == 256 {
            // The Flash shapes of an 8,192- and a 32,768-token chunk (buffers allocated as in a layer).
            for tokens in [8192usize, 32768] {
                let ids: Vec<i32> = (0..tokens * k).map(|i| (crate::testing::fnv1a64(&format!("{seed}:group-time:{i}")) % e as u64) as i32).collect();
                let dev = gpu.upload(&ids)?;
                let ms = median_ms(gpu, 20, || gpu.moe_group(&dev, tokens * k, k, e, bm).map(|_| ()))?;
                println!("time moe grouping (scan, plan, scan) T={tokens} top-{k} E={e} tile {bm}: {ms:.3} ms");
                out.push(json!({"op": "time moe grouping", "tokens": tokens, "top_k": k, "experts": e, "tile": bm, "median_ms": ms}));
            }
        }
    }
    Ok(all)
}

/// [`Gpu::act_quant_grouped`] (the down projection's input quantized only on the rows a tile reads)
/// against [`Gpu::act_quant_layout`] over every row: byte for byte on those rows — rows below the
/// grouped count R and, in the tiled layout (`moe_wt`'s 256-row tiles), not in a 64-row sub-tile of
/// padding alone — while every other row keeps the 0xFF bytes and NaN scales its buffers were filled
/// with (so the record fails if a row is skipped that should not be, or written that need not be).
/// Random h of 384 and 128 features over: hand-made expert sizes (0, 1, 64, 65, 200, 256, 300, 513
/// pairs: a second tile live in its first sub-tile only, tiles of one routed row, an empty expert)
/// tiled and in 128-row tiles; random routings of 1,000 pairs over 16 experts and of the Flash
/// shapes of an 8,192-token chunk (256 experts, top-6, tiles of 256 tiled and 128 plain); one expert
/// for all. Each record names the rows compared and the rows left out.
fn run_grouped_quant(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let mix = |key: String| crate::testing::fnv1a64(&key) >> 32;
    // Hand-made sizes: expert i gets SIZES[i] pairs (top-1), in a hashed order.
    const SIZES: [usize; 8] = [300, 1, 64, 65, 0, 513, 200, 256];
    let mut sized: Vec<(u64, i32)> = SIZES.iter().enumerate().flat_map(|(e, &n)| (0..n).map(move |j| (e, j))).map(|(e, j)| (mix(format!("{seed}:gq-sized:{e}:{j}")), e as i32)).collect();
    sized.sort_unstable();
    let sized: Vec<i32> = sized.into_iter().map(|(_, e)| e).collect();
    let random_ids = |tk: usize, e: usize| -> Vec<i32> { (0..tk).map(|i| (mix(format!("{seed}:gq:{tk}:{i}")) % e as u64) as i32).collect() };
    // (name, ids, top-k, experts, tile, width, tiled)
    type Case = (&'static str, Vec<i32>, usize, usize, usize, usize, bool);
    let cases: Vec<Case> = vec![
        ("sizes 0-513", sized.clone(), 1, SIZES.len(), 256, 384, true),
        ("sizes 0-513", sized, 1, SIZES.len(), 128, 384, false),
        ("random", random_ids(1000, 16), 4, 16, 256, 384, true),
        ("random", random_ids(1000, 16), 4, 16, 128, 384, false),
        ("random", random_ids(8192 * 6, 256), 6, 256, 256, 128, true),
        ("random", random_ids(8192 * 6, 256), 6, 256, 128, 128, false),
        ("one expert", vec![2; 2500], 1, 4, 256, 128, true),
    ];
    for (name, ids, k, e, bm, width, tiled) in cases {
        let tk = ids.len();
        let p = gpu.act_quant_grouped_pair(&ids, k, e, bm, width, tiled, |rows| random(seed, &format!("gq.h.{tk}.{bm}"), rows * width, 3.0))?;
        let kb = width.div_ceil(128);
        let kp = kb * 128;
        let (mut compared, mut differ, mut left_out, mut left_touched) = (0usize, 0usize, 0usize, 0usize);
        for r in 0..p.r_cap {
            // The row's bytes (offset, length): tiled, 128 per 128-column block inside its 64-row
            // block (the swizzle permutes 16-byte chunks within a row); else one row of kp.
            let spans: Vec<(usize, usize)> = if tiled { (0..kb).map(|b| (((r >> 6) * kb + b) * 8192 + (r & 63) * 128, 128)).collect() } else { vec![(r * kp, kp)] };
            let scales = r * kb..(r + 1) * kb;
            let read = r < p.rows && !(tiled && p.row_dst[r & !63] < 0);
            if read {
                compared += 1;
                let bytes_differ = spans.iter().any(|&(at, n)| p.full.0[at..at + n] != p.grouped.0[at..at + n]);
                let scales_differ = p.full.1[scales.clone()].iter().zip(&p.grouped.1[scales]).any(|(a, b)| a.to_bits() != b.to_bits());
                differ += usize::from(bytes_differ || scales_differ);
            } else {
                left_out += 1;
                let touched = spans.iter().any(|&(at, n)| p.grouped.0[at..at + n].iter().any(|&b| b != 0xFF)) || p.grouped.1[scales].iter().any(|v| !v.is_nan());
                left_touched += usize::from(touched);
            }
        }
        let ok = differ == 0 && left_touched == 0 && compared > 0 && p.rows <= p.r_cap;
        all &= flag_record(
            out,
            &format!("moe_q8 grouped h quantisation ({name}: pairs {tk}, top-{k}, {e} experts, tile {bm}, width {width}{})", if tiled { ", tiled" } else { "" }),
            json!({"rows_compared": compared, "rows_left_out": left_out, "grouped_rows": p.rows, "capacity": p.r_cap, "differing_rows": differ, "left_out_rows_written": left_touched, "vs": "act_quant over every row, on the rows a tile reads; the fill elsewhere"}),
            ok,
        );
    }
    Ok(all)
}

/// FP4 experts whose scale bytes exceed 128 where `moe_wbs`'s conversion takes its second multiply
/// (2^(s−1) is no bf16 there): every third weight row 2^12 times larger (inputs 2^12 times
/// smaller), so that lanes of one warp disagree on the branch. Split activations, all on against
/// the CPU (NMSE ≤ 1e-8) and bit for bit against `MOE_BF16_WS=off` (`moe_wb`), also with a grid of
/// 7 blocks (each walks many work units, the ring running across them); the records give the
/// smallest and largest scale byte of the routed experts.
#[allow(clippy::too_many_arguments)]
fn run_large_scales(gpu: &Gpu, seed: u64, cfg: &flashseek_model::config::Ds4Config, f: &[f32], routes: &[Route], dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (t, d, e, inter) = (routes.len(), cfg.hidden_size, cfg.n_routed_experts, 256usize);
    let gain = |r: usize| if r.is_multiple_of(3) { 4096.0 } else { 1.0 };
    let f: Vec<f32> = f.iter().map(|v| v / 4096.0).collect();
    let df = gpu.upload(&f)?;
    let (layer, lw) = test_layer(gpu, seed, "moe_large_scales.fp4", "fp4", e, d, inter, &gain)?;
    // The scale bytes the kernels read: every routed expert's matrices, as uploaded.
    let (mut min_scale, mut max_scale) = (u8::MAX, 0u8);
    for m in layer.experts.iter().flat_map(|x| [&x.w1, &x.w2, &x.w3]) {
        if let GpuMatrix::Fp4 { scales, .. } = &m.data {
            for b in gpu.download(scales)? {
                (min_scale, max_scale) = (min_scale.min(b), max_scale.max(b));
            }
        }
    }
    // Rows 2^12 apart share blocks: no block scale tables, so the FP8 path keeps 128-row tiles.
    let mut all = check_block_smax(gpu, &layer, "fp4 scales > 128 (12 binades within a block)", false, out)?;
    let y_ref = moe::moe(cfg, &lw, &f, routes, &Numerics::default());
    let shape = json!({"tokens": t, "d": d, "inter": inter, "experts": e, "top_k": cfg.num_experts_per_tok, "weight_gain": "4096 on every third row", "scale_bytes": [min_scale, max_scale]});
    let on = gpu.download(&*gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, true, MoeOptions::ALL_ON)?)?;
    all &= vs_cpu(out, "moe_grouped fp4 split scales > 128 vs cpu", &shape, &on, &y_ref, SPLIT_NMSE_TOL);
    let ran = wbs_runs(gpu, d, inter, t * cfg.num_experts_per_tok, e, MoeOptions::ALL_ON);
    let wb = switch_scope(&[("MOE_BF16_WS", "off")], || gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, true, MoeOptions::ALL_ON))?;
    let wb = gpu.download(&wb)?;
    let grid7 = gpu.download(&*gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, true, MoeOptions { max_blocks: Some(7), ..MoeOptions::ALL_ON })?)?;
    for (name, got) in [("MOE_BF16_WS=off", &wb), ("grid of 7 blocks", &grid7)] {
        let differ = differing_bits(&on, got);
        let detail = json!({"differing_values": differ, "of": on.len(), "vs": "all on", "scale_bytes": [min_scale, max_scale], "moe_wbs_ran": ran});
        all &= flag_record(out, &format!("moe_grouped fp4 split scales > 128 {name} bits"), detail, differ == 0 && max_scale > 128 && min_scale <= 128);
    }
    Ok(all)
}

/// Whether the split grouped MoE of `tk` routed pairs over `e` FP4 experts (d, inter) runs
/// `moe_wbs` here with `opts` (wgmma allowed, `MOE_BF16_WS` on, 128-row tiles): the records that
/// compare it with `moe_wb` say so.
fn wbs_runs(gpu: &Gpu, d: usize, inter: usize, tk: usize, e: usize, opts: MoeOptions) -> bool {
    let wgmma = gpu.bf16_wgmma("fp4", d) && gpu.bf16_wgmma("fp4", inter);
    super::ops_moe::moe_gemm_family(wgmma, "fp4", opts.tile_rows(tk, e, true, wgmma), true) == "moe_wbs"
}

/// The same routing with experts of 192 hidden units: the fused gate/up GEMM is 384 wide (the
/// 128 × 256 wgmma tile's second column tile is half outside) and the down GEMM's K = 192 ends in a
/// half FP8 scale block. Every format, split and bf16 activations: all on, both tile heights and
/// fusion off against the CPU and bit for bit against all on, and (sm_90a) the mma.sync kernels bit
/// for bit.
#[allow(clippy::too_many_arguments)]
fn run_ragged(gpu: &Gpu, seed: u64, cfg: &flashseek_model::config::Ds4Config, f: &[f32], routes: &[Route], dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (t, d, e, inter) = (routes.len(), cfg.hidden_size, cfg.n_routed_experts, 192usize);
    let df = gpu.upload(f)?;
    let shape = json!({"tokens": t, "d": d, "inter": inter, "experts": e, "top_k": cfg.num_experts_per_tok});
    let mut all = true;
    for fmt in ["fp4", "fp8", "bf16"] {
        let (layer, lw) = test_layer(gpu, seed, &format!("moe_ragged.{fmt}"), fmt, e, d, inter, &|_| 1.0)?;
        let y_ref = moe::moe(cfg, &lw, f, routes, &Numerics::default());
        for split in [true, false] {
            let act = if split { "split" } else { "bf16" };
            let tol = if split { SPLIT_NMSE_TOL } else { GROUPED_BF16_NMSE_TOL };
            let on = MoeOptions::ALL_ON;
            let first = gpu.download(&*gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, split, on)?)?;
            all &= vs_cpu(out, &format!("moe_grouped inter {inter} {fmt} {act} all on vs cpu"), &shape, &first, &y_ref, tol);
            let mut variants = vec![("tile 64", MoeOptions { force_tile_rows: Some(64), ..on }), ("tile 128", MoeOptions { force_tile_rows: Some(128), ..on }), ("fused off", MoeOptions { fused_swiglu: false, ..on })];
            let wgmma = gpu.bf16_wgmma(fmt, d) && gpu.bf16_wgmma(fmt, inter);
            if wgmma {
                variants.push(("BF16_WGMMA=off", on));
                if fmt == "fp4" && split {
                    variants.push(("MOE_BF16_WS=off", on));
                }
            }
            for (vname, opts) in variants {
                let got = if let Some(sw) = vname.strip_suffix("=off") {
                    switch_scope(&[(sw, "off")], || gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, split, opts))?
                } else {
                    gpu.moe_experts_grouped(cfg, &layer, &df, t, dids, dw, split, opts)?
                };
                let got = gpu.download(&got)?;
                all &= vs_cpu(out, &format!("moe_grouped inter {inter} {fmt} {act} {vname} vs cpu"), &shape, &got, &y_ref, tol);
                let differ = differing_bits(&first, &got);
                all &= flag_record(out, &format!("moe_grouped inter {inter} {fmt} {act} {vname} bits"), json!({"differing_values": differ, "of": got.len(), "vs": "all on"}), differ == 0);
            }
        }
    }
    Ok(all)
}

/// Prints and records `got` against the CPU's `want` (NMSE tolerance `tol`, every value finite);
/// returns whether it passed.
fn vs_cpu(out: &mut Vec<Value>, op: &str, shape: &Value, got: &[f32], want: &[f32], tol: f64) -> bool {
    let (nmse, max_abs, ref_max) = errors(got, want);
    let pass = nmse <= tol && got.iter().all(|v| v.is_finite());
    println!("{op:<52} nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e}, tol {tol:.0e})  {}", if pass { "ok" } else { "FAIL" });
    out.push(json!({"op": op, "shape": shape, "nmse": nmse, "max_abs": max_abs, "ref_max": ref_max, "tolerance_nmse": tol, "pass": pass}));
    pass
}

/// The parity matrix's inputs: 1,000 tokens of width 512 routed top-6 over 16 experts by
/// [`designed_routes`] (weights rounded to f32, as the GPU holds them).
struct Designed {
    cfg: flashseek_model::config::Ds4Config,
    f: Vec<f32>,
    routes32: Vec<Route>,
    ids: Vec<i32>,
    gammas: Vec<f32>,
}

fn designed(seed: u64) -> Designed {
    let (t, d, e, k) = (1000usize, 512usize, 16usize, 6usize);
    let routes = designed_routes(seed, t, k, e);
    Designed {
        cfg: config(d, e, k, ScoringFunc::SqrtSoftplus, 1.0),
        f: random(seed, "moe_grouped.f", t * d, 2.0),
        ids: routes.iter().flat_map(|r| r.experts.iter().map(|x| *x as i32)).collect(),
        gammas: routes.iter().flat_map(|r| r.weights.iter().map(|v| *v as f32)).collect(),
        routes32: routes.iter().map(|r| Route { experts: r.experts.clone(), weights: r.weights.iter().map(|v| *v as f32 as f64).collect() }).collect(),
    }
}

/// Only the official-numerics half of the matrix (`gpu-check --only q8`), on the same routing.
pub fn run_official(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let Designed { cfg, f, routes32, ids, gammas } = designed(seed);
    let (dids, dw) = (gpu.upload(&ids)?, gpu.upload(&gammas)?);
    // The records' "all on" is the f32 rows' (MOE_DOWN_BF16_OUT has its own records) whatever the
    // environment says.
    switch_scope(&[("MOE_DOWN_BF16_OUT", "off")], || run_q8(gpu, seed, &cfg, &f, &routes32, &dids, &dw, &ids, out))
}

/// The official-numerics (FP8 activation) half of the parity matrix; see the module docs.
#[allow(clippy::too_many_arguments)]
fn run_q8(gpu: &Gpu, seed: u64, cfg: &flashseek_model::config::Ds4Config, f: &[f32], routes: &[Route], dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, ids: &[i32], out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (t, d, e, k) = (routes.len(), cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok);
    let inter = 256usize;
    let mut all = true;
    let df = gpu.upload(f)?;
    let dzero = gpu.zeros::<f32>(t * k)?;
    let official = Numerics { act_quant_fp8: true, ..Default::default() };
    for fmt in ["fp4", "fp8"] {
        let (layer, lw) = test_layer(gpu, seed, &format!("moe_q8.{fmt}"), fmt, e, d, inter, &|_| 1.0)?;
        if fmt == "fp4" {
            all &= check_block_smax(gpu, &layer, fmt, true, out)?;
        }
        let y_ref = moe::moe(cfg, &lw, f, routes, &official);
        let y_hf = moe::moe(cfg, &lw, f, routes, &Numerics::default());
        let shape = json!({"tokens": t, "d": d, "inter": inter, "experts": e, "top_k": k});
        let mut first: Option<Vec<f32>> = None;
        for (vname, opts) in variants() {
            let got = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, &layer, &df, t, dids, dw, opts)?)?;
            let (nmse, max_abs, ref_max) = errors(&got, &y_ref);
            let pass = nmse <= Q8_MOE_NMSE_TOL && got.iter().all(|v| v.is_finite());
            let op = format!("moe_q8 {fmt} {vname} vs cpu");
            println!("{op:<52} nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e}, tol {Q8_MOE_NMSE_TOL:.0e})  {}", if pass { "ok" } else { "FAIL" });
            out.push(json!({"op": op, "shape": shape, "nmse": nmse, "max_abs": max_abs, "ref_max": ref_max, "tolerance_nmse": Q8_MOE_NMSE_TOL, "reference": "cpu, Numerics { act_quant_fp8 }", "pass": pass}));
            all &= pass;
            match &first {
                None => {
                    let (nmse_hf, _, _) = errors(&got, &y_hf);
                    println!("moe_q8 {fmt} all on vs cpu in HF numerics (informational): nmse {nmse_hf:.3e}");
                    out.push(json!({"op": format!("moe_q8 {fmt} vs cpu hf numerics"), "shape": shape, "nmse": nmse_hf, "informational": true}));
                    first = Some(got);
                }
                Some(f0) => {
                    let differ = differing_bits(f0, &got);
                    all &= flag_record(out, &format!("moe_q8 {fmt} {vname} bits"), json!({"differing_values": differ, "of": got.len(), "vs": "all on"}), differ == 0);
                }
            }
        }
        // Decode sizes (MOE_GROUPED_DECODE under TC_LINEAR=fp8): the first 1 and 3 tokens alone, with
        // the defaults (FP4: the gemvs of MOE_DECODE_GEMV) and on the grouped GEMMs.
        let grouped_only = MoeOptions { decode_gemv: None, ..MoeOptions::ALL_ON };
        for ts in [1usize, 3] {
            let (fs, is, ws) = (gpu.upload(&f[..ts * d])?, gpu.upload(&ids[..ts * k])?, gpu.upload(&gpu.download(dw)?[..ts * k])?);
            let want = moe::moe(cfg, &lw, &f[..ts * d], &routes[..ts], &official);
            for (label, opts) in [("", MoeOptions::ALL_ON), (" MOE_DECODE_GEMV=off", grouped_only)] {
                let gemv = gpu.moe_tables(&layer)?.is_some_and(|tb| super::ops_moe::gemv_runs(tb, ts * k, opts));
                let got = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, &layer, &fs, ts, &is, &ws, opts)?)?;
                let (nmse, max_abs, _) = errors(&got, &want);
                let ok = nmse <= Q8_MOE_NMSE_TOL && got.iter().all(|v| v.is_finite());
                all &= flag_record(out, &format!("moe_q8 {fmt} T={ts}{label} vs cpu"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "gemv_ran": gemv}), ok && (gemv == (fmt == "fp4" && label.is_empty())));
            }
        }
        if fmt == "fp4" {
            all &= run_gemv(gpu, cfg, &layer, &lw, f, routes, &df, dids, dw, ids, out)?;
        }
        // The mma.sync kernels (FP8_WGMMA=off) against the same reference.
        let sync = switch_scope(&[("FP8_WGMMA", "off")], || gpu.moe_experts_grouped_q8(cfg, &layer, &df, t, dids, dw, MoeOptions::ALL_ON))?;
        let sync = gpu.download(&sync)?;
        let (nmse, max_abs, ref_max) = errors(&sync, &y_ref);
        let pass = nmse <= Q8_MOE_NMSE_TOL;
        println!("moe_q8 {fmt} mma.sync (FP8_WGMMA=off) vs cpu              nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e})  {}", if pass { "ok" } else { "FAIL" });
        out.push(json!({"op": format!("moe_q8 {fmt} mma.sync vs cpu"), "shape": shape, "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "pass": pass}));
        all &= pass;
        let per_expert = gpu.moe_experts(cfg, &layer, &df, t, ids, dw, true)?;
        let per_expert = gpu.download(&per_expert)?;
        let (nmse, max_abs, ref_max) = errors(&per_expert, &y_ref);
        let pass = nmse <= Q8_MOE_NMSE_TOL;
        println!("moe_q8 {fmt} per-expert vs cpu                        nmse {nmse:.3e}  max_abs {max_abs:.3e}  (ref max {ref_max:.3e})  {}", if pass { "ok" } else { "FAIL" });
        out.push(json!({"op": format!("moe_q8 {fmt} per-expert vs cpu"), "shape": shape, "nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "pass": pass}));
        all &= pass;
        // The warp-specialised kernels (MOE_FP8_WS, on by default: the records above with 128-row
        // tiles ran on them — not tile 64, T=1 / T=3, mma.sync or per-expert; FP4 all on runs moe_wt,
        // which needs MOE_FP8_WS) against moe_w8: the same MMAs and promotion, so the same bits.
        if let Some(f0) = &first {
            let ws_off = switch_scope(&[("MOE_FP8_WS", "off")], || gpu.moe_experts_grouped_q8(cfg, &layer, &df, t, dids, dw, MoeOptions::ALL_ON))?;
            let differ = differing_bits(f0, &gpu.download(&ws_off)?);
            all &= flag_record(out, &format!("moe_q8 {fmt} MOE_FP8_WS=off bits"), json!({"differing_values": differ, "of": f0.len(), "vs": "all on"}), differ == 0);
            // The 256-row tiles (MOE_FP8_WT, FP4 only; the all-on records above ran on them, the
            // forced 128-row tile on moe_ws) against moe_ws: the same MMAs per 64-row sub-tile.
            if fmt == "fp4" {
                let ran = gpu.moe_tables(&layer)?.is_some_and(|tb| gpu.moe_wt_runs(tb, t * k, e, MoeOptions::ALL_ON));
                let wt_off = switch_scope(&[("MOE_FP8_WT", "off")], || gpu.moe_experts_grouped_q8(cfg, &layer, &df, t, dids, dw, MoeOptions::ALL_ON))?;
                let differ = differing_bits(f0, &gpu.download(&wt_off)?);
                all &= flag_record(out, &format!("moe_q8 {fmt} MOE_FP8_WT=off bits"), json!({"differing_values": differ, "of": f0.len(), "vs": "all on", "moe_wt_ran": ran}), differ == 0 && ran);
                all &= down_bf16_records(gpu, cfg, &layer, &df, dids, dw, ids, &y_ref, f0, ran, out)?;
            }
        }
        let masked = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, &layer, &df, t, dids, &dzero, MoeOptions::ALL_ON)?)?;
        let shared = gpu.download(&*gpu.shared_expert(&layer, &df, None, t, d, cfg.swiglu_limit as f32, true)?)?;
        let differ = differing_bits(&masked, &shared);
        all &= flag_record(out, &format!("moe_q8 {fmt} masked"), json!({"differing_values": differ, "of": shared.len(), "vs": "official shared expert alone"}), differ == 0);
    }
    Ok(all)
}

/// `MOE_DOWN_BF16_OUT` on the parity layer (FP4, the 256-row tiles: `wt_ran`): every routed
/// (token, slot) row of the bf16 scatter against the f32 scatter's row rounded to nearest even, bit
/// for bit (`bits`: the same accumulations, rounded as they are stored); the MoE output against the
/// CPU in official numerics (`y_ref`, the FP8 MoE's tolerance) and against the f32 rows' output
/// (`f32_out`, NMSE reported: the switch's own error).
#[allow(clippy::too_many_arguments)]
fn down_bf16_records(gpu: &Gpu, cfg: &flashseek_model::config::Ds4Config, layer: &GpuMoeLayer, df: &cudarc::driver::CudaSlice<f32>, dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, ids: &[i32], y_ref: &[f32], f32_out: &[f32], wt_ran: bool, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    use super::ops_moe::OwnedSlots;
    let (t, d, e) = (ids.len() / cfg.num_experts_per_tok, cfg.hidden_size, cfg.n_routed_experts);
    let (_, plain) = switch_scope(&[("MOE_DOWN_BF16_OUT", "off")], || gpu.moe_grouped_q8_slots(cfg, layer, df, t, dids, dw, MoeOptions::ALL_ON))?;
    let (got, rounded) = switch_scope(&[("MOE_DOWN_BF16_OUT", "on")], || gpu.moe_grouped_q8_slots(cfg, layer, df, t, dids, dw, MoeOptions::ALL_ON))?;
    let got = gpu.download(&got)?;
    let (mut differ, mut compared) = (0usize, 0usize);
    let ran = match (plain, rounded) {
        (Some(OwnedSlots::F32(a)), Some(OwnedSlots::Bf16(b))) => {
            let (a, b) = (gpu.download(&a)?, gpu.download(&b)?);
            for (ts, id) in ids.iter().enumerate() {
                if *id < 0 || *id as usize >= e {
                    continue;
                }
                for j in ts * d..(ts + 1) * d {
                    compared += 1;
                    differ += usize::from(quant::f32_to_bf16(a[j]) != b[j]);
                }
            }
            true
        }
        _ => false,
    };
    let mut all = flag_record(out, "moe_q8 fp4 MOE_DOWN_BF16_OUT bits", json!({"differing_values": differ, "of": compared, "vs": "the f32 scatter's rows rounded to nearest-even bf16", "bf16_rows_ran": ran, "moe_wt_ran": wt_ran}), differ == 0 && compared > 0 && ran && wt_ran);
    let (nmse_f32, max_abs_f32, _) = errors(&got, f32_out);
    println!("moe_q8 fp4 MOE_DOWN_BF16_OUT=on vs the f32 rows' output: nmse {nmse_f32:.3e} max_abs {max_abs_f32:.3e}");
    all &= vs_cpu(out, "moe_q8 fp4 MOE_DOWN_BF16_OUT=on vs cpu", &json!({"tokens": t, "vs_f32_rows_nmse": nmse_f32, "vs_f32_rows_max_abs": max_abs_f32}), &got, y_ref, Q8_MOE_NMSE_TOL);
    Ok(all)
}

/// `MOE_DECODE_GEMV`'s kernels forced on the designed routing (1,000 tokens: every pair one gemv)
/// against the CPU in official numerics, against the grouped GEMMs (reported), with γ = 0 (the
/// shared expert's bits: unrouted weight gives exact zeros) and with some ids outside the experts
/// (skipped like the grouped path skips them: NMSE against it within the MoE tolerance).
#[allow(clippy::too_many_arguments)]
fn run_gemv(gpu: &Gpu, cfg: &flashseek_model::config::Ds4Config, layer: &GpuMoeLayer, lw: &crate::weights::LayerWeights, f: &[f32], routes: &[Route], df: &cudarc::driver::CudaSlice<f32>, dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, ids: &[i32], out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (t, d, k) = (routes.len(), cfg.hidden_size, cfg.num_experts_per_tok);
    let forced = MoeOptions { decode_gemv: Some(usize::MAX), ..MoeOptions::ALL_ON };
    let grouped_only = MoeOptions { decode_gemv: None, ..MoeOptions::ALL_ON };
    let shape = json!({"tokens": t, "d": d, "inter": lw.experts[0].w2.cols, "experts": cfg.n_routed_experts, "top_k": k});
    let mut all = true;
    let official = Numerics { act_quant_fp8: true, ..Default::default() };
    let y_ref = moe::moe(cfg, lw, f, routes, &official);
    let got = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, dids, dw, forced)?)?;
    all &= vs_cpu(out, "moe_q8 fp4 gemv vs cpu", &shape, &got, &y_ref, Q8_MOE_NMSE_TOL);
    all &= gemv_mma_records(gpu, cfg, layer, df, dids, dw, &got, &y_ref, &shape, "moe_q8 fp4 gemv", out)?;
    let grouped = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, dids, dw, grouped_only)?)?;
    let (nmse, max_abs, _) = errors(&got, &grouped);
    println!("moe_q8 fp4 gemv vs grouped (informational): nmse {nmse:.3e} max_abs {max_abs:.3e}");
    out.push(json!({"op": "moe_q8 fp4 gemv vs grouped", "shape": shape, "nmse": nmse, "max_abs": max_abs, "informational": true}));
    let dzero = gpu.zeros::<f32>(t * k)?;
    let masked = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, dids, &dzero, forced)?)?;
    let shared = gpu.download(&*gpu.shared_expert(layer, df, None, t, d, cfg.swiglu_limit as f32, true)?)?;
    let differ = differing_bits(&masked, &shared);
    all &= flag_record(out, "moe_q8 fp4 gemv masked", json!({"differing_values": differ, "of": shared.len(), "vs": "official shared expert alone"}), differ == 0);
    // Every 7th pair's id outside the experts (−1 or E): no expert's output for it on either path.
    let e = cfg.n_routed_experts as i32;
    let holes: Vec<i32> = ids.iter().enumerate().map(|(i, &x)| if i % 7 == 3 { if i % 2 == 0 { -1 } else { e } } else { x }).collect();
    let dholes = gpu.upload(&holes)?;
    let a = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, &dholes, dw, forced)?)?;
    let b = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, &dholes, dw, grouped_only)?)?;
    let (nmse, max_abs, _) = errors(&a, &b);
    let ok = nmse <= Q8_MOE_NMSE_TOL && a.iter().all(|v| v.is_finite());
    all &= flag_record(out, "moe_q8 fp4 gemv unrouted ids vs grouped", json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "unrouted_pairs": holes.iter().filter(|&&x| x < 0 || x >= e).count()}), ok);
    Ok(all)
}

/// `MOE_GEMV_MMA`'s records for one forced-gemv call whose default result is `got` (the tensor-core
/// gemvs, which must have run) and whose CPU reference in official numerics is `want`: the CUDA-core
/// gemvs (`MOE_GEMV_MMA=off`) against the CPU, and the two against each other (NMSE ≤
/// [`Q8_MOE_NMSE_TOL`]; the MMA unit's group sums, not the same bits).
#[allow(clippy::too_many_arguments)]
fn gemv_mma_records(gpu: &Gpu, cfg: &flashseek_model::config::Ds4Config, layer: &GpuMoeLayer, df: &cudarc::driver::CudaSlice<f32>, dids: &cudarc::driver::CudaSlice<i32>, dw: &cudarc::driver::CudaSlice<f32>, got: &[f32], want: &[f32], shape: &Value, label: &str, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let t = df.len() / cfg.hidden_size;
    let forced = MoeOptions { decode_gemv: Some(usize::MAX), ..MoeOptions::ALL_ON };
    let ran = gpu.moe_tables(layer)?.is_some_and(super::ops_moe::gemv_mma_runs);
    let off = switch_scope(&[("MOE_GEMV_MMA", "off")], || gpu.moe_experts_grouped_q8(cfg, layer, df, t, dids, dw, forced))?;
    let off = gpu.download(&*off)?;
    let mut all = vs_cpu(out, &format!("{label} MOE_GEMV_MMA=off vs cpu"), shape, &off, want, Q8_MOE_NMSE_TOL);
    let (nmse, max_abs, _) = errors(got, &off);
    let ok = ran && nmse <= Q8_MOE_NMSE_TOL && got.iter().all(|v| v.is_finite());
    all &= flag_record(out, &format!("{label} mma vs cuda-core gemv"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "mma_ran": ran, "vs": "MOE_GEMV_MMA=off"}), ok);
    // Both warp splits of each tile's groups forced (4: where both widths are multiples of 1,024).
    let tables = gpu.moe_tables(layer)?;
    for ks in [1usize, 4] {
        let ran_ks = tables.map_or(0, |tb| super::ops_moe::gemv_mma_ksplit(tb, t * cfg.num_experts_per_tok, Some(ks)));
        if ran_ks != ks {
            continue;
        }
        let y = gpu.download(&*gpu.moe_experts_grouped_q8(cfg, layer, df, t, dids, dw, MoeOptions { gemv_ksplit: Some(ks), ..forced })?)?;
        all &= vs_cpu(out, &format!("{label} mma k-split {ks} vs cpu"), shape, &y, want, Q8_MOE_NMSE_TOL);
    }
    Ok(all)
}

/// The gemvs at the Flash widths (d 4,096, inter 2,048: 128 and 64 groups per row, several per
/// lane) against the CPU, on 8 FP4 experts and 2 tokens of top-6 (12 pairs, forced): official
/// numerics (tolerance [`Q8_MOE_NMSE_TOL`]) and exact (`SPLIT_NMSE_TOL`).
pub fn run_gemv_flash_widths(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (t, d, inter, e, k) = (2usize, 4096usize, 2048usize, 8usize, 6usize);
    let mut cfg = config(d, e, k, ScoringFunc::SqrtSoftplus, 1.0);
    cfg.moe_intermediate_size = inter;
    // Token 0 on experts 0…5, token 1 on 7, 5, 3, 1, 6, 2 (experts shared and not, slots in other orders).
    let w = random(seed, "moe_gemv_flash.gamma", t * k, 1.0);
    let routes: Vec<Route> = [[0usize, 1, 2, 3, 4, 5], [7, 5, 3, 1, 6, 2]]
        .iter()
        .enumerate()
        .map(|(ti, ex)| Route { experts: ex.to_vec(), weights: (0..k).map(|s| (0.25 + w[ti * k + s].abs()) as f64).collect() })
        .collect();
    let ids: Vec<i32> = routes.iter().flat_map(|r| r.experts.iter().map(|x| *x as i32)).collect();
    let gammas: Vec<f32> = routes.iter().flat_map(|r| r.weights.iter().map(|v| *v as f32)).collect();
    let f = random(seed, "moe_gemv_flash.f", t * d, 2.0);
    let (df, dids, dw) = (gpu.upload(&f)?, gpu.upload(&ids)?, gpu.upload(&gammas)?);
    let (layer, lw) = test_layer(gpu, seed, "moe_gemv_flash.fp4", "fp4", e, d, inter, &|_| 1.0)?;
    let forced = MoeOptions { decode_gemv: Some(usize::MAX), ..MoeOptions::ALL_ON };
    let shape = json!({"tokens": t, "d": d, "inter": inter, "experts": e, "top_k": k});
    let ran = gpu.moe_tables(&layer)?.is_some_and(|tb| super::ops_moe::gemv_runs(tb, t * k, forced));
    let mut all = flag_record(out, "moe gemv flash widths ran", json!({"gemv_runs": ran}), ran);
    let official = Numerics { act_quant_fp8: true, ..Default::default() };
    let got = gpu.download(&*gpu.moe_experts_grouped_q8(&cfg, &layer, &df, t, &dids, &dw, forced)?)?;
    let want = moe::moe(&cfg, &lw, &f, &routes, &official);
    all &= vs_cpu(out, "moe_q8 fp4 gemv flash widths vs cpu", &shape, &got, &want, Q8_MOE_NMSE_TOL);
    all &= gemv_mma_records(gpu, &cfg, &layer, &df, &dids, &dw, &got, &want, &shape, "moe_q8 fp4 gemv flash widths", out)?;
    let got = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &df, t, &dids, &dw, true, forced)?)?;
    all &= vs_cpu(out, "moe_grouped fp4 gemv f32 flash widths vs cpu", &shape, &got, &moe::moe(&cfg, &lw, &f, &routes, &Numerics::default()), SPLIT_NMSE_TOL);
    Ok(all)
}

/// `fp4_block_smax` (the `moe_wt` kernels' block scales, [`super::ops_moe::GpuExpertTables`])
/// against the same rule on the host: every 128 × 128 block's largest group scale byte of w1, w3 and
/// w2 from the uploaded FP4 scales, and the verdict (tables only when every group scale lies within
/// 8 binades of its block's largest and none is 255). `expect_fold`: what this layer must give.
fn check_block_smax(gpu: &Gpu, layer: &GpuMoeLayer, label: &str, expect_fold: bool, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let Some(tables) = gpu.moe_tables(layer)? else {
        return Ok(flag_record(out, &format!("moe_q8 {label} block scales"), json!({"error": "no grouped tables"}), false));
    };
    let (mut want, mut fold, mut differ, mut n) = ([Vec::new(), Vec::new(), Vec::new()], true, 0usize, 0usize);
    for ex in &layer.experts {
        for (i, m) in [&ex.w1, &ex.w3, &ex.w2].into_iter().enumerate() {
            let GpuMatrix::Fp4 { scales, .. } = &m.data else {
                return Ok(flag_record(out, &format!("moe_q8 {label} block scales"), json!({"error": "not FP4"}), false));
            };
            let sc = gpu.download(scales)?;
            let (rows, groups) = (m.rows, m.cols / 32);
            for nb in 0..rows.div_ceil(128) {
                for kb in 0..m.cols / 128 {
                    let block = (nb * 128..rows.min(nb * 128 + 128)).flat_map(|r| sc[r * groups + 4 * kb..r * groups + 4 * kb + 4].to_vec());
                    let (mx, mn) = block.fold((0u8, u8::MAX), |(a, b), v| (a.max(v), b.min(v)));
                    fold &= mx != 255 && mx - mn <= 8;
                    want[i].push(mx);
                }
            }
        }
    }
    if let Some(got) = &tables.block_smax {
        for (g, w) in got.iter().zip(&want) {
            let g = gpu.download(g)?;
            n += w.len();
            differ += super::check::differing_values(&g, w);
        }
    }
    let ok = tables.block_smax.is_some() == fold && fold == expect_fold && differ == 0;
    Ok(flag_record(out, &format!("moe_q8 {label} block scales"), json!({"tables": tables.block_smax.is_some(), "host_rule": fold, "expected": expect_fold, "differing_bytes": differ, "of": n}), ok))
}

/// Times one Flash-shaped MoE layer at several token counts (see the module docs); also checks the
/// warp-specialised FP8 kernels bit for bit against moe_w8 on those shapes (rows with `"pass"`:
/// callers fold them into the verdict with [`timing_checks_pass`]).
pub fn timings(gpu: &Gpu, seed: u64, repeats: usize, tokens: &[usize]) -> Result<Vec<Value>, CudaError> {
    use super::upload::{GpuSource, RandomOfficialSource};
    let cfg = super::bench::flash_config(1);
    let (d, e, k, inter) = (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size);
    let src = RandomOfficialSource::new(&cfg, seed);
    let expert = |q: &str| -> Result<GpuExpert, CudaError> {
        Ok(GpuExpert { w1: src.matrix(gpu, &format!("{q}.w1.weight"), inter, d)?, w2: src.matrix(gpu, &format!("{q}.w2.weight"), d, inter)?, w3: src.matrix(gpu, &format!("{q}.w3.weight"), inter, d)? })
    };
    let layer = GpuMoeLayer {
        gate: GpuWeight { rows: 0, cols: 0, data: GpuMatrix::F32(gpu.zeros_owned::<f32>(1)?) },
        router: GpuRouter::Score { bias: gpu.zeros_owned::<f32>(e)? },
        shared: expert("layers.0.ffn.shared_experts")?,
        experts: (0..e).map(|x| expert(&format!("layers.0.ffn.experts.{x}"))).collect::<Result<_, _>>()?,
        tables: std::sync::OnceLock::new(),
    };
    let repeats = repeats.clamp(1, 10);
    let mut rows = Vec::new();
    for &t in tokens {
        let f = gpu.upload(&random(seed, "moe_time.f", t * d, 1.0))?;
        // Random distinct experts per token (uniform load on average, like a trained router).
        let mut ids = Vec::with_capacity(t * k);
        for ti in 0..t {
            let mut h = crate::testing::fnv1a64(&format!("{seed}:route{ti}"));
            let mut chosen: Vec<i32> = Vec::with_capacity(k);
            while chosen.len() < k {
                h ^= h << 13;
                h ^= h >> 7;
                h ^= h << 17;
                let x = (h % e as u64) as i32;
                if !chosen.contains(&x) {
                    chosen.push(x);
                }
            }
            ids.extend(chosen);
        }
        let dids = gpu.upload(&ids)?;
        // The same layer under a skewed routing: expert popularity log-normal (σ = 0.42), so that
        // pairs per expert spread as the random-weight bench's score layers do (coefficient of
        // variation ~0.43, `gpu-bench --moe-detail`; uniform picks give ~0.07).
        let skewed_ids = skewed_routes(seed, t, k, e, 0.42);
        let skewed = gpu.upload(&skewed_ids)?;
        let dw = gpu.upload(&vec![1.0f32 / k as f32; t * k])?;
        let routed_flops = 2.0 * 3.0 * (t * k) as f64 * (inter * d) as f64;
        let shared_flops = 2.0 * 3.0 * t as f64 * (inter * d) as f64;
        let mut record_time = |name: &str, ms: f64| {
            let tf = (routed_flops + shared_flops) / (ms * 1e-3) / 1e12;
            println!("time moe layer T={t:<6} {name:<32} {ms:8.2} ms  {:8.0} tok/s  {tf:6.1} TFLOP/s (routed + shared)", t as f64 / (ms * 1e-3));
            rows.push(json!({"op": "moe_layer", "variant": name, "tokens": t, "experts": e, "top_k": k, "d": d, "inter": inter, "median_ms": ms, "tok_per_s": t as f64 / (ms * 1e-3), "tflop_per_s": tf, "repeats": repeats}));
        };
        if t <= 2048 {
            let host_ids = ids.clone();
            let ms = median_ms(gpu, repeats.min(3), || gpu.moe_experts(&cfg, &layer, &f, t, &host_ids, &dw, false).map(|_| ()))?;
            record_time("per-expert (grouped off)", ms);
        }
        // The grouped kernels these rows and records name (MOE_DECODE_GEMV would take every call of up
        // to 32 tokens; its own rows force it on and off below).
        let on = MoeOptions { decode_gemv: None, ..MoeOptions::ALL_ON };
        for split in [true, false] {
            let act = if split { "split" } else { "bf16" };
            for (name, opts) in [("all on", on), ("fused off", MoeOptions { fused_swiglu: false, ..on }), ("adaptive off (128)", MoeOptions { adaptive_tiles: false, ..on }), ("tile 64", MoeOptions { force_tile_rows: Some(64), ..on }), ("persistent off", MoeOptions { persistent: false, ..on })] {
                let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, split, opts).map(|_| ()))?;
                record_time(&format!("grouped {act} {name}"), ms);
            }
            let ms = switch_scope(&[("BF16_WGMMA", "off")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, split, on).map(|_| ())))?;
            record_time(&format!("grouped {act} mma.sync all on"), ms);
            if split {
                let ms = switch_scope(&[("MOE_BF16_WS", "off")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, split, on).map(|_| ())))?;
                record_time("grouped split ws off", ms);
            }
        }
        for (name, opts) in [("all on", on), ("fused off", MoeOptions { fused_swiglu: false, ..on }), ("adaptive off (128)", MoeOptions { adaptive_tiles: false, ..on }), ("tile 64", MoeOptions { force_tile_rows: Some(64), ..on }), ("persistent off", MoeOptions { persistent: false, ..on })] {
            let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, opts).map(|_| ()))?;
            record_time(&format!("grouped fp8 wgmma {name}"), ms);
        }
        let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &skewed, &dw, on).map(|_| ()))?;
        record_time("grouped fp8 wgmma all on skewed", ms);
        // MOE_DOWN_BF16_OUT (the 256-row tiles' scatter in bf16, the combine widening it), next to
        // all on again (the pair timed back to back).
        let ms = switch_scope(&[("MOE_DOWN_BF16_OUT", "on")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, on).map(|_| ())))?;
        record_time("grouped fp8 wgmma down bf16 out", ms);
        let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, on).map(|_| ()))?;
        record_time("grouped fp8 wgmma all on (again)", ms);
        let ms = switch_scope(&[("MOE_FP8_WS", "off")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, on).map(|_| ())))?;
        record_time("grouped fp8 wgmma ws off", ms);
        let ms = switch_scope(&[("MOE_FP8_WT", "off")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, on).map(|_| ())))?;
        record_time("grouped fp8 wgmma wt off", ms);
        let t256 = MoeOptions { force_tile_rows: Some(256), ..on };
        let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, t256).map(|_| ()))?;
        record_time("grouped fp8 wgmma tile 256", ms);
        let ms = switch_scope(&[("FP8_WGMMA", "off")], || median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, on).map(|_| ())))?;
        record_time("grouped fp8 mma.sync all on", ms);
        // MOE_DECODE_GEMV: the gemvs forced and switched off at every size up to 64 tokens (where
        // `all on` takes them below MOE_GEMV_MAX_PAIRS), and their outputs against the grouped GEMMs'.
        if t <= 64 {
            let forced = MoeOptions { decode_gemv: Some(usize::MAX), ..on };
            let off = MoeOptions { decode_gemv: None, ..on };
            let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, forced).map(|_| ()))?;
            record_time("gemv (MOE_DECODE_GEMV forced)", ms);
            let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, off).map(|_| ()))?;
            record_time("gemv off (grouped GEMMs)", ms);
            let mma_off = || switch_scope(&[("MOE_GEMV_MMA", "off")], || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, forced));
            let ms = median_ms(gpu, repeats, || mma_off().map(|_| ()))?;
            record_time("gemv MOE_GEMV_MMA=off (CUDA cores)", ms);
            for ks in [1usize, 4] {
                let o = MoeOptions { gemv_ksplit: Some(ks), ..forced };
                let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, o).map(|_| ()))?;
                record_time(&format!("gemv mma k-split {ks} (forced)"), ms);
            }
            let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, true, forced).map(|_| ()))?;
            record_time("gemv f32 (exact, MOE_DECODE_GEMV forced)", ms);
            let ms = median_ms(gpu, repeats, || gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, true, off).map(|_| ()))?;
            record_time("gemv f32 off (grouped split GEMMs)", ms);
            let a = gpu.download(&*gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, forced)?)?;
            let b = gpu.download(&*mma_off()?)?;
            let (nmse, max_abs, _) = super::check::errors(&a, &b);
            let ran = gpu.moe_tables(&layer)?.is_some_and(super::ops_moe::gemv_mma_runs);
            let ok = ran && nmse <= Q8_MOE_NMSE_TOL && a.iter().all(|v| v.is_finite());
            flag_record(&mut rows, &format!("moe_q8 flash T={t} gemv mma vs cuda-core gemv"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "mma_ran": ran, "vs": "MOE_GEMV_MMA=off"}), ok);
            let a = gpu.download(&*gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, forced)?)?;
            let b = gpu.download(&*gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, off)?)?;
            let (nmse, max_abs, _) = super::check::errors(&a, &b);
            let ok = nmse <= Q8_MOE_NMSE_TOL && a.iter().all(|v| v.is_finite());
            flag_record(&mut rows, &format!("moe_q8 flash T={t} gemv vs grouped"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": Q8_MOE_NMSE_TOL, "vs": "MOE_DECODE_GEMV=off (the grouped FP8 GEMMs)"}), ok);
            let a = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, true, forced)?)?;
            let b = gpu.download(&*gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, true, off)?)?;
            let (nmse, max_abs, _) = super::check::errors(&a, &b);
            let ok = nmse <= SPLIT_NMSE_TOL && a.iter().all(|v| v.is_finite());
            flag_record(&mut rows, &format!("moe_grouped flash T={t} gemv f32 vs grouped split"), json!({"nmse": nmse, "max_abs": max_abs, "tolerance_nmse": SPLIT_NMSE_TOL, "vs": "MOE_DECODE_GEMV=off (the grouped split-bf16 GEMMs)"}), ok);
        }
        // Flash shapes (K = 4,096: 32 K steps per unit, many units per block) bit for bit: the
        // warp-specialised kernels against moe_w8, with 128-row tiles forced (the adaptive rule
        // takes 64-row tiles, which moe_ws leaves to moe_w8, below 4,096 tokens).
        let t128 = MoeOptions { force_tile_rows: Some(128), ..on };
        // Both warp-specialised families against their plain twins: official numerics (moe_ws vs
        // moe_w8) and the exact default (moe_wbs vs moe_wb, which also says whether moe_wbs ran).
        type Run<'a> = &'a dyn Fn() -> Result<super::graph::DevBuf<f32>, CudaError>;
        let q8: Run = &|| gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, t128);
        let split: Run = &|| gpu.moe_experts_grouped(&cfg, &layer, &f, t, &dids, &dw, true, t128);
        // And the 256-row tiles (moe_wt, forced) against moe_ws's 128-row ones (the same forcing
        // with MOE_FP8_WT off gives 128).
        let q8_256: Run = &|| gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &dids, &dw, t256);
        // … and under the skewed routing (many 256-row tiles with one or two live sub-tiles).
        let q8_256_skewed: Run = &|| gpu.moe_experts_grouped_q8(&cfg, &layer, &f, t, &skewed, &dw, t256);
        // (the key saying whether the switched kernel ran, its value, and whether the record needs it
        // to have run: moe_wt's compares nothing otherwise).
        type Ran<'a> = Option<(&'a str, bool, bool)>;
        let wt_ran = gpu.moe_tables(&layer)?.is_some_and(|tb| gpu.moe_wt_runs(tb, t * k, e, t256));
        // The moe_wt records need experts whose last 256-row tile has an odd number of live 64-row
        // sub-tiles (one multiply warpgroup a sub-tile short) as well as the others.
        let odd = |ids: &[i32]| super::bench::routing_stats(ids, e)["odd_256"].as_u64().unwrap_or(0);
        let (odd_uniform, odd_skewed) = (odd(&ids), odd(&skewed_ids));
        // (… and, for moe_wt's records, how many experts' last tile has odd live sub-tiles.)
        type Row<'a> = (&'a str, &'a str, Run<'a>, &'a str, Ran<'a>, Option<u64>);
        let runs: [Row; 4] = [
            ("moe_q8", "MOE_FP8_WS", q8, "all on, both with 128-row tiles", None, None),
            ("moe_grouped", "MOE_BF16_WS", split, "all on, both with 128-row tiles", Some(("moe_wbs_ran", wbs_runs(gpu, d, inter, t * k, e, t128), false)), None),
            ("moe_q8", "MOE_FP8_WT", q8_256, "all on with 256-row tiles forced (off: 128)", Some(("moe_wt_ran", wt_ran, true)), Some(odd_uniform)),
            ("moe_q8 skewed", "MOE_FP8_WT", q8_256_skewed, "all on with 256-row tiles forced (off: 128), skewed routing", Some(("moe_wt_ran", wt_ran, true)), Some(odd_skewed)),
        ];
        for (op, switch, run, vs, ran, odd) in runs {
            let ws = gpu.download(&*run()?)?;
            let plain = switch_scope(&[(switch, "off")], run)?;
            let differ = differing_bits(&ws, &gpu.download(&*plain)?);
            let mut detail = json!({"differing_values": differ, "of": ws.len(), "vs": vs, "finite": ws.iter().all(|v| v.is_finite())});
            if let Some((key, r, _)) = ran {
                detail[key] = json!(r);
            }
            let ran_needed = ran.is_none_or(|(_, r, required)| r || !required);
            if let Some(n) = odd {
                detail["experts_odd_last_tile"] = json!(n);
                if n == 0 {
                    // A coverage failure, not a numerics one.
                    detail["coverage"] = json!("no expert with an odd last tile: this routing does not cover moe_wt's idle-warpgroup tiles");
                }
            }
            flag_record(&mut rows, &format!("{op} flash T={t} {switch}=off bits"), detail, differ == 0 && ran_needed && odd.is_none_or(|n| n > 0));
        }
    }
    Ok(rows)
}

/// `t` tokens' top-`k` expert ids (distinct per token) drawn with log-normal expert popularity
/// (weights exp(σ·z_e), z_e standard normal per expert), deterministic in `seed`: a routing whose
/// pairs per expert spread like a router's on real activations (σ 0.42: coefficient of variation
/// ~0.43 over 256 experts) instead of uniformly. `sigma` finite and at most 4 (every expert's weight
/// stays within f64's reach of the total, so that every expert can be drawn and the draws for a
/// token end); `min(k, e)` ids per token.
fn skewed_routes(seed: u64, t: usize, k: usize, e: usize, sigma: f64) -> Vec<i32> {
    debug_assert!(sigma.is_finite() && (0.0..=4.0).contains(&sigma), "σ {sigma}");
    // xorshift64 needs a non-zero state.
    let mut h = crate::testing::fnv1a64(&format!("{seed}:skewed")) | 1;
    let mut next = move || {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        // 53 random bits in (0, 1).
        ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut cum = Vec::with_capacity(e);
    let mut total = 0.0;
    for _ in 0..e {
        // Box–Muller: one standard normal per expert.
        let z = (-2.0 * next().ln()).sqrt() * (2.0 * std::f64::consts::PI * next()).cos();
        total += (sigma * z).exp();
        cum.push(total);
    }
    let k = k.min(e);
    let mut ids = Vec::with_capacity(t * k);
    for _ in 0..t {
        let start = ids.len();
        while ids.len() - start < k {
            let u = next() * total;
            let x = cum.partition_point(|&c| c < u).min(e - 1) as i32;
            if !ids[start..].contains(&x) {
                ids.push(x);
            }
        }
    }
    ids
}

/// Whether every check among timing rows passed (rows without `"pass"` are timings).
pub fn timing_checks_pass(rows: &[Value]) -> bool {
    rows.iter().all(|r| r.get("pass").and_then(Value::as_bool) != Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The skewed routing: distinct ids per token, in range, deterministic, and spread like the
    /// bench's score layers (coefficient of variation of pairs per expert 0.3–0.6 at 8,192 × 6 over
    /// 256 experts; uniform picks ~0.07).
    #[test]
    fn skewed_routes_spread() {
        let (t, k, e) = (8192, 6, 256);
        let ids = skewed_routes(7, t, k, e, 0.42);
        assert_eq!(ids, skewed_routes(7, t, k, e, 0.42));
        assert_eq!(ids.len(), t * k);
        let mut count = vec![0usize; e];
        for tok in ids.chunks(k) {
            for (i, &x) in tok.iter().enumerate() {
                assert!((0..e as i32).contains(&x));
                assert!(!tok[..i].contains(&x));
                count[x as usize] += 1;
            }
        }
        let mean = (t * k) as f64 / e as f64;
        let cv = (count.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / e as f64).sqrt() / mean;
        assert!((0.3..0.6).contains(&cv), "cv {cv}");
    }
}
