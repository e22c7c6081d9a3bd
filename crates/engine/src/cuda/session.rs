//! A generation sequence on the GPU ([`Sequence`] for the shared generation loop): the device
//! state of [`GpuSequence`], the token list, chunked prefill and prefix reuse by truncation.

use super::gpu::Gpu;
use super::model::{decode_step_gpu, decode_step_gpu_dev, forward_chunk_gpu, GpuModel, GpuSequence};
use crate::sampler::{LogitsNeed, StepLogits};
use crate::forward::LogitsFor;
use crate::session::{Backend, Sequence, ServedSequence, SessionError};

/// One sequence on one GPU, holding at most `capacity` tokens.
pub struct GpuSession<'a> {
    gpu: &'a Gpu,
    model: &'a GpuModel,
    seq: GpuSequence,
    tokens: Vec<u32>,
    /// Tokens per prefill chunk.
    pub prefill_chunk: usize,
}

fn backend(e: super::CudaError) -> SessionError {
    SessionError::Backend(e.to_string())
}

impl<'a> GpuSession<'a> {
    /// An empty sequence with room for `capacity` tokens (device state is allocated up front).
    pub fn new(gpu: &'a Gpu, model: &'a GpuModel, capacity: usize) -> Result<Self, SessionError> {
        let seq = GpuSequence::new(gpu, model, capacity).map_err(backend)?;
        Ok(GpuSession { gpu, model, seq, tokens: Vec::new(), prefill_chunk: crate::switches::prefill_chunk_tokens() })
    }

    /// Appends `ids` in prefill chunks; returns the last position's logits `[vocab]`.
    ///
    /// Errors: exceeding the capacity ([`SessionError::TooLong`]), out-of-vocabulary ids, device
    /// errors.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError> {
        self.check_append(ids)?;
        let mut last = Vec::new();
        let chunks = super::model::prefill_chunks(ids, self.prefill_chunk);
        for (i, c) in chunks.iter().enumerate() {
            let lf = if i + 1 == chunks.len() { LogitsFor::Last } else { LogitsFor::None };
            last = forward_chunk_gpu(self.gpu, self.model, &mut self.seq, c, lf, false).map_err(backend)?.logits;
            self.tokens.extend_from_slice(c);
        }
        Ok(last)
    }

    /// Appends one token (a decode step, [`decode_step_gpu`]: a CUDA graph with
    /// `DECODE_CUDA_GRAPH`); returns its logits `[vocab]`.
    ///
    /// Errors: as [`GpuSession::prefill`].
    pub fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        self.check_append(&[id])?;
        let logits = decode_step_gpu(self.gpu, self.model, &mut self.seq, id).map_err(backend)?;
        self.tokens.push(id);
        Ok(logits)
    }

    /// Whether `ids` may be appended: within the capacity and the vocabulary.
    fn check_append(&self, ids: &[u32]) -> Result<(), SessionError> {
        if self.tokens.len() + ids.len() > self.seq.capacity {
            return Err(SessionError::TooLong { len: self.tokens.len() + ids.len(), limit: self.seq.capacity });
        }
        crate::forward::check_ids(ids, self.model.config.vocab_size)?;
        Ok(())
    }
}

impl Drop for GpuSession<'_> {
    /// Hands a decode step captured ahead back to the device's kept graphs.
    fn drop(&mut self) {
        self.seq.discard_pending(self.gpu);
    }
}

/// A saved point of a [`GpuSession`]: a device copy of its state and its token list
/// ([`GpuSession::snapshot`]).
pub struct GpuSessionSnapshot {
    seq: GpuSequence,
    tokens: Vec<u32>,
}

impl GpuSessionSnapshot {
    /// The tokens the snapshot holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    /// Device bytes it holds.
    pub fn bytes(&self) -> usize {
        self.seq.bytes()
    }
}

impl GpuSession<'_> {
    /// Appends one token and returns its logits as `need` asks: the full row, or the top tokens
    /// selected on the device ([`Gpu::logits_top`](super::gpu::Gpu)), so only `2 + 2k` values cross
    /// to the host instead of the vocabulary. `SAMPLE_ON_DEVICE=off` always returns the full row.
    ///
    /// Errors: as [`GpuSession::prefill`].
    pub fn decode_for(&mut self, id: u32, need: LogitsNeed) -> Result<StepLogits, SessionError> {
        let k = match need {
            LogitsNeed::Top(k) if crate::switches::on("SAMPLE_ON_DEVICE") => k,
            _ => return Ok(StepLogits::Full(self.decode(id)?)),
        };
        self.check_append(&[id])?;
        let lg = decode_step_gpu_dev(self.gpu, self.model, &mut self.seq, id).map_err(backend)?;
        self.tokens.push(id);
        let mut top = self.gpu.logits_top(&lg, 1, self.model.config.vocab_size, k).map_err(backend)?;
        Ok(StepLogits::Top(top.remove(0)))
    }

    /// Saves the current state on the device (a copy of the rows and entries in use).
    ///
    /// Errors: device allocation or copy failures.
    pub fn snapshot(&self) -> Result<GpuSessionSnapshot, SessionError> {
        Ok(GpuSessionSnapshot { seq: self.seq.snapshot(self.gpu, self.model).map_err(backend)?, tokens: self.tokens.clone() })
    }

    /// Returns to `snap` (taken from a session of the same model), whatever ran since.
    ///
    /// Errors: a snapshot longer than this session's capacity ([`SessionError::TooLong`]), device
    /// copy failures.
    pub fn restore(&mut self, snap: &GpuSessionSnapshot) -> Result<(), SessionError> {
        if snap.tokens.len() > self.seq.capacity {
            return Err(SessionError::TooLong { len: snap.tokens.len(), limit: self.seq.capacity });
        }
        self.seq.restore(self.gpu, self.model, &snap.seq).map_err(backend)?;
        self.tokens.clone_from(&snap.tokens);
        Ok(())
    }
}

