//! One sequence being generated: its state plus the prefill/decode calls on top of
//! [`forward_chunk`](crate::forward::forward_chunk), with prefix reuse.

use crate::forward::{forward_chunk, ForwardError, ForwardOptions, LogitsFor};
use crate::sampler::{LogitsNeed, StepLogits};
use crate::state::{SequenceState, StateError};
use crate::weights::ModelWeights;

/// Errors of a session.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Bad input to the forward pass.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A truncation the state cannot do.
    #[error(transparent)]
    State(#[from] StateError),
    /// The sequence would exceed the model's context.
    #[error("sequence of {len} tokens exceeds the context limit of {limit} tokens")]
    TooLong {
        /// Requested length.
        len: usize,
        /// Limit.
        limit: usize,
    },
    /// A device backend failed (CUDA driver, kernel or shape error).
    #[error("device backend: {0}")]
    Backend(String),
}

/// One sequence on some backend: what the generation loop needs.
pub trait Sequence {
    /// Tokens held.
    fn tokens(&self) -> &[u32];
    /// Maximum length.
    fn max_len(&self) -> usize;
    /// Makes the sequence equal `ids` reusing the longest common prefix; returns the last logits
    /// and the number of reused tokens.
    fn set_prompt(&mut self, ids: &[u32]) -> Result<(Vec<f32>, usize), SessionError>;
    /// Appends one token; returns its logits.
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError>;
    /// Appends one token; returns its logits in the form `need` asks for
    /// ([`Sampler::need`](crate::sampler::Sampler::need)). The default returns the full row; a GPU
    /// sequence selects the top tokens on the device ([`TopLogits`](crate::sampler::TopLogits)).
    fn decode_for(&mut self, id: u32, need: LogitsNeed) -> Result<StepLogits, SessionError> {
        let _ = need;
        Ok(StepLogits::Full(self.decode(id)?))
    }
}

impl Sequence for Session<'_> {
    fn tokens(&self) -> &[u32] {
        Session::tokens(self)
    }
    fn max_len(&self) -> usize {
        self.max_len
    }
    fn set_prompt(&mut self, ids: &[u32]) -> Result<(Vec<f32>, usize), SessionError> {
        Session::set_prompt(self, ids)
    }
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        Session::decode(self, id)
    }
}

/// One sequence as the server's scheduler drives it (continuous batching with a prefix cache):
/// chunked prefill, decode, truncation for prefix reuse, and its memory.
pub trait ServedSequence {
    /// Tokens held.
    fn tokens(&self) -> &[u32];
    /// Most tokens it can hold (the context, or what a device sequence was allocated for).
    fn capacity(&self) -> usize;
    /// Appends `ids` (split into the sequence's prefill chunks); returns the last logits `[vocab]`.
    ///
    /// Errors: out-of-vocabulary ids, exceeding [`ServedSequence::capacity`], backend failures.
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError>;
    /// Appends one token; returns its logits `[vocab]`.
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError>;
    /// Appends one token; returns its logits in the form `need` asks for (as
    /// [`Sequence::decode_for`]; the default returns the full row).
    fn decode_for(&mut self, id: u32, need: LogitsNeed) -> Result<StepLogits, SessionError> {
        let _ = need;
        Ok(StepLogits::Full(ServedSequence::decode(self, id)?))
    }
    /// Rewinds to the first `len` tokens.
    ///
    /// Errors: `len` beyond what the state can rewind to.
    fn truncate(&mut self, len: usize) -> Result<(), SessionError>;
    /// Bytes of state held (for admission and the prefix cache's budget).
    fn state_bytes(&self) -> usize;
    /// Tokens per prefill chunk.
    fn set_prefill_chunk(&mut self, tokens: usize);
}

