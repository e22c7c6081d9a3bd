//! A writer of DeepSeek's official release layout and precision (spec §1.1, §2, §6).
//!
//! [`write_official`] writes `config.json` in the legacy / official schema and every canonical tensor
//! of a config ([`canonical_tensors`]) under its official name, in the official precision:
//!
//! | Tensors | Stored as |
//! |---|---|
//! | attn `wq_a`/`wq_b`/`wkv`/`wo_a`/`wo_b`, indexer `wq_b`, shared experts `w1`/`w2`/`w3` | FP8 e4m3 + `<base>.scale` F8_E8M0 `[ceil(out/128), ceil(in/128)]` |
//! | routed experts `w1`/`w2`/`w3` | FP4 e2m1 packed I8 `[out, in/2]` (low nibble first) + `.scale` F8_E8M0 `[out, in/32]` |
//! | embed, head, every norm weight, compressor `wkv`/`wgate`, indexer `weights_proj`, `ffn.gate.weight` | BF16 |
//! | `attn_sink`, compressor `ape`, `hc_*_{fn,base,scale}`, `hc_head_*`, `ffn.gate.bias` | F32 |
//! | `ffn.gate.tid2eid` | I32 |
//!
//! Memory stays bounded: the shard plan is computed from shapes alone, then each shard is streamed
//! to disk one tensor at a time (one tensor's f32 values and stored bytes are alive at once).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{CheckpointError, StoredDtype, FP4_GROUP, FP8_BLOCK};
use crate::config::{Ds4Config, LayerKind, RouterKind};
use crate::quant;

/// Options of [`write_official`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfficialWriteOptions {
    /// Largest shard (tensor data bytes). When the whole model's tensor bytes exceed it, the weights
    /// are split into `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`;
    /// otherwise one `model.safetensors` is written. A single tensor (with its scale) larger than this
    /// gets a shard of its own. Must be at least 1.
    pub max_shard_bytes: u64,
}

impl Default for OfficialWriteOptions {
    /// 5 GB shards, about the size of the official release's shards.
    fn default() -> Self {
        OfficialWriteOptions { max_shard_bytes: 5_000_000_000 }
    }
}

/// Stored precision of a canonical tensor in the official release (spec §2 "Dtype" column, §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OfficialFormat {
    /// FP8 e4m3 with a ue8m0 scale per 128×128 block (`<base>.scale`, F8_E8M0).
    Fp8,
    /// FP4 e2m1 packed two per byte (I8 `[out, in/2]`) with a ue8m0 scale per 32 inputs.
    Fp4,
    /// bfloat16.
    Bf16,
    /// float32.
    F32,
    /// int32 table (`tid2eid`).
    I32,
}

/// One tensor the forward pass reads: canonical (= official) name, logical shape (`[out, in]` for
/// weights, FP4 unpacked) and its official stored precision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalTensor {
    /// Canonical name, e.g. `layers.3.attn.wq_a.weight`.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Official stored precision.
    pub format: OfficialFormat,
}

