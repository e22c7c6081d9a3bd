//! The whole DeepSeek-V4 forward on the GPU (spec §4), assembled from the op launchers, with the
//! per-sequence state on the device (spec §5) in the same layout as the CPU state: raw K=V rows,
//! each compressor's per-token projections and its emitted entries, addressed by absolute position.
//! Chunked prefill, decode and truncation work as on the CPU (`forward::forward_chunk`).
//!
//! This first version favours clarity: activations are f32, weights come from a
//! [`GpuSource`](super::upload::GpuSource) (f32, or the checkpoint's stored FP8/FP4/BF16 formats
//! dequantized in the kernels), and there are host round trips where a
//! step needs host-side lists (indexer offsets, expert grouping). Stored-format uploads (FP8/FP4),
//! CUDA graphs and fused prefill kernels come next (issues 5 and 6).

use super::drv;
use super::graph::DevBuf;
use super::gpu::{Gpu, GpuGroupTable, GpuMatrix, GpuWeight, MultiOut};
use super::ops_attention::{hca_offsets, topk_offsets, AttentionKernel, AttentionOut, AttentionQuery, AttentionShape, CompressedKeys, IndexerShape, PoolShape};
use super::ops_mhc::{GpuExpert, GpuHcWeights, GpuMoeLayer, GpuRouter};
use super::upload::GpuSource;
use super::CudaError;
use crate::cpu::rope::Rope;
use crate::forward::LogitsFor;
use crate::state::SequenceState;
use cudarc::driver::CudaSlice;
use flashseek_model::config::{Ds4Config, LayerKind};
use flashseek_model::quant;

/// A compressor's weights on the device.
struct GpuCompressor {
    wkv: GpuWeight,
    wgate: GpuWeight,
    ape: CudaSlice<f32>,
    norm: CudaSlice<f32>,
    ratio: usize,
    width: usize,
    overlap: bool,
}

impl GpuCompressor {
    /// Compressor `prefix` (`…attn.compressor` or `…attn.indexer.compressor`) of entry width `width`.
    fn upload(gpu: &Gpu, src: &dyn GpuSource, prefix: &str, width: usize, ratio: usize, overlap: bool, d: usize) -> Result<Self, CudaError> {
        let out = if overlap { 2 * width } else { width };
        Ok(GpuCompressor {
            wkv: src.matrix(gpu, &format!("{prefix}.wkv.weight"), out, d)?,
            wgate: src.matrix(gpu, &format!("{prefix}.wgate.weight"), out, d)?,
            ape: gpu.upload(&src.host(&format!("{prefix}.ape"), &[ratio, out])?)?,
            norm: gpu.upload(&src.host(&format!("{prefix}.norm.weight"), &[width])?)?,
            ratio,
            width,
            overlap,
        })
    }
}

/// The bf16 bits of `v` when every value is exactly a bf16 (the round trip keeps its f32 bits).
fn exact_bf16(v: &[f32]) -> Option<Vec<u16>> {
    let bits: Vec<u16> = v.iter().map(|x| quant::f32_to_bf16(*x)).collect();
    bits.iter().zip(v).all(|(b, x)| quant::bf16_to_f32(*b).to_bits() == x.to_bits()).then_some(bits)
}

/// `v` as a bf16 matrix when every value is exactly a bf16 ([`exact_bf16`]), else as f32.
fn f32_or_exact_bf16(gpu: &Gpu, v: &[f32]) -> Result<GpuMatrix, CudaError> {
    match exact_bf16(v) {
        Some(bits) => Ok(GpuMatrix::Bf16(gpu.upload(&bits)?)),
        None => Ok(GpuMatrix::F32(gpu.upload(v)?)),
    }
}

struct GpuIndexer {
    wq_b: GpuWeight,
    /// `weights_proj` pre-multiplied by `heads^-1/2` (the CPU scales the product instead; the two
    /// differ by f32 rounding only). Stored as bf16 when every scaled value is exactly a bf16 (a
    /// bf16 checkpoint with a power-of-two scale, e.g. Flash's 64 heads: ×1/8), so that prefill runs
    /// it on the tensor-core linear like the other bf16 weights; else f32 (the f32 kernel).
    weights_proj: GpuWeight,
    compressor: GpuCompressor,
    heads: usize,
    head_dim: usize,
}

struct GpuLayer {
    kind: LayerKind,
    attn_norm: CudaSlice<f32>,
    wq_a: GpuWeight,
    q_norm: CudaSlice<f32>,
    wq_b: GpuWeight,
    wkv: GpuWeight,
    kv_norm: CudaSlice<f32>,
    /// `wo_a` per output group: `[o_lora_rank, H·c/g]` each (rows g·r.. of the stored matrix).
    wo_a: Vec<GpuWeight>,
    /// Device addresses of `wo_a`'s groups (one launch for all of them below 64 tokens).
    wo_a_table: Option<GpuGroupTable>,
    wo_b: GpuWeight,
    sinks: CudaSlice<f32>,
    compressor: Option<GpuCompressor>,
    indexer: Option<GpuIndexer>,
    hc_attn: GpuHcWeights,
    hc_ffn: GpuHcWeights,
    ffn_norm: CudaSlice<f32>,
    moe: GpuMoeLayer,
}

/// The model's weights on one GPU.
pub struct GpuModel {
    /// Config.
    pub config: Ds4Config,
    /// Embedding table `[vocab, d]` f32 on the device.
    embed: CudaSlice<f32>,
    layers: Vec<GpuLayer>,
    hc_head: GpuHcWeights,
    norm: CudaSlice<f32>,
    head: GpuWeight,
    rope_main: Rope,
    rope_compress: Rope,
    inv_main: CudaSlice<f32>,
    inv_compress: CudaSlice<f32>,
}

/// Splits a `[g·r, cols]` weight into `g` row blocks (any stored format; FP8 blocks are split on
/// 128-row boundaries, so `r` must be a multiple of 128 for FP8).
fn split_rows(gpu: &Gpu, w: GpuWeight, groups: usize) -> Result<Vec<GpuWeight>, CudaError> {
    let r = w.rows / groups;
    let cols = w.cols;
    let part = |data: GpuMatrix| GpuWeight { rows: r, cols, data };
    let sub = |src: &CudaSlice<u8>, a: usize, b: usize| -> Result<CudaSlice<u8>, CudaError> {
        let mut dst = gpu.zeros_owned::<u8>(b - a)?;
        drv("split", gpu.stream.memcpy_dtod(&src.slice(a..b), &mut dst))?;
        Ok(dst)
    };
    let mut out = Vec::with_capacity(groups);
    for g in 0..groups {
        let data = match &w.data {
            GpuMatrix::F32(m) => {
                let mut dst = gpu.zeros_owned::<f32>(r * cols)?;
                drv("split", gpu.stream.memcpy_dtod(&m.slice(g * r * cols..(g + 1) * r * cols), &mut dst))?;
                GpuMatrix::F32(dst)
            }
            GpuMatrix::Bf16(m) => {
                let mut dst = gpu.zeros_owned::<u16>(r * cols)?;
                drv("split", gpu.stream.memcpy_dtod(&m.slice(g * r * cols..(g + 1) * r * cols), &mut dst))?;
                GpuMatrix::Bf16(dst)
            }
            GpuMatrix::Fp8 { w: m, scales } => {
                if !r.is_multiple_of(128) {
                    return Err(CudaError::Unsupported { what: "wo_a split", detail: format!("FP8 group rows {r} not a multiple of 128") });
                }
                let sk = cols.div_ceil(128);
                GpuMatrix::Fp8 { w: sub(m, g * r * cols, (g + 1) * r * cols)?, scales: sub(scales, g * (r / 128) * sk, (g + 1) * (r / 128) * sk)? }
            }
            GpuMatrix::Fp4 { w: m, scales, fold } => {
                let sk = cols / 32;
                GpuMatrix::Fp4 { w: sub(m, g * r * cols / 2, (g + 1) * r * cols / 2)?, scales: sub(scales, g * r * sk, (g + 1) * r * sk)?, fold: *fold }
            }
        };
        out.push(part(data));
    }
    Ok(out)
}