/// A model loaded on some backend, as the server's scheduler uses it: new sequences, the config.
pub trait Backend: Sync {
    /// Its sequences, borrowing the backend.
    type Seq<'a>: ServedSequence + Send
    where
        Self: 'a;
    /// The model's configuration.
    fn config(&self) -> &flashseek_model::config::Ds4Config;
    /// The longest sequence it can hold (the model's context, or less on a device that allocates
    /// sequences up front); the server refuses longer prompts with this limit.
    fn max_sequence_len(&self) -> usize;
    /// How many tokens [`Backend::new_sequence`] allocates for a request that can grow to `needed`
    /// tokens (≤ [`Backend::max_sequence_len`]): admission reserves that much state.
    fn capacity_for(&self, needed: usize) -> usize;
    /// An empty sequence able to hold at least `needed` tokens (up to [`Backend::max_sequence_len`];
    /// see [`Backend::capacity_for`]).
    ///
    /// Errors: the backend cannot allocate it (device memory).
    fn new_sequence(&self, needed: usize) -> Result<Self::Seq<'_>, SessionError>;
    /// A new sequence holding the first `len` tokens of `src` (a copy of that part of its state;
    /// `src` is left as it is), able to grow to `needed` tokens: how the server's prefix cache
    /// shares one cached prefix among requests. `Ok(None)` when the backend does not copy states
    /// (the default) or the copy would not fit.
    ///
    /// Errors: `len` beyond `src`, allocation or copy failures.
    fn fork_sequence<'a>(&'a self, src: &Self::Seq<'a>, len: usize, needed: usize) -> Result<Option<Self::Seq<'a>>, SessionError> {
        let _ = (src, len, needed);
        Ok(None)
    }
    /// Whether different sequences' decode steps may run on different threads at once (the CPU:
    /// yes; one GPU stream: no).
    fn parallel_decode(&self) -> bool;
    /// Smallest prompt piece a server step should prefill on this backend (unless the prompt's rest
    /// is shorter): pieces at least this long run the same kernels whatever their length, so a
    /// prompt gets the same results whether it is prefilled alone or sharing steps with others.
    /// The CPU reference: 1 (any piece); CUDA: `cuda::model::PREFILL_MIN_TAIL`.
    fn min_prefill_piece(&self) -> usize {
        1
    }
}

/// Tokens to allocate for a sequence that can grow to `needed`: `needed` rounded up to a multiple of
/// `granule` (room for a follow-up turn), at most `max` and at least 1 (a device backend's
/// [`Backend::capacity_for`]).
pub fn granular_capacity(needed: usize, granule: usize, max: usize) -> usize {
    needed.max(1).div_ceil(granule.max(1)).saturating_mul(granule.max(1)).min(max).max(1)
}

/// The CPU reference as a [`Backend`]: [`Session`]s over shared weights (state grows with the
/// sequence, up to the model's context).
pub struct CpuBackend {
    /// The weights.
    pub weights: std::sync::Arc<ModelWeights>,
    /// Forward options (numerics).
    pub forward: ForwardOptions,
}

impl Backend for CpuBackend {
    type Seq<'a> = Session<'a>;
    fn config(&self) -> &flashseek_model::config::Ds4Config {
        &self.weights.config
    }
    fn max_sequence_len(&self) -> usize {
        self.weights.config.max_position_embeddings
    }
    fn capacity_for(&self, needed: usize) -> usize {
        needed
    }
    fn new_sequence(&self, _needed: usize) -> Result<Session<'_>, SessionError> {
        Ok(Session::new(&self.weights, self.forward, None))
    }
    fn fork_sequence<'a>(&'a self, src: &Session<'a>, len: usize, _needed: usize) -> Result<Option<Session<'a>>, SessionError> {
        src.fork(len).map(Some)
    }
    fn parallel_decode(&self) -> bool {
        true
    }
}

impl ServedSequence for Session<'_> {
    fn tokens(&self) -> &[u32] {
        Session::tokens(self)
    }
    fn capacity(&self) -> usize {
        self.max_len
    }
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError> {
        Session::prefill(self, ids)
    }
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        Session::decode(self, id)
    }
    fn truncate(&mut self, len: usize) -> Result<(), SessionError> {
        Session::truncate(self, len)
    }
    fn state_bytes(&self) -> usize {
        self.state.bytes()
    }
    fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens.max(1);
    }
}

