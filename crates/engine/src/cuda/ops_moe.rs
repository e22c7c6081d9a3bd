//! The grouped MoE for prefill (issue 6 §5; spec §4.11 exact numerics): routed (token, slot) pairs
//! grouped by expert on the device with a deterministic count / prefix-sum / stable fill
//! (`moe.cu` `moe_group_*`), one tensor-core launch for every expert's gate/up with the clamped
//! SwiGLU fused in its epilogue, one for every expert's down projection scattering rows back to
//! their (token, slot), then the shared expert and the slot combine (γ applied there in f64, in slot
//! order, exactly as the per-expert path does). No host synchronisation: the work queue of
//! non-empty expert tiles is built and read on the device (`gemm.cu` `moe_gemm_*` on mma.sync, or
//! `moe_wb_*` on Hopper's wgmma with `BF16_WGMMA`).
//!
//! Switches ([`crate::switches`]): `MOE_GROUPED` (this path at all), `MOE_FUSED_SWIGLU` (off: two
//! plain grouped GEMMs for gate and up, the SwiGLU kernel and a bf16 conversion), `MOE_ADAPTIVE_TILES`
//! (64-row tiles when experts see few tokens; off: always 128), `MOE_PERSISTENT` (a grid of a few
//! blocks per SM walking the queue; off: one block per work unit), `MOE_BF16_WS` (FP4 experts, split
//! activations, 128-row tiles: the warp-specialised `moe_wbs_*`; off: `moe_wb_*`). The activations
//! are split (hi + lo bf16) unless `TC_LINEAR=bf16` (then plain bf16, inexact).
//!
//! Design learned from the grouped-GEMM idea in DeepSeek's DeepGEMM and from lucebox's adaptive
//! MoE tiles (`../shared/research/`); the code is ours.

use super::drv;
use super::graph::DevBuf;
use super::gpu::{gemm_smem_for, wb_smem, Gpu, GpuMatrix, GpuWeight, GEMM_ENTRY_POINTS, GEMM_WB_ENTRY_POINTS};
use super::ops_mhc::{GpuExpert, GpuMoeLayer, SlotOut};
use super::CudaError;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use flashseek_model::config::Ds4Config;

/// Output columns per block of the mma.sync grouped GEMM (`BN` of `MOE_GEMM_ENTRY` in gemm.cu; the
/// wgmma ones: [`moe_gemm_entry_bn`]).
pub const MOE_GEMM_BN: usize = 128;
/// Threads of `moe_group_plan` (`MOE_PLAN_THREADS` in moe.cu): the most experts the grouping handles.
pub const MOE_GROUP_MAX_EXPERTS: usize = 1024;
/// Average tokens per expert below which adaptive tiles pick 64-row tiles.
pub const MOE_ADAPTIVE_THRESHOLD: usize = 96;

fn bad(detail: impl Into<String>) -> CudaError {
    CudaError::Unsupported { what: "grouped moe", detail: detail.into() }
}

/// The grouped GEMM entry points of gemm.cu: mma.sync `moe_gemm_<fmt>_<bm>[_x2]_<epi>`, wgmma
/// `moe_wb_<fmt>_<bm>[_x2]_<epi>` (switch `BF16_WGMMA`; the program `gemm_wb.cu`) and the
/// warp-specialised `moe_wbs_fp4_128_x2_<epi>` (switch `MOE_BF16_WS`, same program).
pub fn moe_gemm_entry_points() -> impl Iterator<Item = &'static str> {
    GEMM_ENTRY_POINTS.iter().chain(GEMM_WB_ENTRY_POINTS).copied().filter(|n| n.starts_with("moe_gemm_") || n.starts_with("moe_wb_") || n.starts_with("moe_wbs_"))
}

/// Threads per block of the warp-specialised `moe_wbs_*` kernels: two multiply warpgroups and one
/// producer warpgroup (`GBS_THREADS` in gemm.cu).
pub const WBS_THREADS: u32 = 384;

/// Dynamic shared memory of a `moe_wbs_*` block (`GbsLayout` in gemm.cu): 1 KB of alignment slack,
/// 3 stages of 73,728 bytes (activation planes hi and lo 128 × 64 bf16, converted weights 256 × 64
/// bf16, packed FP4 weights 256 × 32 bytes) and a full and an empty barrier (8 bytes each) per stage.
pub const WBS_SMEM: usize = 1024 + 3 * 73_728 + 2 * 3 * 8;

/// The grouped GEMM family for a launch that [`Gpu::bf16_wgmma`] allows on wgmma (`wgmma`):
/// `moe_wbs` (switch `MOE_BF16_WS`, on by default) for FP4 experts with split activations and
/// 128-row tiles, else `moe_wb`; without wgmma `moe_gemm`.
pub fn moe_gemm_family(wgmma: bool, format: &str, bm: usize, split: bool) -> &'static str {
    if !wgmma {
        "moe_gemm"
    } else if format == "fp4" && split && bm == 128 && crate::switches::on("MOE_BF16_WS") {
        "moe_wbs"
    } else {
        "moe_wb"
    }
}

/// `(format, tile rows, split)` of a grouped GEMM entry point name (any family).
pub fn moe_gemm_entry_shape(name: &str) -> (&'static str, usize, bool) {
    let fmt = ["bf16", "fp8", "fp4"].into_iter().find(|f| ["moe_gemm", "moe_wb", "moe_wbs"].iter().any(|fam| name.starts_with(&format!("{fam}_{f}_")))).unwrap_or("fp4");
    let bm = if name.contains("_64_") { 64 } else { 128 };
    (fmt, bm, name.contains("_x2_"))
}

/// Output columns per block of a grouped GEMM entry point: [`MOE_GEMM_BN`] for mma.sync, twice the
/// tile height for wgmma (`moe_wb_<fmt>_<bm>_*`: 64 × 128 and 128 × 256, `BM * 2` in gemm.cu;
/// `moe_wbs_*`: 128 × 256).
pub fn moe_gemm_entry_bn(name: &str) -> usize {
    let (_, bm, _) = moe_gemm_entry_shape(name);
    if name.starts_with("moe_wb_") || name.starts_with("moe_wbs_") {
        2 * bm
    } else {
        MOE_GEMM_BN
    }
}

/// Dynamic shared memory of a grouped GEMM entry point (by name; any family).
pub fn moe_gemm_entry_smem(name: &str) -> usize {
    let (fmt, bm, split) = moe_gemm_entry_shape(name);
    if name.starts_with("moe_wbs_") {
        WBS_SMEM
    } else if name.starts_with("moe_wb_") {
        wb_smem(fmt, bm, moe_gemm_entry_bn(name), split)
    } else {
        gemm_smem_for(fmt, bm, MOE_GEMM_BN, split)
    }
}

/// How the grouped MoE runs (the `MOE_*` switches; [`MoeOptions::from_switches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeOptions {
    /// `MOE_GROUPED`: use the grouped path where the layer allows it.
    pub grouped: bool,
    /// `MOE_FUSED_SWIGLU`: gate/up and SwiGLU in one launch.
    pub fused_swiglu: bool,
    /// `MOE_ADAPTIVE_TILES`: tile height from tokens per expert.
    pub adaptive_tiles: bool,
    /// `MOE_PERSISTENT`: persistent grid over the tile queue.
    pub persistent: bool,
    /// Forces the tile height (64 or 128; checks use it to cover both tiles on one routing; 256
    /// where the FP8 path can take `moe_wt`'s 256-row tiles, [`super::ops_q8::wt_tiles`], else 128).
    pub force_tile_rows: Option<usize>,
    /// Caps the grid at this many blocks (checks use it so that every block walks several work
    /// units; the result is the same bits for any grid).
    pub max_blocks: Option<usize>,
    /// `MOE_DECODE_GEMV`: calls of at most this many routed pairs (token × top-k) over FP4 experts
    /// (official numerics, or the exact split ones) run [`Gpu::moe_experts_gemv`] (one gemv per pair, no grouping) instead of
    /// the grouped GEMMs; `None` = never. [`MOE_GEMV_MAX_PAIRS`] with the switch on.
    pub decode_gemv: Option<usize>,
    /// Forces how many warps split each 16-row tile's groups in `MOE_GEMV_MMA`'s gemvs (1 or 4;
    /// checks use it to cover and time both); `None` = [`gemv_mma_ksplit`]'s rule.
    pub gemv_ksplit: Option<usize>,
}

/// Most routed pairs (tokens × top-k) [`Gpu::moe_experts_gemv`] takes under `MOE_DECODE_GEMV`:
/// 32 tokens of top-6. Each pair reads its expert's weights on its own, so the grouped GEMMs (each
/// expert's weights once) win once experts repeat across many pairs. Measured on the H200 (one Flash
/// MoE layer, official numerics, gpu-check `time moe layer T=… gemv …` at a56dd29,
/// `bench/moe_decode_gemv_h200.log`): gemv against grouped 0.12 / 0.21 ms at T = 1, 0.83 / 1.07 at 8,
/// 1.59 / 1.82 at 16, 3.12 / 3.29 at 32, 2.90 / 2.30 at 64.
pub const MOE_GEMV_MAX_PAIRS: usize = 192;

impl MoeOptions {
    /// The options the switches give for this process.
    pub fn from_switches() -> Self {
        use crate::switches::on;
        MoeOptions {
            grouped: on("MOE_GROUPED"),
            fused_swiglu: on("MOE_FUSED_SWIGLU"),
            adaptive_tiles: on("MOE_ADAPTIVE_TILES"),
            persistent: on("MOE_PERSISTENT"),
            force_tile_rows: None,
            max_blocks: None,
            decode_gemv: on("MOE_DECODE_GEMV").then_some(MOE_GEMV_MAX_PAIRS),
            gemv_ksplit: None,
        }
    }

