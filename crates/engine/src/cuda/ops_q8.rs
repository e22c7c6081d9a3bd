//! FP8 activations on FP8 tensor cores — DeepSeek's official numerics for the GEMMs of spec §10.1
//! (wq_a, wq_b, wkv, wo_b, indexer wq_b, shared and routed w1/w3/w2), the switch `TC_LINEAR=fp8`
//! ([`super::gpu::TcMode::Fp8`]). Host glue of `kernels/gemm_q8.cu`.
//!
//! Numerics (spec §6 "Official activation quantisation"): each activation row is quantized per 128
//! features to e4m3 with a power-of-two (ue8m0) scale; the GEMM sums e4m3 × e4m3 products of each
//! 128-feature block on the tensor cores and adds the block's partial times `s_a·s_w` in f32. The
//! CPU reference of this path is the exact forward with `Numerics { act_quant_fp8: true }` (the
//! quantize-dequantize of the same activations, then exact products in f64): the two differ only in
//! accumulation order and precision. In the MoE the routing weight γ multiplies the hidden before the
//! down projection's quantisation (OFF-M order; `forward::moe::moe`).
//!
//! Where the FP8 kernel cannot run exactly (token counts below
//! [`super::gpu::TC_LINEAR_MIN_TOKENS`], input widths not a multiple of 128, bf16/f32 weights, FP4
//! weights whose scales are not foldable, see [`fp4_fold_exact`]) the activations are quantized and
//! dequantized in place and the existing kernels run on them (a dequantized e4m3 value is exact in
//! bf16), so every path has the same numerics.
//!
//! Learned from DeepSeek's DeepGEMM/`fp8_gemm` design (per-block promotion of FP8 partials into f32,
//! DeepSeek-V3 report §3.3) and the PTX ISA (`mma.sync.m16n8k32` e4m3); the code is ours.

use super::drv;
use super::graph::DevBuf;
use super::cublaslt::LT_MIN_TOKENS;
use super::gpu::{tc_linear_mode, Gpu, GpuMatrix, GpuWeight, TcMode, TC_LINEAR_MIN_TOKENS};
use super::CudaError;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// The entry points of gemm_q8.cu.
pub const GEMM_Q8_ENTRY_POINTS: &[&str] = &[
    "act_quant_fp8",
    "gemm_q8_fp8",
    "gemm_q8_fp4",
    "moe_q8_fp8_128_plain",
    "moe_q8_fp8_128_swiglu",
    "moe_q8_fp8_128_scatter",
    "moe_q8_fp8_64_plain",
    "moe_q8_fp8_64_swiglu",
    "moe_q8_fp8_64_scatter",
    "moe_q8_fp4_128_plain",
    "moe_q8_fp4_128_swiglu",
    "moe_q8_fp4_128_scatter",
    "moe_q8_fp4_64_plain",
    "moe_q8_fp4_64_swiglu",
    "moe_q8_fp4_64_scatter",
    "gemm_w8_fp8",
    "gemm_w8_fp4",
    "moe_w8_fp8_128_plain",
    "moe_w8_fp8_128_swiglu",
    "moe_w8_fp8_128_scatter",
    "moe_w8_fp8_64_plain",
    "moe_w8_fp8_64_swiglu",
    "moe_w8_fp8_64_scatter",
    "moe_w8_fp4_128_plain",
    "moe_w8_fp4_128_swiglu",
    "moe_w8_fp4_128_scatter",
    "moe_w8_fp4_64_plain",
    "moe_w8_fp4_64_swiglu",
    "moe_w8_fp4_64_scatter",
    "moe_ws_fp8_128_plain",
    "moe_ws_fp8_128_swiglu",
    "moe_ws_fp8_128_scatter",
    "moe_ws_fp4_128_plain",
    "moe_ws_fp4_128_swiglu",
    "moe_ws_fp4_128_scatter",
    "moe_wt_fp4_256_plain",
    "moe_wt_fp4_256_swiglu",
    "moe_wt_fp4_256_scatter",
    "moe_wt_fp4_256_scatter_bf16",
    "fp4_block_smax",
    "moe_gather_q8",
    "scale_rows_by_route",
    "lt_scales",
];

/// The kernel family prefixes for the plain GEMM (`gemm_w8` / `gemm_q8`) and the grouped one
/// (`moe_w8` / `moe_q8`): Hopper's warpgroup MMA when the switch `FP8_WGMMA` is on (the default)
/// and the device is sm_90a (elsewhere the w8 kernels are traps), else `mma.sync`.
pub fn families_for(arch: &str) -> (&'static str, &'static str) {
    if crate::switches::on("FP8_WGMMA") && arch == "sm_90a" {
        ("gemm_w8", "moe_w8")
    } else {
        ("gemm_q8", "moe_q8")
    }
}

/// The grouped FP8 GEMM family for `bm`-row tiles: the warp-specialised `moe_ws` kernels when the
/// switch `MOE_FP8_WS` is on (the default), `family` is `moe_w8` with 128-row tiles and the kernels
/// compiled as their register split needs (`ws_ok`, [`super::gpu::Gpu`]'s check at open), else
/// `family` itself.
pub fn moe_family_for(family: &'static str, bm: usize, ws_ok: bool) -> &'static str {
    if family == "moe_w8" && bm == 128 && ws_ok && crate::switches::on("MOE_FP8_WS") {
        "moe_ws"
    } else {
        family
    }
}

/// Threads per block of the `moe_ws` kernels: two multiply warpgroups and two producers
/// (`GWS_THREADS` in gemm_q8.cu).
pub const WS_THREADS: u32 = 512;

/// Whether the grouped FP8 MoE takes 256-row tiles on the `moe_wt` kernels (switch `MOE_FP8_WT`,
/// on by default; like `moe_ws` it needs `MOE_FP8_WS`, so that `MOE_FP8_WS=off` runs `moe_w8`
/// everywhere): FP4 experts whose 128 × 128 blocks convert exactly relative to their largest
/// group scale (`block_fold`, [`super::ops_moe::GpuExpertTables`]), the wgmma family, the kernels
/// compiled as their register split needs (`wt_ok`, [`super::gpu::Gpu`]'s check at open), and
/// either 256-row tiles forced (`force` ≥ 256) or, with adaptive tiles and no forced size, at least
/// [`WT_MIN_TOKENS_PER_EXPERT`] routed pairs per expert on average (`tk` pairs over `e` experts).
#[allow(clippy::too_many_arguments)]
pub fn wt_tiles(format: &str, block_fold: bool, family: &str, wt_ok: bool, force: Option<usize>, adaptive: bool, tk: usize, e: usize) -> bool {
    format == "fp4"
        && block_fold
        && family == "moe_w8"
        && wt_ok
        && crate::switches::on("MOE_FP8_WS")
        && crate::switches::on("MOE_FP8_WT")
        && match force {
            Some(bm) => bm >= 256,
            None => adaptive && tk >= WT_MIN_TOKENS_PER_EXPERT * e.max(1),
        }
}

/// Average routed pairs per expert from which the `moe_wt` kernels' 256-row tiles are taken (a
/// Flash prefill chunk of 8,192 tokens has 192, one of 32,768 — the default — 768): above 128 an
/// expert's rows span two 128-row tiles, each of which converts the expert's weights again. The
/// threshold is not tuned (at 2,048 tokens, 48 per expert, 256-row tiles were slower).
pub const WT_MIN_TOKENS_PER_EXPERT: usize = 128;

/// Threads per block of the `moe_wt` kernels: two multiply warpgroups and one producer
/// (`GWT_THREADS` in gemm_q8.cu).
pub const WT_THREADS: u32 = 384;

/// Registers per thread the `moe_wt` kernels must be compiled to (`__launch_bounds__(384, 1)`):
/// their `setmaxnreg` split 128 × 72 + 256 × 216 = 64,512 = 384 × 168 rests on it (the multiply
/// warpgroups' `setmaxnreg.inc` draws on the registers the producer's `dec` gave back).
pub const WT_REGS: i32 = 168;

/// Registers per thread the `moe_ws` kernels must be compiled to (`__launch_bounds__(512, 1)`: the
/// whole register file): their `setmaxnreg` split 256 × 40 + 256 × 216 = 512 × 128 rests on it.
pub const WS_REGS: i32 = 128;

/// Output columns per block of every gemm_q8.cu GEMM.
pub const Q8_BN: usize = 128;
/// Activation quantisation block (features per scale), spec §6.
pub const Q8_BLOCK: usize = 128;

/// Whether [`Gpu::grouped_linear_lt_fp8`] takes `t` tokens of groups `gin` inputs wide: group g's
/// activation scales start g·(gin/128)·t floats into their token-fastest copy, 16-byte aligned
/// only when (gin/128)·t is a multiple of 4 (always at Flash's gin = 4,096); other shapes stay on
/// the caller's path rather than handing cuBLASLt a less aligned scale pointer.
pub(crate) fn lt_fp8_group_scales_aligned(gin: usize, t: usize) -> bool {
    (gin / Q8_BLOCK * t).is_multiple_of(4)
}

fn bad(detail: impl Into<String>) -> CudaError {
    CudaError::Unsupported { what: "fp8 linear", detail: detail.into() }
}

fn i32_of(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| bad(format!("{what} = {v} does not fit the kernel's 32-bit index")))
}

