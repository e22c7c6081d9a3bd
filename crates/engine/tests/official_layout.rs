//! A tiny model written in DeepSeek's official naming with FP8 and FP4 weights
//! (`flashseek_model::checkpoint::official::write_official`, sharded) loads and produces logits equal
//! (bitwise) to the same model's dequantized weights saved in the transformers `save_pretrained`
//! layout (f32, `model.`-prefixed official names, spec §2 "Observed on disk"). The quantized model
//! also differs measurably from the unquantized FormulaSource model it was written from (so the
//! quantization really happened) while staying close to it (NMSE printed).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use flashseek_engine::forward::{forward, ForwardOptions};
use flashseek_engine::testing::{formula_ids, FormulaSource};
use flashseek_engine::weights::{ModelWeights, TensorSource, WeightsError};
use flashseek_model::checkpoint::official::{canonical_tensors, write_official, OfficialFormat, OfficialWriteOptions};
use flashseek_model::checkpoint::{write_safetensors, Checkpoint, NamingScheme, StoredDtype};
use flashseek_model::config::{Ds4Config, LayerKind, RouterKind};

const SEED: u64 = 20260731;
const TOKENS: usize = 40;

/// hidden 128, 3 layers sliding / CSA (ratio 4) / HCA (ratio 8), hash + score routers, small window
/// and top-k, expert widths divisible by 32 (FP4 groups), FP8 tiles partial in places.
fn tiny_config() -> Ds4Config {
    Ds4Config::from_json(&serde_json::json!({
        "model_type": "deepseek_v4", "vocab_size": 256, "hidden_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "partial_rotary_factor": 0.25,
        "q_lora_rank": 96, "o_groups": 2, "o_lora_rank": 32, "sliding_window": 8,
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        "mlp_layer_types": ["hash_moe", "moe", "moe"],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                         "attention_factor": 1.0, "partial_rotary_factor": 0.25}
        },
        "index_n_heads": 4, "index_head_dim": 32, "index_topk": 3,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1
    }))
    .expect("tiny config is valid")
}

/// The transformers `save_pretrained` name of a canonical tensor (spec §2 "Observed on disk").
fn hf_saved_name(canonical: &str) -> String {
    match canonical {
        "embed.weight" => "model.embed_tokens.weight".into(),
        "norm.weight" => "model.norm.weight".into(),
        "head.weight" => "head.weight".into(),
        "hc_head_fn" => "model.hc_head.hc_fn".into(),
        "hc_head_base" => "model.hc_head.hc_base".into(),
        "hc_head_scale" => "model.hc_head.hc_scale".into(),
        other => match other.strip_suffix(".attn.kv_norm.weight") {
            // transformers writes the attention's kv_norm as `attn.norm.weight`.
            Some(layer) => format!("model.{layer}.attn.norm.weight"),
            None => format!("model.{other}"),
        },
    }
}

/// Records every (name, shape) ModelWeights::load asks for.
struct Recording<'a> {
    inner: &'a dyn TensorSource,
    seen: RefCell<BTreeSet<(String, Vec<usize>)>>,
}

impl TensorSource for Recording<'_> {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        self.seen.borrow_mut().insert((name.to_string(), shape.to_vec()));
        self.inner.load_f32(name, shape)
    }
    fn load_i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightsError> {
        self.seen.borrow_mut().insert((name.to_string(), shape.to_vec()));
        self.inner.load_i64(name, shape)
    }
}

/// Writes the dequantized tensors of `ck` in the transformers layout (f32, tid2eid I64).
fn write_hf_saved(dir: &Path, cfg: &Ds4Config, ck: &Checkpoint) {
    std::fs::create_dir_all(dir).unwrap();
    let mut tensors = Vec::new();
    for t in canonical_tensors(cfg) {
        let (dtype, bytes): (StoredDtype, Vec<u8>) = if t.format == OfficialFormat::I32 {
            let ids = ck.load_i64(&t.name, &t.shape).unwrap();
            (StoredDtype::I64, ids.iter().flat_map(|v| v.to_le_bytes()).collect())
        } else {
            let v = ck.load_f32(&t.name, &t.shape).unwrap();
            (StoredDtype::F32, v.iter().flat_map(|v| v.to_le_bytes()).collect())
        };
        tensors.push((hf_saved_name(&t.name), dtype, t.shape.clone(), bytes));
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg.to_hf_json()).unwrap()).unwrap();
}