    /// Every optimisation on (the defaults).
    pub const ALL_ON: MoeOptions = MoeOptions { grouped: true, fused_swiglu: true, adaptive_tiles: true, persistent: true, force_tile_rows: None, max_blocks: None, decode_gemv: Some(MOE_GEMV_MAX_PAIRS), gemv_ksplit: None };

    /// Tile height for `tk` routed pairs over `e` experts with split (`split`) or bf16 activations,
    /// on the wgmma kernels (`wgmma`) or mma.sync ones. Adaptive: 64-row tiles when the average
    /// tokens per expert is below [`MOE_ADAPTIVE_THRESHOLD`], and always with split activations on
    /// mma.sync (whose two planes make its 128-row tile's shared memory and registers limit it to
    /// one block per SM). Measured on H200, Flash shapes, 256 FP4 experts, mma.sync
    /// (`bench/moe_grouped_h200.json`): T = 2048 (48 tokens per expert) 9.0 ms with 64 rows vs
    /// 17.3 ms with 128; T = 8192 (192 per expert) split 29.9 vs 35.6 ms, bf16 26.3 vs 25.3 ms.
    pub fn tile_rows(&self, tk: usize, e: usize, split: bool, wgmma: bool) -> usize {
        if let Some(bm) = self.force_tile_rows {
            return if bm <= 64 { 64 } else { 128 };
        }
        if self.adaptive_tiles && ((split && !wgmma) || tk < MOE_ADAPTIVE_THRESHOLD * e.max(1)) {
            64
        } else {
            128
        }
    }
}

/// Per-expert device addresses of a layer's routed experts, for the grouped GEMM: every expert in
/// one format (bf16, FP8 or FP4) with the same shapes.
pub struct GpuExpertTables {
    /// Weight format name (`bf16`, `fp8`, `fp4`).
    pub format: &'static str,
    /// Hidden units per expert (`moe_intermediate_size`).
    pub inter: usize,
    /// Model width.
    pub d: usize,
    /// Whether the FP8-activation kernels (gemm_q8.cu) can run every expert exactly
    /// ([`super::ops_q8::q8_capable`] for all of w1, w3, w2).
    pub q8: bool,
    /// FP4 experts under [`Self::q8`]: the largest group scale byte of every 128 × 128 block of
    /// w1, w3 and w2 (gemm_q8.cu `fp4_block_smax`, `[E][ceil(rows/128)][cols/128]` each) when every
    /// group scale of every block lies within 8 binades of it (the `moe_wt` kernels' exactness
    /// condition), else `None`.
    pub(crate) block_smax: Option<[CudaSlice<u8>; 3]>,
    /// Whether every FP4 weight address is a multiple of 16 bytes and every scale address of 8
    /// (the 32- and 64-bit loads of moe.cu `moe_gemv_fp4_mma_*`, switch `MOE_GEMV_MMA`).
    pub(crate) gemv_mma_aligned: bool,
    w1: CudaSlice<u64>,
    s1: CudaSlice<u64>,
    w3: CudaSlice<u64>,
    s3: CudaSlice<u64>,
    w2: CudaSlice<u64>,
    s2: CudaSlice<u64>,
}

/// Address of a weight's values and of its scales (0 for bf16).
fn addresses(gpu: &Gpu, w: &GpuWeight) -> Option<(&'static str, u64, u64)> {
    let s = &gpu.stream;
    match &w.data {
        GpuMatrix::Bf16(m) => Some(("bf16", m.device_ptr(s).0, 0)),
        GpuMatrix::Fp8 { w, scales } => Some(("fp8", w.device_ptr(s).0, scales.device_ptr(s).0)),
        GpuMatrix::Fp4 { w, scales, .. } => Some(("fp4", w.device_ptr(s).0, scales.device_ptr(s).0)),
        GpuMatrix::F32(_) => None,
    }
}

impl GpuExpertTables {
    /// Builds the tables, or `Ok(None)` when the experts cannot run grouped: f32 weights (the
    /// tensor-core path would round them), mixed formats or shapes, widths not multiples of 32, or
    /// more than [`MOE_GROUP_MAX_EXPERTS`] experts.
    pub fn build(gpu: &Gpu, experts: &[GpuExpert]) -> Result<Option<Self>, CudaError> {
        let Some(first) = experts.first() else { return Ok(None) };
        let (inter, d) = (first.w1.rows, first.w1.cols);
        if experts.len() > MOE_GROUP_MAX_EXPERTS || inter == 0 || d == 0 || !inter.is_multiple_of(32) || !d.is_multiple_of(32) {
            return Ok(None);
        }
        let mut fmt = None;
        let mut t: [Vec<u64>; 6] = Default::default();
        for ex in experts {
            if ex.w1.rows != inter || ex.w1.cols != d || ex.w3.rows != inter || ex.w3.cols != d || ex.w2.rows != d || ex.w2.cols != inter {
                return Ok(None);
            }
            for (i, w) in [&ex.w1, &ex.w3, &ex.w2].into_iter().enumerate() {
                let Some((f, a, s)) = addresses(gpu, w) else { return Ok(None) };
                if *fmt.get_or_insert(f) != f {
                    return Ok(None);
                }
                t[2 * i].push(a);
                t[2 * i + 1].push(s);
            }
        }
        let [w1, s1, w3, s3, w2, s2] = t;
        let gemv_mma_aligned = [&w1, &w3, &w2].iter().all(|v| v.iter().all(|a| a % 16 == 0)) && [&s1, &s3, &s2].iter().all(|v| v.iter().all(|a| a % 8 == 0));
        let q8 = experts.iter().all(|ex| [&ex.w1, &ex.w3, &ex.w2].into_iter().all(super::ops_q8::q8_capable));
        let format = fmt.unwrap_or("bf16");
        let (s1, s3, s2) = (gpu.upload(&s1)?, gpu.upload(&s3)?, gpu.upload(&s2)?);
        let block_smax = if format == "fp4" && q8 { Self::build_block_smax(gpu, experts.len(), [(&s1, inter, d), (&s3, inter, d), (&s2, d, inter)])? } else { None };
        Ok(Some(GpuExpertTables { format, inter, d, q8, block_smax, gemv_mma_aligned, w1: gpu.upload(&w1)?, s1, w3: gpu.upload(&w3)?, s3, w2: gpu.upload(&w2)?, s2 }))
    }

    /// The block scale tables of [`Self::block_smax`] for FP4 matrices given as (scale address
    /// table `[E]`, rows, cols; cols a multiple of 128), or `None` when some block's group scales
    /// span more than 8 binades (or hold a NaN byte). Synchronises once (reads the verdict).
    fn build_block_smax(gpu: &Gpu, e: usize, mats: [(&CudaSlice<u64>, usize, usize); 3]) -> Result<Option<[CudaSlice<u8>; 3]>, CudaError> {
        let mut flag = gpu.zeros_owned::<i32>(1)?;
        let mut outs = Vec::with_capacity(3);
        for (stab, rows, cols) in mats {
            let (nb, kb) = (rows.div_ceil(128), cols / 128);
            let mut out = gpu.zeros_owned::<u8>((e * nb * kb).max(1))?;
            let (n_i, k_i) = (i32::try_from(rows).map_err(|_| bad(format!("{rows} rows")))?, i32::try_from(cols).map_err(|_| bad(format!("{cols} columns")))?);
            let cfg = LaunchConfig { grid_dim: (e as u32, nb as u32, 1), block_dim: (kb.clamp(32, 128) as u32, 1, 1), shared_mem_bytes: 0 };
            let mut b = gpu.stream.launch_builder(gpu.f("fp4_block_smax"));
            b.arg(stab).arg(&n_i).arg(&k_i).arg(&mut out).arg(&mut flag);
            // SAFETY: fp4_block_smax(stab [E] addresses of [rows, cols/32] scale bytes (the experts'
            // uploaded FP4 scales, checked by build), N = rows, K = cols (a multiple of 128: q8),
            // out [E·ceil(rows/128)·cols/128], bad [1]); grid (E, ceil(rows/128)).
            drv("fp4_block_smax", unsafe { b.launch(cfg) })?;
            outs.push(out);
        }
        if gpu.download(&flag)?.first() != Some(&0) {
            return Ok(None);
        }
        Ok(outs.try_into().ok())
    }
}

/// Pairs per chunk of `moe_group_scan` (`MOE_GROUP_CHUNK` in moe.cu).
pub const MOE_GROUP_CHUNK: usize = 1024;

/// A grouping of routed pairs by expert as host arrays (moe.cu's grouping kernels, or
/// [`group_reference`]): offsets `[E + 1]` (row of each expert's first tile; `[E]` = rows R), items
/// `[n][2]` (expert, first row of the tile), row_tok / row_dst `[R]` (token and pair index of each
/// grouped row, −1 for padding rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupArrays {
    pub offsets: Vec<i32>,
    pub items: Vec<i32>,
    pub row_tok: Vec<i32>,
    pub row_dst: Vec<i32>,
}

/// The grouping moe.cu computes, on the host: the `experts.len()` pairs (i = token·k + slot) of
/// experts `0 … e − 1` in tiles of `bm` rows, each expert's pairs in pair order, its rows padded to a
/// multiple of `bm`; ids outside `0 … e − 1` belong to no expert.
pub fn group_reference(experts: &[i32], k: usize, e: usize, bm: usize) -> GroupArrays {
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); e];
    for (i, &x) in experts.iter().enumerate() {
        if x >= 0 && (x as usize) < e {
            members[x as usize].push(i);
        }
    }
    let (mut offsets, mut items, mut row_tok, mut row_dst) = (Vec::with_capacity(e + 1), Vec::new(), Vec::new(), Vec::new());
    for (ex, m) in members.iter().enumerate() {
        let row0 = row_tok.len();
        offsets.push(row0 as i32);
        let padded = m.len().div_ceil(bm) * bm;
        for j in 0..m.len().div_ceil(bm) {
            items.extend([ex as i32, (row0 + j * bm) as i32]);
        }
        for r in 0..padded {
            let (tok, dst) = m.get(r).map_or((-1, -1), |&i| ((i / k) as i32, i as i32));
            row_tok.push(tok);
            row_dst.push(dst);
        }
    }
    offsets.push(row_tok.len() as i32);
    GroupArrays { offsets, items, row_tok, row_dst }
}

