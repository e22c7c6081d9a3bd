//! Launchers for the attention family: sparse attention with sinks (spec §4.6,
//! `kernels/attention.cu`), the KV compressors (§4.8–§4.9, `kernels/compressor.cu`) and the
//! lightning indexer (§4.10, `kernels/indexer.cu`), plus the host helpers that build the per-query
//! candidate lists (CSR offsets + indices).
//!
//! Conventions: f32 activations, row-major; positions are absolute token positions; index buffers
//! are i32. Every launcher validates shapes on the host and returns [`CudaError::Unsupported`] on
//! bad input. Device-side index lists (CSR contents) cannot be checked on the host: out-of-range
//! entry indices are skipped by the kernels, and offsets must be the ones the helpers here build.

use super::graph::DevBuf;
use super::gpu::Gpu;
use super::CudaError;
use crate::cpu::rope::Rope;
use crate::sampler::TopLogits;
use cudarc::driver::{CudaSlice, DriverError, LaunchConfig, PushKernelArg};

/// Entry points of `kernels/attention.cu`.
pub const ATTENTION_ENTRY_POINTS: &[&str] = &[
    "sparse_attention_f32",
    "sparse_attention_tc",
    "sparse_attention_tc_fast_exp",
    "sparse_attention_tc_split",
    "sparse_attention_tc_fast_exp_split",
    "sparse_attention_wg",
    "sparse_attention_wg_fast_exp",
    "sparse_attention_wg_bf16_out",
    "sparse_attention_wg_fast_exp_bf16_out",
    "sparse_attention_wc",
    "sparse_attention_wc_bf16_out",
    "sparse_attention_wc_fp8_out",
];

/// The streaming attention kernels (dynamic shared memory [`ATTENTION_TC_SMEM`]): f32 output, and
/// the `_split` ones that write [`AttentionOut::SplitPlanes`].
pub const ATTENTION_TC_KERNELS: [&str; 4] = ["sparse_attention_tc", "sparse_attention_tc_fast_exp", "sparse_attention_tc_split", "sparse_attention_tc_fast_exp_split"];

/// The bf16 wgmma streaming kernels (switch `MLA_BF16`; dynamic shared memory
/// [`ATTENTION_WG_SMEM`], 384 threads): f32 output and precise exp, fast exp, then the `_bf16_out`
/// ones that write [`AttentionOut::Bf16`].
pub const ATTENTION_WG_KERNELS: [&str; 4] = ["sparse_attention_wg", "sparse_attention_wg_fast_exp", "sparse_attention_wg_bf16_out", "sparse_attention_wg_fast_exp_bf16_out"];

/// Dynamic shared memory of `sparse_attention_wg` (`AwgLayout::TOTAL` in attention.cu): Q (64 KB),
/// a ring of `AWG_ST` = 3 K=V tiles of 32 KB, the partial-logit exchange (32 KB), the stages'
/// candidate masks (16 B), two tiles of row pointers (512 B), 6 mbarriers, 1 KB alignment slack.
pub const ATTENTION_WG_SMEM: usize = 65536 + 3 * 32768 + 2 * 2 * 128 * 16 * 4 + 16 + 2 * 32 * 8 + 2 * 3 * 8 + 1024;

/// The candidate-split bf16 wgmma streaming kernels (switch `MLA_BF16_CAND_SPLIT` with `MLA_BF16`;
/// dynamic shared memory [`ATTENTION_WC_SMEM`], 384 threads at [`ATTENTION_WG_REGS`]): f32 output,
/// then the one that writes [`AttentionOut::Bf16`], then the one that writes [`AttentionOut::Fp8`].
pub const ATTENTION_WC_KERNELS: [&str; 3] = ["sparse_attention_wc", "sparse_attention_wc_bf16_out", "sparse_attention_wc_fp8_out"];

/// Dynamic shared memory of `sparse_attention_wc` (`AwcLayout::TOTAL` in attention.cu): Q (64 KB),
/// four 32 KB halves of two 64-candidate K=V blocks, two 8 KB P tiles, the row maxima and
/// denominators of both warpgroups (2 × 512 B), two steps × two blocks × four copy warps of
/// candidate masks (128 B), 128 row pointers of the mask path (1 KB), the epilogue's 256 (cos, sin)
/// pairs (2 KB), 8 mbarriers, 1 KB alignment slack.
pub const ATTENTION_WC_SMEM: usize = 65536 + 4 * 32768 + 2 * 8192 + 2 * 512 + 128 + 128 * 8 + 256 * 8 + 8 * 8 + 1024;

const _: () = assert!(ATTENTION_WC_SMEM <= 227 * 1024);

/// Registers per thread `sparse_attention_wg*` must compile to: its setmaxnreg split (128 copy
/// threads at 56, 256 multiply threads at 224) adds up to 384 threads at this count.
pub const ATTENTION_WG_REGS: i32 = 168;

const _: () = assert!(128 * 56 + 256 * 224 == 384 * ATTENTION_WG_REGS as usize && ATTENTION_WG_SMEM <= 227 * 1024);

/// Dynamic shared memory of `sparse_attention_tc` (`ATC_SMEM` in attention.cu: Q and K tiles as
/// split bf16 with 520-element rows, partial logits, row pointers).
pub const ATTENTION_TC_SMEM: usize = 2 * 64 * 520 * 2 + 2 * 32 * 520 * 2 + 8 * 32 * 16 * 4 + 32 * 8;

/// Which attention kernel runs ([`Gpu::sparse_attention_into`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// `sparse_attention_f32`: one block per (token, head), f32 CUDA cores (the exact path).
    Exact,
    /// `sparse_attention_tc` (switch `MLA_STREAM_TOPK`): one block per token, each K=V row read once
    /// for all heads, split-bf16 tensor-core products; H = 64 and c = 512 only (else [`AttentionKernel::Exact`]).
    Stream,
    /// `sparse_attention_tc_fast_exp` (switches `MLA_STREAM_TOPK` + `MLA_STREAM_FAST_EXP`): the
    /// streaming kernel with the hardware `__expf` in the online softmax (not exact: relative error
    /// of a few ulp per exponential; gpu-check reports its NMSE and max-abs against both the CPU
    /// and [`AttentionKernel::Stream`]).
    StreamFastExp,
    /// `sparse_attention_wg` (switches `MLA_STREAM_TOPK` + `MLA_BF16`, sm_90a): the streaming
    /// attention in OFF-K's numerics — Q, K=V and P rounded to bf16, f32 accumulation, one wgmma
    /// product — from bf16 copies of the rows the launcher makes (not exact: gpu-check reports its
    /// NMSE and max-abs against the CPU and [`AttentionKernel::Stream`]).
    StreamBf16,
    /// `sparse_attention_wg_fast_exp`: [`AttentionKernel::StreamBf16`] with `__expf` (switch
    /// `MLA_STREAM_FAST_EXP` too).
    StreamBf16FastExp,
    /// `sparse_attention_wc` (switches `MLA_STREAM_TOPK` + `MLA_BF16` + `MLA_BF16_CAND_SPLIT`,
    /// sm_90a): [`AttentionKernel::StreamBf16`]'s numerics class (Q, K=V and P in bf16, f32
    /// accumulation) with the multiply warpgroups splitting each 128 candidates between them
    /// (each its own 64 candidates' logits over all 512 channels, P exchanged through shared
    /// memory) instead of splitting the channels; the softmax's 2^x on `ex2.approx` with log2 e
    /// folded into the scale, so `MLA_STREAM_FAST_EXP` does not change it. Not exact: gpu-check reports its NMSE
    /// and max-abs against the CPU, the split kernel and [`AttentionKernel::StreamBf16`].
    StreamBf16Cand,
}

impl AttentionKernel {
    /// The kernel the `MLA_STREAM_TOPK`, `MLA_BF16`, `MLA_BF16_CAND_SPLIT` and `MLA_STREAM_FAST_EXP`
    /// switches select for `heads` × `head_dim`; `bf16_ok`: the device runs the bf16 kernels
    /// ([`Gpu::attention_bf16_ok`]), else `MLA_BF16` falls back to the split kernels;
    /// `cand_split_ok`: it runs the candidate-split ones ([`Gpu::attention_cand_split_ok`]), else
    /// `MLA_BF16_CAND_SPLIT` falls back to [`AttentionKernel::StreamBf16`].
    pub fn from_switches(heads: usize, head_dim: usize, bf16_ok: bool, cand_split_ok: bool) -> Self {
        if crate::switches::on("MLA_STREAM_TOPK") && heads == 64 && head_dim == 512 {
            let fast = crate::switches::on("MLA_STREAM_FAST_EXP");
            let bf16 = bf16_ok && crate::switches::on("MLA_BF16");
            if bf16 && cand_split_ok && crate::switches::on("MLA_BF16_CAND_SPLIT") {
                return AttentionKernel::StreamBf16Cand;
            }
            match (bf16, fast) {
                (true, true) => AttentionKernel::StreamBf16FastExp,
                (true, false) => AttentionKernel::StreamBf16,
                (false, true) => AttentionKernel::StreamFastExp,
                (false, false) => AttentionKernel::Stream,
            }
        } else {
            AttentionKernel::Exact
        }
    }

    /// Whether this is one of the bf16 wgmma kernels (`MLA_BF16`).
    pub fn is_bf16(self) -> bool {
        matches!(self, AttentionKernel::StreamBf16 | AttentionKernel::StreamBf16FastExp | AttentionKernel::StreamBf16Cand)
    }
}
/// Entry points of `kernels/compressor.cu`.
pub const COMPRESSOR_ENTRY_POINTS: &[&str] = &["add_position_bias_f32", "compressor_pool_f32", "rope_positions_f32"];
/// Keys per block of `indexer_scores_tc` (indexer.cu `ITC_KB`): its block count for prefill chunks.
pub const ITC_KEYS_PER_BLOCK: usize = 512;

/// Blocks `indexer_scores_tc` aims for at least with `INDEXER_TC_DECODE_TILES` (two per SM of an
/// H200's 132).
const ITC_MIN_BLOCKS: usize = 264;

/// Keys per block of `indexer_scores_tc` for `tokens` queries over `n` entries with
/// `INDEXER_TC_DECODE_TILES` on: [`ITC_KEYS_PER_BLOCK`] when that grid has at least
/// [`ITC_MIN_BLOCKS`] blocks (prefill chunks), else the fewest keys per block (a multiple of 64,
/// at least 64) that give it about that many — a decode step's 2,048 entries at 8K context in 32
/// blocks of 64 instead of 4 of 512.
pub fn indexer_tc_keys_per_block(tokens: usize, n: usize) -> usize {
    let pairs = tokens.div_ceil(2).max(1);
    if n.div_ceil(ITC_KEYS_PER_BLOCK) * pairs >= ITC_MIN_BLOCKS {
        return ITC_KEYS_PER_BLOCK;
    }
    let per_block = n.div_ceil(ITC_MIN_BLOCKS.div_ceil(pairs));
    per_block.div_ceil(64).clamp(1, ITC_KEYS_PER_BLOCK / 64) * 64
}

/// Entry points of `kernels/indexer.cu`.
pub const INDEXER_ENTRY_POINTS: &[&str] = &["indexer_scores_f32", "indexer_scores_tc", "indexer_topk_f32", "indexer_topk_stream", "indexer_topk_stream_fp8", "indexer_keys_split", "indexer_topk_wgmma", "indexer_scores_wgmma", "indexer_topk_wgmma_fp8", "indexer_scores_wgmma_fp8", "indexer_topk_mask_u8", "logits_topk_f32"];

/// Largest head dim `sparse_attention_f32` supports (`ATT_MAXC`).
pub const ATTENTION_MAX_HEAD_DIM: usize = 1024;
/// Largest index head dim `indexer_scores_f32` supports (`IDX_MAXHD`).
pub const INDEXER_MAX_HEAD_DIM: usize = 128;
/// Largest `heads · head_dim` of one index query `indexer_scores_f32` supports (`IDX_MAXQ`).
pub const INDEXER_MAX_QUERY: usize = 8192;
/// Dynamic shared memory of `indexer_topk_stream` (`ITS_SMEM` in indexer.cu: two buffers of
/// `ITS_CAP` = 2,048 (u32 key, i32 index) pairs).
pub const INDEXER_STREAM_SMEM: usize = 2 * 2048 * 8;

