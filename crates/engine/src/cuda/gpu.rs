//! A CUDA device: context (event tracking off, before any allocation), one stream, the compiled
//! kernel modules, and the op launchers.

use super::drv;
use super::graph::DevBuf;
use super::{guard, nvrtc, CudaError, KERNEL_SOURCES};
use crate::cpu::rope::Rope;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::Arc;

/// Makes `ctx` current on this thread (for raw driver calls).
///
/// Errors: the driver refusing (or an error cudarc recorded earlier on the context).
pub(crate) fn drv_bind(ctx: &CudaContext) -> Result<(), CudaError> {
    drv("binding the context", ctx.bind_to_thread())
}

/// The error for host-side work requested while a decode step is being captured.
fn in_capture(what: &str) -> CudaError {
    CudaError::Unsupported { what: "CUDA graph capture", detail: format!("{what} inside a captured decode step (it needs the host to wait for the device)") }
}

/// A weight matrix `[rows, cols]` on the device in its stored format (spec §6).
pub enum GpuMatrix {
    /// f32 `[rows, cols]`.
    F32(CudaSlice<f32>),
    /// bf16 bits `[rows, cols]`.
    Bf16(CudaSlice<u16>),
    /// e4m3 `[rows, cols]` + ue8m0 scales `[ceil(rows/128), ceil(cols/128)]`.
    Fp8 {
        /// Values.
        w: CudaSlice<u8>,
        /// Block scales.
        scales: CudaSlice<u8>,
    },
    /// Packed e2m1 `[rows, cols/2]` + ue8m0 scales `[rows, cols/32]`.
    Fp4 {
        /// Packed values.
        w: CudaSlice<u8>,
        /// Group scales.
        scales: CudaSlice<u8>,
        /// Whether every 128-input block's four scales lie within 8 binades of their maximum
        /// ([`super::ops_q8::fp4_fold_exact`]): then the FP8 tensor-core path (gemm_q8.cu) converts
        /// the values to e4m3 exactly; otherwise `TC_LINEAR=fp8` falls back to the bf16 tensor cores
        /// on quantized activations (same numerics, slower).
        fold: bool,
    },
}

/// A matrix with its shape.
pub struct GpuWeight {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Storage.
    pub data: GpuMatrix,
}

/// Device address tables of G weights of one format and shape (the groups of a grouped linear,
/// e.g. `wo_a`'s 8 groups, spec §4.7): what `linear_<fmt>[_t1]_grouped` (linear.cu) reads to run
/// every group in one launch ([`Gpu::grouped_linear_gemv`]). The addresses stay valid while the
/// weights live: the caller keeps both together (e.g. in one layer).
pub struct GpuGroupTable {
    fmt: &'static str,
    rows: usize,
    cols: usize,
    groups: usize,
    /// Each group's weight values (`[groups]` device addresses).
    w: CudaSlice<u64>,
    /// Each group's scales (0 for f32 and bf16).
    s: CudaSlice<u64>,
}

impl GpuGroupTable {
    /// The tables of `ws`, or `None` when they are empty or differ in format or shape.
    ///
    /// Errors: the upload.
    pub fn build(gpu: &Gpu, ws: &[GpuWeight]) -> Result<Option<Self>, CudaError> {
        let Some(w0) = ws.first() else { return Ok(None) };
        let st = &gpu.stream;
        let entry = |w: &GpuWeight| -> (&'static str, u64, u64) {
            match &w.data {
                GpuMatrix::F32(m) => ("f32", m.device_ptr(st).0, 0),
                GpuMatrix::Bf16(m) => ("bf16", m.device_ptr(st).0, 0),
                GpuMatrix::Fp8 { w, scales } => ("fp8", w.device_ptr(st).0, scales.device_ptr(st).0),
                GpuMatrix::Fp4 { w, scales, .. } => ("fp4", w.device_ptr(st).0, scales.device_ptr(st).0),
            }
        };
        let entries: Vec<_> = ws.iter().map(entry).collect();
        let fmt = entries[0].0;
        if ws.iter().zip(&entries).any(|(w, e)| e.0 != fmt || w.rows != w0.rows || w.cols != w0.cols) {
            return Ok(None);
        }
        let w: Vec<u64> = entries.iter().map(|e| e.1).collect();
        let s: Vec<u64> = entries.iter().map(|e| e.2).collect();
        Ok(Some(GpuGroupTable { fmt, rows: w0.rows, cols: w0.cols, groups: ws.len(), w: gpu.upload(&w)?, s: gpu.upload(&s)? }))
    }
}