/// What [`Gpu::act_quant_grouped_pair`] downloads: e4m3 bytes and scales of both quantisations.
pub(crate) struct GroupedQuantPair {
    /// Rows of capacity (both quantisations' row count).
    pub r_cap: usize,
    /// The grouped row count R.
    pub rows: usize,
    /// The grouping's row_dst `[r_cap]` (−1: padding row; rows ≥ R: 0, never read).
    pub row_dst: Vec<i32>,
    /// Every row quantized ([`Gpu::act_quant_layout`]): (q, sa).
    pub full: (Vec<u8>, Vec<f32>),
    /// [`Gpu::act_quant_grouped_into`] over 0xFF bytes and NaN scales: (q, sa), defined on the
    /// rows a tile reads, the fill elsewhere.
    pub grouped: (Vec<u8>, Vec<f32>),
}

/// The device buffers of one grouped MoE call (sized from upper bounds known on the host).
pub(crate) struct Grouping {
    bm: usize,
    /// Rows of capacity (≥ the grouped rows R), a multiple of 128.
    r_cap: usize,
    max_items: usize,
    offsets: DevBuf<i32>,
    items: DevBuf<i32>,
    n_items: DevBuf<i32>,
    row_tok: DevBuf<i32>,
    row_dst: DevBuf<i32>,
}

impl Grouping {
    /// The rows of the grouped buffers a down projection reads, for [`Gpu::act_quant_grouped`]:
    /// below the grouped count R (`offsets[E]`, the last offset) and, with `tiled` (`moe_wt`'s
    /// 256-row tiles), not in a 64-row sub-tile of padding alone (by `row_dst`).
    fn quantized_rows(&self, tiled: bool) -> super::ops_q8::GroupedRows<'_> {
        let e = self.offsets.len() - 1;
        super::ops_q8::GroupedRows { rows: self.offsets.slice(e..), live: tiled.then(|| self.row_dst.slice(..)) }
    }
}

