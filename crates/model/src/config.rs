//! DeepSeek-V4 `config.json`, parsed and validated once into [`Ds4Config`] (spec §1).
//!
//! Two schemas are accepted:
//! - the current Hugging Face schema (transformers ≥ 5.8, `configuration_deepseek_v4.py`):
//!   `layer_types`, `mlp_layer_types`, `compress_rates`, nested `rope_parameters` {`main`, `compress`},
//!   `partial_rotary_factor`;
//! - the legacy / official schema: `compress_ratios` (one entry per layer, extra trailing entries
//!   belong to MTP blocks and are ignored), `num_hash_layers`, `qk_rope_head_dim`, top-level
//!   `rope_scaling` (or the official `rope_factor` / `original_seq_len` / `beta_fast` / `beta_slow`
//!   keys) applied to the compressed layers' rope, `compress_rope_theta`.
//!
//! Everything the forward pass needs (widths, head counts, compress rates, window, top-k, vocab) comes
//! from here; nothing is hard-coded to Flash. Every error names the field and what was expected.

use serde_json::{Map, Value};
use std::path::Path;

/// Errors from reading or validating a `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}")]
    Io {
        /// Path of the config file.
        path: String,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// The file is not valid JSON, or not a JSON object.
    #[error("config {path} is not a JSON object: {msg}")]
    Json {
        /// Path (or `<memory>`).
        path: String,
        /// Parser message.
        msg: String,
    },
    /// A required field is absent.
    #[error("config field `{field}` is missing (expected {expected})")]
    Missing {
        /// JSON key.
        field: String,
        /// What a valid value looks like.
        expected: String,
    },
    /// A field has the wrong type or an out-of-range / inconsistent value.
    #[error("config field `{field}` is invalid: expected {expected}, found {found}")]
    Invalid {
        /// JSON key (dotted for nested keys).
        field: String,
        /// What a valid value looks like.
        expected: String,
        /// What the file holds.
        found: String,
    },
}

type Result<T> = std::result::Result<T, ConfigError>;

/// Attention kind of one decoder layer (spec §1.2, §4.6–§4.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Sliding-window attention only (`compress_ratio` 0; HF `sliding_attention`); main rope.
    Sliding,
    /// Compressed sparse attention: overlapping compressor of ratio `ratio` plus the lightning
    /// indexer's top-k (HF `compressed_sparse_attention`); compress rope.
    Csa {
        /// Tokens per compressed entry (Flash: 4).
        ratio: usize,
    },
    /// Heavily compressed attention: non-overlapping compressor of ratio `ratio`, every visible
    /// entry attended (HF `heavily_compressed_attention`); compress rope.
    Hca {
        /// Tokens per compressed entry (Flash: 128).
        ratio: usize,
    },
}

impl LayerKind {
    /// Compression ratio, 0 for sliding-only layers.
    pub fn ratio(self) -> usize {
        match self {
            LayerKind::Sliding => 0,
            LayerKind::Csa { ratio } | LayerKind::Hca { ratio } => ratio,
        }
    }
    /// Whether this layer uses the compress rope (CSA/HCA) rather than the main rope.
    pub fn uses_compress_rope(self) -> bool {
        !matches!(self, LayerKind::Sliding)
    }
    /// HF `layer_types` label.
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Csa { .. } => "compressed_sparse_attention",
            LayerKind::Hca { .. } => "heavily_compressed_attention",
        }
    }
}

/// Expert-selection kind of one MoE layer (spec §4.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    /// Experts from the frozen `tid2eid[token_id]` table (HF `hash_moe`).
    Hash,
    /// Learned top-k over `score + bias` (HF `moe`).
    Score,
}

/// Router score function (`scoring_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoringFunc {
    /// `sqrt(softplus(x))` (DeepSeek-V4; spec §3.3).
    SqrtSoftplus,
    /// `sigmoid(x)`.
    Sigmoid,
}