impl GpuModel {
    /// Uploads a model whose tensors come from `src` (canonical names, spec §2); the embedding
    /// table is kept in f32 on the device (rows gathered per chunk by a kernel).
    pub fn upload_with(gpu: &Gpu, cfg: &Ds4Config, src: &dyn GpuSource) -> Result<Self, CudaError> {
        let c = cfg;
        let d = c.hidden_size;
        let n = c.hc_mult;
        let hcd = c.num_attention_heads * c.head_dim;
        let hc = |p: &str| -> Result<GpuHcWeights, CudaError> {
            let mix = (2 + n) * n;
            GpuHcWeights::from_host(gpu, &src.host(&format!("{p}_fn"), &[mix, n * d])?, &src.host(&format!("{p}_base"), &[mix])?, &src.host(&format!("{p}_scale"), &[3])?, n)
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (l, kind) in c.layer_kinds.iter().enumerate() {
            let p = format!("layers.{l}");
            let (compressor, indexer) = match *kind {
                LayerKind::Sliding => (None, None),
                LayerKind::Hca { ratio } => (Some(GpuCompressor::upload(gpu, src, &format!("{p}.attn.compressor"), c.head_dim, ratio, false, d)?), None),
                LayerKind::Csa { ratio } => {
                    let heads = c.index_n_heads;
                    let s = (heads as f64).powf(-0.5);
                    let wp: Vec<f32> = src.host(&format!("{p}.attn.indexer.weights_proj.weight"), &[heads, d])?.iter().map(|v| (*v as f64 * s) as f32).collect();
                    (
                        Some(GpuCompressor::upload(gpu, src, &format!("{p}.attn.compressor"), c.head_dim, ratio, true, d)?),
                        Some(GpuIndexer {
                            wq_b: src.matrix(gpu, &format!("{p}.attn.indexer.wq_b.weight"), heads * c.index_head_dim, c.q_lora_rank)?,
                            weights_proj: GpuWeight { rows: heads, cols: d, data: f32_or_exact_bf16(gpu, &wp)? },
                            compressor: GpuCompressor::upload(gpu, src, &format!("{p}.attn.indexer.compressor"), c.index_head_dim, ratio, true, d)?,
                            heads,
                            head_dim: c.index_head_dim,
                        }),
                    )
                }
            };
            let e = c.n_routed_experts;
            let router = match c.router_kinds[l] {
                flashseek_model::config::RouterKind::Hash => GpuRouter::Hash {
                    tid2eid: gpu.upload(&src.table(&format!("{p}.ffn.gate.tid2eid"), c.vocab_size, c.num_experts_per_tok)?.iter().map(|v| *v as i32).collect::<Vec<_>>())?,
                    vocab: c.vocab_size,
                },
                flashseek_model::config::RouterKind::Score => GpuRouter::Score { bias: gpu.upload(&src.host(&format!("{p}.ffn.gate.bias"), &[e])?)? },
            };
            let inter = c.moe_intermediate_size;
            let expert = |q: &str| -> Result<GpuExpert, CudaError> {
                Ok(GpuExpert {
                    w1: src.matrix(gpu, &format!("{q}.w1.weight"), inter, d)?,
                    w2: src.matrix(gpu, &format!("{q}.w2.weight"), d, inter)?,
                    w3: src.matrix(gpu, &format!("{q}.w3.weight"), inter, d)?,
                })
            };
            let wo_a = split_rows(gpu, src.matrix(gpu, &format!("{p}.attn.wo_a.weight"), c.o_groups * c.o_lora_rank, hcd / c.o_groups)?, c.o_groups)?;
            layers.push(GpuLayer {
                kind: *kind,
                attn_norm: gpu.upload(&src.host(&format!("{p}.attn_norm.weight"), &[d])?)?,
                wq_a: src.matrix(gpu, &format!("{p}.attn.wq_a.weight"), c.q_lora_rank, d)?,
                q_norm: gpu.upload(&src.host(&format!("{p}.attn.q_norm.weight"), &[c.q_lora_rank])?)?,
                wq_b: src.matrix(gpu, &format!("{p}.attn.wq_b.weight"), hcd, c.q_lora_rank)?,
                wkv: src.matrix(gpu, &format!("{p}.attn.wkv.weight"), c.head_dim, d)?,
                kv_norm: gpu.upload(&src.host(&format!("{p}.attn.kv_norm.weight"), &[c.head_dim])?)?,
                wo_a_table: GpuGroupTable::build(gpu, &wo_a)?,
                wo_a,
                wo_b: src.matrix(gpu, &format!("{p}.attn.wo_b.weight"), d, c.o_groups * c.o_lora_rank)?,
                sinks: gpu.upload(&src.host(&format!("{p}.attn.attn_sink"), &[c.num_attention_heads])?)?,
                compressor,
                indexer,
                hc_attn: hc(&format!("{p}.hc_attn"))?,
                hc_ffn: hc(&format!("{p}.hc_ffn"))?,
                ffn_norm: gpu.upload(&src.host(&format!("{p}.ffn_norm.weight"), &[d])?)?,
                moe: GpuMoeLayer {
                    gate: src.matrix(gpu, &format!("{p}.ffn.gate.weight"), e, d)?,
                    router,
                    shared: expert(&format!("{p}.ffn.shared_experts"))?,
                    experts: (0..e).map(|x| expert(&format!("{p}.ffn.experts.{x}"))).collect::<Result<_, _>>()?,
                    tables: std::sync::OnceLock::new(),
                },
            });
        }
        let rope_main = Rope::new(&c.rope_main, c.qk_rope_head_dim);
        let rope_compress = Rope::new(&c.rope_compress, c.qk_rope_head_dim);
        Ok(GpuModel {
            config: c.clone(),
            embed: gpu.upload(&src.host("embed.weight", &[c.vocab_size, d])?)?,
            layers,
            hc_head: GpuHcWeights::from_host(gpu, &src.host("hc_head_fn", &[n, n * d])?, &src.host("hc_head_base", &[n])?, &src.host("hc_head_scale", &[1])?, n)?,
            norm: gpu.upload(&src.host("norm.weight", &[d])?)?,
            head: src.matrix(gpu, "head.weight", c.vocab_size, d)?,
            inv_main: gpu.upload(rope_main.inv_freq())?,
            inv_compress: gpu.upload(rope_compress.inv_freq())?,
            rope_main,
            rope_compress,
        })
    }
}

/// A compressor's per-sequence state on the device (capacity fixed at creation).
struct GpuCompState {
    kv: CudaSlice<f32>,
    logit: CudaSlice<f32>,
    entries: CudaSlice<f32>,
    n_entries: usize,
}

struct GpuLayerState {
    kv: CudaSlice<f32>,
    comp: Option<GpuCompState>,
    idx: Option<GpuCompState>,
}

/// One sequence's state on the device, for up to `capacity` tokens.
pub struct GpuSequence {
    /// Tokens processed.
    pub pos: usize,
    /// Maximum tokens.
    pub capacity: usize,
    /// Earliest position a truncation may target (0 unless uploaded from a CPU state whose
    /// retention limit dropped older rows, [`GpuSequence::from_host`]).
    pub earliest: usize,
    layers: Vec<GpuLayerState>,
    /// The token of a captured decode step, `[n]` copies (the embedding gather reads all, hash
    /// routers the first), written before each such step is launched (allocated at first use).
    token: Option<CudaSlice<i32>>,
    /// The next decode step, captured ahead while the previous one ran ([`decode_step_gpu_dev`]).
    next: Option<PendingStep>,
}

/// A decode step captured ahead of its token ([`decode_step_gpu_dev`]).
struct PendingStep {
    captured: super::graph::Captured,
    /// Host marks it was captured from and leaves behind.
    before: HostMarks,
    after: HostMarks,
    /// Switch values at capture (a step captured under other values is not launched).
    switches: Vec<&'static str>,
    /// Its logits buffer `[vocab]`.
    logits: DevBuf<f32>,
}

impl GpuSequence {
    /// Allocates the state of a sequence of up to `capacity` tokens.
    pub fn new(gpu: &Gpu, m: &GpuModel, capacity: usize) -> Result<Self, CudaError> {
        let c = &m.config;
        let comp = |cw: &GpuCompressor| -> Result<GpuCompState, CudaError> {
            let out = if cw.overlap { 2 * cw.width } else { cw.width };
            Ok(GpuCompState {
                kv: gpu.zeros_owned(capacity * out)?,
                logit: gpu.zeros_owned(capacity * out)?,
                entries: gpu.zeros_owned((capacity / cw.ratio).max(1) * cw.width)?,
                n_entries: 0,
            })
        };
        let layers = m
            .layers
            .iter()
            .map(|l| {
                Ok(GpuLayerState {
                    kv: gpu.zeros_owned(capacity * c.head_dim)?,
                    comp: l.compressor.as_ref().map(comp).transpose()?,
                    idx: l.indexer.as_ref().map(|i| comp(&i.compressor)).transpose()?,
                })
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(GpuSequence { pos: 0, capacity, earliest: 0, layers, token: None, next: None })
    }

    /// Device bytes held by the state (allocated for the whole capacity).
    pub fn bytes(&self) -> usize {
        let comp = |c: &GpuCompState| (c.kv.len() + c.logit.len() + c.entries.len()) * 4;
        self.layers.iter().map(|l| l.kv.len() * 4 + l.comp.as_ref().map_or(0, comp) + l.idx.as_ref().map_or(0, comp)).sum()
    }

    /// Rewinds to `len` tokens (rows past it are ignored and overwritten later; entries that depend
    /// on dropped tokens are dropped).
    pub fn truncate(&mut self, m: &GpuModel, len: usize) -> Result<(), CudaError> {
        if len > self.pos {
            return Err(CudaError::Unsupported { what: "truncate", detail: format!("to {len} but the sequence has {} tokens", self.pos) });
        }
        if len < self.earliest {
            return Err(CudaError::Unsupported {
                what: "truncate",
                detail: format!("to {len}: the state was uploaded with rows from position {} only (its retention limit)", self.earliest),
            });
        }
        for (l, s) in m.layers.iter().zip(self.layers.iter_mut()) {
            if let (Some(cw), Some(cs)) = (&l.compressor, &mut s.comp) {
                cs.n_entries = cs.n_entries.min(len / cw.ratio);
            }
            if let (Some(iw), Some(is)) = (&l.indexer, &mut s.idx) {
                is.n_entries = is.n_entries.min(len / iw.compressor.ratio);
            }
        }
        self.pos = len;
        Ok(())
    }
}

impl GpuSequence {
    /// A device copy of the state (rows and entries of the first `pos` tokens), held in a sequence
    /// whose capacity is exactly `pos` (at least 1); [`GpuSequence::restore`] copies it back.
    /// Unlike [`GpuSequence::truncate`], a snapshot survives later tokens overwriting the rows
    /// after a truncation point (spec §5: the state is index-addressed rows plus entry counts).
    ///
    /// Errors: device allocation or copy failures.
    pub fn snapshot(&self, gpu: &Gpu, m: &GpuModel) -> Result<GpuSequence, CudaError> {
        let mut snap = GpuSequence::new(gpu, m, self.pos.max(1))?;
        copy_state(gpu, m, self, &mut snap)?;
        Ok(snap)
    }

    /// Makes this sequence equal to `snap` (from [`GpuSequence::snapshot`] of a sequence of the
    /// same model): its first `snap.pos` rows and entries are copied back; rows past them are
    /// ignored as after a truncation.
    ///
    /// Errors: `snap` longer than this sequence's capacity, or device copy failures.
    pub fn restore(&mut self, gpu: &Gpu, m: &GpuModel, snap: &GpuSequence) -> Result<(), CudaError> {
        copy_state(gpu, m, snap, self)
    }

    /// The state as the CPU reference holds it ([`SequenceState`] without a retention limit):
    /// every row of the first `pos` tokens and every emitted entry, downloaded.
    ///
    /// Errors: device copy failures.
    pub fn to_host(&self, gpu: &Gpu, m: &GpuModel) -> Result<SequenceState, CudaError> {
        let c = &m.config;
        let mut st = SequenceState::new(c, None);
        let pos = self.pos;
        let down = |buf: &CudaSlice<f32>, len: usize| gpu.download_range(buf, 0..len);
        for ((l, g), h) in m.layers.iter().zip(&self.layers).zip(st.layers.iter_mut()) {
            h.kv.extend(&down(&g.kv, pos * c.head_dim)?);
            let comps = [(l.compressor.as_ref(), &g.comp, &mut h.compressor), (l.indexer.as_ref().map(|i| &i.compressor), &g.idx, &mut h.indexer)];
            for (cw, gc, hc) in comps {
                if let (Some(cw), Some(gc), Some(hc)) = (cw, gc, hc) {
                    let out = cw.wkv.rows;
                    hc.kv.extend(&down(&gc.kv, pos * out)?);
                    hc.logit.extend(&down(&gc.logit, pos * out)?);
                    hc.entries = down(&gc.entries, gc.n_entries * cw.width)?;
                }
            }
        }
        st.pos = pos;
        Ok(st)
    }

    /// A device sequence of `capacity` tokens holding the CPU reference's state `st` (same model):
    /// rows are written at their absolute positions, so a state trimmed by a retention limit
    /// (rows before its base dropped) continues exactly as it would on the CPU.
    ///
    /// Errors: a state of another model shape (layer count, layer kinds, row widths, entry
    /// counts) or longer than `capacity`, each named; device failures.
    pub fn from_host(gpu: &Gpu, m: &GpuModel, st: &SequenceState, capacity: usize) -> Result<GpuSequence, CudaError> {
        let c = &m.config;
        let bad = |detail: String| CudaError::Unsupported { what: "state upload", detail };
        if st.pos > capacity {
            return Err(bad(format!("the state holds {} tokens, the sequence only room for {capacity}", st.pos)));
        }
        if st.layers.len() != m.layers.len() {
            return Err(bad(format!("the state has {} layers, the model {}", st.layers.len(), m.layers.len())));
        }
        let mut seq = GpuSequence::new(gpu, m, capacity)?;
        let up = |rows: &crate::state::Rows, width: usize, dst: &mut CudaSlice<f32>, what: String| -> Result<(), CudaError> {
            let data = rows.as_slice();
            if rows.end() != st.pos || !data.len().is_multiple_of(width.max(1)) {
                return Err(bad(format!("{what}: rows end at {} (expected {}), {} values for width {width}", rows.end(), st.pos, data.len())));
            }
            if !data.is_empty() {
                let mut view = dst.slice_mut(rows.base() * width..rows.end() * width);
                drv("state upload", gpu.stream.memcpy_htod(data, &mut view))?;
            }
            Ok(())
        };
        for (i, ((l, g), h)) in m.layers.iter().zip(seq.layers.iter_mut()).zip(&st.layers).enumerate() {
            up(&h.kv, c.head_dim, &mut g.kv, format!("layer {i} K=V"))?;
            let comps = [("compressor", l.compressor.as_ref(), &mut g.comp, &h.compressor), ("indexer", l.indexer.as_ref().map(|x| &x.compressor), &mut g.idx, &h.indexer)];
            for (name, cw, gc, hc) in comps {
                match (cw, gc, hc) {
                    (None, _, None) => {}
                    (Some(cw), Some(gc), Some(hc)) => {
                        let out = cw.wkv.rows;
                        let n = st.pos / cw.ratio;
                        if hc.ratio != cw.ratio || hc.width != cw.width || hc.entries.len() != n * cw.width {
                            return Err(bad(format!(
                                "layer {i} {name}: ratio {} width {} with {} entry values (expected ratio {} width {} and {} entries)",
                                hc.ratio,
                                hc.width,
                                hc.entries.len(),
                                cw.ratio,
                                cw.width,
                                n
                            )));
                        }
                        up(&hc.kv, out, &mut gc.kv, format!("layer {i} {name} kv"))?;
                        up(&hc.logit, out, &mut gc.logit, format!("layer {i} {name} logits"))?;
                        if n > 0 {
                            let mut view = gc.entries.slice_mut(0..n * cw.width);
                            drv("state upload", gpu.stream.memcpy_htod(&hc.entries, &mut view))?;
                        }
                        gc.n_entries = n;
                    }
                    _ => return Err(bad(format!("layer {i}: the state's {name} does not match the model's layer kind {:?}", l.kind))),
                }
            }
        }
        seq.pos = st.pos;
        seq.earliest = st.earliest();
        Ok(seq)
    }
}

/// Copies `src`'s first `src.pos` tokens of state into `dst` (same model) and sets its length.
fn copy_state(gpu: &Gpu, m: &GpuModel, src: &GpuSequence, dst: &mut GpuSequence) -> Result<(), CudaError> {
    if src.pos > dst.capacity {
        return Err(CudaError::Unsupported { what: "restore", detail: format!("a state of {} tokens into a sequence of capacity {}", src.pos, dst.capacity) });
    }
    let hd = m.config.head_dim;
    for (l, (s, d)) in m.layers.iter().zip(src.layers.iter().zip(dst.layers.iter_mut())) {
        copy_into(gpu, &s.kv, src.pos * hd, &mut d.kv, 0)?;
        let comps = [(l.compressor.as_ref(), &s.comp, &mut d.comp), (l.indexer.as_ref().map(|i| &i.compressor), &s.idx, &mut d.idx)];
        for (cw, sc, dc) in comps {
            if let (Some(cw), Some(sc), Some(dc)) = (cw, sc, dc) {
                let out = cw.wkv.rows;
                copy_into(gpu, &sc.kv, src.pos * out, &mut dc.kv, 0)?;
                copy_into(gpu, &sc.logit, src.pos * out, &mut dc.logit, 0)?;
                copy_into(gpu, &sc.entries, sc.n_entries * cw.width, &mut dc.entries, 0)?;
                dc.n_entries = sc.n_entries;
            }
        }
    }
    dst.pos = src.pos;
    dst.earliest = src.earliest;
    Ok(())
}

/// Copies `src` (`len` values) into `dst` starting at element `at`.
fn copy_into(gpu: &Gpu, src: &CudaSlice<f32>, len: usize, dst: &mut CudaSlice<f32>, at: usize) -> Result<(), CudaError> {
    if len == 0 {
        return Ok(());
    }
    let mut view = dst.slice_mut(at..at + len);
    drv("copy", gpu.stream.memcpy_dtod(&src.slice(0..len), &mut view))
}

/// The host side of a [`GpuSequence`]: what a forward changes outside device memory (the position
/// and each compressor's entry count). A captured decode step that has to be abandoned restores it
/// (its device work never ran).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMarks {
    pos: usize,
    entries: Vec<(usize, usize)>,
}

impl GpuSequence {
    /// Drops the decode step captured ahead, if any, returning its executable graph and staging
    /// arena to `gpu`'s kept lists (dropping the sequence would destroy them instead).
    pub fn discard_pending(&mut self, gpu: &Gpu) {
        if let Some(p) = self.next.take() {
            gpu.graph.discard(p.captured);
        }
    }

