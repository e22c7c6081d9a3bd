//! `flashseek qualify`: the qualification matrix of the prefill stack on DeepSeek-V4-Flash shapes
//! (flashseek_engine::cuda::qualify): exact-length chat prompts, every switch configuration, cold
//! prefill + greedy decode, JSON and an SVG chart. Exit code 1 when a run is refused.

use flashseek_engine::cuda::{gpu::Gpu, qualify};
use std::path::PathBuf;

/// Arguments of `qualify`.
#[derive(clap::Args)]
pub struct Args {
    /// CUDA device: N, cuda or cuda:N.
    #[arg(long, default_value = "0", value_parser = super::common::parse_cuda_device)]
    pub device: usize,
    /// Flash layers to instantiate (the first N of the 43-layer schedule).
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Prompt lengths in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8192,32768,131072")]
    pub contexts: Vec<usize>,
    /// Prefill chunk (tokens; default: each configuration's LONG_CONTEXT_CHUNK, 32,768 or 2,048).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Greedy tokens generated after each prefill.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Longest prompt on which the slow configurations (baseline, switches alone on, MoE
    /// ungrouped, TC_LINEAR off) run; past it the logits NMSE and the promised tokens are
    /// checked against the run with every switch at its default (the exact fast path).
    #[arg(long, default_value_t = 8192)]
    pub full_matrix_max: usize,
    /// Folder for qualify.json and qualify.svg.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
}

/// Runs `qualify`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.contexts.is_empty() || args.contexts.contains(&0) {
        return Err(super::common::UsageError("--contexts needs positive token counts".into()).into());
    }
    if !(1..=43).contains(&args.layers) {
        return Err(super::common::UsageError(format!("--layers {}: DeepSeek-V4-Flash has 1 to 43 layers", args.layers)).into());
    }
    if args.chunk == Some(0) {
        return Err(super::common::UsageError("--chunk must be at least 1".into()).into());
    }
    std::fs::create_dir_all(&args.out).map_err(|e| anyhow::anyhow!("--out {}: {e}", args.out.display()))?;
    let json_path = args.out.join("qualify.json");
    super::common::check_writable(&json_path).map_err(|e| anyhow::anyhow!("--out: {e}"))?;
    let gpu = Gpu::open(args.device, &flashseek_engine::default_model::cache_root().join("kernels"))?;
    let opts = qualify::QualifyOptions { layers: args.layers, contexts: args.contexts.clone(), chunk: args.chunk, decode_tokens: args.decode_tokens, full_matrix_max: args.full_matrix_max };
    let (mut report, ok) = qualify::run(&gpu, &opts)?;
    report["command"] = flashseek_engine::switches::reproducible_command(std::env::args()).into();
    report["commit"] = option_env!("FLASHSEEK_COMMIT").unwrap_or("unknown (set FLASHSEEK_COMMIT when building)").into();
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?).map_err(|e| anyhow::anyhow!("{}: {e}", json_path.display()))?;
    let svg = args.out.join("qualify.svg");
    std::fs::write(&svg, qualify::chart_svg(&report)).map_err(|e| anyhow::anyhow!("{}: {e}", svg.display()))?;
    println!("wrote {} and {}", json_path.display(), svg.display());
    if !ok {
        anyhow::bail!("qualification refused: a configuration that promises exactness generated different tokens");
    }
    Ok(())
}
