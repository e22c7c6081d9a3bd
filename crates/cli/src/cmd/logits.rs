//! `flashseek logits --model DIR --ids IDS.json --out OUT.safetensors`: the one-shot fp32 logits of
//! every position, for external parity checks.

use anyhow::Context;
use flashseek_engine::forward::{forward, ForwardOptions, Numerics};
use flashseek_engine::weights::ModelWeights;
use flashseek_model::checkpoint::{write_safetensors, Checkpoint, StoredDtype};
use flashseek_model::config::Ds4Config;
use std::path::PathBuf;

/// Arguments of `logits`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// JSON file holding an array of token ids.
    #[arg(long)]
    pub ids: PathBuf,
    /// Output safetensors file; tensor `logits`, f32 [T, vocab].
    #[arg(long)]
    pub out: PathBuf,
    /// Simulate DeepSeek's official numerics (spec §10: FP8 activations, FP8 KV, FP4 indexer).
    #[arg(long)]
    pub official_numerics: bool,
}

/// Runs `logits`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.ids).with_context(|| format!("reading {}", args.ids.display()))?;
    let ids: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{}: expected a JSON array of non-negative token ids", args.ids.display()))?;
    super::common::check_model_dir(&args.model)?;
    let cfg = Ds4Config::from_file(&args.model)?;
    if ids.len() > cfg.max_position_embeddings {
        anyhow::bail!(
            "{}: {} ids exceed the model's context of {} positions (max_position_embeddings)",
            args.ids.display(),
            ids.len(),
            cfg.max_position_embeddings
        );
    }
    let ckpt = Checkpoint::open(&args.model)?;
    let weights = ModelWeights::load(&cfg, &ckpt)?;
    let numerics = if args.official_numerics { Numerics::official() } else { Numerics::default() };
    let out = forward(&weights, &ids, &ForwardOptions { numerics, record_streams: false })?;
    let bytes: Vec<u8> = out.logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors(&args.out, &[("logits".to_string(), StoredDtype::F32, vec![ids.len(), cfg.vocab_size], bytes)])?;
    eprintln!("wrote logits [{}, {}] to {}", ids.len(), cfg.vocab_size, args.out.display());
    Ok(())
}
