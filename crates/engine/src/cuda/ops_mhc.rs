//! Launchers for the mHC family (`kernels/mhc.cu`: spec §4.2 pre with Sinkhorn, §4.3 post, §4.12 head
//! collapse) and the MoE family (`kernels/moe.cu`: spec §4.11 router, clamped SwiGLU, row
//! gather/scatter, slot combine), plus [`Gpu::moe_forward`], the host glue that runs a whole MoE layer
//! for T tokens on the device (router, routed experts grouped by expert, shared expert, combine).
//!
//! Every launcher validates shapes and buffer lengths first ([`CudaError::Unsupported`] on bad input);
//! activation buffers may be longer than needed (only the leading elements are used), weights must
//! have exactly their stated size. All kernels are deterministic (fixed reduction orders, no atomics).

use super::drv;
use super::graph::DevBuf;
use super::gpu::{Gpu, GpuWeight};
use super::CudaError;
use crate::weights::HcWeights;
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use flashseek_model::config::{Ds4Config, ScoringFunc};

/// Entry points of `kernels/mhc.cu`.
pub const MHC_ENTRY_POINTS: &[&str] = &[
    "hc_mix_partial_f32",
    "hc_pre_f32",
    "hc_post_f32",
    "hc_head_f32",
    "hc_post_mix_f32",
    "hc_pre_coef_f32",
    "hc_pre_norm_f32",
    "hc_pre_norm_wide_f32",
    "hc_post_bf16",
    "hc_post_mix_bf16",
    "hc_pre_norm_bf16",
    "hc_pre_norm_wide_bf16",
    "hc_gather_bf16",
    "hc_widen_bf16",
    "hc_post_mix_tc_bf16",
];

/// Element type of the residual streams `[T, n, d]` on the device: `f32` (the exact path) or `u16`,
/// bf16 bits (`MHC_BF16_STREAMS`: DeepSeek's reference keeps the streams in the activation dtype,
/// bf16, spec §4.1 / §4.3). The kernels that read or write the streams between sub-blocks
/// ([`Gpu::hc_post`], [`Gpu::hc_post_mix`], [`Gpu::hc_pre_norm`]) take either; with bf16 the posts
/// compute in f32 (post_k·y, then fmaf over j — as OFF-M computes before its cast; the f32 path
/// computes in f64) and round to nearest even, and every sum over the streams runs over the stored
/// values in the f32 kernels' order (kernels/mhc.cu, `HcS`, `hc_post_f32_expr`).
pub trait HcStream: sealed::Sealed + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default + Unpin {
    /// This element type's entry points (`_f32` / `_bf16`; every one in [`MHC_ENTRY_POINTS`]):
    /// hc_post, hc_post_mix, hc_pre_norm and hc_pre_norm_wide.
    const POST: &'static str;
    /// See [`HcStream::POST`].
    const POST_MIX: &'static str;
    /// See [`HcStream::POST`].
    const PRE_NORM: &'static str;
    /// See [`HcStream::POST`].
    const PRE_NORM_WIDE: &'static str;
    /// hc_pre_norm stages a token's streams in shared memory (`HcS::HCN_STAGE` in mhc.cu: bf16, whose
    /// n·d values take at most [`HC_NORM_STAGE_MAX`] bytes): its launches give it n·d·2 bytes.
    const NORM_STAGED: bool;
}

/// [`HcStream`] is implemented for f32 and u16 only (the kernels that exist).
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
}

impl HcStream for f32 {
    const POST: &'static str = "hc_post_f32";
    const POST_MIX: &'static str = "hc_post_mix_f32";
    const PRE_NORM: &'static str = "hc_pre_norm_f32";
    const PRE_NORM_WIDE: &'static str = "hc_pre_norm_wide_f32";
    const NORM_STAGED: bool = false;
}

impl HcStream for u16 {
    const POST: &'static str = "hc_post_bf16";
    const POST_MIX: &'static str = "hc_post_mix_bf16";
    const PRE_NORM: &'static str = "hc_pre_norm_bf16";
    const PRE_NORM_WIDE: &'static str = "hc_pre_norm_wide_bf16";
    const NORM_STAGED: bool = true;
}

