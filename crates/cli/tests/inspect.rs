//! `flashseek inspect`: the golden transformers-layout model, an official-layout FP8/FP4 model, and
//! the error paths (exit code 1, a message naming the path, no panic).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flashseek_engine::testing::FormulaSource;
use flashseek_engine::weights::TensorSource;
use flashseek_model::checkpoint::official::{canonical_tensors, write_official, OfficialWriteOptions};
use flashseek_model::config::Ds4Config;
use safetensors::SafeTensors;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn inspect(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashseek")).arg("inspect").arg(dir).output().expect("runs flashseek")
}

fn stdout_of(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "inspect failed ({:?}): {}\n{text}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

/// Lines with runs of whitespace collapsed to one space, trimmed.
fn lines(text: &str) -> Vec<String> {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

fn has_line(text: &str, want: &str) -> bool {
    lines(text).iter().any(|l| l == want)
}

fn line_starting(text: &str, prefix: &str) -> String {
    lines(text)
        .into_iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
}

/// A fresh scratch directory under the target's test tmp dir.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn inspect_golden_hf_saved_model() {
    let dir = repo_root().join("tests/fixtures/goldens/tiny_flash_rates/model");
    let out = inspect(&dir);
    let text = stdout_of(&out);
    println!("{text}");

    assert!(text.contains("layers 4"), "{text}");
    assert!(has_line(&text, "vocab 512, hidden 64, layers 4"), "{text}");
    assert!(line_starting(&text, "naming scheme:").starts_with("naming scheme: HfSaved"), "{text}");
    for want in [
        "layer 0: sliding ratio 0 router hash",
        "layer 1: CSA ratio 4 router hash",
        "layer 2: HCA ratio 128 router score",
        "layer 3: CSA ratio 4 router score",
    ] {
        assert!(has_line(&text, want), "missing schedule line {want:?} in:\n{text}");
    }
    assert!(has_line(&text, "compress rates: CSA 4 (2 layers); HCA 128 (1 layer)"), "{text}");
    assert!(line_starting(&text, "forward check:").contains("all "), "{text}");

    // Independent count: every tensor of the file is an f32 (or i64 table) weight.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cfg = Ds4Config::from_file(&dir).unwrap();
    let mut total = 0u64;
    let mut embed = 0u64;
    let mut routed = 0u64;
    let mut per_component: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, view) in st.tensors() {
        let n: u64 = view.shape().iter().map(|&d| d as u64).product();
        total += n;
        if name == "model.embed_tokens.weight" {
            embed += n;
        }
        if name.contains(".ffn.experts.") {
            routed += n;
            *per_component.entry("routed experts").or_default() += n;
        }
    }
    let (e, k) = (cfg.n_routed_experts as u64, cfg.num_experts_per_tok as u64);
    let active = total - embed - routed + routed / e * k;
    assert!(line_starting(&text, "total parameters:").starts_with(&format!("total parameters: {total} (")), "{text}");
    assert!(line_starting(&text, "active parameters per token:").starts_with(&format!("active parameters per token: {active} ")), "{text}");
    assert!(has_line(&text, "MTP parameters (not in the total): 0"), "{text}");

    // Component rows: name, tensors, params, bytes, formats.
    let routed_row = line_starting(&text, "routed experts ");
    let expected_tensors = cfg.num_hidden_layers * cfg.n_routed_experts * 3;
    assert_eq!(
        routed_row,
        format!("routed experts {expected_tensors} {} {} f32 100.0%", per_component["routed experts"], per_component["routed experts"] * 4)
    );
    let router_row = line_starting(&text, "router ");
    assert!(router_row.contains("i64") && router_row.contains("f32"), "{router_row}");
    let file_len = bytes.len() as u64;
    let all_row = line_starting(&text, "all ");
    let data: u64 = st.tensors().iter().map(|(_, v)| v.data().len() as u64).sum();
    assert!(data < file_len);
    assert_eq!(all_row, format!("all {} {total} {data}", st.len()));
}

#[test]
fn inspect_official_fp8_fp4_model() {
    let json = serde_json::json!({
        "model_type": "deepseek_v4", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
        "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        "mlp_layer_types": ["hash_moe", "moe", "moe"],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
        },
        "index_n_heads": 2, "index_head_dim": 16, "index_topk": 2,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
        "hc_mult": 2, "hc_sinkhorn_iters": 3, "bos_token_id": 0, "eos_token_id": 1
    });
    let cfg = Ds4Config::from_json(&json).unwrap();
    let dir = scratch("official");
    let src = FormulaSource { seed: 5, n_experts: cfg.n_routed_experts };
    write_official(
        &dir,
        &cfg,
        &|n, s| src.load_f32(n, s).unwrap(),
        &|n, s| src.load_i64(n, s).unwrap(),
        &OfficialWriteOptions { max_shard_bytes: 32 * 1024 },
    )
    .unwrap();
    let text = stdout_of(&inspect(&dir));
    println!("{text}");
    assert!(line_starting(&text, "naming scheme:").starts_with("naming scheme: Official"), "{text}");
    assert!(line_starting(&text, "files:").starts_with("files: "), "{text}");
    assert!(line_starting(&text, "declared storage:").contains("quant_method fp8"), "{text}");
    let attn = line_starting(&text, "attention ");
    assert!(attn.contains("fp8-e4m3 (ue8m0 128x128)") && attn.contains("f32"), "{attn}");
    let routed = line_starting(&text, "routed experts ");
    assert!(routed.ends_with("fp4-e2m1 (ue8m0 /32) 100.0%"), "{routed}");
    assert!(line_starting(&text, "embed ").ends_with("bf16 100.0%"), "{text}");
    // Logical parameters (FP4 unpacked, scales excluded) = the canonical tensors' element counts.
    let total: u64 = canonical_tensors(&cfg).iter().map(|t| t.numel() as u64).sum();
    assert!(line_starting(&text, "total parameters:").starts_with(&format!("total parameters: {total} ")), "{text}");
    assert!(line_starting(&text, "forward check:").contains("all "), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_clean_failure(out: &Output, must_name: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit code 1, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for m in must_name {
        assert!(err.contains(m), "stderr does not mention {m:?}: {err}");
    }
}

#[test]
fn inspect_errors_exit_1_with_a_clear_message() {
    // Nonexistent directory.
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-model-dir");
    let out = inspect(&missing);
    assert_ne!(out.status.code(), Some(0));
    assert_clean_failure(&out, &[&missing.display().to_string(), "cannot be read"]);

    // Bad config.
    let dir = scratch("badcfg");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "deepseek_v4", "hidden_size": "wide"}"#).unwrap();
    assert_clean_failure(&inspect(&dir), &[&dir.display().to_string(), "config"]);

    // Good config, corrupt checkpoint.
    let golden = repo_root().join("tests/fixtures/goldens/tiny_flash_rates/model");
    std::fs::copy(golden.join("config.json"), dir.join("config.json")).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ").unwrap();
    assert_clean_failure(&inspect(&dir), &[&dir.display().to_string(), "checkpoint", "model.safetensors"]);

    // A file instead of a directory.
    let file = dir.join("config.json");
    assert_clean_failure(&inspect(&file), &["not a directory"]);
    let _ = std::fs::remove_dir_all(&dir);
}