/// YaRN frequency scaling (spec §3.2). No magnitude scale is applied when
/// `attention_factor` is 1 (DeepSeek-V4 forces 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Context extension factor (Flash: 16).
    pub factor: f64,
    /// Pre-training context (Flash: 65536).
    pub original_max_position_embeddings: f64,
    /// Extrapolation boundary in rotations (Flash: 32).
    pub beta_fast: f64,
    /// Interpolation boundary in rotations (Flash: 1).
    pub beta_slow: f64,
    /// Multiplier on cos/sin (DeepSeek-V4: 1.0).
    pub attention_factor: f64,
    /// Floor/ceil the correction range (HF default true).
    pub truncate: bool,
}

/// One rope parameter set (HF `rope_parameters.main` / `.compress`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Base θ.
    pub theta: f64,
    /// YaRN scaling, if any.
    pub yarn: Option<Yarn>,
}

/// Stored precision declared by `quantization_config` / `expert_dtype` (informational; the loader
/// decides from the tensors themselves).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuantDecl {
    /// `quant_method` (e.g. `fp8`), if declared.
    pub method: Option<String>,
    /// `scale_fmt` (e.g. `ue8m0`), if declared.
    pub scale_fmt: Option<String>,
    /// `weight_block_size`, if declared.
    pub weight_block_size: Option<[usize; 2]>,
    /// `expert_dtype` (e.g. `fp4`), if declared.
    pub expert_dtype: Option<String>,
}

/// A validated DeepSeek-V4 configuration (spec §1). Field names follow the HF schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Ds4Config {
    /// Vocabulary rows of `embed`/`head` (Flash: 129280).
    pub vocab_size: usize,
    /// Model width d (Flash: 4096).
    pub hidden_size: usize,
    /// Main decoder layers (Flash: 43).
    pub num_hidden_layers: usize,
    /// Query heads H (Flash: 64).
    pub num_attention_heads: usize,
    /// Head dim c of q, k and v (Flash: 512).
    pub head_dim: usize,
    /// Trailing rope dims of each head (Flash: 64).
    pub qk_rope_head_dim: usize,
    /// Query low rank (Flash: 1024).
    pub q_lora_rank: usize,
    /// Output projection groups (Flash: 8).
    pub o_groups: usize,
    /// Output low rank per group (Flash: 1024).
    pub o_lora_rank: usize,
    /// Raw K=V window including the current token (Flash: 128).
    pub sliding_window: usize,
    /// Attention kind per layer, `num_hidden_layers` entries.
    pub layer_kinds: Vec<LayerKind>,
    /// Router kind per layer, `num_hidden_layers` entries.
    pub router_kinds: Vec<RouterKind>,
    /// Rope of sliding-only layers (Flash: θ 10000, no scaling).
    pub rope_main: RopeParams,
    /// Rope of CSA/HCA layers, their compressors and the indexer (Flash: θ 160000 + YaRN).
    pub rope_compress: RopeParams,
    /// Indexer query heads (Flash: 64).
    pub index_n_heads: usize,
    /// Indexer head dim (Flash: 128).
    pub index_head_dim: usize,
    /// Compressed entries each CSA query keeps (Flash: 512).
    pub index_topk: usize,
    /// Routed experts (Flash: 256).
    pub n_routed_experts: usize,
    /// Experts per token (Flash: 6).
    pub num_experts_per_tok: usize,
    /// Expert FFN width, routed and shared (Flash: 2048).
    pub moe_intermediate_size: usize,
    /// Router score function.
    pub scoring_func: ScoringFunc,
    /// Multiplier on the renormalised routing weights (Flash: 1.5).
    pub routed_scaling_factor: f64,
    /// SwiGLU clamp (Flash: 10).
    pub swiglu_limit: f64,
    /// mHC streams n (Flash: 4).
    pub hc_mult: usize,
    /// Sinkhorn iterations (Flash: 20).
    pub hc_sinkhorn_iters: usize,
    /// mHC eps (Flash: 1e-6).
    pub hc_eps: f64,
    /// RMSNorm eps (Flash: 1e-6).
    pub rms_norm_eps: f64,
    /// MTP blocks in the checkpoint (not run by the main forward).
    pub num_nextn_predict_layers: usize,
    /// Maximum positions.
    pub max_position_embeddings: usize,
    /// BOS id.
    pub bos_token_id: Option<u32>,
    /// EOS ids.
    pub eos_token_ids: Vec<u32>,
    /// Declared storage precision.
    pub quant: QuantDecl,
}

