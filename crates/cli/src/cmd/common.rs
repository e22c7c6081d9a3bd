//! What the model-running subcommands share: choosing and loading the model, the tokenizer,
//! sampling flags, and the end-of-run statistics line.

use anyhow::Context;
use flashseek_engine::default_model::{cache_root, ensure_default_model};
use flashseek_engine::forward::{ForwardOptions, Numerics};
use flashseek_engine::generate::GenerateStats;
use flashseek_engine::sampler::SamplingParams;
use flashseek_engine::cuda::gpu::Gpu;
use flashseek_engine::cuda::model::GpuModel;
use flashseek_engine::cuda::session::GpuSession;
use flashseek_engine::cuda::upload::StoredSource;
use flashseek_engine::session::{Sequence, Session};
use flashseek_engine::weights::{ModelWeights, TensorSource, WeightsError};
use flashseek_model::checkpoint::Checkpoint;
use flashseek_model::config::Ds4Config;
use flashseek_model::tokenizer::Ds4Tokenizer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::cell::Cell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Prefill chunk of the CPU reference when `--prefill-chunk` is not given (tokens).
pub const CPU_PREFILL_CHUNK: usize = 512;

/// Model selection flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// DeepSeek-V4 checkpoint directory (config.json + safetensors, official or transformers
    /// layout). Without it flashseek runs its embedded random-weight default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Simulate DeepSeek's official numerics (spec §10: FP8 activations, FP8 KV, FP4 indexer); CPU
    /// backend only (on CUDA, `--switch TC_LINEAR=fp8` gives the FP8-activation part).
    #[arg(long)]
    pub official_numerics: bool,
    /// Tokens per prefill chunk (default: 512 on the CPU; on CUDA the `LONG_CONTEXT_CHUNK` switch,
    /// 32,768 or 2,048 — for `serve` 8,192 or 2,048, there a budget per scheduler step that the
    /// prompts being prefilled share; a value given here is used as given). On CUDA, chunks under 64
    /// tokens run the linears on the exact f32 kernels and chunks of 64–255 tokens on gemm.cu's
    /// tensor-core kernels instead of cuBLASLt, so only chunks of >= 256 tokens give bit-identical
    /// results to each other.
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Backend: `cpu` (the exact reference) or `cuda` / `cuda:N` / `N` (GPU N; weights uploaded in their
    /// stored formats; kernels as the switches say — `flashseek switches` — exact HF numerics by
    /// default). With `serve`, one GPU runs every sequence (decode steps one after another).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Tokens of device state to allocate per sequence on a GPU (its context limit there; `serve`
    /// serves this context and allocates prompt + max_tokens rounded up to 4,096 per request).
    #[arg(long, default_value_t = 8192)]
    pub gpu_context: usize,
}

/// A parsed `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU reference.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl ModelArgs {
    /// Parses `--device`.
    pub fn device(&self) -> anyhow::Result<Device> {
        match self.device.trim() {
            "cpu" => Ok(Device::Cpu),
            d => parse_cuda_device(d).map(Device::Cuda).map_err(|_| UsageError(format!("--device {d}: expected cpu, cuda, cuda:N or N")).into()),
        }
    }
}

/// Sampling flags (see `flashseek_engine::sampler::SamplingParams`).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate (at least 1).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = parse_positive_count)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy. DeepSeek recommends 1.0.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: usize,
    /// Drop tokens below min_p × the top probability (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty over prompt and output tokens (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    /// Presence penalty (OpenAI semantics).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty (OpenAI semantics).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Random seed (same seed, same tokens).
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Stop string (repeatable); never printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

/// An invalid command-line value found after parsing (sampling values, `--device`): the command
/// exits with code 2, like clap's own argument errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl SamplingArgs {
    /// The sampler parameters, with `eos` as a stop token.
    pub fn params(&self, eos: u32) -> anyhow::Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            logprobs: None,
            stop_token_ids: vec![eos],
            stop_strings: self.stop.clone(),
            forced: None,
            reasoning_budget: None,
        };
        p.validate().map_err(|e| UsageError(e.to_string()))?;
        Ok(p)
    }
}