/// One CUDA device with the flashseek kernels loaded.
///
/// One thread at a time drives a `Gpu` while a decode step is captured ([`super::graph`]: the
/// capture flag is per device, so another thread's work would be recorded into the graph); the
/// server's engine thread is the only user of its GPU.
pub struct Gpu {
    /// CUDA graphs for decode steps ([`super::graph`]): capture flag, memory pool, kept graphs.
    /// First, so that it is dropped (waiting for queued work, destroying the executables) while
    /// the stream and the kernel modules still exist.
    pub graph: super::graph::GraphState,
    /// The context.
    pub ctx: Arc<CudaContext>,
    /// The stream all ops run on.
    pub stream: Arc<CudaStream>,
    /// Target architecture, e.g. `sm_90a`.
    pub arch: String,
    /// Streaming multiprocessors (read once at [`Gpu::open`]; 132 on an H200 SXM).
    pub sms: usize,
    functions: HashMap<&'static str, CudaFunction>,
    /// Stage marks while profiling ([`Gpu::profile_start`]): (stage that starts here, event).
    profile: std::sync::Mutex<Option<Vec<(&'static str, cudarc::driver::CudaEvent)>>>,
    /// MoE detail ([`Gpu::moe_detail_start`], `gpu-bench --moe-detail`): while `Some`, `moe_forward`
    /// marks its sub-stages (`moe:…`; the grouped FP8 path five, the others `moe:route` and
    /// `moe:experts`) and keeps a device copy of each layer's routed expert ids.
    moe_detail: std::sync::Mutex<Option<Vec<CudaSlice<i32>>>>,
    /// cuBLASLt for `FP8_CUBLASLT`, created at first use (`Err` = why it is unavailable).
    pub(crate) lt: std::sync::Mutex<Option<Result<super::cublaslt::Lt, String>>>,
    /// Whether the warp-specialised `moe_ws_*` kernels compiled to the register count their
    /// `setmaxnreg` split assumes ([`super::ops_q8::WS_REGS`]); otherwise `MOE_FP8_WS` falls back to
    /// `moe_w8` (said once at [`Gpu::open`]).
    pub(crate) moe_ws_ok: bool,
    /// Whether the `moe_wt_*` kernels were compiled to the registers per thread their `setmaxnreg`
    /// split assumes ([`super::ops_q8::WT_REGS`]); otherwise `MOE_FP8_WT` falls back to 128-row
    /// tiles (said at start).
    pub(crate) moe_wt_ok: bool,
    /// The bf16 wgmma attention kernels (`sparse_attention_wg*`, switch `MLA_BF16`) can run: sm_90a
    /// and compiled to [`super::ops_attention::ATTENTION_WG_REGS`] registers (their setmaxnreg split).
    pub(crate) attention_wg_ok: bool,
    /// The candidate-split bf16 attention kernels (`sparse_attention_wc*`, switch
    /// `MLA_BF16_CAND_SPLIT`) can run: `attention_wg_ok`'s conditions for them.
    pub(crate) attention_wc_ok: bool,
}

/// Seconds from event `a` to event `b` (both recorded on one stream; waits for `b`).
///
/// Errors: the driver failing to wait or to measure.
pub fn elapsed_s(a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent) -> Result<f64, CudaError> {
    drv("waiting for an event", b.synchronize())?;
    Ok(drv("measuring between events", a.elapsed_ms(b))? as f64 * 1e-3)
}

/// The stage name that marks the GPU as idle (host work between calls): left out of
/// [`Gpu::profile_finish`]'s table.
pub const IDLE_STAGE: &str = "idle";

/// Time per forward stage from [`Gpu::profile_finish`]: stage name → (milliseconds, marks).
pub type StageTimes = Vec<(&'static str, f64, usize)>;

/// Widest row [`Gpu::rms_norm`] runs one warp per row (`RN_MAXN` in norm.cu).
pub const NORM_ROW_MAX: usize = 1024;
/// Rows per block of `rms_norm_rows_f32` (`RN_ROWS` in norm.cu).
const NORM_ROWS_PER_BLOCK: usize = 8;

/// Whether rows of width `n` go to `rms_norm_rows_f32` (by width only: batch invariance).
fn norm_rows_kernel(n: usize) -> bool {
    n <= NORM_ROW_MAX && n.is_multiple_of(4)
}

/// The rows (`tokens·heads`) of a RoPE over rows of `width` values, after the checks `rope_f32` and
/// `rms_norm_rows_f32` share: an even rotated width ≤ the row and ≤ 2,048 (the block), a table of
/// width/2 frequencies, rows and positions within the kernels' 32-bit indices.
fn rope_rows(rope: &Rope, inv_freq: &CudaSlice<f32>, tokens: usize, heads: usize, width: usize, pos0: usize) -> Result<usize, String> {
    let rows = tokens.checked_mul(heads).ok_or_else(|| format!("{tokens} tokens × {heads} heads overflow"))?;
    if !rope.dim.is_multiple_of(2) || rope.dim > width || rope.dim > 2048 || inv_freq.len() < rope.dim / 2 {
        return Err(format!("rope width {} (table of {}) for rows of {width}: needs an even width ≤ the row (and ≤ 2,048) and a table of width/2", rope.dim, inv_freq.len()));
    }
    if i32::try_from(rows).is_err() || i32::try_from(pos0.saturating_add(tokens)).is_err() {
        return Err(format!("{rows} rows at position {pos0} do not fit the kernels' 32-bit indices"));
    }
    Ok(rows)
}

/// The kernel entry points per source file.
pub(crate) const ENTRY_POINTS: &[(&str, &[&str])] = &[
    ("norm.cu", &["rms_norm_f32", "rms_norm_rows_f32"]),
    ("rope.cu", &["rope_f32"]),
    (
        "linear.cu",
        &[
            "linear_f32",
            "linear_bf16",
            "linear_fp8",
            "linear_fp4",
            "linear_f32_t1",
            "linear_bf16_t1",
            "linear_fp8_t1",
            "linear_fp4_t1",
            "linear_f32_grouped",
            "linear_bf16_grouped",
            "linear_fp8_grouped",
            "linear_fp4_grouped",
            "linear_f32_t1_grouped",
            "linear_bf16_t1_grouped",
            "linear_fp8_t1_grouped",
            "linear_fp4_t1_grouped",
            "linear_f32_q",
            "linear_bf16_q",
            "linear_fp8_q",
            "linear_fp4_q",
            "linear_f32_t1_q",
            "linear_bf16_t1_q",
            "linear_fp8_t1_q",
            "linear_fp4_t1_q",
            "linear_f32_t1p",
            "linear_f32_t1p_q",
            "linear_f32_t1p_grouped",
            "linear_bf16_t1p",
            "linear_bf16_t1p_q",
            "linear_bf16_t1p_grouped",
            "linear_fp8_t1p",
            "linear_fp8_t1p_q",
            "linear_fp8_t1p_grouped",
            "linear_fp4_t1p",
            "linear_fp4_t1p_q",
            "linear_fp4_t1p_grouped",
            "linear_f32_multi",
            "linear_bf16_multi",
            "linear_f32_t1_multi",
            "linear_bf16_t1_multi",
            "linear_f32_t1p_multi",
            "linear_bf16_t1p_multi",
            "linear_fp8_mma_q_ks1",
            "linear_fp8_mma_q_ks2",
            "linear_fp8_mma_q_ks4",
            "linear_fp8_mma_q_ks8",
        ],
    ),
    ("attention.cu", super::ops_attention::ATTENTION_ENTRY_POINTS),
    ("compressor.cu", super::ops_attention::COMPRESSOR_ENTRY_POINTS),
    ("indexer.cu", super::ops_attention::INDEXER_ENTRY_POINTS),
    ("mhc.cu", super::ops_mhc::MHC_ENTRY_POINTS),
    ("moe.cu", super::ops_mhc::MOE_ENTRY_POINTS),
    ("gemm.cu", GEMM_ENTRY_POINTS),
    ("gemm_wb.cu", GEMM_WB_ENTRY_POINTS),
    ("gemm_q8.cu", super::ops_q8::GEMM_Q8_ENTRY_POINTS),
];

/// The entry points of gemm.cu: the activation conversion and, per weight format, the tensor-core
/// GEMM in each mma.sync [`GemmTile`] and the grouped MoE GEMMs `moe_gemm_*`.
pub(crate) const GEMM_ENTRY_POINTS: &[&str] = &[
    "gemm_x_bf16",
    "w_fp8_bf16",
    "gemm_tc_f32",
    "gemm_tc_bf16",
    "gemm_tc_fp8",
    "gemm_tc_fp4",
    "gemm_tc_f32_m",
    "gemm_tc_bf16_m",
    "gemm_tc_fp8_m",
    "gemm_tc_fp4_m",
    "gemm_tc_f32_s",
    "gemm_tc_bf16_s",
    "gemm_tc_fp8_s",
    "gemm_tc_fp4_s",
    "gemm_tc_bf16_x2",
    "gemm_tc_fp8_x2",
    "gemm_tc_fp4_x2",
    "gemm_tc_bf16_m_x2",
    "gemm_tc_fp8_m_x2",
    "gemm_tc_fp4_m_x2",
    "gemm_tc_bf16_s_x2",
    "gemm_tc_fp8_s_x2",
    "gemm_tc_fp4_s_x2",
    "moe_gemm_bf16_128_plain",
    "moe_gemm_bf16_128_swiglu",
    "moe_gemm_bf16_128_scatter",
    "moe_gemm_bf16_64_plain",
    "moe_gemm_bf16_64_swiglu",
    "moe_gemm_bf16_64_scatter",
    "moe_gemm_bf16_128_x2_plain",
    "moe_gemm_bf16_128_x2_swiglu",
    "moe_gemm_bf16_128_x2_scatter",
    "moe_gemm_bf16_64_x2_plain",
    "moe_gemm_bf16_64_x2_swiglu",
    "moe_gemm_bf16_64_x2_scatter",
    "moe_gemm_fp8_128_plain",
    "moe_gemm_fp8_128_swiglu",
    "moe_gemm_fp8_128_scatter",
    "moe_gemm_fp8_64_plain",
    "moe_gemm_fp8_64_swiglu",
    "moe_gemm_fp8_64_scatter",
    "moe_gemm_fp8_128_x2_plain",
    "moe_gemm_fp8_128_x2_swiglu",
    "moe_gemm_fp8_128_x2_scatter",
    "moe_gemm_fp8_64_x2_plain",
    "moe_gemm_fp8_64_x2_swiglu",
    "moe_gemm_fp8_64_x2_scatter",
    "moe_gemm_fp4_128_plain",
    "moe_gemm_fp4_128_swiglu",
    "moe_gemm_fp4_128_scatter",
    "moe_gemm_fp4_64_plain",
    "moe_gemm_fp4_64_swiglu",
    "moe_gemm_fp4_64_scatter",
    "moe_gemm_fp4_128_x2_plain",
    "moe_gemm_fp4_128_x2_swiglu",
    "moe_gemm_fp4_128_x2_scatter",
    "moe_gemm_fp4_64_x2_plain",
    "moe_gemm_fp4_64_x2_swiglu",
    "moe_gemm_fp4_64_x2_scatter",
];

/// gemm.cu's wgmma entry points (switch `BF16_WGMMA`), compiled as the program `gemm_wb.cu`.
pub(crate) const GEMM_WB_ENTRY_POINTS: &[&str] = &[
    "gemm_wb_bf16",
    "gemm_wb_fp8",
    "gemm_wb_fp4",
    "gemm_wb_bf16_x2",
    "gemm_wb_fp8_x2",
    "gemm_wb_fp4_x2",
    "gemm_wb_bf16_w",
    "gemm_wb_fp8_w",
    "gemm_wb_fp4_w",
    "gemm_wb_bf16_w_x2",
    "gemm_wb_fp8_w_x2",
    "gemm_wb_fp4_w_x2",
    "moe_wb_bf16_128_plain",
    "moe_wb_bf16_128_swiglu",
    "moe_wb_bf16_128_scatter",
    "moe_wb_bf16_64_plain",
    "moe_wb_bf16_64_swiglu",
    "moe_wb_bf16_64_scatter",
    "moe_wb_bf16_128_x2_plain",
    "moe_wb_bf16_128_x2_swiglu",
    "moe_wb_bf16_128_x2_scatter",
    "moe_wb_bf16_64_x2_plain",
    "moe_wb_bf16_64_x2_swiglu",
    "moe_wb_bf16_64_x2_scatter",
    "moe_wb_fp8_128_plain",
    "moe_wb_fp8_128_swiglu",
    "moe_wb_fp8_128_scatter",
    "moe_wb_fp8_64_plain",
    "moe_wb_fp8_64_swiglu",
    "moe_wb_fp8_64_scatter",
    "moe_wb_fp8_128_x2_plain",
    "moe_wb_fp8_128_x2_swiglu",
    "moe_wb_fp8_128_x2_scatter",
    "moe_wb_fp8_64_x2_plain",
    "moe_wb_fp8_64_x2_swiglu",
    "moe_wb_fp8_64_x2_scatter",
    "moe_wb_fp4_128_plain",
    "moe_wb_fp4_128_swiglu",
    "moe_wb_fp4_128_scatter",
    "moe_wb_fp4_64_plain",
    "moe_wb_fp4_64_swiglu",
    "moe_wb_fp4_64_scatter",
    "moe_wb_fp4_128_x2_plain",
    "moe_wb_fp4_128_x2_swiglu",
    "moe_wb_fp4_128_x2_scatter",
    "moe_wb_fp4_64_x2_plain",
    "moe_wb_fp4_64_x2_swiglu",
    "moe_wb_fp4_64_x2_scatter",
    "moe_wbs_fp4_128_x2_plain",
    "moe_wbs_fp4_128_x2_swiglu",
    "moe_wbs_fp4_128_x2_scatter",
];

/// Token count from which [`Gpu::linear`] uses the tensor-core GEMM (gemm.cu).
pub const TC_LINEAR_MIN_TOKENS: usize = 64;

/// Tokens per block of linear.cu's multi-token gemvs (`TT`).
const GEMV_TOKENS_PER_BLOCK: usize = 8;

/// Floats of linear.cu's staged input tile (`XS_FLOATS`, 32 KB of shared memory).
const GEMV_STAGED_FLOATS: usize = 8192;

/// The token-count suffix of linear.cu's gemv entry for `t` tokens of weights holding `per`
/// values per 16-byte chunk, and its row-block cap: `""` (8 tokens per block) for `t > 1`; at one
/// token `_t1`, or with `LINEAR_T1_PREFETCH` `_t1p` (the next row's loads issued before the
/// current row is reduced). Row blocks are capped (each block loops over rows, x staged once per
/// block): 1,056 (8 per SM) for the first two; for `_t1p` the blocks its registers let every SM
/// hold at once (3 of 256 threads at its 72 registers, 2 at FP4's 96: `ptxas -v` on NVRTC 13.0),
/// so that no SM starts a second wave while others idle.
fn t1_variant(t: usize, per: usize) -> (&'static str, usize) {
    const MAX_ROW_BLOCKS: usize = 132 * 8;
    match t {
        1 if crate::switches::on("LINEAR_T1_PREFETCH") => ("_t1p", if per == 32 { 132 * 2 } else { 132 * 3 }),
        1 => ("_t1", MAX_ROW_BLOCKS),
        _ => ("", MAX_ROW_BLOCKS),
    }
}

/// Most weights one [`Gpu::linear_multi_into`] launch takes (linear.cu `FS_MULTI_MAX`).
pub const LINEAR_MULTI_MAX: usize = 6;

/// One output of [`Gpu::linear_multi_into`]: weight `w`'s values for token j go to
/// `y[at + j·w.rows ..][.. w.rows]`, with `bias = Some((b, ratio))` (`b`: `[ratio, w.rows]` f32)
/// adding row `(pos0 + j) mod ratio` of `b`.
pub struct MultiOut<'a> {
    /// The weight `[rows, cols]` (f32 or bf16).
    pub w: &'a GpuWeight,
    /// The buffer the outputs go into (f32).
    pub y: &'a mut CudaSlice<f32>,
    /// Offset of token 0's outputs in `y` (values).
    pub at: usize,
    /// The position bias and its period, if any.
    pub bias: Option<(&'a CudaSlice<f32>, usize)>,
}

/// linear.cu's `FsMultiOut` (one weight of a `linear_*_multi` launch), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FsMultiOut {
    w: u64,
    y: u64,
    bias: u64,
    n: i32,
    ldy: i32,
    ratio: i32,
    blocks: i32,
}

/// linear.cu's `FsMulti`: the outputs, their count and the chunk's first position.
#[repr(C)]
#[derive(Clone, Copy)]
struct FsMulti {
    o: [FsMultiOut; LINEAR_MULTI_MAX],
    count: i32,
    pos0: i32,
}

// SAFETY: plain integers in linear.cu's `FsMulti` layout (repr(C), 8-byte aligned, no padding
// between fields: 6 × 40 + 8 bytes).
unsafe impl cudarc::driver::DeviceRepr for FsMulti {}

/// [`Gpu::linear_gemv_q_takes`] on the token count and input width alone.
fn gemv_q_takes_shape(t: usize, cols: usize) -> bool {
    (1..TC_LINEAR_MIN_TOKENS).contains(&t) && cols.is_multiple_of(128) && t.min(GEMV_TOKENS_PER_BLOCK) * cols <= GEMV_STAGED_FLOATS
}

/// Staged e4m3 input bytes of linear.cu's `linear_fp8_mma_q_ks*` (`LGM_XBYTES`): `t · (cols + 16)`
/// at most.
const LGM_XBYTES: usize = 32_768;
/// 128-value blocks per batch of loads in `linear_fp8_mma_q_ks*` (`LGM_U`).
const LGM_U: usize = 2;

/// [`Gpu::linear_gemv_mma_takes`] on the token count and input width alone.
fn gemv_mma_takes_shape(t: usize, cols: usize) -> bool {
    (1..=8).contains(&t) && cols.is_multiple_of(256) && cols <= 8192 && t * (cols + 16) <= LGM_XBYTES
}

/// How many of `linear_fp8_mma_q_ks*`'s 8 warps split each 16-row tile's 128-value blocks for a
/// weight of `rows × cols`: the fewest (1, 2, 4 or 8) that give at least 1,024 warps (8 per SM)
/// among those that divide the row's blocks into whole batches of [`LGM_U`].
pub(crate) fn gemv_mma_ksplit(rows: usize, cols: usize) -> usize {
    let (tiles, kb) = (rows.div_ceil(16), cols / 128);
    let fits = |ks: usize| kb.is_multiple_of(ks * LGM_U);
    [1usize, 2, 4, 8].into_iter().filter(|&ks| fits(ks)).find(|&ks| tiles * ks >= 1024).unwrap_or_else(|| [8usize, 4, 2, 1].into_iter().find(|&ks| fits(ks)).unwrap_or(1))
}

/// How [`Gpu::linear`] runs `T ≥` [`TC_LINEAR_MIN_TOKENS`] tokens (the switch
/// `FLASHSEEK_TC_LINEAR`, read once per process by [`tc_linear_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcMode {
    /// `FLASHSEEK_TC_LINEAR=0`: the exact f32 kernels (linear.cu) for every token count.
    Off,
    /// `FLASHSEEK_TC_LINEAR=bf16`: tensor cores with bf16 activations (weights dequantized exactly
    /// to bf16, f32 weights rounded), f32 accumulation; NMSE ≈ 2e-6 per layer against the f32
    /// reference, which flips some MoE/indexer top-k choices end to end (on H200 the golden and
    /// stored-format prefill checks of `gpu-check` then miss NMSE 1e-4 and 99% top-1). Fastest.
    Bf16,
    /// `FLASHSEEK_TC_LINEAR=split` (the default): tensor cores with split activations x = hi + lo
    /// (two bf16 products per weight, about 16 significant bits of x), f32 accumulation; NMSE ≈
    /// 1e-11 per layer, every `gpu-check` model check passes. f32 weights stay on the exact kernels.
    /// About 1.3–1.9× the time of [`TcMode::Bf16`].
    Split,
    /// `FLASHSEEK_TC_LINEAR=fp8`: DeepSeek's official numerics (spec §10.1) — the inputs of the
    /// §10.1 GEMMs quantized to e4m3 per 128 features and multiplied on FP8 tensor cores
    /// (gemm_q8.cu, [`super::ops_q8`]); every other linear layer as [`TcMode::Split`]. Compared with
    /// the CPU reference run with `Numerics { act_quant_fp8: true }`, not with the HF numerics.
    Fp8,
}

/// The mode when `FLASHSEEK_TC_LINEAR` is unset (or `1`).
pub const TC_LINEAR_DEFAULT: TcMode = TcMode::Split;

/// [`TcMode`] from the switch `TC_LINEAR` (`FLASHSEEK_TC_LINEAR` or `--switch TC_LINEAR=…`: `split`
/// (default, also `1`/`on`), `bf16`, `off`/`0`); see [`crate::switches`]. Read once per process.
pub fn tc_linear_mode() -> TcMode {
    match crate::switches::value("TC_LINEAR") {
        "bf16" => TcMode::Bf16,
        "off" => TcMode::Off,
        "fp8" => TcMode::Fp8,
        _ => TcMode::Split,
    }
}

/// Block tile of the tensor-core GEMM (gemm.cu): tokens × outputs per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmTile {
    /// 128 × 256, 8 warps (`gemm_tc_<fmt>`).
    Large,
    /// 128 × 128, 8 warps (`gemm_tc_<fmt>_m`).
    Medium,
    /// 64 × 64, 4 warps (`gemm_tc_<fmt>_s`).
    Small,
    /// 128 × 128 on Hopper's warpgroup MMA, 2 warpgroups (`gemm_wb_<fmt>`; switch `BF16_WGMMA`):
    /// sm_90a, bf16/FP8/FP4 weights with K a multiple of 64 only ([`Gpu::bf16_wgmma`]).
    Wgmma,
    /// 128 × 256 on the warpgroup MMA (`gemm_wb_<fmt>_w`), where [`GemmTile::Wgmma`] runs.
    WgmmaWide,
}