impl Ds4Config {
    /// Reads and validates `path` (a `config.json`, or a directory containing one).
    ///
    /// Errors: unreadable file, invalid JSON, or any [`ConfigError`] from [`Ds4Config::from_json`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let file = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Io {
            path: file.display().to_string(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ConfigError::Json {
            path: file.display().to_string(),
            msg: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(ConfigError::Json { path: file.display().to_string(), msg: format!("top level is {}", kind_of(&value)) });
        }
        Self::from_json(&value)
    }

    /// Validates a parsed `config.json` object (either schema).
    ///
    /// Errors: wrong `model_type`; a missing required field; a value of the wrong type, out of
    /// range, or inconsistent with another field — each naming the field and the expected value.
    pub fn from_json(value: &Value) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| ConfigError::Json {
            path: "<memory>".into(),
            msg: format!("top level is {}", kind_of(value)),
        })?;
        let o = Obj(obj);
        match obj.get("model_type") {
            Some(Value::String(s)) if s == "deepseek_v4" => {}
            Some(v) => {
                return Err(ConfigError::Invalid {
                    field: "model_type".into(),
                    expected: "\"deepseek_v4\"".into(),
                    found: v.to_string(),
                })
            }
            None => {
                return Err(ConfigError::Missing {
                    field: "model_type".into(),
                    expected: "\"deepseek_v4\"".into(),
                })
            }
        }

        let num_hidden_layers = o.usize_req("num_hidden_layers", 1)?;
        let hidden_size = o.usize_req("hidden_size", 1)?;
        let vocab_size = o.usize_req("vocab_size", 1)?;
        let num_attention_heads = o.usize_req("num_attention_heads", 1)?;
        let num_key_value_heads = o.usize_opt("num_key_value_heads", 1)?.unwrap_or(1);
        if num_key_value_heads != 1 {
            return Err(invalid("num_key_value_heads", "1 (DeepSeek-V4 has one shared K=V head)", num_key_value_heads));
        }
        let head_dim = o.usize_req("head_dim", 2)?;

        // Rope dims: `qk_rope_head_dim` (legacy) or `partial_rotary_factor` (HF).
        let qk_rope_head_dim = if let Some(r) = o.usize_opt("qk_rope_head_dim", 2)? {
            r
        } else if let Some(f) = o.f64_opt("partial_rotary_factor")? {
            (head_dim as f64 * f) as usize
        } else {
            head_dim / 8
        };
        if qk_rope_head_dim == 0 || qk_rope_head_dim % 2 != 0 || qk_rope_head_dim > head_dim {
            return Err(invalid(
                "qk_rope_head_dim",
                &format!("an even number of rope dims in 2..={head_dim} (head_dim)"),
                qk_rope_head_dim,
            ));
        }
        if let Some(nope) = o.usize_opt("qk_nope_head_dim", 0)? {
            if nope + qk_rope_head_dim != head_dim {
                return Err(invalid(
                    "qk_nope_head_dim",
                    &format!("head_dim - qk_rope_head_dim = {}", head_dim - qk_rope_head_dim),
                    nope,
                ));
            }
        }

        let q_lora_rank = o.usize_req("q_lora_rank", 1)?;
        let o_groups = o.usize_req("o_groups", 1)?;
        let o_lora_rank = o.usize_req("o_lora_rank", 1)?;
        if (num_attention_heads * head_dim) % o_groups != 0 || num_attention_heads % o_groups != 0 {
            return Err(invalid(
                "o_groups",
                &format!("a divisor of num_attention_heads ({num_attention_heads})"),
                o_groups,
            ));
        }
        let sliding_window = o.usize_req("sliding_window", 1)?;

        // Compress rates per attention kind.
        let mut csa_rate = 4usize;
        let mut hca_rate = 128usize;
        if let Some(v) = obj.get("compress_rates").filter(|v| !v.is_null()) {
            let m = v.as_object().ok_or_else(|| invalid("compress_rates", "an object {layer type: rate}", kind_of(v)))?;
            let mo = Obj(m);
            if let Some(r) = mo.usize_opt("compressed_sparse_attention", 1)? {
                csa_rate = r;
            }
            if let Some(r) = mo.usize_opt("heavily_compressed_attention", 1)? {
                hca_rate = r;
            }
        }
        if let Some(r) = o.usize_opt("compress_rate_csa", 1)? {
            csa_rate = r;
        }
        if let Some(r) = o.usize_opt("compress_rate_hca", 1)? {
            hca_rate = r;
        }

        let layer_kinds: Vec<LayerKind> = if let Some(v) = obj.get("layer_types").filter(|v| !v.is_null()) {
            let arr = v.as_array().ok_or_else(|| invalid("layer_types", "an array of layer type names", kind_of(v)))?;
            let mut kinds = Vec::with_capacity(arr.len());
            for (i, t) in arr.iter().enumerate() {
                kinds.push(match t.as_str() {
                    Some("sliding_attention") => LayerKind::Sliding,
                    Some("compressed_sparse_attention") => LayerKind::Csa { ratio: csa_rate },
                    Some("heavily_compressed_attention") => LayerKind::Hca { ratio: hca_rate },
                    _ => {
                        return Err(invalid(
                            &format!("layer_types[{i}]"),
                            "one of sliding_attention, compressed_sparse_attention, heavily_compressed_attention",
                            t,
                        ))
                    }
                });
            }
            kinds
        } else if let Some(v) = obj.get("compress_ratios").filter(|v| !v.is_null()) {
            let arr = v.as_array().ok_or_else(|| invalid("compress_ratios", "an array of integers", kind_of(v)))?;
            let mut kinds = Vec::with_capacity(arr.len());
            for (i, r) in arr.iter().enumerate() {
                let ratio = r.as_u64().ok_or_else(|| invalid(&format!("compress_ratios[{i}]"), "a non-negative integer", r))?
                    as usize;
                // Legacy schema (HF `_COMPRESS_RATIO_TO_LAYER_TYPE`): 0 = sliding, the CSA rate, the HCA rate.
                kinds.push(match ratio {
                    0 => LayerKind::Sliding,
                    r if r == csa_rate => LayerKind::Csa { ratio: r },
                    r if r == hca_rate => LayerKind::Hca { ratio: r },
                    r => {
                        return Err(invalid(
                            &format!("compress_ratios[{i}]"),
                            &format!("0, {csa_rate} (CSA) or {hca_rate} (HCA), matching compress_rates"),
                            r,
                        ))
                    }
                });
            }
            kinds
        } else {
            return Err(ConfigError::Missing {
                field: "layer_types".into(),
                expected: "a per-layer attention schedule (`layer_types` or legacy `compress_ratios`); \
                           the HF default is a V4-Pro schedule and would silently mis-build Flash"
                    .into(),
            });
        };
        let schedule_field = if obj.get("layer_types").is_some_and(|v| !v.is_null()) { "layer_types" } else { "compress_ratios" };
        if layer_kinds.len() < num_hidden_layers {
            return Err(invalid(
                schedule_field,
                &format!("at least num_hidden_layers = {num_hidden_layers} entries"),
                format!("{} entries", layer_kinds.len()),
            ));
        }
        if obj.contains_key("layer_types") && layer_kinds.len() != num_hidden_layers {
            return Err(invalid(
                "layer_types",
                &format!("exactly num_hidden_layers = {num_hidden_layers} entries"),
                format!("{} entries", layer_kinds.len()),
            ));
        }
        let layer_kinds: Vec<LayerKind> = layer_kinds[..num_hidden_layers].to_vec();

        let router_kinds: Vec<RouterKind> = if let Some(v) = obj.get("mlp_layer_types").filter(|v| !v.is_null()) {
            let arr = v.as_array().ok_or_else(|| invalid("mlp_layer_types", "an array of \"hash_moe\"/\"moe\"", kind_of(v)))?;
            if arr.len() != num_hidden_layers {
                return Err(invalid(
                    "mlp_layer_types",
                    &format!("exactly num_hidden_layers = {num_hidden_layers} entries"),
                    format!("{} entries", arr.len()),
                ));
            }
            let mut kinds = Vec::with_capacity(arr.len());
            for (i, t) in arr.iter().enumerate() {
                kinds.push(match t.as_str() {
                    Some("hash_moe") => RouterKind::Hash,
                    Some("moe") => RouterKind::Score,
                    _ => return Err(invalid(&format!("mlp_layer_types[{i}]"), "\"hash_moe\" or \"moe\"", t)),
                });
            }
            kinds
        } else {
            let n_hash = o.usize_opt("num_hash_layers", 0)?.unwrap_or(3);
            (0..num_hidden_layers)
                .map(|i| if i < n_hash { RouterKind::Hash } else { RouterKind::Score })
                .collect()
        };

        // Rope parameters.
        let rope_theta = o.f64_opt("rope_theta")?.unwrap_or(10000.0);
        let compress_rope_theta = o.f64_opt("compress_rope_theta")?.unwrap_or(160000.0);
        let (rope_main, rope_compress) = parse_rope(&o, rope_theta, compress_rope_theta)?;

        let index_n_heads = o.usize_req("index_n_heads", 1)?;
        let index_head_dim = o.usize_req("index_head_dim", 2)?;
        let index_topk = o.usize_req("index_topk", 1)?;
        if layer_kinds.iter().any(|k| matches!(k, LayerKind::Csa { .. })) && index_head_dim <= qk_rope_head_dim {
            return Err(invalid(
                "index_head_dim",
                &format!("more than qk_rope_head_dim ({qk_rope_head_dim}) (indexer heads are [nope | rope])"),
                index_head_dim,
            ));
        }

        let n_routed_experts = o.usize_req("n_routed_experts", 1)?;
        let num_experts_per_tok = o.usize_req("num_experts_per_tok", 1)?;
        if num_experts_per_tok > n_routed_experts {
            return Err(invalid(
                "num_experts_per_tok",
                &format!("at most n_routed_experts = {n_routed_experts}"),
                num_experts_per_tok,
            ));
        }
        let n_shared = o.usize_opt("n_shared_experts", 0)?.unwrap_or(1);
        if n_shared != 1 {
            return Err(invalid("n_shared_experts", "1 (DeepSeek-V4 has one shared expert)", n_shared));
        }
        let moe_intermediate_size = o.usize_req("moe_intermediate_size", 1)?;
        let scoring_func = match obj.get("scoring_func") {
            None | Some(Value::Null) => ScoringFunc::SqrtSoftplus,
            Some(Value::String(s)) if s == "sqrtsoftplus" => ScoringFunc::SqrtSoftplus,
            Some(Value::String(s)) if s == "sigmoid" => ScoringFunc::Sigmoid,
            Some(v) => return Err(invalid("scoring_func", "\"sqrtsoftplus\" or \"sigmoid\"", v)),
        };
        let routed_scaling_factor = o.f64_opt("routed_scaling_factor")?.unwrap_or(1.5);
        let swiglu_limit = o.f64_opt("swiglu_limit")?.unwrap_or(10.0);
        if swiglu_limit <= 0.0 {
            return Err(invalid("swiglu_limit", "a positive clamp", swiglu_limit));
        }

        let hc_mult = o.usize_opt("hc_mult", 1)?.unwrap_or(4);
        let hc_sinkhorn_iters = o.usize_opt("hc_sinkhorn_iters", 1)?.unwrap_or(20);
        let hc_eps = o.f64_opt("hc_eps")?.unwrap_or(1e-6);
        let rms_norm_eps = o.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
        if rms_norm_eps <= 0.0 {
            return Err(invalid("rms_norm_eps", "a positive epsilon", rms_norm_eps));
        }
        let num_nextn_predict_layers = o.usize_opt("num_nextn_predict_layers", 0)?.unwrap_or(0);
        let max_position_embeddings = o.usize_opt("max_position_embeddings", 1)?.unwrap_or(1 << 20);
        let bos_token_id = o.usize_opt("bos_token_id", 0)?.map(|v| v as u32);
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| invalid(&format!("eos_token_id[{i}]"), "a token id", v))
                })
                .collect::<Result<Vec<_>>>()?,
            Some(v) => vec![v.as_u64().ok_or_else(|| invalid("eos_token_id", "a token id or a list of ids", v))? as u32],
        };
        for (name, id) in bos_token_id.iter().map(|b| ("bos_token_id", *b)).chain(eos_token_ids.iter().map(|e| ("eos_token_id", *e))) {
            if id as usize >= vocab_size {
                return Err(invalid(name, &format!("an id below vocab_size ({vocab_size})"), id));
            }
        }
        if matches!(obj.get("tie_word_embeddings"), Some(Value::Bool(true))) {
            return Err(invalid("tie_word_embeddings", "false (DeepSeek-V4 has a separate head)", "true"));
        }

        let mut quant = QuantDecl::default();
        if let Some(Value::Object(q)) = obj.get("quantization_config") {
            quant.method = q.get("quant_method").and_then(Value::as_str).map(str::to_owned);
            quant.scale_fmt = q.get("scale_fmt").and_then(Value::as_str).map(str::to_owned);
            if let Some(Value::Array(b)) = q.get("weight_block_size") {
                if let [Some(a), Some(c)] = [b.first().and_then(Value::as_u64), b.get(1).and_then(Value::as_u64)] {
                    quant.weight_block_size = Some([a as usize, c as usize]);
                }
            }
            quant.expert_dtype = q.get("expert_dtype").and_then(Value::as_str).map(str::to_owned);
        }
        if let Some(Value::String(s)) = obj.get("expert_dtype") {
            quant.expert_dtype = Some(s.clone());
        }

        Ok(Ds4Config {
            vocab_size,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            head_dim,
            qk_rope_head_dim,
            q_lora_rank,
            o_groups,
            o_lora_rank,
            sliding_window,
            layer_kinds,
            router_kinds,
            rope_main,
            rope_compress,
            index_n_heads,
            index_head_dim,
            index_topk,
            n_routed_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            scoring_func,
            routed_scaling_factor,
            swiglu_limit,
            hc_mult,
            hc_sinkhorn_iters,
            hc_eps,
            rms_norm_eps,
            num_nextn_predict_layers,
            max_position_embeddings,
            bos_token_id,
            eos_token_ids,
            quant,
        })
    }

    /// Non-rope dims of each attention head (`head_dim - qk_rope_head_dim`).
    pub fn nope_head_dim(&self) -> usize {
        self.head_dim - self.qk_rope_head_dim
    }

    /// Rope parameters for a layer of kind `kind` (main for sliding, compress otherwise).
    pub fn rope_for(&self, kind: LayerKind) -> &RopeParams {
        if kind.uses_compress_rope() {
            &self.rope_compress
        } else {
            &self.rope_main
        }
    }

    /// Renders the config in the current HF schema (what `save_pretrained` writes), so writers
    /// produce configs this parser and transformers both read.
    pub fn to_hf_json(&self) -> Value {
        let csa = self.layer_kinds.iter().find_map(|k| match k {
            LayerKind::Csa { ratio } => Some(*ratio),
            _ => None,
        });
        let hca = self.layer_kinds.iter().find_map(|k| match k {
            LayerKind::Hca { ratio } => Some(*ratio),
            _ => None,
        });
        let rope = |r: &RopeParams| {
            let mut m = serde_json::json!({
                "rope_theta": r.theta,
                "partial_rotary_factor": self.qk_rope_head_dim as f64 / self.head_dim as f64,
                "rope_type": "default",
            });
            if let Some(y) = r.yarn {
                m["rope_type"] = "yarn".into();
                m["factor"] = y.factor.into();
                m["original_max_position_embeddings"] = y.original_max_position_embeddings.into();
                m["beta_fast"] = y.beta_fast.into();
                m["beta_slow"] = y.beta_slow.into();
                m["attention_factor"] = y.attention_factor.into();
                m["truncate"] = y.truncate.into();
            }
            m
        };
        serde_json::json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "partial_rotary_factor": self.qk_rope_head_dim as f64 / self.head_dim as f64,
            "q_lora_rank": self.q_lora_rank,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_lora_rank,
            "sliding_window": self.sliding_window,
            "layer_types": self.layer_kinds.iter().map(|k| k.hf_name()).collect::<Vec<_>>(),
            "mlp_layer_types": self.router_kinds.iter().map(|k| match k { RouterKind::Hash => "hash_moe", RouterKind::Score => "moe" }).collect::<Vec<_>>(),
            "compress_rates": {
                "compressed_sparse_attention": csa.unwrap_or(4),
                "heavily_compressed_attention": hca.unwrap_or(128),
            },
            "rope_theta": self.rope_main.theta,
            "compress_rope_theta": self.rope_compress.theta,
            "rope_parameters": { "main": rope(&self.rope_main), "compress": rope(&self.rope_compress) },
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": 1,
            "moe_intermediate_size": self.moe_intermediate_size,
            "scoring_func": match self.scoring_func { ScoringFunc::SqrtSoftplus => "sqrtsoftplus", ScoringFunc::Sigmoid => "sigmoid" },
            "norm_topk_prob": true,
            "routed_scaling_factor": self.routed_scaling_factor,
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids.first(),
            "tie_word_embeddings": false,
            "quantization_config": self.quant.method.as_ref().map(|m| serde_json::json!({
                "quant_method": m,
                "fmt": "e4m3",
                "scale_fmt": self.quant.scale_fmt,
                "weight_block_size": self.quant.weight_block_size,
                "activation_scheme": "dynamic",
            })),
            "expert_dtype": self.quant.expert_dtype,
        })
    }
}

