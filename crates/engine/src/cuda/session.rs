//! A generation sequence on the GPU ([`Sequence`] for the shared generation loop): the device
//! state of [`GpuSequence`], the token list, chunked prefill and prefix reuse by truncation.

use super::gpu::Gpu;
use super::model::{forward_chunk_gpu, GpuModel, GpuSequence};
use crate::forward::LogitsFor;
use crate::session::{Sequence, SessionError};

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

    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, SessionError> {
        if self.tokens.len() + ids.len() > self.seq.capacity {
            return Err(SessionError::TooLong { len: self.tokens.len() + ids.len(), limit: self.seq.capacity });
        }
        crate::forward::check_ids(ids, self.model.config.vocab_size)?;
        let mut last = Vec::new();
        let chunks = super::model::prefill_chunks(ids, self.prefill_chunk);
        for (i, c) in chunks.iter().enumerate() {
            let lf = if i + 1 == chunks.len() { LogitsFor::Last } else { LogitsFor::None };
            last = forward_chunk_gpu(self.gpu, self.model, &mut self.seq, c, lf, false).map_err(backend)?.logits;
            self.tokens.extend_from_slice(c);
        }
        Ok(last)
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
        self.prefill(&[id])
    }
}
