//! The model's weights as the CPU reference holds them: every tensor dequantized to f32,
//! row-major `[out, in]` (spec §2 shapes), loaded once through a [`TensorSource`].
//!
//! Canonical tensor names are DeepSeek's official release names (spec §2); the checkpoint module
//! maps the other naming schemes onto them.

use flashseek_model::checkpoint::{Checkpoint, CheckpointError};
use flashseek_model::config::{Ds4Config, LayerKind, RouterKind};

/// Errors while building [`ModelWeights`].
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The checkpoint lacks a tensor, or holds it in the wrong shape, dtype or format.
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
    /// A tensor's values are inconsistent with the config (e.g. a tid2eid entry out of range).
    #[error("tensor `{name}`: {msg}")]
    Value {
        /// Canonical tensor name.
        name: String,
        /// What is wrong.
        msg: String,
    },
}

impl From<CheckpointError> for WeightsError {
    fn from(e: CheckpointError) -> Self {
        WeightsError::Checkpoint(Box::new(e))
    }
}

/// Anything that can hand out canonical tensors as f32 / i64 with a checked shape.
pub trait TensorSource {
    /// Loads `name` as f32 with logical shape `shape` (dequantizing stored formats).
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError>;
    /// Loads an integer table (tid2eid) with shape `shape`.
    fn load_i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightsError>;
}

impl TensorSource for Checkpoint {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        Ok(Checkpoint::load_f32(self, name, shape)?)
    }
    fn load_i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightsError> {
        Ok(Checkpoint::load_i64(self, name, shape)?)
    }
}

/// A dense matrix `[rows, cols]`, row-major f32 (`rows` = output features).
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// `rows * cols` values.
    pub data: Vec<f32>,
}

impl Matrix {
    fn load(src: &dyn TensorSource, name: &str, rows: usize, cols: usize) -> Result<Self, WeightsError> {
        Ok(Matrix { rows, cols, data: src.load_f32(name, &[rows, cols])? })
    }
    /// Row `r` (the weights of output feature `r`).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// mHC parameters of one sub-block (spec §4.2): `fn` [(2+n)·n, n·d], `base` [(2+n)·n], `scale` [3].
#[derive(Debug, Clone)]
pub struct HcWeights {
    /// Mix projection Φ.
    pub fn_: Matrix,
    /// Biases b.
    pub base: Vec<f32>,
    /// Scales α (pre, post, comb).
    pub scale: Vec<f32>,
}

/// A compressor (spec §4.8 HCA, §4.9 CSA; the indexer's own compressor is a CSA one).
#[derive(Debug, Clone)]
pub struct CompressorWeights {
    /// `wkv` [width·(1 or 2), d].
    pub wkv: Matrix,
    /// `wgate`, same shape.
    pub wgate: Matrix,
    /// Position bias `ape` [ratio, width·(1 or 2)].
    pub ape: Matrix,
    /// RMSNorm weight [width].
    pub norm: Vec<f32>,
}

/// Lightning indexer (spec §4.10).
#[derive(Debug, Clone)]
pub struct IndexerWeights {
    /// `wq_b` [index_n_heads·index_head_dim, q_lora_rank].
    pub wq_b: Matrix,
    /// `weights_proj` [index_n_heads, d].
    pub weights_proj: Matrix,
    /// The indexer's CSA compressor at width `index_head_dim`.
    pub compressor: CompressorWeights,
}

/// One SwiGLU expert (routed or shared; spec §4.11): w1/w3 [inter, d], w2 [d, inter].
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    /// Gate projection.
    pub w1: Matrix,
    /// Down projection.
    pub w2: Matrix,
    /// Up projection.
    pub w3: Matrix,
}