/// DeepSeek-V4-Flash's official `config.json` (legacy/official schema; values from spec §1.1, layer
/// schedule `[0, 0] + [4, 128] × 20 + [4, 0]` from §1.2, the last entry belonging to the MTP block).
pub fn flash_official_json() -> Value {
    let mut ratios = vec![0u64, 0];
    for _ in 0..20 {
        ratios.extend([4, 128]);
    }
    ratios.extend([4, 0]);
    let text = r#"{
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
        "num_hash_layers": 3, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "norm_topk_prob": true, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "num_nextn_predict_layers": 1, "max_position_embeddings": 1048576, "bos_token_id": 0, "eos_token_id": 1,
        "tie_word_embeddings": false, "topk_method": "noaux_tc",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
        "expert_dtype": "fp4"
    }"#;
    let mut v: Value = serde_json::from_str(text).expect("static JSON");
    v["compress_ratios"] = Value::from(ratios);
    v
}

/// Parses the main and compress rope sets from either schema.
fn parse_rope(o: &Obj<'_>, rope_theta: f64, compress_rope_theta: f64) -> Result<(RopeParams, RopeParams)> {
    let obj = o.0;
    let nested = obj.get("rope_parameters").and_then(Value::as_object);
    if let Some(rp) = nested {
        if let (Some(Value::Object(main)), Some(Value::Object(comp))) = (rp.get("main"), rp.get("compress")) {
            return Ok((
                rope_set(main, "rope_parameters.main", rope_theta)?,
                rope_set(comp, "rope_parameters.compress", compress_rope_theta)?,
            ));
        }
    }
    // Flat form: `rope_scaling` / flat `rope_parameters` / official top-level yarn keys apply to
    // the compress rope only (HF `__post_init__`; OFF-M applies YaRN on compressed layers only).
    let flat = obj
        .get("rope_scaling")
        .and_then(Value::as_object)
        .or(nested)
        .cloned()
        .unwrap_or_default();
    let mut comp = flat;
    if !comp.contains_key("type") && !comp.contains_key("rope_type") {
        if let Some(f) = o.f64_opt("rope_factor")? {
            comp.insert("rope_type".into(), "yarn".into());
            comp.insert("factor".into(), f.into());
            for (official, hf) in [
                ("original_seq_len", "original_max_position_embeddings"),
                ("beta_fast", "beta_fast"),
                ("beta_slow", "beta_slow"),
            ] {
                if let Some(v) = obj.get(official) {
                    comp.insert(hf.into(), v.clone());
                }
            }
        }
    }
    if !comp.contains_key("original_max_position_embeddings") {
        if let Some(v) = obj.get("original_max_position_embeddings") {
            comp.insert("original_max_position_embeddings".into(), v.clone());
        }
    }
    comp.remove("rope_theta");
    let is_yarn = matches!(comp.get("rope_type").or(comp.get("type")).and_then(Value::as_str), Some("yarn"));
    if is_yarn && !comp.contains_key("attention_factor") {
        comp.insert("attention_factor".into(), 1.0.into());
    }
    let main = RopeParams { theta: rope_theta, yarn: None };
    let compress = rope_set(&comp, "rope_scaling", compress_rope_theta)?;
    Ok((main, compress))
}