/// A loaded model and its tokenizer.
pub struct Loaded {
    /// Dequantized weights (CPU backend).
    pub weights: Option<ModelWeights>,
    /// The GPU and the model on it (CUDA backend).
    pub gpu: Option<(Gpu, GpuModel)>,
    /// Maximum tokens per GPU sequence.
    pub gpu_context: usize,
    /// Tokens per prefill chunk.
    pub prefill_chunk: Option<usize>,
    /// Tokenizer (the checkpoint's `tokenizer.json` if it has one, else the embedded V4 tokenizer).
    pub tokenizer: Ds4Tokenizer,
    /// Forward options from the flags.
    pub forward: ForwardOptions,
}

/// Counts bytes handed out, for the loading progress bar.
struct Progress<'a> {
    inner: &'a Checkpoint,
    bar: ProgressBar,
    start: Instant,
    shown: Cell<bool>,
}

impl Progress<'_> {
    fn tick(&self, bytes: u64) {
        self.bar.inc(bytes);
        if !self.shown.get() && self.start.elapsed() > Duration::from_secs(1) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown.set(true);
        }
    }
}

impl TensorSource for Progress<'_> {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let v = TensorSource::load_f32(self.inner, name, shape)?;
        self.tick(self.inner.info(name).map_or(0, |i| stored_bytes(&i)));
        Ok(v)
    }
    fn load_i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightsError> {
        let v = TensorSource::load_i64(self.inner, name, shape)?;
        self.tick(self.inner.info(name).map_or(0, |i| stored_bytes(&i)));
        Ok(v)
    }
}

fn stored_bytes(info: &flashseek_model::checkpoint::TensorInfo) -> u64 {
    info.dtype.bytes_for(info.shape.iter().product::<usize>()).unwrap_or(0) as u64
}

/// Refuses a `--model` path that is not a directory, saying whether it is missing or a file.
///
/// Errors: the path does not exist, or is not a directory.
pub fn check_model_dir(d: &std::path::Path) -> anyhow::Result<()> {
    if !d.exists() {
        anyhow::bail!("--model {}: does not exist; expected a checkpoint directory (config.json + safetensors)", d.display());
    }
    if !d.is_dir() {
        anyhow::bail!("--model {}: is not a directory; expected a checkpoint directory (config.json + safetensors)", d.display());
    }
    Ok(())
}