/// The routed experts' outputs `[t·k, d]` (one row per (token, slot)) that a MoE path hands to
/// [`Gpu::moe_combine`]: f32, or bf16 bits (`MOE_DOWN_BF16_OUT`, [`Gpu::moe_combine_bf16`]).
#[derive(Clone, Copy)]
pub(crate) enum SlotOut<'a> {
    /// f32 values.
    F32(&'a CudaSlice<f32>),
    /// bf16 bits.
    Bf16(&'a CudaSlice<u16>),
}

/// Entry points of `kernels/moe.cu`.
pub const MOE_ENTRY_POINTS: &[&str] = &[
    "router_scores_f32",
    "swiglu_f32",
    "gather_rows_f32",
    "scatter_rows_f32",
    "moe_combine_f32",
    "moe_combine_bf16",
    "moe_group_scan",
    "moe_group_plan",
    "moe_gather_bf16",
    "moe_gemv_fp4_swiglu",
    "moe_gemv_fp4_down",
    "moe_gemv_fp4_swiglu_f32",
    "moe_gemv_fp4_down_f32",
    "moe_gemv_fp4_mma_swiglu",
    "moe_gemv_fp4_mma_down",
    "moe_gemv_fp4_mma_swiglu_ks4",
    "moe_gemv_fp4_mma_down_ks4",
];

/// Most residual streams `n` (`hc_mult`) the mHC kernels handle (`HC_MAXN` in mhc.cu).
pub const HC_MAX_STREAMS: usize = 4;
/// Most routed experts the router kernel handles (`MOE_MAXE` in moe.cu).
pub const ROUTER_MAX_EXPERTS: usize = 1024;
/// Most experts per token the router kernel handles (`MOE_MAXK` in moe.cu).
pub const ROUTER_MAX_TOP_K: usize = 16;

/// Block size of the mHC mix kernels (`HC_THREADS` in mhc.cu, their `__launch_bounds__`).
const HC_THREADS: u32 = 256;
/// Splits of the mix dot products per token (`HC_SPLIT` in mhc.cu).
const HC_SPLIT: usize = 64;
/// Floats per (token, split) of the partial sums (`HC_PART` in mhc.cu).
const HC_PART: usize = 32;
/// Tokens per block of the partial pass (`HC_WARPS`·`HC_TT` in mhc.cu: 4 warps of 4 tokens).
const HC_PARTIAL_TOKENS: usize = 16;
/// Block size of the partial pass (`HC_PARTIAL_THREADS` in mhc.cu, its `__launch_bounds__`).
const HC_PARTIAL_THREADS: u32 = 128;
/// Channels per block of hc_post_mix_f32 (`HCX_RUN` in mhc.cu, two per lane): a token's MHC_FUSED
/// mix partials are `ceil(d / HC_MIX_RUN)` channel runs.
const HC_MIX_RUN: usize = 64;
/// Tokens per block of hc_post_mix_f32 (`HCX_WARPS`·`HCX_TT` in mhc.cu: 4 warps of 4 tokens).
const HC_MIX_TOKENS: usize = 16;
/// Block size of hc_post_mix_f32 (`HCX_THREADS` in mhc.cu, its `__launch_bounds__`).
const HC_MIX_THREADS: u32 = 128;
/// Dynamic shared memory of hc_post_mix_f32 in bytes (`HCX_SMEM` in mhc.cu: each of its 4 warps'
/// lane-sum rows, 4 tokens × 25 rows of 36 floats); set as the function's limit when the kernels load.
pub(crate) const HC_MIX_SMEM: usize = 4 * 4 * 25 * 36 * 4;
/// Channels per run of hc_post_mix_tc_bf16 (`HCT_RUN` in mhc.cu; `MHC_MIX_TC`): a token's partials
/// are `ceil(d / 128)` runs.
const HC_MIX_TC_RUN: usize = 128;
/// Channels per chunk of a run of hc_post_mix_tc_bf16 (`HCT_CHUNK` in mhc.cu: 8 per lane quad).
const HC_MIX_TC_CHUNK: usize = 32;
/// Tokens per block of hc_post_mix_tc_bf16 (`HCT_WARPS` warps of 16, the MMA's rows).
const HC_MIX_TC_TOKENS: usize = 64;
/// Block size of hc_post_mix_tc_bf16 (`HCT_THREADS` in mhc.cu, its `__launch_bounds__`).
const HC_MIX_TC_THREADS: u32 = 128;
/// Doubles per token of a coefficient record ([`HcPostCoefs`]; `HC_REC` in mhc.cu): pre at 0, post
/// at [`HC_REC_POST`], comb at [`HC_REC_COMB`], their f32 copies from [`HC_REC_F32`] on.
const HC_REC: usize = 34;
/// Offset of post in a coefficient record (`HC_REC_POST` in mhc.cu).
const HC_REC_POST: usize = 4;
/// Offset of comb in a coefficient record (`HC_REC_COMB` in mhc.cu).
const HC_REC_COMB: usize = 8;
/// Offset (in doubles) of a coefficient record's f32 copies of post (floats 0 … n − 1) and comb
/// (C[j][k] at float `HC_MAX_STREAMS` + j·n + k), two floats per double slot, low half first
/// (`HC_REC_F32` in mhc.cu): what the bf16 streams' f32 post reads.
const HC_REC_F32: usize = 24;
// The record's layout (mhc.cu asserts the same): post and comb as doubles before the f32 copies,
// room for HC_MAX_STREAMS + HC_MAX_STREAMS² floats after them, an even count of doubles (16-byte
// records for the double2 loads).
const _: () = assert!(HC_REC_COMB + HC_MAX_STREAMS * HC_MAX_STREAMS <= HC_REC_F32 && 2 * (HC_REC - HC_REC_F32) >= HC_MAX_STREAMS * (1 + HC_MAX_STREAMS) && HC_REC.is_multiple_of(2));
/// Tokens (a warp each) per block of hc_pre_coef_f32 (`HCC_WARPS` in mhc.cu).
const HC_COEF_TOKENS: usize = 8;
/// Widest hidden size hc_pre_norm_f32 handles (16 channels per thread of `HC_THREADS`); up to
/// [`HC_NORM_MAX_D`] runs hc_pre_norm_wide_f32 (`HCN_V` = 32 per thread).
const HC_NORM_NARROW_D: usize = 16 * HC_THREADS as usize;
/// Widest hidden size the fused pre + RMSNorm (`MHC_FUSED`) handles (`HCN_V`·`HC_THREADS` in mhc.cu);
/// wider models run [`Gpu::hc_pre`] and [`Gpu::rms_norm`].
pub const HC_NORM_MAX_D: usize = 32 * HC_THREADS as usize;
/// Dynamic shared memory limit of hc_pre_norm_bf16 / _wide_bf16 (set when the kernels load): a
/// token's bf16 streams at the widest fused hidden size, 4 × [`HC_NORM_MAX_D`] × 2 bytes.
pub(crate) const HC_NORM_STAGE_MAX: usize = HC_MAX_STREAMS * HC_NORM_MAX_D * 2;
/// Block size of router_scores_f32 (`MOE_THREADS` in moe.cu).
const MOE_THREADS: u32 = 256;
/// Block size of the elementwise and row kernels.
const ROW_THREADS: u32 = 256;

fn bad(what: &'static str, detail: impl Into<String>) -> CudaError {
    CudaError::Unsupported { what, detail: detail.into() }
}

/// Checks that device buffer `name` holds at least `need` elements.
fn need(what: &'static str, name: &str, len: usize, need: usize) -> Result<(), CudaError> {
    if len < need {
        return Err(bad(what, format!("{name} holds {len} elements, {need} needed")));
    }
    Ok(())
}

/// Checks that weight buffer `name` holds exactly `want` elements.
fn exact(what: &'static str, name: &str, len: usize, want: usize) -> Result<(), CudaError> {
    if len != want {
        return Err(bad(what, format!("{name} holds {len} elements, expected {want}")));
    }
    Ok(())
}

/// `v` as a kernel `int`, or an error naming it.
fn int(what: &'static str, name: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| bad(what, format!("{name} = {v} exceeds the kernel's 32-bit range")))
}

/// mHC parameters of one sub-block (spec §4.2) or of the final head (spec §4.12) on the device.
pub struct GpuHcWeights {
    /// Φ: `[(2+n)·n, n·d]` for a sub-block, `[n, n·d]` for the head; f32 row-major.
    pub fn_: CudaSlice<f32>,
    /// A sub-block's Φ in channel runs ([`hc_phi_runs`]) for hc_post_mix_f32, made from `fn_` by
    /// [`GpuHcWeights::from_host`]; `None` for the head.
    fn_runs: Option<CudaSlice<f32>>,
    /// A sub-block's Φ as three bf16 planes in MMA fragment order ([`hc_phi_tc`]) for
    /// hc_post_mix_tc_bf16 (`MHC_MIX_TC`); `None` for the head and for d not a multiple of 8.
    fn_tc: Option<CudaSlice<u32>>,
    /// Biases b: `[(2+n)·n]` or `[n]`.
    pub base: CudaSlice<f32>,
    /// Scales α: `[3]` (pre, post, comb) or `[1]`.
    pub scale: CudaSlice<f32>,
}

impl GpuHcWeights {
    /// Uploads CPU-side mHC weights (sub-block: `fn_` [(2+n)·n, n·d], base, scale [3]; the head:
    /// `fn_` [n, n·d], base [n], scale [1]).
    ///
    /// Errors: `fn_` not `[(2+n)·n or n, n·d]` for the `base` it comes with (n = `hc_mult`), device
    /// allocation or copy failures.
    pub fn upload(gpu: &Gpu, w: &HcWeights, n: usize) -> Result<Self, CudaError> {
        Self::from_host(gpu, &w.fn_.data, &w.base, &w.scale, n)
    }

    /// The weights from host slices for `n` streams: Φ `fn_` row-major `[m, n·d]`, base b `[m]`,
    /// scale α, with m = `base.len()` either (2+n)·n (a sub-block) or n (the head). A sub-block's Φ is
    /// also stored in runs for hc_post_mix_f32 ([`hc_phi_runs`]; 1.5 MiB more per sub-block at
    /// Flash's n 4, d 4,096) and, when d is a multiple of 8, as bf16 planes in fragment order for
    /// hc_post_mix_tc_bf16 ([`hc_phi_tc`]; 2.25 MiB more).
    ///
    /// Errors: n outside 1..=4, m neither (2+n)·n nor n, `fn_` not m rows of n·d (d > 0); device
    /// allocation or copy failures.
    pub fn from_host(gpu: &Gpu, fn_: &[f32], base: &[f32], scale: &[f32], n: usize) -> Result<Self, CudaError> {
        const W: &str = "mHC weights";
        let m = base.len();
        if n == 0 || n > HC_MAX_STREAMS || (m != (2 + n) * n && m != n) {
            return Err(bad(W, format!("{m} biases for n = {n} streams: expected (2+n)·n (a sub-block) or n (the head), 1 ≤ n ≤ {HC_MAX_STREAMS}")));
        }
        if fn_.is_empty() || !fn_.len().is_multiple_of(m * n) {
            return Err(bad(W, format!("Φ holds {} values, not {m} rows of n·d with n = {n}", fn_.len())));
        }
        let d = fn_.len() / (m * n);
        let sub_block = m == (2 + n) * n;
        let fn_runs = if sub_block { Some(gpu.upload(&hc_phi_runs(fn_, m, n, d))?) } else { None };
        // The planes must add up to Φ: every value finite and below bf16's largest (else no fragments,
        // and the bf16 streams' post keeps the CUDA-core mix).
        let planes_exact = fn_.iter().all(|v| v.abs() < 3.0e38);
        let fn_tc = if sub_block && d.is_multiple_of(8) && planes_exact { Some(gpu.upload(&hc_phi_tc(fn_, m, n, d))?) } else { None };
        Ok(GpuHcWeights { fn_: gpu.upload(fn_)?, fn_runs, fn_tc, base: gpu.upload(base)?, scale: gpu.upload(scale)? })
    }
}

impl GpuHcWeights {
    /// Whether hc_post_mix_tc_bf16's fragments of Φ exist ([`Gpu::hc_post_mix_tc`] can take these
    /// weights as `next`): a sub-block's Φ with d a multiple of 8 and every value finite and below
    /// 3·10^38 (so that [`bf16_planes`] add up to it). Device memory: 2.25 MiB per sub-block at
    /// Flash's n 4, d 4,096, built at upload whatever the switches (qualify and the switch matrix
    /// turn `MHC_BF16_STREAMS` on and off over one uploaded model).
    pub fn has_mix_fragments(&self) -> bool {
        self.fn_tc.is_some()
    }
}

/// A sub-block's Φ `[m, n·d]` (row-major, stream k's channel i at column k·d + i) rearranged in runs
/// of `HC_MIX_RUN` channels for hc_post_mix_f32: `[ceil(d / 64)][m][n][64]`, run b holding
/// Φ[o, k·d + 64·b + c] at ((b·m + o)·n + k)·64 + c and zeros past d, so that a block's warp reads its
/// lanes' pairs at fixed offsets from one address (measured: 1,984 instructions per warp and four
/// tokens at Flash's n 4 against 3,104 with the offsets computed per load, with the other changes of
/// the same commit). `fn_` must hold m·n·d values ([`GpuHcWeights::from_host`] checks it).
pub(crate) fn hc_phi_runs(fn_: &[f32], m: usize, n: usize, d: usize) -> Vec<f32> {
    let nb = d.div_ceil(HC_MIX_RUN);
    let mut out = vec![0f32; nb * m * n * HC_MIX_RUN];
    for b in 0..nb {
        let c1 = HC_MIX_RUN.min(d - b * HC_MIX_RUN);
        for o in 0..m {
            for k in 0..n {
                let src = &fn_[o * n * d + k * d + b * HC_MIX_RUN..][..c1];
                out[((b * m + o) * n + k) * HC_MIX_RUN..][..c1].copy_from_slice(src);
            }
        }
    }
    out
}

/// The three bf16 planes of `v` (bits; nearest even each): p0 = bf16(v), p1 = bf16(v − p0), p2 =
/// bf16(v − p0 − p1). Each difference is exact in f32 and each plane carries the next 8 of f32's 24
/// significand bits, so p0 + p1 + p2 = v while the third plane stays normal and p0 finite (|v| within about 2^-100 … 3.3·10^38; test
/// `phi_planes_are_exact`): with exact products and f32 accumulation, three bf16 MMAs give an f32
/// dot product against the f32 Φ (`MHC_MIX_TC`; the split of the "3xTF32" / bf16x3 emulations).
pub(crate) fn bf16_planes(v: f32) -> [u16; 3] {
    use flashseek_model::quant::{bf16_to_f32, f32_to_bf16};
    let p0 = f32_to_bf16(v);
    let r1 = v - bf16_to_f32(p0);
    let p1 = f32_to_bf16(r1);
    let p2 = f32_to_bf16(r1 - bf16_to_f32(p1));
    [p0, p1, p2]
}

/// A sub-block's Φ `[m, n·d]` (row-major, stream k's channel i at column k·d + i; d a multiple of 8)
/// as hc_post_mix_tc_bf16's B fragments (mma.sync m16n8k16, `MHC_MIX_TC`): u32 words, uint4 (((b·4 +
/// q)·n + k)·F4 + f)·32 + ℓ for run b (128 channels), chunk q (32), stream k and lane ℓ (g = ℓ / 4,
/// c = ℓ % 4), F4 = 3·ceil(m / 8); word w = 4f + j of the lane's = ((s·NT + nt)·3 + p)·2 + r holds
/// [`bf16_planes`]' plane p of Φ[8·nt + g, k·d + i] for i = 128b + 32q + 8c + 4s + 2r (low half)
/// and i + 1 (high half), zero for rows ≥ m or channels ≥ d. That is the PTX ISA's B fragment (b0,
/// b1 at k = 2c, 2c + 1; b2, b3 at 2c + 8, 2c + 9; column g) with k step s's logical k 2c, 2c + 1,
/// 2c + 8, 2c + 9 standing for channels 8c + 4s + 0 … 3, the map the kernel's A fragments follow
/// (the lane's 16 loaded bytes; test `phi_tc_fragments_multiply_as_mma`).
pub(crate) fn hc_phi_tc(fn_: &[f32], m: usize, n: usize, d: usize) -> Vec<u32> {
    let nt = m.div_ceil(8);
    let f4 = 3 * nt;
    let chunks = HC_MIX_TC_RUN / HC_MIX_TC_CHUNK;
    let nb = d.div_ceil(HC_MIX_TC_RUN);
    let mut out = vec![0u32; hc_phi_tc_len(m, n, d)];
    // Each value's three planes, computed once (the loops below take one plane at a time).
    let mut planes: [Vec<u16>; 3] = std::array::from_fn(|_| Vec::with_capacity(fn_.len()));
    for v in fn_ {
        planes.iter_mut().zip(bf16_planes(*v)).for_each(|(plane, bits)| plane.push(bits));
    }
    for b in 0..nb {
        for q in 0..chunks {
            for k in 0..n {
                for lane in 0..32 {
                    let (g, c) = (lane / 4, lane % 4);
                    for s in 0..2 {
                        for ti in 0..nt {
                            let o = 8 * ti + g;
                            for (p, values) in planes.iter().enumerate() {
                                for r in 0..2 {
                                    let w = ((s * nt + ti) * 3 + p) * 2 + r;
                                    let i = HC_MIX_TC_RUN * b + HC_MIX_TC_CHUNK * q + 8 * c + 4 * s + 2 * r;
                                    let plane = |i: usize| if o < m && i < d { u32::from(values[o * n * d + k * d + i]) } else { 0 };
                                    out[((((b * chunks + q) * n + k) * f4 + w / 4) * 32 + lane) * 4 + w % 4] = plane(i) | (plane(i + 1) << 16);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Words of [`hc_phi_tc`]'s layout for m mixes of n streams of width d.
fn hc_phi_tc_len(m: usize, n: usize, d: usize) -> usize {
    d.div_ceil(HC_MIX_TC_RUN) * (HC_MIX_TC_RUN / HC_MIX_TC_CHUNK) * n * 3 * m.div_ceil(8) * 32 * 4
}

/// What differs between the post + mix kernels' launches ([`Gpu::hc_post_mix`],
/// [`Gpu::hc_post_mix_tc`]): the caller's name for errors, the entry point, channels per run (one
/// partial row per token and run), tokens and threads per block, dynamic shared memory in bytes.
struct PostMixLaunch {
    what: &'static str,
    entry: &'static str,
    run: usize,
    tokens: usize,
    threads: u32,
    smem: usize,
}

/// The mix partial sums of one mHC pre in channel blocks (`MHC_FUSED`), from [`Gpu::hc_post_mix`] or
/// [`Gpu::hc_post_mix_tc`]: `part` `[t, blocks, 32]` f32 holds, for each token and run of channels
/// (64 for hc_post_mix_f32 / _bf16, 128 for hc_post_mix_tc_bf16; all n streams), the `m` sums `Σ Φ[o, ·]·x̄` and the squared norm `Σ x̄²` at index `m`; [`Gpu::hc_pre_norm`]
/// adds the blocks in order. (gpu-check also builds them from hc_mix_partial_f32's 64 splits.)
pub struct HcMixPartials {
    part: DevBuf<f32>,
    blocks: usize,
    m: usize,
    t: usize,
    d: usize,
    /// Device address of the Φ the partials were made with: [`Gpu::hc_pre_norm`] refuses another
    /// sub-block's (the attention and MoE pre's Φ have the same shape).
    phi: u64,
}

/// The coefficients of one mHC pre as doubles (`MHC_FUSED`), from [`Gpu::hc_pre_norm`]: a record of
/// `HC_REC` = 34 f64 per token — the stream weights of the pre at 0, post at 4, comb at 8 (C[j][k] at
/// 8 + j·n + k), post and comb being exactly the f32 values written to the pre's `post` / `comb`, and
/// from slot 24 on those f32 values themselves (two per slot: post at float 0, comb at float 4), which
/// the bf16 streams' f32 post reads (`MHC_BF16_STREAMS`).
/// [`Gpu::hc_post_mix`] loads them instead of converting 20 floats per lane and token (the f32 → f64
/// conversions were the busiest pipe of its post: 16 per clock and SM on Hopper).
pub struct HcPostCoefs {
    rec: DevBuf<f64>,
    t: usize,
    n: usize,
}

impl HcPostCoefs {
    /// A record from post `[t, n]` and comb `[t, n, n]` (f32, on the device) through the host, with
    /// zero pre weights: what gpu-check gives [`Gpu::hc_post_mix`] for coefficients made elsewhere.
    ///
    /// Errors: n outside 1..=4, buffers shorter than `t` tokens, device copies.
    pub(crate) fn from_f32(gpu: &Gpu, post: &CudaSlice<f32>, comb: &CudaSlice<f32>, t: usize, n: usize) -> Result<Self, CudaError> {
        const W: &str = "HcPostCoefs::from_f32";
        if n == 0 || n > HC_MAX_STREAMS {
            return Err(bad(W, format!("n = {n} streams (need 1 ≤ n ≤ {HC_MAX_STREAMS})")));
        }
        need(W, "post", post.len(), t * n)?;
        need(W, "comb", comb.len(), t * n * n)?;
        let (p, c) = (gpu.download(post)?, gpu.download(comb)?);
        let mut rec = vec![0f64; (t * HC_REC).max(1)];
        for ti in 0..t {
            let r = &mut rec[ti * HC_REC..(ti + 1) * HC_REC];
            r[HC_REC_POST..HC_REC_POST + n].iter_mut().zip(&p[ti * n..(ti + 1) * n]).for_each(|(o, v)| *o = *v as f64);
            r[HC_REC_COMB..HC_REC_COMB + n * n].iter_mut().zip(&c[ti * n * n..(ti + 1) * n * n]).for_each(|(o, v)| *o = *v as f64);
            // The f32 copies, two per double slot (little-endian: the even float in the low half).
            let mut floats = [0f32; 2 * (HC_REC - HC_REC_F32)];
            floats[..n].copy_from_slice(&p[ti * n..(ti + 1) * n]);
            floats[HC_MAX_STREAMS..HC_MAX_STREAMS + n * n].copy_from_slice(&c[ti * n * n..(ti + 1) * n * n]);
            for (slot, pair) in r[HC_REC_F32..].iter_mut().zip(floats.chunks(2)) {
                *slot = f64::from_bits(u64::from(pair[0].to_bits()) | (u64::from(pair[1].to_bits()) << 32));
            }
        }
        Ok(HcPostCoefs { rec: DevBuf::plain(gpu.upload(&rec)?), t, n })
    }

    /// How many post and comb entries — the doubles and their f32 copies — differ in their bits from
    /// `other`'s over the tokens and streams both hold (gpu-check: the records against
    /// [`HcPostCoefs::from_f32`] of the f32 outputs, which checks that function's packing too).
    ///
    /// Errors: device copies.
    pub(crate) fn differing_post_comb(&self, gpu: &Gpu, other: &HcPostCoefs) -> Result<usize, CudaError> {
        let (a, b) = (gpu.download(&self.rec)?, gpu.download(&other.rec)?);
        let (t, n) = (self.t.min(other.t), self.n.min(other.n));
        let mut differ = 0;
        for ti in 0..t {
            let (ra, rb) = (&a[ti * HC_REC..(ti + 1) * HC_REC], &b[ti * HC_REC..(ti + 1) * HC_REC]);
            let idx = (HC_REC_POST..HC_REC_POST + n).chain(HC_REC_COMB..HC_REC_COMB + n * n);
            differ += idx.filter(|&i| ra[i].to_bits() != rb[i].to_bits()).count();
            // The f32 copies (two per slot, the even float in the low half).
            let float = |r: &[f64], e: usize| (r[HC_REC_F32 + e / 2].to_bits() >> (32 * (e % 2))) as u32;
            let fidx = (0..n).chain(HC_MAX_STREAMS..HC_MAX_STREAMS + n * n);
            differ += fidx.filter(|&e| float(ra, e) != float(rb, e)).count();
        }
        Ok(differ)
    }
}

/// The device address of a sub-block's Φ (identifies it; no synchronisation is involved, the
/// context tracks no events).
fn phi_address(gpu: &Gpu, w: &GpuHcWeights) -> u64 {
    use cudarc::driver::DevicePtr;
    w.fn_.device_ptr(&gpu.stream).0
}

/// One SwiGLU expert on the device (spec §4.11): w1/w3 `[inter, d]`, w2 `[d, inter]`, any stored format.
pub struct GpuExpert {
    /// Gate projection.
    pub w1: GpuWeight,
    /// Down projection.
    pub w2: GpuWeight,
    /// Up projection.
    pub w3: GpuWeight,
}

impl GpuExpert {
    /// `(inter, d)` after checking that the three shapes agree.
    fn dims(&self) -> Result<(usize, usize), CudaError> {
        let (inter, d) = (self.w1.rows, self.w1.cols);
        if self.w3.rows != inter || self.w3.cols != d || self.w2.rows != d || self.w2.cols != inter || inter == 0 || d == 0 {
            return Err(bad(
                "moe expert",
                format!("w1 [{}, {}], w3 [{}, {}], w2 [{}, {}] do not form an expert", self.w1.rows, self.w1.cols, self.w3.rows, self.w3.cols, self.w2.rows, self.w2.cols),
            ));
        }
        Ok((inter, d))
    }
}

/// Expert selection of one MoE layer on the device.
pub enum GpuRouter {
    /// Hash layer: `tid2eid` `[vocab, top_k]` int32 expert ids.
    Hash {
        /// Row-major table.
        tid2eid: CudaSlice<i32>,
        /// Rows of the table.
        vocab: usize,
    },
    /// Score layer: selection bias β `[n_routed_experts]`.
    Score {
        /// `gate.bias`.
        bias: CudaSlice<f32>,
    },
}

/// One MoE layer's weights on the device (spec §4.11).
pub struct GpuMoeLayer {
    /// Router `gate.weight` `[E, d]`.
    pub gate: GpuWeight,
    /// Hash table or score bias.
    pub router: GpuRouter,
    /// Shared expert (weight 1).
    pub shared: GpuExpert,
    /// Routed experts, `n_routed_experts` of them.
    pub experts: Vec<GpuExpert>,
    /// Per-expert device addresses for the grouped MoE, built on first use (`None` inside: the
    /// experts cannot run grouped). Start with `OnceLock::new()`.
    pub tables: std::sync::OnceLock<Option<super::ops_moe::GpuExpertTables>>,
}

/// What [`Gpu::moe_forward`] returns.
pub struct GpuMoeOutput {
    /// MoE output `[T, d]`.
    pub out: DevBuf<f32>,
    /// Selected experts `[T, k]` (device).
    pub experts: DevBuf<i32>,
    /// Routing weights γ `[T, k]` (already × routed_scaling_factor).
    pub weights: DevBuf<f32>,
}

impl Gpu {
    /// Split-K partial sums of the `m` mix dot products `Φ·x̄` and of `x̄²` over each token's flattened
    /// streams (`nd` = n·d values; `fn_` is `[m, nd]`): returns `part` `[t, HC_SPLIT, HC_PART]`, which
    /// hc_pre_f32 / hc_head_f32 sum in split order. Callers have validated the shapes (`t` ≥ 1).
    fn hc_mix_partial(&self, x: &CudaSlice<f32>, fn_: &CudaSlice<f32>, m: usize, t: usize, nd: usize) -> Result<DevBuf<f32>, CudaError> {
        // SAFETY: uninitialised device memory; hc_mix_partial_f32 writes entries 0..=m of every
        // (token, split), which are the only ones hc_pre_f32 / hc_head_f32 read.
        let mut part = unsafe { self.scratch::<f32>(t * HC_SPLIT * HC_PART) }?;
        let cfg = LaunchConfig { grid_dim: (t.div_ceil(HC_PARTIAL_TOKENS) as u32, HC_SPLIT as u32, 1), block_dim: (HC_PARTIAL_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (t_i, m_i, nd_i) = (t as i32, m as i32, nd as i32);
        let mut b = self.stream.launch_builder(self.f("hc_mix_partial_f32"));
        b.arg(x).arg(fn_).arg(&mut part).arg(&t_i).arg(&m_i).arg(&nd_i);
        // SAFETY: matches hc_mix_partial_f32's signature; x holds t·nd and fn_ m·nd values (checked by
        // the callers), part t·HC_SPLIT·HC_PART.
        drv("hc_mix_partial_f32", unsafe { b.launch(cfg) })?;
        Ok(part)
    }

    /// mHC pre for `t` tokens (spec §4.2): from streams `x` (`[t, n, d]`) and the sub-block's Φ
    /// (`[(2+n)·n, n·d]`), b, α (`[3]`), writes the sub-block input `u` (`[t, d]`), `post` (`[t, n]`) and
    /// the Sinkhorn-normalised `comb` (`[t, n, n]`, `C[j][k]` at `j·n + k`; `iters` iterations).
    /// `eps` is `rms_norm_eps` (the RMS factor of the flattened streams), `hc_eps` the mHC eps.
    /// Two launches: hc_mix_partial_f32 (split-K mix dot products), then hc_pre_f32 (coefficients,
    /// Sinkhorn, `u`). Deterministic and batch invariant (a token's result does not depend on `t`).
    ///
    /// Errors: `n` outside 1..=4, `d` not a multiple of 4, or a buffer of the wrong size.
    #[allow(clippy::too_many_arguments)]
    pub fn hc_pre(
        &self,
        w: &GpuHcWeights,
        x: &CudaSlice<f32>,
        u: &mut CudaSlice<f32>,
        post: &mut CudaSlice<f32>,
        comb: &mut CudaSlice<f32>,
        t: usize,
        n: usize,
        d: usize,
        iters: usize,
        eps: f64,
        hc_eps: f64,
    ) -> Result<(), CudaError> {
        const W: &str = "hc_pre";
        let mix = pre_shapes(W, w, x.len(), ("u", u.len()), post, comb, t, n, d)?;
        if t == 0 {
            return Ok(());
        }
        let grid = int(W, "tokens", t)? as u32;
        let part = self.hc_mix_partial(x, &w.fn_, mix, t, n * d)?;
        let (n_i, d_i, it_i) = (n as i32, d as i32, int(W, "iters", iters)?);
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (HC_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("hc_pre_f32"));
        b.arg(&part).arg(x).arg(&w.base).arg(&w.scale).arg(u).arg(post).arg(comb).arg(&n_i).arg(&d_i).arg(&it_i).arg(&eps).arg(&hc_eps);
        // SAFETY: matches hc_pre_f32's signature; every buffer was checked to hold what the grid reads/writes.
        drv("hc_pre_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// mHC post for `t` tokens, in place on the streams `x` (`[t, n, d]`, f32 or bf16: [`HcStream`]),
    /// spec §4.3: `X'[k] = post_k·y + Σ_j C[j][k]·X[j]` (the sum over C's first index), with the
    /// sub-block output `y` (`[t, d]`) and `post` / `comb` from [`Gpu::hc_pre`].
    ///
    /// Errors: `n` outside 1..=4, `d` not a multiple of 4, or a buffer too short.
    #[allow(clippy::too_many_arguments)]
    pub fn hc_post<S: HcStream>(&self, x: &mut CudaSlice<S>, y: &CudaSlice<f32>, post: &CudaSlice<f32>, comb: &CudaSlice<f32>, t: usize, n: usize, d: usize) -> Result<(), CudaError> {
        const W: &str = "hc_post";
        hc_dims(W, n, d)?;
        need(W, "x", x.len(), t * n * d)?;
        need(W, "y", y.len(), t * d)?;
        need(W, "post", post.len(), t * n)?;
        need(W, "comb", comb.len(), t * n * n)?;
        if t == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (int(W, "tokens", t)? as u32, d.div_ceil(ROW_THREADS as usize) as u32, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (n_i, d_i) = (n as i32, d as i32);
        let entry = S::POST;
        let mut b = self.stream.launch_builder(self.f(entry));
        b.arg(x).arg(y).arg(post).arg(comb).arg(&n_i).arg(&d_i);
        // SAFETY: matches hc_post_f32's / hc_post_bf16's signature (x of S); buffers checked above.
        drv(entry, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `MHC_FUSED`, first half: the mHC post of one sub-block (spec §4.3, in place on `x` `[t, n, d]`,
    /// f32 or bf16 ([`HcStream`]), as [`Gpu::hc_post`] computes it for the same element type, bit for bit) when `post` = `Some((y, coefs))` (`y` `[t, d]`,
    /// `coefs` the sub-block pre's [`HcPostCoefs`]), then the mix partial sums of the NEXT sub-block's
    /// pre (spec §4.2: Φ of `next`, `[(2+n)·n, n·d]`, read in its channel runs) over the streams just
    /// written (as stored), so the pre does not read the streams once more for them. With `post` = `None` only the
    /// partials of `x` (the first pre of a forward). One launch (hc_post_mix_f32: a block per 64
    /// channels × 16 tokens, a warp per 4 tokens, `HC_MIX_SMEM` bytes of shared memory). Every token's
    /// partials are summed in a fixed order that does not depend on `t` (batch invariant,
    /// deterministic).
    ///
    /// Errors: `n` outside 1..=4, `d` not a multiple of 4, a buffer of the wrong size, coefficients
    /// for another `n` or fewer tokens, `next` without channel runs (the head's weights), or more than
    /// 65,535 × 16 tokens (the grid).
    #[allow(clippy::too_many_arguments)]
    pub fn hc_post_mix<S: HcStream>(&self, x: &mut CudaSlice<S>, post: Option<(&CudaSlice<f32>, &HcPostCoefs)>, next: &GpuHcWeights, t: usize, n: usize, d: usize) -> Result<HcMixPartials, CudaError> {
        const W: &str = "hc_post_mix";
        let m = mix_shapes(W, &next.fn_, x.len(), t, n, d)?;
        let runs = next.fn_runs.as_ref().ok_or_else(|| bad(W, "Φ without channel runs (the head's weights, not a sub-block's)"))?;
        exact(W, "Φ runs", runs.len(), d.div_ceil(HC_MIX_RUN) * m * n * HC_MIX_RUN)?;
        let launch = PostMixLaunch { what: W, entry: S::POST_MIX, run: HC_MIX_RUN, tokens: HC_MIX_TOKENS, threads: HC_MIX_THREADS, smem: HC_MIX_SMEM };
        self.post_mix_launch(&launch, x, post, next, runs, m, t, n, d)
    }

    /// `MHC_MIX_TC` (with `MHC_BF16_STREAMS`): [`Gpu::hc_post_mix`] on bf16 streams with the next
    /// pre's mix on tensor cores (hc_post_mix_tc_bf16: mma.sync m16n8k16 over the stored bf16 streams
    /// and Φ in three bf16 planes, [`hc_phi_tc`]; a warp per 16 tokens, a block per 128 channels × 64
    /// tokens; for t ≤ 16 the block's four warps share the 16-token tile, one 32-channel chunk each,
    /// with the same bits). The streams it writes are hc_post_mix_bf16's bits; the partials (per run of 128
    /// channels) are f32-accurate sums in another order than hc_post_mix_bf16's, so the pre after them
    /// differs from that path in the last bits (gpu-check `hc_post_mix_tc …`). Batch invariant and
    /// deterministic.
    ///
    /// Errors: as [`Gpu::hc_post_mix`] (with at most 65,535 × 64 tokens per call, the grid), and no
    /// fragments in `next` (the head's weights, `d` not a multiple of 8, or a Φ value too large for
    /// the planes: [`GpuHcWeights::has_mix_fragments`]).
    #[allow(clippy::too_many_arguments)]
    pub fn hc_post_mix_tc(&self, x: &mut CudaSlice<u16>, post: Option<(&CudaSlice<f32>, &HcPostCoefs)>, next: &GpuHcWeights, t: usize, n: usize, d: usize) -> Result<HcMixPartials, CudaError> {
        const W: &str = "hc_post_mix_tc";
        let m = mix_shapes(W, &next.fn_, x.len(), t, n, d)?;
        let frags = next.fn_tc.as_ref().ok_or_else(|| bad(W, format!("Φ without MMA fragments (the head's weights, hidden size {d} not a multiple of 8, or a Φ value of 3·10^38 or more, which bf16 planes cannot hold)")))?;
        exact(W, "Φ fragments", frags.len(), hc_phi_tc_len(m, n, d))?;
        let launch = PostMixLaunch { what: W, entry: "hc_post_mix_tc_bf16", run: HC_MIX_TC_RUN, tokens: HC_MIX_TC_TOKENS, threads: HC_MIX_TC_THREADS, smem: 0 };
        self.post_mix_launch(&launch, x, post, next, frags, m, t, n, d)
    }

    /// The launch of a post + mix kernel (hc_post_mix_f32 / _bf16 / hc_post_mix_tc_bf16, the same
    /// arguments): checks y and the coefficients, allocates the partials `[t, ceil(d / run),
    /// HC_PART]` and launches a grid (runs, ceil(t / tokens)). `phi`: the kernel's layout of Φ, its
    /// length checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn post_mix_launch<S: HcStream, P: cudarc::driver::DeviceRepr>(
        &self,
        l: &PostMixLaunch,
        x: &mut CudaSlice<S>,
        post: Option<(&CudaSlice<f32>, &HcPostCoefs)>,
        next: &GpuHcWeights,
        phi: &CudaSlice<P>,
        m: usize,
        t: usize,
        n: usize,
        d: usize,
    ) -> Result<HcMixPartials, CudaError> {
        let blocks = d.div_ceil(l.run);
        if let Some((y, c)) = post {
            need(l.what, "y", y.len(), t * d)?;
            if c.n != n || c.t < t {
                return Err(bad(l.what, format!("coefficients for {} tokens of {} streams; need {t} of {n}", c.t, c.n)));
            }
        }
        // SAFETY: uninitialised device memory; the kernel writes entries 0..=m of every (token,
        // block), the only ones hc_pre_coef_f32 reads.
        let mut part = unsafe { self.scratch::<f32>((t * blocks * HC_PART).max(1)) }?;
        if t > 0 {
            let grid_y = t.div_ceil(l.tokens);
            if grid_y > 65_535 {
                return Err(bad(l.what, format!("{t} tokens: at most {} per call (the grid's y dimension)", 65_535 * l.tokens)));
            }
            let cfg = LaunchConfig { grid_dim: (blocks as u32, grid_y as u32, 1), block_dim: (l.threads, 1, 1), shared_mem_bytes: l.smem as u32 };
            let (t_i, n_i, d_i, has) = (int(l.what, "tokens", t)?, n as i32, d as i32, i32::from(post.is_some()));
            let null = 0u64;
            let mut b = self.stream.launch_builder(self.f(l.entry));
            b.arg(&mut *x);
            match post {
                Some((y, c)) => b.arg(y).arg(&c.rec),
                None => b.arg(&null).arg(&null),
            };
            b.arg(phi).arg(&mut part).arg(&t_i).arg(&n_i).arg(&d_i).arg(&has);
            // SAFETY: matches hc_post_mix_f32's / _bf16's / hc_post_mix_tc_bf16's signature (x of S);
            // x holds t·n·d values, y and the records (read only when has_post) their t rows, Φ the
            // kernel's layout (checked by the caller), part t·blocks·HC_PART.
            drv(l.entry, unsafe { b.launch(cfg) })?;
        }
        Ok(HcMixPartials { part, blocks, m, t, d, phi: phi_address(self, next) })
    }

    /// The partials of [`Gpu::hc_pre`]'s own first pass (hc_mix_partial_f32, 64 splits per token) as
    /// [`HcMixPartials`], so that gpu-check can give [`Gpu::hc_pre_norm`] and hc_pre_f32 the same sums.
    ///
    /// Errors: as [`Gpu::hc_pre`].
    pub(crate) fn hc_split_partials(&self, x: &CudaSlice<f32>, w: &GpuHcWeights, t: usize, n: usize, d: usize) -> Result<HcMixPartials, CudaError> {
        const W: &str = "hc_split_partials";
        let m = mix_shapes(W, &w.fn_, x.len(), t, n, d)?;
        int(W, "tokens", t)?;
        let part = if t == 0 {
            // SAFETY: never read (no token).
            unsafe { self.scratch::<f32>(1) }?
        } else {
            self.hc_mix_partial(x, &w.fn_, m, t, n * d)?
        };
        Ok(HcMixPartials { part, blocks: HC_SPLIT, m, t, d, phi: phi_address(self, w) })
    }

    /// `MHC_FUSED`, second half: the mHC pre of a sub-block (spec §4.2) from the partials `mix` of
    /// [`Gpu::hc_post_mix`] (made with this sub-block's Φ, for at least `t` tokens), followed by the
    /// sub-block's RMSNorm (spec §4.5 / §4.11 input norm, weight `norm` `[d]`, `norm_eps`): writes
    /// `out` = RMSNorm(u) `[t, d]` (u = Σ_j pre_j·x[j] over the streams `x` as stored, f32 or bf16:
    /// [`HcStream`]; u itself stays in registers), `post` `[t, n]` and `comb`
    /// `[t, n, n]`, and returns the coefficients as doubles for the sub-block's [`Gpu::hc_post_mix`].
    /// Given the same partials it computes the bits of hc_pre_f32 followed by rms_norm_f32 (same
    /// expressions, same reduction order) — what [`Gpu::rms_norm`] runs for d > 1,024; narrower rows
    /// go to rms_norm_rows_f32, whose order differs. Two launches: hc_pre_coef_f32 (a warp per token:
    /// totals, coefficients, Sinkhorn) and hc_pre_norm_f32 (a block per token: u and its norm).
    ///
    /// Errors: `n` outside 1..=4, `d` not a multiple of 4 or above [`HC_NORM_MAX_D`], partials for
    /// another mix size, fewer tokens or another sub-block's Φ, or a buffer of the wrong size.
    #[allow(clippy::too_many_arguments)]
    pub fn hc_pre_norm<S: HcStream>(
        &self,
        w: &GpuHcWeights,
        mix: &HcMixPartials,
        x: &CudaSlice<S>,
        norm: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<f32>,
        post: &mut CudaSlice<f32>,
        comb: &mut CudaSlice<f32>,
        t: usize,
        n: usize,
        d: usize,
        iters: usize,
        eps: f64,
        hc_eps: f64,
        norm_eps: f32,
    ) -> Result<HcPostCoefs, CudaError> {
        const W: &str = "hc_pre_norm";
        let m = pre_shapes(W, w, x.len(), ("out", out.len()), post, comb, t, n, d)?;
        if d > HC_NORM_MAX_D {
            return Err(bad(W, format!("hidden size {d} above the {HC_NORM_MAX_D} the fused norm holds")));
        }
        if mix.m != m || mix.t < t || mix.d != d {
            return Err(bad(W, format!("partials of {} mixes for {} tokens of width {}; need {m} for {t} of width {d}", mix.m, mix.t, mix.d)));
        }
        if mix.phi != phi_address(self, w) {
            return Err(bad(W, "partials made with another sub-block's Φ"));
        }
        if let Some(nw) = norm {
            need(W, "norm", nw.len(), d)?;
        }
        // SAFETY: uninitialised device memory; hc_pre_coef_f32 writes the pre (0..n), post and comb
        // (HC_REC_POST.., HC_REC_COMB..) entries of every token's record and their f32 copies
        // (floats 0..n and HC_MAX_STREAMS.. from HC_REC_F32), the only ones read.
        let mut rec = unsafe { self.scratch::<f64>((t * HC_REC).max(1)) }?;
        if t > 0 {
            let (t_i, s_i, n_i, d_i, it_i, null) = (int(W, "tokens", t)?, mix.blocks as i32, n as i32, d as i32, int(W, "iters", iters)?, 0u64);
            let cfg = LaunchConfig { grid_dim: (t.div_ceil(HC_COEF_TOKENS) as u32, 1, 1), block_dim: (32 * HC_COEF_TOKENS as u32, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.stream.launch_builder(self.f("hc_pre_coef_f32"));
            b.arg(&mix.part).arg(&s_i).arg(&w.base).arg(&w.scale).arg(&mut *post).arg(&mut *comb).arg(&mut rec);
            b.arg(&t_i).arg(&n_i).arg(&d_i).arg(&it_i).arg(&eps).arg(&hc_eps);
            // SAFETY: matches hc_pre_coef_f32's signature; part holds t·blocks·HC_PART (from
            // hc_post_mix), post t·n, comb t·n·n, rec t·HC_REC.
            drv("hc_pre_coef_f32", unsafe { b.launch(cfg) })?;
            let entry = if d <= HC_NORM_NARROW_D { S::PRE_NORM } else { S::PRE_NORM_WIDE };
            // bf16 streams: a token's n·d values staged in shared memory (≤ HC_NORM_STAGE_MAX).
            let smem = if S::NORM_STAGED && d.is_multiple_of(8) { n * d * 2 } else { 0 };
            let cfg = LaunchConfig { grid_dim: (t_i as u32, 1, 1), block_dim: (HC_THREADS, 1, 1), shared_mem_bytes: smem as u32 };
            let mut b = self.stream.launch_builder(self.f(entry));
            b.arg(&rec).arg(x);
            match norm {
                Some(nw) => b.arg(nw),
                None => b.arg(&null),
            };
            b.arg(out).arg(&n_i).arg(&d_i).arg(&norm_eps);
            // SAFETY: matches hc_pre_norm_{f32,bf16} / _wide_{f32,bf16}'s signature (x of S); rec
            // written above for t tokens, x holds t·n·d, out t·d, norm d values.
            drv(entry, unsafe { b.launch(cfg) })?;
        }
        Ok(HcPostCoefs { rec, t, n })
    }

    /// Hyper-head collapse for `t` tokens (spec §4.12 step 1, no Sinkhorn): `h = Σ_j π_j X[j]` (`[t, d]`)
    /// with `π = σ(α·ρ·(Φ_head x̄) + b) + hc_eps`; `w` holds Φ_head `[n, n·d]`, b `[n]`, α `[1]`. The final
    /// RMSNorm is [`Gpu::rms_norm`].
    ///
    /// Errors: `n` outside 1..=4, `d` not a multiple of 4, or a buffer of the wrong size.
    #[allow(clippy::too_many_arguments)]
    pub fn hc_head(&self, w: &GpuHcWeights, x: &CudaSlice<f32>, h: &mut CudaSlice<f32>, t: usize, n: usize, d: usize, eps: f64, hc_eps: f64) -> Result<(), CudaError> {
        const W: &str = "hc_head";
        hc_dims(W, n, d)?;
        exact(W, "fn", w.fn_.len(), n * n * d)?;
        exact(W, "base", w.base.len(), n)?;
        need(W, "scale", w.scale.len(), 1)?;
        need(W, "x", x.len(), t * n * d)?;
        need(W, "h", h.len(), t * d)?;
        if t == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (int(W, "tokens", t)? as u32, 1, 1), block_dim: (HC_THREADS, 1, 1), shared_mem_bytes: 0 };
        let part = self.hc_mix_partial(x, &w.fn_, n, t, n * d)?;
        let (n_i, d_i) = (n as i32, d as i32);
        let mut b = self.stream.launch_builder(self.f("hc_head_f32"));
        b.arg(&part).arg(x).arg(&w.base).arg(&w.scale).arg(h).arg(&n_i).arg(&d_i).arg(&eps).arg(&hc_eps);
        // SAFETY: matches hc_head_f32's signature; buffers checked above.
        drv("hc_head_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Router for `t` tokens (spec §4.11 steps 1–3) from the gate logits (`[t, e]`, e.g. from
    /// [`Gpu::linear`] with `gate.weight`): scores `sqrt(softplus)` (or σ), then experts from
    /// `tid2eid[ids[t]]` (hash) or the top-`k` of score + bias with ties to the lower index (score), and
    /// weights `γ = s / (Σ s + 1e-20) · routed_scaling_factor`. Writes `experts` (`[t, k]` int32) and
    /// `weights` (`[t, k]`). `ids` (`[t]` token ids) is read by hash routing only.
    ///
    /// A token id outside the table (or a table entry outside 0..e) yields experts −1 and NaN weights for
    /// that token. Errors: `e` > 1024, `k` = 0, `k` > min(e, 16), or a buffer of the wrong size.
    #[allow(clippy::too_many_arguments)]
    pub fn router(
        &self,
        logits: &CudaSlice<f32>,
        router: &GpuRouter,
        ids: &CudaSlice<i32>,
        experts: &mut CudaSlice<i32>,
        weights: &mut CudaSlice<f32>,
        t: usize,
        e: usize,
        k: usize,
        scoring: ScoringFunc,
        routed_scaling_factor: f64,
    ) -> Result<(), CudaError> {
        const W: &str = "router";
        if e == 0 || e > ROUTER_MAX_EXPERTS || k == 0 || k > e.min(ROUTER_MAX_TOP_K) {
            return Err(bad(W, format!("{e} experts, top-{k} (at most {ROUTER_MAX_EXPERTS} experts, 1..=min(E, {ROUTER_MAX_TOP_K}) per token)")));
        }
        need(W, "logits", logits.len(), t * e)?;
        need(W, "experts", experts.len(), t * k)?;
        need(W, "weights", weights.len(), t * k)?;
        let vocab = match router {
            GpuRouter::Hash { tid2eid, vocab } => {
                exact(W, "tid2eid", tid2eid.len(), vocab * k)?;
                need(W, "ids", ids.len(), t)?;
                int(W, "vocab", *vocab)?
            }
            GpuRouter::Score { bias } => {
                exact(W, "bias", bias.len(), e)?;
                0
            }
        };
        if t == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (int(W, "tokens", t)? as u32, 1, 1), block_dim: (MOE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (e_i, k_i) = (e as i32, k as i32);
        let sig = matches!(scoring, ScoringFunc::Sigmoid) as i32;
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f("router_scores_f32"));
        b.arg(logits);
        match router {
            GpuRouter::Hash { tid2eid, .. } => b.arg(&null).arg(tid2eid),
            GpuRouter::Score { bias } => b.arg(bias).arg(&null),
        };
        b.arg(ids).arg(experts).arg(weights).arg(&e_i).arg(&k_i).arg(&vocab).arg(&sig).arg(&routed_scaling_factor);
        // SAFETY: matches router_scores_f32's signature (bias or tid2eid null as the router kind says);
        // buffers checked above.
        drv("router_scores_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Clamped SwiGLU (spec §4.11) over the first `len` elements of separate gate/up buffers:
    /// `h = silu(min(g, limit)) · clamp(u, −limit, limit)`.
    ///
    /// Errors: a buffer shorter than `len`.
    pub fn swiglu(&self, g: &CudaSlice<f32>, u: &CudaSlice<f32>, h: &mut CudaSlice<f32>, len: usize, limit: f32) -> Result<(), CudaError> {
        const W: &str = "swiglu";
        need(W, "g", g.len(), len)?;
        need(W, "u", u.len(), len)?;
        need(W, "h", h.len(), len)?;
        if len == 0 {
            return Ok(());
        }
        let blocks = len.div_ceil(ROW_THREADS as usize).min(65535 * 16) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let len_i = len as i64;
        let mut b = self.stream.launch_builder(self.f("swiglu_f32"));
        b.arg(g).arg(u).arg(h).arg(&len_i).arg(&limit);
        // SAFETY: matches swiglu_f32's signature; buffers hold at least len elements.
        drv("swiglu_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `dst[r] = src[idx[r]]` for the `idx.len()` rows of width `d` (`src` has `src_rows` rows).
    /// An out-of-range index yields a NaN row.
    ///
    /// Errors: a buffer too short.
    pub fn gather_rows(&self, src: &CudaSlice<f32>, src_rows: usize, idx: &CudaView<'_, i32>, dst: &mut CudaSlice<f32>, d: usize) -> Result<(), CudaError> {
        self.launch_row_gather("gather_rows_f32", src, src_rows, idx, dst, d)
    }

    /// One block per index of `idx`: `kernel(src, idx, dst, src_rows, d)` (gather_rows_f32 or
    /// hc_gather_bf16, whose signatures these are), after checking the buffers (errors name the kernel).
    fn launch_row_gather<T: cudarc::driver::DeviceRepr>(&self, kernel: &'static str, src: &CudaSlice<f32>, src_rows: usize, idx: &CudaView<'_, i32>, dst: &mut CudaSlice<T>, d: usize) -> Result<(), CudaError> {
        let m = idx.len();
        need(kernel, "src", src.len(), src_rows * d)?;
        need(kernel, "dst", dst.len(), m * d)?;
        if m == 0 || d == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (int(kernel, "rows", m)? as u32, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (rows_i, d_i) = (int(kernel, "src rows", src_rows)?, int(kernel, "d", d)?);
        let mut b = self.stream.launch_builder(self.f(kernel));
        b.arg(src).arg(idx).arg(dst).arg(&rows_i).arg(&d_i);
        // SAFETY: matches gather_rows_f32's / hc_gather_bf16's signature (dst of T: f32 / u16); one
        // block per index, buffers checked above.
        drv(kernel, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// The embedding rows of the tokens' streams as bf16 stream bits (`MHC_BF16_STREAMS`, spec §4.1):
    /// `dst[r] = bf16(src[idx[r]])` for the `idx.len()` rows of width `d` (`src` f32 `[src_rows, d]`,
    /// `dst` u16 `[idx.len(), d]`; rounded to nearest even, exact for a bf16 checkpoint's embedding;
    /// an index outside `[0, src_rows)` gives a NaN row, as [`Gpu::gather_rows`]).
    ///
    /// Errors: buffers too short, more rows than a grid holds.
    pub fn hc_gather_bf16(&self, src: &CudaSlice<f32>, src_rows: usize, idx: &CudaView<'_, i32>, dst: &mut CudaSlice<u16>, d: usize) -> Result<(), CudaError> {
        self.launch_row_gather("hc_gather_bf16", src, src_rows, idx, dst, d)
    }

    /// bf16 stream bits widened to f32 (`MHC_BF16_STREAMS`): `dst[i] = f32(src[i])` for every `i <
    /// src.len()` — exact; what the head and recorded streams read.
    ///
    /// Errors: `dst` shorter than `src`.
    pub fn hc_widen_bf16(&self, src: &CudaView<'_, u16>, dst: &mut CudaSlice<f32>) -> Result<(), CudaError> {
        const W: &str = "hc_widen_bf16";
        let len = src.len();
        need(W, "dst", dst.len(), len)?;
        if len == 0 {
            return Ok(());
        }
        let blocks = len.div_ceil(ROW_THREADS as usize).min(65_535) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let len_i = len as i64;
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(src).arg(dst).arg(&len_i);
        // SAFETY: matches hc_widen_bf16's signature (grid-stride over len); dst holds len values.
        drv(W, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `dst[idx[r]] = src[r]` for the `idx.len()` rows of width `d` (`dst` has `dst_rows` rows; the
    /// indices must be distinct). An out-of-range index is skipped.
    ///
    /// Errors: a buffer too short.
    pub fn scatter_rows(&self, src: &CudaSlice<f32>, idx: &CudaView<'_, i32>, dst: &mut CudaSlice<f32>, dst_rows: usize, d: usize) -> Result<(), CudaError> {
        const W: &str = "scatter_rows";
        let m = idx.len();
        need(W, "src", src.len(), m * d)?;
        need(W, "dst", dst.len(), dst_rows * d)?;
        if m == 0 || d == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (int(W, "rows", m)? as u32, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (rows_i, d_i) = (int(W, "dst rows", dst_rows)?, int(W, "d", d)?);
        let mut b = self.stream.launch_builder(self.f("scatter_rows_f32"));
        b.arg(src).arg(idx).arg(dst).arg(&rows_i).arg(&d_i);
        // SAFETY: matches scatter_rows_f32's signature; one block per index, buffers checked above.
        drv("scatter_rows_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `out[t] = Σ_slot γ[t, slot]·slot_out[t, slot] (slot order) + shared[t]` for `t` tokens of width
    /// `d`, in f64 (`acc = fma(γ, v, acc)` per slot from 0, then + shared; rounded to f32):
    /// `slot_out` `[t, k, d]` holds the unscaled routed outputs `W2·h`, `weights` `[t, k]` the γ
    /// (applied here, after W2, as in exact mode; `None`: γ = 1, for the official order where γ came
    /// before W2), `shared` `[t, d]` the shared expert (optional). With `experts` = (`[t, k]` expert
    /// ids, E), slots whose expert lies outside 0..E count as zeros whatever their buffer holds (the
    /// grouped paths never write them). One launch (moe_combine_f32, 4 channels per thread when
    /// `d % 4 == 0`).
    ///
    /// Errors: a buffer too short.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(&self, slot_out: &CudaSlice<f32>, weights: Option<&CudaSlice<f32>>, experts: Option<(&CudaSlice<i32>, usize)>, shared: Option<&CudaSlice<f32>>, out: &mut CudaSlice<f32>, t: usize, k: usize, d: usize) -> Result<(), CudaError> {
        self.moe_combine_slots("moe_combine_f32", slot_out, weights, experts, shared, out, t, k, d)
    }

    /// [`Gpu::moe_combine`] on bf16 routed outputs (`slot_out` `[t, k, d]` bf16 bits; switch
    /// `MOE_DOWN_BF16_OUT`): each value widened exactly, then the same f64 sums — the bits of
    /// [`Gpu::moe_combine`] on the widened values. Half the slot bytes read (moe_combine_bf16).
    ///
    /// Errors: a buffer too short.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_bf16(&self, slot_out: &CudaSlice<u16>, weights: Option<&CudaSlice<f32>>, experts: Option<(&CudaSlice<i32>, usize)>, shared: Option<&CudaSlice<f32>>, out: &mut CudaSlice<f32>, t: usize, k: usize, d: usize) -> Result<(), CudaError> {
        self.moe_combine_slots("moe_combine_bf16", slot_out, weights, experts, shared, out, t, k, d)
    }

    /// The one launcher of moe.cu's `moe_combine_f32` / `moe_combine_bf16` (`name`; `T` the slot type
    /// it reads: f32 or bf16 bits).
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_slots<T: cudarc::driver::DeviceRepr>(&self, name: &'static str, slot_out: &CudaSlice<T>, weights: Option<&CudaSlice<f32>>, experts: Option<(&CudaSlice<i32>, usize)>, shared: Option<&CudaSlice<f32>>, out: &mut CudaSlice<f32>, t: usize, k: usize, d: usize) -> Result<(), CudaError> {
        const W: &str = "moe_combine";
        need(W, "slot_out", slot_out.len(), t * k * d)?;
        if let Some(w) = weights {
            need(W, "weights", w.len(), t * k)?;
        }
        if let Some((x, _)) = experts {
            need(W, "experts", x.len(), t * k)?;
        }
        if let Some(s) = shared {
            need(W, "shared", s.len(), t * d)?;
        }
        need(W, "out", out.len(), t * d)?;
        if t == 0 || d == 0 {
            return Ok(());
        }
        // 16 bytes of each slot's row per thread (4 f32 or 8 bf16 channels) when d allows it, else 1.
        let vec = 16 / std::mem::size_of::<T>();
        let per_thread = if d.is_multiple_of(vec) { vec } else { 1 };
        let cfg = LaunchConfig { grid_dim: (int(W, "tokens", t)? as u32, d.div_ceil(ROW_THREADS as usize * per_thread) as u32, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (k_i, d_i) = (int(W, "k", k)?, int(W, "d", d)?);
        let e_i = int(W, "experts", experts.map_or(0, |(_, e)| e))?;
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(name));
        b.arg(slot_out);
        match weights {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        match experts {
            Some((x, _)) => b.arg(x),
            None => b.arg(&null),
        };
        match shared {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        b.arg(out).arg(&k_i).arg(&d_i).arg(&e_i);
        // SAFETY: matches the signature of moe_combine_f32 (T = f32) and moe_combine_bf16 (T = u16);
        // buffers checked above.
        drv(name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// One SwiGLU expert on the first `m` rows of `x` (`[m, d]`): `y = W2·(silu(min(W1 x, L)) ⊙ clamp(W3 x, ±L))`,
    /// using the scratch buffers `g`, `u`, `h` (each ≥ `m·inter`); writes `y` (`[m, d]`). The three
    /// linears are §10.1 GEMMs: with `official` their inputs are FP8-quantized
    /// ([`Gpu::linear_official`]), else [`Gpu::linear`]; with `route` = (dst, γ) the hidden rows are
    /// scaled by `γ[dst[r]]` before W2 (the official order). `xq`: [`Gpu::act_quant`] of these `m`
    /// rows of `x` when the caller has it (official numerics), used for W1 and W3 where
    /// [`super::ops_q8::official_multi_shares`] says they share one quantisation: the same bytes, one
    /// pass over `x` fewer. With `official`, no `route` and W2 on the FP8 GEMM
    /// ([`super::ops_q8::official_runs_q8`]) W2's input is quantized from `g` and `u` directly
    /// ([`Gpu::act_quant_swiglu`], the same bytes) and `h` is left unwritten.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expert_ffn(&self, ex: &GpuExpert, x: &CudaSlice<f32>, xq: Option<&super::ops_q8::QuantizedActs>, m: usize, limit: f32, g: &mut CudaSlice<f32>, u: &mut CudaSlice<f32>, h: &mut CudaSlice<f32>, y: &mut CudaSlice<f32>, official: bool, route: Option<(&cudarc::driver::CudaView<i32>, &CudaSlice<f32>)>) -> Result<(), CudaError> {
        const W: &str = "moe expert";
        let (inter, d) = ex.dims()?;
        need(W, "x", x.len(), m * d)?;
        need(W, "gate scratch", g.len(), m * inter)?;
        need(W, "up scratch", u.len(), m * inter)?;
        need(W, "hidden scratch", h.len(), m * inter)?;
        need(W, "y", y.len(), m * d)?;
        if official {
            // One quantisation of x for gate and up (it is per row and block: the same values).
            let outs = &mut [(&ex.w1, &mut *g), (&ex.w3, &mut *u)];
            match xq {
                Some(qa) if super::ops_q8::official_multi_shares(m, outs) => self.linear_official_multi_q8(qa, m, outs)?,
                _ => self.linear_official_multi(x, m, outs)?,
            }
        } else {
            self.linear(x, &ex.w1, g, m)?;
            self.linear(x, &ex.w3, u, m)?;
        }
        // Official numerics without a route (the shared expert): the down projection's FP8 input
        // straight from g and u (Gpu::act_quant_swiglu: the bytes of swiglu then act_quant), h
        // left unwritten. Where linear_official would not quantize (short chunks, weights the FP8
        // GEMM cannot take) h is formed as below.
        if official && route.is_none() && super::ops_q8::official_runs_q8(m, &ex.w2) {
            let qa = self.act_quant_swiglu(g, u, limit, m, inter)?;
            return self.linear_q8(&qa, &ex.w2, y, m);
        }
        self.swiglu(g, u, h, m * inter, limit)?;
        if let Some((dst, gamma)) = route {
            self.scale_rows_by_route(h, dst, gamma, m, inter)?;
        }
        if official {
            self.linear_official(h, &ex.w2, y, m)
        } else {
            self.linear(h, &ex.w2, y, m)
        }
    }

    /// Router half of [`Gpu::moe_forward`]: the gate projection of the ffn-normed inputs `f` (`[t, d]`)
    /// and [`Gpu::router`]. Returns experts `[t, k]` and weights `[t, k]` on the device.
    ///
    /// Errors: shapes that disagree with `cfg`, or any launcher error.
    pub fn moe_route(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, ids: &CudaSlice<i32>, t: usize) -> Result<(DevBuf<i32>, DevBuf<f32>), CudaError> {
        const W: &str = "moe_route";
        let (d, e, k) = (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok);
        if t == 0 {
            return Err(bad(W, "no tokens"));
        }
        if layer.gate.rows != e || layer.gate.cols != d {
            return Err(bad(W, format!("gate is [{}, {}], expected [{e}, {d}]", layer.gate.rows, layer.gate.cols)));
        }
        need(W, "f", f.len(), t * d)?;
        // SAFETY: written by the linear below.
        let mut logits = unsafe { self.scratch::<f32>(t * e) }?;
        self.linear(f, &layer.gate, &mut logits, t)?;
        let mut experts = self.zeros::<i32>(t * k)?;
        let mut weights = self.zeros::<f32>(t * k)?;
        self.router(&logits, &layer.router, ids, &mut experts, &mut weights, t, e, k, cfg.scoring_func, cfg.routed_scaling_factor)?;
        Ok((experts, weights))
    }

    /// Expert half of [`Gpu::moe_forward`] (exact mode: γ applied after W2): given the ffn-normed
    /// inputs `f` (`[t, d]`), the selected `experts` (`[t, k]`, host copy) and their `weights`
    /// (`[t, k]`, device), returns `Σ_slot γ·expert(f) + shared(f)` (`[t, d]`).
    ///
    /// Routed experts run one at a time over their gathered tokens (members in token, then slot
    /// order, as the CPU reference groups them): gather rows → w1, w3 → clamped SwiGLU → w2 → scatter
    /// into `slot_out[t, slot]`. Then the shared expert over all tokens, then [`Gpu::moe_combine`].
    ///
    /// Errors: an expert id outside 0..E, shapes that disagree with `cfg`, or any launcher error.
    ///
    /// `official`: DeepSeek's official numerics (FP8-quantized linear inputs, γ before W2; the path
    /// `TC_LINEAR=fp8` takes) instead of the HF numerics.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, t: usize, experts: &[i32], weights: &CudaSlice<f32>, official: bool) -> Result<DevBuf<f32>, CudaError> {
        const W: &str = "moe_experts";
        let (d, e, k) = (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok);
        let limit = cfg.swiglu_limit as f32;
        if t == 0 || k == 0 {
            return Err(bad(W, format!("{t} tokens, top-{k}")));
        }
        if layer.experts.len() != e {
            return Err(bad(W, format!("{} routed experts, config says {e}", layer.experts.len())));
        }
        exact(W, "experts", experts.len(), t * k)?;
        need(W, "weights", weights.len(), t * k)?;
        need(W, "f", f.len(), t * d)?;
        int(W, "token slots", t * k)?;
        // Group (token, slot) pairs by expert, in token then slot order.
        let mut members: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
        for (i, &x) in experts.iter().enumerate() {
            if x < 0 || x as usize >= e {
                return Err(bad(W, format!("token {} slot {} routed to expert {x} (of {e})", i / k, i % k)));
            }
            members[x as usize].push((i / k, i % k));
        }
        let mut inter_max = 0usize;
        for (x, ex) in layer.experts.iter().enumerate() {
            let (inter, dd) = ex.dims()?;
            if dd != d {
                return Err(bad(W, format!("expert {x} has input width {dd}, expected {d}")));
            }
            if !members[x].is_empty() {
                inter_max = inter_max.max(inter);
            }
        }
        let (_, sh_d) = layer.shared.dims()?;
        if sh_d != d {
            return Err(bad(W, format!("shared expert has input width {sh_d}, expected {d}")));
        }
        let m_max = members.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut rows_idx: Vec<i32> = Vec::with_capacity(t * k);
        let mut dst_idx: Vec<i32> = Vec::with_capacity(t * k);
        let mut ranges: Vec<(usize, usize, usize)> = Vec::new();
        for (x, mem) in members.iter().enumerate() {
            if mem.is_empty() {
                continue;
            }
            let a = rows_idx.len();
            for &(ti, s) in mem {
                rows_idx.push(ti as i32);
                dst_idx.push((ti * k + s) as i32);
            }
            ranges.push((x, a, rows_idx.len()));
        }
        let rows_dev = self.stage_upload(&rows_idx)?;
        let dst_dev = self.stage_upload(&dst_idx)?;
        let mut xs = self.zeros::<f32>(m_max * d)?;
        let mut g = self.zeros::<f32>(m_max * inter_max.max(1))?;
        let mut u = self.zeros::<f32>(m_max * inter_max.max(1))?;
        let mut h = self.zeros::<f32>(m_max * inter_max.max(1))?;
        let mut y = self.zeros::<f32>(m_max * d)?;
        let mut slot_out = self.zeros::<f32>(t * k * d)?;
        // Official numerics: γ scales the hidden before W2's quantisation.
        for &(x, a, b) in &ranges {
            let m = b - a;
            self.gather_rows(f, t, &rows_dev.slice(a..b), &mut xs, d)?;
            let dst = dst_dev.slice(a..b);
            self.expert_ffn(&layer.experts[x], &xs, None, m, limit, &mut g, &mut u, &mut h, &mut y, official, official.then_some((&dst, weights)))?;
            self.scatter_rows(&y, &dst, &mut slot_out, t * k, d)?;
        }
        self.moe_shared_and_combine(layer, f, None, t, k, d, limit, SlotOut::F32(&slot_out), weights, None, official)
    }

    /// The shared expert of `layer` over the first `t` rows of `f` (`[t, d]`; SwiGLU limit `limit`),
    /// in official numerics (FP8-quantized inputs) when `official`; `fq`: [`Gpu::act_quant`] of
    /// those rows if the caller made it (see [`Gpu::expert_ffn`]).
    ///
    /// Errors: an expert whose shapes do not agree, short buffers, or any launcher error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn shared_expert(&self, layer: &GpuMoeLayer, f: &CudaSlice<f32>, fq: Option<&super::ops_q8::QuantizedActs>, t: usize, d: usize, limit: f32, official: bool) -> Result<DevBuf<f32>, CudaError> {
        let sh_inter = layer.shared.w1.rows;
        // SAFETY (all four): expert_ffn writes every value of their first t rows (its linears and
        // SwiGLU), the only ones read — except sh where W2's input is quantized from sg and su
        // directly (Gpu::act_quant_swiglu), and then nothing reads sh.
        let mut sg = unsafe { self.scratch::<f32>(t * sh_inter) }?;
        let mut su = unsafe { self.scratch::<f32>(t * sh_inter) }?;
        let mut sh = unsafe { self.scratch::<f32>(t * sh_inter) }?;
        let mut shared = unsafe { self.scratch::<f32>(t * d) }?;
        self.expert_ffn(&layer.shared, f, fq, t, limit, &mut sg, &mut su, &mut sh, &mut shared, official, None)?;
        Ok(shared)
    }

    /// The end of every MoE path: the shared expert over all `t` tokens, then [`Gpu::moe_combine`]
    /// of the routed outputs `slot_out` (`[t·k, d]`) with γ = `weights` (`[t, k]`); with `official`
    /// (DeepSeek's numerics, γ already applied before W2) the shared expert's inputs are
    /// FP8-quantized (`fq`: [`Gpu::act_quant`] of `f` when the caller made it, see
    /// [`Gpu::shared_expert`]) and γ = 1 here. `experts` (ids `[t, k]`, E): the grouped paths' routing, whose
    /// slots of ids outside 0..E they leave unwritten (`slot_out` need not be zero-filled). Returns
    /// the MoE output `[t, d]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_shared_and_combine(&self, layer: &GpuMoeLayer, f: &CudaSlice<f32>, fq: Option<&super::ops_q8::QuantizedActs>, t: usize, k: usize, d: usize, limit: f32, slot_out: SlotOut<'_>, weights: &CudaSlice<f32>, experts: Option<(&CudaSlice<i32>, usize)>, official: bool) -> Result<DevBuf<f32>, CudaError> {
        let shared = self.shared_expert(layer, f, fq, t, d, limit, official)?;
        // SAFETY: moe_combine writes all t·d values.
        let mut out = unsafe { self.scratch::<f32>(t * d) }?;
        let w = (!official).then_some(weights);
        match slot_out {
            SlotOut::F32(s) => self.moe_combine(s, w, experts, Some(&shared), &mut out, t, k, d)?,
            SlotOut::Bf16(s) => self.moe_combine_bf16(s, w, experts, Some(&shared), &mut out, t, k, d)?,
        }
        Ok(out)
    }

    /// A whole MoE layer (spec §4.11) for `t` tokens on the GPU: `f` (`[t, d]`) are the ffn-normed
    /// inputs, `ids` (`[t]`) the token ids (read by hash layers). Exact mode (γ after W2, no
    /// activation quantisation; comparable with `forward::moe::route` + `forward::moe::moe` with
    /// `Numerics::default()`), or with `TC_LINEAR=fp8` DeepSeek's official numerics (`Numerics {
    /// act_quant_fp8 }`).
    ///
    /// With the `MOE_GROUPED` switch on, at least [`super::gpu::TC_LINEAR_MIN_TOKENS`] tokens (any
    /// count with `MOE_GROUPED_DECODE`) and experts that allow it, the routed experts run grouped on the device
    /// ([`Gpu::moe_experts_grouped`] with split activations unless `TC_LINEAR=bf16`, or
    /// [`Gpu::moe_experts_grouped_q8`]; no synchronisation); otherwise one expert at a time
    /// ([`Gpu::moe_experts`], one synchronisation to group tokens on the host).
    ///
    /// Errors: shapes that disagree with `cfg`, an invalid token id or table entry (hash layers;
    /// per-expert path), or any launcher error.
    pub fn moe_forward(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, ids: &CudaSlice<i32>, t: usize) -> Result<GpuMoeOutput, CudaError> {
        let mode = super::gpu::tc_linear_mode();
        // TC_LINEAR=fp8: DeepSeek's official numerics on every path below.
        let official = mode == super::gpu::TcMode::Fp8;
        let opts = super::ops_moe::MoeOptions::from_switches();
        self.moe_mark("moe:route");
        let (experts, weights) = self.moe_route(cfg, layer, f, ids, t)?;
        self.moe_detail_ids(&experts)?;
        // Below 64 tokens (decode) the per-expert path runs unless MOE_GROUPED_DECODE asks for the
        // grouped one there too (no host synchronisation).
        let min_t = if crate::switches::on("MOE_GROUPED_DECODE") { 1 } else { super::gpu::TC_LINEAR_MIN_TOKENS };
        let tables = if opts.grouped && t >= min_t { self.moe_tables(layer)? } else { None };
        let out = match tables {
            Some(tb) if official && tb.q8 => self.moe_experts_grouped_q8(cfg, layer, f, t, &experts, &weights, opts)?,
            // Split activations unless TC_LINEAR=bf16 asks for the inexact fast mode.
            // (Decode-sized chunks stay split: TC_LINEAR only concerns ≥ 64 tokens.)
            Some(_) if !official => {
                self.moe_mark("moe:experts");
                self.moe_experts_grouped(cfg, layer, f, t, &experts, &weights, mode != super::gpu::TcMode::Bf16 || t < super::gpu::TC_LINEAR_MIN_TOKENS, opts)?
            }
            _ => {
                self.moe_mark("moe:experts");
                if tables.is_some() {
                    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        eprintln!("flashseek: warning: TC_LINEAR=fp8 runs a MoE layer one expert at a time: some routed expert is not FP8 or FP4 whose group scales fold into e4m3 (spread ≤ 8 binades per 128 inputs) — same numerics, slower");
                    }
                }
                let host = self.download(&experts)?;
                self.moe_experts(cfg, layer, f, t, &host, &weights, official)?
            }
        };
        Ok(GpuMoeOutput { out, experts, weights })
    }
}

/// The shapes an mHC pre checks ([`Gpu::hc_pre`], [`Gpu::hc_pre_norm`]): [`mix_shapes`], b
/// `[(2+n)·n]` and α `[3]` exactly, and at least `t` tokens of the output (`out`: its name and
/// length, `[t, d]`), `post` and `comb`. Returns the mix size (2+n)·n.
#[allow(clippy::too_many_arguments)]
fn pre_shapes(what: &'static str, w: &GpuHcWeights, x_len: usize, out: (&str, usize), post: &CudaSlice<f32>, comb: &CudaSlice<f32>, t: usize, n: usize, d: usize) -> Result<usize, CudaError> {
    let mix = mix_shapes(what, &w.fn_, x_len, t, n, d)?;
    exact(what, "base", w.base.len(), mix)?;
    exact(what, "scale", w.scale.len(), 3)?;
    need(what, out.0, out.1, t * d)?;
    need(what, "post", post.len(), t * n)?;
    need(what, "comb", comb.len(), t * n * n)?;
    Ok(mix)
}

/// The shapes every mix of a pre needs: `n` and `d` (as [`hc_dims`]), its Φ `fn_` exactly
/// `[(2+n)·n, n·d]` and at least `t` tokens of streams (`x_len` values). Returns the mix size (2+n)·n.
fn mix_shapes(what: &'static str, fn_: &CudaSlice<f32>, x_len: usize, t: usize, n: usize, d: usize) -> Result<usize, CudaError> {
    hc_dims(what, n, d)?;
    let mix = (2 + n) * n;
    exact(what, "fn", fn_.len(), mix * n * d)?;
    need(what, "x", x_len, t * n * d)?;
    Ok(mix)
}

/// Common mHC shape checks: 1 ≤ n ≤ 4, d a positive multiple of 4, n·d within 32 bits.
fn hc_dims(what: &'static str, n: usize, d: usize) -> Result<(), CudaError> {
    if n == 0 || n > HC_MAX_STREAMS || d == 0 || !d.is_multiple_of(4) {
        return Err(bad(what, format!("n = {n} streams of width d = {d} (need 1 ≤ n ≤ {HC_MAX_STREAMS}, d a positive multiple of 4)")));
    }
    int(what, "n·d", n * d).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hc_phi_runs puts Φ[o, k·d + 64·b + c] at ((b·m + o)·n + k)·64 + c and zeros past d (d = 100:
    /// a last run of 36 channels).
    #[test]
    fn phi_runs_layout() {
        let (m, n, d) = (8usize, 2usize, 100usize);
        let fn_: Vec<f32> = (0..m * n * d).map(|i| i as f32 + 0.5).collect();
        let r = hc_phi_runs(&fn_, m, n, d);
        assert_eq!(r.len(), 2 * m * n * 64);
        let mut seen = 0;
        for b in 0..2 {
            for o in 0..m {
                for k in 0..n {
                    for c in 0..64 {
                        let got = r[((b * m + o) * n + k) * 64 + c];
                        let i = 64 * b + c;
                        if i < d {
                            assert_eq!(got, fn_[o * n * d + k * d + i], "b {b} o {o} k {k} c {c}");
                            seen += 1;
                        } else {
                            assert_eq!(got, 0.0, "padding b {b} o {o} k {k} c {c}");
                        }
                    }
                }
            }
        }
        assert_eq!(seen, fn_.len());
    }

    /// Three bf16 planes add up to the f32 value exactly (the premise of `MHC_MIX_TC`'s f32-accurate
    /// mix): random values over many binades, signs, the f32 extremes of Φ's range and ties.
    #[test]
    fn phi_planes_are_exact() {
        use flashseek_model::quant::bf16_to_f32;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut values: Vec<f32> = (0..200_000).map(|_| {
            let r = next();
            // Significand bits at random, exponents over 2^-60 … 2^20, both signs.
            let mant = (r & 0x7f_ffff) as u32;
            let exp = 67 + ((r >> 23) % 80) as u32;
            f32::from_bits(((r >> 40) as u32 & 1) << 31 | exp << 23 | mant)
        }).collect();
        values.extend([0.0, -0.0, 1.0, 1.0e38, -1.0e38, 1.0 + f32::EPSILON, 3.0e-3, -0.017_320_508, f32::from_bits(0x3f80_8080)]);
        for v in values {
            let [p0, p1, p2] = bf16_planes(v);
            let sum = bf16_to_f32(p0) as f64 + bf16_to_f32(p1) as f64 + bf16_to_f32(p2) as f64;
            assert_eq!(sum, v as f64, "{v:e} = {p0:#06x} + {p1:#06x} + {p2:#06x}");
        }
    }

    /// hc_phi_tc's fragments, multiplied as the PTX ISA defines mma.sync m16n8k16 (A: a0 = (row g,
    /// k 2c, 2c + 1), a1 = (row g + 8, the same k), a2 = (row g, k 2c + 8, 2c + 9), a3 = (row g + 8,
    /// those k); B: b0 = (k 2c, 2c + 1; column g), b1 = (k 2c + 8, 2c + 9; column g)) with A as
    /// hc_post_mix_tc_bf16 builds it from each lane's 16 loaded bytes (words 2s and 2s + 1 of rows g
    /// and g + 8 for k step s), give every run's mix dot products over the bf16 streams: n 3 (15
    /// mixes: two n-tiles, the second with a padding column), d 136 (a last run of 8 channels).
    #[test]
    fn phi_tc_fragments_multiply_as_mma() {
        use flashseek_model::quant::{bf16_to_f32, f32_to_bf16};
        // The kernel lines this test's choices of registers and indices copy (a change there must
        // change them here): the lane's first channel, the A registers, the B words, the
        // fragments' address, the C write-back.
        let src = include_str!("kernels/mhc.cu");
        for line in [
            "const int i = b * HCT_RUN + q * HCT_CHUNK + 8 * c;",
            "const u32 a[4] = {hct_word(xs[0][k], 2 * s), hct_word(xs[1][k], 2 * s), hct_word(xs[0][k], 2 * s + 1),",
            "hct_word(xs[1][k], 2 * s + 1)};",
            "const int w = ((s * NT + nt) * 3 + p) * 2;",
            "gm_mma(acc[nt], a, hct_word(bf[w / 4], w % 4), hct_word(bf[w / 4], w % 4 + 1));",
            "const uint4* fq = fb + (size_t)(b * HCT_CHUNKS + q) * NN * F4 * 32 + lane;",
            "bf[f] = __ldg(fq + (k * F4 + f) * 32);",
            "const int o = 8 * nt + 2 * c;",
            "if (o < M) pr[o] = tot[nt][2 * r];",
            "if (o + 1 < M) pr[o + 1] = tot[nt][2 * r + 1];",
        ] {
            assert!(src.contains(line), "mhc.cu no longer has `{line}`");
        }
        let (n, d) = (3usize, 136usize);
        let m = (2 + n) * n;
        let nt = m.div_ceil(8);
        let f4 = 3 * nt;
        let val = |i: usize, salt: u64| -> f32 {
            let mut h = (i as u64 ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
            ((h % 20_001) as f32 - 10_000.0) * 1.37e-5
        };
        let fn_: Vec<f32> = (0..m * n * d).map(|i| val(i, 1)).collect();
        // 16 tokens of bf16 streams [16, n, d].
        let xs: Vec<u16> = (0..16 * n * d).map(|i| f32_to_bf16(val(i, 2) * 70.0)).collect();
        let frags = hc_phi_tc(&fn_, m, n, d);
        assert_eq!(frags.len(), hc_phi_tc_len(m, n, d));
        let half = |w: u32, h: usize| bf16_to_f32((w >> (16 * h)) as u16) as f64;
        let chunks = HC_MIX_TC_RUN / HC_MIX_TC_CHUNK;
        for b in 0..d.div_ceil(HC_MIX_TC_RUN) {
            let mut cacc = vec![[0f64; 32]; 16];
            for q in 0..chunks {
                for k in 0..n {
                    for s in 0..2 {
                        // Dense A [16][16] and B [3][16][8·nt] from the lanes' registers.
                        let mut a = [[0f64; 16]; 16];
                        let mut bm = vec![[[0f64; 32]; 16]; 3];
                        for lane in 0..32 {
                            let (g, c) = (lane / 4, lane % 4);
                            // The lane's word j of token row `row`: channels i0 + 2j, i0 + 2j + 1.
                            let word = |row: usize, j: usize| -> u32 {
                                let i0 = HC_MIX_TC_RUN * b + HC_MIX_TC_CHUNK * q + 8 * c + 2 * j;
                                let at = |i: usize| if i < d { u32::from(xs[(row * n + k) * d + i]) } else { 0 };
                                at(i0) | (at(i0 + 1) << 16)
                            };
                            let regs = [word(g, 2 * s), word(g + 8, 2 * s), word(g, 2 * s + 1), word(g + 8, 2 * s + 1)];
                            for h in 0..2 {
                                a[g][2 * c + h] = half(regs[0], h);
                                a[g + 8][2 * c + h] = half(regs[1], h);
                                a[g][2 * c + 8 + h] = half(regs[2], h);
                                a[g + 8][2 * c + 8 + h] = half(regs[3], h);
                            }
                            for ti in 0..nt {
                                for (p, plane) in bm.iter_mut().enumerate() {
                                    let w = ((s * nt + ti) * 3 + p) * 2;
                                    let at = |w: usize| frags[((((b * chunks + q) * n + k) * f4 + w / 4) * 32 + lane) * 4 + w % 4];
                                    for h in 0..2 {
                                        plane[2 * c + h][8 * ti + g] = half(at(w), h);
                                        plane[2 * c + 8 + h][8 * ti + g] = half(at(w + 1), h);
                                    }
                                }
                            }
                        }
                        for (row, arow) in a.iter().enumerate() {
                            for col in 0..8 * nt {
                                cacc[row][col] += (0..3).map(|p| (0..16).map(|kk| arow[kk] * bm[p][kk][col]).sum::<f64>()).sum::<f64>();
                            }
                        }
                    }
                }
            }
            for (row, got) in cacc.iter().enumerate() {
                for (o, g) in got.iter().enumerate().take(8 * nt) {
                    let want: f64 = if o < m {
                        (0..n).flat_map(|k| (HC_MIX_TC_RUN * b..(HC_MIX_TC_RUN * (b + 1)).min(d)).map(move |i| (k, i))).map(|(k, i)| fn_[o * n * d + k * d + i] as f64 * bf16_to_f32(xs[(row * n + k) * d + i]) as f64).sum()
                    } else {
                        0.0
                    };
                    assert!((g - want).abs() <= 1e-12 * (1.0 + want.abs()), "run {b} row {row} o {o}: {g} vs {want}");
                }
            }
        }
    }

    /// The launch constants here are the kernel's: a mismatch would give blocks the wrong size or
    /// partial buffers the wrong stride (the kernels index with their own defines).
    #[test]
    fn mhc_launch_constants_match_the_source() {
        let src = include_str!("kernels/mhc.cu");
        for (define, value) in [
            ("HC_SPLIT", HC_SPLIT),
            ("HC_PART", HC_PART),
            ("HC_THREADS", HC_THREADS as usize),
            ("HC_MAXN", HC_MAX_STREAMS),
            ("HCX_RUN", HC_MIX_RUN),
            ("HC_REC", HC_REC),
            ("HC_REC_POST", HC_REC_POST),
            ("HC_REC_COMB", HC_REC_COMB),
            ("HC_REC_F32", HC_REC_F32),
            ("HCC_WARPS", HC_COEF_TOKENS),
            ("HCN_V", HC_NORM_MAX_D / HC_THREADS as usize),
            ("HCT_RUN", HC_MIX_TC_RUN),
            ("HCT_CHUNK", HC_MIX_TC_CHUNK),
        ] {
            assert!(src.contains(&format!("#define {define} {value} ")) || src.contains(&format!("#define {define} {value}\n")), "{define} = {value}");
        }
        assert!(src.contains("#define HCX_TT 4 ") && src.contains("#define HCX_WARPS 4 ") && src.contains("#define HCX_THREADS (32 * HCX_WARPS)"));
        assert_eq!(HC_MIX_TOKENS, 4 * 4);
        assert_eq!(HC_MIX_THREADS, 32 * 4);
        assert!(src.contains("#define HC_TT 4 ") && src.contains("#define HC_WARPS 4 ") && src.contains("#define HC_PARTIAL_THREADS (32 * HC_WARPS)"));
        assert_eq!(HC_PARTIAL_TOKENS, 4 * 4);
        assert_eq!(HC_PARTIAL_THREADS, 32 * 4);
        assert!(src.contains("__launch_bounds__(HCX_THREADS, 3)"));
        // hc_post_mix_tc_bf16: 4 warps of 16 tokens.
        assert!(src.contains("#define HCT_WARPS 4 ") && src.contains("#define HCT_THREADS (32 * HCT_WARPS)") && src.contains("const int t0 = split ? 0 : (blockIdx.y * HCT_WARPS + warp) * 16;"));
        assert_eq!((HC_MIX_TC_TOKENS, HC_MIX_TC_THREADS), (4 * 16, 32 * 4));
        assert!(src.contains("#define HCX_LD 36 ") && src.contains("#define HCX_WFLOATS (HCX_TT * (HC_MAXM + 1) * HCX_LD)") && src.contains("#define HCX_SMEM (HCX_WARPS * HCX_WFLOATS * 4)") && src.contains("#define HC_MAXM 24 "));
        assert_eq!(HC_MIX_SMEM, 4 * 4 * (24 + 1) * 36 * 4);
        // hc_pre_norm_f32 keeps 16 channels per thread, the wide entry HCN_V.
        assert!(src.contains("HCN_ENTRY(hc_pre_norm_f32, 16, float)") && src.contains("HCN_ENTRY(hc_pre_norm_wide_f32, HCN_V, float)"));
        assert!(src.contains("HCN_ENTRY(hc_pre_norm_bf16, 16, u16)") && src.contains("HCN_ENTRY(hc_pre_norm_wide_bf16, HCN_V, u16)"));
        assert_eq!(HC_NORM_NARROW_D, 16 * 256);
        for e in MHC_ENTRY_POINTS {
            let entry = [format!("{e}("), format!("HCN_ENTRY({e},"), format!("HCX_ENTRY({e},"), format!("HC_POST_ENTRY({e},")];
            assert!(entry.iter().any(|p| src.contains(p.as_str())), "{e}");
        }
        // Each stream kernel has both element types, under the names HcStream gives them.
        fn names<S: HcStream>() -> [&'static str; 4] {
            [S::POST, S::POST_MIX, S::PRE_NORM, S::PRE_NORM_WIDE]
        }
        for ((base, f), b) in ["hc_post", "hc_post_mix", "hc_pre_norm", "hc_pre_norm_wide"].iter().zip(names::<f32>()).zip(names::<u16>()) {
            assert_eq!((f, b), (format!("{base}_f32").as_str(), format!("{base}_bf16").as_str()));
            assert!(MHC_ENTRY_POINTS.contains(&f) && MHC_ENTRY_POINTS.contains(&b), "{base}");
        }
    }
}