fn rope_set(m: &Map<String, Value>, field: &str, default_theta: f64) -> Result<RopeParams> {
    let mo = Obj(m);
    let theta = mo.f64_opt("rope_theta").map_err(|e| prefix(e, field))?.unwrap_or(default_theta);
    if theta <= 1.0 {
        return Err(invalid(&format!("{field}.rope_theta"), "a base > 1", theta));
    }
    let ty = m.get("rope_type").or(m.get("type")).and_then(Value::as_str).unwrap_or("default");
    let yarn = match ty {
        "default" => None,
        "yarn" => {
            let req = |k: &str| -> Result<f64> {
                mo.f64_opt(k).map_err(|e| prefix(e, field))?.ok_or_else(|| ConfigError::Missing {
                    field: format!("{field}.{k}"),
                    expected: "a number (YaRN parameter)".into(),
                })
            };
            let y = Yarn {
                factor: req("factor")?,
                original_max_position_embeddings: req("original_max_position_embeddings")?,
                beta_fast: mo.f64_opt("beta_fast").map_err(|e| prefix(e, field))?.unwrap_or(32.0),
                beta_slow: mo.f64_opt("beta_slow").map_err(|e| prefix(e, field))?.unwrap_or(1.0),
                attention_factor: mo.f64_opt("attention_factor").map_err(|e| prefix(e, field))?.unwrap_or(1.0),
                truncate: m.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            };
            if y.factor <= 0.0 {
                return Err(invalid(&format!("{field}.factor"), "a positive factor", y.factor));
            }
            Some(y)
        }
        other => return Err(invalid(&format!("{field}.rope_type"), "\"default\" or \"yarn\"", other)),
    };
    Ok(RopeParams { theta, yarn })
}