/// Resolves `--model` (writing the embedded default model on first use), loads config, weights and
/// tokenizer. Prints a one-time note when the embedded random-weight model is used.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    if args.prefill_chunk == Some(0) {
        return Err(UsageError("--prefill-chunk must be at least 1".into()).into());
    }
    args.device()?; // a bad --device fails before anything loads
    if args.official_numerics && args.device()? != Device::Cpu {
        anyhow::bail!("--official-numerics runs on the CPU backend only (use --device cpu); on CUDA, `--switch TC_LINEAR=fp8` gives the FP8 activation part of it (spec §10.1)");
    }
    // The embedded model's note comes once it has loaded (after any device error).
    let mut default_model = false;
    let dir = match &args.model {
        Some(d) => {
            check_model_dir(d)?;
            d.clone()
        }
        None => {
            let root = cache_root();
            let t = Instant::now();
            let (mut dir, mut created) = ensure_default_model(&root)?;
            if Ds4Config::from_file(&dir).is_err() || Checkpoint::open(&dir).is_err() {
                // A damaged cached copy (interrupted disk write, manual edits): write it again.
                eprintln!("flashseek: the cached default model at {} is damaged; rewriting it", dir.display());
                std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
                (dir, created) = ensure_default_model(&root)?;
            }
            if created {
                eprintln!("flashseek: wrote the embedded default model to {} ({:.1} s)", dir.display(), t.elapsed().as_secs_f64());
            }
            default_model = true;
            dir
        }
    };
    let cfg = Ds4Config::from_file(&dir).with_context(|| format!("model {}", dir.display()))?;
    let ckpt = Checkpoint::open(&dir)?;
    let device = args.device()?;
    let bar = ProgressBar::with_draw_target(Some(ckpt.total_bytes()), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("loading {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {elapsed}")
            .expect("static template"),
    );
    let (weights, gpu) = match device {
        Device::Cpu => {
            let src = Progress { inner: &ckpt, bar, start: Instant::now(), shown: Cell::new(false) };
            let weights = ModelWeights::load(&cfg, &src)?;
            src.bar.finish_and_clear();
            (Some(weights), None)
        }
        Device::Cuda(n) => {
            let t = Instant::now();
            let gpu = Gpu::open(n, &cache_root().join("kernels"))?;
            let model = GpuModel::upload_with(&gpu, &cfg, &StoredSource(&ckpt))?;
            eprintln!(
                "flashseek: loaded the model on {} ({}) in {:.1} s",
                gpu.ctx.name().unwrap_or_default(),
                gpu.arch,
                t.elapsed().as_secs_f64()
            );
            (None, Some((gpu, model)))
        }
    };
    if default_model {
        eprintln!(
            "flashseek: running the embedded default model — random weights, so its text is meaningless.\n\
             flashseek: for real output pass --model /path/to/DeepSeek-V4-checkpoint (config.json + safetensors)."
        );
    }
    let tok_file = dir.join("tokenizer.json");
    let tokenizer = if tok_file.is_file() { Ds4Tokenizer::from_file(&tok_file)? } else { Ds4Tokenizer::embedded()? };
    if tokenizer.vocab_size() > cfg.vocab_size {
        anyhow::bail!(
            "tokenizer has {} tokens but the model's vocab_size is {} ({})",
            tokenizer.vocab_size(),
            cfg.vocab_size,
            dir.display()
        );
    }
    let numerics = if args.official_numerics { Numerics::official() } else { Numerics::default() };
    if gpu.is_none() {
        let set: Vec<String> = flashseek_engine::switches::SWITCHES
            .iter()
            .filter(|s| flashseek_engine::switches::value_of(s.name).1 != flashseek_engine::switches::Origin::Default)
            .map(|s| format!("{}={}", s.name, flashseek_engine::switches::value(s.name)))
            .collect();
        if !set.is_empty() {
            eprintln!("flashseek: note: switches ({}) choose CUDA kernels and have no effect on the CPU reference (its official numerics: --official-numerics)", set.join(", "));
        }
    }
    Ok(Loaded {
        weights,
        gpu,
        gpu_context: args.gpu_context,
        prefill_chunk: args.prefill_chunk,
        tokenizer,
        forward: ForwardOptions { numerics, record_streams: false },
    })
}

impl Loaded {
    /// A new empty sequence on the loaded backend.
    pub fn sequence(&self) -> anyhow::Result<Box<dyn Sequence + '_>> {
        if let Some(w) = &self.weights {
            let mut s = Session::new(w, self.forward, None);
            s.prefill_chunk = self.prefill_chunk.unwrap_or(CPU_PREFILL_CHUNK);
            return Ok(Box::new(s));
        }
        let (gpu, model) = self.gpu.as_ref().ok_or_else(|| anyhow::anyhow!("no backend loaded"))?;
        let mut s = GpuSession::new(gpu, model, self.gpu_context)?;
        if let Some(c) = self.prefill_chunk {
            s.prefill_chunk = c;
        }
        Ok(Box::new(s))
    }

    /// The CPU weights, for commands that only run on the CPU backend.
    pub fn cpu_weights(self) -> anyhow::Result<ModelWeights> {
        self.weights.ok_or_else(|| anyhow::anyhow!("this command runs on the CPU backend only (use --device cpu)"))
    }
}

/// The closing statistics line.
pub fn stats_line(s: &GenerateStats) -> String {
    format!(
        "[prompt {} tokens ({} reused) · prefill {:.1} tok/s · {} generated · decode {} · {}]",
        s.prompt_tokens,
        s.reused_tokens,
        s.prefill_tok_s(),
        s.generated,
        s.decode_tok_s().map_or("n/a".to_string(), |r| format!("{r:.1} tok/s")),
        s.finish.label()
    )
}