/// The config fields that describe the network (everything but the declared storage and MTP).
fn network(cfg: &Ds4Config) -> Ds4Config {
    let mut c = cfg.clone();
    c.quant = Default::default();
    c.num_nextn_predict_layers = 0;
    c
}

#[test]
fn official_fp8_fp4_checkpoint_matches_its_dequantized_hf_copy() {
    let cfg = tiny_config();
    assert_eq!(
        cfg.layer_kinds,
        vec![LayerKind::Sliding, LayerKind::Csa { ratio: 4 }, LayerKind::Hca { ratio: 8 }]
    );
    assert_eq!(cfg.router_kinds, vec![RouterKind::Hash, RouterKind::Score, RouterKind::Score]);
    let formula = FormulaSource { seed: SEED, n_experts: cfg.n_routed_experts };

    // The writer enumerates exactly the tensors (and shapes) the forward reads.
    let rec = Recording { inner: &formula, seen: RefCell::new(BTreeSet::new()) };
    let unquantized = ModelWeights::load(&cfg, &rec).expect("formula weights load");
    let listed: BTreeSet<(String, Vec<usize>)> = canonical_tensors(&cfg).into_iter().map(|t| (t.name, t.shape)).collect();
    assert_eq!(*rec.seen.borrow(), listed, "canonical_tensors == what ModelWeights::load reads");

    // 1. Official layout, FP8 + FP4, sharded.
    let tmp = tempfile::tempdir().unwrap();
    let off_dir = tmp.path().join("official");
    let values = |n: &str, s: &[usize]| formula.load_f32(n, s).expect("formula values");
    let tables = |n: &str, s: &[usize]| formula.load_i64(n, s).expect("formula tables");
    let written =
        write_official(&off_dir, &cfg, &values, &tables, &OfficialWriteOptions { max_shard_bytes: 96 * 1024 }).unwrap();
    let off = Checkpoint::open(&off_dir).expect("official checkpoint opens");
    assert_eq!(off.scheme(), NamingScheme::Official);
    assert!(off_dir.join("model.safetensors.index.json").is_file());
    let shards = off.files().len();
    assert!(shards >= 2, "expected >= 2 shards, found {shards}");
    for (name, fmt) in [
        ("layers.0.attn.wq_a.weight", "fp8-e4m3 (ue8m0 128x128)"),
        ("layers.1.attn.wo_a.weight", "fp8-e4m3 (ue8m0 128x128)"),
        ("layers.1.attn.indexer.wq_b.weight", "fp8-e4m3 (ue8m0 128x128)"),
        ("layers.2.ffn.shared_experts.w1.weight", "fp8-e4m3 (ue8m0 128x128)"),
        ("layers.0.ffn.experts.7.w2.weight", "fp4-e2m1 (ue8m0 /32)"),
        ("layers.2.ffn.experts.0.w3.weight", "fp4-e2m1 (ue8m0 /32)"),
        ("embed.weight", "bf16"),
        ("layers.2.attn.compressor.wgate.weight", "bf16"),
        ("layers.0.ffn.gate.tid2eid", "i32"),
        ("layers.1.ffn.gate.bias", "f32"),
    ] {
        assert_eq!(off.format_of(name).as_deref(), Some(fmt), "{name}");
    }
    let off_cfg = Ds4Config::from_file(&off_dir).expect("official config parses");
    assert_eq!(network(&off_cfg), network(&cfg), "the official config describes the same network");
    assert_eq!(off_cfg.quant.method.as_deref(), Some("fp8"));
    assert_eq!(off_cfg.quant.expert_dtype.as_deref(), Some("fp4"));

    // 2. The same dequantized values in the transformers layout.
    let hf_dir = tmp.path().join("hf");
    write_hf_saved(&hf_dir, &cfg, &off);
    let hf = Checkpoint::open(&hf_dir).expect("HF checkpoint opens");
    assert_eq!(hf.scheme(), NamingScheme::HfSaved);
    assert_eq!(hf.format_of("layers.0.attn.wq_a.weight").as_deref(), Some("f32"));
    assert_eq!(hf.format_of("layers.0.ffn.gate.tid2eid").as_deref(), Some("i64"));
    let hf_cfg = Ds4Config::from_file(&hf_dir).expect("HF config parses");
    assert_eq!(network(&hf_cfg), network(&cfg));

    // 3. Both load; logits bitwise equal.
    let w_off = ModelWeights::load(&off_cfg, &off).expect("official weights load");
    let w_hf = ModelWeights::load(&hf_cfg, &hf).expect("HF weights load");
    let ids = formula_ids(SEED, TOKENS, cfg.vocab_size);
    let opts = ForwardOptions::default();
    let l_off = forward(&w_off, &ids, &opts).unwrap().logits;
    let l_hf = forward(&w_hf, &ids, &opts).unwrap().logits;
    assert_eq!(l_off.len(), TOKENS * cfg.vocab_size);
    assert!(l_off.iter().all(|v| v.is_finite()));
    let mismatches = l_off.iter().zip(&l_hf).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(mismatches, 0, "official vs HF-saved logits differ in {mismatches} entries");

    // 4. Quantization happened, and stayed close. First per stored format, on the weights
    //    themselves (sum of squared errors over sum of squares, all tensors of that format).
    let mut per_format: Vec<(OfficialFormat, f64, f64)> = Vec::new();
    for t in canonical_tensors(&cfg).into_iter().filter(|t| t.format != OfficialFormat::I32) {
        let (q, r) = (off.load_f32(&t.name, &t.shape).unwrap(), formula.load_f32(&t.name, &t.shape).unwrap());
        let (n, d) = sq_err(&q, &r);
        match per_format.iter_mut().find(|(f, _, _)| *f == t.format) {
            Some(e) => {
                e.1 += n;
                e.2 += d;
            }
            None => per_format.push((t.format, n, d)),
        }
    }
    for (fmt, n, d) in &per_format {
        let nmse = n / d;
        println!("weights stored as {fmt:?}: NMSE vs unquantized {nmse:.3e}");
        let (lo, hi) = match fmt {
            OfficialFormat::F32 => (0.0, 0.0),
            OfficialFormat::Bf16 => (1e-7, 1e-5),
            OfficialFormat::Fp8 => (1e-4, 2e-3),
            OfficialFormat::Fp4 => (2e-3, 3e-2),
            OfficialFormat::I32 => unreachable!(),
        };
        assert!((lo..=hi).contains(&nmse), "{fmt:?} weights: NMSE {nmse:.3e} outside [{lo:e}, {hi:e}]");
    }

    // Then on the logits. The random tiny network amplifies weight errors, mostly through discrete
    // choices (router top-k, indexer top-k) that flip for some tokens, so the per-token median is
    // printed next to the overall NMSE.
    let l_ref = forward(&unquantized, &ids, &opts).unwrap().logits;
    let (num, den) = sq_err(&l_off, &l_ref);
    let nmse = num / den;
    let mut per_token: Vec<f64> = l_off
        .chunks(cfg.vocab_size)
        .zip(l_ref.chunks(cfg.vocab_size))
        .map(|(q, r)| {
            let (n, d) = sq_err(q, r);
            n / d
        })
        .collect();
    per_token.sort_by(f64::total_cmp);
    let median = per_token[TOKENS / 2];
    let max_abs = l_off.iter().zip(&l_ref).fold(0f32, |m, (q, r)| m.max((q - r).abs()));
    let argmax = |l: &[f32]| -> Vec<usize> {
        l.chunks(cfg.vocab_size)
            .map(|row| row.iter().enumerate().fold(0, |b, (i, v)| if *v > row[b] { i } else { b }))
            .collect()
    };
    let agree = argmax(&l_off).iter().zip(argmax(&l_ref)).filter(|(a, b)| **a == *b).count();
    println!(
        "official layout: {shards} shards, {written} bytes written, {} stored tensor bytes (HF f32 copy: {} bytes)",
        off.total_bytes(),
        hf.total_bytes()
    );
    println!(
        "quantized (FP8/FP4/BF16) vs unquantized logits over {TOKENS} tokens: NMSE {nmse:.3e} \
         (per-token median {median:.3e}, worst {:.3e}), max |diff| {max_abs:.3e}, argmax agreement {agree}/{TOKENS}",
        per_token[TOKENS - 1]
    );
    assert!(nmse > 1e-6, "quantized logits are too close to the unquantized ones (NMSE {nmse:.3e}): no quantization?");
    assert!(nmse < 0.3, "quantized logits drift too far from the unquantized ones (NMSE {nmse:.3e})");
    assert!(median < 0.1, "per-token median NMSE {median:.3e} too large");
}

/// (Σ (a − b)², Σ b²) in f64.
fn sq_err(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0f64, 0f64), |(n, d), (x, y)| (n + (*x as f64 - *y as f64).powi(2), d + (*y as f64).powi(2)))
}