impl GemmTile {
    /// Every tile; the wgmma ones run only where [`Gpu::bf16_wgmma`] allows them.
    pub const ALL: [GemmTile; 5] = [GemmTile::Large, GemmTile::Medium, GemmTile::Small, GemmTile::Wgmma, GemmTile::WgmmaWide];

    /// The mma.sync tiles (every device and format).
    pub const MMA_SYNC: [GemmTile; 3] = [GemmTile::Large, GemmTile::Medium, GemmTile::Small];

    /// (tokens, outputs, threads) per block and the entry-point suffix.
    pub fn shape(self) -> (usize, usize, usize, &'static str) {
        match self {
            GemmTile::Large => (128, 256, 256, ""),
            GemmTile::Medium => (128, 128, 256, "_m"),
            GemmTile::Small => (64, 64, 128, "_s"),
            GemmTile::Wgmma => (128, 128, 256, ""),
            GemmTile::WgmmaWide => (128, 256, 256, "_w"),
        }
    }

    /// Every (weight format, tile, split activations) gemm.cu has a kernel for: f32 weights only on
    /// the mma.sync tiles with bf16 activations, the other formats on every tile both ways.
    pub fn kernels() -> impl Iterator<Item = (&'static str, GemmTile, bool)> {
        ["f32", "bf16", "fp8", "fp4"]
            .into_iter()
            .flat_map(|fmt| GemmTile::ALL.into_iter().flat_map(move |tile| [false, true].into_iter().map(move |split| (fmt, tile, split))))
            .filter(|(fmt, tile, split)| *fmt != "f32" || !(*split || tile.is_wgmma()))
    }

    /// Whether this is one of the warpgroup-MMA tiles.
    pub fn is_wgmma(self) -> bool {
        matches!(self, GemmTile::Wgmma | GemmTile::WgmmaWide)
    }

    /// The entry point of this tile for weight format `fmt` (`f32`, `bf16`, `fp8`, `fp4`), with
    /// split activations or not.
    pub fn entry(self, fmt: &str, split: bool) -> String {
        let x2 = if split { "_x2" } else { "" };
        match self {
            GemmTile::Wgmma | GemmTile::WgmmaWide => format!("gemm_wb_{fmt}{}{x2}", self.shape().3),
            t => format!("gemm_tc_{fmt}{}{x2}", t.shape().3),
        }
    }

    /// The tile with the least estimated time for `t` tokens and `n` outputs on `sms`
    /// multiprocessors: blocks per SM times the tile's work over its relative throughput (fitted to
    /// H200 timings: Large 1, Medium 0.85; Small 0.8 with four or more blocks per SM, less with
    /// fewer, as four warps alone leave the SM underused).
    pub fn choose(t: usize, n: usize, sms: usize) -> GemmTile {
        let cost = |tile: GemmTile| {
            let (bm, bn, _, _) = tile.shape();
            let per_sm = (t.div_ceil(bm) * n.div_ceil(bn)).div_ceil(sms.max(1));
            let eff = match tile {
                GemmTile::Large => 1.0,
                GemmTile::Medium => 0.85,
                GemmTile::Small => 0.8 * (0.45 + 0.55 * (per_sm.clamp(1, 4) - 1) as f64 / 3.0),
                // Never asked: choose ranks the mma.sync tiles only.
                GemmTile::Wgmma | GemmTile::WgmmaWide => 1.0,
            };
            (per_sm * bm * bn) as f64 / eff
        };
        let mut best = GemmTile::Large;
        for tile in GemmTile::MMA_SYNC {
            if cost(tile) < cost(best) {
                best = tile;
            }
        }
        best
    }
}

/// Dynamic shared memory of a gemm.cu block (mirrors `GmLayout` there): `stages · (activation tile,
/// two with `split` + raw weight tile) + 2 bf16 weight tiles + the FP4 table`; for the wgmma tiles
/// [`wb_smem`] (`GbLayout`).
pub fn gemm_smem_bytes(format: &str, tile: GemmTile, split: bool) -> usize {
    let (bm, bn, _, _) = tile.shape();
    if tile.is_wgmma() {
        return wb_smem(format, bm, bn, split);
    }
    gemm_smem_for(format, bm, bn, split)
}

/// Dynamic shared memory of a gemm.cu wgmma block of `bm` (64 or 128) rows × `bn` (128 or 256)
/// columns (mirrors `GbLayout` there): 1 KB of alignment slack, stages of (the activation tile
/// `bm × 128` bytes per plane + the raw weight tile: bf16 `bn × 128`, FP8 `bn × 64`, FP4 `bn × 32`
/// bytes) — 4 where they fit a block's 227 KB, 3 otherwise and for 64-row split blocks (two per SM)
/// — and for FP8/FP4 two converted `bn × 128`-byte tiles.
pub fn wb_smem(format: &str, bm: usize, bn: usize, split: bool) -> usize {
    let planes = if split { 2 } else { 1 };
    // Raw weight bytes per row and K step (there is no f32 wgmma kernel: its rows would be 256).
    let raw = match format {
        "fp4" => 32,
        "fp8" => 64,
        "bf16" => 128,
        _ => 256,
    };
    let conv = if format == "fp8" || format == "fp4" { 2 * bn * 128 } else { 0 };
    let stage = bm * 128 * planes + bn * raw;
    let stages = if bm == 64 && split || 1024 + 4 * stage + conv > 232_448 { 3 } else { 4 };
    1024 + stages * stage + conv
}

/// [`gemm_smem_bytes`] for any `bm × bn` block tile (the grouped MoE GEMM's tiles too).
pub fn gemm_smem_for(format: &str, bm: usize, bn: usize, split: bool) -> usize {
    let stages = if format == "f32" { 3 } else { 4 };
    let raw_pitch = match format {
        "f32" => 144,
        "bf16" => 80,
        "fp8" => 48,
        _ => 16,
    };
    let btile = if format == "bf16" { 0 } else { bn * 80 };
    let lut = if format == "fp4" { 256 * 32 * 4 } else { 0 };
    stages * (bm * 80 * if split { 2 } else { 1 } + bn * raw_pitch) + 2 * btile + lut
}

/// The kernel [`Gpu::linear`] takes for `t` tokens of weight `w` under the current `TC_LINEAR`:
/// `Some(split)` = [`Gpu::linear_tc`] with or without split activations, `None` = the GEMV.
fn linear_route(t: usize, w: &GpuWeight) -> Option<bool> {
    if t < TC_LINEAR_MIN_TOKENS {
        return None;
    }
    match tc_linear_mode() {
        TcMode::Off => None,
        TcMode::Bf16 => Some(false),
        TcMode::Split | TcMode::Fp8 if !matches!(w.data, GpuMatrix::F32(_)) => Some(true),
        TcMode::Split | TcMode::Fp8 => None,
    }
}

/// Whether [`Gpu::linear_multi`] converts its input once for all of `ws` at `t` tokens, and with
/// `split` or not (`Some(split)`): more than one weight, each of which [`Gpu::linear`] would send to
/// [`Gpu::linear_tc`] with that same `split` under the current `TC_LINEAR`, all of one input width.
pub fn linear_multi_shares<'a>(t: usize, ws: impl IntoIterator<Item = &'a GpuWeight>) -> Option<bool> {
    let mut it = ws.into_iter();
    let first = it.next()?;
    let split = linear_route(t, first)?;
    let mut n = 1;
    for w in it {
        if linear_route(t, w) != Some(split) || w.cols != first.cols {
            return None;
        }
        n += 1;
    }
    (n > 1).then_some(split)
}

/// The format name of a weight (`f32`, `bf16`, `fp8`, `fp4`) and its input-width multiple.
fn format_of(w: &GpuWeight) -> (&'static str, usize) {
    match w.data {
        GpuMatrix::F32(_) => ("f32", 4),
        GpuMatrix::Bf16(_) => ("bf16", 8),
        GpuMatrix::Fp8 { .. } => ("fp8", 16),
        GpuMatrix::Fp4 { .. } => ("fp4", 32),
    }
}

/// Sets the release threshold of the device's default memory pool (the one stream-ordered
/// allocations come from) to "never": memory freed by `cuMemFreeAsync` stays in the pool for the
/// next allocation instead of going back to the driver at every synchronization (the default
/// threshold 0). The forward allocates its temporaries per chunk and per decode step, so without
/// this every step pays for fresh device allocations. Source: CUDA driver API,
/// `cuMemPoolSetAttribute` / `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
///
/// A device without memory pools (cudarc then allocates synchronously) is left as it is.
///
/// Errors: driver errors.
fn keep_freed_memory(ctx: &std::sync::Arc<CudaContext>) -> Result<(), CudaError> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        // No memory pools on this device: cudarc allocates synchronously, nothing to keep.
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver calls on the context's own device; `pool` is written by the driver and
    // the attribute value is a u64 as CU_MEMPOOL_ATTR_RELEASE_THRESHOLD requires.
    unsafe {
        drv("binding the context", ctx.bind_to_thread())?;
        drv("cuDeviceGetDefaultMemPool", sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result())?;
        let mut threshold: u64 = u64::MAX;
        drv(
            "setting the memory pool's release threshold",
            sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut threshold as *mut u64).cast()).result(),
        )?;
    }
    Ok(())
}