impl Gpu {
    /// The layer's expert tables, built on first use (None: the layer cannot run grouped).
    pub fn moe_tables<'a>(&self, layer: &'a GpuMoeLayer) -> Result<Option<&'a GpuExpertTables>, CudaError> {
        if layer.tables.get().is_none() {
            let t = GpuExpertTables::build(self, &layer.experts)?;
            let _ = layer.tables.set(t);
        }
        Ok(layer.tables.get().and_then(Option::as_ref))
    }

    /// Whether [`Gpu::moe_experts_grouped_q8`] runs `tk` routed pairs over `e` experts with
    /// `tables` on the 256-row `moe_wt` kernels with `opts` ([`super::ops_q8::wt_tiles`] on this
    /// device).
    pub(crate) fn moe_wt_runs(&self, tables: &GpuExpertTables, tk: usize, e: usize, opts: MoeOptions) -> bool {
        super::ops_q8::wt_tiles(tables.format, tables.block_smax.is_some(), super::ops_q8::families_for(&self.arch).1, self.moe_wt_ok, opts.force_tile_rows, opts.adaptive_tiles, tk, e)
    }

    /// Scan, plan and fill (moe.cu `moe_group_scan` / `moe_group_plan`): groups the `tk` pairs of
    /// `experts` (device, `[tk]`) by expert in tiles of `bm` rows.
    ///
    /// Errors: no pairs, no experts or more than [`MOE_GROUP_MAX_EXPERTS`], top-k or tile 0, fewer
    /// than `tk` ids, sizes past 32 bits, launch failures.
    pub(crate) fn moe_group(&self, experts: &CudaSlice<i32>, tk: usize, k: usize, e: usize, bm: usize) -> Result<Grouping, CudaError> {
        if tk == 0 || e == 0 || e > MOE_GROUP_MAX_EXPERTS || k == 0 || bm == 0 || experts.len() < tk {
            return Err(bad(format!("grouping {tk} pairs ({} ids) of top-{k} over {e} experts (at most {MOE_GROUP_MAX_EXPERTS}) in tiles of {bm}", experts.len())));
        }
        let active = e.min(tk);
        let r_cap = (tk + active * (bm - 1)).div_ceil(128) * 128;
        let max_items = tk.div_ceil(bm) + active;
        let nch = tk.div_ceil(MOE_GROUP_CHUNK);
        let i32_of = |v: usize, what: &str| i32::try_from(v).map_err(|_| bad(format!("{what} = {v} exceeds 32 bits")));
        i32_of(r_cap * 2, "grouped rows")?;
        i32_of(nch * e, "chunk counts")?;
        let (tk_i, k_i, e_i, bm_i, nch_i) = (i32_of(tk, "pairs")?, i32_of(k, "top-k")?, i32_of(e, "experts")?, i32_of(bm, "tile")?, i32_of(nch, "chunks")?);
        // SAFETY: every element is written by the first scan (fill 0) before the plan reads it.
        let mut cc = unsafe { self.scratch::<i32>((nch * e).max(1)) }?;
        let mut offsets = self.zeros::<i32>(e + 1)?;
        let mut items = self.zeros::<i32>(2 * max_items)?;
        let mut n_items = self.zeros::<i32>(1)?;
        let mut row_tok = self.zeros::<i32>(r_cap)?;
        let mut row_dst = self.zeros::<i32>(r_cap)?;
        let s = &self.stream;
        let scan_cfg = LaunchConfig { grid_dim: (nch as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: (4 * e) as u32 };
        for fill in [0i32, 1] {
            let mut b = s.launch_builder(self.f("moe_group_scan"));
            b.arg(experts).arg(&tk_i).arg(&k_i).arg(&e_i).arg(&mut cc).arg(&mut row_tok).arg(&mut row_dst).arg(&fill);
            // SAFETY: moe_group_scan(experts [tk], tk, k, E, cc [nch·E], row_tok [r_cap], row_dst [r_cap],
            // fill); grid nch, block 32, 4·E bytes of shared memory (E ≤ 1,024: 4 KB); with fill 1 cc holds
            // the chunks' first rows (moe_group_plan) and every row written is < R ≤ r_cap.
            drv("moe_group_scan", unsafe { b.launch(scan_cfg) })?;
            if fill == 0 {
                let mut b = s.launch_builder(self.f("moe_group_plan"));
                b.arg(&mut cc).arg(&nch_i).arg(&e_i).arg(&bm_i).arg(&mut offsets).arg(&mut items).arg(&mut n_items).arg(&mut row_tok).arg(&mut row_dst);
                // SAFETY: moe_group_plan(cc [nch·E], nch, E, bm, offsets [E+1], items [2·max_items], n_items [1],
                // row_tok, row_dst [r_cap]); Σ ceil(count/bm) ≤ max_items and Σ ceil(count/bm)·bm ≤ r_cap;
                // one block of MOE_PLAN_THREADS ≥ E.
                drv("moe_group_plan", unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (MOE_GROUP_MAX_EXPERTS as u32, 1, 1), shared_mem_bytes: 0 }) })?;
            }
        }
        Ok(Grouping { bm, r_cap, max_items, offsets, items, n_items, row_tok, row_dst })
    }

    /// [`Gpu::moe_group`] of host expert ids `experts` (`[tk]`, top-`k` pairs, `e` experts, tiles of
    /// `bm` rows), downloaded for gpu-check's comparison with [`group_reference`]: (offsets `[E + 1]`,
    /// items `[n_items][2]`, row_tok `[R]`, row_dst `[R]`).
    ///
    /// Errors: as `moe_group`, or a download.
    pub(crate) fn moe_group_download(&self, experts: &[i32], k: usize, e: usize, bm: usize) -> Result<GroupArrays, CudaError> {
        let dev = self.upload(experts)?;
        let g = self.moe_group(&dev, experts.len(), k, e, bm)?;
        let offsets = self.download(&g.offsets)?;
        let n = self.download(&g.n_items)?.first().copied().unwrap_or(0).max(0) as usize;
        let rows = offsets.last().copied().unwrap_or(0).max(0) as usize;
        let mut items = self.download(&g.items)?;
        items.truncate(2 * n);
        let mut row_tok = self.download(&g.row_tok)?;
        row_tok.truncate(rows);
        let mut row_dst = self.download(&g.row_dst)?;
        row_dst.truncate(rows);
        Ok(GroupArrays { offsets, items, row_tok, row_dst })
    }

    /// gpu-check support for [`Gpu::act_quant_grouped`]: groups the host ids `experts` (top-`k`,
    /// `e` experts, tiles of `bm`), quantizes `h(r_cap)` (`[r_cap, width]` f32, r_cap the grouping's
    /// capacity) both with [`Gpu::act_quant_layout`] over every row and with
    /// [`Gpu::act_quant_grouped_into`] (the sub-tile test with `tiled`, as the grouped MoE calls it)
    /// into buffers filled with 0xFF bytes (e4m3 NaN, which the quantizer never writes) and NaN
    /// scales first, and downloads both with the grouping's R and `row_dst` (`[r_cap]`).
    ///
    /// Errors: as `moe_group` and the quantizers, or a download.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn act_quant_grouped_pair(&self, experts: &[i32], k: usize, e: usize, bm: usize, width: usize, tiled: bool, h: impl FnOnce(usize) -> Vec<f32>) -> Result<GroupedQuantPair, CudaError> {
        let dev = self.upload(experts)?;
        let g = self.moe_group(&dev, experts.len(), k, e, bm)?;
        let dh = self.upload(&h(g.r_cap))?;
        let full = self.act_quant_layout(&dh, g.r_cap, width, tiled)?;
        let mut gq = self.upload(&vec![0xFFu8; full.q.len()])?;
        let mut gsa = self.upload(&vec![f32::NAN; full.sa.len()])?;
        self.act_quant_grouped_into(&dh, &mut gq, &mut gsa, g.r_cap, width, tiled, g.quantized_rows(tiled))?;
        let r = self.download(&g.offsets)?.last().copied().unwrap_or(0).max(0) as usize;
        Ok(GroupedQuantPair {
            r_cap: g.r_cap,
            rows: r,
            row_dst: self.download(&g.row_dst)?,
            full: (self.download(&full.q)?, self.download(&full.sa)?),
            grouped: (self.download(&gq)?, self.download(&gsa)?),
        })
    }

    /// The checks both grouped paths make: the layer's expert tables (with `q8`, ones the FP8
    /// kernels take), shapes against `cfg`, buffer lengths. Returns (tables, d, E, k).
    #[allow(clippy::too_many_arguments)]
    fn grouped_inputs<'a>(&self, cfg: &Ds4Config, layer: &'a GpuMoeLayer, f: &CudaSlice<f32>, t: usize, experts: &CudaSlice<i32>, weights: &CudaSlice<f32>, q8: bool) -> Result<(&'a GpuExpertTables, usize, usize, usize), CudaError> {
        let (d, e, k) = (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok);
        let tables = self.moe_tables(layer)?.filter(|tb| !q8 || tb.q8).ok_or_else(|| {
            bad(if q8 { "the routed experts are not all FP8 or foldable FP4 with widths multiple of 128" } else { "the routed experts are not all bf16/FP8/FP4 of one shape with widths multiple of 32" })
        })?;
        if t == 0 || k == 0 || layer.experts.len() != e || tables.d != d {
            return Err(bad(format!("{t} tokens, top-{k}, {} experts of width {} for config E = {e}, d = {d}", layer.experts.len(), tables.d)));
        }
        let tk = t * k;
        if experts.len() < tk || weights.len() < tk || f.len() < t * d {
            return Err(bad(format!("buffers of {} ids, {} weights, {} inputs for {t} tokens × top-{k}, d = {d}", experts.len(), weights.len(), f.len())));
        }
        Ok((tables, d, e, k))
    }

    /// Launch geometry of a grouped GEMM over `g`'s tile queue with `n` outputs (`bn` per block, 8
    /// warps for 128-row tiles, 4 for 64, 16 for the warp-specialised `moe_ws_*`, 12 for
    /// `moe_wbs_*` and `moe_wt_*`): one block per work unit, or with `opts.persistent` as many blocks as fit the
    /// SMs (they walk the queue); at most `opts.max_blocks` either way.
    fn moe_launch_config(&self, fname: &str, g: &Grouping, n: usize, bn: usize, smem: usize, opts: MoeOptions) -> Result<LaunchConfig, CudaError> {
        let threads = if fname.starts_with("moe_ws_") {
            super::ops_q8::WS_THREADS
        } else if fname.starts_with("moe_wt_") {
            super::ops_q8::WT_THREADS
        } else if fname.starts_with("moe_wbs_") {
            WBS_THREADS
        } else if g.bm == 128 {
            256
        } else {
            128
        };
        let units = g.max_items * n.div_ceil(bn);
        let blocks = if opts.persistent {
            let sms = self.sms;
            let per_sm = self.f(fname).occupancy_max_active_blocks_per_multiprocessor(threads, smem, None).unwrap_or(1).max(1) as usize;
            (sms * per_sm).min(units)
        } else {
            units
        };
        let blocks = opts.max_blocks.map_or(blocks, |m| blocks.min(m));
        Ok(LaunchConfig { grid_dim: (u32::try_from(blocks.max(1)).map_err(|_| bad("grid too large"))?, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem as u32 })
    }

    /// Launches one grouped GEMM: `moe_wb_<fmt>_<bm>[_x2]_<epi>` (or `moe_wbs_…`, see
    /// [`moe_gemm_family`]) where [`Gpu::bf16_wgmma`] allows it for this input width `k`, else
    /// `moe_gemm_<fmt>_<bm>[_x2]_<epi>`.
    #[allow(clippy::too_many_arguments)]
    fn moe_gemm(
        &self,
        g: &Grouping,
        tables: &GpuExpertTables,
        epi: &str,
        split: bool,
        opts: MoeOptions,
        xb: &CudaSlice<u16>,
        lo_plane: usize,
        w: (&CudaSlice<u64>, &CudaSlice<u64>),
        w3: (&CudaSlice<u64>, &CudaSlice<u64>),
        y: Option<&mut CudaSlice<f32>>,
        hb: Option<(&mut CudaSlice<u16>, usize, usize)>,
        n: usize,
        k: usize,
        limit: f32,
    ) -> Result<(), CudaError> {
        let family = moe_gemm_family(self.bf16_wgmma(tables.format, k), tables.format, g.bm, split);
        let name = format!("{family}_{}_{}{}_{epi}", tables.format, g.bm, if split { "_x2" } else { "" });
        let Some(fname) = moe_gemm_entry_points().find(|x| *x == name) else {
            return Err(bad(format!("no kernel {name}")));
        };
        let cfg = self.moe_launch_config(fname, g, n, moe_gemm_entry_bn(fname), moe_gemm_entry_smem(fname), opts)?;
        let (lo, n_i, k_i) = (lo_plane as i64, n as i32, k as i32);
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(fname));
        b.arg(xb).arg(&lo).arg(w.0).arg(w.1).arg(w3.0).arg(w3.1).arg(&g.items).arg(&g.n_items);
        match y {
            Some(y) => b.arg(y),
            None => b.arg(&null),
        };
        let (h_lo, ldh);
        match hb {
            Some((h, lo, ld)) => {
                h_lo = lo as i64;
                ldh = ld as i32;
                b.arg(h);
            }
            None => {
                h_lo = 0;
                ldh = 0;
                b.arg(&null);
            }
        }
        b.arg(&h_lo).arg(&ldh).arg(&g.row_dst).arg(&n_i).arg(&k_i).arg(&limit);
        // SAFETY: matches moe_gemm's signature; xb holds r_cap·Kp (·2 split) bf16, items/n_items come
        // from moe_group_plan (every item's rows lie inside r_cap), the tables hold E addresses of
        // weights of the shapes checked by GpuExpertTables::build, y/hb are sized by the caller for
        // r_cap (plain, swiglu) or T·k (scatter) rows; dynamic shared memory is the layout's size.
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// The grouped expert half of the MoE for `t` tokens: `Σ_slot γ·expert(f) + shared(f)` (`[t, d]`)
    /// from the ffn-normed inputs `f` (`[t, d]`), the selected `experts` and routing `weights`
    /// (`[t, k]`, both on the device). Same result as [`Gpu::moe_experts`] to f32 rounding (exact-weight
    /// formats; split activations reproduce the per-expert tensor-core path's bits per expert row).
    ///
    /// Errors: a layer that cannot run grouped (see [`GpuExpertTables::build`]), shapes that
    /// disagree with `cfg`, or any launch error. Expert ids outside 0..E are not grouped: their
    /// slots are never written and the combine counts them as zeros (the router marks such tokens
    /// with NaN weights, which reach the output).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_grouped(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, t: usize, experts: &CudaSlice<i32>, weights: &CudaSlice<f32>, split: bool, opts: MoeOptions) -> Result<DevBuf<f32>, CudaError> {
        let (tables, d, e, k) = self.grouped_inputs(cfg, layer, f, t, experts, weights, false)?;
        let tk = t * k;
        let inter = tables.inter;
        let limit = cfg.swiglu_limit as f32;
        // MOE_DECODE_GEMV: a few pairs in the exact numerics (split activations) as f32 gemvs.
        if split && gemv_runs(tables, tk, opts) {
            return self.moe_experts_gemv(layer, tables, f, t, experts, weights, (d, e, k), limit, false, None);
        }
        let wgmma = self.bf16_wgmma(tables.format, d) && self.bf16_wgmma(tables.format, inter);
        let g = self.moe_group(experts, tk, k, e, opts.tile_rows(tk, e, split, wgmma))?;
        let planes = if split { 2 } else { 1 };
        // Grouped activations [r_cap, d] (bf16, + low plane).
        // SAFETY: rows < R are written by moe_gather_bf16 below; rows ≥ R are never read (no item covers them).
        let mut xb = unsafe { self.scratch::<u16>(g.r_cap * d * planes) }?;
        {
            let quads = g.r_cap * d / 4;
            let cfg = LaunchConfig { grid_dim: (quads.div_ceil(256).min(132 * 16) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (d_i, lo, sp, e_i) = (d as i32, (g.r_cap * d) as i64, split as i32, e as i32);
            let mut b = self.stream.launch_builder(self.f("moe_gather_bf16"));
            b.arg(f).arg(&g.row_tok).arg(&g.offsets).arg(&mut xb).arg(&d_i).arg(&d_i).arg(&lo).arg(&sp).arg(&e_i);
            // SAFETY: moe_gather_bf16(f [t, d], row_tok, offsets [E+1], xb [r_cap, Kp = d] (+ plane), d, Kp, lo_plane, split, E).
            drv("moe_gather_bf16", unsafe { b.launch(cfg) })?;
        }
        // h = SwiGLU(gate, up) as bf16 [r_cap, inter] (+ low plane).
        let h_lo = g.r_cap * inter;
        // SAFETY: rows < R are written by the gate/up stage; rows ≥ R are never read.
        let mut hb = unsafe { self.scratch::<u16>(h_lo * planes) }?;
        if opts.fused_swiglu {
            self.moe_gemm(&g, tables, "swiglu", split, opts, &xb, g.r_cap * d, (&tables.w1, &tables.s1), (&tables.w3, &tables.s3), None, Some((&mut hb, h_lo, inter)), 2 * inter, d, limit)?;
        } else {
            let mut yg = self.zeros::<f32>(g.r_cap * inter)?;
            let mut yu = self.zeros::<f32>(g.r_cap * inter)?;
            self.moe_gemm(&g, tables, "plain", split, opts, &xb, g.r_cap * d, (&tables.w1, &tables.s1), (&tables.w1, &tables.s1), Some(&mut yg), None, inter, d, limit)?;
            self.moe_gemm(&g, tables, "plain", split, opts, &xb, g.r_cap * d, (&tables.w3, &tables.s3), (&tables.w3, &tables.s3), Some(&mut yu), None, inter, d, limit)?;
            let mut yh = self.zeros::<f32>(g.r_cap * inter)?;
            self.swiglu(&yg, &yu, &mut yh, g.r_cap * inter, limit)?;
            // hb [r_cap, inter] (+ plane at r_cap·inter): T = Tp = r_cap, K = Kp = inter.
            self.x_bf16_into(&yh.slice(..), &mut hb, g.r_cap, inter, g.r_cap, split)?;
        }
        // Down projection, rows scattered to their (token, slot).
        // SAFETY: the scatter writes every (token, slot) row whose expert is in 0..E; the combine
        // reads no other (it is given the expert ids).
        let mut slot_out = unsafe { self.scratch::<f32>(tk * d) }?;
        self.moe_gemm(&g, tables, "scatter", split, opts, &hb, h_lo, (&tables.w2, &tables.s2), (&tables.w2, &tables.s2), Some(&mut slot_out), None, d, inter, limit)?;
        // Shared expert over all tokens, then the combine.
        self.moe_shared_and_combine(layer, f, None, t, k, d, limit, SlotOut::F32(&slot_out), weights, Some((experts, e)), false)
    }

    /// Launches one grouped FP8-activation GEMM `moe_<q8|w8|ws|wt>_<fmt>_<bm>_<epi>` (gemm_q8.cu; the
    /// family from [`super::ops_q8::families_for`] and [`super::ops_q8::moe_family_for`], or `moe_wt`
    /// for 256-row tiles, whose block scale tables `blocks` indexes in
    /// [`GpuExpertTables::block_smax`]: gate (or only) and up matrix, 0 = w1, 1 = w3, 2 = w2).
    #[allow(clippy::too_many_arguments)]
    fn moe_q8<Y: cudarc::driver::DeviceRepr>(&self, g: &Grouping, tables: &GpuExpertTables, epi: &str, opts: MoeOptions, xq: &CudaSlice<u8>, xsa: &CudaSlice<f32>, w: (&CudaSlice<u64>, &CudaSlice<u64>), w3: (&CudaSlice<u64>, &CudaSlice<u64>), blocks: (usize, usize), y: Option<&mut CudaSlice<Y>>, hf: Option<(&mut CudaSlice<f32>, usize)>, gamma: &CudaSlice<f32>, n: usize, k: usize, limit: f32) -> Result<(), CudaError> {
        // 256-row tiles exist only as moe_wt (FP4; chosen by ops_q8::wt_tiles).
        let family = if g.bm == 256 { "moe_wt" } else { super::ops_q8::moe_family_for(super::ops_q8::families_for(&self.arch).1, g.bm, self.moe_ws_ok) };
        // The output type must be the entry's: bf16 bits for the `_bf16` scatter, f32 otherwise.
        if epi.ends_with("_bf16") != (std::mem::size_of::<Y>() == 2) {
            return Err(bad(format!("moe_q8 epilogue {epi} with {}-byte outputs (expected 2 for a _bf16 epilogue, 4 otherwise)", std::mem::size_of::<Y>())));
        }
        let name = format!("{family}_{}_{}_{epi}", tables.format, g.bm);
        let Some(&fname) = super::ops_q8::GEMM_Q8_ENTRY_POINTS.iter().find(|x| **x == name) else {
            return Err(bad(format!("no kernel {name}")));
        };
        let cfg = self.moe_launch_config(fname, g, n, super::ops_q8::Q8_BN, super::ops_q8::smem_of(fname), opts)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(fname));
        b.arg(xq).arg(xsa).arg(w.0).arg(w.1).arg(w3.0).arg(w3.1).arg(&g.items).arg(&g.n_items);
        match y {
            Some(y) => b.arg(y),
            None => b.arg(&null),
        };
        let ldh;
        match hf {
            Some((h, ld)) => {
                ldh = ld as i32;
                b.arg(h);
            }
            None => {
                ldh = 0;
                b.arg(&null);
            }
        }
        b.arg(&ldh).arg(&g.row_dst).arg(gamma).arg(&n_i).arg(&k_i).arg(&limit);
        if family == "moe_wt" {
            // The block scale tables of the gate (or only) and up matrices: indices into block_smax.
            let bs = tables.block_smax.as_ref().ok_or_else(|| bad("moe_wt without block scale tables"))?;
            b.arg(&bs[blocks.0]).arg(&bs[blocks.1]);
        }
        // SAFETY: matches moe_q8's signature (y f32, or bf16 bits for the _bf16 scatter: checked
        // above); xq/xsa hold r_cap rows of Kp = k bytes / k/128 scales
        // (moe_gather_q8, or act_quant_grouped: defined on the rows a tile reads; for moe_wt in
        // their tiled layout, r_cap a multiple of 128 and every tile's rows within one expert's,
        // dst ≥ 0 first), items come from moe_group_plan, the tables hold E addresses of
        // weights checked by GpuExpertTables::build (q8), y/hf are sized by the caller for r_cap
        // (plain, swiglu) or T·k (scatter) rows; gamma holds T·k weights indexed by row_dst; moe_wt:
        // the two tables of GpuExpertTables::block_smax for w and w3 ([E][ceil(rows/128)][k/128]).
        drv(&name, unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// [`Gpu::moe_experts_grouped`] in DeepSeek's official numerics (`TC_LINEAR=fp8`, spec §10.1):
    /// the inputs quantized once per token to e4m3 (per 128 features) and gathered by expert, gate/up
    /// on FP8 tensor cores with the clamped SwiGLU and γ fused (h·γ in f32), h·γ quantized, the down
    /// projection scattered to (token, slot), then the shared expert (same numerics) and a combine
    /// with γ already applied. CPU reference: `forward::moe::moe` with `act_quant_fp8`.
    ///
    /// Errors: experts [`GpuExpertTables::q8`] rejects, shapes that disagree with `cfg`, launch
    /// failures.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_grouped_q8(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, t: usize, experts: &CudaSlice<i32>, weights: &CudaSlice<f32>, opts: MoeOptions) -> Result<DevBuf<f32>, CudaError> {
        Ok(self.moe_grouped_q8_slots(cfg, layer, f, t, experts, weights, opts)?.0)
    }

    /// [`Gpu::moe_experts_grouped_q8`] that also returns the routed outputs it combined (`[t·k, d]`,
    /// one row per (token, slot); rows of slots whose expert lies outside 0..E unwritten; `None`
    /// where the decode gemvs ran): f32, or with `MOE_DOWN_BF16_OUT` on the 256-row tiles bf16
    /// (the gpu-check of that switch compares the two).
    ///
    /// Errors: as [`Gpu::moe_experts_grouped_q8`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_grouped_q8_slots(&self, cfg: &Ds4Config, layer: &GpuMoeLayer, f: &CudaSlice<f32>, t: usize, experts: &CudaSlice<i32>, weights: &CudaSlice<f32>, opts: MoeOptions) -> Result<(DevBuf<f32>, Option<OwnedSlots>), CudaError> {
        let (tables, d, e, k) = self.grouped_inputs(cfg, layer, f, t, experts, weights, true)?;
        let tk = t * k;
        let inter = tables.inter;
        let limit = cfg.swiglu_limit as f32;
        if gemv_runs(tables, tk, opts) {
            return Ok((self.moe_experts_gemv(layer, tables, f, t, experts, weights, (d, e, k), limit, true, opts.gemv_ksplit)?, None));
        }
        let wt = self.moe_wt_runs(tables, tk, e, opts);
        self.moe_mark("moe:group+gather");
        let g = self.moe_group(experts, tk, k, e, if wt { 256 } else { opts.tile_rows(tk, e, false, false) })?;
        let qa = self.act_quant(f, t, d)?;
        let kb = d / super::ops_q8::Q8_BLOCK;
        // SAFETY: rows < R are written by moe_gather_q8; rows ≥ R are never read (no item covers them).
        let mut xq = unsafe { self.scratch::<u8>(g.r_cap * d) }?;
        // SAFETY: as above.
        let mut xsa = unsafe { self.scratch::<f32>(g.r_cap * kb) }?;
        {
            let chunks = g.r_cap * d / 16;
            let lc = LaunchConfig { grid_dim: (chunks.div_ceil(256).min(132 * 16) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (d_i, e_i, tiled) = (d as i32, e as i32, wt as i32);
            let mut b = self.stream.launch_builder(self.f("moe_gather_q8"));
            b.arg(&qa.q).arg(&qa.sa).arg(&g.row_tok).arg(&g.offsets).arg(&mut xq).arg(&mut xsa).arg(&d_i).arg(&e_i).arg(&tiled);
            // SAFETY: moe_gather_q8(q [t↑128, d], sa [.., d/128], row_tok, offsets [E+1], xq [r_cap, d] (tiled: the
            // same bytes in gq_tiled's order, r_cap a multiple of 128), xsa [r_cap, d/128], Kp = d, E, tiled).
            drv("moe_gather_q8", unsafe { b.launch(lc) })?;
        }
        // h·γ as f32 [r_cap, inter].
        // SAFETY: the fused gate/up writes every row of every tile (γ = 0 for padding rows) except
        // moe_wt's sub-tiles of padding rows alone, which the down projection skips as well; the
        // unfused path writes all r_cap rows (swiglu over the zero-filled yg / yu). Rows ≥ R (and
        // moe_wt's sub-tiles of padding alone) are read by no tile and not quantized.
        let mut hf = unsafe { self.scratch::<f32>(g.r_cap * inter) }?;
        self.moe_mark("moe:gate_up");
        if opts.fused_swiglu {
            self.moe_q8::<f32>(&g, tables, "swiglu", opts, &xq, &xsa, (&tables.w1, &tables.s1), (&tables.w3, &tables.s3), (0, 1), None, Some((&mut hf, inter)), weights, 2 * inter, d, limit)?;
        } else {
            let mut yg = self.zeros::<f32>(g.r_cap * inter)?;
            let mut yu = self.zeros::<f32>(g.r_cap * inter)?;
            self.moe_q8(&g, tables, "plain", opts, &xq, &xsa, (&tables.w1, &tables.s1), (&tables.w1, &tables.s1), (0, 0), Some(&mut yg), None, weights, inter, d, limit)?;
            self.moe_q8(&g, tables, "plain", opts, &xq, &xsa, (&tables.w3, &tables.s3), (&tables.w3, &tables.s3), (1, 1), Some(&mut yu), None, weights, inter, d, limit)?;
            self.swiglu(&yg, &yu, &mut hf, g.r_cap * inter, limit)?;
            self.scale_rows_by_route(&mut hf, &g.row_dst.slice(..), weights, g.r_cap, inter)?;
        }
        self.moe_mark("moe:down");
        let hq = self.act_quant_grouped(&hf, g.r_cap, inter, wt, g.quantized_rows(wt))?;
        // SAFETY: as in moe_experts_grouped: every routed (token, slot) row is scattered to, and the
        // combine reads no other.
        // MOE_DOWN_BF16_OUT (the 256-row tiles' scatter): the rows in bf16, as DeepSeek's GEMMs
        // write them (spec §6), half the bytes written here and read by the combine.
        // (Not with FLASHSEEK_KERNEL_DEFINES' timing form GWT_EPI_STAGED=0, whose direct stores
        // have no bf16 form: the kernel would trap.)
        let slots = if wt && crate::switches::on("MOE_DOWN_BF16_OUT") && super::nvrtc::gwt_epi_staged() {
            let mut s = unsafe { self.scratch::<u16>(tk * d) }?;
            self.moe_q8(&g, tables, "scatter_bf16", opts, &hq.q, &hq.sa, (&tables.w2, &tables.s2), (&tables.w2, &tables.s2), (2, 2), Some(&mut s), None, weights, d, inter, limit)?;
            OwnedSlots::Bf16(s)
        } else {
            let mut s = unsafe { self.scratch::<f32>(tk * d) }?;
            self.moe_q8(&g, tables, "scatter", opts, &hq.q, &hq.sa, (&tables.w2, &tables.s2), (&tables.w2, &tables.s2), (2, 2), Some(&mut s), None, weights, d, inter, limit)?;
            OwnedSlots::F32(s)
        };
        // The shared expert's gate and up take the routed experts' quantisation of f.
        self.moe_mark("moe:shared+combine");
        let out = self.moe_shared_and_combine(layer, f, Some(&qa), t, k, d, limit, slots.view(), weights, Some((experts, e)), true)?;
        Ok((out, Some(slots)))
    }
}

/// The routed outputs [`Gpu::moe_grouped_q8_slots`] combined, owned: f32, or bf16 bits
/// (`MOE_DOWN_BF16_OUT`).
pub(crate) enum OwnedSlots {
    /// f32 values.
    F32(DevBuf<f32>),
    /// bf16 bits.
    Bf16(DevBuf<u16>),
}

impl OwnedSlots {
    /// The borrowed form the combine takes.
    pub(crate) fn view(&self) -> SlotOut<'_> {
        match self {
            OwnedSlots::F32(s) => SlotOut::F32(s),
            OwnedSlots::Bf16(s) => SlotOut::Bf16(s),
        }
    }
}

/// Whether [`Gpu::moe_experts_grouped_q8`] (or, split, [`Gpu::moe_experts_grouped`]) hands `tk` routed pairs over `tables` to
/// [`Gpu::moe_experts_gemv`] under `opts` (`MOE_DECODE_GEMV`): FP4 experts, at most
/// `opts.decode_gemv` pairs, widths multiples of 128 (the activation blocks) and at most
/// [`MOE_GEMV_MAX_WIDTH`] (one input row in shared memory).
pub(crate) fn gemv_runs(tables: &GpuExpertTables, tk: usize, opts: MoeOptions) -> bool {
    let width_ok = |w: usize| w > 0 && w.is_multiple_of(super::ops_q8::Q8_BLOCK) && w <= MOE_GEMV_MAX_WIDTH;
    tables.format == "fp4" && opts.decode_gemv.is_some_and(|m| tk <= m) && width_ok(tables.d) && width_ok(tables.inter)
}

/// Whether [`Gpu::moe_experts_gemv`] in official numerics takes the tensor-core gemvs
/// `moe_gemv_fp4_mma_*` (switch `MOE_GEMV_MMA`): FP4 tables with aligned addresses
/// ([`GpuExpertTables::gemv_mma_aligned`]) and both widths multiples of [`MGM_K_MULTIPLE`].
pub(crate) fn gemv_mma_runs(tables: &GpuExpertTables) -> bool {
    crate::switches::on("MOE_GEMV_MMA") && tables.format == "fp4" && tables.gemv_mma_aligned && tables.d.is_multiple_of(MGM_K_MULTIPLE) && tables.inter.is_multiple_of(MGM_K_MULTIPLE)
}

/// How many warps split each 16-row tile's groups in `moe_gemv_fp4_mma_*` for `tk` pairs: 4 (the
/// `_ks4` entries) for at most [`MGM_KS4_MAX_PAIRS`] pairs when both widths are multiples of
/// 4·[`MGM_K_MULTIPLE`], else 1; `force` (checks) overrides the count (4 only where the widths allow
/// it).
pub(crate) fn gemv_mma_ksplit(tables: &GpuExpertTables, tk: usize, force: Option<usize>) -> usize {
    let ks4_ok = tables.d.is_multiple_of(4 * MGM_K_MULTIPLE) && tables.inter.is_multiple_of(4 * MGM_K_MULTIPLE);
    match force {
        Some(4) if ks4_ok => 4,
        Some(_) => 1,
        None if ks4_ok && tk <= MGM_KS4_MAX_PAIRS => 4,
        None => 1,
    }
}

/// Most routed pairs for which `moe_gemv_fp4_mma_*` split each tile's groups four ways (decode steps
/// of up to 2 tokens of top-6); not yet measured against the 1-way form at every size.
pub const MGM_KS4_MAX_PAIRS: usize = 12;

/// Output rows per block of `moe_gemv_fp4_mma_*` (16 per warp, `MGM_WARPS` = 4 warps in moe.cu).
const MGM_ROWS_PER_BLOCK: usize = 64;
/// Threads per block of `moe_gemv_fp4_mma_*` (`32 · MGM_WARPS`).
const MGM_THREADS: u32 = 128;
/// The input widths `moe_gemv_fp4_mma_*` take are multiples of this (`32 · MGM_U`: whole batches of
/// 8 groups of 32, and whole 64-bit words of scale bytes).
pub const MGM_K_MULTIPLE: usize = 256;

/// Widest input row `moe_gemv_fp4_*` takes (its f32 copy in 48 KB of shared memory).
pub const MOE_GEMV_MAX_WIDTH: usize = 12_288;

/// Output rows per block of `moe_gemv_fp4_*` (`MGV_WARPS · MGV_RPW` in moe.cu).
const MGV_ROWS_PER_BLOCK: usize = 32;

impl Gpu {
    /// The MoE of `t` tokens (`f` `[t, d]`, routing `experts` / `weights` `[t·k]` on the device)
    /// over FP4 experts as gemvs (switch `MOE_DECODE_GEMV`, moe.cu `moe_gemv_fp4_*`): one launch for
    /// every pair's gate/up with the SwiGLU (h `[t·k, inter]`), one for every pair's down projection
    /// into its slot, then the shared expert and the combine as on the grouped paths. `official`
    /// (`TC_LINEAR=fp8`, DeepSeek's numerics): f and h quantized to e4m3 (act_quant) before their
    /// gemvs and γ applied to h before W2; otherwise (the exact modes) f32 inputs and γ in the
    /// combine, as [`Gpu::moe_experts_grouped`]. No grouping, no padding rows: each pair reads its
    /// expert's weights once. The grouped GEMMs' numerics definition, not their bits (gpu-check
    /// `moe_q8 … gemv`, `moe_grouped … gemv`).
    ///
    /// Errors: widths the kernels do not take ([`gemv_runs`]), sizes past 32 bits, launch failures.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_gemv(&self, layer: &GpuMoeLayer, tables: &GpuExpertTables, f: &CudaSlice<f32>, t: usize, experts: &CudaSlice<i32>, weights: &CudaSlice<f32>, (d, e, k): (usize, usize, usize), limit: f32, official: bool, ksplit: Option<usize>) -> Result<DevBuf<f32>, CudaError> {
        let (tk, inter) = (t * k, tables.inter);
        if !gemv_runs(tables, tk, MoeOptions { decode_gemv: Some(usize::MAX), ..MoeOptions::ALL_ON }) || tk == 0 {
            return Err(bad(format!("moe gemv over {} experts of [{inter}, {d}], {tk} pairs", tables.format)));
        }
        let i32_of = |v: usize, what: &str| i32::try_from(v).map_err(|_| bad(format!("{what} = {v} exceeds 32 bits")));
        let (k_i, e_i, d_i, inter_i) = (i32_of(k, "top-k")?, i32_of(e, "experts")?, i32_of(d, "width")?, i32_of(inter, "hidden units")?);
        i32_of(tk * inter.max(d), "outputs")?;
        if tk > 65_535 {
            return Err(bad(format!("{tk} pairs exceed the grid's 65,535 rows of blocks")));
        }
        let lc = |n: usize, width: usize| LaunchConfig { grid_dim: (n.div_ceil(MGV_ROWS_PER_BLOCK) as u32, tk as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: (4 * width) as u32 };
        self.moe_mark("moe:gate_up");
        let qa = if official { Some(self.act_quant(f, t, d)?) } else { None };
        // SAFETY: the gate/up gemv writes every value of its tk rows (zeros for unrouted pairs).
        let mut h = unsafe { self.scratch::<f32>(tk * inter) }?;
        // The official gemvs: with MOE_GEMV_MMA the tensor-core forms (`_ks4`: the four-way split of
        // each tile's groups), else the CUDA-core ones; the same arguments, other launch shapes.
        let mma = official && gemv_mma_runs(tables);
        let ks = gemv_mma_ksplit(tables, tk, ksplit);
        let (swiglu_q, down_q) = if mma {
            let sfx = if ks == 4 { "_ks4" } else { "" };
            (format!("moe_gemv_fp4_mma_swiglu{sfx}"), format!("moe_gemv_fp4_mma_down{sfx}"))
        } else {
            ("moe_gemv_fp4_swiglu".to_string(), "moe_gemv_fp4_down".to_string())
        };
        let lc_q = |n: usize, width: usize| {
            if mma {
                LaunchConfig { grid_dim: (n.div_ceil(MGM_ROWS_PER_BLOCK / ks) as u32, tk as u32, 1), block_dim: (MGM_THREADS, 1, 1), shared_mem_bytes: (width + 4 * (width / 128)) as u32 }
            } else {
                lc(n, width)
            }
        };
        match &qa {
            Some(qa) => {
                let ldq = i32_of(qa.kp, "row bytes")?;
                let mut b = self.stream.launch_builder(self.f(&swiglu_q));
                b.arg(&qa.q).arg(&qa.sa).arg(&ldq).arg(experts).arg(&k_i).arg(&e_i).arg(&tables.w1).arg(&tables.s1).arg(&tables.w3).arg(&tables.s3).arg(weights).arg(&mut h).arg(&inter_i).arg(&d_i).arg(&limit);
                // SAFETY: moe_gemv_fp4[_mma]_swiglu(q [≥ t rows, kp], sa [·, kp/128], ldq = kp, experts [tk], k,
                // E, w1/s1/w3/s3 tables [E], gamma [tk], h [tk, inter], N = inter, K = d, limit). CUDA cores:
                // grid (N/32, tk), block 256, 4·d bytes of shared memory (d ≤ MOE_GEMV_MAX_WIDTH, a
                // multiple of 128). MMA: d a multiple of 32·MGM_U (gemv_mma_runs; 4·256 for _ks4,
                // gemv_mma_ksplit), weight / scale addresses 16- / 8-byte aligned (gemv_mma_aligned);
                // grid (N / (64 / ks), tk), block 128, d + d/32 bytes of shared memory.
                drv(&swiglu_q, unsafe { b.launch(lc_q(inter, d)) })?;
            }
            None => {
                let mut b = self.stream.launch_builder(self.f("moe_gemv_fp4_swiglu_f32"));
                b.arg(f).arg(&d_i).arg(experts).arg(&k_i).arg(&e_i).arg(&tables.w1).arg(&tables.s1).arg(&tables.w3).arg(&tables.s3).arg(&mut h).arg(&inter_i).arg(&d_i).arg(&limit);
                // SAFETY: moe_gemv_fp4_swiglu_f32(x = f [t, d], ldx = d, experts [tk], k, E, tables [E],
                // h [tk, inter], N = inter, K = d, limit); grid (N/32, tk), block 256, 4·d bytes of shared memory.
                drv("moe_gemv_fp4_swiglu_f32", unsafe { b.launch(lc(inter, d)) })?;
            }
        }
        self.moe_mark("moe:down");
        // SAFETY: the down gemv writes every routed pair's row; moe_combine_f32 reads no other (it
        // skips the slots of ids outside 0..E).
        let mut slot_out = unsafe { self.scratch::<f32>(tk * d) }?;
        if official {
            let hq = self.act_quant(&h, tk, inter)?;
            let ldq = i32_of(hq.kp, "row bytes")?;
            let mut b = self.stream.launch_builder(self.f(&down_q));
            b.arg(&hq.q).arg(&hq.sa).arg(&ldq).arg(experts).arg(&e_i).arg(&tables.w2).arg(&tables.s2).arg(&mut slot_out).arg(&d_i).arg(&inter_i);
            // SAFETY: moe_gemv_fp4[_mma]_down(q [≥ tk rows, kp], sa, ldq = kp, experts [tk], E, w2/s2 tables
            // [E], y [tk, d], N = d, K = inter). CUDA cores: grid (d/32, tk), block 256, 4·inter bytes of
            // shared memory. MMA: inter a multiple of 32·MGM_U (4·32·MGM_U for _ks4), aligned tables
            // as above; grid (d / (64 / ks), tk), block 128, inter + inter/32 bytes.
            drv(&down_q, unsafe { b.launch(lc_q(d, inter)) })?;
        } else {
            let mut b = self.stream.launch_builder(self.f("moe_gemv_fp4_down_f32"));
            b.arg(&h).arg(&inter_i).arg(experts).arg(&e_i).arg(&tables.w2).arg(&tables.s2).arg(&mut slot_out).arg(&d_i).arg(&inter_i);
            // SAFETY: moe_gemv_fp4_down_f32(x = h [tk, inter], ldx = inter, experts [tk], E, w2/s2 tables [E],
            // y [tk, d], N = d, K = inter); grid (d/32, tk), block 256, 4·inter bytes of shared memory.
            drv("moe_gemv_fp4_down_f32", unsafe { b.launch(lc(d, inter)) })?;
        }
        self.moe_mark("moe:shared+combine");
        self.moe_shared_and_combine(layer, f, qa.as_ref(), t, k, d, limit, SlotOut::F32(&slot_out), weights, Some((experts, e)), official)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host grouping gpu-check compares the kernels with: pairs in order within each expert,
    /// padding rows −1, ids outside the experts dropped, tiles of each expert listed in order.
    #[test]
    fn group_reference_orders_and_pads() {
        // 3 tokens × top-2 over 3 experts; pair 3 names expert 5 (none), pair 4 expert −1 (none).
        let g = group_reference(&[2, 0, 0, 5, -1, 2], 2, 3, 2);
        assert_eq!(g.offsets, vec![0, 2, 2, 4]);
        assert_eq!(g.items, vec![0, 0, 2, 2]);
        assert_eq!(g.row_tok, vec![0, 1, 0, 2]);
        assert_eq!(g.row_dst, vec![1, 2, 0, 5]);
        let g = group_reference(&[1, 1, 1], 1, 2, 2);
        assert_eq!(g.offsets, vec![0, 0, 4]);
        assert_eq!(g.items, vec![1, 0, 1, 2]);
        assert_eq!(g.row_tok, vec![0, 1, 2, -1]);
        assert_eq!(g.row_dst, vec![0, 1, 2, -1]);
    }

    #[test]
    fn group_chunk_matches_the_kernel() {
        assert!(include_str!("kernels/moe.cu").contains(&format!("#define MOE_GROUP_CHUNK {MOE_GROUP_CHUNK}\n")));
    }

    #[test]
    fn tile_rows_follow_the_measured_rule() {
        let on = MoeOptions::ALL_ON;
        // 256 experts: 2048 tokens × 6 = 48 per expert → 64 rows; 8192 × 6 = 192 per expert.
        assert_eq!(on.tile_rows(2048 * 6, 256, false, false), 64);
        assert_eq!(on.tile_rows(8192 * 6, 256, false, false), 128);
        assert_eq!(on.tile_rows(8192 * 6, 256, true, false), 64);
        // wgmma: split activations take the 128-row tile too when experts are full enough.
        assert_eq!(on.tile_rows(8192 * 6, 256, true, true), 128);
        assert_eq!(on.tile_rows(2048 * 6, 256, true, true), 64);
        let fixed = MoeOptions { adaptive_tiles: false, ..on };
        assert_eq!(fixed.tile_rows(16, 256, true, false), 128);
        assert_eq!(MoeOptions { force_tile_rows: Some(64), ..fixed }.tile_rows(1 << 20, 1, false, true), 64);
        assert_eq!(MoeOptions { force_tile_rows: Some(100), ..on }.tile_rows(1, 256, true, false), 128);
    }

    /// Every grouped GEMM entry point parses to a family, format, tile and split, all 36
    /// combinations exist once per family (moe_wbs: FP4, split, 128 rows only), and every block's
    /// shared memory fits a Hopper SM (227 KB per block); the 64-row wgmma blocks fit two per SM
    /// (228 KB, 1 KB reserved per block).
    #[test]
    fn grouped_gemm_entry_points_are_complete() {
        let names: Vec<&str> = moe_gemm_entry_points().collect();
        assert_eq!(names.len(), 75);
        let mut seen = std::collections::HashSet::new();
        for n in &names {
            let (fmt, bm, split) = moe_gemm_entry_shape(n);
            let family = ["moe_wbs", "moe_wb", "moe_gemm"].into_iter().find(|f| n.starts_with(&format!("{f}_"))).expect("a family prefix");
            if family == "moe_wbs" {
                assert_eq!((fmt, bm, split, moe_gemm_entry_bn(n)), ("fp4", 128, true, 256), "{n}");
            }
            let epi = ["plain", "swiglu", "scatter"].into_iter().find(|e| n.ends_with(e)).expect("an epilogue suffix");
            assert_eq!(*n, format!("{family}_{fmt}_{bm}{}_{epi}", if split { "_x2" } else { "" }));
            assert!(seen.insert((family, fmt, bm, split, epi)));
            let smem = moe_gemm_entry_smem(n);
            assert!(smem <= 227 * 1024, "{n}: {smem}");
            if family == "moe_wb" && bm == 64 {
                assert!(2 * (smem + 1024) <= 228 * 1024, "{n}: {smem}");
            }
        }
    }

    /// moe_wbs's FP4 → bf16 conversion (gemm.cu `gbs_e2m1x2` and the scale multiply in `moe_wbs`)
    /// gives gb_gemm's bf16 bits (`gb_e2m1x8`'s values times `gm_e8m0_bf16`'s 2^(s − 127)) for every
    /// byte (two nibbles) and every scale byte: a mirror of both in Rust, each bf16 multiply an f32
    /// product rounded to bf16 (the products are exact or overflow alike; NaN compared as NaN), and
    /// the kernel source checked to hold the mirrored constants.
    #[test]
    fn wbs_fp4_conversion_matches_gb_gemm() {
        use flashseek_model::quant::{bf16_to_f32, f32_to_bf16};
        let src = include_str!("kernels/gemm.cu");
        assert!(src.contains("return ((b * 0x00040040u) & 0x01C001C0u) | ((b * 0x01001000u) & 0x80008000u);"));
        assert!(src.contains("u32 f = one ? (sc + 126u) << 7 : 0x7E80u;") && src.contains("const bool one = sc <= 128u;"));
        assert!(src.contains("return e == 0u ? 0x0040u : e == 255u ? 0x7fc0u : (e << 7);"));
        let mul = |a: u16, b: u16| f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b));
        let e8m0 = |s: u32| -> u16 { if s == 0 { 0x0040 } else if s == 255 { 0x7fc0 } else { (s << 7) as u16 } };
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let reference = |nib: u32, s: u32| {
            let v = if nib & 8 != 0 { -E2M1[(nib & 7) as usize] } else { E2M1[(nib & 7) as usize] };
            mul(f32_to_bf16(v), e8m0(s))
        };
        let same = |a: u16, b: u16| a == b || (bf16_to_f32(a).is_nan() && bf16_to_f32(b).is_nan());
        for s in 0u32..256 {
            for byte in 0u32..256 {
                let w = (byte.wrapping_mul(0x0004_0040) & 0x01C0_01C0) | (byte.wrapping_mul(0x0100_1000) & 0x8000_8000);
                for (half, nib) in [(w as u16, byte & 15), ((w >> 16) as u16, byte >> 4)] {
                    let fast = if s <= 128 { mul(half, ((s + 126) << 7) as u16) } else { mul(mul(half, 0x7E80), e8m0(s)) };
                    assert!(same(fast, reference(nib, s)), "byte {byte:#04x} scale {s}: {fast:#06x} vs {:#06x}", reference(nib, s));
                }
            }
        }
    }

    /// The launch's block size and shared memory are the kernel's (`GBS_THREADS`, `GbsLayout`), and
    /// the family rule sends only FP4 split 128-row wgmma launches to moe_wbs.
    #[test]
    fn warp_specialised_bf16_moe_matches_the_source() {
        let src = include_str!("kernels/gemm.cu");
        assert!(src.contains("#define GBS_PRODUCERS 128") && src.contains("#define GBS_THREADS (256 + GBS_PRODUCERS)"));
        assert_eq!(WBS_THREADS, 384);
        assert!(src.contains("MOE_ENTRY(NAME, GBS_THREADS, moe_wbs<EPI>)") && src.contains("__launch_bounds__(THREADS, 1)"));
        assert!(src.contains("static constexpr int STAGES = 3;") && src.contains("static constexpr int STAGE = 73728;"));
        assert!(src.contains("static constexpr int TOTAL = 1024 + BARS + 2 * STAGES * 8;"));
        assert_eq!(WBS_SMEM, 222_256);
        crate::switches::scoped(&[("MOE_BF16_WS", "on")], || {
            assert_eq!(moe_gemm_family(true, "fp4", 128, true), "moe_wbs");
            assert_eq!(moe_gemm_family(true, "fp4", 64, true), "moe_wb");
            assert_eq!(moe_gemm_family(true, "fp4", 128, false), "moe_wb");
            assert_eq!(moe_gemm_family(true, "fp8", 128, true), "moe_wb");
            assert_eq!(moe_gemm_family(false, "fp4", 128, true), "moe_gemm");
        })
        .unwrap();
        crate::switches::scoped(&[("MOE_BF16_WS", "off")], || assert_eq!(moe_gemm_family(true, "fp4", 128, true), "moe_wb")).unwrap();
    }

    /// `MOE_GEMV_MMA`'s decode (moe.cu `mgm_lo` / `mgm_hi`): for every 32-bit word, each of its
    /// eight nibbles lands as an e4m3 byte whose value is the nibble's e2m1 value times 2^-6 — the
    /// low nibbles of bytes 0…3 in the bytes of `mgm_lo`, the high ones in `mgm_hi` — and the B
    /// fragment's byte permutation (`__byte_perm` 0x6420 / 0x7531) takes the same values of the
    /// input row (value 2i to byte i of the first register, 2i + 1 of the second); `mgm_scaled`'s
    /// multiplier 2^(s − 121) is a normal f32 for s ≤ 248 (else ldexpf). A mirror in Rust, with
    /// the kernel source checked to hold the mirrored expressions, and the host constants tied to
    /// the kernel's.
    #[test]
    fn gemv_mma_decode_matches_e2m1() {
        use flashseek_model::quant::{e2m1_to_f32, e4m3_to_f32};
        let src = include_str!("kernels/moe.cu");
        assert!(src.contains("mgm_lo(u32 w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }"));
        assert!(src.contains("mgm_hi(u32 w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }"));
        assert!(src.contains("make_uint2(__byte_perm(v.x, v.y, 0x6420), __byte_perm(v.x, v.y, 0x7531))"));
        assert!(src.contains("return e <= 127 ? d * __int_as_float((e + 127) << 23) : ldexpf(d, e);") && src.contains("const int e = (int)s - 121;"));
        assert!(src.contains("#define MGM_WARPS 4") && src.contains("#define MGM_U 8"));
        assert!(src.contains("MGM_ENTRIES(, 1)") && src.contains("MGM_ENTRIES(_ks4, 4)"));
        assert_eq!((MGM_ROWS_PER_BLOCK, MGM_THREADS as usize, MGM_K_MULTIPLE), (16 * 4, 32 * 4, 32 * 8));
        let lo = |w: u32| ((w << 2) & 0x1C1C_1C1C) | ((w << 4) & 0x8080_8080);
        let hi = |w: u32| ((w >> 2) & 0x1C1C_1C1C) | (w & 0x8080_8080);
        // Every nibble value in every position (each byte's two nibbles over all 256 bytes, the
        // other bytes of the word varied so that neighbours' bits cannot leak in).
        for byte in 0u32..256 {
            for pos in 0..4 {
                for fill in [0u32, 0xFFFF_FFFF, 0x5A5A_5A5A, 0xA5A5_A5A5] {
                    let w = (fill & !(0xFF << (8 * pos))) | (byte << (8 * pos));
                    let (l, h) = ((lo(w) >> (8 * pos)) as u8, (hi(w) >> (8 * pos)) as u8);
                    for (e4, nib) in [(l, byte & 15), (h, byte >> 4)] {
                        let want = e2m1_to_f32(nib as u8) / 64.0;
                        let got = e4m3_to_f32(e4);
                        assert!(got == want && got.is_sign_negative() == want.is_sign_negative(), "byte {byte:#04x} at {pos}, fill {fill:#x}: {e4:#04x} = {got} vs {want}");
                    }
                }
            }
        }
        // The B fragment: bytes 8c … 8c + 7 of the row; value 2i + j of the eight goes to byte i of
        // register j (the A fragment's low / high nibble of byte i of the same word).
        let perm = |x: u32, y: u32, sel: u32| -> u32 {
            let b = |n: u32| if n < 4 { (x >> (8 * n)) & 0xFF } else { (y >> (8 * (n - 4))) & 0xFF };
            (0..4).map(|i| b((sel >> (4 * i)) & 7) << (8 * i)).sum()
        };
        let (x, y) = (0x0302_0100u32, 0x0706_0504u32);
        for i in 0..4 {
            assert_eq!((perm(x, y, 0x6420) >> (8 * i)) & 0xFF, 2 * i);
            assert_eq!((perm(x, y, 0x7531) >> (8 * i)) & 0xFF, 2 * i + 1);
        }
        for s in 0u32..=248 {
            let e = s as i32 - 121;
            assert_eq!(f32::from_bits(((e + 127) << 23) as u32), 2f32.powi(e), "scale {s}");
        }
    }
}
