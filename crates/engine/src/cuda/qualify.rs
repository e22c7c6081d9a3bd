//! `flashseek qualify` (issue 6 §8): the qualification matrix of the prefill stack. For each target
//! prompt length (default 8,192 / 32,768 / 131,072 tokens) a prompt of exactly that many tokens is
//! built through the real tokenizer and the DeepSeek-V4 chat encoding; then for each switch
//! configuration (the baseline with every optimisation off, each switch alone on, all on, each
//! alone off) a cold prefill and `decode_tokens` greedy tokens run on DeepSeek-V4-Flash shapes with
//! random official-precision weights. Recorded per run: prefill tok/s (CUDA events), time to first
//! token (host clock: prefill + logits to the host + argmax), decode tok/s, SHA-256 of the generated
//! ids, and the last prompt position's logits NMSE against the exact path: the baseline (the exact
//! kernels) where the baseline ran at that length, else the run with every switch at its default
//! (the exact fast path, which the shorter lengths compare with the baseline). Each compared row
//! names its reference in `nmse_reference` (the JSON keys `logits_nmse_vs_baseline` and
//! `ids_equal_baseline` keep their names whichever it is); the reference runs themselves have none.
//!
//! Refusals (the run fails): a prompt whose token count differs from the target, a configuration
//! that promises exactness (`exactness_promised`: neither a fast-numerics one such as
//! `TC_LINEAR=bf16` or `MLA_BF16=on` nor an official-numerics one) whose generated ids differ from
//! the reference's or that runs before any reference (its tokens unchecked), and a run with all
//! switches on and a quarter of the prefill chunk
//! ([`invariance_chunk`]) whose logits differ in any bit (or whose ids differ) from the default
//! chunk's (chunk size is a performance knob only). The slow configurations (the baseline, "alone on", `MOE_GROUPED` off, `TC_LINEAR` off) run only up
//! to `full_matrix_max` tokens; the report says which were skipped.

use super::bench::flash_config;
use super::check::differing_bits;
use super::gpu::Gpu;
use super::model::{decode_step_gpu, prefill_gpu, GpuModel, GpuSequence};
use super::upload::RandomOfficialSource;
use super::CudaError;
use crate::switches::{configurations, scoped, Role};
use flashseek_model::chat::{encode_messages, EncodeOptions, ThinkingMode};
use flashseek_model::tokenizer::Ds4Tokenizer;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::time::Instant;

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct QualifyOptions {
    /// Flash layers instantiated (the first N of the schedule).
    pub layers: usize,
    /// Target prompt lengths in tokens.
    pub contexts: Vec<usize>,
    /// Prefill chunk (tokens); None = the `LONG_CONTEXT_CHUNK` switch of each configuration.
    pub chunk: Option<usize>,
    /// Greedy tokens generated after each prefill.
    pub decode_tokens: usize,
    /// Longest prompt on which the slow configurations run.
    pub full_matrix_max: usize,
}

fn tok_err(e: impl std::fmt::Display) -> CudaError {
    CudaError::Unsupported { what: "qualify prompt", detail: e.to_string() }
}

/// Token ids of a one-message chat prompt (chat mode, BOS added) that is exactly `target` tokens
/// long: the user message is a fixed opening sentence followed by repetitions of " the" (one token
/// each in the V4 vocabulary), their count solved from a measured prompt.
///
/// Errors: the tokenizer failing, or no count giving exactly `target` tokens (reported with the
/// lengths found: the caller refuses the run).
pub fn exact_prompt(tok: &Ds4Tokenizer, target: usize) -> Result<Vec<u32>, CudaError> {
    let opening = "Summarise the following text in one sentence.";
    let encode = |n: usize| -> Result<Vec<u32>, CudaError> {
        let content = format!("{opening}{}", " the".repeat(n));
        let opts = EncodeOptions { thinking_mode: ThinkingMode::Chat, reasoning_effort: None, drop_thinking: true, add_default_bos_token: true, context: None };
        let text = encode_messages(&[json!({"role": "user", "content": content})], &opts).map_err(tok_err)?;
        tok.encode_with_special(&text).map_err(tok_err)
    };
    let base = encode(0)?.len();
    if target < base {
        return Err(tok_err(format!("target {target} is shorter than the empty prompt ({base} tokens)")));
    }
    let mut n = target - base;
    for _ in 0..4 {
        let ids = encode(n)?;
        if ids.len() == target {
            return Ok(ids);
        }
        n = (n as i64 + target as i64 - ids.len() as i64).max(0) as usize;
    }
    Err(tok_err(format!("no filler length gives exactly {target} tokens (last try {} tokens)", encode(n)?.len())))
}