/// Dynamic shared memory of a gemm_q8.cu block of `bm` × `bn` (mirrors `GqLayout`): 4 stages of
/// (activation tile `bm × 80` + weight tile: FP8 `bn × 80` as stored, FP4 `bn × 32` packed), plus for
/// FP4 two converted e4m3 tiles `bn × 80` and the 72-byte conversion table.
pub fn q8_smem(format: &str, bm: usize, bn: usize) -> usize {
    let fp4 = format == "fp4";
    4 * (bm * 80 + bn * if fp4 { 32 } else { 80 }) + if fp4 { 2 * bn * 80 + 72 } else { 0 }
}

/// Dynamic shared memory of a wgmma block (`GwLayout` in gemm_q8.cu) of `bm` rows × 128 columns:
/// 1 KB of alignment slack, 5 stages for 128-row blocks and 4 for 64-row blocks (two fit an SM) of
/// (A `bm × 128` + B: FP8 `128 × 128`, FP4 `128 × 64` packed), and for FP4 two converted `128 × 128`
/// tiles, two rows of 128 weight scales and the table.
pub fn w8_smem(format: &str, bm: usize) -> usize {
    let fp4 = format == "fp4";
    let stages = if bm == 128 { 5 } else { 4 };
    1024 + stages * (bm * 128 + if fp4 { 128 * 64 } else { 128 * 128 }) + if fp4 { 2 * 128 * 128 + 2 * 128 * 4 + 72 } else { 0 }
}

/// Dynamic shared memory of a warp-specialised block (`GwsLayout` in gemm_q8.cu): 1 KB of
/// alignment slack, then FP4: 5 stages of 44,032 bytes (A 128 × 128, converted B 128 × 128, packed B
/// 128 × 64, 512 scale words, 128 row scales), FP8: 6 stages of 32,768 (A and B 128 × 128); the
/// full and empty barriers (8 bytes each per stage) and, for FP4, the 72-byte table.
pub fn ws_smem(format: &str) -> usize {
    if format == "fp4" {
        1024 + 5 * 44032 + 2 * 5 * 8 + 72
    } else {
        1024 + 6 * 32768 + 2 * 6 * 8
    }
}

/// Dynamic shared memory of a `moe_wt` block (`GwtLayout` in gemm_q8.cu): 1 KB of alignment slack,
/// 3 stages of 49,152 bytes (A 256 × 128, converted B 128 × 128), a packed-weight ring of 3 steps
/// (8,192 bytes each) and its words (3 × 2,560: four scale words and the block scales per producer
/// thread), the epilogue's staging blocks (8 multiply warps × 16 × 40 f32), the full and empty
/// barriers (8 bytes each per stage) and the 72-byte table. 4 stages and the staging blocks would
/// not fit in 227 KB; 3 stages timed as 4 did (`bench/moe_wt_variants_h200.log`, 6492799).
pub const WT_SMEM: usize = 1024 + 3 * 49152 + 3 * 8192 + 3 * 2560 + 8 * 16 * 40 * 4 + 2 * 3 * 8 + 72;

/// The shape rules of [`Gpu::act_quant_grouped`] (x of `x_len` values for `r_cap` rows of `k`,
/// r_cap a multiple of 128, a row-count word, `rows.live` only tiled and covering r_cap), checked
/// before anything is allocated.
fn check_grouped_quant(x_len: usize, r_cap: usize, k: usize, tiled: bool, rows: &GroupedRows<'_>) -> Result<(), CudaError> {
    if x_len < r_cap * k || !r_cap.is_multiple_of(128) {
        return Err(bad(format!("{x_len} values for {r_cap} grouped rows (a multiple of 128) of {k}")));
    }
    if rows.rows.is_empty() {
        return Err(bad("no device word for the grouped row count"));
    }
    if let Some(live) = &rows.live {
        if !tiled || live.len() < r_cap {
            return Err(bad(format!("sub-tile liveness of {} rows for {r_cap} rows ({})", live.len(), if tiled { "tiled" } else { "not tiled" })));
        }
    }
    Ok(())
}

/// Shared memory of any gemm_q8.cu GEMM entry point (by name).
pub fn smem_of(name: &str) -> usize {
    if name.starts_with("moe_wt_") {
        return WT_SMEM;
    }
    let fmt = if name.contains("fp8") { "fp8" } else { "fp4" };
    let bm = if name.contains("_64_") { 64 } else { 128 };
    if name.starts_with("moe_ws_") {
        return ws_smem(fmt);
    }
    if name.starts_with("gemm_w8_") || name.starts_with("moe_w8_") {
        w8_smem(fmt, bm)
    } else {
        q8_smem(fmt, bm, Q8_BN)
    }
}

/// Whether the FP8 kernel converts FP4 weights exactly: every 128-input block of a row has its four
/// ue8m0 group scales within 8 binades of their maximum (e2m1 values times 2^−8…2^0 are all e4m3
/// values) and no NaN scale byte (0xFF); `cols` must be a multiple of 128. `scales` is the stored
/// `[rows, cols/32]` table. DeepSeek's converter re-expresses FP4 experts as FP8 the same way
/// (spec §6, OFF-CV).
pub fn fp4_fold_exact(scales: &[u8], cols: usize) -> bool {
    cols.is_multiple_of(128)
        && scales.len().is_multiple_of(4)
        && scales.chunks_exact(4).all(|c| {
            let (mx, mn) = (*c.iter().max().unwrap_or(&0), *c.iter().min().unwrap_or(&0));
            mx != 255 && mx - mn <= 8
        })
}

/// Whether the official-numerics linears ([`Gpu::linear_official`], [`Gpu::linear_official_bf16`])
/// quantize `t` rows once and run the FP8 GEMM on `w` (at least [`TC_LINEAR_MIN_TOKENS`] rows and
/// [`q8_capable`]) rather than quantize-dequantize and the exact kernels.
pub fn official_runs_q8(t: usize, w: &GpuWeight) -> bool {
    t >= TC_LINEAR_MIN_TOKENS && q8_capable(w)
}

/// Whether [`Gpu::linear_q8`] can run weight `w` exactly: FP8, or foldable FP4, input width a
/// multiple of 128.
pub fn q8_capable(w: &GpuWeight) -> bool {
    w.cols.is_multiple_of(Q8_BLOCK)
        && match &w.data {
            GpuMatrix::Fp8 { .. } => true,
            GpuMatrix::Fp4 { fold, .. } => *fold,
            _ => false,
        }
}

/// Whether [`Gpu::linear_official_multi`] quantizes its input once for all of `outs` (more than
/// one weight, every one [`official_runs_q8`] at `t`, one input width).
pub fn official_multi_shares(t: usize, outs: &[(&GpuWeight, &mut CudaSlice<f32>)]) -> bool {
    outs.len() > 1 && outs.iter().all(|(w, _)| official_runs_q8(t, w) && w.cols == outs[0].0.cols)
}

/// Rows [`Gpu::act_quant`] allocates for `t` tokens: `t` rounded up to 128 (at least 128).
fn act_rows(t: usize) -> usize {
    t.div_ceil(128).max(1) * 128
}

/// Columns (bytes per row) of quantized activations of width `k`: `k` rounded up to the 128-wide
/// scale block.
fn act_cols(k: usize) -> usize {
    k.div_ceil(Q8_BLOCK) * Q8_BLOCK
}

/// Activations quantized for gemm_q8.cu: e4m3 `q` `[rows, kp]` and f32 scales `sa` `[rows, kp/128]`
/// (rows past the valid ones are zero with scale 1; from [`Gpu::act_quant_grouped`], only the rows a
/// grouped tile reads are defined).
pub struct QuantizedActs {
    /// e4m3 bytes `[rows, kp]` (with [`Self::tiled`]: the same bytes in gemm_q8.cu `gq_tiled`'s
    /// order, which only the `moe_wt` kernels and `indexer_topk_wgmma_fp8` / `_scores_` read).
    pub q: DevBuf<u8>,
    /// Power-of-two scale per row and 128-block.
    pub sa: DevBuf<f32>,
    /// Rows allocated (a multiple of 128).
    pub rows: usize,
    /// Input width rounded up to 128.
    pub kp: usize,
    /// Whether `q` is in the tiled layout ([`Gpu::act_quant_layout`]); the plain GEMMs refuse it.
    pub tiled: bool,
}