impl Sequence for GpuSession<'_> {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    fn max_len(&self) -> usize {
        self.seq.capacity.min(self.model.config.max_position_embeddings)
    }
    fn set_prompt(&mut self, ids: &[u32]) -> Result<(Vec<f32>, usize), SessionError> {
        let common = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let reuse = common.min(ids.len().saturating_sub(1));
        self.seq.truncate(self.model, reuse).map_err(backend)?;
        self.tokens.truncate(reuse);
        let logits = self.prefill(&ids[reuse..])?;
        Ok((logits, reuse))
    }
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        GpuSession::decode(self, id)
    }
    fn decode_for(&mut self, id: u32, need: LogitsNeed) -> Result<StepLogits, SessionError> {
        GpuSession::decode_for(self, id, need)
    }
}

impl ServedSequence for GpuSession<'_> {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    fn capacity(&self) -> usize {
        self.seq.capacity
    }
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError> {
        GpuSession::prefill(self, ids)
    }
    fn decode(&mut self, id: u32) -> Result<Vec<f32>, SessionError> {
        GpuSession::decode(self, id)
    }
    fn decode_for(&mut self, id: u32, need: LogitsNeed) -> Result<StepLogits, SessionError> {
        GpuSession::decode_for(self, id, need)
    }
    fn truncate(&mut self, len: usize) -> Result<(), SessionError> {
        self.seq.truncate(self.model, len).map_err(backend)?;
        self.tokens.truncate(len);
        Ok(())
    }
    fn state_bytes(&self) -> usize {
        self.seq.bytes()
    }
    fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens.max(1);
    }
}

/// One GPU and a model on it as a server [`Backend`] (`flashseek serve --device cuda`): each
/// sequence allocates its device state up front, for its request's length rounded up to
/// [`GPU_SEQUENCE_GRANULE`] tokens (room for a follow-up turn to reuse it from the prefix cache)
/// and at most `max_capacity`; decode steps run one sequence after another on the GPU's stream.
pub struct GpuBackend {
    /// The device.
    pub gpu: Gpu,
    /// The model on it.
    pub model: GpuModel,
    /// Most tokens one sequence is allocated for (`--gpu-context`): the server's context limit.
    pub max_capacity: usize,
}

/// GPU sequences are allocated in multiples of this many tokens.
pub const GPU_SEQUENCE_GRANULE: usize = 4096;

impl Backend for GpuBackend {
    type Seq<'a> = GpuSession<'a>;
    fn config(&self) -> &flashseek_model::config::Ds4Config {
        &self.model.config
    }
    fn max_sequence_len(&self) -> usize {
        self.max_capacity.clamp(1, self.model.config.max_position_embeddings)
    }
    fn capacity_for(&self, needed: usize) -> usize {
        crate::session::granular_capacity(needed, GPU_SEQUENCE_GRANULE, self.max_sequence_len())
    }
    fn new_sequence(&self, needed: usize) -> Result<GpuSession<'_>, SessionError> {
        GpuSession::new(&self.gpu, &self.model, self.capacity_for(needed))
    }
    fn fork_sequence<'a>(&'a self, src: &GpuSession<'a>, len: usize, needed: usize) -> Result<Option<GpuSession<'a>>, SessionError> {
        if len > src.tokens.len() {
            return Err(SessionError::TooLong { len, limit: src.tokens.len() });
        }
        // The whole source state is copied (GpuSequence::restore, as a snapshot restores), then
        // truncated: both operations gpu-check verifies. That needs room for all of the source;
        // a fork larger than what admission reserved for the request (`capacity_for(needed)`) is
        // declined and the caller takes the cached session instead.
        let capacity = self.capacity_for(needed.max(len));
        if src.tokens.len() > capacity {
            return Ok(None);
        }
        let mut s = GpuSession::new(&self.gpu, &self.model, capacity)?;
        s.seq.restore(&self.gpu, &self.model, &src.seq).map_err(backend)?;
        s.seq.truncate(&self.model, len).map_err(backend)?;
        s.tokens = src.tokens[..len].to_vec();
        s.prefill_chunk = src.prefill_chunk;
        Ok(Some(s))
    }
    fn parallel_decode(&self) -> bool {
        false
    }
    fn min_prefill_piece(&self) -> usize {
        // Shorter pieces run their linears on other kernels (other bits).
        super::model::PREFILL_MIN_TAIL
    }
}