impl CanonicalTensor {
    /// Logical element count (parameters).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every canonical tensor of `cfg`'s main model (no MTP), in a fixed order: `embed.weight`, then per
/// layer attention (+ compressor / indexer by [`LayerKind`]), mHC, FFN norm, router (`gate.weight` +
/// `gate.bias` or `gate.tid2eid` by [`RouterKind`]), shared expert, routed experts; then `norm.weight`,
/// `hc_head_{fn,base,scale}`, `head.weight`. This is exactly the set the engine's
/// `ModelWeights::load` reads, with the same shapes (spec §2).
pub fn canonical_tensors(cfg: &Ds4Config) -> Vec<CanonicalTensor> {
    use OfficialFormat::*;
    let c = cfg;
    let d = c.hidden_size;
    let n = c.hc_mult;
    let hcd = c.num_attention_heads * c.head_dim;
    let mix = (2 + n) * n;
    let inter = c.moe_intermediate_size;
    let e = c.n_routed_experts;
    let mut out = Vec::new();
    fn push(out: &mut Vec<CanonicalTensor>, name: String, shape: Vec<usize>, format: OfficialFormat) {
        out.push(CanonicalTensor { name, shape, format });
    }
    fn compressor(out: &mut Vec<CanonicalTensor>, prefix: &str, width: usize, ratio: usize, overlap: bool, d: usize) {
        let o = if overlap { 2 * width } else { width };
        push(out, format!("{prefix}.wkv.weight"), vec![o, d], Bf16);
        push(out, format!("{prefix}.wgate.weight"), vec![o, d], Bf16);
        push(out, format!("{prefix}.ape"), vec![ratio, o], F32);
        push(out, format!("{prefix}.norm.weight"), vec![width], Bf16);
    }
    let o = &mut out;
    push(o, "embed.weight".into(), vec![c.vocab_size, d], Bf16);
    for l in 0..c.num_hidden_layers {
        let p = format!("layers.{l}");
        let kind = c.layer_kinds.get(l).copied().unwrap_or(LayerKind::Sliding);
        push(o, format!("{p}.attn_norm.weight"), vec![d], Bf16);
        push(o, format!("{p}.attn.wq_a.weight"), vec![c.q_lora_rank, d], Fp8);
        push(o, format!("{p}.attn.q_norm.weight"), vec![c.q_lora_rank], Bf16);
        push(o, format!("{p}.attn.wq_b.weight"), vec![hcd, c.q_lora_rank], Fp8);
        push(o, format!("{p}.attn.wkv.weight"), vec![c.head_dim, d], Fp8);
        push(o, format!("{p}.attn.kv_norm.weight"), vec![c.head_dim], Bf16);
        push(o, format!("{p}.attn.wo_a.weight"), vec![c.o_groups * c.o_lora_rank, hcd / c.o_groups.max(1)], Fp8);
        push(o, format!("{p}.attn.wo_b.weight"), vec![d, c.o_groups * c.o_lora_rank], Fp8);
        push(o, format!("{p}.attn.attn_sink"), vec![c.num_attention_heads], F32);
        match kind {
            LayerKind::Sliding => {}
            LayerKind::Hca { ratio } => compressor(o, &format!("{p}.attn.compressor"), c.head_dim, ratio, false, d),
            LayerKind::Csa { ratio } => {
                compressor(o, &format!("{p}.attn.compressor"), c.head_dim, ratio, true, d);
                push(o, format!("{p}.attn.indexer.wq_b.weight"), vec![c.index_n_heads * c.index_head_dim, c.q_lora_rank], Fp8);
                push(o, format!("{p}.attn.indexer.weights_proj.weight"), vec![c.index_n_heads, d], Bf16);
                compressor(o, &format!("{p}.attn.indexer.compressor"), c.index_head_dim, ratio, true, d);
            }
        }
        for sub in ["attn", "ffn"] {
            push(o, format!("{p}.hc_{sub}_fn"), vec![mix, n * d], F32);
            push(o, format!("{p}.hc_{sub}_base"), vec![mix], F32);
            push(o, format!("{p}.hc_{sub}_scale"), vec![3], F32);
        }
        push(o, format!("{p}.ffn_norm.weight"), vec![d], Bf16);
        push(o, format!("{p}.ffn.gate.weight"), vec![e, d], Bf16);
        match c.router_kinds.get(l).copied().unwrap_or(RouterKind::Score) {
            RouterKind::Hash => push(o, format!("{p}.ffn.gate.tid2eid"), vec![c.vocab_size, c.num_experts_per_tok], I32),
            RouterKind::Score => push(o, format!("{p}.ffn.gate.bias"), vec![e], F32),
        }
        for (prefix, fmt) in
            std::iter::once((format!("{p}.ffn.shared_experts"), Fp8)).chain((0..e).map(|x| (format!("{p}.ffn.experts.{x}"), Fp4)))
        {
            push(o, format!("{prefix}.w1.weight"), vec![inter, d], fmt);
            push(o, format!("{prefix}.w2.weight"), vec![d, inter], fmt);
            push(o, format!("{prefix}.w3.weight"), vec![inter, d], fmt);
        }
    }
    push(o, "norm.weight".into(), vec![d], Bf16);
    push(o, "hc_head_fn".into(), vec![n, n * d], F32);
    push(o, "hc_head_base".into(), vec![n], F32);
    push(o, "hc_head_scale".into(), vec![1], F32);
    push(o, "head.weight".into(), vec![c.vocab_size, d], Bf16);
    out
}

/// The canonical / official name of the scale companion of weight `name` (`<base>.scale`).
pub fn scale_name(name: &str) -> String {
    format!("{}.scale", name.strip_suffix(".weight").unwrap_or(name))
}

/// One stored tensor of the plan.
#[derive(Debug, Clone)]
struct Stored {
    name: String,
    dtype: StoredDtype,
    shape: Vec<usize>,
    len: usize,
}

/// A canonical tensor and what it becomes on disk (the weight, plus its scale for FP8/FP4).
#[derive(Debug, Clone)]
struct Unit {
    tensor: CanonicalTensor,
    stored: Vec<Stored>,
}

impl Unit {
    fn bytes(&self) -> u64 {
        self.stored.iter().map(|s| s.len as u64).sum()
    }
}

fn werr(path: &Path, tensor: &str, detail: impl Into<String>) -> CheckpointError {
    CheckpointError::Write { path: path.to_path_buf(), tensor: tensor.to_string(), detail: detail.into() }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// Plans the stored form of one canonical tensor; checks the FP4 / FP8 shape rules.
fn plan_unit(dir: &Path, t: CanonicalTensor) -> Result<Unit, CheckpointError> {
    let numel = t.numel();
    let two_d = |what: &str| -> Result<(usize, usize), CheckpointError> {
        match t.shape.as_slice() {
            &[r, c] => Ok((r, c)),
            s => Err(werr(dir, &t.name, format!("{what} weights must be 2-D [out, in], found shape {s:?}"))),
        }
    };
    let plain = |dtype: StoredDtype, width: usize| Stored {
        name: t.name.clone(),
        dtype,
        shape: t.shape.clone(),
        len: numel * width,
    };
    let stored = match t.format {
        OfficialFormat::Bf16 => vec![plain(StoredDtype::BF16, 2)],
        OfficialFormat::F32 => vec![plain(StoredDtype::F32, 4)],
        OfficialFormat::I32 => vec![plain(StoredDtype::I32, 4)],
        OfficialFormat::Fp8 => {
            let (r, c) = two_d("FP8")?;
            let s = vec![r.div_ceil(FP8_BLOCK), c.div_ceil(FP8_BLOCK)];
            vec![
                plain(StoredDtype::F8E4M3, 1),
                Stored { name: scale_name(&t.name), dtype: StoredDtype::F8E8M0, len: s[0] * s[1], shape: s },
            ]
        }
        OfficialFormat::Fp4 => {
            let (r, c) = two_d("FP4")?;
            if c % FP4_GROUP != 0 {
                return Err(werr(
                    dir,
                    &t.name,
                    format!(
                        "FP4 routed-expert weights need an input dimension divisible by {FP4_GROUP} \
                         (one ue8m0 scale per {FP4_GROUP} inputs, spec §6), found shape [{r}, {c}]; \
                         choose hidden_size and moe_intermediate_size as multiples of {FP4_GROUP}"
                    ),
                ));
            }
            vec![
                Stored { name: t.name.clone(), dtype: StoredDtype::I8, shape: vec![r, c / 2], len: r * c / 2 },
                Stored {
                    name: scale_name(&t.name),
                    dtype: StoredDtype::F8E8M0,
                    shape: vec![r, c / FP4_GROUP],
                    len: r * (c / FP4_GROUP),
                },
            ]
        }
    };
    Ok(Unit { tensor: t, stored })
}

/// Quantizes / encodes one unit into its stored byte buffers (same order as `unit.stored`).
fn encode_unit(
    file: &Path,
    unit: &Unit,
    values: &dyn Fn(&str, &[usize]) -> Vec<f32>,
    tables: &dyn Fn(&str, &[usize]) -> Vec<i64>,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let t = &unit.tensor;
    let numel = t.numel();
    let qerr = |source| CheckpointError::Quant { file: file.to_path_buf(), tensor: t.name.clone(), source };
    if t.format == OfficialFormat::I32 {
        let ids = tables(&t.name, &t.shape);
        if ids.len() != numel {
            return Err(werr(file, &t.name, format!("tables() gave {} ids, expected {numel} for shape {:?}", ids.len(), t.shape)));
        }
        let mut out = Vec::with_capacity(numel * 4);
        for (i, &v) in ids.iter().enumerate() {
            let v = i32::try_from(v)
                .map_err(|_| werr(file, &t.name, format!("entry {i} = {v} does not fit the official I32 table")))?;
            out.extend_from_slice(&v.to_le_bytes());
        }
        return Ok(vec![out]);
    }
    let v = values(&t.name, &t.shape);
    if v.len() != numel {
        return Err(werr(file, &t.name, format!("values() gave {} values, expected {numel} for shape {:?}", v.len(), t.shape)));
    }
    Ok(match t.format {
        OfficialFormat::Bf16 => vec![v.iter().flat_map(|x| quant::f32_to_bf16(*x).to_le_bytes()).collect()],
        OfficialFormat::F32 => vec![v.iter().flat_map(|x| x.to_le_bytes()).collect()],
        OfficialFormat::Fp8 => {
            let (q, s) = quant::quantize_fp8_blocked(&v, t.shape[0], t.shape[1], FP8_BLOCK).map_err(qerr)?;
            vec![q, s]
        }
        OfficialFormat::Fp4 => {
            let (q, s) = quant::quantize_fp4_grouped(&v, t.shape[0], t.shape[1], FP4_GROUP).map_err(qerr)?;
            vec![q, s]
        }
        OfficialFormat::I32 => unreachable!("handled above"),
    })
}

/// Streams one safetensors file: header from the plan, then each unit's bytes as it is encoded.
/// Returns the file's size in bytes.
fn write_shard(
    path: &Path,
    units: &[Unit],
    values: &dyn Fn(&str, &[usize]) -> Vec<f32>,
    tables: &dyn Fn(&str, &[usize]) -> Vec<i64>,
) -> Result<u64, CheckpointError> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0usize;
    for s in units.iter().flat_map(|u| &u.stored) {
        if header.contains_key(&s.name) {
            return Err(werr(path, &s.name, "duplicate tensor name"));
        }
        header.insert(
            s.name.clone(),
            json!({ "dtype": s.dtype.header_name(), "shape": s.shape, "data_offsets": [offset, offset + s.len] }),
        );
        offset += s.len;
    }
    let mut text = serde_json::to_string(&Value::Object(header))
        .map_err(|e| werr(path, "", format!("header serialisation failed: {e}")))?;
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(text.len() as u64).to_le_bytes()).map_err(io(path))?;
    w.write_all(text.as_bytes()).map_err(io(path))?;
    for u in units {
        let bufs = encode_unit(path, u, values, tables)?;
        for (s, b) in u.stored.iter().zip(&bufs) {
            if b.len() != s.len {
                return Err(werr(path, &s.name, format!("encoded {} bytes, expected {} for {} {:?}", b.len(), s.len, s.dtype, s.shape)));
            }
            w.write_all(b).map_err(io(path))?;
        }
    }
    w.flush().map_err(io(path))?;
    Ok(8 + text.len() as u64 + offset as u64)
}

