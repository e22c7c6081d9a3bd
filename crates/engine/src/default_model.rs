//! The embedded default model: a small, deterministic, random-weight DeepSeek-V4 that flashseek
//! writes once (in DeepSeek's official layout and precision: FP8 e4m3 weights with ue8m0 128×128
//! block scales, FP4 e2m1 routed experts, BF16 embeddings/head) and then loads like any checkpoint.
//! It has the real 129,280-token vocabulary, so the tokenizer and chat format run for real; its
//! text is meaningless.

use crate::testing::{formula_tid2eid, formula_values};
use flashseek_model::checkpoint::official::{write_official, OfficialWriteOptions};
use flashseek_model::checkpoint::CheckpointError;
use flashseek_model::config::Ds4Config;
use std::path::{Path, PathBuf};

/// Folder name of the default model under the cache root; bump when its config or values change.
pub const DEFAULT_MODEL_DIR: &str = "default-model-v1";

/// Generator seed of the default model's weights.
pub const DEFAULT_MODEL_SEED: u64 = 20261129;

/// The default model's config: the Flash layer pattern in miniature (2 sliding, then CSA/HCA
/// alternating; 3 hash-routed layers), hidden 256, 8 heads × 128 (64 rope), window 128,
/// compress rates 4/128, indexer 8 × 128 with top-k 64, 16 experts (top 4, width 256), mHC 4 × 20.
pub fn default_config() -> Ds4Config {
    let text = r#"{
        "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 256, "num_hidden_layers": 6,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
        "q_lora_rank": 256, "o_groups": 4, "o_lora_rank": 128, "sliding_window": 128,
        "compress_ratios": [0, 0, 4, 128, 4, 128], "num_hash_layers": 3,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
        "index_n_heads": 8, "index_head_dim": 128, "index_topk": 64,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "moe_intermediate_size": 256,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 65536, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
        "expert_dtype": "fp4"
    }"#;
    let v: serde_json::Value = serde_json::from_str(text).expect("the built-in default config is JSON");
    Ds4Config::from_json(&v).expect("the built-in default config is valid")
}

/// The cache root: `$FLASHSEEK_CACHE`, else `$XDG_CACHE_HOME/flashseek`, else `$HOME/.cache/flashseek`,
/// else a `flashseek` folder in the system temp dir.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("FLASHSEEK_CACHE").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join("flashseek");
    }
    if let Some(p) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join(".cache").join("flashseek");
    }
    std::env::temp_dir().join("flashseek")
}

/// Errors creating the default model.
#[derive(Debug, thiserror::Error)]
pub enum DefaultModelError {
    /// Filesystem trouble under the cache root.
    #[error("default model at {path}: {source}")]
    Io {
        /// Path concerned.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The writer failed.
    #[error("writing the default model: {0}")]
    Write(Box<CheckpointError>),
}

impl From<CheckpointError> for DefaultModelError {
    fn from(e: CheckpointError) -> Self {
        DefaultModelError::Write(Box::new(e))
    }
}

/// Returns the default model's directory under `root`, writing it first if it is not there
/// (written into a temporary sibling and renamed, so an interrupted write is never mistaken for a
/// model). `created` is true when it was written by this call.
pub fn ensure_default_model(root: &Path) -> Result<(PathBuf, bool), DefaultModelError> {
    ensure_formula_model(root, DEFAULT_MODEL_DIR, &default_config(), DEFAULT_MODEL_SEED)
}

/// Writes (once) a random-weight model of config `cfg` in the official layout and precision under
/// `root/name`, weights from [`formula_values`] with `seed` (tables from [`formula_tid2eid`]);
/// returns its folder and whether it was written now. Safe against concurrent writers (temporary
/// folder, then rename) like [`ensure_default_model`], which is this with the default config.
///
/// Errors: I/O under `root`, or a config the official writer rejects.
pub fn ensure_formula_model(root: &Path, name: &str, cfg: &Ds4Config, seed: u64) -> Result<(PathBuf, bool), DefaultModelError> {
    let dir = root.join(name);
    if dir.join("config.json").is_file() {
        return Ok((dir, false));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DefaultModelError::Io { path, source }
    };
    std::fs::create_dir_all(root).map_err(io(root))?;
    // Temporary folders of interrupted writes older than an hour are left-overs: remove them.
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            let stale = e.file_name().to_string_lossy().starts_with(&format!("{name}.tmp-"))
                && e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > std::time::Duration::from_secs(3600));
            if stale {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let tmp = root.join(format!("{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let experts = cfg.n_routed_experts;
    write_official(
        &tmp,
        cfg,
        &|name, shape| formula_values(seed, name, shape),
        &|name, shape| formula_tid2eid(seed, name, shape[0], shape[1], experts),
        &OfficialWriteOptions { max_shard_bytes: 256 << 20 },
    )?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok((dir, true)),
        // Another process finished first: use its copy.
        Err(_) if dir.join("config.json").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok((dir, false))
        }
        Err(e) => Err(io(&dir)(e)),
    }
}