/// The wgmma indexer kernels (sm_90a; [`INDEXER_WGMMA_SMEM`] each): split-bf16 and FP8 scores,
/// selection and scores-only.
pub const INDEXER_WGMMA_KERNELS: &[&str] = &["indexer_topk_wgmma", "indexer_scores_wgmma", "indexer_topk_wgmma_fp8", "indexer_scores_wgmma_fp8"];

/// Dynamic shared memory of the [`INDEXER_WGMMA_KERNELS`] (`IwgLayout::TOTAL` in
/// indexer.cu): 1 KB alignment slack, a ring of 4 key tiles of 32 KB (the FP8 kernels: 8 tiles of
/// 8 KB and the 4 tokens' e4m3 queries, 8 KB each), per warpgroup (4) a buffer of 2,048 (key, index)
/// pairs (16 KB), head-group partials (1 KB), a histogram (1 KB), scan sums and state (160 B), then
/// room for 16 mbarriers (the split-bf16 kernels use 8).
pub const INDEXER_WGMMA_SMEM: usize = 1024 + 4 * 32768 + 4 * (2048 * 8 + 4 * 64 * 4 + 256 * 4 + 32 * 4 + 8 * 4) + 2 * 8 * 8;

const _: () = assert!(INDEXER_WGMMA_SMEM <= 227 * 1024, "indexer_topk_wgmma's shared memory must fit a Hopper block");

/// Bytes of one 64-key tile of `indexer_keys_split`'s split-bf16 keys (`IWG_TILE`).
const INDEXER_WGMMA_TILE: usize = 32768;

/// Fewest query tokens for which [`Gpu::indexer_select`] runs the streaming kernels: they take one
/// block per token pair (`indexer_topk_stream`) or per four tokens (`indexer_topk_wgmma`, one block
/// per SM), so below ~one wave of blocks on an H200 (132 SMs) the score matrix (one block per 512
/// keys and token pair) keeps the GPU busier. Measured at T = 1 (decode, 128K context, 20 Flash
/// layers): streaming 36.9 ms per token vs 24.5 ms with the score matrix; gpu-check times the
/// three paths at 256, 512 and 1,024 tokens (`indexer selection T=…`).
pub const INDEXER_STREAM_MIN_TOKENS: usize = 256;

/// Largest top-k of `indexer_topk_stream` and `indexer_topk_wgmma` (`ITS_CAP − 2·ITC_KT`: a buffer
/// must take one more 64-key tile per token after a cut).
pub const INDEXER_STREAM_MAX_K: usize = 2048 - 128;

/// Largest grid y dimension (tokens of the indexer scores, entries of one pooling launch).
const MAX_GRID_Y: usize = 65535;

fn launched(what: &str, r: Result<(), DriverError>) -> Result<(), CudaError> {
    r.map_err(|e| CudaError::Driver { what: what.into(), detail: format!("{e:?}") })
}

fn unsupported(what: &'static str, detail: String) -> CudaError {
    CudaError::Unsupported { what, detail }
}

/// `v` as an i32 kernel argument, or Unsupported naming `name`.
fn int(what: &'static str, name: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| unsupported(what, format!("{name} = {v} does not fit in i32")))
}

/// Fails unless `cond`, with `detail`.
fn ensure(what: &'static str, cond: bool, detail: impl FnOnce() -> String) -> Result<(), CudaError> {
    if cond {
        Ok(())
    } else {
        Err(unsupported(what, detail()))
    }
}

/// Number of compressed entries visible to the query at absolute position `pos` (spec §4.6 b):
/// entries `w < (pos+1)/ratio`, capped at the `n_entries` that exist.
pub fn visible_entries(pos: usize, ratio: usize, n_entries: usize) -> usize {
    ((pos + 1) / ratio.max(1)).min(n_entries)
}

/// CSR offsets (`[tokens + 1]`) of per-query lists of lengths `len(t)`.
fn csr_offsets(what: &'static str, tokens: usize, len: impl Fn(usize) -> usize) -> Result<Vec<i32>, CudaError> {
    let mut off = Vec::with_capacity(tokens + 1);
    let mut acc = 0usize;
    off.push(0);
    for t in 0..tokens {
        acc += len(t);
        off.push(int(what, "total list length", acc)?);
    }
    Ok(off)
}

/// HCA candidate lists (spec §4.6: every visible entry) of queries at positions `pos0..pos0+tokens`
/// over `n_entries` entries of ratio `ratio`, explicit: `(offsets [tokens+1], indices)`, query t's
/// list being `0..visible_entries(pos0+t)`.
pub fn hca_candidates(pos0: usize, tokens: usize, ratio: usize, n_entries: usize) -> Result<(Vec<i32>, Vec<i32>), CudaError> {
    let off = csr_offsets("hca_candidates", tokens, |t| visible_entries(pos0 + t, ratio, n_entries))?;
    let mut idx = Vec::with_capacity(off[tokens] as usize);
    for t in 0..tokens {
        idx.extend(0..visible_entries(pos0 + t, ratio, n_entries) as i32);
    }
    Ok((off, idx))
}

/// The offsets alone of [`hca_candidates`], for the identity-list mode of
/// [`Gpu::sparse_attention`] (`indices: None`), which needs no index buffer.
pub fn hca_offsets(pos0: usize, tokens: usize, ratio: usize, n_entries: usize) -> Result<Vec<i32>, CudaError> {
    csr_offsets("hca_offsets", tokens, |t| visible_entries(pos0 + t, ratio, n_entries))
}

/// CSR offsets (`[tokens+1]`) of the indexer's top-k lists ([`Gpu::indexer_topk`]): query t gets
/// `min(visible_entries(pos0+t), k)` entries.
pub fn topk_offsets(pos0: usize, tokens: usize, ratio: usize, n_entries: usize, k: usize) -> Result<Vec<i32>, CudaError> {
    csr_offsets("topk_offsets", tokens, |t| visible_entries(pos0 + t, ratio, n_entries).min(k))
}

/// Geometry of one [`Gpu::sparse_attention`] call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query tokens T (query t at absolute position `pos0 + t`).
    pub tokens: usize,
    /// Query heads H.
    pub heads: usize,
    /// Head dim c (= K=V row width); a multiple of 4, at most [`ATTENTION_MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Absolute position of the first query.
    pub pos0: usize,
    /// Sliding window W: query at `pos` sees raw rows `max(0, pos−W+1)..=pos`.
    pub window: usize,
    /// Absolute position of row 0 of the raw K=V buffer.
    pub kv_base: usize,
}

/// The queries [`Gpu::sparse_attention_into`] reads.
#[derive(Clone, Copy)]
pub enum AttentionQuery<'a> {
    /// `[T, H, c]` f32, already through the per-head RMSNorm and RoPE (spec §4.6, e.g.
    /// [`Gpu::rms_norm_rope`]).
    Normed(&'a CudaSlice<f32>),
    /// `[T, H, c]` f32, the raw `wq_b` output: the streaming kernel applies the per-head unweighted
    /// RMSNorm (epsilon `eps`, ≥ 0) and the RoPE at each token's position while it stages Q (switch
    /// `MLA_FUSED_Q_NORM`), computing what [`Gpu::rms_norm_rope`] (`rms_norm_rows_f32`) writes bit for
    /// bit. The streaming kernel only (`MLA_STREAM_TOPK`, 64 heads of 512).
    Raw {
        /// The un-normed queries.
        q: &'a CudaSlice<f32>,
        /// The RMSNorm epsilon (the config's `rms_norm_eps`).
        eps: f32,
    },
    /// [`AttentionQuery::Raw`] with the raw queries as bf16 bits `[T, H, c]` (switch
    /// `WQ_B_BF16_OUT`: the `wq_b` GEMM's output in bf16, as DeepSeek's `fp8_gemm` writes it, spec
    /// §6): widened exactly as the kernel loads them, so the result is bit for bit that of `Raw`
    /// on the widened values. The streaming kernel only.
    RawBf16 {
        /// The un-normed queries (bf16 bits).
        q: &'a CudaSlice<u16>,
        /// The RMSNorm epsilon (the config's `rms_norm_eps`).
        eps: f32,
    },
}

/// The query buffer of one launch: f32 or bf16 bits.
enum QueryBuf<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
}

/// Where [`Gpu::sparse_attention_into`] writes the attention output.
pub enum AttentionOut<'a> {
    /// f32 `[T, H, c]`.
    F32(&'a mut CudaSlice<f32>),
    /// The split bf16 planes that [`Gpu::bf16_planes`] (`split`) makes from that f32 output, for
    /// the grouped output projection (§4.7, [`Gpu::grouped_linear_lt_planes`]): hi at elements
    /// `0 .. T·H·c`, lo from element `plane` (≥ T·H·c, a multiple of 8), row t at `t·H·c`; nothing
    /// else is written.
    /// The streaming kernel only (`MLA_STREAM_TOPK`, 64 heads of 512): attention.cu splits each
    /// value as gemm.cu `gemm_x_bf16` does, so the planes are bit for bit those of the f32 output.
    SplitPlanes {
        /// u16 bf16 bits, at least `plane + T·H·c` of them.
        planes: &'a mut CudaSlice<u16>,
        /// Offset of the lo plane, in elements.
        plane: usize,
    },
    /// The output rounded to bf16 `[T, H, c]` (u16 bits; round to nearest even — the hi plane of
    /// [`AttentionOut::SplitPlanes`] alone), for the grouped output projection on bf16 activations
    /// ([`Gpu::grouped_linear_lt_planes`] without a lo plane). The bf16 kernels only
    /// ([`AttentionKernel::StreamBf16`]: OFF-K's attention writes its output in bf16).
    Bf16(&'a mut CudaSlice<u16>),
    /// The output quantized as [`Gpu::act_quant`] quantizes the f32 output `[T, H·c]` (switch
    /// `WO_A_FP8`: DeepSeek's rule per 128 channels of a head, spec §6), for the FP8 grouped output
    /// projection ([`Gpu::grouped_linear_lt_fp8`]): e4m3 bytes `[T, H, c]` in `q` and f32 scales
    /// `[T, H·c/128]` in `scales` — bit for bit act_quant_fp8 on the f32 output (gpu-check
    /// `sparse_attention_wc fp8 out bits`). The candidate-split bf16 kernel only
    /// ([`AttentionKernel::StreamBf16Cand`]).
    Fp8 {
        /// e4m3 bytes, at least T·H·c.
        q: &'a mut CudaSlice<u8>,
        /// f32 scales, at least T·H·c/128.
        scales: &'a mut CudaSlice<f32>,
    },
}

/// The compressed candidates of a [`Gpu::sparse_attention`] call.
pub struct CompressedKeys<'a> {
    /// Entries `[n_entries, c]` (`n_entries = len / c`).
    pub entries: &'a CudaSlice<f32>,
    /// CSR offsets `[tokens + 1]` into `indices` (non-decreasing, from 0).
    pub offsets: &'a CudaSlice<i32>,
    /// Entry indices (each query's list ascending, as the reference orders keys), or `None` for
    /// identity lists: element j of every list is entry j (HCA; offsets from [`hca_offsets`]).
    pub indices: Option<&'a CudaSlice<i32>>,
    /// The mask path of `DIRECT_INDEXER_TOPK=off` (issue 6 §2): `[T, n_entries]` bytes, with
    /// identity lists (`indices: None`, offsets = the visible counts from [`hca_offsets`]); query t
    /// attends to the visible entries whose byte is non-zero, ascending (built by
    /// [`Gpu::topk_mask`] from the indexer's lists, it gives the direct path's bits).
    pub mask: Option<&'a CudaSlice<u8>>,
}