fn argmax(x: &[f32]) -> u32 {
    crate::testing::argmax(x) as u32
}

/// What one cold prefill + greedy decode measured.
struct RunResult {
    /// Prefill seconds (CUDA events).
    prefill: f64,
    /// Seconds to the first token (host clock).
    ttft: f64,
    /// Seconds of the greedy steps (host clock).
    decode: f64,
    /// Logits of the last prompt position.
    logits: Vec<f32>,
    /// Generated ids.
    ids: Vec<u32>,
}

/// Cold prefill of `ids` then `n` greedy tokens.
fn one_run(gpu: &Gpu, m: &GpuModel, ids: &[u32], chunk: Option<usize>, n: usize) -> Result<RunResult, CudaError> {
    let chunk = chunk.unwrap_or_else(crate::switches::prefill_chunk_tokens);
    let mut seq = GpuSequence::new(gpu, m, ids.len() + n + 1)?;
    gpu.sync()?;
    let wall = Instant::now();
    let a = gpu.record_event()?;
    let logits = prefill_gpu(gpu, m, &mut seq, ids, chunk)?;
    let b = gpu.record_event()?;
    let mut next = argmax(&logits);
    let ttft = wall.elapsed().as_secs_f64();
    let prefill = super::gpu::elapsed_s(&a, &b)?;
    let t = Instant::now();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next);
        let l = decode_step_gpu(gpu, m, &mut seq, next)?;
        next = argmax(&l);
    }
    Ok(RunResult { prefill, ttft, decode: t.elapsed().as_secs_f64(), logits, ids: out })
}