/// The `config.json` of `cfg` in the legacy / official schema (spec §1.1): `compress_ratios` (one per
/// main layer, no MTP entries), `num_hash_layers`, `qk_rope_head_dim`, `rope_theta` /
/// `compress_rope_theta` + `rope_scaling` (YaRN of the compress rope), `quantization_config` (fp8 e4m3,
/// ue8m0, [128, 128], dynamic) and `expert_dtype` fp4; `num_nextn_predict_layers` 0.
/// `compress_rates` is added only when the CSA / HCA rates differ from Flash's 4 / 128 (otherwise the
/// ratios could not be told apart).
///
/// Errors ([`CheckpointError::Write`] on `config.json`, naming the field): hash-routed layers that are
/// not a prefix of the layers; a YaRN main rope; CSA (or HCA) layers of different ratios; equal CSA and
/// HCA ratios; anything else that does not parse back to the same config.
pub fn official_config_json(cfg: &Ds4Config, config_path: &Path) -> Result<Value, CheckpointError> {
    let bad = |field: &str, detail: String| werr(config_path, field, detail);
    let n_layers = cfg.num_hidden_layers;
    if cfg.layer_kinds.len() != n_layers || cfg.router_kinds.len() != n_layers {
        return Err(bad(
            "num_hidden_layers",
            format!(
                "expected {n_layers} layer kinds and router kinds, found {} and {}",
                cfg.layer_kinds.len(),
                cfg.router_kinds.len()
            ),
        ));
    }
    let n_hash = cfg.router_kinds.iter().take_while(|k| **k == RouterKind::Hash).count();
    if let Some(i) = cfg.router_kinds[n_hash..].iter().position(|k| *k == RouterKind::Hash) {
        return Err(bad(
            "num_hash_layers",
            format!(
                "the official schema can only express hash-routed layers as a prefix (num_hash_layers), \
                 but layer {} is hash-routed after score-routed layer {n_hash} (router kinds {:?})",
                n_hash + i,
                cfg.router_kinds
            ),
        ));
    }
    if cfg.rope_main.yarn.is_some() {
        return Err(bad(
            "rope_scaling",
            "the official schema applies YaRN (rope_scaling) to the compressed layers' rope only, \
             but the main rope has YaRN scaling"
                .into(),
        ));
    }
    let uniform = |label: &str, pick: fn(&LayerKind) -> Option<usize>| -> Result<Option<usize>, CheckpointError> {
        let mut rates: Vec<usize> = cfg.layer_kinds.iter().filter_map(pick).collect();
        rates.sort_unstable();
        rates.dedup();
        match rates.as_slice() {
            [] => Ok(None),
            [r] => Ok(Some(*r)),
            rs => Err(bad(
                "compress_ratios",
                format!("the official schema has one {label} ratio, found {label} layers with ratios {rs:?}"),
            )),
        }
    };
    let csa = uniform("CSA", |k| match k {
        LayerKind::Csa { ratio } => Some(*ratio),
        _ => None,
    })?;
    let hca = uniform("HCA", |k| match k {
        LayerKind::Hca { ratio } => Some(*ratio),
        _ => None,
    })?;
    let (mut csa_eff, mut hca_eff) = (csa.unwrap_or(4), hca.unwrap_or(128));
    if csa_eff == hca_eff {
        match (csa, hca) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "compress_ratios",
                    format!("CSA and HCA layers share the ratio {csa_eff}; compress_ratios could not tell them apart"),
                ))
            }
            (None, _) => csa_eff = hca_eff + 1,
            (_, None) => hca_eff = csa_eff + 1,
        }
    }
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    put("architectures", json!(["DeepseekV4ForCausalLM"]));
    put("model_type", json!("deepseek_v4"));
    put("vocab_size", json!(cfg.vocab_size));
    put("hidden_size", json!(cfg.hidden_size));
    put("num_hidden_layers", json!(n_layers));
    put("num_attention_heads", json!(cfg.num_attention_heads));
    put("num_key_value_heads", json!(1));
    put("head_dim", json!(cfg.head_dim));
    put("qk_rope_head_dim", json!(cfg.qk_rope_head_dim));
    put("qk_nope_head_dim", json!(cfg.nope_head_dim()));
    put("q_lora_rank", json!(cfg.q_lora_rank));
    put("o_groups", json!(cfg.o_groups));
    put("o_lora_rank", json!(cfg.o_lora_rank));
    put("sliding_window", json!(cfg.sliding_window));
    put("compress_ratios", json!(cfg.layer_kinds.iter().map(|k| k.ratio()).collect::<Vec<_>>()));
    if (csa_eff, hca_eff) != (4, 128) {
        put(
            "compress_rates",
            json!({ "compressed_sparse_attention": csa_eff, "heavily_compressed_attention": hca_eff }),
        );
    }
    put("num_hash_layers", json!(n_hash));
    put("rope_theta", json!(cfg.rope_main.theta));
    put("compress_rope_theta", json!(cfg.rope_compress.theta));
    if let Some(y) = cfg.rope_compress.yarn {
        let mut rs = json!({
            "type": "yarn",
            "factor": y.factor,
            "original_max_position_embeddings": y.original_max_position_embeddings,
            "beta_fast": y.beta_fast,
            "beta_slow": y.beta_slow,
        });
        if y.attention_factor != 1.0 {
            rs["attention_factor"] = json!(y.attention_factor);
        }
        if !y.truncate {
            rs["truncate"] = json!(false);
        }
        put("rope_scaling", rs);
    }
    put("index_n_heads", json!(cfg.index_n_heads));
    put("index_head_dim", json!(cfg.index_head_dim));
    put("index_topk", json!(cfg.index_topk));
    put("n_routed_experts", json!(cfg.n_routed_experts));
    put("num_experts_per_tok", json!(cfg.num_experts_per_tok));
    put("n_shared_experts", json!(1));
    put("moe_intermediate_size", json!(cfg.moe_intermediate_size));
    put(
        "scoring_func",
        json!(match cfg.scoring_func {
            crate::config::ScoringFunc::SqrtSoftplus => "sqrtsoftplus",
            crate::config::ScoringFunc::Sigmoid => "sigmoid",
        }),
    );
    put("topk_method", json!("noaux_tc"));
    put("norm_topk_prob", json!(true));
    put("routed_scaling_factor", json!(cfg.routed_scaling_factor));
    put("swiglu_limit", json!(cfg.swiglu_limit));
    put("hc_mult", json!(cfg.hc_mult));
    put("hc_sinkhorn_iters", json!(cfg.hc_sinkhorn_iters));
    put("hc_eps", json!(cfg.hc_eps));
    put("rms_norm_eps", json!(cfg.rms_norm_eps));
    put("num_nextn_predict_layers", json!(0));
    put("max_position_embeddings", json!(cfg.max_position_embeddings));
    put("bos_token_id", json!(cfg.bos_token_id));
    match cfg.eos_token_ids.as_slice() {
        [] => {}
        [e] => put("eos_token_id", json!(e)),
        es => put("eos_token_id", json!(es)),
    }
    put("tie_word_embeddings", json!(false));
    put("hidden_act", json!("silu"));
    put("attention_bias", json!(false));
    put("torch_dtype", json!("bfloat16"));
    put(
        "quantization_config",
        json!({
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            "activation_scheme": "dynamic",
        }),
    );
    put("expert_dtype", json!("fp4"));
    let value = Value::Object(m);

    // The written config must describe the same model.
    let back = Ds4Config::from_json(&value)
        .map_err(|e| bad("config.json", format!("the official config does not parse back: {e}")))?;
    let mut same = back.clone();
    same.num_nextn_predict_layers = cfg.num_nextn_predict_layers;
    same.quant = cfg.quant.clone();
    if &same != cfg {
        return Err(bad(
            "config.json",
            format!("the official schema cannot express this config: it parses back as {back:?}, expected {cfg:?}"),
        ));
    }
    Ok(value)
}