/// The rows of a grouped MoE buffer that [`Gpu::act_quant_grouped`] quantizes (device pointers
/// into the grouping, ops_moe.rs `Grouping`).
/// Made by ops_moe.rs `Grouping::quantized_rows`.
pub(crate) struct GroupedRows<'a> {
    /// One int: the grouped row count R (`offsets[E]`).
    pub rows: CudaView<'a, i32>,
    /// The grouping's `row_dst` (`[≥ r_cap]`, −1 for padding rows): sub-tiles of padding alone are
    /// skipped (tiled layout only: `moe_wt` skips them too).
    pub live: Option<CudaView<'a, i32>>,
}

impl Gpu {
    #[allow(clippy::too_many_arguments)]
    fn act_quant_launch(&self, x: &CudaSlice<f32>, q: Option<(&mut CudaSlice<u8>, &mut CudaSlice<f32>)>, t: usize, k: usize, tp: usize, tiled: bool, grouped: Option<GroupedRows<'_>>, swiglu: Option<(&CudaSlice<f32>, f32)>) -> Result<(), CudaError> {
        let kb = k.div_ceil(Q8_BLOCK);
        let warps = if q.is_some() { tp * kb } else { t * kb };
        if warps == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (warps.div_ceil(8).min(132 * 64) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (t_i, k_i, tp_i) = (i32_of(t, "tokens")?, i32_of(k, "width")?, i32_of(tp, "rows")?);
        i32_of(tp * kb * Q8_BLOCK, "quantized elements")?;
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f("act_quant_fp8"));
        b.arg(x);
        let rt: i32;
        match q {
            Some((q, sa)) => {
                rt = if tiled { 2 } else { 0 };
                b.arg(q).arg(sa);
            }
            None => {
                rt = 1;
                b.arg(&null).arg(&null);
            }
        }
        b.arg(&t_i).arg(&k_i).arg(&tp_i).arg(&rt);
        match &grouped {
            Some(g) => {
                b.arg(&g.rows);
                match &g.live {
                    Some(live) => b.arg(live),
                    None => b.arg(&null),
                };
            }
            None => {
                b.arg(&null).arg(&null);
            }
        }
        let no_limit = 0f32;
        match &swiglu {
            Some((up, limit)) => b.arg(*up).arg(limit),
            None => b.arg(&null).arg(&no_limit),
        };
        // SAFETY: matches act_quant_fp8(x, q, sa, T, K, Tp, mode, rows, live, up, limit); x (and up
        // when given) holds T·K floats (checked by the callers), q Tp·Kp bytes and sa Tp·Kp/128
        // floats when quantizing (tiled: the same bytes in gq_tiled's order, Tp a multiple of 128);
        // rows one int, live (tiled only) ≥ Tp ints ([`GroupedRows`]).
        drv("act_quant_fp8", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Quantizes `t` rows of `x` (`[t, k]` f32) per 128 features (spec §6): returns e4m3 values and
    /// power-of-two scales with `t` rounded up to 128 rows.
    ///
    /// Errors: `x` shorter than `t·k`, sizes beyond 32-bit indexing, launch failures.
    pub fn act_quant(&self, x: &CudaSlice<f32>, t: usize, k: usize) -> Result<QuantizedActs, CudaError> {
        self.act_quant_layout(x, t, k, false)
    }

    /// [`Gpu::act_quant`] with the e4m3 values in `moe_wt`'s tiled layout when `tiled` (gemm_q8.cu
    /// `gq_tiled`: 64-row × 128-byte swizzled blocks; the scales stay `[rows, k/128]`; with k = 128 also
    /// the key tiles of `indexer_topk_wgmma_fp8`).
    ///
    /// Errors: as [`Gpu::act_quant`].
    pub(crate) fn act_quant_layout(&self, x: &CudaSlice<f32>, t: usize, k: usize, tiled: bool) -> Result<QuantizedActs, CudaError> {
        if x.len() < t * k {
            return Err(bad(format!("{} values for {t} rows of {k}", x.len())));
        }
        let (rows, kp) = (act_rows(t), act_cols(k));
        // SAFETY: every element is written by act_quant_fp8 (rows < Tp, columns < Kp).
        let mut q = unsafe { self.scratch::<u8>(rows * kp) }?;
        // SAFETY: as above, one scale per (row, block).
        let mut sa = unsafe { self.scratch::<f32>(rows * kp / Q8_BLOCK) }?;
        self.act_quant_launch(x, Some((&mut q, &mut sa)), t, k, rows, tiled, None, None)?;
        Ok(QuantizedActs { q, sa, rows, kp, tiled })
    }

    /// [`Gpu::act_quant_layout`] of a grouped MoE's `r_cap` rows of h (`[r_cap, k]`, r_cap a
    /// multiple of 128) that quantizes only the rows a tile reads: those below the grouped row
    /// count (`rows.rows`, on the device) and, with `rows.live` (tiled only), not in a 64-row
    /// sub-tile of padding alone (gemm_q8.cu act_quant_fp8's rows / live). The rows left out
    /// hold whatever the scratch held; no kernel reads them.
    ///
    /// Errors: as [`Gpu::act_quant`]; r_cap not a multiple of 128, no row-count word, `rows.live`
    /// shorter than r_cap or given without `tiled`.
    pub(crate) fn act_quant_grouped(&self, x: &CudaSlice<f32>, r_cap: usize, k: usize, tiled: bool, rows: GroupedRows<'_>) -> Result<QuantizedActs, CudaError> {
        check_grouped_quant(x.len(), r_cap, k, tiled, &rows)?;  // before the scratch is taken
        let kp = act_cols(k);
        // SAFETY: the rows a tile reads are written by act_quant_fp8 (see above); no kernel reads the others.
        let mut q = unsafe { self.scratch::<u8>(r_cap * kp) }?;
        // SAFETY: as above, one scale per (row, block).
        let mut sa = unsafe { self.scratch::<f32>(r_cap * kp / Q8_BLOCK) }?;
        self.act_quant_grouped_into(x, &mut q, &mut sa, r_cap, k, tiled, rows)?;
        Ok(QuantizedActs { q, sa, rows: r_cap, kp, tiled })
    }

    /// [`Gpu::act_quant_grouped`] into the caller's `q` (`[r_cap, kp]` bytes) and `sa` (`[r_cap,
    /// kp/128]`): the rows left out keep what they held (gpu-check fills them first to see that).
    ///
    /// Errors: as [`Gpu::act_quant_grouped`], or `q` / `sa` shorter than that.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn act_quant_grouped_into(&self, x: &CudaSlice<f32>, q: &mut CudaSlice<u8>, sa: &mut CudaSlice<f32>, r_cap: usize, k: usize, tiled: bool, rows: GroupedRows<'_>) -> Result<(), CudaError> {
        check_grouped_quant(x.len(), r_cap, k, tiled, &rows)?;
        let kp = act_cols(k);
        if q.len() < r_cap * kp || sa.len() < r_cap * kp / Q8_BLOCK {
            return Err(bad(format!("{} bytes and {} scales for {r_cap} rows of {kp}", q.len(), sa.len())));
        }
        self.act_quant_launch(x, Some((q, sa)), r_cap, k, r_cap, tiled, Some(rows), None)
    }

    /// [`Gpu::act_quant`] of the SwiGLU `h = silu(min(g, limit))·clamp(u, ±limit)` of `t` rows of
    /// gate `g` and up `u` (`[t, k]` f32 each) without writing h: the same bytes and scales as
    /// [`Gpu::swiglu`] then [`Gpu::act_quant`] (gpu-check `act_quant swiglu … bits`). The shared
    /// expert's down-projection input (spec §4.11 SwiGLU, §10.1 activation quantisation).
    ///
    /// Errors: `g` or `u` shorter than `t·k`, launch failures.
    pub fn act_quant_swiglu(&self, g: &CudaSlice<f32>, u: &CudaSlice<f32>, limit: f32, t: usize, k: usize) -> Result<QuantizedActs, CudaError> {
        if g.len() < t * k || u.len() < t * k {
            return Err(bad(format!("{} gate and {} up values for {t} rows of {k}", g.len(), u.len())));
        }
        let (rows, kp) = (act_rows(t), act_cols(k));
        // SAFETY: every element is written by act_quant_fp8 (rows < Tp, columns < Kp).
        let mut q = unsafe { self.scratch::<u8>(rows * kp) }?;
        // SAFETY: as above, one scale per (row, block).
        let mut sa = unsafe { self.scratch::<f32>(rows * kp / Q8_BLOCK) }?;
        self.act_quant_launch(g, Some((&mut q, &mut sa)), t, k, rows, false, None, Some((u, limit)))?;
        Ok(QuantizedActs { q, sa, rows, kp, tiled: false })
    }

    /// FP8 quantize-dequantize of `t` rows of `x` (`[t, k]`) in place, per 128 features (spec §6,
    /// §10.1): the CPU's `Numerics::act_in`.
    ///
    /// Errors: `x` shorter than `t·k`, launch failures.
    pub fn act_roundtrip(&self, x: &mut CudaSlice<f32>, t: usize, k: usize) -> Result<(), CudaError> {
        if x.len() < t * k {
            return Err(bad(format!("{} values for {t} rows of {k}", x.len())));
        }
        let xr: &CudaSlice<f32> = x;
        self.act_quant_launch(xr, None, t, k, t, false, None, None)
    }

    /// The FP8 GEMM `y[t, n] = Σ_b sa[t, b]·sw[n, b]·Σ_{k∈b} q[t, k]·w[n, k]` for `t` rows of `qa`
    /// (gemm_q8.cu; FP8 weights or foldable FP4, width a multiple of 128, see [`q8_capable`]).
    ///
    /// Errors: a weight [`q8_capable`] rejects, shapes that disagree, launch failures.
    pub fn linear_q8(&self, qa: &QuantizedActs, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        if !q8_capable(w) {
            return Err(bad(format!("weight [{}, {}] is not FP8 or foldable FP4 with a width multiple of 128", w.rows, w.cols)));
        }
        if qa.tiled {
            return Err(bad("activations in the tiled layout (moe_wt's input) given to a plain FP8 GEMM"));
        }
        if qa.kp != w.cols || qa.rows < t.div_ceil(128) * 128 || y.len() < t * w.rows {
            return Err(bad(format!("activations [{}, {}] and {} outputs for {t} tokens of [{}, {}]", qa.rows, qa.kp, y.len(), w.rows, w.cols)));
        }
        if t == 0 || w.rows == 0 {
            return Ok(());
        }
        if t >= LT_MIN_TOKENS && crate::switches::on("FP8_CUBLASLT") && self.linear_lt(qa, w, y, t)? {
            return Ok(());
        }
        let (fmt, wv, s) = match &w.data {
            GpuMatrix::Fp8 { w, scales } => ("fp8", w, scales),
            GpuMatrix::Fp4 { w, scales, .. } => ("fp4", w, scales),
            _ => unreachable!("checked by q8_capable"),
        };
        let blocks = t.div_ceil(128) * w.rows.div_ceil(Q8_BN);
        let name = format!("{}_{fmt}", families_for(&self.arch).0);
        let cfg = LaunchConfig { grid_dim: (u32::try_from(blocks).map_err(|_| bad("grid too large"))?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem_of(&name) as u32 };
        let (t_i, n_i, k_i) = (i32_of(t, "tokens")?, i32_of(w.rows, "outputs")?, i32_of(w.cols, "inputs")?);
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(&qa.q).arg(&qa.sa).arg(wv).arg(s).arg(y).arg(&t_i).arg(&n_i).arg(&k_i);
        // SAFETY: matches gemm_q8_<fmt>(q, sa, W, S, y, T, N, K); q/sa cover 128-row tiles past T,
        // W/S the stored layouts of [N, K], y holds T·N floats; shared memory is the layout's size.
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// One `lt_scales` launch (gemm_q8.cu): `t` tokens' activation scales `sa` (`[t, kb]`, as
    /// act_quant_fp8 writes them) into `sat` token-fastest (`[kb, t]`), and `nb` rows of ue8m0
    /// weight block scales `sw` (`[nb, kb]`) widened into `swf` (`[nb, kbp]`, kbp = kb rounded up
    /// to 4, padding 1.0): the layouts cuBLASLt's block-scaled FP8 GEMM reads. `t` or `nb` may be 0
    /// (that part is skipped).
    ///
    /// Errors: buffers shorter than those sizes, counts past 32-bit indexing, launch failures.
    #[allow(clippy::too_many_arguments)]
    fn lt_scales(&self, sa: &CudaView<'_, f32>, t: usize, kb: usize, sat: &mut CudaViewMut<'_, f32>, sw: &CudaSlice<u8>, nb: usize, swf: &mut CudaViewMut<'_, f32>) -> Result<(), CudaError> {
        let kbp = kb.div_ceil(4) * 4;
        if sa.len() < t * kb || sat.len() < t * kb || sw.len() < nb * kb || swf.len() < nb * kbp {
            return Err(bad(format!(
                "lt_scales: {t} tokens of {kb} blocks and {nb} weight rows need {} + {} activation and {} + {} weight scales; got {} + {} and {} + {}",
                t * kb,
                t * kb,
                nb * kb,
                nb * kbp,
                sa.len(),
                sat.len(),
                sw.len(),
                swf.len()
            )));
        }
        let (t_i, kb_i, nb_i) = (i32_of(t, "tokens")?, i32_of(kb, "blocks")?, i32_of(nb, "blocks")?);
        let work = i32_of(t * kb + nb * kbp, "scales")? as usize;
        let cfg = LaunchConfig { grid_dim: (work.div_ceil(256).clamp(1, 132 * 8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("lt_scales"));
        b.arg(sa).arg(&t_i).arg(&kb_i).arg(sat).arg(sw).arg(&nb_i).arg(swf);
        // SAFETY: matches lt_scales(sa, T, KB, sat, sw, NB, swf) with the sizes checked above.
        drv("lt_scales", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// [`Gpu::linear_q8`] through cuBLASLt's block-scaled FP8 GEMM ([`super::cublaslt`], switch
    /// `FP8_CUBLASLT`): FP8 weights with `rows` a multiple of 128 only. Returns whether it ran;
    /// `false` (`y` not written) when the weight is not FP8, cuBLASLt is unavailable (said once on
    /// stderr) or has no algorithm for the shape.
    ///
    /// Errors: activations or outputs that do not fit the weight and `t`; allocation or launch failures.
    pub fn linear_lt(&self, qa: &QuantizedActs, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<bool, CudaError> {
        use cudarc::driver::DevicePtrMut;
        if y.len() < t * w.rows {
            return Err(bad(format!("{} outputs for {t} tokens of [{}, {}]", y.len(), w.rows, w.cols)));
        }
        let yp = y.device_ptr_mut(&self.stream).0;
        // SAFETY: y holds t·N f32 (checked above) on this stream.
        unsafe { self.linear_lt_to(qa, w, yp, super::cublaslt::LtKind::Fp8BlockScaled, t) }
    }

    /// [`Gpu::linear_lt`] with the output in bf16 (`y` `[t, N]` bf16 bits; [`super::cublaslt::LtKind::Fp8BlockScaledBf16Out`]:
    /// cuBLASLt rounds its f32 result once, round to nearest even).
    ///
    /// Errors: as [`Gpu::linear_lt`].
    pub fn linear_lt_bf16(&self, qa: &QuantizedActs, w: &GpuWeight, y: &mut CudaSlice<u16>, t: usize) -> Result<bool, CudaError> {
        use cudarc::driver::DevicePtrMut;
        if y.len() < t * w.rows {
            return Err(bad(format!("{} bf16 outputs for {t} tokens of [{}, {}]", y.len(), w.rows, w.cols)));
        }
        let yp = y.device_ptr_mut(&self.stream).0;
        // SAFETY: y holds t·N bf16 values (checked above) on this stream.
        unsafe { self.linear_lt_to(qa, w, yp, super::cublaslt::LtKind::Fp8BlockScaledBf16Out, t) }
    }

    /// The shared body of [`Gpu::linear_lt`] / [`Gpu::linear_lt_bf16`]: `kind` one of the FP8 kinds.
    ///
    /// # Safety
    /// `y` must address `t·N` outputs of `kind`'s output type on this GPU, alive until the stream has
    /// run the product.
    unsafe fn linear_lt_to(&self, qa: &QuantizedActs, w: &GpuWeight, y: u64, kind: super::cublaslt::LtKind, t: usize) -> Result<bool, CudaError> {
        use cudarc::driver::DevicePtr;
        let GpuMatrix::Fp8 { w: wv, scales } = &w.data else { return Ok(false) };
        if !w.rows.is_multiple_of(Q8_BLOCK) || !w.cols.is_multiple_of(Q8_BLOCK) || t == 0 {
            return Ok(false);
        }
        if qa.tiled {
            return Err(bad("activations in the tiled layout (moe_wt's input) given to cuBLASLt's FP8 GEMM"));
        }
        if qa.kp != w.cols || qa.rows < t || qa.sa.len() < qa.rows * (qa.kp / Q8_BLOCK) {
            return Err(bad(format!("activations [{}, {}] for {t} tokens of [{}, {}]", qa.rows, qa.kp, w.rows, w.cols)));
        }
        if !self.lt_available() {
            return Ok(false);
        }
        // Weight-scale rows padded to 4 blocks (16 bytes), as cuBLASLt reads them (measured: with
        // K/128 = 2 unpadded rows, half the outputs of a [512, 256] weight were wrong).
        let (kb, nb) = (w.cols / Q8_BLOCK, w.rows / Q8_BLOCK);
        let kbp = kb.div_ceil(4) * 4;
        // SAFETY: both fully written by lt_scales below.
        let mut sat = unsafe { self.scratch::<f32>(kb * t) }?;
        // SAFETY: as above.
        let mut swf = unsafe { self.scratch::<f32>(nb * kbp) }?;
        // qa.sa holds ≥ t·kb floats (qa.rows ≥ t, kp = cols); scales are the stored [N/128, K/128].
        self.lt_scales(&qa.sa.slice(..), t, kb, &mut sat.slice_mut(..), scales, nb, &mut swf.slice_mut(..))?;
        let s = &self.stream;
        let ops = super::cublaslt::LtOperands {
            w: wv.device_ptr(s).0,
            w_scales: swf.device_ptr(s).0,
            x: qa.q.device_ptr(s).0,
            x_scales: sat.device_ptr(s).0,
            y,
            beta: 0.0,
        };
        let shape = super::cublaslt::LtShape { kind, m: t, n: w.rows, k: w.cols, ldb: w.cols, ldd: w.rows };
        // SAFETY: W/scales as stored, q [≥ t, K] e4m3, sat [K/128, t], swf, y t·N outputs of kind's
        // type (the caller's contract), all on this stream; the scale buffers are freed
        // stream-ordered after the product.
        unsafe { self.lt_matmul(&ops, shape) }
    }

    /// The grouped output projection (spec §4.7) in FP8, as vLLM runs DeepSeek-V4's `wo_a` on sm_90
    /// (switch `WO_A_FP8`; `fp8_einsum` with 1 × 128 activation and 128 × 128 weight scales): for
    /// each group g, `z[:, g·r .. (g+1)·r] = Σ_b sa[t, b]·sw_g[n/128, b]·Σ_{k∈b} q[t, k]·w_g[n, k]`
    /// over the group's input columns `g·gin ..` on cuBLASLt's block-scaled FP8 GEMM
    /// ([`super::cublaslt`]), f32 out, rows read and written in place (strides G·gin and G·r).
    /// `q` `[t, G·gin]` e4m3 bytes and `sa` `[t, G·gin/128]` f32 scales in act_quant_fp8's layout
    /// (e.g. the attention kernel's [`super::ops_attention::AttentionOut::Fp8`]); `wo_a` G weights
    /// `[r, gin]`. Returns how many leading groups it computed: 0 when a weight is not FP8 with r
    /// and gin multiples of 128 or cuBLASLt is unavailable, fewer than G when cuBLASLt declines a
    /// group (said once on stderr) — the caller computes the rest — and 0 for shapes that fail
    /// [`lt_fp8_group_scales_aligned`].
    ///
    /// Errors: activations, scales or outputs shorter than `t` tokens of the groups need, a group's
    /// FP8 weight or block scales shorter than `[r, gin]` needs, groups of different shapes, launch
    /// failures.
    pub fn grouped_linear_lt_fp8(&self, q: &CudaSlice<u8>, sa: &CudaSlice<f32>, wo_a: &[GpuWeight], z: &mut CudaSlice<f32>, t: usize) -> Result<usize, CudaError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let Some(w0) = wo_a.first() else { return Ok(0) };
        let (gin, r, groups) = (w0.cols, w0.rows, wo_a.len());
        let (kin, kout) = (groups * gin, groups * r);
        if let Some((g, w)) = wo_a.iter().enumerate().find(|(_, w)| w.cols != gin || w.rows != r) {
            return Err(bad(format!("group {g}'s weight is [{}, {}]; every group must be group 0's [{r}, {gin}]", w.rows, w.cols)));
        }
        if q.len() < t * kin || sa.len() < t * kin / Q8_BLOCK || z.len() < t * kout {
            return Err(bad(format!(
                "{t} tokens of {groups} groups [{r}, {gin}] need at least {} e4m3 inputs, {} scales and {} outputs; got {}, {} and {}",
                t * kin,
                t * kin / Q8_BLOCK,
                t * kout,
                q.len(),
                sa.len(),
                z.len()
            )));
        }
        let (kb, gkb, nb) = (kin / Q8_BLOCK, gin / Q8_BLOCK, r / Q8_BLOCK);
        let gkbp = gkb.div_ceil(4) * 4;
        // Each FP8 group's (block scales, e4m3 weight), their lengths checked.
        let mut fp8: Vec<(&CudaSlice<u8>, &CudaSlice<u8>)> = Vec::with_capacity(groups);
        for (g, w) in wo_a.iter().enumerate() {
            if let GpuMatrix::Fp8 { w: wv, scales } = &w.data {
                if wv.len() < r * gin || scales.len() < nb * gkb {
                    return Err(bad(format!("group {g}'s FP8 weight holds {} values and {} block scales; [{r}, {gin}] needs {} and {}", wv.len(), scales.len(), r * gin, nb * gkb)));
                }
                fp8.push((scales, wv));
            }
        }
        if fp8.len() < groups || t == 0 || !gin.is_multiple_of(Q8_BLOCK) || !r.is_multiple_of(Q8_BLOCK) || !lt_fp8_group_scales_aligned(gin, t) || !self.lt_available() {
            return Ok(0);
        }
        // The activation scales token-fastest for every group at once ([G·gin/128, t]: group g's
        // rows are g·gin/128 ..), each group's weight scales widened to f32 (rows padded to 4 blocks).
        // SAFETY: fully written by the lt_scales launches below.
        let mut sat = unsafe { self.scratch::<f32>(kb * t) }?;
        // SAFETY: as above, nb·gkbp per group.
        let mut swf = unsafe { self.scratch::<f32>(groups * nb * gkbp) }?;
        let s = &self.stream;
        // lt_scales reads one block count for both parts: the activations' (kb per token, no
        // weight rows) in one launch, then each group's weight scales (gkb per row, no tokens).
        let (w0s, _) = fp8[0];
        self.lt_scales(&sa.slice(..t * kb), t, kb, &mut sat.slice_mut(..), w0s, 0, &mut swf.slice_mut(..1))?;
        for (g, (scales, _)) in fp8.iter().enumerate() {
            self.lt_scales(&sa.slice(..1), 0, gkb, &mut sat.slice_mut(..1), scales, nb, &mut swf.slice_mut(g * nb * gkbp..(g + 1) * nb * gkbp))?;
        }
        let (qp, sap, swp, zp) = (q.device_ptr(s).0, sat.device_ptr(s).0, swf.device_ptr(s).0, z.device_ptr_mut(s).0);
        for (g, (_, wv)) in fp8.iter().enumerate() {
            let ops = super::cublaslt::LtOperands {
                w: wv.device_ptr(s).0,
                w_scales: swp + (4 * g * nb * gkbp) as u64,
                x: qp + (g * gin) as u64,
                x_scales: sap + (4 * g * gkb * t) as u64,
                y: zp + (4 * g * r) as u64,
                beta: 0.0,
            };
            let shape = super::cublaslt::LtShape { kind: super::cublaslt::LtKind::Fp8BlockScaled, m: t, n: r, k: gin, ldb: kin, ldd: kout };
            // SAFETY: group g's weight [r, gin] e4m3 and its widened scales [r/128, gkbp]; q rows of
            // kin bytes from column g·gin (t rows, checked); sat rows g·gkb .. of [kb, t]; z rows of
            // kout floats from column g·r (checked); all on this stream, the scale buffers freed
            // stream-ordered after the products.
            if !unsafe { self.lt_matmul(&ops, shape) }? {
                return Ok(g);
            }
        }
        Ok(groups)
    }

    /// [`Gpu::linear_official`] with the output rounded to bf16 (`y` `[t, N]` bf16 bits), as
    /// DeepSeek's `fp8_gemm` writes it (spec §6 "Output is bf16"; switch `WQ_B_BF16_OUT`): on
    /// cuBLASLt's bf16-output FP8 GEMM where `FP8_CUBLASLT` takes the shape (`t ≥`
    /// [`super::cublaslt::LT_MIN_TOKENS`], FP8 weight), else the f32 product of
    /// [`Gpu::linear_official`] rounded to nearest even (gemm_x_bf16). Either way each output is
    /// the bf16 rounding of an f32 sum of the same products (the two differ only where cuBLAS's
    /// accumulation order moves a sum across a rounding boundary). The rounding pass costs a `t·N`
    /// f32 scratch buffer and one more launch: below 256 tokens (decode) and without cuBLASLt the
    /// bf16 output saves its reader's bytes but not the GEMM's.
    ///
    /// Errors: `x` shorter than `t·K` or `y` than `t·N`; `N` not a multiple of 32 (the rounding
    /// pass's rows); as [`Gpu::linear_official`] otherwise.
    pub fn linear_official_bf16(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<u16>, t: usize) -> Result<(), CudaError> {
        if x.len() < t * w.cols || y.len() < t * w.rows {
            return Err(bad(format!("{} inputs and {} bf16 outputs for {t} tokens of [{}, {}]", x.len(), y.len(), w.rows, w.cols)));
        }
        if !w.rows.is_multiple_of(32) {
            return Err(bad(format!("bf16 output of [{}, {}]: needs a multiple of 32 outputs (the rounding pass's rows)", w.rows, w.cols)));
        }
        if t == 0 || w.rows == 0 {
            return Ok(());
        }
        if official_runs_q8(t, w) {
            // The input quantized once, for the bf16-output GEMM or the f32 one that falls back.
            let qa = self.act_quant(x, t, w.cols)?;
            if t >= LT_MIN_TOKENS && crate::switches::on("FP8_CUBLASLT") && self.linear_lt_bf16(&qa, w, y, t)? {
                return Ok(());
            }
            // SAFETY: fully written by the linear below.
            let mut y32 = unsafe { self.scratch::<f32>(t * w.rows) }?;
            self.linear_q8(&qa, w, &mut y32, t)?;
            return self.x_bf16_into(&y32.slice(..), y, t, w.rows, t, false);
        }
        // SAFETY: fully written by the linear below.
        let mut y32 = unsafe { self.scratch::<f32>(t * w.rows) }?;
        self.linear_official(x, w, &mut y32, t)?;
        self.x_bf16_into(&y32.slice(..), y, t, w.rows, t, false)
    }

    /// A §10.1 linear layer (its input FP8-quantized in official numerics): with `TC_LINEAR=fp8`,
    /// [`Gpu::linear_q8`] where it applies (`t ≥` [`TC_LINEAR_MIN_TOKENS`], [`q8_capable`]), else the
    /// input quantize-dequantized ([`Gpu::act_roundtrip`]) and then the exact kernels (bf16 tensor
    /// cores for `t ≥ 64` — exact on dequantized e4m3 inputs — or linear.cu). Any other mode:
    /// [`Gpu::linear`] (HF numerics).
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_q(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        if tc_linear_mode() != TcMode::Fp8 {
            return self.linear(x, w, y, t);
        }
        self.linear_official(x, w, y, t)
    }

    /// Several §10.1 linears of the same input `x` (`[t, k]`): as [`Gpu::linear_q`] on each, but with
    /// `TC_LINEAR=fp8` the input is quantized once for all the weights the FP8 kernel takes (the
    /// values are the same: quantisation is per row and block).
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_q_multi(&self, x: &CudaSlice<f32>, t: usize, outs: &mut [(&GpuWeight, &mut CudaSlice<f32>)]) -> Result<(), CudaError> {
        if tc_linear_mode() == TcMode::Fp8 {
            return self.linear_official_multi(x, t, outs);
        }
        for (w, y) in outs.iter_mut() {
            self.linear(x, w, y, t)?;
        }
        Ok(())
    }

    /// [`Gpu::linear_official`] on several weights of the same input `x` (`[t, k]`), quantizing `x`
    /// once for all of them when the FP8 kernel takes every one (`t ≥`
    /// [`TC_LINEAR_MIN_TOKENS`], [`q8_capable`], one input width).
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_official_multi(&self, x: &CudaSlice<f32>, t: usize, outs: &mut [(&GpuWeight, &mut CudaSlice<f32>)]) -> Result<(), CudaError> {
        if !official_multi_shares(t, outs) {
            for (w, y) in outs.iter_mut() {
                self.linear_official(x, w, y, t)?;
            }
            return Ok(());
        }
        if x.len() < t * outs[0].0.cols {
            return Err(bad(format!("{} inputs for {t} tokens of width {}", x.len(), outs[0].0.cols)));
        }
        let qa = self.act_quant(x, t, outs[0].0.cols)?;
        self.linear_official_multi_q8(&qa, t, outs)
    }

    /// [`Gpu::linear_official_multi`]'s shared path on inputs already quantized: `qa` must be
    /// [`Gpu::act_quant`] of that `x` for these `t` tokens (the MoE's routed experts quantize the
    /// same inputs as its shared expert), and [`official_multi_shares`] must hold.
    ///
    /// Errors: `qa` in the tiled layout or of another width, as [`Gpu::linear_q8`].
    pub(crate) fn linear_official_multi_q8(&self, qa: &QuantizedActs, t: usize, outs: &mut [(&GpuWeight, &mut CudaSlice<f32>)]) -> Result<(), CudaError> {
        if !official_multi_shares(t, outs) {
            return Err(bad(format!("{} weights at {t} tokens do not share one quantisation of their input", outs.len())));
        }
        // act_quant's rows for these t tokens: quantized activations of another token count
        // would be taken for these.
        if qa.rows != act_rows(t) {
            return Err(bad(format!("activations quantized for {} rows given for {t} tokens", qa.rows)));
        }
        for (w, y) in outs.iter_mut() {
            self.linear_q8(qa, w, y, t)?;
        }
        Ok(())
    }

    /// [`Gpu::linear_q`]'s official-numerics path whatever the switch says: FP8-quantized inputs
    /// (spec §6), the FP8 kernel where it applies, else quantize-dequantize and the exact kernels
    /// (below 64 tokens, with `LINEAR_FUSED_QUANT`, both in one launch: [`Gpu::linear_gemv_q`]).
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_official(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        if x.len() < t * w.cols {
            return Err(bad(format!("{} inputs for {t} tokens of width {}", x.len(), w.cols)));
        }
        if official_runs_q8(t, w) {
            let qa = self.act_quant(x, t, w.cols)?;
            return self.linear_q8(&qa, w, y, t);
        }
        // LINEAR_GEMV_MMA: up to 8 tokens of FP8 weights, each 128-value block's products on the
        // tensor cores (the same definition, the MMA unit's sums).
        if crate::switches::on("LINEAR_GEMV_MMA") && Gpu::linear_gemv_mma_takes(t, w) {
            return self.linear_gemv_mma(x, w, y, t);
        }
        // LINEAR_FUSED_QUANT: below 64 tokens the gemv quantize-dequantizes x itself as it stages
        // it (the same bits as the copy, roundtrip and gemv below, in one launch).
        if crate::switches::on("LINEAR_FUSED_QUANT") && Gpu::linear_gemv_q_takes(t, w) {
            return self.linear_gemv_q(x, w, y, t);
        }
        // SAFETY: fully written by the copy below.
        let mut xr = unsafe { self.scratch::<f32>((t * w.cols).max(1)) }?;
        if t * w.cols > 0 {
            drv("copy", self.stream.memcpy_dtod(&x.slice(0..t * w.cols), &mut *xr))?;
        }
        self.act_roundtrip(&mut xr, t, w.cols)?;
        if t >= TC_LINEAR_MIN_TOKENS && !matches!(w.data, GpuMatrix::F32(_)) {
            self.linear_tc(&xr, w, y, t, None, false)
        } else {
            self.linear_gemv(&xr, w, y, t)
        }
    }

    /// `h[r, :] *= γ[dst[r]]` for `rows` rows of width `width` (0 where `dst[r] < 0`): the official
    /// MoE order, γ before the down projection's activation quantisation.
    ///
    /// Errors: short buffers, launch failures.
    pub fn scale_rows_by_route(&self, h: &mut CudaSlice<f32>, dst: &cudarc::driver::CudaView<i32>, gamma: &CudaSlice<f32>, rows: usize, width: usize) -> Result<(), CudaError> {
        if h.len() < rows * width || dst.len() < rows {
            return Err(bad(format!("{} values and {} indices for {rows} rows of {width}", h.len(), dst.len())));
        }
        if rows * width == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: ((rows * width).div_ceil(256).min(132 * 32) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (r_i, w_i) = (i32_of(rows, "rows")?, i32_of(width, "width")?);
        let mut b = self.stream.launch_builder(self.f("scale_rows_by_route"));
        b.arg(h).arg(dst).arg(gamma).arg(&r_i).arg(&w_i);
        // SAFETY: matches scale_rows_by_route(h, dst, gamma, rows, width); every dst entry indexes
        // gamma (built by the caller from its own routing) or is negative.
        drv("scale_rows_by_route", unsafe { b.launch(cfg) }).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_only_on_sm90a() {
        crate::switches::scoped(&[("FP8_WGMMA", "on")], || assert_eq!(families_for("sm_90a"), ("gemm_w8", "moe_w8"))).unwrap();
        assert_eq!(families_for("sm_100"), ("gemm_q8", "moe_q8"));
        crate::switches::scoped(&[("FP8_WGMMA", "off")], || assert_eq!(families_for("sm_90a"), ("gemm_q8", "moe_q8"))).unwrap();
    }

    /// The launch's block size and shared memory are the kernel's (`GWS_THREADS`, `GwsLayout`).
    #[test]
    fn warp_specialised_launch_matches_the_source() {
        let src = include_str!("kernels/gemm_q8.cu");
        assert!(src.contains("#define GWS_PRODUCERS 256 ") && src.contains("#define GWS_THREADS (256 + GWS_PRODUCERS)"));
        assert_eq!(WS_THREADS, 512);
        assert!(src.contains("__launch_bounds__(GWS_THREADS, 1)"));
        // GwsLayout: 1 KB slack + stages + 2 barriers per stage (+ the fp4 table).
        assert!(src.contains("static constexpr int STAGES = FP4 ? 5 : 6;") && src.contains("static constexpr int STAGE = FP4 ? 44032 : 32768;"));
        assert_eq!(ws_smem("fp8"), 1024 + 6 * 32768 + 96);
    }

    #[test]
    fn warp_specialised_moe_only_for_128_row_wgmma_tiles() {
        crate::switches::scoped(&[("MOE_FP8_WS", "on")], || {
            assert_eq!(moe_family_for("moe_w8", 128, true), "moe_ws");
            assert_eq!(moe_family_for("moe_w8", 128, false), "moe_w8", "registers not as the split needs");
            assert_eq!(moe_family_for("moe_w8", 64, true), "moe_w8");
            assert_eq!(moe_family_for("moe_q8", 128, true), "moe_q8");
        })
        .unwrap();
        crate::switches::scoped(&[("MOE_FP8_WS", "off")], || assert_eq!(moe_family_for("moe_w8", 128, true), "moe_w8")).unwrap();
    }

    /// The `moe_wt` launch constants are the kernel's (`GWT_THREADS`, `GwtLayout`, the setmaxnreg
    /// split), and its 256-row tiles are taken only as [`wt_tiles`] says.
    #[test]
    fn tiled_moe_launch_matches_the_source() {
        let src = include_str!("kernels/gemm_q8.cu");
        assert!(src.contains("#define GWT_PRODUCERS 128") && src.contains("#define GWT_THREADS (256 + GWT_PRODUCERS)") && src.contains("#ifndef GWT_LAG\n#define GWT_LAG 2\n#endif"));
        assert!(src.contains("#ifndef GWT_STAGES\n#define GWT_STAGES 3\n#endif") && src.contains("#ifndef GWT_EPI_STAGED\n#define GWT_EPI_STAGED 1\n#endif"));
        assert_eq!(WT_THREADS, 384);
        assert!(src.contains("__launch_bounds__(GWT_THREADS, 1)"));
        // setmaxnreg.inc draws on the registers the block holds: the split must sum to what the
        // launch gave (an 80 / 216 split, 1,024 over, left a multiply warpgroup waiting forever).
        assert!(src.contains("setmaxnreg.dec.sync.aligned.u32 72;") && src.contains("setmaxnreg.inc.sync.aligned.u32 216;"));
        const { assert!(128 * 72 + 256 * 216 == 384 * WT_REGS) };
        assert!(src.contains("static constexpr int STAGES = GWT_STAGES, RAW = GWT_LAG + 1;") && src.contains("static constexpr int A = 0, BC = 32768, STAGE = 49152;"));
        assert!(src.contains("static constexpr int SW = BR + RAW * 8192, SW_SLOT = 5 * GWT_PRODUCERS * 4;"));
        assert!(src.contains("EPS = SW + RAW * SW_SLOT, EPS_WARP = 16 * 40, EPS_BYTES = GWT_EPI_STAGED ? 8 * EPS_WARP * 4 : 0;"));
        assert!(src.contains("static constexpr int BARS = EPS + EPS_BYTES;") && src.contains("static constexpr int LUT = BARS + 2 * STAGES * 8;"));
        assert!(src.contains("static constexpr int TOTAL = 1024 + LUT + 72;"));
        assert_eq!(WT_SMEM, 201_336);
        const { assert!(WT_SMEM <= 227 * 1024) };
        assert_eq!(smem_of("moe_wt_fp4_256_swiglu"), WT_SMEM);
        for epi in ["plain", "swiglu", "scatter"] {
            assert!(GEMM_Q8_ENTRY_POINTS.contains(&format!("moe_wt_fp4_256_{epi}").as_str()));
        }
        crate::switches::scoped(&[("MOE_FP8_WT", "on")], || {
            // 8,192 tokens × top-6 over 256 experts: 192 per expert.
            assert!(wt_tiles("fp4", true, "moe_w8", true, None, true, 8192 * 6, 256));
            assert!(!wt_tiles("fp4", true, "moe_w8", true, None, true, 4096 * 6, 256), "96 per expert");
            assert!(!wt_tiles("fp4", true, "moe_w8", true, None, false, 8192 * 6, 256), "adaptive tiles off");
            assert!(wt_tiles("fp4", true, "moe_w8", true, Some(256), false, 6, 256), "forced");
            assert!(!wt_tiles("fp4", true, "moe_w8", true, Some(128), true, 8192 * 6, 256), "128 forced");
            assert!(!wt_tiles("fp8", true, "moe_w8", true, None, true, 8192 * 6, 256), "FP8 experts");
            assert!(!wt_tiles("fp4", false, "moe_w8", true, Some(256), true, 8192 * 6, 256), "a block's scales span more than 8 binades");
            assert!(!wt_tiles("fp4", true, "moe_q8", true, None, true, 8192 * 6, 256), "mma.sync family");
            assert!(!wt_tiles("fp4", true, "moe_w8", false, None, true, 8192 * 6, 256), "registers not as the split needs");
        })
        .unwrap();
        crate::switches::scoped(&[("MOE_FP8_WT", "off")], || assert!(!wt_tiles("fp4", true, "moe_w8", true, Some(256), true, 8192 * 6, 256))).unwrap();
        crate::switches::scoped(&[("MOE_FP8_WT", "on"), ("MOE_FP8_WS", "off")], || assert!(!wt_tiles("fp4", true, "moe_w8", true, Some(256), true, 8192 * 6, 256), "MOE_FP8_WS=off: moe_w8 everywhere")).unwrap();
    }

    /// gemm_q8.cu's tiled activation layout (`gq_tiled`, mirrored here with common.cuh's `gw_swz`)
    /// is a permutation of the row-major bytes in which the 64 rows × 128 columns that `moe_wt`
    /// copies with one `cp.async.bulk` (block (r / 64)·KT + k / 128) are the 8,192 contiguous bytes
    /// of that block, each 128-byte row holding its own row's bytes with the 16-byte chunks in the
    /// 128-byte swizzle wgmma reads (chunk c at c ^ (row & 7)).
    #[test]
    fn tiled_layout_is_the_bulk_copied_swizzled_blocks() {
        let q8 = include_str!("kernels/gemm_q8.cu");
        let common = include_str!("kernels/common.cuh");
        assert!(q8.contains("return ((size_t)(r >> 6) * KT + (k >> 7)) * 8192 + gw_swz((int)(r & 63), (k & 127) >> 4) + (k & 15);"));
        assert!(common.contains("__device__ __forceinline__ u32 gw_swz(int r, int c) { return (u32)(r * 128 + ((c ^ (r & 7)) << 4)); }"));
        let gw_swz = |r: usize, c: usize| r * 128 + ((c ^ (r & 7)) << 4);
        let tiled = |r: usize, k: usize, kt: usize| ((r >> 6) * kt + (k >> 7)) * 8192 + gw_swz(r & 63, (k & 127) >> 4) + (k & 15);
        let (rows, kp) = (192usize, 512usize);
        let kt = kp / 128;
        let mut seen = vec![false; rows * kp];
        for r in 0..rows {
            for k in 0..kp {
                let o = tiled(r, k, kt);
                assert!(!std::mem::replace(&mut seen[o], true), "({r}, {k}) lands on a taken byte");
                let block = (r / 64) * kt + k / 128;
                assert_eq!(o / 8192, block, "({r}, {k}) outside its bulk-copied block");
                assert_eq!((o % 8192) / 128, r % 64, "({r}, {k}) outside its row of the block");
                assert_eq!((o % 128) / 16, ((k % 128) / 16) ^ (r % 8), "({r}, {k}) not in its swizzled chunk");
            }
        }
        assert!(seen.iter().all(|b| *b));
    }

    /// `__byte_perm(x, y, s)` as the CUDA documentation defines it: output byte k is byte
    /// `s[4k+2 .. 4k]` of the eight bytes (x: 0–3, y: 4–7), replaced by copies of that byte's
    /// sign bit when `s` bit 4k + 3 is set; only the selector's low 16 bits count.
    fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
        let bytes = ((y as u64) << 32) | x as u64;
        (0..4).fold(0u32, |acc, k| {
            let n = (s >> (4 * k)) & 0xf;
            let mut b = ((bytes >> (8 * (n & 7))) & 0xff) as u32;
            if n & 8 != 0 {
                b = if b & 0x80 != 0 { 0xff } else { 0 };
            }
            acc | (b << (8 * k))
        })
    }

    /// gemm_q8.cu's FP4 → e4m3 conversion (`gq_fp4x8` with the table rows of `gq_fill_lut`), as
    /// written there, turns every e2m1 nibble into the e4m3 byte of its value times 2^d, the
    /// sign included, for every table row d = −8 … 0 (its form before 2026-12-01 took the
    /// signs through shifted selectors; both are compared with the e2m1 values here).
    #[test]
    fn fp4_to_e4m3_conversion_is_exact() {
        use flashseek_model::quant::{e2m1_to_f32, e4m3_to_f32, f32_to_e4m3};
        let src = include_str!("kernels/gemm_q8.cu");
        assert!(src.contains("const u32 m = w & 0x77777777u, a = w << 4;"));
        assert!(src.contains("lo = (__byte_perm(a, w, 0x5140u) & 0x80808080u) | __byte_perm(t0, t1, m);"));
        assert!(src.contains("hi = (__byte_perm(a, w, 0x7362u) & 0x80808080u) | __byte_perm(t0, t1, m >> 16);"));
        assert!(src.contains("const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};"));
        let convert = |w: u32, t0: u32, t1: u32| {
            let (m, a) = (w & 0x7777_7777, w << 4);
            let lo = (byte_perm(a, w, 0x5140) & 0x8080_8080) | byte_perm(t0, t1, m);
            let hi = (byte_perm(a, w, 0x7362) & 0x8080_8080) | byte_perm(t0, t1, m >> 16);
            (lo, hi)
        };
        let mut x = 0x9e37_79b9u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for d in -8i32..=0 {
            let f = 2f32.powi(d);
            let mag = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0].map(|v| f32_to_e4m3(v * f) as u32);
            let t0 = mag[0] | mag[1] << 8 | mag[2] << 16 | mag[3] << 24;
            let t1 = mag[4] | mag[5] << 8 | mag[6] << 16 | mag[7] << 24;
            let words = (0..2000).map(|_| next()).collect::<Vec<_>>().into_iter().chain([0, u32::MAX, 0x8888_8888, 0x7777_7777, 0x0123_4567, 0xfedc_ba98]);
            for w in words {
                let (lo, hi) = convert(w, t0, t1);
                for i in 0..8 {
                    let byte = (if i < 4 { lo >> (8 * i) } else { hi >> (8 * (i - 4)) }) as u8;
                    let want = e2m1_to_f32(((w >> (4 * i)) & 0xf) as u8) * f;
                    let got = e4m3_to_f32(byte);
                    assert!(got == want && got.is_sign_negative() == want.is_sign_negative(), "d {d}, word {w:#010x}, element {i}: {got} vs {want}");
                }
            }
        }
    }

    /// common.cuh's branch-free `fs_e8m0_sel` (the `moe_ws` / `moe_wt` multiply warpgroups' block
    /// scales), as written there, decodes every byte as the CPU's `ue8m0_to_f32` (2^-127 for 0,
    /// NaN for 255).
    #[test]
    fn branch_free_e8m0_decode_is_the_cpu_one() {
        let src = include_str!("kernels/common.cuh");
        assert!(src.contains("u32 b = e << 23;\n    b = e == 0u ? 0x00400000u : b;\n    b = e == 255u ? 0x7fc00000u : b;\n    return __uint_as_float(b);"));
        for e in 0u32..=255 {
            let mut b = e << 23;
            b = if e == 0 { 0x0040_0000 } else { b };
            b = if e == 255 { 0x7fc0_0000 } else { b };
            let (got, want) = (f32::from_bits(b), flashseek_model::quant::ue8m0_to_f32(e as u8));
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "byte {e}: {got} vs {want}");
        }
    }

    #[test]
    fn fold_rule() {
        assert!(fp4_fold_exact(&[121, 121, 121, 121, 120, 127, 119, 126], 128));
        assert!(fp4_fold_exact(&[100, 108, 104, 101], 128));
        assert!(!fp4_fold_exact(&[100, 109, 104, 101], 128), "a 9-binade spread underflows e4m3");
        assert!(!fp4_fold_exact(&[255, 250, 250, 250], 128), "NaN scale");
        assert!(!fp4_fold_exact(&[121, 121], 64), "width not a multiple of 128");
    }

    #[test]
    fn smem_fits_hopper() {
        for fmt in ["fp8", "fp4"] {
            for bm in [64, 128] {
                assert!(q8_smem(fmt, bm, Q8_BN) <= 227 * 1024);
            }
        }
        assert_eq!(q8_smem("fp8", 128, 128), 4 * (128 * 80 * 2));
        for name in GEMM_Q8_ENTRY_POINTS.iter().filter(|n| n.contains("_w8_") || n.contains("_q8_") || n.contains("_ws_")) {
            assert!(smem_of(name) <= 227 * 1024, "{name}");
        }
        assert_eq!(ws_smem("fp4"), 221_336);
        assert_eq!(w8_smem("fp8", 128), 1024 + 5 * 32768);
        // 64-row blocks: two per SM (228 KB per SM, 1 KB reserved per block).
        for fmt in ["fp8", "fp4"] {
            assert!(2 * (w8_smem(fmt, 64) + 1024) <= 228 * 1024, "{fmt}");
        }
    }

    /// WO_A_FP8's scale alignment rule: Flash's groups (4,096 inputs, 32 blocks) at any token count;
    /// a 3-block group only at token counts that make the group's scale rows a multiple of 4 floats.
    #[test]
    fn grouped_fp8_scale_alignment_rule() {
        for t in [1usize, 255, 256, 257, 8191] {
            assert!(lt_fp8_group_scales_aligned(4096, t), "{t}");
        }
        assert!(!lt_fp8_group_scales_aligned(384, 257));
        assert!(!lt_fp8_group_scales_aligned(384, 258));
        assert!(lt_fp8_group_scales_aligned(384, 260));
        assert!(lt_fp8_group_scales_aligned(512, 257));
    }

    /// Every entry point listed here is one the kernel file defines (and the reverse for the
    /// `extern "C"` ones), so the NVRTC test checks each of them in the CUBIN.
    #[test]
    fn entry_points_match_the_source() {
        let src = include_str!("kernels/gemm_q8.cu");
        for n in GEMM_Q8_ENTRY_POINTS {
            let direct = src.contains(&format!("void {n}(")) || src.contains(&format!("FP8_GEMM_ENTRY({n},"));
            let ws = (n.starts_with("moe_ws_") && src.contains(&format!("MOE_WS_ENTRY({n},"))) || (n.starts_with("moe_wt_") && src.contains(&format!("MOE_WT_ENTRY({n},")));
            let moe = ["q8", "w8"].iter().find_map(|fam| n.strip_prefix(&format!("moe_{fam}_")).map(|r| (fam, r))).map(|(fam, r)| {
                let f = if r.starts_with("fp8") { "fp8" } else { "fp4" };
                src.contains(&format!("MOE_FP8_FMT({fam}, {}, {f},", *fam == "w8")) && src.contains(&format!("moe_##P##_##F##{}", &r[3..]))
            });
            assert!(direct || ws || moe == Some(true), "{n} is not defined in gemm_q8.cu");
        }
    }
}
