//! The token-by-token generation loop shared by the CLI and the server: prompt (with prefix reuse)
//! → sample → decode, until a stop token, the token budget, or the caller says stop.

use crate::sampler::{Sampled, Sampler, SamplerError, StepLogits};
use crate::session::{Sequence, SessionError};
use std::ops::ControlFlow;
use std::time::Instant;

/// Errors of a generation.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The forward pass or state refused the input.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The sampler refused the logits or its parameters.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (e.g. EOS) was sampled.
    Stop,
    /// `max_tokens` tokens were generated.
    Length,
    /// The caller's callback asked to stop (stop string, cancellation).
    Callback,
    /// The sequence reached the model's context limit.
    ContextFull,
}

impl FinishReason {
    /// A short label for reports: `stop`, `length`, `stop string`, `context full`.
    pub fn label(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Callback => "stop string",
            FinishReason::ContextFull => "context full",
        }
    }
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenerateStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the session's previous contents (not recomputed).
    pub reused_tokens: usize,
    /// Seconds spent on the prompt.
    pub prefill_secs: f64,
    /// Generated tokens (including a final stop token).
    pub generated: usize,
    /// Seconds spent generating after the prompt.
    pub decode_secs: f64,
    /// Why it ended.
    pub finish: FinishReason,
}

impl GenerateStats {
    /// Prompt tokens actually computed per second.
    pub fn prefill_tok_s(&self) -> f64 {
        (self.prompt_tokens - self.reused_tokens) as f64 / self.prefill_secs.max(1e-9)
    }
    /// Decode steps per second (the first token comes from the prompt's logits, so `generated − 1`
    /// forward steps are timed); None when no decode step ran.
    pub fn decode_tok_s(&self) -> Option<f64> {
        (self.generated > 1).then(|| (self.generated - 1) as f64 / self.decode_secs.max(1e-9))
    }
}

/// Generates up to `max_tokens` tokens after `prompt`, calling `on_token` with each sampled token
/// (a sampled stop token is reported too, then generation ends).
///
/// Errors: prompt or state errors from the session; sampler errors (e.g. NaN logits).
pub fn generate(
    session: &mut dyn Sequence,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_tokens: usize,
    mut on_token: impl FnMut(&Sampled) -> ControlFlow<()>,
) -> Result<GenerateStats, GenerateError> {
    let t0 = Instant::now();
    let (first, reused) = session.set_prompt(prompt)?;
    let mut logits = StepLogits::Full(first);
    let prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut generated = 0;
    let mut finish = FinishReason::Length;
    while generated < max_tokens {
        let s = sampler.sample_step(&logits)?;
        generated += 1;
        let stop = sampler.is_stop_token(s.token);
        if on_token(&s).is_break() {
            finish = FinishReason::Callback;
            break;
        }
        if stop {
            finish = FinishReason::Stop;
            break;
        }
        if generated == max_tokens {
            break;
        }
        if session.tokens().len() + 1 > session.max_len() {
            finish = FinishReason::ContextFull;
            break;
        }
        logits = session.decode_for(s.token, sampler.need())?;
    }
    Ok(GenerateStats {
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        prefill_secs,
        generated,
        decode_secs: t1.elapsed().as_secs_f64(),
        finish,
    })
}
