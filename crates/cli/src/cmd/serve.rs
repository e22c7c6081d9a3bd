//! `flashseek serve`: the OpenAI- and Anthropic-compatible HTTP server (crate `flashseek-server`).

use super::common::{load, ModelArgs};
use flashseek_server::scheduler::SchedulerConfig;
use flashseek_server::ServerConfig;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 = any free port).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require this API key (as `Authorization: Bearer KEY` or `x-api-key: KEY`) on /v1/*.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Name the model is served as (repeatable: aliases); default: the model directory's name,
    /// or `flashseek-default` for the embedded model.
    #[arg(long = "served-model-name")]
    pub served_model_name: Vec<String>,
    /// Most sequences generating at once (continuous batching).
    #[arg(long, default_value_t = 16)]
    pub max_running: usize,
    /// State-memory budget for admission, in MiB (running sequences' estimates + prefix cache).
    #[arg(long, default_value_t = 8192)]
    pub state_budget_mib: usize,
    /// Most requests waiting for admission; more are answered 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Finished sequences kept for prefix reuse (0 = off).
    #[arg(long, default_value_t = 4)]
    pub prefix_cache: usize,
    /// On SIGINT/SIGTERM, seconds in-flight requests may take to finish before they are cancelled
    /// (a second signal cancels them at once).
    #[arg(long, default_value_t = 30)]
    pub drain_timeout: u64,
}

/// Runs `serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.max_body_bytes == 0 {
        return Err(super::common::UsageError("--max-body-bytes must be at least 1 (0 would answer every request 413)".into()).into());
    }
    if args.max_queue == 0 {
        // Every request waits in the queue until the engine admits it: 0 would refuse them all.
        return Err(super::common::UsageError("--max-queue must be at least 1 (every request passes through the queue)".into()).into());
    }
    let names = if args.served_model_name.is_empty() {
        vec![match &args.model.model {
            Some(dir) => std::fs::canonicalize(dir)
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "flashseek-default".into()),
            None => "flashseek-default".into(),
        }]
    } else {
        args.served_model_name.clone()
    };
    let m = load(&args.model)?;
    let on_gpu = m.gpu.is_some();
    let prefill_chunk = match args.model.prefill_chunk {
        Some(c) => c,
        None if on_gpu => flashseek_engine::switches::serve_prefill_chunk_tokens(),
        None => super::common::CPU_PREFILL_CHUNK,
    };
    let cfg = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        model_names: names,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_bytes,
        keepalive: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(args.drain_timeout),
        scheduler: SchedulerConfig {
            max_running: args.max_running.max(1),
            state_budget_bytes: args.state_budget_mib.saturating_mul(1 << 20),
            max_queue: args.max_queue,
            prefill_chunk,
            prefix_cache_entries: args.prefix_cache,
            forward: m.forward,
        },
    };
    let tokenizer = Arc::new(m.tokenizer.clone());
    if let Some((gpu, model)) = m.gpu {
        // One GPU: sequences allocate their device state for their request's length (rounded up,
        // at most --gpu-context, the server's context limit on this backend); decode steps run one
        // sequence after another on the GPU's stream.
        let backend = flashseek_engine::cuda::session::GpuBackend { gpu, model, max_capacity: m.gpu_context };
        flashseek_server::serve_backend_blocking(cfg, Arc::new(backend), tokenizer)?;
    } else {
        flashseek_server::serve_blocking(cfg, Arc::new(m.cpu_weights()?), tokenizer)?;
    }
    Ok(())
}