/// Writes `dir/config.json` (legacy / official schema, see [`official_config_json`]) and every
/// canonical tensor of `cfg` ([`canonical_tensors`]) under its official name and precision (module
/// docs; spec §2, §6). `values(name, shape)` gives the f32 values of each canonical tensor (row-major,
/// logical shape), `tables(name, shape)` the `tid2eid` expert ids.
///
/// Files: one `model.safetensors` when the tensor bytes fit in `opts.max_shard_bytes` (a stale
/// `model.safetensors.index.json` in `dir` is removed), else `model-{i:05}-of-{n:05}.safetensors` and
/// `model.safetensors.index.json` (`metadata.total_size`, `weight_map`). Each shard is streamed one
/// tensor at a time. Returns the number of bytes written over all files (shards with their headers,
/// index, config).
///
/// Errors: [`CheckpointError::Write`] for a config the official schema cannot express, an FP4 weight
/// whose input dimension is not a multiple of 32, `max_shard_bytes` 0, a `values`/`tables` result of
/// the wrong length or a table id beyond i32; [`CheckpointError::Quant`] for non-finite values of an
/// FP8/FP4 tensor; [`CheckpointError::Io`].
pub fn write_official(
    dir: &Path,
    cfg: &Ds4Config,
    values: &dyn Fn(&str, &[usize]) -> Vec<f32>,
    tables: &dyn Fn(&str, &[usize]) -> Vec<i64>,
    opts: &OfficialWriteOptions,
) -> Result<u64, CheckpointError> {
    if opts.max_shard_bytes == 0 {
        return Err(werr(dir, "", "max_shard_bytes must be at least 1"));
    }
    let config_path = dir.join("config.json");
    let config = official_config_json(cfg, &config_path)?;
    let units = canonical_tensors(cfg)
        .into_iter()
        .map(|t| plan_unit(dir, t))
        .collect::<Result<Vec<_>, _>>()?;

    // Greedy shard plan from sizes alone.
    let total: u64 = units.iter().map(Unit::bytes).sum();
    let mut shards: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut acc) = (0usize, 0u64);
    for (i, u) in units.iter().enumerate() {
        if i > start && acc + u.bytes() > opts.max_shard_bytes {
            shards.push(start..i);
            start = i;
            acc = 0;
        }
        acc += u.bytes();
    }
    shards.push(start..units.len());

    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_text = serde_json::to_string_pretty(&config)
        .map_err(|e| werr(&config_path, "config.json", format!("serialisation failed: {e}")))?;
    std::fs::write(&config_path, &config_text).map_err(io(&config_path))?;
    let mut written = config_text.len() as u64;

    let index_path = dir.join("model.safetensors.index.json");
    if shards.len() == 1 {
        if index_path.exists() {
            std::fs::remove_file(&index_path).map_err(io(&index_path))?;
        }
        written += write_shard(&dir.join("model.safetensors"), &units, values, tables)?;
        return Ok(written);
    }
    let n = shards.len();
    let mut weight_map = Map::new();
    for (i, r) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let path: PathBuf = dir.join(&file);
        written += write_shard(&path, &units[r.clone()], values, tables)?;
        for s in units[r.clone()].iter().flat_map(|u| &u.stored) {
            weight_map.insert(s.name.clone(), Value::String(file.clone()));
        }
    }
    let index = json!({ "metadata": { "total_size": total }, "weight_map": Value::Object(weight_map) });
    let index_text = serde_json::to_string_pretty(&index)
        .map_err(|e| werr(&index_path, "", format!("index serialisation failed: {e}")))?;
    std::fs::write(&index_path, &index_text).map_err(io(&index_path))?;
    written += index_text.len() as u64;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, NamingScheme};

    /// A tiny config: sliding / CSA / HCA, hash then score routers, non-Flash HCA rate.
    fn tiny() -> Ds4Config {
        Ds4Config::from_json(&json!({
            "model_type": "deepseek_v4", "vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
            "q_lora_rank": 48, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 4,
            "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            "mlp_layer_types": ["hash_moe", "moe", "moe"],
            "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": 10000.0},
                "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                             "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
            },
            "index_n_heads": 2, "index_head_dim": 16, "index_topk": 2,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
            "hc_mult": 2, "hc_sinkhorn_iters": 3, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
            "bos_token_id": 0, "eos_token_id": 1
        }))
        .unwrap()
    }

    fn vals(name: &str, shape: &[usize]) -> Vec<f32> {
        let n: usize = shape.iter().product();
        let h = name.bytes().fold(7u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32));
        (0..n).map(|i| ((h.wrapping_add((i as u32).wrapping_mul(2654435761)) >> 8) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    fn tabs(_: &str, shape: &[usize]) -> Vec<i64> {
        (0..shape[0] * shape[1]).map(|i| (i % 4) as i64).collect()
    }

    fn big() -> OfficialWriteOptions {
        OfficialWriteOptions { max_shard_bytes: u64::MAX }
    }

    #[test]
    fn official_writer_single_file_reopens_with_official_formats() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny();
        let bytes = write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap();
        assert!(dir.path().join("model.safetensors").is_file());
        assert!(!dir.path().join("model.safetensors.index.json").exists());
        let ck = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ck.scheme(), NamingScheme::Official);
        assert_eq!(ck.files().len(), 1);
        let file_len = std::fs::metadata(dir.path().join("model.safetensors")).unwrap().len();
        let cfg_len = std::fs::metadata(dir.path().join("config.json")).unwrap().len();
        assert_eq!(bytes, file_len + cfg_len);

        let tensors = canonical_tensors(&cfg);
        let mut expected_names: Vec<String> = Vec::new();
        for t in &tensors {
            expected_names.push(t.name.clone());
            if matches!(t.format, OfficialFormat::Fp8 | OfficialFormat::Fp4) {
                expected_names.push(scale_name(&t.name));
            }
        }
        expected_names.sort();
        assert_eq!(ck.names(), expected_names);

        let fmt = |n: &str| ck.format_of(n).unwrap();
        assert_eq!(fmt("layers.0.attn.wq_a.weight"), "fp8-e4m3 (ue8m0 128x128)");
        assert_eq!(fmt("layers.1.attn.indexer.wq_b.weight"), "fp8-e4m3 (ue8m0 128x128)");
        assert_eq!(fmt("layers.2.ffn.shared_experts.w2.weight"), "fp8-e4m3 (ue8m0 128x128)");
        assert_eq!(fmt("layers.2.ffn.experts.3.w2.weight"), "fp4-e2m1 (ue8m0 /32)");
        assert_eq!(fmt("layers.0.ffn.experts.0.w1.weight"), "fp4-e2m1 (ue8m0 /32)");
        assert_eq!(fmt("embed.weight"), "bf16");
        assert_eq!(fmt("head.weight"), "bf16");
        assert_eq!(fmt("layers.1.attn.compressor.wkv.weight"), "bf16");
        assert_eq!(fmt("layers.1.attn.indexer.compressor.norm.weight"), "bf16");
        assert_eq!(fmt("layers.1.attn.indexer.weights_proj.weight"), "bf16");
        assert_eq!(fmt("layers.1.ffn.gate.weight"), "bf16");
        assert_eq!(fmt("layers.1.attn.compressor.ape"), "f32");
        assert_eq!(fmt("layers.1.attn.attn_sink"), "f32");
        assert_eq!(fmt("layers.1.hc_ffn_fn"), "f32");
        assert_eq!(fmt("hc_head_scale"), "f32");
        assert_eq!(fmt("layers.1.ffn.gate.bias"), "f32");
        assert_eq!(fmt("layers.0.ffn.gate.tid2eid"), "i32");
        assert_eq!(fmt("layers.0.attn.wq_a.scale"), "ue8m0");

        // Stored shapes (spec §2 / §6).
        let info = |n: &str| ck.info(n).unwrap();
        assert_eq!(info("layers.0.attn.wq_b.weight").shape, vec![64, 48]);
        assert_eq!(info("layers.0.attn.wq_b.scale").shape, vec![1, 1]);
        assert_eq!(info("layers.0.ffn.experts.1.w1.weight").shape, vec![32, 32]);
        assert_eq!(info("layers.0.ffn.experts.1.w1.weight").dtype, StoredDtype::I8);
        assert_eq!(info("layers.0.ffn.experts.1.w1.scale").shape, vec![32, 2]);
        assert_eq!(info("layers.0.ffn.experts.1.w2.scale").shape, vec![64, 1]);
        assert_eq!(info("layers.0.ffn.experts.1.w2.scale").dtype, StoredDtype::F8E8M0);
        assert_eq!(info("layers.2.attn.compressor.ape").shape, vec![8, 32]);
        assert_eq!(info("layers.1.attn.compressor.ape").shape, vec![4, 64]);

        // Values round-trip within the formats' precision; exact for F32 and tables.
        for t in &tensors {
            if t.format == OfficialFormat::I32 {
                assert_eq!(ck.load_i64(&t.name, &t.shape).unwrap(), tabs(&t.name, &t.shape));
                continue;
            }
            let got = ck.load_f32(&t.name, &t.shape).unwrap();
            let want = vals(&t.name, &t.shape);
            let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let tol = match t.format {
                OfficialFormat::F32 => 0.0,
                OfficialFormat::Bf16 => amax * 2f32.powi(-8),
                OfficialFormat::Fp8 => amax * 2f32.powi(-3),
                OfficialFormat::Fp4 => amax * 0.5,
                OfficialFormat::I32 => unreachable!(),
            };
            let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol, "{}: max err {err} > {tol}", t.name);
            if t.format != OfficialFormat::F32 {
                assert_ne!(got, want, "{}: expected a lossy format", t.name);
            }
        }

        // Readable by the `safetensors` crate as well.
        let raw = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
        assert_eq!(st.len(), expected_names.len());
    }

    #[test]
    fn official_writer_shards_with_index() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny();
        let one = tempfile::tempdir().unwrap();
        write_official(one.path(), &cfg, &vals, &tabs, &big()).unwrap();
        let total = Checkpoint::open(one.path()).unwrap().total_bytes();

        let opts = OfficialWriteOptions { max_shard_bytes: 16 * 1024 };
        let bytes = write_official(dir.path(), &cfg, &vals, &tabs, &opts).unwrap();
        let index: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap()).unwrap();
        assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
        let ck = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ck.scheme(), NamingScheme::Official);
        let files = ck.files();
        let n = files.len();
        assert!(n >= 3, "expected several shards, found {n}");
        for (i, f) in files.iter().enumerate() {
            assert_eq!(
                f.file_name().unwrap().to_str().unwrap(),
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            );
            // Within the limit, unless a single tensor is larger than it.
            let data = std::fs::metadata(f).unwrap().len();
            assert!(data < 16 * 1024 + 64 * 1024, "{f:?}: {data} bytes");
        }
        assert_eq!(ck.total_bytes(), total);
        let sum: u64 = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum::<u64>()
            + std::fs::metadata(dir.path().join("model.safetensors.index.json")).unwrap().len()
            + std::fs::metadata(dir.path().join("config.json")).unwrap().len();
        assert_eq!(bytes, sum);
        // Same decoded values as the single-file copy; weights and scales stay together.
        let single = Checkpoint::open(one.path()).unwrap();
        assert_eq!(ck.names(), single.names());
        for t in canonical_tensors(&cfg) {
            if t.format == OfficialFormat::I32 {
                continue;
            }
            assert_eq!(ck.load_f32(&t.name, &t.shape).unwrap(), single.load_f32(&t.name, &t.shape).unwrap(), "{}", t.name);
            if matches!(t.format, OfficialFormat::Fp8 | OfficialFormat::Fp4) {
                assert_eq!(ck.info(&t.name).unwrap().file, ck.info(&scale_name(&t.name)).unwrap().file);
            }
        }
        // A single-file rewrite into the sharded directory removes the stale index.
        write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap();
        assert!(!dir.path().join("model.safetensors.index.json").exists());
        assert_eq!(Checkpoint::open(dir.path()).unwrap().files().len(), 1);
    }

    #[test]
    fn official_writer_config_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny();
        write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap();
        let raw: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        // Legacy / official schema fields.
        assert_eq!(raw["compress_ratios"], json!([0, 4, 8]));
        assert_eq!(raw["num_hash_layers"], json!(1));
        assert_eq!(raw["qk_rope_head_dim"], json!(8));
        assert_eq!(raw["num_nextn_predict_layers"], json!(0));
        assert_eq!(raw["rope_scaling"]["type"], json!("yarn"));
        assert_eq!(raw["quantization_config"]["fmt"], json!("e4m3"));
        assert_eq!(raw["quantization_config"]["scale_fmt"], json!("ue8m0"));
        assert_eq!(raw["quantization_config"]["weight_block_size"], json!([128, 128]));
        assert_eq!(raw["quantization_config"]["activation_scheme"], json!("dynamic"));
        assert_eq!(raw["expert_dtype"], json!("fp4"));
        assert!(raw.get("layer_types").is_none() && raw.get("mlp_layer_types").is_none());

        let back = Ds4Config::from_file(dir.path()).unwrap();
        assert_eq!(back.layer_kinds, cfg.layer_kinds);
        assert_eq!(back.router_kinds, cfg.router_kinds);
        assert_eq!(back.rope_main, cfg.rope_main);
        assert_eq!(back.rope_compress, cfg.rope_compress);
        assert_eq!(
            (back.vocab_size, back.hidden_size, back.num_hidden_layers, back.num_attention_heads, back.head_dim),
            (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim)
        );
        assert_eq!(
            (back.qk_rope_head_dim, back.q_lora_rank, back.o_groups, back.o_lora_rank, back.sliding_window),
            (cfg.qk_rope_head_dim, cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.sliding_window)
        );
        assert_eq!(
            (back.index_n_heads, back.index_head_dim, back.index_topk),
            (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk)
        );
        assert_eq!(
            (back.n_routed_experts, back.num_experts_per_tok, back.moe_intermediate_size, back.hc_mult),
            (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.hc_mult)
        );
        assert_eq!(back.quant.method.as_deref(), Some("fp8"));
        assert_eq!(back.quant.expert_dtype.as_deref(), Some("fp4"));
        assert_eq!(back.quant.weight_block_size, Some([128, 128]));
        // Everything else survives too.
        let mut same = back.clone();
        same.quant = cfg.quant.clone();
        same.num_nextn_predict_layers = cfg.num_nextn_predict_layers;
        assert_eq!(same, cfg);

        // Flash rates (4 / 128) need no compress_rates.
        let mut flash = cfg.clone();
        flash.layer_kinds = vec![LayerKind::Sliding, LayerKind::Csa { ratio: 4 }, LayerKind::Hca { ratio: 128 }];
        let v = official_config_json(&flash, Path::new("config.json")).unwrap();
        assert!(v.get("compress_rates").is_none());
        assert_eq!(v["compress_ratios"], json!([0, 4, 128]));
        // Only HCA layers, at rate 4: the absent CSA rate is moved out of the way.
        let mut hca4 = cfg.clone();
        hca4.layer_kinds = vec![LayerKind::Sliding, LayerKind::Hca { ratio: 4 }, LayerKind::Hca { ratio: 4 }];
        let v = official_config_json(&hca4, Path::new("config.json")).unwrap();
        assert_eq!(Ds4Config::from_json(&v).unwrap().layer_kinds, hca4.layer_kinds);
    }

    #[test]
    fn official_writer_errors() {
        let dir = tempfile::tempdir().unwrap();
        let msg = |e: CheckpointError| e.to_string();

        // Hash layers not a prefix.
        let mut cfg = tiny();
        cfg.router_kinds = vec![RouterKind::Score, RouterKind::Hash, RouterKind::Score];
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap_err());
        assert!(e.contains("num_hash_layers") && e.contains("prefix") && e.contains("layer 1"), "{e}");
        assert!(!dir.path().join("config.json").exists(), "nothing is written on a config error");

        // FP4 needs in % 32 == 0 (hidden 48 → w1/w3 in = 48).
        let mut cfg = tiny();
        cfg.hidden_size = 48;
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap_err());
        assert!(e.contains("layers.0.ffn.experts.0.w1.weight") && e.contains("divisible by 32") && e.contains("[32, 48]"), "{e}");

        // FP8 partial blocks are fine (wq_b is [64, 48], one partial block).
        // Mixed CSA ratios and equal CSA/HCA ratios cannot be expressed.
        let mut cfg = tiny();
        cfg.layer_kinds = vec![LayerKind::Csa { ratio: 4 }, LayerKind::Csa { ratio: 2 }, LayerKind::Hca { ratio: 8 }];
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap_err());
        assert!(e.contains("compress_ratios") && e.contains("[2, 4]"), "{e}");
        let mut cfg = tiny();
        cfg.layer_kinds = vec![LayerKind::Sliding, LayerKind::Csa { ratio: 8 }, LayerKind::Hca { ratio: 8 }];
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap_err());
        assert!(e.contains("share the ratio 8"), "{e}");
        // YaRN on the main rope.
        let mut cfg = tiny();
        cfg.rope_main.yarn = cfg.rope_compress.yarn;
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &big()).unwrap_err());
        assert!(e.contains("rope_scaling") && e.contains("main rope"), "{e}");

        // Bad callbacks and options.
        let cfg = tiny();
        let short = |_: &str, _: &[usize]| vec![0f32; 3];
        let e = msg(write_official(dir.path(), &cfg, &short, &tabs, &big()).unwrap_err());
        assert!(e.contains("embed.weight") && e.contains("gave 3 values"), "{e}");
        let nan = |n: &str, s: &[usize]| {
            let mut v = vals(n, s);
            if n.contains("wq_a") {
                v[5] = f32::NAN;
            }
            v
        };
        let e = msg(write_official(dir.path(), &cfg, &nan, &tabs, &big()).unwrap_err());
        assert!(e.contains("layers.0.attn.wq_a.weight") && e.contains("finite"), "{e}");
        let huge = |_: &str, s: &[usize]| vec![i64::MAX; s[0] * s[1]];
        let e = msg(write_official(dir.path(), &cfg, &vals, &huge, &big()).unwrap_err());
        assert!(e.contains("tid2eid") && e.contains("I32"), "{e}");
        let e = msg(write_official(dir.path(), &cfg, &vals, &tabs, &OfficialWriteOptions { max_shard_bytes: 0 }).unwrap_err());
        assert!(e.contains("max_shard_bytes"), "{e}");
    }
}
