//! `flashseek gpu-bench`: prefill and decode of the current GPU forward on DeepSeek-V4-Flash shapes
//! (random weights in official precision), on as many Flash layers as requested.

use flashseek_engine::cuda::{bench, gpu::Gpu};
use std::path::PathBuf;

/// Arguments of `gpu-bench`.
#[derive(clap::Args)]
pub struct Args {
    /// CUDA device: N, cuda or cuda:N.
    #[arg(long, default_value = "0", value_parser = super::common::parse_cuda_device)]
    pub device: usize,
    /// Flash layers to instantiate (the first N of the 43-layer schedule).
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Use this config.json (any DeepSeek-V4 config) instead of the first `--layers` Flash layers.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Prompt lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub contexts: Vec<usize>,
    /// Tokens per prefill chunk (default: 32,768, or 2,048 with `--switch LONG_CONTEXT_CHUNK=off`).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Decode steps timed per context.
    #[arg(long, default_value_t = 16)]
    pub decode_steps: usize,
    /// Cold prefills per context up to 32,768 tokens (median reported; longer contexts run once).
    #[arg(long, default_value_t = 3)]
    pub prefill_repeats: usize,
    /// Stop before larger contexts once a prefill takes longer than this (seconds).
    #[arg(long, default_value_t = 120.0)]
    pub max_prefill_secs: f64,
    /// Break the profiled prefill's MoE stage into sub-stages (route, then on the grouped FP8 path —
    /// TC_LINEAR=fp8 with MOE_GROUPED on — group + gather, gate/up, down, shared + combine;
    /// otherwise the experts as one) and report each MoE layer's routing (pairs per expert, tile
    /// fill).
    #[arg(long)]
    pub moe_detail: bool,
    /// Where to write the JSON report.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `gpu-bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(out) = &args.out {
        super::common::check_writable(out).map_err(|e| anyhow::anyhow!("--out: {e}"))?;
    }
    if args.contexts.is_empty() || args.contexts.contains(&0) {
        return Err(super::common::UsageError("--contexts needs positive token counts".into()).into());
    }
    if args.config.is_none() && !(1..=43).contains(&args.layers) {
        return Err(super::common::UsageError(format!("--layers {}: DeepSeek-V4-Flash has 1 to 43 layers", args.layers)).into());
    }
    if args.chunk == Some(0) {
        return Err(super::common::UsageError("--chunk must be at least 1".into()).into());
    }
    if args.prefill_repeats == 0 {
        return Err(super::common::UsageError("--prefill-repeats must be at least 1".into()).into());
    }
    let config = match &args.config {
        Some(p) => Some(flashseek_model::config::Ds4Config::from_file(p)?),
        None => None,
    };
    let gpu = Gpu::open(args.device, &flashseek_engine::default_model::cache_root().join("kernels"))?;
    let opts = bench::BenchOptions {
        layers: args.layers,
        config,
        contexts: args.contexts.clone(),
        chunk: args.chunk,
        decode_steps: args.decode_steps,
        prefill_repeats: args.prefill_repeats,
        max_prefill_secs: args.max_prefill_secs,
        moe_detail: args.moe_detail,
    };
    let mut report = bench::run(&gpu, &opts)?;
    report["command"] = flashseek_engine::switches::reproducible_command(std::env::args()).into();
    report["commit"] = option_env!("FLASHSEEK_COMMIT").unwrap_or("unknown (set FLASHSEEK_COMMIT when building)").into();
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)?).map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?;
    }
    Ok(())
}