/// Geometry of one compressor pooling call ([`Gpu::compressor_pool`], [`Gpu::compress_entries`]).
#[derive(Debug, Clone, Copy)]
pub struct PoolShape {
    /// Tokens per window m (HCA 128, CSA 4).
    pub ratio: usize,
    /// Entry width (512 for the KV compressors, 128 for the indexer's key compressor).
    pub width: usize,
    /// CSA overlap: rows are `2·width` wide (A half, B half) and entry e also pools the A halves
    /// of window e−1.
    pub overlap: bool,
    /// Absolute position of the token in row 0 of the projected buffers.
    pub row_base: usize,
    /// First entry to pool.
    pub e0: usize,
    /// Entries to pool: `e0..e0 + n_entries`.
    pub n_entries: usize,
}

impl PoolShape {
    /// Row width of the projections: `width` (HCA) or `2·width` (CSA).
    pub fn out(&self) -> usize {
        if self.overlap {
            2 * self.width
        } else {
            self.width
        }
    }
}

/// Geometry of the indexer calls ([`Gpu::indexer_scores`], [`Gpu::indexer_topk`]).
#[derive(Debug, Clone, Copy)]
pub struct IndexerShape {
    /// Query tokens T (query t at absolute position `pos0 + t`).
    pub tokens: usize,
    /// Index heads (Flash 64).
    pub heads: usize,
    /// Index head dim (Flash 128); a multiple of 4, at most [`INDEXER_MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Index keys N that exist.
    pub n_entries: usize,
    /// Compression ratio of the keys (CSA: 4).
    pub ratio: usize,
    /// Absolute position of the first query.
    pub pos0: usize,
}

/// The scalar arguments and launch geometry the streaming top-k kernels share.
struct StreamTopkLaunch {
    args: ScoresArgs,
    tail: [i32; 2],
    cfg: LaunchConfig,
}

impl StreamTopkLaunch {
    /// Pushes `heads, hd, n, ratio, pos0, scale, T, k` (the kernels' trailing arguments).
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        for v in &self.args.ints {
            b.arg(v);
        }
        b.arg(&self.args.scale);
        for v in &self.tail {
            b.arg(v);
        }
    }
}

/// The quantized operands of the FP8 indexer kernels: `q8` plain `[≥ T·heads, hd]`; `k8` plain
/// `[≥ N, hd]`, or with `tiled` (the wgmma kernels) in the tiled layout with whole 64-key tiles for
/// the N keys (nothing to check when T or N is zero).
fn check_fp8_operands(what: &'static str, q8: &super::ops_q8::QuantizedActs, k8: &super::ops_q8::QuantizedActs, shape: &IndexerShape, tiled: bool) -> Result<(), CudaError> {
    let (tokens, n, hd) = (shape.tokens, shape.n_entries, shape.head_dim);
    if tokens == 0 || n == 0 {
        return Ok(());
    }
    let layout = |t: bool| if t { "tiled" } else { "plain" };
    ensure(what, !q8.tiled && q8.kp == hd && q8.rows >= tokens * shape.heads, || format!("q8 is {} [{}, {}], need plain ≥ [{}, {hd}]", layout(q8.tiled), q8.rows, q8.kp, tokens * shape.heads))?;
    let rows = if tiled { n.div_ceil(64) * 64 } else { n };
    ensure(what, k8.tiled == tiled && k8.kp == hd && k8.rows >= rows, || format!("k8 is {} [{}, {}], need {} ≥ [{rows}, {hd}]", layout(k8.tiled), k8.rows, k8.kp, layout(tiled)))
}

/// Launch of the wgmma indexer kernels ([`INDEXER_WGMMA_KERNELS`]): four tokens per block, one
/// warpgroup each (512 threads), dynamic shared memory [`INDEXER_WGMMA_SMEM`].
fn wgmma_indexer_cfg(tokens: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (tokens.div_ceil(4) as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: INDEXER_WGMMA_SMEM as u32 }
}

/// The f32 index queries (`[T, heads, hd]`) and keys (`[N, hd]`) of the indexer kernels are long
/// enough (nothing to check when T or N is zero).
fn check_queries_keys(what: &'static str, q: &CudaSlice<f32>, keys: &CudaSlice<f32>, shape: &IndexerShape) -> Result<(), CudaError> {
    if shape.tokens == 0 || shape.n_entries == 0 {
        return Ok(());
    }
    ensure(what, q.len() >= shape.tokens * shape.heads * shape.head_dim, || format!("q holds {} values, need T·heads·hd = {}", q.len(), shape.tokens * shape.heads * shape.head_dim))?;
    ensure(what, keys.len() >= shape.n_entries * shape.head_dim, || format!("keys hold {} values, need N·hd = {}", keys.len(), shape.n_entries * shape.head_dim))
}

/// The common launch arguments of the indexer score and streaming top-k kernels
/// (`indexer_scores_f32`, `_tc`, `_wgmma`, `indexer_topk_stream`, `_fp8`, `indexer_topk_wgmma`):
/// `heads, hd, N, ratio, pos0` as i32 and `scale = hd^−1/2`.
struct ScoresArgs {
    ints: [i32; 5],
    scale: f32,
}

impl ScoresArgs {
    /// From `shape`. Errors: a size beyond i32 (`pos0 + T` stands for every position).
    fn new(what: &'static str, shape: &IndexerShape) -> Result<Self, CudaError> {
        let IndexerShape { tokens, heads, head_dim: hd, n_entries: n, ratio, pos0 } = *shape;
        let ints = [int(what, "heads", heads)?, int(what, "hd", hd)?, int(what, "N", n)?, int(what, "ratio", ratio)?, int(what, "pos0 + T", pos0 + tokens).map(|_| pos0 as i32)?];
        Ok(ScoresArgs { ints, scale: (hd as f64).powf(-0.5) as f32 })
    }
}

/// Checks shared by [`Gpu::indexer_scores_with`] and [`Gpu::indexer_scores_wgmma`] (head dim and
/// query width limits, ratio, the lengths of q, keys, weights and scores, i32 sizes) and their
/// common arguments; None when there is nothing to do (T or N zero).
fn scores_args(what: &'static str, q: &CudaSlice<f32>, keys: &CudaSlice<f32>, weights: &CudaSlice<f32>, scores: &CudaSlice<f32>, shape: &IndexerShape) -> Result<Option<ScoresArgs>, CudaError> {
    let IndexerShape { tokens, heads, head_dim: hd, n_entries: n, ratio, .. } = *shape;
    if tokens == 0 || n == 0 {
        return Ok(None);
    }
    ensure(what, hd > 0 && hd.is_multiple_of(4) && hd <= INDEXER_MAX_HEAD_DIM, || format!("index head dim {hd}: need a multiple of 4 in 4..={INDEXER_MAX_HEAD_DIM}"))?;
    ensure(what, heads >= 1 && heads * hd <= INDEXER_MAX_QUERY, || format!("heads·hd = {}·{hd} exceeds {INDEXER_MAX_QUERY}", heads))?;
    ensure(what, ratio >= 1, || "ratio must be ≥ 1".into())?;
    check_queries_keys(what, q, keys, shape)?;
    ensure(what, weights.len() >= tokens * heads, || format!("weights hold {} values, need T·heads = {}", weights.len(), tokens * heads))?;
    ensure(what, scores.len() >= tokens * n, || format!("scores hold {} values, need T·N = {}", scores.len(), tokens * n))?;
    ScoresArgs::new(what, shape).map(Some)
}