/// Expert selection parameters.
#[derive(Debug, Clone)]
pub enum RouterWeights {
    /// Hash layer: `tid2eid` [vocab, top_k] expert ids.
    Hash {
        /// Row-major table, validated to be `< n_routed_experts`.
        tid2eid: Vec<u32>,
    },
    /// Score layer: the selection bias β [n_routed_experts].
    Score {
        /// `gate.bias`.
        bias: Vec<f32>,
    },
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// Attention kind.
    pub kind: LayerKind,
    /// `attn_norm` [d].
    pub attn_norm: Vec<f32>,
    /// `wq_a` [q_lora_rank, d].
    pub wq_a: Matrix,
    /// `q_norm` [q_lora_rank].
    pub q_norm: Vec<f32>,
    /// `wq_b` [H·c, q_lora_rank].
    pub wq_b: Matrix,
    /// `wkv` [c, d].
    pub wkv: Matrix,
    /// `kv_norm` [c].
    pub kv_norm: Vec<f32>,
    /// `wo_a` [o_groups·o_lora_rank, H·c/o_groups] (block-diagonal per group, §4.7).
    pub wo_a: Matrix,
    /// `wo_b` [d, o_groups·o_lora_rank].
    pub wo_b: Matrix,
    /// Per-head sink logits [H].
    pub attn_sink: Vec<f32>,
    /// Main compressor (CSA/HCA layers).
    pub compressor: Option<CompressorWeights>,
    /// Indexer (CSA layers).
    pub indexer: Option<IndexerWeights>,
    /// mHC before attention.
    pub hc_attn: HcWeights,
    /// mHC before the MoE.
    pub hc_ffn: HcWeights,
    /// `ffn_norm` [d].
    pub ffn_norm: Vec<f32>,
    /// Router `gate.weight` [E, d].
    pub gate: Matrix,
    /// Hash table or score bias.
    pub router: RouterWeights,
    /// Shared expert.
    pub shared: ExpertWeights,
    /// Routed experts, `n_routed_experts` of them.
    pub experts: Vec<ExpertWeights>,
}

/// The whole model (spec §2), dequantized to f32.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// The validated config the shapes were checked against.
    pub config: Ds4Config,
    /// `embed.weight` [vocab, d].
    pub embed: Matrix,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// `hc_head_fn` [n, n·d].
    pub hc_head_fn: Matrix,
    /// `hc_head_base` [n].
    pub hc_head_base: Vec<f32>,
    /// `hc_head_scale` [1].
    pub hc_head_scale: Vec<f32>,
    /// Final `norm.weight` [d].
    pub norm: Vec<f32>,
    /// `head.weight` [vocab, d].
    pub head: Matrix,
}

fn hc(src: &dyn TensorSource, prefix: &str, n: usize, d: usize) -> Result<HcWeights, WeightsError> {
    let mix = (2 + n) * n;
    Ok(HcWeights {
        fn_: Matrix::load(src, &format!("{prefix}_fn"), mix, n * d)?,
        base: src.load_f32(&format!("{prefix}_base"), &[mix])?,
        scale: src.load_f32(&format!("{prefix}_scale"), &[3])?,
    })
}

fn compressor(
    src: &dyn TensorSource,
    prefix: &str,
    width: usize,
    ratio: usize,
    overlap: bool,
    d: usize,
) -> Result<CompressorWeights, WeightsError> {
    let out = if overlap { 2 * width } else { width };
    Ok(CompressorWeights {
        wkv: Matrix::load(src, &format!("{prefix}.wkv.weight"), out, d)?,
        wgate: Matrix::load(src, &format!("{prefix}.wgate.weight"), out, d)?,
        ape: Matrix::load(src, &format!("{prefix}.ape"), ratio, out)?,
        norm: src.load_f32(&format!("{prefix}.norm.weight"), &[width])?,
    })
}

fn expert(src: &dyn TensorSource, prefix: &str, inter: usize, d: usize) -> Result<ExpertWeights, WeightsError> {
    Ok(ExpertWeights {
        w1: Matrix::load(src, &format!("{prefix}.w1.weight"), inter, d)?,
        w2: Matrix::load(src, &format!("{prefix}.w2.weight"), d, inter)?,
        w3: Matrix::load(src, &format!("{prefix}.w3.weight"), inter, d)?,
    })
}