fn prefix(e: ConfigError, p: &str) -> ConfigError {
    match e {
        ConfigError::Invalid { field, expected, found } => ConfigError::Invalid { field: format!("{p}.{field}"), expected, found },
        ConfigError::Missing { field, expected } => ConfigError::Missing { field: format!("{p}.{field}"), expected },
        other => other,
    }
}

fn invalid(field: &str, expected: &str, found: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid { field: field.into(), expected: expected.into(), found: found.to_string() }
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Typed accessors with field-naming errors.
struct Obj<'a>(&'a Map<String, Value>);

impl Obj<'_> {
    fn usize_opt(&self, k: &str, min: usize) -> Result<Option<usize>> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| invalid(k, &format!("an integer >= {min}"), kind_of(v)))?;
                if (n as usize) < min {
                    return Err(invalid(k, &format!("an integer >= {min}"), n));
                }
                Ok(Some(n as usize))
            }
        }
    }
    fn usize_req(&self, k: &str, min: usize) -> Result<usize> {
        self.usize_opt(k, min)?
            .ok_or_else(|| ConfigError::Missing { field: k.into(), expected: format!("an integer >= {min}") })
    }
    fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let x = v.as_f64().ok_or_else(|| invalid(k, "a number", kind_of(v)))?;
                if !x.is_finite() {
                    return Err(invalid(k, "a finite number", x));
                }
                Ok(Some(x))
            }
        }
    }
}

#[cfg(test)]
mod tests;