/// Runs the matrix; returns the JSON report and whether every run qualified.
pub fn run(gpu: &Gpu, opts: &QualifyOptions) -> Result<(Value, bool), CudaError> {
    let cfg = flash_config(opts.layers);
    let tok = Ds4Tokenizer::shared().map_err(tok_err)?;
    let t = Instant::now();
    let model = GpuModel::upload_with(gpu, &cfg, &RandomOfficialSource::new(&cfg, 7))?;
    gpu.sync()?;
    println!("qualify: {} Flash layers uploaded in {:.1} s", cfg.num_hidden_layers, t.elapsed().as_secs_f64());
    // Warm-up (first launches, allocator growth) under every configuration.
    let warm = exact_prompt(tok, 256)?;
    for c in configurations() {
        scoped(&c.overrides, || one_run(gpu, &model, &warm, opts.chunk, 2)).map_err(tok_err)??;
    }
    let n_layers = cfg.num_hidden_layers as f64;
    let mut rows = Vec::new();
    let mut ok = true;
    for &target in &opts.contexts {
        let ids = exact_prompt(tok, target)?;
        if ids.len() != target {
            return Err(tok_err(format!("prompt of {} tokens for target {target}: refused", ids.len())));
        }
        // The exact path's logits and ids for the NMSE and the promised tokens: the baseline's, or
        // where the baseline is skipped at this length, the defaults' (Role::AllOn, exact).
        let mut exact_ref: Option<(Vec<f32>, Vec<u32>, &'static str)> = None;
        let skipped = |c: &crate::switches::Configuration| c.slow && target > opts.full_matrix_max;
        let baseline_runs = configurations().iter().any(|c| c.role == Role::Baseline && !skipped(c));
        let mut all_on: Option<(Vec<f32>, Vec<u32>)> = None;
        let mut official_all_on: Option<Vec<f32>> = None;
        for c in configurations() {
            if skipped(&c) {
                rows.push(json!({"context": target, "config": c.label, "skipped": format!("slow configuration: runs only up to {} tokens", opts.full_matrix_max)}));
                continue;
            }
            let RunResult { prefill, ttft, decode, logits, ids: gen } = scoped(&c.overrides, || one_run(gpu, &model, &ids, opts.chunk, opts.decode_tokens)).map_err(tok_err)??;
            let sha = Sha256::digest(gen.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
            let sha: String = sha.iter().map(|b| format!("{b:02x}")).collect();
            let (nmse, same, nmse_reference) = match &exact_ref {
                Some((bl, bg, name)) => (Some(super::check::errors(&logits, bl).0), Some(*bg == gen), Some(*name)),
                None => (None, None, None),
            };
            // TC_LINEAR=fp8 runs DeepSeek's official numerics: its tokens are compared, not promised.
            let promised = c.exact && !c.official;
            // Fusion, tile height, grid and chunk size promise the all-on run's bits (an official
            // configuration: the official all-on run's).
            let reference = if c.official { official_all_on.as_ref() } else { all_on.as_ref().map(|(al, _)| al) };
            let bits_differ = match (reference, c.same_bits_as_all_on) {
                (Some(al), true) => Some(differing_bits(&logits, al)),
                _ => None,
            };
            // This run as the exact path's reference for the runs after it (its name), if it is one.
            let becomes_ref = match c.role {
                Role::Baseline => Some("baseline (exact kernels)"),
                Role::AllOn if !baseline_runs => Some("all on (defaults): the exact fast path, the baseline being skipped at this length"),
                _ => None,
            };
            // A promise of bits, or of tokens, with no reference run before it cannot be checked:
            // refused (the runs that become the tokens' reference excepted).
            let unchecked = (c.same_bits_as_all_on && reference.is_none()) || (promised && same.is_none() && becomes_ref.is_none());
            let refused = (promised && same == Some(false)) || bits_differ.is_some_and(|n| n > 0) || unchecked;
            ok &= !refused;
            let prefill_tok_s = target as f64 / prefill;
            let decode_tok_s = opts.decode_tokens as f64 / decode.max(1e-12);
            println!(
                "qualify {target:>6} {:<32} prefill {prefill_tok_s:>8.0} tok/s (43-layer est. {:>6.0})  TTFT {:>7.3} s  decode {decode_tok_s:>6.1} tok/s  ids {}  nmse {}{}",
                c.label,
                prefill_tok_s * n_layers / 43.0,
                ttft,
                &sha[..12],
                nmse.map(|v| format!("{v:.2e}{}", if baseline_runs { "" } else { " (vs defaults)" })).unwrap_or_else(|| "-".into()),
                if unchecked { "  REFUSED: no reference run for its promised bits or tokens" } else if refused { "  REFUSED: tokens (or promised bits) differ" } else { "" }
            );
            rows.push(json!({
                "context": target, "prompt_tokens": ids.len(), "config": c.label,
                "overrides": c.overrides.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>(),
                "prefill_s": prefill, "prefill_tok_s": prefill_tok_s, "prefill_tok_s_43_layer_estimate": prefill_tok_s * n_layers / 43.0,
                "ttft_s": ttft, "decode_tokens": opts.decode_tokens, "decode_tok_s": decode_tok_s,
                "decode_tok_s_43_layer_estimate": decode_tok_s * n_layers / 43.0,
                "generated_ids_sha256": sha, "logits_nmse_vs_baseline": nmse, "ids_equal_baseline": same, "nmse_reference": nmse_reference,
                "exactness_promised": promised, "official_numerics": c.official, "logits_bits_differing_vs_all_on": bits_differ,
                "bits_reference": crate::switches::bits_reference(c.same_bits_as_all_on, c.official), "refused": refused,
            }));
            if let Some(name) = becomes_ref {
                exact_ref = Some((logits.clone(), gen.clone(), name));
            }
            if c.role == Role::OfficialAllOn {
                official_all_on = Some(logits.clone());
            }
            if c.role == Role::AllOn {
                all_on = Some((logits, gen));
            }
        }
        // Chunk size is a pure performance knob (issue 6 §1): all on with a quarter of the chunk
        // must give the same logits bits and the same ids.
        let base = opts.chunk.unwrap_or_else(crate::switches::prefill_chunk_tokens);
        let small = invariance_chunk(base, target);
        if small.is_none() {
            println!("qualify {target:>6} chunk invariance not checked: no chunk of >= {} tokens smaller than {} splits the prompt", super::model::PREFILL_MIN_TAIL, base.min(target));
        }
        if let (Some(small), Some((al, ag))) = (small, all_on) {
            let r = one_run(gpu, &model, &ids, Some(small), opts.decode_tokens)?;
            let differ = differing_bits(&r.logits, &al);
            let same_ids = r.ids == ag;
            let refused = differ != 0 || !same_ids;
            ok &= !refused;
            println!(
                "qualify {target:>6} {:<32} prefill {:>8.0} tok/s  logits bits differing from chunk {}: {differ}  ids {}{}",
                format!("all on, chunk {small}"),
                target as f64 / r.prefill,
                base.min(target),
                if same_ids { "equal" } else { "DIFFER" },
                if refused { "  REFUSED: chunk size changed the result" } else { "" }
            );
            rows.push(json!({
                "context": target, "config": format!("all on, chunk {small}"), "prefill_chunk": small,
                "prefill_s": r.prefill, "prefill_tok_s": target as f64 / r.prefill,
                "prefill_tok_s_43_layer_estimate": target as f64 / r.prefill * n_layers / 43.0, "ttft_s": r.ttft,
                "decode_tok_s": opts.decode_tokens as f64 / r.decode.max(1e-12),
                "logits_bits_differing_vs_default_chunk": differ, "ids_equal_default_chunk": same_ids,
                "exactness_promised": true, "refused": refused,
            }));
        }
    }
    let switches: Vec<Value> = crate::switches::SWITCHES.iter().map(|s| json!({"name": s.name, "default": s.default_value()})).collect();
    Ok((
        json!({
            "gpu": gpu.ctx.name().unwrap_or_default(), "arch": gpu.arch,
            "model": format!("DeepSeek-V4-Flash shapes, first {} layers, random weights in official precision", cfg.num_hidden_layers),
            "layers_measured": cfg.num_hidden_layers, "prefill_chunk": opts.chunk, "full_matrix_max": opts.full_matrix_max,
            "prompt": "one user message through the DeepSeek-V4 chat encoding (chat mode, BOS) and the V4 tokenizer, exactly the target length",
            "timing": "prefill: CUDA events around the chunks of a cold prefill; TTFT: host clock to the first token's argmax; decode: host clock over the greedy steps",
            "estimate_note": "43-layer figures scale by layers/43: an estimate, not a measurement",
            "switches": switches, "qualified": ok, "runs": rows,
        }),
        ok,
    ))
}

/// An SVG bar chart of prefill tok/s (43-layer estimate) per context and configuration.
pub fn chart_svg(report: &Value) -> String {
    let runs: Vec<&Value> = report["runs"].as_array().map(|a| a.iter().filter(|r| r.get("prefill_tok_s").is_some()).collect()).unwrap_or_default();
    let contexts: Vec<u64> = {
        let mut c: Vec<u64> = runs.iter().filter_map(|r| r["context"].as_u64()).collect();
        c.dedup();
        c
    };
    let max = runs.iter().filter_map(|r| r["prefill_tok_s_43_layer_estimate"].as_f64()).fold(1.0f64, f64::max);
    let (bar_h, gap, left, width) = (14.0, 10.0, 300.0, 520.0);
    let mut y = 40.0;
    let mut body = String::new();
    for ctx in &contexts {
        body.push_str(&format!("<text x=\"10\" y=\"{:.0}\" font-weight=\"bold\">{ctx} tokens</text>\n", y + 10.0));
        y += 18.0;
        for r in runs.iter().filter(|r| r["context"].as_u64() == Some(*ctx)) {
            let v = r["prefill_tok_s_43_layer_estimate"].as_f64().unwrap_or(0.0);
            let w = width * v / max;
            let label = r["config"].as_str().unwrap_or("").replace('&', "&amp;").replace('<', "&lt;");
            body.push_str(&format!(
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{label}</text><rect x=\"{left}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"#4a7ab7\"/><text x=\"{:.0}\" y=\"{:.0}\">{v:.0}</text>\n",
                left - 6.0,
                y + 11.0,
                y,
                left + w + 4.0,
                y + 11.0
            ));
            y += bar_h + 4.0;
        }
        y += gap;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{:.0}\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"10\" y=\"20\" font-size=\"14\">flashseek qualify: prefill tok/s, 43-layer estimate ({}; {} layers measured)</text>\n{body}</svg>\n",
        left + width + 80.0,
        y + 10.0,
        report["gpu"].as_str().unwrap_or(""),
        report["layers_measured"]
    )
}

/// The chunk qualify compares with the default chunk `base` at a `target`-token prompt: a quarter
/// of the chunk that actually runs (`base`, or the prompt when that is shorter), at least
/// [`super::model::PREFILL_MIN_TAIL`] tokens (shorter pieces run other kernels); `None` when that is
/// not smaller than the chunk that runs or would not split the prompt (a tail under the minimum
/// joins the chunk before it, so the prompt must hold the chunk plus the minimum).
pub fn invariance_chunk(base: usize, target: usize) -> Option<usize> {
    let min = super::model::PREFILL_MIN_TAIL;
    let runs = base.min(target);
    let small = (runs / 4).max(min);
    (small < runs && target >= small + min).then_some(small)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunk-invariance check's chunk: a quarter of the chunk that runs, never under the tail
    /// minimum, none when nothing smaller is left.
    #[test]
    fn invariance_chunk_is_a_quarter_of_the_running_chunk() {
        assert_eq!(invariance_chunk(32768, 131072), Some(8192));
        assert_eq!(invariance_chunk(32768, 32768), Some(8192));
        assert_eq!(invariance_chunk(32768, 8192), Some(2048), "a prompt shorter than the chunk runs in one piece");
        assert_eq!(invariance_chunk(2048, 8192), Some(512));
        assert_eq!(invariance_chunk(512, 8192), Some(256), "never under the tail minimum");
        assert_eq!(invariance_chunk(256, 8192), None, "nothing smaller than the minimum");
        assert_eq!(invariance_chunk(32768, 300), None, "256 + a 44-token tail is one chunk");
        assert_eq!(invariance_chunk(32768, 511), None);
        assert_eq!(invariance_chunk(32768, 512), Some(256));
        assert_eq!(invariance_chunk(32768, 1000), Some(256));
    }

    /// The qualification prompts have exactly the target lengths, decode back to the chat format,
    /// and a target below the empty prompt is refused.
    #[test]
    fn exact_prompts_hit_their_targets() {
        let tok = Ds4Tokenizer::shared().unwrap();
        for target in [64usize, 1000, 8192, 32768, 131072] {
            let ids = exact_prompt(tok, target).unwrap();
            assert_eq!(ids.len(), target);
            assert_eq!(ids[0], tok.token_to_id("<｜begin▁of▁sentence｜>").unwrap());
        }
        let text = tok.decode(&exact_prompt(tok, 100).unwrap(), false).unwrap();
        assert!(text.contains("<｜User｜>Summarise the following text in one sentence. the the"), "{text}");
        assert!(exact_prompt(tok, 3).is_err());
    }

    #[test]
    fn chart_lists_every_measured_run() {
        let report = json!({"gpu": "X", "layers_measured": 4, "runs": [
            {"context": 8192, "config": "all on", "prefill_tok_s": 1.0, "prefill_tok_s_43_layer_estimate": 100.0},
            {"context": 8192, "config": "a<b", "prefill_tok_s": 1.0, "prefill_tok_s_43_layer_estimate": 50.0},
            {"context": 32768, "config": "skipped", "skipped": "slow"}]});
        let svg = chart_svg(&report);
        assert!(svg.starts_with("<svg") && svg.contains("8192 tokens") && svg.contains("a&lt;b") && !svg.contains("32768 tokens"), "{svg}");
    }
}
