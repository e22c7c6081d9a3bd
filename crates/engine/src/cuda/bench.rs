//! `flashseek gpu-bench`: the current GPU forward on DeepSeek-V4-Flash shapes with random weights
//! in the official precision (FP8 attention and shared experts, FP4 routed experts, BF16
//! embeddings/head/compressors), on the first `layers` layers of the Flash schedule. Measures cold
//! prefill and batch-1 decode with the host clock around synchronised calls (each forward call
//! returns logits to the host), and reports a labelled linear estimate for 43 layers.

use super::gpu::Gpu;
use super::model::{forward_chunk_gpu, GpuModel, GpuSequence};
use super::upload::RandomOfficialSource;
use super::CudaError;
use crate::forward::LogitsFor;
use crate::testing::formula_ids;
use flashseek_model::config::Ds4Config;
use serde_json::{json, Value};
use std::time::Instant;

/// The Flash config (spec §1.1, §1.2) cut to its first `layers` layers.
pub fn flash_config(layers: usize) -> Ds4Config {
    let mut v = flashseek_model::config::flash_official_json();
    let layers = layers.clamp(1, 43);
    v["num_hidden_layers"] = layers.into();
    v["num_nextn_predict_layers"] = 0.into();
    if let Some(r) = v["compress_ratios"].as_array_mut() {
        r.truncate(layers);
    }
    Ds4Config::from_json(&v).expect("the Flash config is valid")
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Flash layers to instantiate (ignored with `config`).
    pub layers: usize,
    /// Another model config (e.g. the one a transformers comparison uses) instead of Flash.
    pub config: Option<Ds4Config>,
    /// Prompt lengths (cold prefill, then decode at that context).
    pub contexts: Vec<usize>,
    /// Tokens per prefill chunk.
    pub chunk: usize,
    /// Decode steps timed after each prefill (median reported).
    pub decode_steps: usize,
    /// Skip larger contexts once a prefill took longer than this many seconds.
    pub max_prefill_secs: f64,
}

/// Runs the benchmark; returns the JSON report.
pub fn run(gpu: &Gpu, opts: &BenchOptions) -> Result<Value, CudaError> {
    let cfg = opts.config.clone().unwrap_or_else(|| flash_config(opts.layers));
    let t = Instant::now();
    let model = GpuModel::upload_with(gpu, &cfg, &RandomOfficialSource::new(&cfg, 7))?;
    gpu.sync()?;
    let upload_s = t.elapsed().as_secs_f64();
    let (free, total) = gpu.ctx.mem_get_info().unwrap_or((0, 0));
    println!("uploaded {} Flash layers in {upload_s:.1} s; device memory used {:.1} GiB of {:.1}", cfg.num_hidden_layers, (total - free) as f64 / (1u64 << 30) as f64, total as f64 / (1u64 << 30) as f64);
    let mut rows = Vec::new();
    for &ctx in &opts.contexts {
        let ids = formula_ids(ctx as u64, ctx + opts.decode_steps, cfg.vocab_size);
        let mut seq = GpuSequence::new(gpu, &model, ctx + opts.decode_steps + 1)?;
        let t = Instant::now();
        let chunks: Vec<&[u32]> = ids[..ctx].chunks(opts.chunk.max(1)).collect();
        for (i, c) in chunks.iter().enumerate() {
            let lf = if i + 1 == chunks.len() { LogitsFor::Last } else { LogitsFor::None };
            forward_chunk_gpu(gpu, &model, &mut seq, c, lf, false)?;
        }
        gpu.sync()?;
        let prefill_s = t.elapsed().as_secs_f64();
        let mut steps = Vec::new();
        for id in &ids[ctx..] {
            let t = Instant::now();
            forward_chunk_gpu(gpu, &model, &mut seq, &[*id], LogitsFor::Last, false)?;
            steps.push(t.elapsed().as_secs_f64());
        }
        steps.sort_by(|a, b| a.total_cmp(b));
        let decode_s = steps.get(steps.len() / 2).copied().unwrap_or(f64::NAN);
        let n = cfg.num_hidden_layers as f64;
        let row = json!({
            "context": ctx,
            "layers_measured": cfg.num_hidden_layers,
            "prefill_s": prefill_s,
            "prefill_tok_s": ctx as f64 / prefill_s,
            "prefill_tok_s_43_layer_estimate": ctx as f64 / (prefill_s * 43.0 / n),
            "prefill_chunk": opts.chunk,
            "decode_ms_per_token": decode_s * 1e3,
            "decode_tok_s": 1.0 / decode_s,
            "decode_tok_s_43_layer_estimate": 1.0 / (decode_s * 43.0 / n),
            "decode_steps": steps.len(),
        });
        println!(
            "context {ctx:>6}: prefill {prefill_s:.2} s ({:.0} tok/s; 43-layer estimate {:.0}), decode {:.2} ms/token ({:.1} tok/s; 43-layer estimate {:.1})",
            ctx as f64 / prefill_s,
            ctx as f64 / (prefill_s * 43.0 / n),
            decode_s * 1e3,
            1.0 / decode_s,
            1.0 / (decode_s * 43.0 / n)
        );
        rows.push(row);
        if prefill_s > opts.max_prefill_secs {
            println!("stopping: prefill took {prefill_s:.1} s (> {} s)", opts.max_prefill_secs);
            break;
        }
    }
    Ok(json!({
        "gpu": gpu.ctx.name().unwrap_or_default(),
        "arch": gpu.arch,
        "model": "DeepSeek-V4-Flash shapes, random weights in official precision (FP8 e4m3 + ue8m0 attention/shared, FP4 e2m1 routed experts, BF16 embed/head/compressors)",
        "layers_measured": cfg.num_hidden_layers,
        "upload_s": upload_s,
        "timing": "host clock around synchronised forward calls (each returns logits); decode = median step",
        "estimate_note": "43-layer figures scale the measured time linearly by 43/layers: an estimate, not a measurement",
        "runs": rows,
    }))
}