/// Checks of [`Gpu::indexer_topk_stream`] and [`Gpu::indexer_topk_stream_fp8`] (shape, k, the
/// weights, offsets and lists) and their launch; None when there is nothing to do (T or N zero).
fn stream_topk_launch(
    what: &'static str,
    shape: &IndexerShape,
    k: usize,
    weights: &CudaSlice<f32>,
    offsets: &CudaSlice<i32>,
    idx: &CudaSlice<i32>,
) -> Result<Option<StreamTopkLaunch>, CudaError> {
    let IndexerShape { tokens, heads, head_dim: hd, n_entries: n, ratio, pos0 } = *shape;
    ensure(what, heads == 64 && hd == 128, || format!("needs 64 heads of 128, got {heads} of {hd}"))?;
    ensure(what, (1..=INDEXER_STREAM_MAX_K).contains(&k), || format!("k = {k}: need 1..={INDEXER_STREAM_MAX_K}"))?;
    if tokens == 0 || n == 0 {
        return Ok(None);
    }
    ensure(what, ratio >= 1, || "ratio must be ≥ 1".into())?;
    ensure(what, weights.len() >= tokens * heads, || format!("weights hold {} values, need T·heads = {}", weights.len(), tokens * heads))?;
    ensure(what, offsets.len() > tokens, || format!("offsets hold {} values, need T+1 = {}", offsets.len(), tokens + 1))?;
    let total: usize = (0..tokens).map(|t| visible_entries(pos0 + t, ratio, n).min(k)).sum();
    ensure(what, idx.len() >= total, || format!("idx holds {} values, the lists need {total}", idx.len()))?;
    int(what, "total list length", total)?;
    let args = ScoresArgs::new(what, shape)?;
    let tail = [int(what, "tokens", tokens)?, int(what, "k", k)?];
    let cfg = LaunchConfig { grid_dim: (tokens.div_ceil(2) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: INDEXER_STREAM_SMEM as u32 };
    Ok(Some(StreamTopkLaunch { args, tail, cfg }))
}

impl Gpu {
    /// Sparse attention with sinks (spec §4.6) followed by the inverse RoPE of the output's
    /// trailing `rope.dim` channels at the query position (§3.2).
    ///
    /// `q`: `[T, H, c]` (normed, rotated queries). `kv`: raw K=V rows `[kv_rows, c]`, row r at
    /// absolute position `kv_base + r`; it must hold every window row of the chunk,
    /// `max(0, pos0−W+1) .. pos0+T`. `comp`: the compressed candidates, `None` on sliding layers.
    /// `sinks`: `[H]`; `inv_freq`: `rope.inv_freq()` on the device (`[rope.dim/2]`; the rope's
    /// attention factor must be 1, as on DeepSeek-V4). `out`: `[T, H, c]`.
    /// Per query t and head h: candidates = window rows in position order, then the query's
    /// compressed list; logits `q·k·c^−1/2`; `o = Σ P·k` with the sink in the denominator only.
    ///
    /// Kernel from the `MLA_STREAM_TOPK` and `MLA_STREAM_FAST_EXP` switches
    /// ([`AttentionKernel::from_switches`]): the streaming tensor-core kernel for 64 heads × 512
    /// (grid `T`, block 256), else the f32 kernel (grid `T·H`, block 128); see
    /// `kernels/attention.cu`. With `comp.mask` (the `DIRECT_INDEXER_TOPK=off` path) the kernels
    /// first count each query's set bytes, then take them in ascending order.
    ///
    /// Errors: [`CudaError::Unsupported`] for `c` not a multiple of 4 or above
    /// [`ATTENTION_MAX_HEAD_DIM`], an odd or too wide rope, short buffers, a window not covered by
    /// `kv`, or sizes beyond i32; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn sparse_attention(
        &self,
        q: &CudaSlice<f32>,
        kv: &CudaSlice<f32>,
        comp: Option<&CompressedKeys<'_>>,
        sinks: &CudaSlice<f32>,
        inv_freq: &CudaSlice<f32>,
        rope: &Rope,
        out: &mut CudaSlice<f32>,
        shape: &AttentionShape,
    ) -> Result<(), CudaError> {
        let kernel = AttentionKernel::from_switches(shape.heads, shape.head_dim, self.attention_bf16_ok(), self.attention_cand_split_ok());
        self.sparse_attention_into(AttentionQuery::Normed(q), kv, comp, sinks, inv_freq, rope, &mut AttentionOut::F32(out), shape, kernel)
    }

    /// [`Gpu::sparse_attention`] on the kernel the caller picks (the streaming ones need H = 64 and
    /// c = 512, the bf16 ones also [`Gpu::attention_bf16_ok`]) from normed or raw queries
    /// ([`AttentionQuery`]) into `out`: f32, the split bf16 planes of the output
    /// ([`AttentionOut::SplitPlanes`], split streaming kernels only) or the output in bf16
    /// ([`AttentionOut::Bf16`], bf16 kernels only).
    ///
    /// Errors: as [`Gpu::sparse_attention`]; a streaming kernel for another shape or (bf16) device;
    /// planes shorter than `plane + T·H·c`, `plane` below `T·H·c` or not a multiple of 8; an output
    /// the kernel does not write; raw queries with the f32 kernel; a negative or non-finite epsilon.
    #[allow(clippy::too_many_arguments)]
    pub fn sparse_attention_into(
        &self,
        query: AttentionQuery<'_>,
        kv: &CudaSlice<f32>,
        comp: Option<&CompressedKeys<'_>>,
        sinks: &CudaSlice<f32>,
        inv_freq: &CudaSlice<f32>,
        rope: &Rope,
        out: &mut AttentionOut<'_>,
        shape: &AttentionShape,
        kernel: AttentionKernel,
    ) -> Result<(), CudaError> {
        const W: &str = "sparse_attention";
        ensure(W, kernel == AttentionKernel::Exact || (shape.heads == 64 && shape.head_dim == 512), || {
            format!("the streaming kernel needs 64 heads of 512, got {} of {}", shape.heads, shape.head_dim)
        })?;
        let AttentionShape { tokens, heads, head_dim: c, pos0, window, kv_base } = *shape;
        if tokens == 0 {
            return Ok(());
        }
        ensure(W, heads > 0 && c > 0 && c.is_multiple_of(4) && c <= ATTENTION_MAX_HEAD_DIM, || {
            format!("heads {heads}, head_dim {c}: need heads ≥ 1 and head_dim a multiple of 4 in 4..={ATTENTION_MAX_HEAD_DIM}")
        })?;
        ensure(W, rope.dim.is_multiple_of(2) && rope.dim <= c, || format!("rope dim {} must be even and ≤ head_dim {c}", rope.dim))?;
        ensure(W, inv_freq.len() >= rope.dim / 2, || format!("inv_freq holds {} values, rope needs {}", inv_freq.len(), rope.dim / 2))?;
        ensure(W, window >= 1, || "window must be ≥ 1".into())?;
        ensure(W, sinks.len() >= heads, || format!("sinks hold {} values for {heads} heads", sinks.len()))?;
        let raw_eps = |eps: f32| -> Result<f32, CudaError> {
            ensure(W, kernel != AttentionKernel::Exact, || "raw queries need the streaming kernel (MLA_STREAM_TOPK=on, 64 heads of 512)".into())?;
            ensure(W, eps.is_finite() && eps >= 0.0, || format!("the q RMSNorm epsilon must be finite and ≥ 0, got {eps}"))?;
            Ok(eps)
        };
        let (q, q_eps, q_len) = match query {
            AttentionQuery::Normed(q) => (QueryBuf::F32(q), -1f32, q.len()),
            AttentionQuery::Raw { q, eps } => (QueryBuf::F32(q), raw_eps(eps)?, q.len()),
            AttentionQuery::RawBf16 { q, eps } => (QueryBuf::Bf16(q), raw_eps(eps)?, q.len()),
        };
        let q_bf16 = i32::from(matches!(q, QueryBuf::Bf16(_)));
        let n = tokens * heads * c;
        let out_len = match out {
            AttentionOut::F32(o) => o.len(),
            AttentionOut::Bf16(o) => {
                ensure(W, kernel.is_bf16(), || "bf16 output needs the bf16 streaming kernel (MLA_BF16=on, 64 heads of 512)".into())?;
                o.len()
            }
            AttentionOut::SplitPlanes { planes, plane } => {
                ensure(W, matches!(kernel, AttentionKernel::Stream | AttentionKernel::StreamFastExp), || "split-plane output needs the split streaming kernel (MLA_STREAM_TOPK=on, MLA_BF16=off, 64 heads of 512)".into())?;
                ensure(W, *plane >= n && planes.len() >= *plane + n, || format!("planes of {} values with the lo plane at {plane} cannot hold two planes of T·H·c = {n}", planes.len()))?;
                ensure(W, plane.is_multiple_of(8), || format!("the lo plane's offset {plane} must be a multiple of 8 (16-byte row stores)"))?;
                n
            }
            AttentionOut::Fp8 { q, scales } => {
                ensure(W, kernel == AttentionKernel::StreamBf16Cand, || "FP8 output needs the candidate-split bf16 kernel (MLA_BF16=on, MLA_BF16_CAND_SPLIT=on, 64 heads of 512)".into())?;
                ensure(W, scales.len() >= n / 128 && q.len() >= n, || format!("FP8 output of T·H·c = {n} values needs at least {n} e4m3 bytes and {} scales; got {} and {}", n / 128, q.len(), scales.len()))?;
                q.len()
            }
        };
        ensure(W, q_len >= n && out_len >= n, || format!("q ({q_len}) and out ({out_len}) must hold T·H·c = {n} values"))?;
        ensure(W, kv.len().is_multiple_of(c), || format!("kv length {} is not a multiple of head_dim {c}", kv.len()))?;
        let kv_rows = kv.len() / c;
        let first = (pos0 + 1).saturating_sub(window);
        ensure(W, kv_base <= first && kv_base + kv_rows >= pos0 + tokens, || {
            format!("kv rows cover positions {kv_base}..{}, the chunk's windows need {first}..{}", kv_base + kv_rows, pos0 + tokens)
        })?;
        let grid = tokens * heads;
        ensure(W, grid <= i32::MAX as usize, || format!("grid T·H = {grid} too large"))?;
        let (h_i, c_i, rd_i, p0_i, w_i, kb_i, kr_i) = (
            int(W, "heads", heads)?,
            int(W, "head_dim", c)?,
            int(W, "rope dim", rope.dim)?,
            int(W, "pos0 + T", pos0 + tokens).map(|_| pos0 as i32)?,
            int(W, "window", window)?,
            int(W, "kv_base", kv_base)?,
            int(W, "kv rows", kv_rows)?,
        );
        let scale = (c as f64).powf(-0.5) as f32;
        let null = 0u64;
        let mut n_entries = 0i32;
        if let Some(ck) = comp {
            ensure(W, ck.entries.len().is_multiple_of(c), || format!("entries length {} is not a multiple of head_dim {c}", ck.entries.len()))?;
            ensure(W, ck.offsets.len() > tokens, || format!("offsets hold {} values, need T+1 = {}", ck.offsets.len(), tokens + 1))?;
            n_entries = int(W, "entries", ck.entries.len() / c)?;
            if let Some(mask) = ck.mask {
                ensure(W, ck.indices.is_none(), || "a mask needs identity lists (indices: None)".into())?;
                let need = tokens * (ck.entries.len() / c);
                ensure(W, mask.len() >= need, || format!("mask holds {} bytes, need T·n_entries = {need}", mask.len()))?;
            }
        }
        let plane_out = matches!(out, AttentionOut::SplitPlanes { .. } | AttentionOut::Bf16(_));
        let fp8_out = matches!(out, AttentionOut::Fp8 { .. });
        let (name, cfg) = match kernel {
            AttentionKernel::Exact => ("sparse_attention_f32", LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }),
            AttentionKernel::Stream | AttentionKernel::StreamFastExp => {
                let name = ATTENTION_TC_KERNELS[usize::from(kernel != AttentionKernel::Stream) + 2 * usize::from(plane_out)];
                (name, LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: ATTENTION_TC_SMEM as u32 })
            }
            AttentionKernel::StreamBf16 | AttentionKernel::StreamBf16FastExp => {
                ensure(W, self.attention_bf16_ok(), || format!("the bf16 attention kernels (MLA_BF16) need sm_90a and {ATTENTION_WG_REGS} registers per thread; this device is {}", self.arch))?;
                let name = ATTENTION_WG_KERNELS[usize::from(kernel == AttentionKernel::StreamBf16FastExp) + 2 * usize::from(plane_out)];
                (name, LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (384, 1, 1), shared_mem_bytes: ATTENTION_WG_SMEM as u32 })
            }
            AttentionKernel::StreamBf16Cand => {
                ensure(W, self.attention_cand_split_ok(), || format!("the candidate-split bf16 attention kernels (MLA_BF16_CAND_SPLIT) need sm_90a and {ATTENTION_WG_REGS} registers per thread; this device is {}", self.arch))?;
                let name = ATTENTION_WC_KERNELS[if fp8_out { 2 } else { usize::from(plane_out) }];
                (name, LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (384, 1, 1), shared_mem_bytes: ATTENTION_WC_SMEM as u32 })
            }
        };
        // MLA_BF16: the kernel reads bf16 copies of the rows it can use — the window rows of this
        // chunk (positions `first` .. pos0 + T) and every entry — each rounded once here.
        let bf16_rows = if kernel.is_bf16() {
            let first = (pos0 + 1).saturating_sub(window); // ≥ kv_base: checked above
            let rows = pos0 + tokens - first;
            let kvb = self.bf16_rows(&kv.slice((first - kv_base) * c..(pos0 + tokens - kv_base) * c), rows, c)?;
            let entb = match comp {
                Some(ck) if n_entries > 0 => Some(self.bf16_rows(&ck.entries.slice(..), n_entries as usize, c)?),
                _ => None,
            };
            Some((kvb, entb, int(W, "first window row", first)?, int(W, "window rows", rows)?))
        } else {
            None
        };
        let (kb_i, kr_i) = match &bf16_rows {
            Some((_, _, first, rows)) => (*first, *rows),
            None => (kb_i, kr_i),
        };
        let mut b = self.stream.launch_builder(self.f(name));
        match q {
            QueryBuf::F32(q) => b.arg(q),
            QueryBuf::Bf16(q) => b.arg(q),
        };
        match &bf16_rows {
            Some((kvb, _, _, _)) => b.arg(kvb),
            None => b.arg(kv),
        };
        match comp {
            Some(ck) => {
                match &bf16_rows {
                    Some((_, Some(entb), _, _)) => b.arg(entb),
                    Some((_, None, _, _)) => b.arg(&null),
                    None => b.arg(ck.entries),
                };
                b.arg(ck.offsets);
                match ck.indices {
                    Some(i) => b.arg(i),
                    None => b.arg(&null),
                };
                match ck.mask {
                    Some(mk) => b.arg(mk),
                    None => b.arg(&null),
                };
            }
            None => {
                b.arg(&null).arg(&null).arg(&null).arg(&null);
            }
        }
        b.arg(sinks).arg(inv_freq);
        let plane_i = match out {
            AttentionOut::SplitPlanes { plane, .. } => *plane as i64,
            _ => 0i64,
        };
        // out (f32; the scales for FP8 output), then after the scalars planes (u16; the e4m3 bytes
        // for FP8 output).
        let (o32, planes, q8, scales8) = match out {
            AttentionOut::F32(o) => (Some(&mut **o), None, None, None),
            AttentionOut::SplitPlanes { planes, .. } => (None, Some(&mut **planes), None, None),
            AttentionOut::Bf16(o) => (None, Some(&mut **o), None, None),
            AttentionOut::Fp8 { q, scales } => (None, None, Some(&mut **q), Some(&mut **scales)),
        };
        match (o32, scales8) {
            (Some(o), _) => b.arg(o),
            (None, Some(sc)) => b.arg(sc),
            (None, None) => b.arg(&null), // out: unused
        };
        b.arg(&h_i).arg(&c_i).arg(&rd_i).arg(&p0_i).arg(&w_i).arg(&kb_i).arg(&kr_i).arg(&n_entries).arg(&scale);
        if kernel != AttentionKernel::Exact {
            match (planes, q8) {
                (Some(p), _) => b.arg(p),
                (None, Some(q)) => b.arg(q),
                (None, None) => b.arg(&null),
            };
            b.arg(&plane_i).arg(&q_eps).arg(&q_bf16);
        }
        // SAFETY: the argument list matches the signature the attention kernels share (pointers incl.
        // the optional mask, then nine i32 and one f32; the streaming kernels then the planes pointer,
        // null for f32 output, the lo plane's offset as i64, the q-norm epsilon as f32, negative
        // for normed queries, and q_bf16 as i32: 1 when q holds bf16 bits (raw queries only);
        // sparse_attention_wc_fp8_out reads out as its T·H·c/128 f32 scales and planes as its
        // T·H·c e4m3 bytes (both checked above); the
        // bf16 kernels' kv and entries are the bf16 copies of the same rows, kv from the chunk's
        // first window row, with that base and row count); buffer sizes and the
        // window coverage were checked above; the streaming kernels get their full dynamic shared
        // memory (they trap on less).
        launched(name, unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// `rows` rows of `c` f32 values (`x`, row-major) rounded to bf16 (round to nearest even) in a
    /// new buffer `[rows, c]` (gemm_x_bf16 without its lo plane), for the bf16 attention kernels.
    ///
    /// Errors: `c` not a multiple of 32, `x` shorter than `rows·c`, sizes beyond 32-bit indexing,
    /// allocation or launch failures.
    fn bf16_rows(&self, x: &cudarc::driver::CudaView<'_, f32>, rows: usize, c: usize) -> Result<DevBuf<u16>, CudaError> {
        const W: &str = "sparse_attention";
        ensure(W, c.is_multiple_of(32) && x.len() >= rows * c, || format!("{} values for {rows} bf16 rows of {c}", x.len()))?;
        int(W, "row values", rows * c)?;
        // SAFETY: gemm_x_bf16 writes all rows·c values (Tp = rows, Kp = c, split 0).
        let mut xb = unsafe { self.scratch::<u16>((rows * c).max(1)) }?;
        self.x_bf16_into(x, &mut xb, rows, c, rows, false)?;
        Ok(xb)
    }

    /// Adds the compressor position bias in place (spec §4.8 step 2 / §4.9): `logit[t, :] +=
    /// ape[(pos0 + t) mod ratio, :]`, where `logit` is `[tokens, out]` and `ape` `[ratio, out]`
    /// (`out = ape.len() / ratio`).
    ///
    /// Launch: grid `ceil(tokens·out / 256)`, block 256.
    ///
    /// Errors: [`CudaError::Unsupported`] for `ratio` 0, an `ape` not a multiple of `ratio`, a short
    /// `logit`, or sizes beyond i32.
    pub fn add_position_bias(&self, logit: &mut CudaSlice<f32>, ape: &CudaSlice<f32>, tokens: usize, ratio: usize, pos0: usize) -> Result<(), CudaError> {
        const W: &str = "add_position_bias";
        ensure(W, ratio >= 1 && ape.len().is_multiple_of(ratio) && !ape.is_empty(), || format!("ape of {} values is not [ratio = {ratio}, out]", ape.len()))?;
        let out = ape.len() / ratio;
        if tokens == 0 {
            return Ok(());
        }
        let total = tokens * out;
        ensure(W, logit.len() >= total, || format!("logit holds {} values, need tokens·out = {total}", logit.len()))?;
        let blocks = total.div_ceil(256);
        ensure(W, blocks <= i32::MAX as usize, || format!("{total} values is too many for one launch"))?;
        let (t_i, o_i, r_i, p_i) = (int(W, "tokens", tokens)?, int(W, "out", out)?, int(W, "ratio", ratio)?, int(W, "pos0 + tokens", pos0 + tokens).map(|_| pos0 as i32)?);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("add_position_bias_f32"));
        b.arg(logit).arg(ape).arg(&t_i).arg(&o_i).arg(&r_i).arg(&p_i);
        // SAFETY: matches add_position_bias_f32; sizes checked above.
        launched("add_position_bias_f32", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Softmax pooling of compressor windows (spec §4.8 step 2, §4.9), before RMSNorm and RoPE:
    /// `pooled[e − e0, ch] = Σ_s softmax_s(logit_s[ch])·kv_s[ch]` over the slots of entry e (HCA: the
    /// `ratio` tokens of window e; CSA: the A halves of window e−1, absent for e = 0, then the B
    /// halves of window e).
    ///
    /// `kv`, `logit`: per-token projections `[rows, out]` (`out` = [`PoolShape::out`]; logits
    /// already biased, [`Gpu::add_position_bias`]), row r holding the token at absolute position
    /// `row_base + r`; they must cover every slot token, `(e0 − 1)·ratio` (CSA, e0 > 0) or
    /// `e0·ratio` up to `(e0 + n_entries)·ratio`. `pooled`: `[n_entries, width]`.
    ///
    /// Launch: grid `(ceil(width/128), n_entries)`, block 128.
    ///
    /// Errors: [`CudaError::Unsupported`] for zero ratio/width, mismatched or short buffers, slot
    /// tokens not covered, more than 65535 entries, or sizes beyond i32.
    pub fn compressor_pool(&self, kv: &CudaSlice<f32>, logit: &CudaSlice<f32>, pooled: &mut CudaSlice<f32>, shape: &PoolShape) -> Result<(), CudaError> {
        const W: &str = "compressor_pool";
        let PoolShape { ratio, width, overlap, row_base, e0, n_entries } = *shape;
        if n_entries == 0 {
            return Ok(());
        }
        ensure(W, ratio >= 1 && width >= 1, || format!("ratio {ratio} and width {width} must be ≥ 1"))?;
        let out = shape.out();
        ensure(W, kv.len() == logit.len() && kv.len().is_multiple_of(out), || {
            format!("kv ({}) and logit ({}) must both be [rows, {out}]", kv.len(), logit.len())
        })?;
        let rows = kv.len() / out;
        let first = if overlap && e0 > 0 { (e0 - 1) * ratio } else { e0 * ratio };
        let end = (e0 + n_entries) * ratio;
        ensure(W, row_base <= first && row_base + rows >= end, || {
            format!("rows cover tokens {row_base}..{}, entries {e0}..{} need {first}..{end}", row_base + rows, e0 + n_entries)
        })?;
        ensure(W, pooled.len() >= n_entries * width, || format!("pooled holds {} values, need {}", pooled.len(), n_entries * width))?;
        ensure(W, n_entries <= MAX_GRID_Y, || format!("{n_entries} entries in one launch (max {MAX_GRID_Y})"))?;
        let (rb_i, rows_i, out_i, w_i, r_i, ov_i, e0_i) = (
            int(W, "row_base", row_base)?,
            int(W, "rows", rows)?,
            int(W, "out", out)?,
            int(W, "width", width)?,
            int(W, "ratio", ratio)?,
            overlap as i32,
            int(W, "end token", end).map(|_| e0 as i32)?,
        );
        let cfg = LaunchConfig { grid_dim: (width.div_ceil(128) as u32, n_entries as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("compressor_pool_f32"));
        b.arg(kv).arg(logit).arg(pooled).arg(&rb_i).arg(&rows_i).arg(&out_i).arg(&w_i).arg(&r_i).arg(&ov_i).arg(&e0_i);
        // SAFETY: matches compressor_pool_f32; row coverage and sizes checked above.
        launched("compressor_pool_f32", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Interleaved RoPE (inverse when `inverse`) of the trailing `rope.dim` channels of each head of
    /// `x` (`[rows, heads, head_dim]`), row t at position `pos0 + t·stride` (spec §3.2; compressed
    /// entries use `pos0 = e0·ratio`, `stride = ratio`).
    ///
    /// Launch: grid `rows·heads`, block `rope.dim/2`.
    ///
    /// Errors: [`CudaError::Unsupported`] for an odd or too wide rope, short buffers, or positions
    /// beyond i32.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_positions(
        &self,
        x: &mut CudaSlice<f32>,
        inv_freq: &CudaSlice<f32>,
        rope: &Rope,
        rows: usize,
        heads: usize,
        head_dim: usize,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<(), CudaError> {
        const W: &str = "rope_positions";
        if rows == 0 || heads == 0 || rope.dim == 0 {
            return Ok(());
        }
        ensure(W, rope.dim.is_multiple_of(2) && rope.dim <= head_dim && rope.dim / 2 <= 1024, || format!("rope dim {} must be even and ≤ head_dim {head_dim}", rope.dim))?;
        ensure(W, inv_freq.len() >= rope.dim / 2, || format!("inv_freq holds {} values, rope needs {}", inv_freq.len(), rope.dim / 2))?;
        ensure(W, x.len() >= rows * heads * head_dim, || format!("x holds {} values, need {}", x.len(), rows * heads * head_dim))?;
        ensure(W, rows * heads <= i32::MAX as usize, || format!("{rows}·{heads} rows too many"))?;
        let last = pos0 + (rows - 1) * stride;
        let (h_i, hd_i, rd_i, p_i, s_i) =
            (int(W, "heads", heads)?, int(W, "head_dim", head_dim)?, int(W, "rope dim", rope.dim)?, int(W, "last position", last).map(|_| pos0 as i32)?, int(W, "stride", stride)?);
        let sign = if inverse { -1.0f32 } else { 1.0 };
        let cfg = LaunchConfig { grid_dim: ((rows * heads) as u32, 1, 1), block_dim: ((rope.dim / 2) as u32, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("rope_positions_f32"));
        b.arg(x).arg(inv_freq).arg(&h_i).arg(&hd_i).arg(&rd_i).arg(&p_i).arg(&s_i).arg(&sign);
        // SAFETY: matches rope_positions_f32; sizes checked above.
        launched("rope_positions_f32", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Complete compressed entries `e0..e0+n_entries` (spec §4.8 steps 2–4, §4.9): softmax pooling
    /// ([`Gpu::compressor_pool`]) into a scratch buffer, weighted RMSNorm with `norm` (`[width]`,
    /// `eps`) into `out` (`[n_entries, width]`), then RoPE of the trailing `rope.dim` channels at
    /// each entry's position `e·ratio`. The official FP8/FP4 simulations are not applied.
    ///
    /// Errors: as [`Gpu::compressor_pool`] and [`Gpu::rope_positions`]; a `norm` of the wrong width.
    #[allow(clippy::too_many_arguments)]
    pub fn compress_entries(
        &self,
        kv: &CudaSlice<f32>,
        logit: &CudaSlice<f32>,
        norm: &CudaSlice<f32>,
        eps: f32,
        inv_freq: &CudaSlice<f32>,
        rope: &Rope,
        shape: &PoolShape,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const W: &str = "compress_entries";
        if shape.n_entries == 0 {
            return Ok(());
        }
        let n = shape.n_entries * shape.width;
        ensure(W, norm.len() == shape.width, || format!("norm holds {} values for width {}", norm.len(), shape.width))?;
        ensure(W, out.len() >= n, || format!("out holds {} values, need {n}", out.len()))?;
        let mut pooled = self.zeros::<f32>(n)?;
        self.compressor_pool(kv, logit, &mut pooled, shape)?;
        self.rms_norm(&pooled, Some(norm), out, shape.n_entries, shape.width, eps)?;
        self.rope_positions(out, inv_freq, rope, shape.n_entries, 1, shape.width, shape.e0 * shape.ratio, shape.ratio, false)
    }

    /// Lightning-indexer scores (spec §4.10 steps 4–5): `scores[t, j] = hd^−1/2 · Σ_h w[t,h] ·
    /// max(q[t,h]·k[j], 0)` for `j < visible_entries(pos0+t)`, −inf for the other `j < N`.
    ///
    /// `q`: `[T, heads, hd]`; `keys`: `[N, hd]`; `weights`: `[T, heads]` (already scaled by
    /// `heads^−1/2`, as the reference); `scores`: `[T, N]`.
    ///
    /// Kernel from the `INDEXER_TC` switch: `indexer_scores_tc` for 64 heads × 128 (grid
    /// `(ceil(N/512), ceil(T/2))`, block 256), else `indexer_scores_f32` (grid `(ceil(N/16), T)`,
    /// block 256, 42 KB static shared memory).
    ///
    /// Errors: [`CudaError::Unsupported`] for `hd` not a multiple of 4 or above
    /// [`INDEXER_MAX_HEAD_DIM`], `heads·hd` above [`INDEXER_MAX_QUERY`], more than 65535 tokens,
    /// zero ratio, short buffers, or sizes beyond i32.
    pub fn indexer_scores(
        &self,
        q: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        scores: &mut CudaSlice<f32>,
        shape: &IndexerShape,
    ) -> Result<(), CudaError> {
        let tc = crate::switches::on("INDEXER_TC") && shape.heads == 64 && shape.head_dim == 128;
        self.indexer_scores_with(q, keys, weights, scores, shape, tc)
    }

    /// [`Gpu::indexer_scores`] on the kernel the caller picks: `tc` = `indexer_scores_tc` (split-bf16
    /// tensor cores; 64 heads of 128 only, an error otherwise), else `indexer_scores_f32`.
    pub fn indexer_scores_with(
        &self,
        q: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        scores: &mut CudaSlice<f32>,
        shape: &IndexerShape,
        tc: bool,
    ) -> Result<(), CudaError> {
        const W: &str = "indexer_scores";
        if tc {
            // Its checks (the tensor-core shape, the buffers, the grid) are indexer_scores_tc_kb's.
            let kb = if crate::switches::on("INDEXER_TC_DECODE_TILES") { indexer_tc_keys_per_block(shape.tokens, shape.n_entries) } else { ITC_KEYS_PER_BLOCK };
            return self.indexer_scores_tc_kb(q, keys, weights, scores, shape, kb);
        }
        let Some(ScoresArgs { ints: [h_i, hd_i, n_i, r_i, p_i], scale }) = scores_args(W, q, keys, weights, scores, shape)? else { return Ok(()) };
        let (tokens, n) = (shape.tokens, shape.n_entries);
        ensure(W, tokens <= MAX_GRID_Y, || format!("{tokens} tokens in one launch (max {MAX_GRID_Y})"))?;
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(16) as u32, tokens as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("indexer_scores_f32"));
        b.arg(q).arg(keys).arg(weights).arg(scores).arg(&h_i).arg(&hd_i).arg(&n_i).arg(&r_i).arg(&p_i).arg(&scale);
        // SAFETY: matches indexer_scores_f32; sizes checked above.
        launched("indexer_scores_f32", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// [`Gpu::indexer_scores_with`]'s tensor-core kernel (`indexer_scores_tc`, 64 heads of 128) with
    /// `kb` keys per block (a multiple of 64 up to [`ITC_KEYS_PER_BLOCK`]; grid `(ceil(N / kb),
    /// ceil(T / 2))`): every key's score comes from the same 64-key tile code whatever `kb` is, so
    /// the same bits (gpu-check `indexer_scores_tc kb 64 vs 512 bits`).
    ///
    /// Errors: as [`Gpu::indexer_scores_with`], and `kb` outside that set.
    pub fn indexer_scores_tc_kb(&self, q: &CudaSlice<f32>, keys: &CudaSlice<f32>, weights: &CudaSlice<f32>, scores: &mut CudaSlice<f32>, shape: &IndexerShape, kb: usize) -> Result<(), CudaError> {
        const W: &str = "indexer_scores";
        ensure(W, shape.heads == 64 && shape.head_dim == 128, || format!("the tensor-core scores need 64 heads of 128, got {} of {}", shape.heads, shape.head_dim))?;
        ensure(W, (64..=ITC_KEYS_PER_BLOCK).contains(&kb) && kb.is_multiple_of(64), || format!("{kb} keys per block (a multiple of 64 up to {ITC_KEYS_PER_BLOCK})"))?;
        let Some(ScoresArgs { ints: [h_i, hd_i, n_i, r_i, p_i], scale }) = scores_args(W, q, keys, weights, scores, shape)? else { return Ok(()) };
        let (tokens, n) = (shape.tokens, shape.n_entries);
        ensure(W, tokens <= MAX_GRID_Y, || format!("{tokens} tokens in one launch (max {MAX_GRID_Y})"))?;
        let (t_i, kb_i) = (int(W, "tokens", tokens)?, kb as i32);
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(kb) as u32, tokens.div_ceil(2) as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("indexer_scores_tc"));
        b.arg(q).arg(keys).arg(weights).arg(scores).arg(&h_i).arg(&hd_i).arg(&n_i).arg(&r_i).arg(&p_i).arg(&scale).arg(&t_i).arg(&kb_i);
        // SAFETY: matches indexer_scores_tc (indexer_scores_f32's arguments plus T and kb, which
        // is checked above against the kernel's trap condition); sizes checked above.
        launched("indexer_scores_tc", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Top-k selection of the indexer (spec §4.10 step 6): for query t, the indices of the `k` best
    /// `scores[t, ..visible]` (higher score first, ties to the lower index; every visible entry when
    /// there are at most `k`), written ascending to `idx[offsets[t]..offsets[t+1]]`.
    ///
    /// `scores`: `[T, N]` ([`Gpu::indexer_scores`]); `offsets`: `[T+1]`, exactly
    /// [`topk_offsets`]`(pos0, T, ratio, N, k)` on the device; `idx`: at least the total count.
    /// Exact for any N (radix select, no size limit).
    ///
    /// Launch: grid `T`, block 256.
    ///
    /// Errors: [`CudaError::Unsupported`] for `k = 0`, zero ratio, short buffers, or sizes beyond i32.
    pub fn indexer_topk(&self, scores: &CudaSlice<f32>, offsets: &CudaSlice<i32>, idx: &mut CudaSlice<i32>, shape: &IndexerShape, k: usize) -> Result<(), CudaError> {
        const W: &str = "indexer_topk";
        let IndexerShape { tokens, n_entries: n, ratio, pos0, .. } = *shape;
        if tokens == 0 {
            return Ok(());
        }
        ensure(W, k >= 1, || "k must be ≥ 1".into())?;
        ensure(W, ratio >= 1, || "ratio must be ≥ 1".into())?;
        ensure(W, tokens <= i32::MAX as usize, || format!("{tokens} tokens too many"))?;
        ensure(W, scores.len() >= tokens * n, || format!("scores hold {} values, need T·N = {}", scores.len(), tokens * n))?;
        ensure(W, offsets.len() > tokens, || format!("offsets hold {} values, need T+1 = {}", offsets.len(), tokens + 1))?;
        let total: usize = (0..tokens).map(|t| visible_entries(pos0 + t, ratio, n).min(k)).sum();
        ensure(W, idx.len() >= total, || format!("idx holds {} values, the lists need {total}", idx.len()))?;
        let (n_i, k_i, r_i, p_i) = (int(W, "N", n)?, int(W, "k", k)?, int(W, "ratio", ratio)?, int(W, "pos0 + T", pos0 + tokens).map(|_| pos0 as i32)?);
        int(W, "total list length", total)?;
        let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("indexer_topk_f32"));
        b.arg(scores).arg(offsets).arg(idx).arg(&n_i).arg(&k_i).arg(&r_i).arg(&p_i);
        // SAFETY: matches indexer_topk_f32; buffer sizes checked above (offsets are the caller's
        // topk_offsets, documented).
        launched("indexer_topk_f32", unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Sampling on the device (issue 5 §3): for each of the `rows` rows of `logits` (`[rows, vocab]`
    /// f32), the `k` most likely tokens in the sampler's order with the unmasked count and the first
    /// NaN / `+inf` ([`TopLogits`], equal to [`TopLogits::from_row`] on the downloaded row), from
    /// `logits_topk_f32` (indexer.cu: the indexer's exact radix select). Downloads `rows·(2 + 2k)`
    /// values instead of `rows·vocab`.
    ///
    /// Errors: `k` not in `1..=`[`crate::sampler::TOP_LOGITS_MAX_K`], a short buffer, sizes beyond
    /// i32, launch or copy failures.
    pub fn logits_top(&self, logits: &CudaSlice<f32>, rows: usize, vocab: usize, k: usize) -> Result<Vec<TopLogits>, CudaError> {
        const W: &str = "logits_top";
        ensure(W, (1..=crate::sampler::TOP_LOGITS_MAX_K).contains(&k), || format!("k = {k} (allowed 1..={})", crate::sampler::TOP_LOGITS_MAX_K))?;
        ensure(W, logits.len() >= rows * vocab, || format!("logits hold {} values, need {rows}·{vocab}", logits.len()))?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let (v_i, k_i) = (int(W, "vocab", vocab)?, int(W, "k", k)?);
        int(W, "rows", rows)?;
        let mut info = self.zeros::<i32>(2 * rows)?;
        let mut ids = self.zeros::<i32>(rows * k)?;
        let mut vals = self.zeros::<f32>(rows * k)?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("logits_topk_f32"));
        b.arg(logits).arg(&v_i).arg(&k_i).arg(&mut info).arg(&mut ids).arg(&mut vals);
        // SAFETY: matches logits_topk_f32(logits, V, k, info, ids, vals): logits rows·V floats (checked),
        // info 2·rows, ids/vals rows·k.
        launched("logits_topk_f32", unsafe { b.launch(cfg) }.map(|_| ()))?;
        let (info, ids, vals) = (self.download(&info)?, self.download(&ids)?, self.download(&vals)?);
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            let (unmasked, bad) = (info[2 * r].max(0) as usize, info[2 * r + 1]);
            let t = if bad >= 0 && (bad as usize) < vocab {
                // The non-finite value itself, for the error message: one more download.
                let at = r * vocab + bad as usize;
                let v = self.download_range(logits, at..at + 1)?[0];
                TopLogits { vocab, unmasked: 0, non_finite: Some((bad as u32, v)), cand: Vec::new() }
            } else {
                let cand = (0..k.min(unmasked)).map(|i| (ids[r * k + i] as u32, vals[r * k + i])).collect();
                let mut t = TopLogits { vocab, unmasked, non_finite: None, cand };
                t.sort();
                t
            };
            out.push(t);
        }
        Ok(out)
    }

    /// The indexer's selection (spec §4.10 steps 4–6) into `idx` (`offsets` = [`topk_offsets`] on
    /// the device), for a 64 × 128 indexer with `k ≤` [`INDEXER_STREAM_MAX_K`] and at least
    /// [`INDEXER_STREAM_MIN_TOKENS`] query tokens (prefill chunks; decode steps take the last path):
    /// with `INDEXER_FP8` on, FP8 scores ([`Gpu::indexer_topk_wgmma_fp8`] where
    /// [`Gpu::indexer_wgmma`] holds, else [`Gpu::indexer_topk_stream_fp8`]; not exact); else with
    /// `INDEXER_STREAM_TOPK` and `INDEXER_TC` on, the fused streaming kernel, no score matrix
    /// ([`Gpu::indexer_topk_wgmma`] where [`Gpu::indexer_wgmma`] holds, else
    /// [`Gpu::indexer_topk_stream`]). Otherwise [`Gpu::indexer_scores`] into a
    /// `[T, N]` f32 buffer it allocates, then [`Gpu::indexer_topk`]. The exact paths give the same
    /// lists (checked bit for bit by gpu-check).
    ///
    /// Errors: those of the kernels it runs.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_select(
        &self,
        q: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        shape: &IndexerShape,
        k: usize,
    ) -> Result<(), CudaError> {
        if shape.tokens == 0 || shape.n_entries == 0 {
            return Ok(());
        }
        let fits = shape.heads == 64 && shape.head_dim == 128 && k <= INDEXER_STREAM_MAX_K && shape.tokens >= INDEXER_STREAM_MIN_TOKENS;
        if fits && crate::switches::on("INDEXER_FP8") {
            let q8 = self.act_quant(q, shape.tokens * shape.heads, shape.head_dim)?;
            let wgmma = self.indexer_wgmma();
            let k8 = self.act_quant_layout(keys, shape.n_entries, shape.head_dim, wgmma)?;
            if wgmma {
                return self.indexer_topk_wgmma_fp8(&q8, &k8, weights, offsets, idx, shape, k);
            }
            return self.indexer_topk_stream_fp8(&q8, &k8, weights, offsets, idx, shape, k);
        }
        if fits && crate::switches::on("INDEXER_STREAM_TOPK") && crate::switches::on("INDEXER_TC") {
            if self.indexer_wgmma() {
                return self.indexer_topk_wgmma(q, keys, weights, offsets, idx, shape, k);
            }
            return self.indexer_topk_stream(q, keys, weights, offsets, idx, shape, k);
        }
        let mut scores = self.zeros::<f32>(shape.tokens * shape.n_entries)?;
        self.indexer_scores(q, keys, weights, &mut scores, shape)?;
        self.indexer_topk(&scores, offsets, idx, shape, k)
    }

    /// `INDEXER_STREAM_TOPK` (issue 6 §3): [`Gpu::indexer_scores`] on the tensor cores and
    /// [`Gpu::indexer_topk`] in one streaming pass over the keys, without the `[T, N]` score
    /// matrix; the same lists bit for bit (same score arithmetic, same selection rule).
    /// Arguments as those two (`offsets` = [`topk_offsets`]); 64 heads of 128 and
    /// `1 ≤ k ≤` [`INDEXER_STREAM_MAX_K`] only.
    ///
    /// Launch: grid `ceil(T/2)`, block 256, dynamic shared memory [`INDEXER_STREAM_SMEM`].
    ///
    /// Errors: [`CudaError::Unsupported`] for another shape or k, zero ratio, short buffers, or
    /// sizes beyond i32.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_topk_stream(
        &self,
        q: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        shape: &IndexerShape,
        k: usize,
    ) -> Result<(), CudaError> {
        const W: &str = "indexer_topk_stream";
        check_queries_keys(W, q, keys, shape)?;
        let Some(l) = stream_topk_launch(W, shape, k, weights, offsets, idx)? else { return Ok(()) };
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(q).arg(keys).arg(weights).arg(offsets).arg(idx);
        l.push(&mut b);
        let cfg = l.cfg;
        // SAFETY: matches indexer_topk_stream; sizes checked above; offsets are the caller's
        // topk_offsets (documented); the kernel gets its dynamic shared memory (it traps on less).
        launched(W, unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// Whether [`Gpu::indexer_select`] runs the wgmma kernels ([`Gpu::indexer_topk_wgmma`], or with
    /// `INDEXER_FP8` [`Gpu::indexer_topk_wgmma_fp8`]): the `INDEXER_WGMMA` switch is on and the
    /// device is sm_90a (wgmma exists nowhere else).
    pub fn indexer_wgmma(&self) -> bool {
        self.arch == "sm_90a" && crate::switches::on("INDEXER_WGMMA")
    }

    /// The index keys `[N, 128]` f32 as `indexer_keys_split` writes them for the wgmma kernels:
    /// `ceil(N/64)` tiles of 32 KB, split bf16 (hi, lo) in the 128-byte-swizzled K-major layout,
    /// keys past N zero (kernels/indexer.cu). A temporary buffer ([`Gpu::scratch`]).
    ///
    /// Errors: short keys, sizes beyond i32, driver errors.
    fn indexer_keys_split(&self, keys: &CudaSlice<f32>, n: usize) -> Result<DevBuf<u8>, CudaError> {
        const W: &str = "indexer_keys_split";
        ensure(W, keys.len() >= n * 128, || format!("keys hold {} values, need N·128 = {}", keys.len(), n * 128))?;
        let tiles = n.div_ceil(64);
        let (n_i, tiles_i) = (int(W, "N", n)?, int(W, "tiles·1024", tiles * 1024).map(|_| tiles as i32)?);
        // SAFETY: the kernel writes every byte of every tile (zeros past N).
        let mut kt = unsafe { self.scratch::<u8>((tiles * INDEXER_WGMMA_TILE).max(1))? };
        let cfg = LaunchConfig { grid_dim: ((tiles * 1024).div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(keys).arg(&mut kt).arg(&n_i).arg(&tiles_i);
        // SAFETY: matches indexer_keys_split; keys hold N·128 values (checked), kt tiles·32 KB bytes.
        launched(W, unsafe { b.launch(cfg) }.map(|_| ()))?;
        Ok(kt)
    }

    /// `INDEXER_WGMMA` (issue 6 §3): [`Gpu::indexer_topk_stream`]'s selection with the scores on
    /// wgmma (sm_90a), four tokens per block: the keys are first split into bf16 hi/lo tiles
    /// ([`Gpu::indexer_keys_split`], 32 KB per 64 keys, a temporary), then each warpgroup multiplies
    /// its token's 64 heads (queries in registers) with each key tile copied by cp.async.bulk into a
    /// 4-stage ring — per score the same three products per 16 dims in the same order as
    /// `indexer_scores_tc` — and selects as `indexer_topk_stream` on its own buffer. Arguments and
    /// lists as [`Gpu::indexer_topk_stream`]; gpu-check compares the lists with `indexer_scores_tc` +
    /// [`Gpu::indexer_topk`] and the scores ([`Gpu::indexer_scores_wgmma`]) with both score kernels.
    ///
    /// Launch: grid `ceil(T/4)`, block 512, dynamic shared memory [`INDEXER_WGMMA_SMEM`].
    ///
    /// Errors: as [`Gpu::indexer_topk_stream`]; [`CudaError::Unsupported`] on a device other than
    /// sm_90a.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_topk_wgmma(
        &self,
        q: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        shape: &IndexerShape,
        k: usize,
    ) -> Result<(), CudaError> {
        const W: &str = "indexer_topk_wgmma";
        ensure(W, self.arch == "sm_90a", || format!("needs sm_90a (wgmma), the device is {}", self.arch))?;
        check_queries_keys(W, q, keys, shape)?;
        let Some(mut l) = stream_topk_launch(W, shape, k, weights, offsets, idx)? else { return Ok(()) };
        let kt = self.indexer_keys_split(keys, shape.n_entries)?;
        l.cfg = wgmma_indexer_cfg(shape.tokens);
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(q).arg(&kt).arg(weights).arg(offsets).arg(idx);
        l.push(&mut b);
        let cfg = l.cfg;
        // SAFETY: matches indexer_topk_wgmma; kt holds ceil(N/64) tiles (every tile the kernel
        // reads: up to the largest visible count ≤ N); other sizes checked above; the kernel gets
        // its dynamic shared memory (it traps on less).
        launched(W, unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// The scores of [`Gpu::indexer_topk_wgmma`] into `scores` `[T, N]` (−inf past the visible
    /// entries), as [`Gpu::indexer_scores`]: for gpu-check's comparison with `indexer_scores_f32`
    /// (NMSE) and `indexer_scores_tc` (bits). 64 heads of 128, sm_90a.
    ///
    /// Launch: grid `ceil(T/4)`, block 512, dynamic shared memory [`INDEXER_WGMMA_SMEM`].
    ///
    /// Errors: [`CudaError::Unsupported`] for another shape or device, zero ratio, short buffers,
    /// or sizes beyond i32.
    pub fn indexer_scores_wgmma(&self, q: &CudaSlice<f32>, keys: &CudaSlice<f32>, weights: &CudaSlice<f32>, scores: &mut CudaSlice<f32>, shape: &IndexerShape) -> Result<(), CudaError> {
        const W: &str = "indexer_scores_wgmma";
        ensure(W, self.arch == "sm_90a", || format!("needs sm_90a (wgmma), the device is {}", self.arch))?;
        ensure(W, shape.heads == 64 && shape.head_dim == 128, || format!("needs 64 heads of 128, got {} of {}", shape.heads, shape.head_dim))?;
        let Some(ScoresArgs { ints: [h_i, hd_i, n_i, r_i, p_i], scale }) = scores_args(W, q, keys, weights, scores, shape)? else { return Ok(()) };
        let (tokens, n) = (shape.tokens, shape.n_entries);
        int(W, "T·N", tokens * n)?;
        let t_i = int(W, "tokens", tokens)?;
        let kt = self.indexer_keys_split(keys, n)?;
        let cfg = wgmma_indexer_cfg(tokens);
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(q).arg(&kt).arg(weights).arg(scores).arg(&h_i).arg(&hd_i).arg(&n_i).arg(&r_i).arg(&p_i).arg(&scale).arg(&t_i);
        // SAFETY: matches indexer_scores_wgmma; sizes checked above; kt from indexer_keys_split for
        // these N keys; the kernel gets its dynamic shared memory (it traps on less).
        launched(W, unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// `INDEXER_FP8` (issue 6 §3): [`Gpu::indexer_topk_stream`] on FP8 scores. `q8`: the index
    /// queries `[T·64, 128]` through [`Gpu::act_quant`] (e4m3, one power-of-two scale per head
    /// row); `k8`: the keys `[N, 128]` likewise (one scale per key); score = `hd^−1/2 · s_k ·
    /// Σ_h (w_h·s_q,h)·max(q8_h·k8, 0)` with one FP8 tensor-core product per 16 heads × 8 keys × 32
    /// dims. Not exact: the selection agrees with the exact one where scores are separated by more
    /// than the e4m3 rounding (gpu-check reports the agreement; qualify the logits NMSE).
    ///
    /// Launch: as [`Gpu::indexer_topk_stream`].
    ///
    /// Errors: as [`Gpu::indexer_topk_stream`], plus quantized buffers of the wrong shape.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_topk_stream_fp8(
        &self,
        q8: &super::ops_q8::QuantizedActs,
        k8: &super::ops_q8::QuantizedActs,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        shape: &IndexerShape,
        k: usize,
    ) -> Result<(), CudaError> {
        const W: &str = "indexer_topk_stream_fp8";
        check_fp8_operands(W, q8, k8, shape, false)?;
        let Some(l) = stream_topk_launch(W, shape, k, weights, offsets, idx)? else { return Ok(()) };
        self.launch_fp8_topk(W, q8, k8, weights, offsets, idx, &l)
    }

    /// Launches FP8 selection kernel `name` (`indexer_topk_stream_fp8` or `indexer_topk_wgmma_fp8`)
    /// with the arguments both take — q8, its scales, k8, its scales, weights, offsets, idx, then
    /// `l`'s trailing ones — on `l.cfg`. The caller checked every buffer for that kernel
    /// ([`check_fp8_operands`], [`stream_topk_launch`]).
    #[allow(clippy::too_many_arguments)]
    fn launch_fp8_topk(
        &self,
        name: &'static str,
        q8: &super::ops_q8::QuantizedActs,
        k8: &super::ops_q8::QuantizedActs,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        l: &StreamTopkLaunch,
    ) -> Result<(), CudaError> {
        let mut b = self.stream.launch_builder(self.f(name));
        b.arg(&q8.q).arg(&q8.sa).arg(&k8.q).arg(&k8.sa).arg(weights).arg(offsets).arg(idx);
        l.push(&mut b);
        // SAFETY: matches both kernels' signature; the quantized buffers hold ≥ T·64 query rows and
        // the keys' rows (≥ N, tiled: ≥ ceil(N/64)·64, every tile the wgmma kernel reads) of 128
        // bytes with one scale each, other sizes checked by stream_topk_launch (the callers' checks);
        // the kernel gets its dynamic shared memory (it traps on less).
        launched(name, unsafe { b.launch(l.cfg) }.map(|_| ()))
    }

    /// `INDEXER_FP8` with `INDEXER_WGMMA` (sm_90a): [`Gpu::indexer_topk_stream_fp8`]'s scores and
    /// selection in [`Gpu::indexer_topk_wgmma`]'s pipeline — four tokens per block, key tiles by
    /// cp.async.bulk, one wgmma m64n64k32 e4m3 per 32 dims (4 per 64-key tile instead of 24
    /// split-bf16 m64n64k16). `q8`: the index queries through [`Gpu::act_quant`]; `k8t`: the keys
    /// through [`Gpu::act_quant_layout`] with `tiled` (64-key tiles of 8 KB, the layout the kernel
    /// copies as is). Not exact (FP8 scores); gpu-check holds its lists to the selection rule on the
    /// CPU's f64 scores of the quantized values and its scores
    /// ([`Gpu::indexer_scores_wgmma_fp8`]) to those scores.
    ///
    /// Launch: as [`Gpu::indexer_topk_wgmma`].
    ///
    /// Errors: as [`Gpu::indexer_topk_stream_fp8`]; untiled keys or tiled queries; a device other
    /// than sm_90a.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_topk_wgmma_fp8(
        &self,
        q8: &super::ops_q8::QuantizedActs,
        k8t: &super::ops_q8::QuantizedActs,
        weights: &CudaSlice<f32>,
        offsets: &CudaSlice<i32>,
        idx: &mut CudaSlice<i32>,
        shape: &IndexerShape,
        k: usize,
    ) -> Result<(), CudaError> {
        const W: &str = "indexer_topk_wgmma_fp8";
        ensure(W, self.arch == "sm_90a", || format!("needs sm_90a (wgmma), the device is {}", self.arch))?;
        check_fp8_operands(W, q8, k8t, shape, true)?;
        let Some(mut l) = stream_topk_launch(W, shape, k, weights, offsets, idx)? else { return Ok(()) };
        l.cfg = wgmma_indexer_cfg(shape.tokens);
        self.launch_fp8_topk(W, q8, k8t, weights, offsets, idx, &l)
    }

    /// The scores of [`Gpu::indexer_topk_wgmma_fp8`] into `scores` `[T, N]` (−inf past the visible
    /// entries), for gpu-check's comparison with the CPU's scores of the quantized values.
    /// Arguments as [`Gpu::indexer_topk_wgmma_fp8`].
    ///
    /// Launch: as [`Gpu::indexer_scores_wgmma`].
    ///
    /// Errors: as [`Gpu::indexer_topk_wgmma_fp8`]; short weights or scores.
    pub fn indexer_scores_wgmma_fp8(&self, q8: &super::ops_q8::QuantizedActs, k8t: &super::ops_q8::QuantizedActs, weights: &CudaSlice<f32>, scores: &mut CudaSlice<f32>, shape: &IndexerShape) -> Result<(), CudaError> {
        const W: &str = "indexer_scores_wgmma_fp8";
        ensure(W, self.arch == "sm_90a", || format!("needs sm_90a (wgmma), the device is {}", self.arch))?;
        ensure(W, shape.heads == 64 && shape.head_dim == 128, || format!("needs 64 heads of 128, got {} of {}", shape.heads, shape.head_dim))?;
        let (tokens, n) = (shape.tokens, shape.n_entries);
        if tokens == 0 || n == 0 {
            return Ok(());
        }
        check_fp8_operands(W, q8, k8t, shape, true)?;
        ensure(W, shape.ratio >= 1, || "ratio must be ≥ 1".into())?;
        ensure(W, weights.len() >= tokens * 64, || format!("weights hold {} values, need T·heads = {}", weights.len(), tokens * 64))?;
        ensure(W, scores.len() >= tokens * n, || format!("scores hold {} values, need T·N = {}", scores.len(), tokens * n))?;
        int(W, "T·N", tokens * n)?;
        let ScoresArgs { ints: [h_i, hd_i, n_i, r_i, p_i], scale } = ScoresArgs::new(W, shape)?;
        let t_i = int(W, "tokens", tokens)?;
        let cfg = wgmma_indexer_cfg(tokens);
        let mut b = self.stream.launch_builder(self.f(W));
        b.arg(&q8.q).arg(&q8.sa).arg(&k8t.q).arg(&k8t.sa).arg(weights).arg(scores).arg(&h_i).arg(&hd_i).arg(&n_i).arg(&r_i).arg(&p_i).arg(&scale).arg(&t_i);
        // SAFETY: matches indexer_scores_wgmma_fp8; sizes checked above; the kernel gets its
        // dynamic shared memory (it traps on less).
        launched(W, unsafe { b.launch(cfg) }.map(|_| ()))
    }

    /// The mask path of `DIRECT_INDEXER_TOPK=off` (issue 6 §2): the `[T, n_entries]` byte mask of
    /// the indexer's lists (`offsets` `[T+1]`, `idx`: [`Gpu::indexer_topk`]'s output), 1 where
    /// entry e is in query t's list, else 0. Allocates the mask (T·n_entries bytes, zeroed).
    ///
    /// Launch: grid `T`, block 256.
    ///
    /// Errors: [`CudaError::Unsupported`] for short offsets, more than i32 entries; driver errors.
    pub fn topk_mask(&self, offsets: &CudaSlice<i32>, idx: &CudaSlice<i32>, tokens: usize, n_entries: usize) -> Result<DevBuf<u8>, CudaError> {
        const W: &str = "topk_mask";
        ensure(W, offsets.len() > tokens, || format!("offsets hold {} values, need T+1 = {}", offsets.len(), tokens + 1))?;
        let n_i = int(W, "n_entries", n_entries)?;
        let mut mask = self.zeros::<u8>((tokens * n_entries).max(1))?;
        if tokens == 0 || n_entries == 0 {
            return Ok(mask);
        }
        let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.f("indexer_topk_mask_u8"));
        b.arg(offsets).arg(idx).arg(&mut mask).arg(&n_i);
        // SAFETY: matches indexer_topk_mask_u8; the mask holds T·n bytes; the kernel bounds every
        // index by n and reads idx within the caller's CSR lists (indexer_topk's output).
        launched("indexer_topk_mask_u8", unsafe { b.launch(cfg) }.map(|_| ()))?;
        Ok(mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_lists() {
        // HCA ratio 4, 3 entries exist: positions 2..6 see (p+1)/4 capped at 3.
        let (off, idx) = hca_candidates(2, 5, 4, 3).unwrap();
        assert_eq!(off, vec![0, 0, 1, 2, 3, 4]);
        assert_eq!(idx, vec![0, 0, 0, 0]);
        let (off, idx) = hca_candidates(10, 2, 4, 3).unwrap();
        assert_eq!(off, vec![0, 2, 5]);
        assert_eq!(idx, vec![0, 1, 0, 1, 2]);
        assert_eq!(hca_offsets(10, 2, 4, 3).unwrap(), off);
        assert_eq!(topk_offsets(10, 2, 4, 3, 2).unwrap(), vec![0, 2, 4]);
        assert_eq!(visible_entries(127, 128, 10), 1);
        assert_eq!(visible_entries(126, 128, 10), 0);
    }

    /// `INDEXER_TC_DECODE_TILES`' rule: prefill chunks keep 512 keys per block; decode steps get a
    /// multiple of 64 (at least 64) giving about 264 blocks; indexer.cu's constants and trap match.
    #[test]
    fn indexer_tc_keys_per_block_rule() {
        let src = include_str!("kernels/indexer.cu");
        assert!(src.contains(&format!("#define ITC_KB {ITC_KEYS_PER_BLOCK} ")));
        assert!(src.contains("#define ITC_KT 64 "));
        assert!(src.contains("if (heads != 64 || hd != 128 || kb < ITC_KT || kb > ITC_KB || kb % ITC_KT != 0) __trap();"));
        // Prefill: 2,048 tokens over 512 entries (1,024 pairs) or 8,192 over 2,048.
        assert_eq!(indexer_tc_keys_per_block(2048, 512), 512);
        assert_eq!(indexer_tc_keys_per_block(8192, 2048), 512);
        // Decode at 8K (2,048 entries): 64 keys, 32 blocks; at 128K (32,768): 128 keys, 256 blocks.
        assert_eq!(indexer_tc_keys_per_block(1, 2048), 64);
        assert_eq!(indexer_tc_keys_per_block(1, 32768), 128);
        assert_eq!(indexer_tc_keys_per_block(1, 200_000), 512);
        for (t, n) in [(1usize, 1usize), (1, 0), (3, 5000), (63, 2048), (2, 135_168)] {
            let kb = indexer_tc_keys_per_block(t, n);
            assert!((64..=ITC_KEYS_PER_BLOCK).contains(&kb) && kb.is_multiple_of(64), "{t} {n}: {kb}");
        }
    }
}

#[cfg(test)]
mod smem_tests {
    /// `ATTENTION_TC_SMEM` is the kernel's `ATC_SMEM` (recomputed from attention.cu's defines) and
    /// fits the 227 KB a Hopper block may use.
    #[test]
    fn streaming_attention_shared_memory_matches_the_kernel() {
        let src = include_str!("kernels/attention.cu");
        let def = |name: &str| define(src, name);
        let (h, tile, pitch) = (def("ATC_H"), def("ATC_TILE"), def("ATC_PITCH"));
        let smem = 2 * h * pitch * 2 + 2 * tile * pitch * 2 + 8 * 32 * 16 * 4 + tile * 8;
        assert_eq!(super::ATTENTION_TC_SMEM, smem);
        assert!(smem <= 227 * 1024);
    }

    /// The value of `#define NAME value` in kernel source `src` (panics when absent).
    fn define(src: &str, name: &str) -> usize {
        let line = src.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("{name} not defined"));
        line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: {line}"))
    }

    /// `ATTENTION_WG_SMEM` is `AwgLayout::TOTAL` (its fields recomputed from attention.cu's
    /// defines and the layout's own expressions) and the launcher's kernel table names the entry
    /// points in the order it indexes them (fast exp + 1, split output + 2).
    #[test]
    fn bf16_attention_shared_memory_matches_the_kernel() {
        let src = include_str!("kernels/attention.cu");
        let def = |name: &str| define(src, name);
        let (threads, stages) = (def("AWG_THREADS"), def("AWG_ST"));
        assert_eq!(threads, 384);
        for expr in [
            "Q = 0;",
            "STAGE = 32768;",
            "K = 65536;",
            "PART = K + AWG_ST * STAGE;",
            "VALID = PART + 2 * 2 * 128 * 16 * 4;",
            "ROWP = VALID + 16;",
            "BARS = ROWP + 2 * 32 * 8;",
            "TOTAL = BARS + 2 * AWG_ST * 8 + 1024;",
        ] {
            assert!(src.contains(&format!("static constexpr int {expr}")), "AwgLayout changed: {expr}");
        }
        let part = 65536 + stages * 32768;
        let total = part + 2 * 2 * 128 * 16 * 4 + 16 + 2 * 32 * 8 + 2 * stages * 8 + 1024;
        assert_eq!(super::ATTENTION_WG_SMEM, total);
        for (i, name) in super::ATTENTION_WG_KERNELS.iter().enumerate() {
            assert_eq!(name.contains("fast_exp"), i & 1 == 1, "{name}");
            assert_eq!(name.ends_with("_bf16_out"), i & 2 == 2, "{name}");
            assert!(super::ATTENTION_ENTRY_POINTS.contains(name), "{name}");
            assert!(src.contains(&format!("__launch_bounds__(AWG_THREADS, 1) {name}(AWG_ARGS)")), "{name}");
        }
    }

    /// `INDEXER_WGMMA_SMEM` is `IwgLayout::TOTAL` (its fields recomputed from indexer.cu's defines
    /// and the layout's own expressions); that it fits a block is a compile-time assertion.
    #[test]
    fn indexer_wgmma_shared_memory_matches_the_kernel() {
        let src = include_str!("kernels/indexer.cu");
        let def = |name: &str| define(src, name);
        let (nwg, tile, stages, cap, kt) = (def("IWG_NWG"), def("IWG_TILE"), def("IWG_STAGES"), def("ITS_CAP"), def("ITC_KT"));
        let stages8 = def("IWG8_STAGES");
        for expr in [
            "BKEY = RING + IWG_STAGES * IWG_TILE;",
            "BIDX = BKEY + IWG_NWG * ITS_CAP * 4;",
            "PART = BIDX + IWG_NWG * ITS_CAP * 4;",
            "HIST = PART + IWG_NWG * 4 * ITC_KT * 4;",
            "WSUM = HIST + IWG_NWG * 256 * 4;",
            "MISC = WSUM + IWG_NWG * 32 * 4;",
            "BARS = MISC + IWG_NWG * 8 * 4;",
            "TOTAL = 1024 + BARS + 2 * IWG8_STAGES * 8;",
        ] {
            assert!(src.contains(&format!("static constexpr int {expr}")), "IwgLayout changed ({expr}): update this test");
        }
        let bars = stages * tile + 2 * nwg * cap * 4 + nwg * 4 * kt * 4 + nwg * 256 * 4 + nwg * 32 * 4 + nwg * 8 * 4;
        assert_eq!(super::INDEXER_WGMMA_SMEM, 1024 + bars + 2 * stages8 * 8);
    }
}