impl Gpu {
    /// Opens device `ordinal`, compiles (or loads from `cache_dir`) every kernel for its
    /// architecture (`sm_{major}{minor}`, with the `a` suffix on Hopper to allow wgmma).
    ///
    /// Errors: no driver/device ([`CudaError::Unavailable`]), NVRTC missing or failing, load failures.
    pub fn open(ordinal: usize, cache_dir: &std::path::Path) -> Result<Self, CudaError> {
        let ctx = guard("driver", || CudaContext::new(ordinal))?;
        let ctx = drv("creating the context", ctx)?;
        // SAFETY: called right after creation, before any allocation (cudarc PR #555).
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx)?;
        let (major, minor) = drv("reading the compute capability", ctx.compute_capability())?;
        let arch = if major == 9 { format!("sm_{major}{minor}a") } else { format!("sm_{major}{minor}") };
        // A created (non-blocking) stream: the legacy default stream cannot be captured into a
        // CUDA graph (decode steps, `super::graph`).
        let stream = drv("creating the stream", ctx.new_stream())?;
        if let Some(d) = nvrtc::kernel_defines_in_effect() {
            eprintln!("FLASHSEEK_KERNEL_DEFINES (a development knob): every kernel compiled with {}", d.trim_end().replace('\n', "; "));
        }
        let mut functions = HashMap::new();
        // Every program compiled (or read from the cache) on its own thread: NVRTC compiles
        // separate programs concurrently, and gemm.cu's two halves dominate a cold start.
        let cubins: Vec<Result<Vec<u8>, CudaError>> = std::thread::scope(|scope| {
            let arch = arch.as_str();
            let jobs: Vec<_> = KERNEL_SOURCES.iter().map(|(file, src)| scope.spawn(move || nvrtc::compile_cached(cache_dir, file, src, arch))).collect();
            jobs.into_iter()
                .zip(KERNEL_SOURCES)
                .map(|(job, (file, _))| {
                    job.join().unwrap_or_else(|p| {
                        let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                        Err(CudaError::Compile { file: (*file).into(), arch: arch.into(), log: format!("the compiling thread panicked: {why}") })
                    })
                })
                .collect()
        });
        for ((file, _), cubin) in KERNEL_SOURCES.iter().zip(cubins) {
            let cubin = cubin?;
            let module = drv(&format!("loading {file}"), ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)))?;
            let names = ENTRY_POINTS.iter().find(|(f, _)| f == file).map(|(_, n)| *n).unwrap_or(&[]);
            for name in names {
                functions.insert(*name, drv(&format!("finding {name}"), module.load_function(name))?);
            }
        }
        // gemm.cu blocks use more than 48 KB of dynamic shared memory.
        for (fmt, tile, split) in GemmTile::kernels() {
            let name = tile.entry(fmt, split);
            let bytes = gemm_smem_bytes(fmt, tile, split) as i32;
            let attr = cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            drv(&format!("shared memory of {name}"), functions[name.as_str()].set_attribute(attr, bytes))?;
        }
        {
            let attr = cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            let bytes = super::ops_attention::ATTENTION_TC_SMEM as i32;
            for name in super::ops_attention::ATTENTION_TC_KERNELS {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            let bytes = super::ops_attention::ATTENTION_WG_SMEM as i32;
            for name in super::ops_attention::ATTENTION_WG_KERNELS {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            let bytes = super::ops_attention::ATTENTION_WC_SMEM as i32;
            for name in super::ops_attention::ATTENTION_WC_KERNELS {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            let bytes = super::ops_attention::INDEXER_STREAM_SMEM as i32;
            for name in ["indexer_topk_stream", "indexer_topk_stream_fp8"] {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            let bytes = super::ops_attention::INDEXER_WGMMA_SMEM as i32;
            for name in super::ops_attention::INDEXER_WGMMA_KERNELS {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            // hc_post_mix_f32 / _bf16: their warps' lane-sum rows.
            let bytes = super::ops_mhc::HC_MIX_SMEM as i32;
            for name in ["hc_post_mix_f32", "hc_post_mix_bf16"] {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
            // hc_pre_norm_bf16 / _wide_bf16: a token's bf16 streams.
            let bytes = super::ops_mhc::HC_NORM_STAGE_MAX as i32;
            for name in ["hc_pre_norm_bf16", "hc_pre_norm_wide_bf16"] {
                drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            }
        }
        for name in super::ops_moe::moe_gemm_entry_points() {
            let bytes = super::ops_moe::moe_gemm_entry_smem(name) as i32;
            let attr = cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
        }
        // moe_ws_*: 512 threads at WS_REGS registers each, split by setmaxnreg into 40 (producers)
        // and 216 (multiply warpgroups); with any other count the increase could wait forever.
        let mut moe_ws_ok = true;
        let mut moe_wt_ok = true;
        for name in super::ops_q8::GEMM_Q8_ENTRY_POINTS.iter().filter(|n| n.contains("_q8_") || n.contains("_w8_") || n.contains("_ws_") || n.contains("_wt_")) {
            let bytes = super::ops_q8::smem_of(name) as i32;
            let attr = cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            drv(&format!("shared memory of {name}"), functions[name].set_attribute(attr, bytes))?;
            if name.starts_with("moe_ws_") && moe_ws_ok {
                let regs = drv(&format!("registers of {name}"), functions[name].num_regs())?;
                if regs != super::ops_q8::WS_REGS {
                    eprintln!("MOE_FP8_WS: {name} compiled to {regs} registers per thread, not the {} its setmaxnreg split assumes; the grouped FP8 MoE uses moe_w8", super::ops_q8::WS_REGS);
                    moe_ws_ok = false;
                }
            }
            // moe_wt_*: 384 threads at WT_REGS, split into 72 (producer) and 216 (multiply).
            if name.starts_with("moe_wt_") && moe_wt_ok {
                let regs = drv(&format!("registers of {name}"), functions[name].num_regs())?;
                if regs != super::ops_q8::WT_REGS {
                    eprintln!("MOE_FP8_WT: {name} compiled to {regs} registers per thread, not the {} its setmaxnreg split assumes; the grouped FP8 MoE keeps 128-row tiles", super::ops_q8::WT_REGS);
                    moe_wt_ok = false;
                }
            }
        }
        // The bf16 attention kernels (sparse_attention_wg*, sparse_attention_wc*): 384 threads at
        // ATTENTION_WG_REGS, split by setmaxnreg into 56 (copy) and 224 (multiply); sm_90a only.
        let attention_regs_ok = |names: &[&str], what: &str, fallback: &str| -> Result<bool, CudaError> {
            if arch != "sm_90a" {
                return Ok(false);
            }
            for name in names {
                let regs = drv(&format!("registers of {name}"), functions[*name].num_regs())?;
                if regs != super::ops_attention::ATTENTION_WG_REGS {
                    eprintln!("{what}: {name} compiled to {regs} registers per thread, not the {} its setmaxnreg split assumes; {fallback}", super::ops_attention::ATTENTION_WG_REGS);
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let attention_wg_ok = attention_regs_ok(&super::ops_attention::ATTENTION_WG_KERNELS, "MLA_BF16", "attention keeps the split-bf16 kernels")?;
        let attention_wc_ok = attention_regs_ok(&super::ops_attention::ATTENTION_WC_KERNELS, "MLA_BF16_CAND_SPLIT", "MLA_BF16 keeps sparse_attention_wg")?;
        let graph = super::graph::GraphState::new(ctx.clone());
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(132).max(1) as usize;
        Ok(Gpu { ctx, stream, arch, sms, functions, profile: std::sync::Mutex::new(None), moe_detail: std::sync::Mutex::new(None), lt: std::sync::Mutex::new(None), graph, moe_ws_ok, moe_wt_ok, attention_wg_ok, attention_wc_ok })
    }

    /// Whether the bf16 wgmma attention kernels (switch `MLA_BF16`) run on this device (sm_90a, and
    /// compiled to the register count their setmaxnreg split assumes); elsewhere `MLA_BF16` keeps
    /// the split-bf16 streaming kernels.
    pub fn attention_bf16_ok(&self) -> bool {
        self.attention_wg_ok
    }

    /// Whether the candidate-split bf16 attention kernels (switch `MLA_BF16_CAND_SPLIT`) run on this
    /// device (as [`Gpu::attention_bf16_ok`]); elsewhere `MLA_BF16` keeps `sparse_attention_wg`.
    pub fn attention_cand_split_ok(&self) -> bool {
        self.attention_wc_ok
    }

    /// Records a timing event (`CU_EVENT_DEFAULT`) on the stream.
    ///
    /// Errors: the driver failing to create or record it.
    pub fn record_event(&self) -> Result<cudarc::driver::CudaEvent, CudaError> {
        let ev = drv("creating an event", self.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)))?;
        drv("recording an event", ev.record(&self.stream))?;
        Ok(ev)
    }

    /// Starts recording stage marks (CUDA events on the stream; no synchronisation until
    /// [`Gpu::profile_finish`]).
    pub fn profile_start(&self) {
        *self.profile.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// Whether stage marks are being recorded ([`Gpu::profile_start`]).
    pub fn profiling(&self) -> bool {
        self.profile.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Starts MoE detail (a profiling aid for `gpu-bench --moe-detail`): until
    /// [`Gpu::moe_detail_finish`], `moe_forward` marks its sub-stages with [`Gpu::moe_mark`] (names
    /// `moe:…`; they show only while profiling) and keeps a copy of every layer's expert ids.
    pub fn moe_detail_start(&self) {
        *self.moe_detail.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// Marks MoE sub-stage `name` (as [`Gpu::stage`]) when MoE detail is on; otherwise nothing.
    pub(crate) fn moe_mark(&self, name: &'static str) {
        if self.moe_detail.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            self.stage(name);
        }
    }

    /// Keeps a device copy of a layer's routed expert ids (`[t, k]` i32, the router's output) when
    /// MoE detail is on (an asynchronous copy on the stream: no synchronisation).
    ///
    /// Errors: allocation or copy failures.
    pub(crate) fn moe_detail_ids(&self, experts: &CudaSlice<i32>) -> Result<(), CudaError> {
        let mut g = self.moe_detail.lock().unwrap_or_else(|e| e.into_inner());
        // Not inside a decode graph's capture (no lasting allocation there; the bench profiles
        // prefills only).
        if let (Some(kept), false) = (g.as_mut(), self.graph.capturing()) {
            kept.push(drv("copy", self.stream.clone_dtod(experts))?);
        }
        Ok(())
    }

    /// Stops MoE detail; returns the kept expert ids of each MoE layer call in call order (layers of
    /// the first chunk, then of the next …), downloaded.
    ///
    /// Errors: a failed download.
    pub fn moe_detail_finish(&self) -> Result<Vec<Vec<i32>>, CudaError> {
        let kept = self.moe_detail.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        kept.iter().map(|b| self.download(b)).collect()
    }

    /// Marks that the work queued from here on belongs to stage `name` (until the next mark). A
    /// no-op unless profiling; errors recording the event are ignored (profiling is best effort).
    pub fn stage(&self, name: &'static str) {
        let mut g = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(marks) = g.as_mut() {
            if let Ok(ev) = self.record_event() {
                marks.push((name, ev));
            }
        }
    }

    /// Stops profiling: synchronises, then sums the GPU time between consecutive marks per stage
    /// (the last mark's stage ends at this call), in order of first appearance; time after an
    /// [`IDLE_STAGE`] mark (the host between forward calls) is left out.
    ///
    /// Errors: a failed synchronisation or event query.
    pub fn profile_finish(&self) -> Result<StageTimes, CudaError> {
        self.stage(IDLE_STAGE);
        let marks = self.profile.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        self.sync()?;
        let mut out: StageTimes = Vec::new();
        for w in marks.windows(2).filter(|w| w[0].0 != IDLE_STAGE) {
            let ms = drv("event elapsed", w[0].1.elapsed_ms(&w[1].1))? as f64;
            match out.iter_mut().find(|(n, _, _)| *n == w[0].0) {
                Some(e) => {
                    e.1 += ms;
                    e.2 += 1;
                }
                None => out.push((w[0].0, ms, 1)),
            }
        }
        Ok(out)
    }

    /// The loaded kernel `name` (an entry point listed for its source file).
    pub fn f(&self, name: &str) -> &CudaFunction {
        &self.functions[name]
    }

    /// Copies host data to a new device buffer that lives as long as the caller keeps it (weights,
    /// states).
    ///
    /// Errors: driver errors; a call while a decode step is being captured.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        if self.graph.capturing() {
            return Err(in_capture("an upload from pageable memory"));
        }
        drv("upload", self.stream.clone_htod(data))
    }

    /// Copies host data to a temporary device buffer of the forward: an ordinary upload, or while
    /// a decode step is being captured a copy recorded from pinned staging memory into a graph-pool
    /// block ([`super::graph`]).
    ///
    /// Errors: driver errors.
    pub fn stage_upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<DevBuf<T>, CudaError> {
        if self.graph.capturing() {
            return self.graph.pooled_upload(&self.stream, data);
        }
        drv("upload", self.stream.clone_htod(data)).map(DevBuf::plain)
    }

    /// Copies device data to the host (synchronizes the stream).
    ///
    /// Errors: driver errors; a call while a decode step is being captured.
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(&self, data: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        if self.graph.capturing() {
            return Err(in_capture("a download"));
        }
        drv("download", self.stream.clone_dtoh(data))
    }

    /// Copies the elements `range` of `data` to the host (synchronizes the stream; an empty range
    /// copies nothing).
    ///
    /// Errors: a range past the end of `data`, driver errors, a call while a decode step is being
    /// captured.
    pub fn download_range<T: cudarc::driver::DeviceRepr + Default + Clone>(&self, data: &CudaSlice<T>, range: std::ops::Range<usize>) -> Result<Vec<T>, CudaError> {
        if range.end > data.len() || range.start > range.end {
            return Err(CudaError::Unsupported { what: "download", detail: format!("elements {range:?} of a buffer of {}", data.len()) });
        }
        if range.is_empty() {
            return Ok(Vec::new());
        }
        if self.graph.capturing() {
            return Err(in_capture("a download"));
        }
        drv("download", self.stream.clone_dtoh(&data.slice(range)))
    }

    /// Zero-filled temporary device buffer: a stream-ordered allocation, or while a decode step is
    /// being captured a block of the graph pool ([`super::graph`]).
    ///
    /// Errors: allocation failures.
    pub fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> Result<DevBuf<T>, CudaError> {
        if self.graph.capturing() {
            return self.graph.pooled_zeros(&self.stream, n);
        }
        drv("alloc", self.stream.alloc_zeros(n)).map(DevBuf::plain)
    }

    /// Temporary device buffer with unspecified contents (as [`Gpu::zeros`] without the memset).
    ///
    /// # Safety
    /// The caller writes every element before reading it (as for cudarc's `CudaStream::alloc`).
    ///
    /// Errors: allocation failures.
    pub unsafe fn scratch<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<DevBuf<T>, CudaError> {
        if self.graph.capturing() {
            return self.graph.pooled(&self.stream, n);
        }
        // SAFETY: forwarded to the caller.
        drv("alloc", unsafe { self.stream.alloc(n) }).map(DevBuf::plain)
    }

    /// Zero-filled device buffer kept by the caller (weights, states).
    ///
    /// Errors: allocation failures; a call while a decode step is being captured.
    pub fn zeros_owned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        if self.graph.capturing() {
            return Err(in_capture("a lasting allocation"));
        }
        drv("alloc", self.stream.alloc_zeros(n))
    }

    /// Waits for the stream.
    ///
    /// Errors: driver errors; a call while a decode step is being captured.
    pub fn sync(&self) -> Result<(), CudaError> {
        if self.graph.capturing() {
            return Err(in_capture("a synchronisation"));
        }
        drv("synchronize", self.stream.synchronize())
    }

    /// RMSNorm of `rows` rows of width `n` (spec §3.1): `y = w ⊙ x / sqrt(mean(x²)+eps)`, unweighted
    /// when `w` is None. Rows of at most [`NORM_ROW_MAX`] values (a multiple of 4) run one warp per row
    /// (`rms_norm_rows_f32`), wider ones one block per row (`rms_norm_f32`); the choice depends on `n`
    /// only, so a row gets the same bits whatever `rows` is.
    ///
    /// Errors: `x` or `y` shorter than `rows·n`, `w` shorter than `n`; driver errors.
    pub fn rms_norm(&self, x: &CudaSlice<f32>, w: Option<&CudaSlice<f32>>, y: &mut CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<(), CudaError> {
        self.rms_norm_impl(x, w, y, rows, n, eps, None)
    }

    /// [`Gpu::rms_norm`] of `tokens·heads` rows of width `n` followed by [`Gpu::rope`] (forward) on
    /// each row's trailing `rope.dim` channels, token t at position `pos0 + t` — the per-head q norm
    /// and the kv norm + RoPE of spec §4.6 — in one pass when `n` ≤ [`NORM_ROW_MAX`] (same rotation
    /// expression as `rope_f32`), else as the two kernels.
    ///
    /// Errors: as [`Gpu::rms_norm`] and [`Gpu::rope`] (the rotated width, its table, 32-bit sizes).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_rope(&self, x: &CudaSlice<f32>, w: Option<&CudaSlice<f32>>, y: &mut CudaSlice<f32>, tokens: usize, heads: usize, n: usize, eps: f32, inv_freq: &CudaSlice<f32>, rope: &Rope, pos0: usize) -> Result<(), CudaError> {
        let rows = rope_rows(rope, inv_freq, tokens, heads, n, pos0).map_err(|detail| CudaError::Unsupported { what: "rms_norm_rope", detail })?;
        if !norm_rows_kernel(n) {
            self.rms_norm(x, w, y, rows, n, eps)?;
            return self.rope(y, inv_freq, rope, tokens, heads, n, pos0, false);
        }
        self.rms_norm_impl(x, w, y, rows, n, eps, Some((inv_freq, heads, rope.dim, pos0)))
    }

    #[allow(clippy::too_many_arguments)]
    fn rms_norm_impl(&self, x: &CudaSlice<f32>, w: Option<&CudaSlice<f32>>, y: &mut CudaSlice<f32>, rows: usize, n: usize, eps: f32, rope: Option<(&CudaSlice<f32>, usize, usize, usize)>) -> Result<(), CudaError> {
        let need = rows.saturating_mul(n);
        if x.len() < need || y.len() < need || w.is_some_and(|w| w.len() < n) {
            return Err(CudaError::Unsupported { what: "rms_norm", detail: format!("buffers of {} / {} values (weight {:?}) for {rows} rows of {n}", x.len(), y.len(), w.map(|w| w.len())) });
        }
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let (n_i, null) = (n as i32, 0u64);
        if norm_rows_kernel(n) {
            let cfg = LaunchConfig { grid_dim: (rows.div_ceil(NORM_ROWS_PER_BLOCK) as u32, 1, 1), block_dim: (32 * NORM_ROWS_PER_BLOCK as u32, 1, 1), shared_mem_bytes: 0 };
            let rows_i = i32::try_from(rows).map_err(|_| CudaError::Unsupported { what: "rms_norm", detail: format!("{rows} rows do not fit the kernel's 32-bit index") })?;
            let (heads, rope_dim, pos0) = match rope {
                Some((_, h, rd, p)) => (h.max(1) as i32, rd as i32, p as i32),
                None => (1, 0, 0),
            };
            // The kernel's sign argument (−1 would give the inverse rotation): the forward RoPE only.
            let sign = 1.0f32;
            let mut b = self.stream.launch_builder(self.f("rms_norm_rows_f32"));
            b.arg(x);
            match w {
                Some(w) => b.arg(w),
                None => b.arg(&null),
            };
            b.arg(y).arg(&rows_i).arg(&n_i).arg(&eps);
            match rope {
                Some((inv, ..)) => b.arg(inv),
                None => b.arg(&null),
            };
            b.arg(&heads).arg(&rope_dim).arg(&pos0).arg(&sign);
            // SAFETY: argument list matches rms_norm_rows_f32's signature; x and y hold rows·n floats,
            // w n, inv_freq rope_dim/2 (checked above and by rms_norm_rope).
            return drv("rms_norm_rows_f32", unsafe { b.launch(cfg) }).map(|_| ());
        }
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("rms_norm_f32"));
        b.arg(x);
        match w {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        b.arg(y).arg(&n_i).arg(&eps);
        // SAFETY: argument list matches rms_norm_f32's signature; buffers hold rows·n floats.
        drv("rms_norm_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Interleaved RoPE (inverse when `inverse`) on the trailing `rope.dim` channels of each head of
    /// `x` (`[tokens, heads, head_dim]`), token t at position `pos0 + t` (spec §3.2).
    ///
    /// Errors: `rope.dim` odd, larger than `head_dim` or than 2,048, a table shorter than
    /// `rope.dim / 2`, `x` shorter than `tokens·heads·head_dim`, sizes past the kernel's 32-bit
    /// indices; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(&self, x: &mut CudaSlice<f32>, inv_freq: &CudaSlice<f32>, rope: &Rope, tokens: usize, heads: usize, head_dim: usize, pos0: usize, inverse: bool) -> Result<(), CudaError> {
        let bad = |detail: String| CudaError::Unsupported { what: "rope", detail };
        let rows = rope_rows(rope, inv_freq, tokens, heads, head_dim, pos0).map_err(bad)?;
        if x.len() < rows.saturating_mul(head_dim) {
            return Err(bad(format!("x holds {} values, {rows} rows of {head_dim} needed", x.len())));
        }
        if rows == 0 || rope.dim < 2 {
            return Ok(());
        }
        // R rows per block of ≤ 256 threads (rope.dim / 2 pairs per row).
        let pairs = rope.dim / 2;
        let per_block = (256 / pairs).max(1);
        let cfg = LaunchConfig { grid_dim: (rows.div_ceil(per_block) as u32, 1, 1), block_dim: (pairs as u32, per_block as u32, 1), shared_mem_bytes: 0 };
        let (h, hd, rd, p0, rows_i) = (heads as i32, head_dim as i32, rope.dim as i32, pos0 as i32, rows as i32);
        let sign = if inverse { -1.0f32 } else { 1.0 };
        let mut b = self.stream.launch_builder(self.f("rope_f32"));
        b.arg(x).arg(inv_freq).arg(&h).arg(&hd).arg(&rd).arg(&p0).arg(&sign).arg(&rows_i);
        // SAFETY: matches rope_f32's signature.
        drv("rope_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `y[t, n] = Σ_k x[t, k]·W[n, k]` for `t` tokens, dequantizing W in the kernel: for `t ≥`
    /// [`TC_LINEAR_MIN_TOKENS`] the tensor-core GEMM ([`Gpu::linear_tc`]) as [`tc_linear_mode`]
    /// says (`FLASHSEEK_TC_LINEAR`), else the exact f32 kernel ([`Gpu::linear_gemv`]).
    ///
    /// Errors: `cols` not a multiple of the format's vector width (4 f32, 8 bf16, 16 FP8, 32 FP4).
    pub fn linear(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        match linear_route(t, w) {
            Some(split) => self.linear_tc(x, w, y, t, None, split),
            None => self.linear_gemv(x, w, y, t),
        }
    }

    /// [`Gpu::linear`] on the tensor cores (gemm.cu): x rounded to bf16 into a scratch buffer
    /// (`[T↑128, K↑32]`; with `split` also the residuals x − bf16(x) as a second plane), then the
    /// GEMM with W dequantized exactly to bf16 (f32 W rounded), f32 accumulation, deterministic.
    /// `tile` forces a block tile (None: [`Gpu::auto_tile`]).
    ///
    /// Errors: `cols` not a multiple of the format's vector width, buffers shorter than the shape,
    /// `split` with f32 weights (whose bf16 rounding would dominate: use [`Gpu::linear_gemv`]), a
    /// forced wgmma tile where [`Gpu::bf16_wgmma`] says no.
    pub fn linear_tc(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize, tile: Option<GemmTile>, split: bool) -> Result<(), CudaError> {
        let Some(chosen) = self.linear_tc_tile(x.len(), w, y.len(), t, tile, split)? else {
            return Ok(());
        };
        let (xb, tp, kp) = self.bf16_planes(x, t, w.cols, split)?;
        self.linear_tc_planes(&xb, tp, kp, w, y, t, tile, chosen, split, false)
    }

    /// [`Gpu::linear`] on several weights of the same input `x` (`[t, k]`): the weights that take
    /// [`Gpu::linear_tc`] with the same activation planes as the first one that takes it (one input
    /// width, all split or none) get `x` converted once for all of them (the compressors' `wkv` and
    /// `wgate`; in a CSA layer with the indexer compressor's and `weights_proj`) when there are two or
    /// more; the same GEMMs on the same planes, so the same bits as one [`Gpu::linear`] per weight,
    /// which every other weight runs ([`linear_multi_shares`] says whether all of them share).
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_multi(&self, x: &CudaSlice<f32>, t: usize, outs: &mut [(&GpuWeight, &mut CudaSlice<f32>)]) -> Result<(), CudaError> {
        self.linear_multi_planes(x, t, outs, false)
    }

    /// [`Gpu::linear_multi`], or with `hi_only` (switch `COMPRESSOR_BF16`, the compressors'
    /// projections) every weight that would take split activations takes the hi plane alone: `x`
    /// rounded to nearest-even bf16 once (one plane, half the conversion's writes), each GEMM on it
    /// with f32 accumulation — cuBLASLt's bf16 GEMM where [`Gpu::linear_split_lt`] takes the shape
    /// (`LINEAR_CUBLASLT`, ≥ [`super::cublaslt::LT_MIN_TOKENS`] tokens, ≥ `LT_MIN_ROWS` outputs),
    /// gemm.cu's bf16 kernels otherwise (`weights_proj`'s 64 rows). Half the tensor-core work of
    /// the split product; not exact: the product of `bf16(x)` (HF's model-dtype compressor in bf16
    /// and vLLM's, spec §9, where OFF-M computes in fp32). Weights outside the tensor-core route
    /// (fewer than 64 tokens, `TC_LINEAR=off`, f32 weights) run as [`Gpu::linear`] either way.
    ///
    /// Errors: as [`Gpu::linear`].
    pub fn linear_multi_planes(&self, x: &CudaSlice<f32>, t: usize, outs: &mut [(&GpuWeight, &mut CudaSlice<f32>)], hi_only: bool) -> Result<(), CudaError> {
        // Acts only where the weights would take split activations (TC_LINEAR split or fp8).
        let hi_only = hi_only && matches!(tc_linear_mode(), TcMode::Split | TcMode::Fp8);
        let route = |w: &GpuWeight| linear_route(t, w).map(|split| split && !hi_only);
        // The sharing group: the route (split or not) and input width of the first tensor-core weight.
        let key = outs.iter().find_map(|(w, _)| route(w).map(|split| (split, w.cols)));
        let joins = |w: &GpuWeight| key.is_some_and(|(split, k)| route(w) == Some(split) && w.cols == k);
        let members = outs.iter().filter(|(w, _)| joins(w)).count();
        let (split, cols) = match key {
            Some(key) if members > 1 || hi_only => key,
            _ => {
                for (w, y) in outs.iter_mut() {
                    self.linear(x, w, y, t)?;
                }
                return Ok(());
            }
        };
        for (w, y) in outs.iter_mut().filter(|(w, _)| !joins(w)) {
            self.linear(x, w, y, t)?;
        }
        let mut tiles = Vec::with_capacity(members);
        for (w, y) in outs.iter().filter(|(w, _)| joins(w)) {
            tiles.push(self.linear_tc_tile(x.len(), w, y.len(), t, None, split)?);
        }
        if tiles.iter().all(Option::is_none) {
            return Ok(());
        }
        let (xb, tp, kp) = self.bf16_planes(x, t, cols, split)?;
        for ((w, y), chosen) in outs.iter_mut().filter(|(w, _)| joins(w)).zip(tiles) {
            if let Some(chosen) = chosen {
                self.linear_tc_planes(&xb, tp, kp, w, y, t, None, chosen, split, hi_only)?;
            }
        }
        Ok(())
    }

    /// [`Gpu::linear_tc`]'s checks of one GEMM (input and output lengths `x_len`, `y_len`) and its
    /// block tile: `None` when there is nothing to compute (`t` or the rows 0).
    ///
    /// Errors: as [`Gpu::linear_tc`].
    fn linear_tc_tile(&self, x_len: usize, w: &GpuWeight, y_len: usize, t: usize, tile: Option<GemmTile>, split: bool) -> Result<Option<GemmTile>, CudaError> {
        let (fmt, need) = format_of(w);
        if split && fmt == "f32" {
            return Err(CudaError::Unsupported { what: "linear", detail: "split activations with f32 weights".into() });
        }
        if !w.cols.is_multiple_of(need) {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("input width {} is not a multiple of {need}", w.cols) });
        }
        if x_len < t * w.cols || y_len < t * w.rows {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("buffers of {x_len} and {y_len} values for {t} tokens of [{}, {}]", w.rows, w.cols) });
        }
        if t == 0 || w.rows == 0 {
            return Ok(None);
        }
        for v in [t, w.rows, w.cols] {
            i32::try_from(v).map_err(|_| CudaError::Unsupported { what: "linear", detail: format!("{v} does not fit the kernel's 32-bit index") })?;
        }
        match tile {
            Some(tile) if tile.is_wgmma() && !self.bf16_wgmma(fmt, w.cols) => Err(CudaError::Unsupported { what: "linear", detail: format!("the wgmma tile with {fmt} weights of input width {} on {} (needs sm_90a, bf16/FP8/FP4, a multiple of 64, BF16_WGMMA on)", w.cols, self.arch) }),
            Some(tile) => Ok(Some(tile)),
            None => Ok(Some(self.auto_tile(t, w.rows, fmt, w.cols))),
        }
    }

    /// The GEMM of [`Gpu::linear_tc`] on activations already converted by [`Gpu::bf16_planes`]
    /// (`xb`: `tp` rows of `kp`, with `split` the lo plane after the hi one), the block tile
    /// `chosen` (`tile`: the caller's forcing, if any; cuBLASLt only takes unforced split GEMMs, and
    /// with `lt_hi_only` unforced GEMMs on the hi plane alone: [`Gpu::linear_multi_planes`]).
    ///
    /// Errors: sizes beyond 32-bit indexing, launch failures.
    #[allow(clippy::too_many_arguments)]
    fn linear_tc_planes(&self, xb: &DevBuf<u16>, tp: usize, kp: usize, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize, tile: Option<GemmTile>, chosen: GemmTile, split: bool, lt_hi_only: bool) -> Result<(), CudaError> {
        let (fmt, _) = format_of(w);
        let too_big = |v: usize| i32::try_from(v).map_err(|_| CudaError::Unsupported { what: "linear", detail: format!("{v} does not fit the kernel's 32-bit index") });
        let (tt, n, k) = (too_big(t)?, too_big(w.rows)?, too_big(w.cols)?);
        if (split || lt_hi_only) && tile.is_none() && t >= super::cublaslt::LT_MIN_TOKENS && crate::switches::on("LINEAR_CUBLASLT") && self.linear_split_lt(xb, split.then_some(tp * kp), kp, 0, w, y, w.rows, 0, t)? {
            return Ok(());
        }
        let (bm, bn, threads, _) = chosen.shape();
        let blocks = t.div_ceil(bm) * w.rows.div_ceil(bn);
        let cfg = LaunchConfig { grid_dim: (too_big(blocks)? as u32, 1, 1), block_dim: (threads as u32, 1, 1), shared_mem_bytes: gemm_smem_bytes(fmt, chosen, split) as u32 };
        let name = chosen.entry(fmt, split);
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(xb);
        match &w.data {
            GpuMatrix::F32(m) => b.arg(m),
            GpuMatrix::Bf16(m) => b.arg(m),
            GpuMatrix::Fp8 { w: m, .. } | GpuMatrix::Fp4 { w: m, .. } => b.arg(m),
        };
        match &w.data {
            GpuMatrix::Fp8 { scales, .. } | GpuMatrix::Fp4 { scales, .. } => b.arg(scales),
            _ => b.arg(&null),
        };
        b.arg(y).arg(&tt).arg(&n).arg(&k);
        // SAFETY: matches the (xb, W, S, y, T, N, K) signature of every gemm_tc / gemm_wb entry point
        // (the wgmma ones only where bf16_wgmma allows them: K % 64 == 0, so Kp = K); the dynamic
        // shared memory is the size its layout needs (the kernel traps on less).
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Whether gemm.cu's wgmma kernels (`gemm_wb_*`, `moe_wb_*`) run a GEMM with `fmt` weights
    /// (`f32`, `bf16`, `fp8`, `fp4`) of input width `k` here: the switch `BF16_WGMMA` is on, the
    /// device is sm_90a (wgmma exists nowhere else), the format is bf16/FP8/FP4 and `k` is a
    /// multiple of 64 (one K step).
    pub fn bf16_wgmma(&self, fmt: &str, k: usize) -> bool {
        self.arch == "sm_90a" && fmt != "f32" && k.is_multiple_of(64) && crate::switches::on("BF16_WGMMA")
    }

    /// The block tile [`Gpu::linear_tc`] picks for `t` tokens, `n` outputs and `fmt` weights of input
    /// width `k` on this device's multiprocessors. Where [`Gpu::bf16_wgmma`] allows the wgmma tiles:
    /// [`GemmTile::WgmmaWide`] when its grid fills every SM, else [`GemmTile::Small`] if
    /// [`GemmTile::choose`] picks it, else [`GemmTile::Wgmma`]; elsewhere [`GemmTile::choose`]'s.
    /// Measured on H200 (`bench/tc_h200.log`, 9b2e6b8): wq_b [32768, 1024] at T = 64 WgmmaWide 0.037
    /// ms vs Small 0.047 (split 0.047 vs 0.079); wq_a [1024, 4096] at T = 64 Small 0.054 vs Wgmma
    /// 0.058; at T = 2,048 Wgmma 0.071 vs WgmmaWide 0.113 (a grid of 64 blocks).
    pub fn auto_tile(&self, t: usize, n: usize, fmt: &str, k: usize) -> GemmTile {
        let sms = self.sms;
        let chosen = GemmTile::choose(t, n, sms);
        if !self.bf16_wgmma(fmt, k) {
            return chosen;
        }
        if t.div_ceil(128) * n.div_ceil(256) >= sms {
            GemmTile::WgmmaWide
        } else if chosen == GemmTile::Small {
            GemmTile::Small
        } else {
            GemmTile::Wgmma
        }
    }

    /// `x` (`[t, k]` f32) as gemm.cu's bf16 activation planes (`gemm_x_bf16`): returns the buffer,
    /// `Tp` (t rounded up to 128) and `Kp` (k rounded up to 32); the hi plane `[Tp, Kp]`, with
    /// `split` followed by the lo plane `x − bf16(x)`; padding is zero.
    ///
    /// Errors: `x` shorter than `t·k`, sizes beyond 32-bit indexing, allocation or launch failures.
    pub fn bf16_planes(&self, x: &CudaSlice<f32>, t: usize, k: usize, split: bool) -> Result<(DevBuf<u16>, usize, usize), CudaError> {
        if x.len() < t * k {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("{} inputs for {t} rows of {k}", x.len()) });
        }
        let (tp, kp) = (t.div_ceil(128).max(1) * 128, k.div_ceil(32) * 32);
        // SAFETY: every element is written by gemm_x_bf16 below before anything reads it.
        let mut xb = unsafe { self.scratch::<u16>(tp * kp * if split { 2 } else { 1 }) }?;
        self.x_bf16_into(&x.slice(..), &mut xb, t, k, tp, split)?;
        Ok((xb, tp, kp))
    }

    /// Launches gemm.cu's `gemm_x_bf16`, the one launcher of that kernel (the linears' bf16
    /// planes, the MoE's SwiGLU output, the bf16 attention's rows): rows `0..t` of `x` (`[t, k]`
    /// f32) rounded to bf16 into `xb` as rows of `Kp` (k rounded up to 32) values, rows `t..tp` and
    /// columns `k..Kp` zero; with `split` the lo plane `x − bf16(x)` follows at `tp·Kp`. Grid-stride
    /// over float4s, block 256.
    ///
    /// Errors: `x` shorter than `t·k`, `xb` shorter than the planes, `tp < t`, sizes beyond 32-bit
    /// indexing, launch failures.
    pub(crate) fn x_bf16_into(&self, x: &CudaView<'_, f32>, xb: &mut CudaSlice<u16>, t: usize, k: usize, tp: usize, split: bool) -> Result<(), CudaError> {
        let kp = k.div_ceil(32) * 32;
        let planes = if split { 2 } else { 1 };
        if x.len() < t * k || tp < t || xb.len() < tp * kp * planes {
            return Err(CudaError::Unsupported { what: "gemm_x_bf16", detail: format!("{} inputs for {t} rows of {k} into {} bf16 values ({tp} rows of {kp}, {planes} planes)", x.len(), xb.len()) });
        }
        let too_big = |v: usize| i32::try_from(v).map_err(|_| CudaError::Unsupported { what: "gemm_x_bf16", detail: format!("{v} does not fit the kernel's 32-bit index") });
        let (tt, k_i, tp_i) = (too_big(t)?, too_big(k)?, too_big(tp)?);
        if tp == 0 || kp == 0 {
            return Ok(());
        }
        let quads = tp * kp / 4;
        let cfg = LaunchConfig { grid_dim: (quads.div_ceil(256).min(132 * 32) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("gemm_x_bf16"));
        let split_i = split as i32;
        b.arg(x).arg(xb).arg(&tt).arg(&k_i).arg(&tp_i).arg(&split_i);
        // SAFETY: matches gemm_x_bf16(x, xb, T, K, Tp, split); x holds T·K floats, xb (1 + split)·Tp·Kp
        // bf16 (checked above).
        drv("gemm_x_bf16", unsafe { b.launch(cfg) })?;
        Ok(())
    }

    /// The grouped output projection (spec §4.7) through cuBLASLt (switch `LINEAR_CUBLASLT`, split
    /// activations, or with `split` false the activations rounded to bf16 — `MLA_BF16`'s OFF-M
    /// numerics): `o` `[t, G·gin]` converted to bf16 planes once, then for each group g
    /// `z[:, g·r ..] = W_oa[g] · o[:, g·gin ..]` by [`Gpu::linear_split_lt`] with strided rows — no
    /// gather or scatter. Returns how many leading groups it computed (cuBLASLt may decline a group
    /// whose slices are less aligned than the first's): [`Gpu::grouped_linear_gather`] does the rest.
    ///
    /// Errors: buffers shorter than the shapes, a group weight not `[r, gin]`, launch failures.
    pub fn grouped_linear_lt(&self, o: &CudaSlice<f32>, wo_a: &[GpuWeight], z: &mut CudaSlice<f32>, t: usize, split: bool) -> Result<usize, CudaError> {
        let Some(w0) = wo_a.first() else { return Ok(0) };
        let (gin, r, groups) = (w0.cols, w0.rows, wo_a.len());
        if wo_a.iter().any(|w| w.cols != gin || w.rows != r) || z.len() < t * groups * r || o.len() < t * groups * gin {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("{groups} group weights of [{r}, {gin}] for {} inputs and {} outputs of {t} tokens", o.len(), z.len()) });
        }
        let (xb, tp, kp) = self.bf16_planes(o, t, groups * gin, split)?;
        self.grouped_linear_lt_planes(&xb, split.then_some(tp * kp), kp, wo_a, z, t)
    }

    /// [`Gpu::grouped_linear_lt`] from split bf16 planes the caller made (e.g. the attention
    /// kernel's [`super::ops_attention::AttentionOut::SplitPlanes`]): hi rows of `ldb` ≥ G·gin values from
    /// element 0, lo rows from element `plane` (None: bf16 activations, the hi plane alone, e.g.
    /// [`super::ops_attention::AttentionOut::Bf16`]). Returns how many leading groups it computed.
    ///
    /// Errors: buffers shorter than the shapes, a group weight not `[r, gin]`, launch failures.
    pub fn grouped_linear_lt_planes(&self, xb: &CudaSlice<u16>, plane: Option<usize>, ldb: usize, wo_a: &[GpuWeight], z: &mut CudaSlice<f32>, t: usize) -> Result<usize, CudaError> {
        let Some(w0) = wo_a.first() else { return Ok(0) };
        let (gin, r, groups) = (w0.cols, w0.rows, wo_a.len());
        if wo_a.iter().any(|w| w.cols != gin || w.rows != r) || z.len() < t * groups * r || ldb < groups * gin {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("{groups} group weights of [{r}, {gin}] for rows of {ldb} inputs and {} outputs of {t} tokens", z.len()) });
        }
        for (g, w) in wo_a.iter().enumerate() {
            if !self.linear_split_lt(xb, plane, ldb, g * gin, w, z, groups * r, g * r, t)? {
                return Ok(g);
            }
        }
        Ok(groups)
    }

    /// The grouped output projection group by group on [`Gpu::linear_gemv_strided`] when every
    /// group takes the gemv route at `t` tokens (fewer than [`TC_LINEAR_MIN_TOKENS`]: decode steps
    /// and short chunks): group g's inputs are read in place from `o` (`[t, G·gin]`, columns
    /// g·gin..) and its outputs written in place into `z` (`[t, G·r]`, columns g·r..): all groups
    /// in one launch when `table` holds exactly `ws` (`first` 0, every group), else one launch
    /// per group — the same kernel code on the same values as [`Gpu::grouped_linear_gather`], so
    /// the same bits, without its per-group index upload, zero fills, gather and scatter. Returns
    /// false (nothing done) when some group would take the tensor cores.
    ///
    /// Errors: buffers shorter than the shapes, launch failures.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_linear_gemv(&self, o: &CudaSlice<f32>, ws: &[GpuWeight], first: usize, z: &mut CudaSlice<f32>, t: usize, gin: usize, table: Option<&GpuGroupTable>) -> Result<bool, CudaError> {
        let Some(w0) = ws.first() else { return Ok(true) };
        if ws.iter().any(|w| linear_route(t, w).is_some()) {
            return Ok(false);
        }
        let r = w0.rows;
        let groups = z.len().checked_div(t * r).unwrap_or(0);
        if first + ws.len() > groups || o.len() < t * groups * gin || ws.iter().any(|w| w.rows != r || w.cols != gin) {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("groups {first}..{} of {groups} of [{r}, {gin}] for {} inputs of {t} tokens", first + ws.len(), o.len()) });
        }
        // All groups in one launch when `table` describes exactly these weights.
        if let Some(tb) = table.filter(|tb| first == 0 && tb.groups == ws.len() && tb.groups == groups && tb.rows == r && tb.cols == gin) {
            return self.grouped_gemv_launch(o, tb, z, t).map(|_| true);
        }
        for (i, wg) in ws.iter().enumerate() {
            let g = first + i;
            self.linear_gemv_strided(&o.slice(g * gin..), groups * gin, wg, &mut z.slice_mut(g * r..), groups * r, t)?;
        }
        Ok(true)
    }

    /// `linear_<fmt>[_t1]_grouped`: every group of `tb` in one launch, group g reading columns
    /// g·cols.. of `o`'s rows (`[t, G·cols]`) and writing columns g·rows.. of `z`'s (`[t, G·rows]`).
    ///
    /// Errors: widths the format's loads do not divide, buffers shorter than the shapes (checked
    /// by the caller too), launch failures.
    fn grouped_gemv_launch(&self, o: &CudaSlice<f32>, tb: &GpuGroupTable, z: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        let need = match tb.fmt {
            "f32" => 4,
            "bf16" => 8,
            "fp8" => 16,
            _ => 32,
        };
        let (ldx, ldy) = (tb.groups * tb.cols, tb.groups * tb.rows);
        if t == 0 || !tb.cols.is_multiple_of(need) || o.len() < t * ldx || z.len() < t * ldy {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("{} groups of {} [{}, {}] for {} inputs and {} outputs of {t} tokens", tb.groups, tb.fmt, tb.rows, tb.cols, o.len(), z.len()) });
        }
        let (Ok(ldx_i), Ok(ldy_i), Ok(g_i)) = (i32::try_from(ldx), i32::try_from(ldy), u32::try_from(tb.groups)) else {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("row strides {ldx} and {ldy} do not fit the kernel's 32-bit index") });
        };
        let (t1, cap) = t1_variant(t, need);
        let cfg = LaunchConfig { grid_dim: (tb.rows.div_ceil(8).min(cap) as u32, t.div_ceil(8) as u32, g_i), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let name = format!("linear_{}{t1}_grouped", tb.fmt);
        let (tt, n, k) = (t as i32, tb.rows as i32, tb.cols as i32);
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(o).arg(&tb.w).arg(&tb.s).arg(z).arg(&tt).arg(&n).arg(&k).arg(&ldx_i).arg(&ldy_i);
        // SAFETY: matches (x, wtab, stab, y, T, N, K, ldx, ldy); the tables hold `groups` addresses
        // of live weights of this format and shape (GpuGroupTable::build; the caller keeps them
        // together), o holds t rows of ldx floats and z t rows of ldy (checked above).
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// The grouped output projection group by group with [`Gpu::linear`]: for the groups
    /// `first .. first + ws.len()` of `o` (`[t, G·gin]`, G = `z`'s width / r), gather the group's
    /// columns, multiply, scatter into `z` (`[t, G·r]`).
    ///
    /// Errors: buffers shorter than the shapes, launch failures.
    pub fn grouped_linear_gather(&self, o: &CudaSlice<f32>, ws: &[GpuWeight], first: usize, z: &mut CudaSlice<f32>, t: usize, gin: usize) -> Result<(), CudaError> {
        let Some(w0) = ws.first() else { return Ok(()) };
        let r = w0.rows;
        let groups = z.len().checked_div(t * r).unwrap_or(0);
        if first + ws.len() > groups || o.len() < t * groups * gin {
            return Err(CudaError::Unsupported { what: "grouped linear", detail: format!("groups {first}..{} of {groups} for {} inputs of {t} tokens", first + ws.len(), o.len()) });
        }
        for (i, wg) in ws.iter().enumerate() {
            let g = first + i;
            let rows: Vec<i32> = (0..t).map(|ti| (ti * groups + g) as i32).collect();
            let rows = self.stage_upload(&rows)?;
            let mut xg = self.zeros::<f32>(t * gin)?;
            self.gather_rows(o, t * groups, &rows.slice(0..t), &mut xg, gin)?;
            let mut zg = self.zeros::<f32>(t * r)?;
            self.linear(&xg, wg, &mut zg, t)?;
            self.scatter_rows(&zg, &rows.slice(0..t), z, t * groups, r)?;
        }
        Ok(())
    }

    /// [`Gpu::linear`] on the exact f32 kernels (linear.cu), whatever the token count.
    ///
    /// Errors: `cols` not a multiple of the format's vector width (4 f32, 8 bf16, 16 FP8, 32 FP4).
    pub fn linear_gemv(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        self.linear_gemv_strided(&x.slice(..), w.cols, w, &mut y.slice_mut(..), w.rows, t)
    }

    /// [`Gpu::linear_gemv`] on rows `ldx` floats apart in `x` and `ldy` floats apart in `y`: token
    /// j's input is `x[j·ldx .. j·ldx + cols]`, its output `y[j·ldy .. j·ldy + rows]` (a column block
    /// of wider matrices; the same arithmetic, so the same bits, as on contiguous copies).
    ///
    /// Errors: as [`Gpu::linear_gemv`], `ldx` < cols or not a multiple of 4 (16-byte row loads),
    /// `ldy` < rows, views shorter than the shapes, strides past 32-bit indexing.
    pub fn linear_gemv_strided(&self, x: &CudaView<'_, f32>, ldx: usize, w: &GpuWeight, y: &mut CudaViewMut<'_, f32>, ldy: usize, t: usize) -> Result<(), CudaError> {
        self.gemv_launch(x, ldx, w, y, ldy, t, false)
    }

    /// Whether [`Gpu::linear_gemv_q`] takes `t` tokens of `w`: fewer than
    /// [`TC_LINEAR_MIN_TOKENS`] (the official path's FP8 GEMM starts there), an input width that
    /// is a multiple of 128 (the quantisation blocks), and the block's tokens' inputs fitting the
    /// kernel's staged tile (min(t, 8) · cols ≤ 8,192 floats: every decode step of Flash, whose
    /// widest official input is `wo_b`'s 8,192).
    pub fn linear_gemv_q_takes(t: usize, w: &GpuWeight) -> bool {
        gemv_q_takes_shape(t, w.cols)
    }

    /// The official numerics' small-batch linear in one launch (switch `LINEAR_FUSED_QUANT`;
    /// linear.cu `linear_<fmt>[_t1]_q`): `y = linear(act_in(x), W)` for `t` tokens of `x`
    /// (`[t, cols]` f32) into `y` (`[t, rows]` f32), the input quantize-dequantized per 128 values
    /// (spec §6, §10.1) as the kernel stages it — the bits of [`Gpu::act_roundtrip`] on a copy of
    /// `x` followed by [`Gpu::linear_gemv`], without the copy and the roundtrip launch.
    ///
    /// Errors: shapes [`Gpu::linear_gemv_q_takes`] rejects (the caller checks first), buffers
    /// shorter than the shapes, launch failures.
    pub fn linear_gemv_q(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        if !Self::linear_gemv_q_takes(t, w) {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("the fused-quantisation gemv takes 1..{TC_LINEAR_MIN_TOKENS} tokens of inputs a multiple of 128 wide with min(t, 8)·width ≤ {GEMV_STAGED_FLOATS}: {t} tokens of [{}, {}]", w.rows, w.cols) });
        }
        self.gemv_launch(&x.slice(..), w.cols, w, &mut y.slice_mut(..), w.rows, t, true)
    }

    /// Whether [`Gpu::linear_gemv_mma`] takes `t` tokens of `w` (switch `LINEAR_GEMV_MMA`): FP8
    /// weights, 1..=8 tokens, widths a multiple of 256 up to 8,192 whose staged e4m3 rows fit
    /// linear.cu's tile (`t · (cols + 16) ≤ LGM_XBYTES`).
    pub fn linear_gemv_mma_takes(t: usize, w: &GpuWeight) -> bool {
        matches!(w.data, GpuMatrix::Fp8 { .. }) && gemv_mma_takes_shape(t, w.cols)
    }

    /// The official numerics' small-batch linear over FP8 weights with each 128-value block's
    /// products on the tensor cores (switch `LINEAR_GEMV_MMA`; linear.cu `linear_fp8_mma_q_ks<KS>`):
    /// `y = linear(act_in(x), W)` for `t` ≤ 8 tokens of `x` (`[t, cols]` f32) into `y` (`[t, rows]`
    /// f32) — [`Gpu::linear_gemv_q`]'s definition (the inputs quantized per 128 values as staged,
    /// spec §6, §10.1), the MMA unit's sums, so not its bits. Each 16-row tile's blocks are split
    /// over [`gemv_mma_ksplit`] warps.
    ///
    /// Errors: shapes [`Gpu::linear_gemv_mma_takes`] rejects, buffers shorter than the shapes,
    /// launch failures.
    pub fn linear_gemv_mma(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        let GpuMatrix::Fp8 { w: wv, scales } = &w.data else {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("the tensor-core gemv takes FP8 weights: [{}, {}]", w.rows, w.cols) });
        };
        if !gemv_mma_takes_shape(t, w.cols) {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("the tensor-core gemv takes 1..=8 tokens of inputs a multiple of 256 wide, at most 8,192, with t·(width + 16) ≤ {LGM_XBYTES}: {t} tokens of [{}, {}]", w.rows, w.cols) });
        }
        if x.len() < t * w.cols || y.len() < t * w.rows {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("{} inputs and {} outputs for {t} tokens of [{}, {}]", x.len(), y.len(), w.rows, w.cols) });
        }
        let ks = gemv_mma_ksplit(w.rows, w.cols);
        let name = format!("linear_fp8_mma_q_ks{ks}");
        let cfg = LaunchConfig { grid_dim: (w.rows.div_ceil(16 * 8 / ks) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (tt, n, k) = (t as i32, w.rows as i32, w.cols as i32);
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(x).arg(wv).arg(scales).arg(y).arg(&tt).arg(&n).arg(&k).arg(&k).arg(&n);
        // SAFETY: linear_fp8_mma_q_ks<KS>(x [t, K], W e4m3 [N, K], S [ceil(N/128), K/128], y [t, N], T,
        // N, K, ldx = K, ldy = N); the shape rule above is the kernel's trap condition with KS from
        // gemv_mma_ksplit (K/128 a multiple of KS·LGM_U); lengths checked above.
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Whether [`Gpu::linear_multi_into`] takes `t` tokens of the weights `ws` (switch
    /// `COMPRESSOR_FUSED_DECODE`): 1 to [`LINEAR_MULTI_MAX`] weights, all f32 or all bf16 of one
    /// input width (a multiple of 8), and `t` below [`TC_LINEAR_MIN_TOKENS`] (where
    /// [`Gpu::linear`] takes the gemv).
    pub fn linear_multi_into_takes<'a>(t: usize, ws: impl IntoIterator<Item = &'a GpuWeight>) -> bool {
        let ws: Vec<&GpuWeight> = ws.into_iter().collect();
        let Some(first) = ws.first() else { return false };
        let fmt = format_of(first).0;
        (1..TC_LINEAR_MIN_TOKENS).contains(&t)
            && ws.len() <= LINEAR_MULTI_MAX
            && matches!(fmt, "f32" | "bf16")
            && first.cols.is_multiple_of(8)
            && ws.iter().all(|w| format_of(w).0 == fmt && w.cols == first.cols && w.rows > 0)
    }

    /// Several gemvs of one input in one launch, each written into a larger buffer with an
    /// optional per-position bias (switch `COMPRESSOR_FUSED_DECODE`; linear.cu
    /// `linear_<fmt>[_t1|_t1p]_multi`): for every output `o`, token j of `t` (`x`: `[t, cols]`
    /// f32), `o.y[o.at + j·rows + n] = Σ_k x[j, k]·W[n, k]` (+ `bias[((pos0 + j) mod ratio)·rows +
    /// n]` with `o.bias = Some((bias [ratio, rows], ratio))`). Each value is the one
    /// [`Gpu::linear_gemv`] gives for that weight under the current switches (the same kernel
    /// form, `LINEAR_T1_PREFETCH` included, and row code), and the bias is added as
    /// [`Gpu::add_position_bias`] adds it, so the bits of those launches followed by copies into
    /// place — a compressor's projections appended to its state (spec §4.8 / §4.9 step 1) in one
    /// launch instead of one per weight, a bias pass and two copies.
    ///
    /// Errors: weights [`Gpu::linear_multi_into_takes`] rejects, outputs or biases shorter than
    /// the shapes, positions past 32-bit indexing, launch failures.
    pub fn linear_multi_into(&self, x: &CudaSlice<f32>, t: usize, outs: &mut [MultiOut<'_>], pos0: usize) -> Result<(), CudaError> {
        let bad = |detail: String| CudaError::Unsupported { what: "linear_multi_into", detail };
        if !Self::linear_multi_into_takes(t, outs.iter().map(|o| o.w)) {
            let shapes: Vec<String> = outs.iter().map(|o| format!("[{}, {}] {}", o.w.rows, o.w.cols, format_of(o.w).0)).collect();
            return Err(bad(format!("takes 1..{TC_LINEAR_MIN_TOKENS} tokens of 1..={LINEAR_MULTI_MAX} f32 or bf16 weights of one format and input width (a multiple of 8): {t} tokens of {}", shapes.join(", "))));
        }
        let cols = outs[0].w.cols;
        if x.len() < t * cols {
            return Err(bad(format!("{} inputs for {t} tokens of width {cols}", x.len())));
        }
        let (fmt, per) = format_of(outs[0].w);
        let (form, cap) = t1_variant(t, per);
        let st = &self.stream;
        let pos0_i = i32::try_from(pos0 + t).map(|_| pos0 as i32).map_err(|_| bad(format!("position {pos0} + {t} does not fit the kernel's 32-bit index")))?;
        let mut m = FsMulti { o: [FsMultiOut::default(); LINEAR_MULTI_MAX], count: outs.len() as i32, pos0: pos0_i };
        let mut blocks = 0usize;
        for (slot, o) in m.o.iter_mut().zip(outs.iter_mut()) {
            let rows = o.w.rows;
            let end = o.at + t * rows;
            if o.y.len() < end || i32::try_from(end).is_err() {
                return Err(bad(format!("an output of {} values for {t} tokens of {rows} rows from {}", o.y.len(), o.at)));
            }
            let (bias, ratio) = match o.bias {
                Some((b, ratio)) => {
                    if ratio == 0 || b.len() != ratio * rows {
                        return Err(bad(format!("a bias of {} values for ratio {ratio} and {rows} rows", b.len())));
                    }
                    (b.device_ptr(st).0, ratio)
                }
                None => (0, 1),
            };
            let n_blocks = rows.div_ceil(8).min(cap);
            blocks += n_blocks;
            *slot = FsMultiOut {
                w: match &o.w.data {
                    GpuMatrix::F32(w) => w.device_ptr(st).0,
                    GpuMatrix::Bf16(w) => w.device_ptr(st).0,
                    _ => return Err(bad(format!("an {} weight", format_of(o.w).0))),
                },
                y: o.y.device_ptr_mut(st).0 + 4 * o.at as u64,
                bias,
                n: rows as i32,
                ldy: rows as i32,
                ratio: ratio as i32,
                blocks: n_blocks as i32,
            };
        }
        let name = format!("linear_{fmt}{form}_multi");
        let cfg = LaunchConfig { grid_dim: (blocks as u32, t.div_ceil(8) as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (tt, k, ldx) = (t as i32, cols as i32, cols as i32);
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(x).arg(&m).arg(&tt).arg(&k).arg(&ldx);
        // SAFETY: matches linear_<fmt>*_multi (x, FsMulti by value, T, K, ldx); every address in
        // `m` is a live buffer of this device checked above to hold its t rows from its offset
        // (and its bias ratio·rows values), the weights are [rows, cols] of the entry's format,
        // and x holds t rows of cols floats.
        let r = unsafe { b.launch(cfg) };
        drv(&name, r).map(|_| ())
    }

    /// The launch behind [`Gpu::linear_gemv_strided`] (`quant` false: `linear_<fmt>[_t1]`) and
    /// [`Gpu::linear_gemv_q`] (`quant` true: `linear_<fmt>[_t1]_q`).
    #[allow(clippy::too_many_arguments)]
    fn gemv_launch(&self, x: &CudaView<'_, f32>, ldx: usize, w: &GpuWeight, y: &mut CudaViewMut<'_, f32>, ldy: usize, t: usize, quant: bool) -> Result<(), CudaError> {
        if t == 0 {
            return Ok(());
        }
        let bad = |detail: String| CudaError::Unsupported { what: "linear", detail };
        if ldx < w.cols || !ldx.is_multiple_of(4) || ldy < w.rows {
            return Err(bad(format!("row strides {ldx} (input, ≥ {} and a multiple of 4) and {ldy} (output, ≥ {})", w.cols, w.rows)));
        }
        if x.len() < (t - 1) * ldx + w.cols || y.len() < (t - 1) * ldy + w.rows {
            return Err(bad(format!("{} inputs and {} outputs for {t} tokens of [{}, {}] with row strides {ldx} and {ldy}", x.len(), y.len(), w.rows, w.cols)));
        }
        let (n, k) = (w.rows as i32, w.cols as i32);
        let (Ok(ldx_i), Ok(ldy_i)) = (i32::try_from(ldx), i32::try_from(ldy)) else {
            return Err(bad(format!("row strides {ldx} and {ldy} do not fit the kernel's 32-bit index")));
        };
        let tt = t as i32;
        let need = match w.data {
            GpuMatrix::F32(_) => 4,
            GpuMatrix::Bf16(_) => 8,
            GpuMatrix::Fp8 { .. } => 16,
            GpuMatrix::Fp4 { .. } => 32,
        };
        if !w.cols.is_multiple_of(need) {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("input width {} is not a multiple of {need}", w.cols) });
        }
        // Row blocks are capped (each block loops over rows) so x is staged once per block.
        let (t1, cap) = t1_variant(t, need);
        let cfg = LaunchConfig {
            grid_dim: (w.rows.div_ceil(8).min(cap) as u32, t.div_ceil(8) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (fmt, s): (&str, Option<&CudaSlice<u8>>) = match &w.data {
            GpuMatrix::F32(_) => ("f32", None),
            GpuMatrix::Bf16(_) => ("bf16", None),
            GpuMatrix::Fp8 { scales, .. } => ("fp8", Some(scales)),
            GpuMatrix::Fp4 { scales, .. } => ("fp4", Some(scales)),
        };
        let name = format!("linear_{fmt}{t1}{}", if quant { "_q" } else { "" });
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(x);
        match &w.data {
            GpuMatrix::F32(m) => b.arg(m),
            GpuMatrix::Bf16(m) => b.arg(m),
            GpuMatrix::Fp8 { w: m, .. } | GpuMatrix::Fp4 { w: m, .. } => b.arg(m),
        };
        match s {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        b.arg(y).arg(&tt).arg(&n).arg(&k).arg(&ldx_i).arg(&ldy_i);
        // SAFETY: matches the (x, W, S, y, T, N, K, ldx, ldy) signature of every linear entry
        // point; x holds t rows of ldx floats (the last one cols), y t rows of ldy (the last one
        // rows), checked above.
        let r = unsafe { b.launch(cfg) };
        drv(&name, r).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `COMPRESSOR_FUSED_DECODE`'s launch argument has linear.cu's `FsMulti` layout (the same
    /// fields in the same order, 40 bytes per output, the same maximum) and every form's entry is
    /// defined and loaded; the forms are the ones [`t1_variant`] names.
    #[test]
    fn linear_multi_layout_matches_the_kernel() {
        let src = include_str!("kernels/linear.cu");
        assert!(src.contains(&format!("#define FS_MULTI_MAX {LINEAR_MULTI_MAX}\n")));
        assert!(src.contains("struct FsMultiOut {\n    const void* W;\n    float* y;\n    const float* bias;\n    int N, ldy, ratio, blocks;\n};"));
        assert!(src.contains("struct FsMulti {\n    FsMultiOut o[FS_MULTI_MAX];\n    int count, pos0;\n};"));
        assert_eq!(std::mem::size_of::<FsMultiOut>(), 40);
        assert_eq!(std::mem::align_of::<FsMulti>(), 8);
        assert_eq!(std::mem::size_of::<FsMulti>(), LINEAR_MULTI_MAX * 40 + 8);
        for (fmt, ty, code, per) in [("f32", "float", 0, 4), ("bf16", "u16", 1, 8)] {
            for (form, tt, pf) in [("", "TT", "false"), ("_t1", "1", "false"), ("_t1p", "1", "true")] {
                let name = format!("linear_{fmt}{form}_multi");
                assert!(src.contains(&format!("FS_LINEAR_MULTI({name}, {ty}, {code}, {per}, {tt}, {pf})")), "{name}");
                assert!(ENTRY_POINTS.iter().any(|(f, names)| *f == "linear.cu" && names.contains(&name.as_str())), "{name}");
            }
        }
    }

    /// `LINEAR_GEMV_MMA`'s host rule matches linear.cu: its constants and trap condition, the
    /// entries, the warp split Flash's FP8 decode linears take (every one a whole number of
    /// batches per warp) and the shapes taken and declined.
    #[test]
    fn gemv_mma_rule_matches_the_kernel() {
        let src = include_str!("kernels/linear.cu");
        assert!(src.contains(&format!("#define LGM_U {LGM_U} ")) && src.contains(&format!("#define LGM_XBYTES {LGM_XBYTES} ")));
        assert!(src.contains("if (T < 1 || T > 8 || (K & 127) != 0 || KB > 64 || T * xl > LGM_XBYTES || KB % (KS * LGM_U) != 0) __trap();"));
        assert!(src.contains("const int KB = K >> 7, xl = K + 16;"));
        for ks in [1, 2, 4, 8] {
            let name = format!("linear_fp8_mma_q_ks{ks}");
            assert!(src.contains(&format!("LGM_ENTRY({ks})")), "{name}");
            assert!(ENTRY_POINTS.iter().any(|(f, names)| *f == "linear.cu" && names.contains(&name.as_str())), "{name}");
        }
        // (rows, cols, split): wq_a, wkv, wq_b, wo_b, the indexer's wq_b, shared w1 / w3, shared w2.
        for (rows, cols, ks) in [(1024, 4096, 8), (512, 4096, 8), (32768, 1024, 1), (4096, 8192, 4), (8192, 1024, 2), (2048, 4096, 8), (4096, 2048, 4)] {
            let got = gemv_mma_ksplit(rows, cols);
            assert_eq!(got, ks, "[{rows}, {cols}]");
            assert!((cols / 128).is_multiple_of(got * LGM_U) && gemv_mma_takes_shape(1, cols));
        }
        assert!(gemv_mma_takes_shape(8, 2048) && gemv_mma_takes_shape(3, 8192) && gemv_mma_takes_shape(1, 256));
        assert!(!gemv_mma_takes_shape(8, 4096) && !gemv_mma_takes_shape(9, 256) && !gemv_mma_takes_shape(1, 384) && !gemv_mma_takes_shape(0, 1024) && !gemv_mma_takes_shape(1, 8448));
        assert_eq!(gemv_mma_ksplit(40, 768), 1);
    }

    /// The fused-quantisation gemv's host rule matches linear.cu: its tile constants, and the shapes
    /// it takes (Flash's decode linears) and declines (past the staged tile, widths not a multiple
    /// of 128, 64 tokens and more: the FP8 GEMM's).
    #[test]
    fn fused_quant_gemv_rule_matches_the_kernel() {
        let src = include_str!("kernels/linear.cu");
        assert!(src.contains(&format!("#define TT {GEMV_TOKENS_PER_BLOCK}\n")) && src.contains(&format!("#define XS_FLOATS {GEMV_STAGED_FLOATS} ")));
        assert!(src.contains("if (!staged || (K & 127) != 0) __trap();"));
        for fmt in ["f32", "bf16", "fp8", "fp4"] {
            for t1 in ["", "_t1"] {
                let name = format!("linear_{fmt}{t1}_q");
                assert!(src.contains(&format!("FS_LINEAR_Q_ENTRY({name},")), "{name}");
                assert!(ENTRY_POINTS.iter().any(|(f, names)| *f == "linear.cu" && names.contains(&name.as_str())), "{name}");
            }
        }
        // Flash's decode linears (wq_a / wkv 4,096 wide, wq_b 1,024, wo_b 8,192, the shared
        // expert's 4,096 and 2,048) at one token, and short chunks within the tile.
        for cols in [1024, 2048, 4096, 8192] {
            assert!(gemv_q_takes_shape(1, cols), "{cols}");
        }
        assert!(gemv_q_takes_shape(8, 1024) && gemv_q_takes_shape(63, 128) && gemv_q_takes_shape(2, 4096));
        assert!(!gemv_q_takes_shape(3, 4096) && !gemv_q_takes_shape(1, 8320) && !gemv_q_takes_shape(9, 1152));
        assert!(!gemv_q_takes_shape(1, 200) && !gemv_q_takes_shape(64, 128) && !gemv_q_takes_shape(0, 128));
    }

    /// LINEAR_T1_PREFETCH picks `_t1p` at one token only; every entry it can name exists in
    /// linear.cu and the loader's list.
    #[test]
    fn t1_prefetch_entries_exist() {
        assert_eq!(t1_variant(1, 16), ("_t1p", 396));
        assert_eq!(t1_variant(1, 32), ("_t1p", 264));
        assert_eq!(t1_variant(2, 16), ("", 1056));
        let off = crate::switches::scoped(&[("LINEAR_T1_PREFETCH", "off")], || t1_variant(1, 16)).unwrap();
        assert_eq!(off, ("_t1", 1056));
        let src = include_str!("kernels/linear.cu");
        for fmt in ["f32", "bf16", "fp8", "fp4"] {
            assert!(src.contains(&format!("FS_LINEAR_PF_ENTRY(linear_{fmt}_t1p,")), "{fmt}");
            for k in ["", "_q", "_grouped"] {
                let name = format!("linear_{fmt}_t1p{k}");
                assert!(ENTRY_POINTS.iter().any(|(f, names)| *f == "linear.cu" && names.contains(&name.as_str())), "{name}");
            }
        }
    }

    /// Every tile's entry point for every format it serves is a listed kernel (the loader looks
    /// each up by name: a missing one would fail `Gpu::open`), and its shared memory fits a block
    /// (227 KB on Hopper).
    #[test]
    fn every_tile_names_a_listed_kernel_that_fits() {
        let listed: Vec<&str> = ENTRY_POINTS.iter().flat_map(|(_, names)| names.iter().copied()).collect();
        let mut n = 0;
        for (fmt, tile, split) in GemmTile::kernels() {
            let name = tile.entry(fmt, split);
            assert!(listed.contains(&name.as_str()), "{name} is not a listed entry point");
            let smem = gemm_smem_bytes(fmt, tile, split);
            assert!(smem <= 232_448, "{name}: {smem} bytes of shared memory");
            n += 1;
        }
        // f32: 3 mma.sync tiles; bf16/FP8/FP4: 5 tiles × bf16 and split activations.
        assert_eq!(n, 3 + 3 * 5 * 2);
        // The wgmma layout's stage rule: 4 stages where they fit, 3 otherwise (largest: FP4 split
        // 128 × 256 at 230,400 bytes with 4).
        assert_eq!(wb_smem("fp4", 128, 256, true), 1024 + 4 * (128 * 128 * 2 + 256 * 32) + 2 * 256 * 128);
        assert_eq!(wb_smem("fp8", 128, 256, true), 1024 + 3 * (128 * 128 * 2 + 256 * 64) + 2 * 256 * 128);
        assert_eq!(wb_smem("bf16", 64, 128, true), 1024 + 3 * (64 * 128 * 2 + 128 * 128));
    }

    /// `choose` ranks the mma.sync tiles only and picks the big tile for big problems, the small
    /// one for few blocks.
    #[test]
    fn choose_picks_an_mma_sync_tile() {
        assert_eq!(GemmTile::choose(8192, 32768, 132), GemmTile::Large);
        assert_eq!(GemmTile::choose(64, 1024, 132), GemmTile::Small);
        for (t, n) in [(64, 64), (200, 32768), (2048, 1024), (8192, 4096)] {
            assert!(!GemmTile::choose(t, n, 132).is_wgmma());
        }
    }
}
