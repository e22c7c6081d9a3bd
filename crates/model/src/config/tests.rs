use super::*;
use serde_json::json;

/// The official Flash `config.json` (legacy schema; values from spec §1.1 / §1.2).
fn flash_official() -> Value {
    flash_official_json()
}

fn tiny_hf() -> Value {
    json!({
        "model_type": "deepseek_v4", "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
        "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
        "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
        "compress_rates": {"compressed_sparse_attention": 3, "heavily_compressed_attention": 16},
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0, "partial_rotary_factor": 0.25}
        },
        "index_n_heads": 4, "index_head_dim": 16, "index_topk": 3,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 48,
        "hc_mult": 3, "hc_sinkhorn_iters": 5, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1
    })
}

#[test]
fn flash_official_schema() {
    let c = Ds4Config::from_json(&flash_official()).unwrap();
    assert_eq!(c.num_hidden_layers, 43);
    assert_eq!(c.layer_kinds.len(), 43);
    assert_eq!(c.layer_kinds[0], LayerKind::Sliding);
    assert_eq!(c.layer_kinds[1], LayerKind::Sliding);
    assert_eq!(c.layer_kinds[2], LayerKind::Csa { ratio: 4 });
    assert_eq!(c.layer_kinds[3], LayerKind::Hca { ratio: 128 });
    assert_eq!(c.layer_kinds[42], LayerKind::Csa { ratio: 4 });
    assert_eq!(c.layer_kinds.iter().filter(|k| matches!(k, LayerKind::Csa { .. })).count(), 21);
    assert_eq!(c.layer_kinds.iter().filter(|k| matches!(k, LayerKind::Hca { .. })).count(), 20);
    assert_eq!(&c.router_kinds[..4], &[RouterKind::Hash, RouterKind::Hash, RouterKind::Hash, RouterKind::Score]);
    assert_eq!(c.qk_rope_head_dim, 64);
    assert_eq!(c.nope_head_dim(), 448);
    assert_eq!(c.rope_main, RopeParams { theta: 10000.0, yarn: None });
    let y = c.rope_compress.yarn.expect("yarn on compress rope");
    assert_eq!((c.rope_compress.theta, y.factor, y.original_max_position_embeddings), (160000.0, 16.0, 65536.0));
    assert_eq!((y.beta_fast, y.beta_slow, y.attention_factor, y.truncate), (32.0, 1.0, 1.0, true));
    assert_eq!(c.quant.expert_dtype.as_deref(), Some("fp4"));
    assert_eq!(c.quant.weight_block_size, Some([128, 128]));
    assert_eq!(c.eos_token_ids, vec![1]);
}

#[test]
fn official_toplevel_yarn_keys() {
    let mut v = flash_official();
    let o = v.as_object_mut().unwrap();
    o.remove("rope_scaling");
    o.insert("rope_factor".into(), json!(16));
    o.insert("original_seq_len".into(), json!(65536));
    o.insert("beta_fast".into(), json!(32));
    o.insert("beta_slow".into(), json!(1));
    let c = Ds4Config::from_json(&v).unwrap();
    let y = c.rope_compress.yarn.unwrap();
    assert_eq!((y.factor, y.original_max_position_embeddings, y.attention_factor), (16.0, 65536.0, 1.0));
}

#[test]
fn hf_schema_and_roundtrip() {
    let c = Ds4Config::from_json(&tiny_hf()).unwrap();
    assert_eq!(c.layer_kinds, vec![LayerKind::Sliding, LayerKind::Csa { ratio: 3 }, LayerKind::Hca { ratio: 16 }, LayerKind::Csa { ratio: 3 }]);
    assert_eq!(c.router_kinds, vec![RouterKind::Hash, RouterKind::Score, RouterKind::Score, RouterKind::Score]);
    assert_eq!(c.qk_rope_head_dim, 8);
    assert_eq!(c.hc_mult, 3);
    // The HF rendering parses back to the same config.
    let again = Ds4Config::from_json(&c.to_hf_json()).unwrap();
    assert_eq!(again, c);
    let flash = Ds4Config::from_json(&flash_official()).unwrap();
    assert_eq!(Ds4Config::from_json(&flash.to_hf_json()).unwrap(), flash);
}

fn err_of(v: Value) -> String {
    Ds4Config::from_json(&v).unwrap_err().to_string()
}

#[test]
fn rejects_wrong_model_type() {
    let mut v = tiny_hf();
    v["model_type"] = json!("deepseek_v3");
    let e = err_of(v);
    assert!(e.contains("model_type") && e.contains("deepseek_v4") && e.contains("deepseek_v3"), "{e}");
}

#[test]
fn rejects_missing_and_mistyped_fields() {
    let mut v = tiny_hf();
    v.as_object_mut().unwrap().remove("hidden_size");
    let e = err_of(v);
    assert!(e.contains("`hidden_size` is missing"), "{e}");

    let mut v = tiny_hf();
    v["num_attention_heads"] = json!("four");
    let e = err_of(v);
    assert!(e.contains("num_attention_heads") && e.contains("integer"), "{e}");

    let mut v = tiny_hf();
    v.as_object_mut().unwrap().remove("layer_types");
    let e = err_of(v);
    assert!(e.contains("layer_types"), "{e}");
}

#[test]
fn rejects_inconsistent_fields() {
    let mut v = tiny_hf();
    v["layer_types"] = json!(["sliding_attention"]);
    let e = err_of(v);
    assert!(e.contains("layer_types") && e.contains("num_hidden_layers = 4"), "{e}");

    let mut v = tiny_hf();
    v["layer_types"][2] = json!("full_attention");
    let e = err_of(v);
    assert!(e.contains("layer_types[2]") && e.contains("full_attention"), "{e}");

    let mut v = tiny_hf();
    v["o_groups"] = json!(3);
    let e = err_of(v);
    assert!(e.contains("o_groups"), "{e}");

    let mut v = tiny_hf();
    v["num_experts_per_tok"] = json!(9);
    let e = err_of(v);
    assert!(e.contains("num_experts_per_tok") && e.contains("n_routed_experts = 8"), "{e}");

    let mut v = tiny_hf();
    v["num_key_value_heads"] = json!(2);
    assert!(err_of(v).contains("num_key_value_heads"));

    let mut v = tiny_hf();
    v["rope_parameters"]["compress"].as_object_mut().unwrap().remove("factor");
    let e = err_of(v);
    assert!(e.contains("rope_parameters.compress.factor"), "{e}");

    let mut v = tiny_hf();
    v["eos_token_id"] = json!(300);
    assert!(err_of(v).contains("eos_token_id"));

    let mut v = flash_official();
    v["compress_ratios"][5] = json!(7);
    let e = err_of(v);
    assert!(e.contains("compress_ratios[5]"), "{e}");
}

#[test]
fn reads_from_file_and_reports_bad_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), tiny_hf().to_string()).unwrap();
    assert_eq!(Ds4Config::from_file(dir.path()).unwrap().hidden_size, 64);
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let e = Ds4Config::from_file(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    let e = Ds4Config::from_file(&dir.path().join("absent.json")).unwrap_err().to_string();
    assert!(e.contains("absent.json"), "{e}");
}
