//! `flashseek gpu-check`: CUDA ops vs the CPU reference on fresh random inputs, plus decode-shaped
//! timings; writes a JSON report. Exit code 1 if any op exceeds its tolerance.

use flashseek_engine::cuda::{check, gpu::Gpu};
use std::path::PathBuf;

/// Arguments of `gpu-check`.
#[derive(clap::Args)]
pub struct Args {
    /// CUDA device: N, cuda or cuda:N.
    #[arg(long, default_value = "0", value_parser = super::common::parse_cuda_device)]
    pub device: usize,
    /// Where to write the JSON report.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Timed repeats per measurement (median reported).
    #[arg(long, default_value_t = 50)]
    pub repeats: usize,
    /// Skip the parity checks (timings only, e.g. under a profiler).
    #[arg(long)]
    pub skip_checks: bool,
    /// Limit the run: `switches` = only the switch parity matrix; `tc…` = only the tensor-core
    /// linear checks and timings; `q8…` = only the FP8-activation (`TC_LINEAR=fp8`) linear checks and
    /// timings; `moe…` = only the grouped MoE parity matrix and timings; `att…` =
    /// only the attention-family checks (attention incl. the mask path and fast exp, compressors,
    /// indexer incl. the fused top-k) and their timings; `mhc…` = only the mHC, RMSNorm and RoPE
    /// checks and their timings at a prefill chunk (the largest `--moe-tokens`); `sample…` = only the on-device top-k
    /// selection of `SAMPLE_ON_DEVICE`; any other text = every check, and only the
    /// decode-linear timings whose label or format contains it.
    #[arg(long)]
    pub only: Option<String>,
    /// Golden models folder for the end-to-end GPU vs CPU checks.
    #[arg(long, default_value = "tests/fixtures/goldens")]
    pub goldens: PathBuf,
    /// Skip the end-to-end model checks.
    #[arg(long)]
    pub skip_models: bool,
    /// Greedy tokens compared per golden model.
    #[arg(long, default_value_t = 64)]
    pub greedy_steps: usize,
    /// Token counts of the Flash-shaped MoE layer timings (grouped vs per-expert), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    pub moe_tokens: Vec<usize>,
    /// Also run the switch parity matrix on the full-width parity model (Flash widths, 4 layers, 256
    /// experts, official precision; written once under the cache root, ~6 GB). `--only switches`
    /// runs only the matrix.
    #[arg(long)]
    pub switch_matrix: bool,
    /// Random seed of the inputs (default: from the clock, so every run draws fresh inputs).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Runs `gpu-check`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    if let Some(out) = &args.out {
        // Fail before the run, not after it, when the report cannot be written.
        super::common::check_writable(out).map_err(|e| anyhow::anyhow!("--out: {e}"))?;
    }
    if args.repeats == 0 {
        return Err(super::common::UsageError("--repeats must be at least 1".into()).into());
    }
    let cache = flashseek_engine::default_model::cache_root().join("kernels");
    let t = std::time::Instant::now();
    let gpu = Gpu::open(args.device, &cache)?;
    eprintln!("opened {} ({}) and loaded kernels in {:.2} s", gpu.ctx.name().unwrap_or_default(), gpu.arch, t.elapsed().as_secs_f64());
    // The embedded default model (official layout: FP8/FP4/BF16) for the stored-format check.
    let stored_model = if args.skip_models {
        None
    } else {
        Some(flashseek_engine::default_model::ensure_default_model(&flashseek_engine::default_model::cache_root())?.0)
    };
    let switch_model = if args.switch_matrix || args.only.as_deref().is_some_and(|o| o.starts_with("switch")) {
        use flashseek_engine::cuda::check_switches::{full_width_parity_config, FULL_WIDTH_MODEL_DIR, FULL_WIDTH_MODEL_SEED};
        let t = std::time::Instant::now();
        let (dir, made) = flashseek_engine::default_model::ensure_formula_model(&flashseek_engine::default_model::cache_root(), FULL_WIDTH_MODEL_DIR, &full_width_parity_config(), FULL_WIDTH_MODEL_SEED)?;
        if made {
            println!("wrote the full-width parity model to {} in {:.1} s", dir.display(), t.elapsed().as_secs_f64());
        }
        Some(dir)
    } else {
        None
    };
    let (mut report, ok) = check::run(&gpu, seed, &check::CheckOptions { repeats: args.repeats, skip_checks: args.skip_checks, only: args.only.clone(), goldens: (!args.skip_models && args.goldens.is_dir()).then(|| args.goldens.clone()), greedy_steps: args.greedy_steps, stored_model, moe_tokens: args.moe_tokens.clone(), switch_model })?;
    report["command"] = flashseek_engine::switches::reproducible_command(std::env::args()).into();
    report["commit"] = option_env!("FLASHSEEK_COMMIT").unwrap_or("unknown (set FLASHSEEK_COMMIT when building)").into();
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)?).map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if !ok {
        anyhow::bail!("some CUDA ops exceed their tolerance (see above)");
    }
    Ok(())
}