/// A sequence: the tokens it holds and their state.
pub struct Session<'w> {
    weights: &'w ModelWeights,
    state: SequenceState,
    tokens: Vec<u32>,
    opts: ForwardOptions,
    /// Tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Maximum sequence length.
    pub max_len: usize,
}

impl<'w> Session<'w> {
    /// An empty sequence. `retention` bounds how far back [`Session::truncate`] can go (None: anywhere).
    pub fn new(weights: &'w ModelWeights, opts: ForwardOptions, retention: Option<usize>) -> Self {
        Session {
            weights,
            state: SequenceState::new(&weights.config, retention),
            tokens: Vec::new(),
            opts,
            prefill_chunk: 512,
            max_len: weights.config.max_position_embeddings,
        }
    }

    /// Tokens processed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The state (for memory accounting).
    pub fn state(&self) -> &SequenceState {
        &self.state
    }

    /// Appends `ids` in chunks of `prefill_chunk`; returns the last position's logits `[vocab]`.
    ///
    /// Errors: empty input, out-of-vocabulary ids, or exceeding `max_len` (state unchanged then).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError> {
        if self.tokens.len() + ids.len() > self.max_len {
            return Err(SessionError::TooLong { len: self.tokens.len() + ids.len(), limit: self.max_len });
        }
        crate::forward::check_ids(ids, self.weights.config.vocab_size)?;
        let mut last = Vec::new();
        let chunks: Vec<&[u32]> = ids.chunks(self.prefill_chunk.max(1)).collect();
        for (i, c) in chunks.iter().enumerate() {
            let lf = if i + 1 == chunks.len() { LogitsFor::Last } else { LogitsFor::None };
            last = forward_chunk(self.weights, &mut self.state, c, lf, &self.opts)?.logits;
            self.tokens.extend_from_slice(c);
        }
        Ok(last)
    }

    /// Appends one token; returns its logits `[vocab]`.
    pub fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        self.prefill(&[id])
    }

    /// Rewinds to the first `len` tokens.
    pub fn truncate(&mut self, len: usize) -> Result<(), SessionError> {
        self.state.truncate(len)?;
        self.tokens.truncate(len);
        Ok(())
    }

    /// A new sequence holding this one's first `len` tokens (a copy of only their state; this one
    /// is unchanged).
    ///
    /// Errors: `len` beyond the tokens held or before the retention limit.
    pub fn fork(&self, len: usize) -> Result<Session<'w>, SessionError> {
        let state = self.state.prefix(len)?;
        Ok(Session { weights: self.weights, state, tokens: self.tokens[..len].to_vec(), opts: self.opts, prefill_chunk: self.prefill_chunk, max_len: self.max_len })
    }

    /// Makes the sequence equal `ids`, reusing the longest common prefix with what it holds (at
    /// least one token is always recomputed, to produce logits). Returns the last logits and how
    /// many tokens were reused.
    pub fn set_prompt(&mut self, ids: &[u32]) -> Result<(Vec<f32>, usize), SessionError> {
        let common = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let reuse = common.min(ids.len().saturating_sub(1));
        if self.truncate(reuse).is_err() {
            self.truncate(0)?;
        }
        let reused = self.tokens.len();
        let logits = self.prefill(&ids[reused..])?;
        Ok((logits, reused))
    }
}

#[cfg(test)]
mod capacity_tests {
    use super::granular_capacity;

    #[test]
    fn capacity_rounds_up_to_the_granule_within_the_limit() {
        assert_eq!(granular_capacity(1, 4096, 8192), 4096);
        assert_eq!(granular_capacity(4096, 4096, 8192), 4096);
        assert_eq!(granular_capacity(4097, 4096, 8192), 8192);
        assert_eq!(granular_capacity(100_000, 4096, 8192), 8192);
        assert_eq!(granular_capacity(0, 4096, 8192), 4096);
        assert_eq!(granular_capacity(5, 0, 3), 3);
        assert_eq!(granular_capacity(usize::MAX, 4096, 10), 10);
    }
}