impl ModelWeights {
    /// Loads and shape-checks every tensor the forward pass uses (MTP tensors are ignored).
    ///
    /// Errors: any missing tensor, wrong shape/dtype/format (naming the tensor), or a tid2eid
    /// entry outside `0..n_routed_experts`.
    pub fn load(config: &Ds4Config, src: &dyn TensorSource) -> Result<Self, WeightsError> {
        let c = config;
        let d = c.hidden_size;
        let n = c.hc_mult;
        let hcd = c.num_attention_heads * c.head_dim;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}");
            let kind = c.layer_kinds[l];
            let (comp, idx) = match kind {
                LayerKind::Sliding => (None, None),
                LayerKind::Hca { ratio } => {
                    (Some(compressor(src, &format!("{p}.attn.compressor"), c.head_dim, ratio, false, d)?), None)
                }
                LayerKind::Csa { ratio } => (
                    Some(compressor(src, &format!("{p}.attn.compressor"), c.head_dim, ratio, true, d)?),
                    Some(IndexerWeights {
                        wq_b: Matrix::load(
                            src,
                            &format!("{p}.attn.indexer.wq_b.weight"),
                            c.index_n_heads * c.index_head_dim,
                            c.q_lora_rank,
                        )?,
                        weights_proj: Matrix::load(
                            src,
                            &format!("{p}.attn.indexer.weights_proj.weight"),
                            c.index_n_heads,
                            d,
                        )?,
                        compressor: compressor(
                            src,
                            &format!("{p}.attn.indexer.compressor"),
                            c.index_head_dim,
                            ratio,
                            true,
                            d,
                        )?,
                    }),
                ),
            };
            let e = c.n_routed_experts;
            let router = match c.router_kinds[l] {
                RouterKind::Hash => {
                    let name = format!("{p}.ffn.gate.tid2eid");
                    let raw = src.load_i64(&name, &[c.vocab_size, c.num_experts_per_tok])?;
                    let mut tid2eid = Vec::with_capacity(raw.len());
                    for (i, &v) in raw.iter().enumerate() {
                        if v < 0 || v as usize >= e {
                            return Err(WeightsError::Value {
                                name,
                                msg: format!(
                                    "entry {i} (token {}) is expert {v}, expected 0..{e}",
                                    i / c.num_experts_per_tok
                                ),
                            });
                        }
                        tid2eid.push(v as u32);
                    }
                    RouterWeights::Hash { tid2eid }
                }
                RouterKind::Score => RouterWeights::Score { bias: src.load_f32(&format!("{p}.ffn.gate.bias"), &[e])? },
            };
            let inter = c.moe_intermediate_size;
            layers.push(LayerWeights {
                kind,
                attn_norm: src.load_f32(&format!("{p}.attn_norm.weight"), &[d])?,
                wq_a: Matrix::load(src, &format!("{p}.attn.wq_a.weight"), c.q_lora_rank, d)?,
                q_norm: src.load_f32(&format!("{p}.attn.q_norm.weight"), &[c.q_lora_rank])?,
                wq_b: Matrix::load(src, &format!("{p}.attn.wq_b.weight"), hcd, c.q_lora_rank)?,
                wkv: Matrix::load(src, &format!("{p}.attn.wkv.weight"), c.head_dim, d)?,
                kv_norm: src.load_f32(&format!("{p}.attn.kv_norm.weight"), &[c.head_dim])?,
                wo_a: Matrix::load(src, &format!("{p}.attn.wo_a.weight"), c.o_groups * c.o_lora_rank, hcd / c.o_groups)?,
                wo_b: Matrix::load(src, &format!("{p}.attn.wo_b.weight"), d, c.o_groups * c.o_lora_rank)?,
                attn_sink: src.load_f32(&format!("{p}.attn.attn_sink"), &[c.num_attention_heads])?,
                compressor: comp,
                indexer: idx,
                hc_attn: hc(src, &format!("{p}.hc_attn"), n, d)?,
                hc_ffn: hc(src, &format!("{p}.hc_ffn"), n, d)?,
                ffn_norm: src.load_f32(&format!("{p}.ffn_norm.weight"), &[d])?,
                gate: Matrix::load(src, &format!("{p}.ffn.gate.weight"), e, d)?,
                router,
                shared: expert(src, &format!("{p}.ffn.shared_experts"), inter, d)?,
                experts: (0..e)
                    .map(|x| expert(src, &format!("{p}.ffn.experts.{x}"), inter, d))
                    .collect::<Result<_, _>>()?,
            });
        }
        Ok(ModelWeights {
            config: c.clone(),
            embed: Matrix::load(src, "embed.weight", c.vocab_size, d)?,
            layers,
            hc_head_fn: Matrix::load(src, "hc_head_fn", n, n * d)?,
            hc_head_base: src.load_f32("hc_head_base", &[n])?,
            hc_head_scale: src.load_f32("hc_head_scale", &[1])?,
            norm: src.load_f32("norm.weight", &[d])?,
            head: Matrix::load(src, "head.weight", c.vocab_size, d)?,
        })
    }
}