    /// The host-side counters now.
    pub fn marks(&self) -> HostMarks {
        let n = |c: &Option<GpuCompState>| c.as_ref().map_or(0, |c| c.n_entries);
        HostMarks { pos: self.pos, entries: self.layers.iter().map(|l| (n(&l.comp), n(&l.idx))).collect() }
    }

    /// Puts back counters taken by [`GpuSequence::marks`] on this sequence.
    pub fn set_marks(&mut self, m: &HostMarks) {
        self.pos = m.pos;
        for (l, &(a, b)) in self.layers.iter_mut().zip(&m.entries) {
            if let Some(c) = &mut l.comp {
                c.n_entries = a;
            }
            if let Some(c) = &mut l.idx {
                c.n_entries = b;
            }
        }
    }
}

/// Whether decode steps run as CUDA graphs ([`super::graph`]): the switch `DECODE_CUDA_GRAPH`, with
/// `MOE_GROUPED` and `MOE_GROUPED_DECODE` on (the per-expert MoE synchronises with the host every
/// layer, which a graph cannot hold), not while profiling stages (their events would be recorded
/// into the graph), and not after a capture on this device had to be abandoned.
pub fn decode_graphs_enabled(gpu: &Gpu) -> bool {
    crate::switches::on("DECODE_CUDA_GRAPH")
        && crate::switches::on("MOE_GROUPED")
        && crate::switches::on("MOE_GROUPED_DECODE")
        && !gpu.profiling()
        && gpu.graph.broken().is_none()
}

/// Whether every MoE layer of `m` runs grouped on the device at decode sizes (expert tables
/// built, FP8-capable under `TC_LINEAR=fp8`): otherwise a decode step synchronises with the host
/// and cannot be a graph. Builds the tables (weights uploads) if needed, so call it outside a
/// capture.
///
/// Errors: table uploads failing.
pub fn moe_graph_capable(gpu: &Gpu, m: &GpuModel) -> Result<bool, CudaError> {
    let official = super::gpu::tc_linear_mode() == super::gpu::TcMode::Fp8;
    for l in &m.layers {
        match gpu.moe_tables(&l.moe)? {
            Some(t) if !official || t.q8 => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

fn switch_values() -> Vec<&'static str> {
    crate::switches::SWITCHES.iter().map(|s| crate::switches::value(s.name)).collect()
}

/// One decode step: token `id` appended to `seq`, its logits `[vocab]` left on the device.
///
/// With [`decode_graphs_enabled`] (and [`moe_graph_capable`]) the steps run as CUDA graphs, each
/// captured one step ahead: after launching step N this records step N+1 (its token read from a
/// device buffer written just before its launch) while step N runs on the GPU, so the host's
/// capture time overlaps the device's work. A step captured ahead is launched only if the
/// sequence's host marks and the switches are still those it was captured from (otherwise it is
/// dropped and the step captured afresh). Same kernels, same arguments, same results as
/// [`forward_chunk_gpu_dev`]. A capture that fails is abandoned without running anything and the
/// step runs without a graph; when the cause is structural (some op needed the host mid-step, or
/// the driver refused the capture) graphs are turned off for the device (said once).
///
/// Errors: as [`forward_chunk_gpu`].
pub fn decode_step_gpu_dev(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence, id: u32) -> Result<DevBuf<f32>, CudaError> {
    let none = || CudaError::Unsupported { what: "decode", detail: "the forward returned no logits".into() };
    crate::forward::check_ids(&[id], m.config.vocab_size).map_err(|e| CudaError::Unsupported { what: "forward", detail: e.to_string() })?;
    let graphs = decode_graphs_enabled(gpu) && moe_graph_capable(gpu, m)?;
    let pending = seq.next.take();
    if !graphs || seq.pos >= seq.capacity {
        if let Some(p) = pending {
            gpu.graph.discard(p.captured);
        }
        return forward_chunk_gpu_dev(gpu, m, seq, &[id], LogitsFor::Last, false)?.0.ok_or_else(none);
    }
    let n = m.config.hc_mult;
    if seq.token.is_none() {
        seq.token = Some(gpu.zeros_owned::<i32>(n)?);
    }
    if let Some(tok) = seq.token.as_mut() {
        drv("token upload", gpu.stream.memcpy_htod(&vec![id as i32; n], tok))?;
    }
    let step = match pending {
        Some(p) if p.before == seq.marks() && p.switches == switch_values() => p,
        other => {
            if let Some(p) = other {
                gpu.graph.discard(p.captured);
            }
            match capture_step(gpu, m, seq)? {
                Some(p) => p,
                None => return forward_chunk_gpu_dev(gpu, m, seq, &[id], LogitsFor::Last, false)?.0.ok_or_else(none),
            }
        }
    };
    gpu.graph.launch(&gpu.stream, step.captured)?;
    seq.set_marks(&step.after);
    // The graph's logits block belongs to the graph pool, which a step captured earlier for
    // another sequence may still use as scratch when it runs: hand the caller its own copy
    // (queued right behind the graph; the block goes back to the pool).
    let mut logits = gpu.zeros::<f32>(step.logits.len())?;
    drv("logits copy", gpu.stream.memcpy_dtod(&*step.logits, &mut *logits))?;
    // Record the next step while this one runs.
    if seq.pos < seq.capacity && decode_graphs_enabled(gpu) {
        seq.next = capture_step(gpu, m, seq)?;
    }
    Ok(logits)
}

/// Captures the decode step at `seq`'s position (token from `seq.token`), leaving the host marks
/// as they were; `None` when the capture had to be abandoned (graphs then off for the device if
/// the cause is structural, see the match below).
///
/// Errors: none beyond those turned into `None` (kept as a `Result` for allocation failures of the
/// token buffer).
fn capture_step(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence) -> Result<Option<PendingStep>, CudaError> {
    let Some(tok) = seq.token.take() else { return Ok(None) };
    let before = seq.marks();
    let switches = switch_values();
    let r = gpu.graph.capture(&gpu.stream, || forward_tokens(gpu, m, seq, Tokens::Device(&tok), LogitsFor::Last, false));
    let after = seq.marks();
    seq.set_marks(&before);
    seq.token = Some(tok);
    match r {
        Ok(((Some(logits), _), captured)) => Ok(Some(PendingStep { captured, before, after, switches, logits })),
        Ok(((None, _), captured)) => {
            gpu.graph.discard(captured);
            Ok(None)
        }
        Err(e) if structural_capture_failure(&e) => {
            gpu.graph.mark_broken(e.to_string());
            Ok(None)
        }
        // Anything else (memory for the pool, the staging or a new executable): this step runs
        // without a graph, later ones try again.
        Err(e) => {
            gpu.graph.note_failure(e.to_string());
            Ok(None)
        }
    }
}

/// Whether a capture failed in a way every later step would repeat: some op of the step needs the
/// host (a download or sync, refused by [`Gpu`] while capturing) or the driver refuses to begin or
/// end the capture.
fn structural_capture_failure(e: &CudaError) -> bool {
    match e {
        CudaError::Unsupported { what, .. } => *what == "CUDA graph capture",
        CudaError::Driver { what, .. } => what == "beginning a capture" || what == "ending a capture",
        _ => false,
    }
}

/// [`decode_step_gpu_dev`] with the logits copied to the host.
///
/// Errors: as [`forward_chunk_gpu`].
pub fn decode_step_gpu(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence, id: u32) -> Result<Vec<f32>, CudaError> {
    let lg = decode_step_gpu_dev(gpu, m, seq, id)?;
    gpu.download(&lg)
}

/// The `wq_b` output of a layer: f32, or bf16 bits (`WQ_B_BF16_OUT`).
enum WqBOut {
    F32(DevBuf<f32>),
    Bf16(DevBuf<u16>),
}

/// One compressor's projections of a chunk (spec §4.8 / §4.9 step 1): `kv` and `lg` (the gate
/// logits), `[t, rows of wkv]` f32 each.
struct CompProjections {
    kv: DevBuf<f32>,
    lg: DevBuf<f32>,
}

impl CompProjections {
    /// Uninitialised buffers for `t` tokens of `cw`'s projections.
    ///
    /// # Safety
    /// The caller writes every value (the linear of `cw.wkv` into `kv`, of `cw.wgate` into `lg`)
    /// before anything reads them.
    ///
    /// Errors: allocation failures.
    unsafe fn alloc(gpu: &Gpu, cw: &GpuCompressor, t: usize) -> Result<Self, CudaError> {
        let out = cw.wkv.rows;
        // SAFETY (both): forwarded to the caller.
        Ok(CompProjections { kv: unsafe { gpu.scratch::<f32>(t * out) }?, lg: unsafe { gpu.scratch::<f32>(t * out) }? })
    }
}

/// The rest of a compressor's chunk (spec §4.8 / §4.9 steps 2–4) from its projections `p`: the
/// position bias added to the logits, both appended to the state `cs` at pos0, and the entries
/// completed by the chunk pooled, normed and rotated into `cs.entries`.
///
/// Errors: any op error.
fn compress_pool(gpu: &Gpu, m: &GpuModel, cw: &GpuCompressor, cs: &mut GpuCompState, mut p: CompProjections, t: usize, pos0: usize) -> Result<(), CudaError> {
    let out = cw.wkv.rows;
    gpu.add_position_bias(&mut p.lg, &cw.ape, t, cw.ratio, pos0)?;
    copy_into(gpu, &p.kv, t * out, &mut cs.kv, pos0 * out)?;
    copy_into(gpu, &p.lg, t * out, &mut cs.logit, pos0 * out)?;
    complete_entries(gpu, m, cw, cs, pos0 + t)
}

/// Spec §4.8 / §4.9 steps 2–4 for the entries the state `cs` completes once it holds the
/// projections of positions before `end`: pooled, normed and rotated into `cs.entries`.
///
/// Errors: any op error.
fn complete_entries(gpu: &Gpu, m: &GpuModel, cw: &GpuCompressor, cs: &mut GpuCompState, end: usize) -> Result<(), CudaError> {
    let complete = end / cw.ratio;
    if complete > cs.n_entries {
        let n = complete - cs.n_entries;
        // SAFETY: compress_entries writes all n·width values (its RMSNorm writes every row).
        let mut tmp = unsafe { gpu.scratch::<f32>(n * cw.width) }?;
        let shape = PoolShape { ratio: cw.ratio, width: cw.width, overlap: cw.overlap, row_base: 0, e0: cs.n_entries, n_entries: n };
        gpu.compress_entries(&cs.kv, &cs.logit, &cw.norm, m.config.rms_norm_eps as f32, &m.inv_compress, &m.rope_compress, &shape, &mut tmp)?;
        copy_into(gpu, &tmp, n * cw.width, &mut cs.entries, cs.n_entries * cw.width)?;
        cs.n_entries = complete;
    }
    Ok(())
}

/// Output of [`forward_chunk_gpu`].
pub struct GpuForwardOutput {
    /// Logits `[T', vocab]` for the selected positions (host copy).
    pub logits: Vec<f32>,
    /// With `record_streams`: per layer, the output streams `[T, n, d]` (host copies).
    pub layer_streams: Vec<Vec<f32>>,
}

/// Processes `ids` as the next tokens of `seq` on the GPU (spec §4), layer-major over the chunk, as
/// `forward::forward_chunk` does on the CPU (exact numerics: no official simulations).
///
/// Errors: a token id outside the vocabulary, a chunk past the sequence's capacity, or any op error.
pub fn forward_chunk_gpu(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence, ids: &[u32], logits_for: LogitsFor, record_streams: bool) -> Result<GpuForwardOutput, CudaError> {
    let (lg, layer_streams) = forward_chunk_gpu_dev(gpu, m, seq, ids, logits_for, record_streams)?;
    let logits = match lg {
        Some(lg) => gpu.download(&lg)?,
        None => Vec::new(),
    };
    Ok(GpuForwardOutput { logits, layer_streams })
}

/// Output of [`forward_chunk_gpu_dev`]: the device logits (if any rows were selected) and the recorded streams.
pub type DeviceForwardOutput = (Option<DevBuf<f32>>, Vec<Vec<f32>>);

/// [`forward_chunk_gpu`] leaving the logits on the device: `[T', vocab]` f32 for the positions
/// `logits_for` selects (`None` when it selects none), plus the recorded streams.
///
/// Errors: as [`forward_chunk_gpu`].
pub fn forward_chunk_gpu_dev(
    gpu: &Gpu,
    m: &GpuModel,
    seq: &mut GpuSequence,
    ids: &[u32],
    logits_for: LogitsFor,
    record_streams: bool,
) -> Result<DeviceForwardOutput, CudaError> {
    crate::forward::check_ids(ids, m.config.vocab_size).map_err(|e| CudaError::Unsupported { what: "forward", detail: e.to_string() })?;
    forward_tokens(gpu, m, seq, Tokens::Host(ids), logits_for, record_streams)
}

/// The residual streams of a forward, `[T, n, d]` (spec §4.1): f32 (the exact path) or bf16 bits
/// (`MHC_BF16_STREAMS`, which acts with `MHC_FUSED`'s kernels only); the mHC ops run on either
/// through `on_streams!`.
enum Streams {
    F32(DevBuf<f32>),
    Bf16(DevBuf<u16>),
}

/// `$body` with `$s` bound to the streams' device buffer, whichever element type they hold (the
/// [`Gpu`] mHC ops are generic over [`super::ops_mhc::HcStream`]).
macro_rules! on_streams {
    ($x:expr, $s:ident => $body:expr) => {
        match $x {
            Streams::F32($s) => $body,
            Streams::Bf16($s) => $body,
        }
    };
}

impl Streams {
    /// The post of a sub-block (with `post`) and the next pre's mix partials ([`Gpu::hc_post_mix`]);
    /// bf16 streams with `mix_tc` (`MHC_MIX_TC`) take [`Gpu::hc_post_mix_tc`], the same stored bits
    /// with the mix on tensor cores, where `next` has its fragments (not for a Φ with values of
    /// 3·10^38 or more, which bf16 planes cannot hold).
    #[allow(clippy::too_many_arguments)]
    fn post_mix(&mut self, gpu: &Gpu, post: Option<(&CudaSlice<f32>, &super::ops_mhc::HcPostCoefs)>, next: &super::ops_mhc::GpuHcWeights, t: usize, n: usize, d: usize, mix_tc: bool) -> Result<super::ops_mhc::HcMixPartials, CudaError> {
        match self {
            Streams::F32(x) => gpu.hc_post_mix(x, post, next, t, n, d),
            Streams::Bf16(x) if mix_tc && next.has_mix_fragments() => gpu.hc_post_mix_tc(x, post, next, t, n, d),
            Streams::Bf16(x) => gpu.hc_post_mix(x, post, next, t, n, d),
        }
    }

    /// The f32 streams, for the unfused pre (`MHC_FUSED=off`, under which bf16 streams are never made).
    fn f32(&self) -> Result<&CudaSlice<f32>, CudaError> {
        match self {
            Streams::F32(x) => Ok(x),
            Streams::Bf16(_) => Err(CudaError::Unsupported { what: "forward", detail: "MHC_BF16_STREAMS without MHC_FUSED's kernels".into() }),
        }
    }

    /// Tokens `first .. first + rows` of the streams as a new f32 buffer `[rows, n, d]` (a copy, or
    /// the bf16 values widened): what the head and recorded streams read.
    fn rows_f32(&self, gpu: &Gpu, first: usize, rows: usize, n: usize, d: usize) -> Result<DevBuf<f32>, CudaError> {
        let range = first * n * d..(first + rows) * n * d;
        let mut xs = gpu.zeros::<f32>(rows * n * d)?;
        match self {
            Streams::F32(x) => {
                let mut view = xs.slice_mut(0..rows * n * d);
                drv("copy", gpu.stream.memcpy_dtod(&x.slice(range), &mut view))?;
            }
            Streams::Bf16(x) => gpu.hc_widen_bf16(&x.slice(range), &mut xs)?,
        }
        Ok(xs)
    }
}

/// Where a forward's token ids come from.
enum Tokens<'a> {
    /// Ids on the host (checked against the vocabulary by the caller), uploaded by the forward.
    Host(&'a [u32]),
    /// One token already on the device: `[n]` copies of its id (a captured decode step whose
    /// token is written just before its launch).
    Device(&'a CudaSlice<i32>),
}

/// [`forward_chunk_gpu_dev`] for either token source.
fn forward_tokens(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence, tokens: Tokens<'_>, logits_for: LogitsFor, record_streams: bool) -> Result<DeviceForwardOutput, CudaError> {
    let c = &m.config;
    let t = match tokens {
        Tokens::Host(ids) => ids.len(),
        Tokens::Device(_) => 1,
    };
    let (d, n, hd, h) = (c.hidden_size, c.hc_mult, c.head_dim, c.num_attention_heads);
    let pos0 = seq.pos;
    if pos0 + t > seq.capacity {
        return Err(CudaError::Unsupported { what: "forward", detail: format!("{} tokens exceed the sequence capacity {}", pos0 + t, seq.capacity) });
    }
    let eps = c.rms_norm_eps as f32;
    // §4.1: the embedding row of each token into each of its n streams (gather on the device).
    gpu.stage("embed");
    let uploaded;
    let (rows, ids_dev): (&CudaSlice<i32>, &CudaSlice<i32>) = match tokens {
        Tokens::Host(ids) => {
            let rows: Vec<i32> = ids.iter().flat_map(|id| std::iter::repeat_n(*id as i32, n)).collect();
            uploaded = (gpu.stage_upload(&rows)?, gpu.stage_upload(&ids.iter().map(|v| *v as i32).collect::<Vec<_>>())?);
            (&uploaded.0, &uploaded.1)
        }
        Tokens::Device(tok) => {
            if tok.len() < n {
                return Err(CudaError::Unsupported { what: "forward", detail: format!("a device token buffer of {} ids for {n} streams", tok.len()) });
            }
            (tok, tok)
        }
    };
    // MHC_FUSED: each pre's mix partials come from the post before it (the first from the embedded
    // streams), and the pre's finish writes the sub-block's normed input directly.
    let fused_mhc = crate::switches::on("MHC_FUSED") && d <= super::ops_mhc::HC_NORM_MAX_D;
    // MHC_BF16_STREAMS (with MHC_FUSED's kernels): the streams stored as bf16 between sub-blocks.
    let mut x = if fused_mhc && crate::switches::on("MHC_BF16_STREAMS") {
        let mut xb = gpu.zeros::<u16>(t * n * d)?;
        gpu.hc_gather_bf16(&m.embed, c.vocab_size, &rows.slice(0..t * n), &mut xb, d)?;
        Streams::Bf16(xb)
    } else {
        let mut xf = gpu.zeros::<f32>(t * n * d)?;
        gpu.gather_rows(&m.embed, c.vocab_size, &rows.slice(0..t * n), &mut xf, d)?;
        Streams::F32(xf)
    };
    // MHC_MIX_TC (bf16 streams only): the next pre's mix on tensor cores.
    let mix_tc = crate::switches::on("MHC_MIX_TC") && d.is_multiple_of(8);
    let mut layer_streams = Vec::new();
    let mut mix = match (fused_mhc, m.layers.first()) {
        (true, Some(l0)) => Some(x.post_mix(gpu, None, &l0.hc_attn, t, n, d, mix_tc)?),
        _ => None,
    };
    // u (the pre's output before its RMSNorm) only without MHC_FUSED.
    let mut u = if fused_mhc { None } else { Some(gpu.zeros::<f32>(t * d)?) };
    let mut post = gpu.zeros::<f32>(t * n)?;
    let mut comb = gpu.zeros::<f32>(t * n * n)?;
    // MHC_FUSED: the last fused pre's coefficients as doubles, for the post of its sub-block.
    let mut coefs = None;
    let no_coefs = || CudaError::Unsupported { what: "forward", detail: "MHC_FUSED: no coefficients for a post".into() };
    for (li, (l, s)) in m.layers.iter().zip(seq.layers.iter_mut()).enumerate() {
        let (rope, inv) = if l.kind.uses_compress_rope() { (&m.rope_compress, &m.inv_compress) } else { (&m.rope_main, &m.inv_main) };
        // Attention sub-block (§4.2, §4.5–§4.7).
        gpu.stage("mhc+norms");
        // SAFETY: written by the RMSNorm below or by hc_pre_norm (as each temporary marked so: the
        // op after it writes all of its T rows).
        let mut a = unsafe { gpu.scratch::<f32>(t * d) }?;
        match mix.take() {
            Some(p) => coefs = Some(on_streams!(&x, s => gpu.hc_pre_norm(&l.hc_attn, &p, s, Some(&l.attn_norm), &mut a, &mut post, &mut comb, t, n, d, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps, eps))?),
            None => {
                let u = u.as_mut().ok_or_else(|| CudaError::Unsupported { what: "forward", detail: "MHC_FUSED: no partials for a pre".into() })?;
                gpu.hc_pre(&l.hc_attn, x.f32()?, u, &mut post, &mut comb, t, n, d, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps)?;
                gpu.rms_norm(u, Some(&l.attn_norm), &mut a, t, d, eps)?;
            }
        }
        gpu.stage("projections");
        // SAFETY (qr0, kv0): written by the linears below.
        let mut qr0 = unsafe { gpu.scratch::<f32>(t * c.q_lora_rank) }?;
        let mut kv0 = unsafe { gpu.scratch::<f32>(t * hd) }?;
        gpu.linear_q_multi(&a, t, &mut [(&l.wq_a, &mut qr0), (&l.wkv, &mut kv0)])?;
        // SAFETY: written by the RMSNorm below.
        let mut qr = unsafe { gpu.scratch::<f32>(t * c.q_lora_rank) }?;
        gpu.rms_norm(&qr0, Some(&l.q_norm), &mut qr, t, c.q_lora_rank, eps)?;
        // The per-head q RMSNorm + RoPE (§4.6): its own pass, or (MLA_FUSED_Q_NORM) done by the
        // streaming attention kernel while it stages Q, the same bits; with WQ_B_BF16_OUT (official
        // numerics) the kernel reads wq_b's output as bf16, as DeepSeek's fp8_gemm writes it.
        let kernel = AttentionKernel::from_switches(h, hd, gpu.attention_bf16_ok(), gpu.attention_cand_split_ok());
        let fused_q = kernel != AttentionKernel::Exact && crate::switches::on("MLA_FUSED_Q_NORM");
        let wq_b_bf16 = fused_q && super::gpu::tc_linear_mode() == super::gpu::TcMode::Fp8 && crate::switches::on("WQ_B_BF16_OUT");
        let q0 = if wq_b_bf16 {
            // SAFETY: written by the linear below.
            let mut q0 = unsafe { gpu.scratch::<u16>(t * h * hd) }?;
            gpu.linear_official_bf16(&qr, &l.wq_b, &mut q0, t)?;
            WqBOut::Bf16(q0)
        } else {
            // SAFETY: written by the linear below.
            let mut q0 = unsafe { gpu.scratch::<f32>(t * h * hd) }?;
            gpu.linear_q(&qr, &l.wq_b, &mut q0, t)?;
            WqBOut::F32(q0)
        };
        let q = match (&q0, fused_q) {
            (WqBOut::F32(q0), false) => {
                // SAFETY: written by the per-head RMSNorm + RoPE below.
                let mut q = unsafe { gpu.scratch::<f32>(t * h * hd) }?;
                gpu.rms_norm_rope(q0, None, &mut q, t, h, hd, eps, inv, rope, pos0)?;
                Some(q)
            }
            _ => None,
        };
        let query = match (&q, &q0) {
            (Some(q), _) => AttentionQuery::Normed(q),
            (None, WqBOut::F32(q0)) => AttentionQuery::Raw { q: q0, eps },
            (None, WqBOut::Bf16(q0)) => AttentionQuery::RawBf16 { q: q0, eps },
        };
        // SAFETY: written by the RMSNorm + RoPE below.
        let mut kv = unsafe { gpu.scratch::<f32>(t * hd) }?;
        gpu.rms_norm_rope(&kv0, Some(&l.kv_norm), &mut kv, t, 1, hd, eps, inv, rope, pos0)?;
        copy_into(gpu, &kv, t * hd, &mut s.kv, pos0 * hd)?;
        // The CSA indexer's compressor projections and weights_proj output, computed with the main
        // compressor's from one conversion of `a` (Gpu::linear_multi: the same bits as one linear
        // each; three conversions of the [t, d] input were two too many; a weights_proj stored as
        // f32 runs on its own).
        // With COMPRESSOR_FUSED_DECODE below 64 tokens all of them in one launch that appends the
        // projections to the compressor states (biased logits included): `None` projections below.
        let mut idx_pre: Option<(Option<CompProjections>, DevBuf<f32>)> = None;
        if let (Some(cw), Some(cs)) = (&l.compressor, &mut s.comp) {
            gpu.stage("compressors");
            let csa = match (&l.indexer, l.kind, &mut s.idx) {
                (Some(iw), LayerKind::Csa { .. }, Some(is)) => Some((iw, is)),
                _ => None,
            };
            let mut ws = vec![&cw.wkv, &cw.wgate];
            if let Some((iw, _)) = &csa {
                ws.extend([&iw.compressor.wkv, &iw.compressor.wgate, &iw.weights_proj]);
            }
            if crate::switches::on("COMPRESSOR_FUSED_DECODE") && Gpu::linear_multi_into_takes(t, ws) {
                let at = pos0 * cw.wkv.rows;
                let mut outs = vec![
                    MultiOut { w: &cw.wkv, y: &mut cs.kv, at, bias: None },
                    MultiOut { w: &cw.wgate, y: &mut cs.logit, at, bias: Some((&cw.ape, cw.ratio)) },
                ];
                // SAFETY: written by the launch below (weights_proj's output).
                let mut wts = match &csa {
                    Some((iw, _)) => Some(unsafe { gpu.scratch::<f32>(t * iw.heads) }?),
                    None => None,
                };
                if let (Some((iw, is)), Some(wts)) = (csa, wts.as_mut()) {
                    let (ic, iat) = (&iw.compressor, pos0 * iw.compressor.wkv.rows);
                    outs.push(MultiOut { w: &ic.wkv, y: &mut is.kv, at: iat, bias: None });
                    outs.push(MultiOut { w: &ic.wgate, y: &mut is.logit, at: iat, bias: Some((&ic.ape, ic.ratio)) });
                    outs.push(MultiOut { w: &iw.weights_proj, y: wts, at: 0, bias: None });
                }
                gpu.linear_multi_into(&a, t, &mut outs, pos0)?;
                drop(outs);
                idx_pre = wts.map(|w| (None, w));
                complete_entries(gpu, m, cw, cs, pos0 + t)?;
            } else {
                // COMPRESSOR_BF16: the projections on the input rounded to bf16 alone (HF's and
                // vLLM's model-dtype compressor) instead of its split planes (OFF-M's fp32).
                let hi_only = crate::switches::on("COMPRESSOR_BF16");
                // SAFETY: both written by the linear below.
                let mut p = unsafe { CompProjections::alloc(gpu, cw, t) }?;
                match csa {
                    Some((iw, _)) => {
                        // SAFETY (ip, wts): written by the linears below.
                        let mut ip = unsafe { CompProjections::alloc(gpu, &iw.compressor, t) }?;
                        let mut wts = unsafe { gpu.scratch::<f32>(t * iw.heads) }?;
                        let ic = &iw.compressor;
                        gpu.linear_multi_planes(&a, t, &mut [(&cw.wkv, &mut p.kv), (&cw.wgate, &mut p.lg), (&ic.wkv, &mut ip.kv), (&ic.wgate, &mut ip.lg), (&iw.weights_proj, &mut wts)], hi_only)?;
                        idx_pre = Some((Some(ip), wts));
                    }
                    None => gpu.linear_multi_planes(&a, t, &mut [(&cw.wkv, &mut p.kv), (&cw.wgate, &mut p.lg)], hi_only)?,
                }
                compress_pool(gpu, m, cw, cs, p, t, pos0)?;
            }
        }
        gpu.stage("attention");
        let shape = AttentionShape { tokens: t, heads: h, head_dim: hd, pos0, window: c.sliding_window, kv_base: 0 };
        // The compressed candidates: (CSR offsets, entry lists or None for identity, mask path).
        type Lists = (DevBuf<i32>, Option<DevBuf<i32>>, Option<DevBuf<u8>>);
        let lists: Option<Lists> = match (l.kind, &l.compressor, &s.comp) {
            (LayerKind::Sliding, _, _) => None,
            (LayerKind::Hca { ratio }, Some(_), Some(cs)) => Some((gpu.stage_upload(&hca_offsets(pos0, t, ratio, cs.n_entries)?)?, None, None)),
            (LayerKind::Csa { ratio }, Some(_), Some(cs)) => {
                let (iw, is) = match (&l.indexer, &mut s.idx) {
                    (Some(iw), Some(is)) => (iw, is),
                    _ => return Err(CudaError::Unsupported { what: "forward", detail: "CSA layer without an indexer".into() }),
                };
                gpu.stage("compressors");
                let (ip, wts) = idx_pre.take().ok_or_else(|| CudaError::Unsupported { what: "forward", detail: "CSA layer: no indexer projections".into() })?;
                match ip {
                    Some(ip) => compress_pool(gpu, m, &iw.compressor, is, ip, t, pos0)?,
                    // COMPRESSOR_FUSED_DECODE appended them already.
                    None => complete_entries(gpu, m, &iw.compressor, is, pos0 + t)?,
                }
                gpu.stage("indexer");
                // SAFETY: written by the linear below.
                let mut iq = unsafe { gpu.scratch::<f32>(t * iw.heads * iw.head_dim) }?;
                gpu.linear_q(&qr, &iw.wq_b, &mut iq, t)?;
                gpu.rope(&mut iq, &m.inv_compress, &m.rope_compress, t, iw.heads, iw.head_dim, pos0, false)?;
                let ishape = IndexerShape { tokens: t, heads: iw.heads, head_dim: iw.head_dim, n_entries: is.n_entries, ratio, pos0 };
                let offs = topk_offsets(pos0, t, ratio, is.n_entries, c.index_topk)?;
                let total = *offs.last().unwrap_or(&0) as usize;
                let offsets = gpu.stage_upload(&offs)?;
                let mut idx = gpu.zeros::<i32>(total.max(1))?;
                gpu.indexer_select(&iq, &is.entries, &wts, &offsets, &mut idx, &ishape, c.index_topk)?;
                gpu.stage("attention");
                if crate::switches::on("DIRECT_INDEXER_TOPK") {
                    Some((offsets, Some(idx), None))
                } else {
                    // The mask path (issue 6 §2): a [T, entries] byte mask, attention over the
                    // visible entries it marks (same candidates, same order, same bits).
                    let mask = gpu.topk_mask(&offsets, &idx, t, cs.entries.len() / hd)?;
                    Some((gpu.stage_upload(&hca_offsets(pos0, t, ratio, is.n_entries)?)?, None, Some(mask)))
                }
            }
            _ => return Err(CudaError::Unsupported { what: "forward", detail: "compressed layer without a compressor".into() }),
        };
        let keys = match (&lists, &s.comp) {
            (Some((offsets, idx, mask)), Some(cs)) => Some(CompressedKeys { entries: &cs.entries, offsets, indices: idx.as_deref(), mask: mask.as_deref() }),
            _ => None,
        };
        let attend = |out: &mut AttentionOut<'_>| gpu.sparse_attention_into(query, &s.kv, keys.as_ref(), &l.sinks, inv, rope, out, &shape, kernel);
        // §4.7 grouped output projection (group g takes heads g·H/G.. of every token) on cuBLASLt
        // takes split bf16 planes of the attention output: the streaming kernel writes them itself
        // (bit for bit gemm_x_bf16's split of its f32 output), saving that conversion pass.
        let (groups, r) = (c.o_groups, c.o_lora_rank);
        let gin = h * hd / groups;
        debug_assert_eq!(l.wo_a.len(), groups);
        let lt = t >= super::cublaslt::LT_MIN_TOKENS
            && matches!(super::gpu::tc_linear_mode(), super::gpu::TcMode::Split | super::gpu::TcMode::Fp8)
            && crate::switches::on("LINEAR_CUBLASLT");
        let planes_out = lt && crate::switches::on("MLA_SPLIT_OUT") && kernel != AttentionKernel::Exact && gpu.lt_available();
        // WO_A_FP8 (vLLM's numerics): the attention output quantized to e4m3 by the kernel, wo_a
        // as cuBLASLt's block-scaled FP8 GEMM per group.
        let fp8_out = t >= super::cublaslt::LT_MIN_TOKENS
            && kernel == AttentionKernel::StreamBf16Cand
            && super::gpu::tc_linear_mode() == super::gpu::TcMode::Fp8
            && crate::switches::on("FP8_CUBLASLT")
            && crate::switches::on("WO_A_FP8")
            && l.wo_a.iter().all(|w| matches!(w.data, GpuMatrix::Fp8 { .. }))
            && super::ops_q8::lt_fp8_group_scales_aligned(h * hd / c.o_groups, t)
            && gpu.lt_available();
        // MLA_BF16 (OFF-M's numerics): the attention output is bf16, so wo_a multiplies it once (no
        // lo plane).
        let split = !kernel.is_bf16();
        // SAFETY: every group's columns of all T rows are written by cuBLASLt or, for the groups it
        // declines, by grouped_linear_gather below.
        let mut z = unsafe { gpu.scratch::<f32>(t * groups * r) }?;
        let (mut o, done) = if fp8_out {
            let n = t * h * hd;
            // SAFETY: the kernel writes all T·H·c bytes and T·H·c/128 scales (the only ones read).
            let mut q8 = unsafe { gpu.scratch::<u8>(n) }?;
            // SAFETY: as above.
            let mut sc = unsafe { gpu.scratch::<f32>(n / 128) }?;
            attend(&mut AttentionOut::Fp8 { q: &mut q8, scales: &mut sc })?;
            gpu.stage("projections");
            let done = gpu.grouped_linear_lt_fp8(&q8, &sc, &l.wo_a, &mut z, t)?;
            (None, done)
        } else if planes_out {
            let n = t * h * hd;
            // SAFETY: the streaming kernel writes the T·H·c values of each plane it has (the only
            // ones read).
            let mut planes = unsafe { gpu.scratch::<u16>(if split { 2 * n } else { n }) }?;
            if split {
                attend(&mut AttentionOut::SplitPlanes { planes: &mut planes, plane: n })?;
            } else {
                attend(&mut AttentionOut::Bf16(&mut planes))?;
            }
            gpu.stage("projections");
            let done = gpu.grouped_linear_lt_planes(&planes, split.then_some(n), h * hd, &l.wo_a, &mut z, t)?;
            (None, done)
        } else {
            let mut o = gpu.zeros::<f32>(t * h * hd)?;
            attend(&mut AttentionOut::F32(&mut o))?;
            gpu.stage("projections");
            let done = if lt { gpu.grouped_linear_lt(&o, &l.wo_a, &mut z, t, split)? } else { 0 };
            (Some(o), done)
        };
        if done < groups {
            // cuBLASLt declined a group: the rest on gemm.cu from the f32 output (recomputed when
            // only the planes were written).
            let o = match o.take() {
                Some(o) => o,
                None => {
                    gpu.stage("attention");
                    let mut o = gpu.zeros::<f32>(t * h * hd)?;
                    attend(&mut AttentionOut::F32(&mut o))?;
                    gpu.stage("projections");
                    o
                }
            };
            // WO_A_STRIDED: below 64 tokens each group's gemv reads and writes its columns in place.
            let strided = crate::switches::on("WO_A_STRIDED") && gpu.grouped_linear_gemv(&o, &l.wo_a[done..], done, &mut z, t, gin, l.wo_a_table.as_ref())?;
            if !strided {
                gpu.grouped_linear_gather(&o, &l.wo_a[done..], done, &mut z, t, gin)?;
            }
        }
        // SAFETY: written by the linear below.
        let mut y = unsafe { gpu.scratch::<f32>(t * d) }?;
        gpu.linear_q(&z, &l.wo_b, &mut y, t)?;
        gpu.stage("mhc+norms");
        // SAFETY: written by the RMSNorm below or by hc_pre_norm.
        let mut f = unsafe { gpu.scratch::<f32>(t * d) }?;
        if fused_mhc {
            // MoE sub-block (§4.11): its pre's partials from the attention sub-block's post.
            let ca = coefs.take().ok_or_else(no_coefs)?;
            let p = x.post_mix(gpu, Some((&y, &ca)), &l.hc_ffn, t, n, d, mix_tc)?;
            coefs = Some(on_streams!(&x, s => gpu.hc_pre_norm(&l.hc_ffn, &p, s, Some(&l.ffn_norm), &mut f, &mut post, &mut comb, t, n, d, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps, eps))?);
        } else {
            let u = u.as_mut().ok_or_else(|| CudaError::Unsupported { what: "forward", detail: "MHC_FUSED off without a u buffer".into() })?;
            on_streams!(&mut x, s => gpu.hc_post(s, &y, &post, &comb, t, n, d))?;
            // MoE sub-block (§4.11).
            gpu.hc_pre(&l.hc_ffn, x.f32()?, u, &mut post, &mut comb, t, n, d, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps)?;
            gpu.rms_norm(u, Some(&l.ffn_norm), &mut f, t, d, eps)?;
        }
        gpu.stage("moe");
        let moe = gpu.moe_forward(c, &l.moe, &f, ids_dev, t)?;
        gpu.stage("mhc+norms");
        // With MHC_FUSED the post also computes the next layer's attention pre partials.
        match m.layers.get(li + 1) {
            Some(next) if fused_mhc => {
                let cf = coefs.take().ok_or_else(no_coefs)?;
                mix = Some(x.post_mix(gpu, Some((&moe.out, &cf)), &next.hc_attn, t, n, d, mix_tc)?);
            }
            _ => on_streams!(&mut x, s => gpu.hc_post(s, &moe.out, &post, &comb, t, n, d))?,
        }
        if record_streams {
            layer_streams.push(gpu.download(&*x.rows_f32(gpu, 0, t, n, d)?)?);
        }
    }
    seq.pos += t;
    // §4.12 head for the selected positions.
    gpu.stage("head");
    let (first, rows) = match logits_for {
        LogitsFor::All => (0, t),
        LogitsFor::Last => (t - 1, 1),
        LogitsFor::None => (0, 0),
    };
    let logits = if rows == 0 {
        None
    } else {
        let xs = x.rows_f32(gpu, first, rows, n, d)?;
        let mut hh = gpu.zeros::<f32>(rows * d)?;
        gpu.hc_head(&m.hc_head, &xs, &mut hh, rows, n, d, c.rms_norm_eps, c.hc_eps)?;
        let mut hn = gpu.zeros::<f32>(rows * d)?;
        gpu.rms_norm(&hh, Some(&m.norm), &mut hn, rows, d, eps)?;
        let mut lg = gpu.zeros::<f32>(rows * c.vocab_size)?;
        gpu.linear(&hn, &m.head, &mut lg, rows)?;
        Some(lg)
    };
    // The GPU is idle until the next call queues work (profiling leaves this out).
    gpu.stage(super::gpu::IDLE_STAGE);
    Ok((logits, layer_streams))
}

/// Cold or continued prefill of `ids` into `seq` in chunks of `chunk` tokens (layer-major per
/// chunk); returns the logits of the last position.
///
/// Errors: as [`forward_chunk_gpu`] (on an error `seq` holds the chunks before the failing one).
pub fn prefill_gpu(gpu: &Gpu, m: &GpuModel, seq: &mut GpuSequence, ids: &[u32], chunk: usize) -> Result<Vec<f32>, CudaError> {
    let chunks = prefill_chunks(ids, chunk);
    let mut logits = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let lf = if i + 1 == chunks.len() { LogitsFor::Last } else { LogitsFor::None };
        logits = forward_chunk_gpu(gpu, m, seq, c, lf, false)?.logits;
    }
    Ok(logits)
}

/// Shortest last prefill chunk: a shorter tail joins the chunk before it. The larger of the token
/// counts from which the linears take the tensor-core kernels ([`super::gpu::TC_LINEAR_MIN_TOKENS`])
/// and cuBLASLt ([`super::cublaslt::LT_MIN_TOKENS`]), so that no chunk of a prompt runs a linear on
/// another kernel (other bits) than the prompt's other chunks would.
pub const PREFILL_MIN_TAIL: usize = if super::gpu::TC_LINEAR_MIN_TOKENS > super::cublaslt::LT_MIN_TOKENS { super::gpu::TC_LINEAR_MIN_TOKENS } else { super::cublaslt::LT_MIN_TOKENS };

/// `ids` cut into prefill chunks of `chunk` tokens, except that a last piece shorter than
/// [`PREFILL_MIN_TAIL`] joins the chunk before it: every chunk of a prompt of at least that many
/// tokens then runs the same kernels, whose per-token results do not depend on the chunk, so chunk
/// sizes of at least that many tokens change no bit of the prefill (issue 6 §1; measured by
/// `qualify` for 2,048 / 8,192 / 32,768-token chunks — cuBLASLt picks its algorithm per token count,
/// which the measurement covers only for the counts it ran).
pub fn prefill_chunks(ids: &[u32], chunk: usize) -> Vec<&[u32]> {
    let chunk = chunk.max(1);
    let mut out: Vec<&[u32]> = Vec::with_capacity(ids.len().div_ceil(chunk));
    let mut start = 0;
    while start < ids.len() {
        let mut end = (start + chunk).min(ids.len());
        if ids.len() - end < PREFILL_MIN_TAIL {
            end = ids.len();
        }
        out.push(&ids[start..end]);
        start = end;
    }
    out
}

/// Work of one forward stage for a chunk, for the benchmark's floors: floating-point operations and
/// the bytes a perfect kernel must read (weights once per chunk, plus the KV/indexer rows attention
/// and scoring read once per token).
#[derive(Debug, Clone, Copy, Default)]
pub struct StageCost {
    /// Floating-point operations (multiply + add = 2).
    pub flops: f64,
    /// Bytes read from device memory at least once.
    pub bytes: f64,
}

/// Stored bytes of a weight (values + scales).
pub(crate) fn weight_bytes(w: &GpuWeight) -> f64 {
    (match &w.data {
        GpuMatrix::F32(m) => m.len() * 4,
        GpuMatrix::Bf16(m) => m.len() * 2,
        GpuMatrix::Fp8 { w, scales } | GpuMatrix::Fp4 { w, scales, .. } => w.len() + scales.len(),
    }) as f64
}

impl GpuModel {
    /// Analytical work per stage (`projections`, `compressors`, `indexer`, `attention`, `moe`,
    /// `head`) of a chunk of `t` tokens starting at position `pos0` with logits for `logit_rows`
    /// positions: FLOPs of every matrix product and the minimum bytes read (spec §4; attention
    /// counts QK and PV over the window plus the selected or visible compressed rows of each query,
    /// the indexer its scores over every visible entry; MoE weights: the distinct experts a chunk
    /// can touch, min(E, t·k), plus the shared expert and the router).
    pub fn stage_costs(&self, t: usize, pos0: usize, logit_rows: usize) -> Vec<(&'static str, StageCost)> {
        let c = &self.config;
        let (tf, hd, h) = (t as f64, c.head_dim as f64, c.num_attention_heads as f64);
        let mut proj = StageCost::default();
        let mut comp = StageCost::default();
        let mut idx = StageCost::default();
        let mut att = StageCost::default();
        let mut moe = StageCost::default();
        let lin = |s: &mut StageCost, w: &GpuWeight, rows_t: f64| {
            s.flops += 2.0 * rows_t * (w.rows * w.cols) as f64;
            s.bytes += weight_bytes(w);
        };
        let mid = pos0 as f64 + tf / 2.0; // average position of the chunk's queries
        for l in &self.layers {
            for w in [&l.wq_a, &l.wq_b, &l.wkv, &l.wo_b] {
                lin(&mut proj, w, tf);
            }
            for w in &l.wo_a {
                lin(&mut proj, w, tf);
            }
            if let Some(cw) = &l.compressor {
                lin(&mut comp, &cw.wkv, tf);
                lin(&mut comp, &cw.wgate, tf);
            }
            let window = (c.sliding_window as f64).min(mid + 1.0);
            let compressed = match l.kind {
                LayerKind::Sliding => 0.0,
                LayerKind::Hca { ratio } => (mid / ratio as f64).floor(),
                LayerKind::Csa { ratio } => (mid / ratio as f64).floor().min(c.index_topk as f64),
            };
            att.flops += 4.0 * tf * h * hd * (window + compressed);
            att.bytes += tf * (window + compressed) * hd * 4.0;
            if let Some(iw) = &l.indexer {
                lin(&mut comp, &iw.compressor.wkv, tf);
                lin(&mut comp, &iw.compressor.wgate, tf);
                lin(&mut idx, &iw.wq_b, tf);
                // Computed with the compressors' projections (one conversion of the input), so timed there.
                lin(&mut comp, &iw.weights_proj, tf);
                let entries = (mid / iw.compressor.ratio as f64).floor();
                idx.flops += 2.0 * tf * entries * (iw.heads * iw.head_dim) as f64;
                idx.bytes += ((pos0 + t) / iw.compressor.ratio * iw.head_dim * 4) as f64;
            }
            lin(&mut moe, &l.moe.gate, tf);
            for w in [&l.moe.shared.w1, &l.moe.shared.w2, &l.moe.shared.w3] {
                lin(&mut moe, w, tf);
            }
            let k = c.num_experts_per_tok as f64;
            if let Some(ex) = l.moe.experts.first() {
                let per: f64 = [&ex.w1, &ex.w2, &ex.w3].iter().map(|w| weight_bytes(w)).sum();
                let fl: f64 = [&ex.w1, &ex.w2, &ex.w3].iter().map(|w| (w.rows * w.cols) as f64).sum();
                moe.flops += 2.0 * tf * k * fl;
                moe.bytes += per * (l.moe.experts.len() as f64).min(tf * k);
            }
        }
        let mut head = StageCost::default();
        if logit_rows > 0 {
            lin(&mut head, &self.head, logit_rows as f64);
        }
        vec![("projections", proj), ("compressors", comp), ("indexer", idx), ("attention", att), ("moe", moe), ("head", head)]
    }
}

#[cfg(test)]
mod tests {
    use super::{exact_bf16, prefill_chunks};
    use flashseek_model::quant;

    #[test]
    fn weights_proj_goes_to_bf16_only_when_exact() {
        // A bf16 checkpoint's values times Flash's 64^-1/2 = 1/8 stay bf16 (exponent shift only).
        let raw: Vec<f32> = (0..4096u32).map(|i| quant::bf16_to_f32(quant::f32_to_bf16(((i as f32) * 0.37).sin() * 0.02))).collect();
        let scaled: Vec<f32> = raw.iter().map(|v| (*v as f64 * (64f64).powf(-0.5)) as f32).collect();
        let bits = exact_bf16(&scaled).expect("bf16 values times 1/8 are bf16");
        assert!(bits.iter().zip(&scaled).all(|(b, v)| quant::bf16_to_f32(*b) == *v));
        // A non-power-of-two scale (e.g. 48 heads) or f32 weights are not: they stay f32.
        let scaled48: Vec<f32> = raw.iter().map(|v| (*v as f64 * (48f64).powf(-0.5)) as f32).collect();
        assert!(exact_bf16(&scaled48).is_none());
        assert!(exact_bf16(&[0.1f32, 0.5]).is_none());
        assert_eq!(exact_bf16(&[0.5f32, -2.0, 0.0]), Some(vec![0x3f00, 0xc000, 0x0000]));
    }

    #[test]
    fn short_tails_join_the_previous_chunk() {
        let ids: Vec<u32> = (0..10270).collect();
        let lens = |c: usize| prefill_chunks(&ids, c).iter().map(|s| s.len()).collect::<Vec<_>>();
        assert_eq!(lens(8192), vec![8192, 2078]);
        assert_eq!(lens(2048), vec![2048, 2048, 2048, 2048, 2078]);
        assert_eq!(lens(10240), vec![10270]);
        assert_eq!(prefill_chunks(&ids[..40], 8192).iter().map(|s| s.len()).collect::<Vec<_>>(), vec![40]);
        assert!(prefill_chunks(&[], 8).is_empty());
        // A 100-token tail (below cuBLASLt's 256) joins: 6,244 tokens at 2,048.
        assert_eq!(prefill_chunks(&ids[..6244], 2048).iter().map(|s| s.len()).collect::<Vec<_>>(), vec![2048, 2048, 2148]);
        assert_eq!(prefill_chunks(&ids[..6400], 2048).iter().map(|s| s.len()).collect::<Vec<_>>(), vec![2048, 2048, 2048, 256]);
        // Every token exactly once, in order.
        for c in [1, 63, 64, 100, 2048, 8192, 20000] {
            let joined: Vec<u32> = prefill_chunks(&ids, c).concat();
            assert_eq!(joined, ids, "chunk {c}");
            if c >= super::PREFILL_MIN_TAIL {
                assert!(prefill_chunks(&ids, c).iter().all(|s| s.len() >= super::PREFILL_MIN_TAIL), "chunk {c}");
            }
        }
    }
}