/// Runs the generation loop and hands the generated text to `on_text` piece by piece: tokens are
/// detokenized incrementally (multi-byte characters held until complete) and stop strings are cut
/// (never emitted). `on_text` returns false to stop (e.g. stdout closed). The text left in the
/// decoder when generation ends is flushed through `on_text` too.
pub fn generate_text(
    session: &mut dyn Sequence,
    tokenizer: &flashseek_model::tokenizer::Ds4Tokenizer,
    ids: &[u32],
    sampler: &mut flashseek_engine::sampler::Sampler,
    max_tokens: usize,
    skip_special: bool,
    mut on_text: impl FnMut(&str) -> bool,
) -> anyhow::Result<GenerateStats> {
    let mut stops = flashseek_engine::sampler::StopMatcher::new(&sampler.params().stop_strings);
    let mut dec = flashseek_model::tokenizer::StreamDecoder::new(tokenizer, skip_special);
    let mut failure = None;
    let stats = flashseek_engine::generate::generate(session, ids, sampler, max_tokens, |s| {
        let piece = match dec.push(s.token) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(anyhow::Error::from(e));
                return std::ops::ControlFlow::Break(());
            }
        };
        let (text, stopped) = stops.push(&piece);
        if !on_text(&text) || stopped {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if !stops.is_stopped() {
        let (tail, _) = stops.push(&dec.finish());
        on_text(&(tail + &stops.finish()));
    }
    Ok(stats)
}

/// A count of at least 1 (`--max-tokens`), with a message that says so instead of clap's
/// `0 is not in 1..18446744073709551615`.
///
/// Errors: text that is not a whole number, or 0.
pub fn parse_positive_count(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("expected a whole number of at least 1, got `{v}`")),
    }
}

/// Parses a GPU command's `--device`: `N`, `cuda` (device 0) or `cuda:N` (`--device` of
/// chat/generate/serve takes the same spellings and `cpu`).
pub fn parse_cuda_device(v: &str) -> Result<usize, String> {
    let t = v.trim();
    let n = if t == "cuda" { Some("0") } else { t.strip_prefix("cuda:").or(Some(t)) };
    n.and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| format!("`{v}`: expected a CUDA device: N, cuda or cuda:N"))
}

/// Checks, without touching an existing file, that `path` can be written: its folder exists and a
/// probe file can be created there (and is removed). Commands call it before long runs so that a
/// report that cannot be written fails at once, and a failed run leaves earlier results alone.
pub fn check_writable(path: &std::path::Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        anyhow::bail!("{}: folder {} does not exist", path.display(), dir.display());
    }
    if path.is_dir() {
        anyhow::bail!("{} is a folder, a file path is needed", path.display());
    }
    let probe = dir.join(format!(".flashseek-write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| anyhow::anyhow!("{}: cannot write in {}: {e}", path.display(), dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    #[test]
    fn cuda_devices_parse_like_the_backend_flag() {
        assert_eq!(parse_cuda_device("0"), Ok(0));
        assert_eq!(parse_cuda_device("cuda"), Ok(0));
        assert_eq!(parse_cuda_device("cuda:3"), Ok(3));
        assert!(parse_cuda_device("cpu").is_err());
        assert!(parse_cuda_device("cuda:x").is_err());
    }

    #[test]
    fn backend_device_flag_takes_the_gpu_spellings_and_cpu() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            m: ModelArgs,
        }
        let dev = |v: &str| T::try_parse_from(["t", "--device", v]).unwrap().m.device().map_err(|e| e.to_string());
        assert_eq!(dev("cpu").unwrap(), Device::Cpu);
        assert_eq!(dev("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(dev("cuda:2").unwrap(), Device::Cuda(2));
        assert_eq!(dev("1").unwrap(), Device::Cuda(1));
        assert_eq!(dev("cuda:abc").unwrap_err(), "--device cuda:abc: expected cpu, cuda, cuda:N or N");
        assert!(dev("gpu").is_err());
    }

    #[test]
    fn writability_check_leaves_existing_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        std::fs::write(&f, b"{\"a\":1}").unwrap();
        check_writable(&f).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"{\"a\":1}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(check_writable(&dir.path().join("missing/r.json")).is_err());
        assert!(check_writable(dir.path()).is_err());
    }
}
