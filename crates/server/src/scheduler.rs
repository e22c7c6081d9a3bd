//! The engine thread: owns the weights and every sequence's state, and runs continuous batching.
//!
//! Each loop iteration
//! 1. takes in new requests (blocking only when there is nothing to do),
//! 2. drops requests whose client has gone (closed event channel) — waiting or running — and
//!    frees their state at this step boundary,
//! 3. admits waiting requests in arrival order while `max_running` and the state-memory budget
//!    allow (a lone request is always admitted),
//! 4. runs **one prefill chunk**: at most `prefill_chunk` prompt tokens in all, of the oldest
//!    sequences still prefilling, so a long prompt never stalls the running streams for longer
//!    than one chunk (several short prompts can share one chunk's budget),
//! 5. runs **one decode step for every decoding sequence** (in parallel; each step is a
//!    per-sequence forward pass, so a token never depends on what else is batched), sampling with
//!    the sequence's own [`Sampler`] (no shared RNG),
//! 6. retires finished sequences; their sessions go to a small prefix cache, from which a later
//!    prompt reuses the longest common prefix (reported as cached tokens). A cached session that
//!    holds more than the shared prefix (another conversation that began the same way, or the
//!    answer a follow-up turn will need) is copied rather than taken, when the backend can copy
//!    states ([`Backend::fork_sequence`]), so it stays cached for its own continuation.

use crate::metrics::Metrics;
use flashseek_engine::forward::ForwardOptions;
use flashseek_engine::sampler::{Sampler, SamplingParams, StepLogits, StopMatcher};
use flashseek_engine::session::{Backend, ServedSequence};
use flashseek_model::config::{Ds4Config, LayerKind};
use flashseek_model::tokenizer::{Ds4Tokenizer, StreamDecoder};
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Scheduler limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences prefilling or decoding at once.
    pub max_running: usize,
    /// State-memory budget in bytes (running sequences' estimates plus the prefix cache).
    pub state_budget_bytes: usize,
    /// Most requests waiting for admission; beyond it submissions are refused (HTTP 429).
    pub max_queue: usize,
    /// Tokens per prefill chunk (one chunk per loop iteration).
    pub prefill_chunk: usize,
    /// Finished sequences kept for prefix reuse (0 = no prefix cache).
    pub prefix_cache_entries: usize,
    /// Forward-pass options of the CPU backend (the `Arc<ModelWeights>` entry points of the crate
    /// build a [`flashseek_engine::session::CpuBackend`] with them; other backends ignore them).
    pub forward: ForwardOptions,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_running: 16,
            state_budget_bytes: 8 << 30,
            max_queue: 256,
            prefill_chunk: 256,
            prefix_cache_entries: 4,
            forward: ForwardOptions::default(),
        }
    }
}

/// One generation request.
pub struct GenRequest {
    /// Prompt token ids (non-empty, within the context; checked by the caller).
    pub prompt: Vec<u32>,
    /// Sampling parameters: stop tokens, stop strings, seed, logprobs...
    pub params: SamplingParams,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// Leave special tokens (EOS...) out of the text.
    pub skip_special: bool,
    /// Where the events go; dropping the receiver cancels the request.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (for TTFT).
    pub arrived: Instant,
}

/// One generated token.
#[derive(Debug, Clone)]
pub struct TokenOut {
    /// Token id.
    pub id: u32,
    /// Text this token completes (may be empty: an incomplete character, text held back by a
    /// possible stop string, or a skipped special token). Stop strings never appear.
    pub text: String,
    /// Logprob of the token (if requested).
    pub logprob: Option<f32>,
    /// Most likely alternatives (if requested).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (EOS) was sampled.
    Stop,
    /// A stop string matched (the string).
    StopString(String),
    /// `max_tokens` reached.
    Length,
    /// Cancelled by the server (shutdown).
    Cancelled,
}

/// Counts and timings of a finished request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Milliseconds waiting for admission.
    pub queue_ms: f64,
    /// Milliseconds of prefill (admission to first logits).
    pub prefill_ms: f64,
    /// Milliseconds from the first token to the last.
    pub decode_ms: f64,
}

/// What the engine reports about one request.
#[derive(Debug, Clone)]
pub enum Event {
    /// The request was admitted: how many of its prompt tokens the prefix cache already held
    /// (sent once, before any token; a request cancelled while waiting never gets it).
    Started {
        /// Prompt tokens reused from the prefix cache.
        cached: usize,
    },
    /// A token.
    Token(TokenOut),
    /// The end: the text still held back (decoder / stop matcher), the reason and the usage.
    Done {
        /// Held-back text flushed at the end.
        tail: String,
        /// Why it ended.
        reason: FinishReason,
        /// Counts and timings.
        usage: Usage,
    },
    /// The request failed inside the engine.
    Error(String),
}

/// Why a submission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// The waiting queue is full.
    QueueFull,
    /// The server is shutting down (or the engine has stopped).
    ShuttingDown,
}

enum Command {
    Submit(Box<GenRequest>),
    CancelAll,
}

/// State shared between the engine thread and the HTTP side.
struct Shared {
    queued: Mutex<usize>,
    closing: AtomicBool,
    stopped: AtomicBool,
}

/// The HTTP side's handle on the engine thread (cheap to clone).
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    max_queue: usize,
    /// Model facts the handlers need.
    pub info: Arc<ModelInfo>,
}

/// Facts about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Context length (max_position_embeddings).
    pub context: usize,
    /// Vocabulary size of the model.
    pub vocab_size: usize,
    /// Estimated state bytes per token (all layers, no retention limit).
    pub state_bytes_per_token: usize,
}

impl SchedulerHandle {
    /// Queues a request. Fails when the queue is full or the server is closing.
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
        if self.shared.closing.load(Ordering::SeqCst) || self.shared.stopped.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let mut q = self.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
        if *q >= self.max_queue {
            return Err(SubmitError::QueueFull);
        }
        *q += 1;
        if self.tx.send(Command::Submit(Box::new(req))).is_err() {
            *q -= 1;
            return Err(SubmitError::ShuttingDown);
        }
        Ok(())
    }

    /// The engine thread has ended (after a shutdown, or because it panicked).
    pub fn engine_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::SeqCst)
    }

    /// Refuses new requests from now on (in-flight ones continue).
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
    }

    /// Whether new requests are refused.
    pub fn is_closing(&self) -> bool {
        self.shared.closing.load(Ordering::SeqCst) || self.shared.stopped.load(Ordering::SeqCst)
    }

    /// Cancels every waiting and running request (each gets a `Cancelled` finish).
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Requests waiting for admission.
    pub fn queued(&self) -> usize {
        *self.shared.queued.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Estimated state bytes per token of `cfg` (what [`SequenceState::bytes`] grows by per token,
/// on average, without a retention limit).
///
/// [`SequenceState::bytes`]: flashseek_engine::state::SequenceState::bytes
pub fn state_bytes_per_token(cfg: &Ds4Config) -> usize {
    let mut floats = 0.0f64;
    for k in &cfg.layer_kinds {
        floats += cfg.head_dim as f64;
        let comp = |width: usize, ratio: usize, overlap: bool| {
            let out = if overlap { 2 * width } else { width };
            2.0 * out as f64 + width as f64 / ratio as f64
        };
        match *k {
            LayerKind::Sliding => {}
            LayerKind::Hca { ratio } => floats += comp(cfg.head_dim, ratio, false),
            LayerKind::Csa { ratio } => {
                floats += comp(cfg.head_dim, ratio, true) + comp(cfg.index_head_dim, ratio, true)
            }
        }
    }
    (floats * 4.0).ceil() as usize
}

/// Starts the engine thread on `backend` (the CPU reference, or a GPU). It owns the backend until
/// every handle is dropped (or after [`SchedulerHandle::cancel_all`] on close) and then exits; join
/// the returned thread to wait.
pub fn start<B: Backend + Send + 'static>(
    backend: Arc<B>,
    tokenizer: Arc<Ds4Tokenizer>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
) -> (SchedulerHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared { queued: Mutex::new(0), closing: AtomicBool::new(false), stopped: AtomicBool::new(false) });
    let info = Arc::new(ModelInfo {
        context: backend.max_sequence_len(),
        vocab_size: backend.config().vocab_size,
        state_bytes_per_token: state_bytes_per_token(backend.config()),
    });
    metrics.set_budget(cfg.state_budget_bytes);
    let handle = SchedulerHandle { tx, shared: shared.clone(), max_queue: cfg.max_queue, info };
    let thread = std::thread::Builder::new()
        .name("flashseek-engine".into())
        .spawn(move || {
            // Marks the engine stopped even if the loop panics, so submissions fail fast.
            struct Stopped(Arc<Shared>);
            impl Drop for Stopped {
                fn drop(&mut self) {
                    self.0.stopped.store(true, Ordering::SeqCst);
                }
            }
            let _guard = Stopped(shared.clone());
            let mut engine = Engine::new(&*backend, &tokenizer, cfg, metrics, shared);
            engine.run(rx);
        })
        .expect("spawning the engine thread");
    (handle, thread)
}

enum Phase {
    /// Prompt tokens `[0, done)` are in the state.
    Prefill { done: usize },
    /// Logits of the last position, to sample from (the full row, or the top tokens a device
    /// selected for the sampler, [`Sampler::need`]).
    Decode { logits: StepLogits },
    /// Finished: the reason.
    Finished(FinishReason),
}

struct Seq<'t, S> {
    req: GenRequest,
    session: S,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    phase: Phase,
    /// Estimated state bytes reserved.
    reserved: usize,
    cached: usize,
    generated: usize,
    admitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prefill_secs: f64,
    error: Option<String>,
    /// Decoded text so far (kept only when there are stop strings, to name the one that matched).
    text: String,
}

/// Shortest shared prefix (tokens) for which a cached session is copied rather than taken
/// ([`Backend::fork_sequence`]): below it, recomputing the few tokens costs less than the copy.
pub const MIN_FORK_TOKENS: usize = 16;

struct Cached<S> {
    session: S,
    last_used: u64,
}

struct Engine<'w, 't, B: Backend> {
    backend: &'w B,
    tokenizer: &'t Ds4Tokenizer,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    bytes_per_token: usize,
    waiting: VecDeque<GenRequest>,
    running: Vec<Seq<'t, B::Seq<'w>>>,
    cache: Vec<Cached<B::Seq<'w>>>,
    clock: u64,
    disconnected: bool,
}

impl<'w, 't, B: Backend> Engine<'w, 't, B> {
    fn new(
        backend: &'w B,
        tokenizer: &'t Ds4Tokenizer,
        cfg: SchedulerConfig,
        metrics: Arc<Metrics>,
        shared: Arc<Shared>,
    ) -> Self {
        Engine {
            backend,
            tokenizer,
            bytes_per_token: state_bytes_per_token(backend.config()),
            cfg,
            metrics,
            shared,
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache: Vec::new(),
            clock: 0,
            disconnected: false,
        }
    }

    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish();
                if self.disconnected || self.shared.closing.load(Ordering::SeqCst) {
                    break;
                }
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.disconnected = true;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            self.prefill_chunk();
            self.decode_all();
            self.retire();
            self.publish();
        }
        // Nothing can reach us any more: whatever is left is cancelled.
        self.cancel_everything();
        self.retire();
        self.cache.clear();
        self.publish();
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req) => self.waiting.push_back(*req),
            Command::CancelAll => self.cancel_everything(),
        }
    }

    fn dequeued(&self, n: usize) {
        if n > 0 {
            let mut q = self.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
            *q = q.saturating_sub(n);
        }
    }

    fn cancel_everything(&mut self) {
        let n = self.waiting.len();
        for req in self.waiting.drain(..) {
            let usage = Usage { prompt_tokens: req.prompt.len(), ..Usage::default() };
            let _ = req.events.send(Event::Done { tail: String::new(), reason: FinishReason::Cancelled, usage });
        }
        self.dequeued(n);
        for s in &mut self.running {
            if !matches!(s.phase, Phase::Finished(_)) {
                s.phase = Phase::Finished(FinishReason::Cancelled);
            }
        }
    }

    /// Drops requests whose receiver is gone (client disconnected).
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.events.is_closed());
        let gone = before - self.waiting.len();
        self.dequeued(gone);
        self.metrics.cancelled(gone);
        for s in &mut self.running {
            if s.req.events.is_closed() && !matches!(s.phase, Phase::Finished(_)) {
                // Counted in `retire`, with every other way a running request ends cancelled.
                s.phase = Phase::Finished(FinishReason::Cancelled);
            }
        }
    }

    /// Tokens a request can grow to: its prompt plus what it may generate, within what the
    /// backend can hold.
    fn needed(&self, req: &GenRequest) -> usize {
        (req.prompt.len() + req.max_tokens).min(self.backend.max_sequence_len())
    }

    /// State bytes reserved for a request: what the backend allocates for it.
    fn estimate(&self, req: &GenRequest) -> usize {
        self.backend.capacity_for(self.needed(req)) * self.bytes_per_token
    }

    fn reserved(&self) -> usize {
        self.running.iter().map(|s| s.reserved.max(s.session.state_bytes())).sum()
    }

    fn cache_bytes(&self) -> usize {
        self.cache.iter().map(|c| c.session.state_bytes()).sum()
    }

    fn admit(&mut self) {
        while let Some(front) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_running.max(1) {
                break;
            }
            let est = self.estimate(front);
            let budget = self.cfg.state_budget_bytes;
            let reserved = self.reserved();
            // Make room by evicting cached sessions, least recently used first, the one this
            // prompt would reuse last.
            let keep = self.best_cached(&front.prompt, self.needed(front)).map(|(i, _)| self.cache[i].last_used);
            while reserved + self.cache_bytes() + est > budget && !self.cache.is_empty() {
                let victim = (0..self.cache.len())
                    .min_by_key(|&i| (Some(self.cache[i].last_used) == keep, self.cache[i].last_used))
                    .unwrap_or(0);
                self.cache.swap_remove(victim);
            }
            if !self.running.is_empty() && reserved + self.cache_bytes() + est > budget {
                break;
            }
            let Some(req) = self.waiting.pop_front() else { break };
            self.dequeued(1);
            self.start_seq(req, est);
        }
    }

    /// Drops the least recently used cached session (none when the cache is empty).
    fn evict_lru(&mut self) {
        if let Some(oldest) = (0..self.cache.len()).min_by_key(|&j| self.cache[j].last_used) {
            self.cache.swap_remove(oldest);
        }
    }

    /// The cached session sharing the longest prefix with `prompt` and able to hold `needed`
    /// tokens (index, common length).
    fn best_cached(&self, prompt: &[u32], needed: usize) -> Option<(usize, usize)> {
        self.cache
            .iter()
            .enumerate()
            .filter(|(_, c)| c.session.capacity() >= needed)
            .map(|(i, c)| (i, c.session.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count()))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.cache[i].last_used))
    }

    fn start_seq(&mut self, req: GenRequest, est: usize) {
        let now = Instant::now();
        let needed = self.needed(&req);
        let mut session = match self.best_cached(&req.prompt, needed) {
            Some((i, common)) => {
                // A cached session holding more than this prompt reuses would lose the rest if
                // taken and truncated: copy the shared prefix when it is worth it (and the backend
                // copies states); when it is short and most of the cached session is not shared
                // (an unrelated chat with the same template tokens), start a fresh sequence; take
                // the cached session otherwise, or when neither works.
                let reuse = common.min(req.prompt.len().saturating_sub(1));
                let held = self.cache[i].session.tokens().len();
                // (the new sequence, whether it copied the cached one's prefix)
                let spared = if held <= reuse {
                    None
                } else if reuse >= MIN_FORK_TOKENS {
                    match self.backend.fork_sequence(&self.cache[i].session, reuse, needed) {
                        Ok(s) => s.map(|s| (s, true)),
                        Err(e) => {
                            eprintln!("flashseek: warning: copying a cached prefix failed ({e}); the cached session is taken instead");
                            None
                        }
                    }
                } else if 2 * reuse < held {
                    self.backend.new_sequence(needed).ok().map(|s| (s, false))
                } else {
                    None
                };
                match spared {
                    Some((s, forked)) => {
                        // A copy used the cached session; a fresh sequence beside it did not.
                        if forked {
                            self.clock += 1;
                            self.cache[i].last_used = self.clock;
                        }
                        s
                    }
                    None => self.cache.swap_remove(i).session,
                }
            }
            None => loop {
                match self.backend.new_sequence(needed) {
                    Ok(s) => break s,
                    // No room on the device: free cached sequences, least recently used first.
                    Err(_) if !self.cache.is_empty() => {
                        self.evict_lru();
                    }
                    Err(e) => {
                        // Nothing left to free (or another backend failure): this request fails,
                        // the server keeps serving.
                        let _ = req.events.send(Event::Error(format!("could not start the sequence: {e}")));
                        return;
                    }
                }
            },
        };
        session.set_prefill_chunk(self.cfg.prefill_chunk.max(1));
        // As in `Session::set_prompt`: keep the common prefix, but recompute at least one token.
        let common = session.tokens().iter().zip(&req.prompt).take_while(|(a, b)| a == b).count();
        let reuse = common.min(req.prompt.len().saturating_sub(1));
        if session.truncate(reuse).is_err() {
            let _ = session.truncate(0);
        }
        let cached = session.tokens().len();
        let _ = req.events.send(Event::Started { cached });
        let sampler = Sampler::new(req.params.clone(), &req.prompt);
        let stops = StopMatcher::new(&req.params.stop_strings);
        let decoder = StreamDecoder::new(self.tokenizer, req.skip_special);
        let (sampler, error) = match sampler {
            Ok(s) => (s, None),
            Err(e) => (
                Sampler::new(SamplingParams::greedy(), &[]).expect("greedy parameters are valid"),
                Some(e.to_string()),
            ),
        };
        self.metrics.queue_wait(now.duration_since(req.arrived).as_secs_f64());
        let mut seq = Seq {
            req,
            session,
            sampler,
            decoder,
            stops,
            phase: Phase::Prefill { done: cached },
            reserved: est,
            cached,
            generated: 0,
            admitted: now,
            first_token: None,
            last_token: None,
            prefill_secs: 0.0,
            error: None,
            text: String::new(),
        };
        if let Some(e) = error {
            seq.error = Some(e);
            seq.phase = Phase::Finished(FinishReason::Cancelled);
        }
        self.running.push(seq);
    }

    /// Prefills at most `prefill_chunk` prompt tokens in all, oldest sequences first (a short
    /// prompt takes what it needs and the next one gets the rest of the budget), in pieces of at
    /// least the backend's `min_prefill_piece` tokens ([`piece_end`]).
    fn prefill_chunk(&mut self) {
        let full = self.cfg.prefill_chunk.max(1);
        let mut budget = full;
        for s in self.running.iter_mut() {
            if budget == 0 {
                break;
            }
            let Phase::Prefill { done } = s.phase else { continue };
            let Some(end) = piece_end(done, s.req.prompt.len(), budget, budget == full, self.backend.min_prefill_piece()) else { continue };
            budget = budget.saturating_sub(end - done);
            let t = Instant::now();
            let r = s.session.prefill(&s.req.prompt[done..end]);
            self.metrics.prefill(end - done, t.elapsed().as_secs_f64());
            match r {
                Ok(logits) if end == s.req.prompt.len() => {
                    s.prefill_secs = s.admitted.elapsed().as_secs_f64();
                    s.phase = Phase::Decode { logits: StepLogits::Full(logits) };
                }
                Ok(_) => s.phase = Phase::Prefill { done: end },
                Err(e) => {
                    s.error = Some(e.to_string());
                    s.phase = Phase::Finished(FinishReason::Cancelled);
                }
            }
        }
    }

    fn decode_all(&mut self) {
        let t = Instant::now();
        let metrics = &self.metrics;
        let decoding = |s: &&mut Seq<'t, B::Seq<'w>>| matches!(s.phase, Phase::Decode { .. });
        let step = |s: &mut Seq<'t, B::Seq<'w>>| {
            s.step(metrics);
            1
        };
        let steps: usize = if self.backend.parallel_decode() {
            self.running.par_iter_mut().filter(decoding).map(step).sum()
        } else {
            self.running.iter_mut().filter(decoding).map(step).sum()
        };
        if steps > 0 {
            self.metrics.decode(steps, t.elapsed().as_secs_f64());
        }
    }

    fn retire(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if !matches!(self.running[i].phase, Phase::Finished(_)) {
                i += 1;
                continue;
            }
            let mut s = self.running.swap_remove(i);
            let Phase::Finished(reason) = std::mem::replace(&mut s.phase, Phase::Prefill { done: 0 }) else {
                unreachable!("filtered above")
            };
            // A running request ends cancelled when its client went away, whichever step noticed
            // it first (the disconnect check, or a failed token send).
            if reason == FinishReason::Cancelled && s.error.is_none() && s.req.events.is_closed() {
                self.metrics.cancelled(1);
            }
            let usage = Usage {
                prompt_tokens: s.req.prompt.len(),
                cached_tokens: s.cached,
                completion_tokens: s.generated,
                queue_ms: s.admitted.duration_since(s.req.arrived).as_secs_f64() * 1e3,
                prefill_ms: s.prefill_secs * 1e3,
                decode_ms: match (s.first_token, s.last_token) {
                    (Some(a), Some(b)) => b.duration_since(a).as_secs_f64() * 1e3,
                    _ => 0.0,
                },
            };
            match s.error.take() {
                Some(e) => {
                    let _ = s.req.events.send(Event::Error(e));
                }
                None => {
                    let mut tail = String::new();
                    if !s.stops.is_stopped() {
                        let (t, _) = s.stops.push(&s.decoder.finish());
                        tail = t + &s.stops.finish();
                    }
                    self.metrics.finished(&usage);
                    let _ = s.req.events.send(Event::Done { tail, reason, usage });
                }
            }
            // Keep the session for prefix reuse.
            if self.cfg.prefix_cache_entries > 0 && !s.session.tokens().is_empty() {
                self.clock += 1;
                self.cache.push(Cached { session: s.session, last_used: self.clock });
                while self.cache.len() > self.cfg.prefix_cache_entries {
                    self.evict_lru();
                }
                while self.cache_bytes() + self.reserved() > self.cfg.state_budget_bytes && !self.cache.is_empty() {
                    self.evict_lru();
                }
            }
        }
    }

    fn publish(&self) {
        let running_bytes: usize = self.running.iter().map(|s| s.session.state_bytes()).sum();
        self.metrics.set_engine_gauges(
            self.running.len(),
            *self.shared.queued.lock().unwrap_or_else(|e| e.into_inner()),
            running_bytes,
            self.cache_bytes(),
            self.reserved(),
        );
    }
}

impl<S: ServedSequence> Seq<'_, S> {
    /// Samples one token from the current logits, reports it, and either finishes or decodes it.
    fn step(&mut self, metrics: &Metrics) {
        let Phase::Decode { logits } = &self.phase else { return };
        let sampled = match self.sampler.sample_step(logits) {
            Ok(s) => s,
            Err(e) => {
                self.error = Some(e.to_string());
                self.phase = Phase::Finished(FinishReason::Cancelled);
                return;
            }
        };
        self.generated += 1;
        let now = Instant::now();
        match self.last_token {
            None => {
                self.first_token = Some(now);
                metrics.ttft(now.duration_since(self.req.arrived).as_secs_f64());
            }
            Some(prev) => metrics.itl(now.duration_since(prev).as_secs_f64()),
        }
        self.last_token = Some(now);
        let piece = match self.decoder.push(sampled.token) {
            Ok(p) => p,
            Err(e) => {
                self.error = Some(e.to_string());
                self.phase = Phase::Finished(FinishReason::Cancelled);
                return;
            }
        };
        if !self.req.params.stop_strings.is_empty() {
            self.text.push_str(&piece);
        }
        let (text, stopped) = self.stops.push(&piece);
        let out = TokenOut { id: sampled.token, text, logprob: sampled.logprob, top_logprobs: sampled.top_logprobs };
        if self.req.events.send(Event::Token(out)).is_err() {
            self.phase = Phase::Finished(FinishReason::Cancelled);
            return;
        }
        if stopped {
            let matched = self.stops_matched();
            self.phase = Phase::Finished(FinishReason::StopString(matched));
            return;
        }
        if self.sampler.is_stop_token(sampled.token) {
            self.phase = Phase::Finished(FinishReason::Stop);
            return;
        }
        if self.generated >= self.req.max_tokens {
            self.phase = Phase::Finished(FinishReason::Length);
            return;
        }
        match self.session.decode_for(sampled.token, self.sampler.need()) {
            Ok(l) => self.phase = Phase::Decode { logits: l },
            Err(e) => {
                // The context is full: the request ends as if it had reached its length.
                if matches!(e, flashseek_engine::session::SessionError::TooLong { .. }) {
                    self.phase = Phase::Finished(FinishReason::Length);
                } else {
                    self.error = Some(e.to_string());
                    self.phase = Phase::Finished(FinishReason::Cancelled);
                }
            }
        }
    }

    /// Which stop string matched: the one completed first in the text, the earliest-starting one
    /// on a tie (the [`StopMatcher`] rule).
    fn stops_matched(&self) -> String {
        let text = &self.text;
        self.req
            .params
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()).map(|p| (p + s.len(), p, s)))
            .min()
            .map(|(_, _, s)| s.clone())
            .unwrap_or_default()
    }
}

/// End of the piece of a prompt of `len` tokens, `done` of them prefilled, that a step with
/// `budget` tokens left prefills: as much as the budget allows, but a rest of the prompt under
/// `min_piece` joins the piece (the step overruns its budget by less than `min_piece`), and a piece
/// under `min_piece` that leaves more of the prompt waits (`None`) unless the sequence has the
/// whole step's budget (`first`: progress is guaranteed whatever the settings). Overflow-safe for
/// any budget.
pub fn piece_end(done: usize, len: usize, budget: usize, first: bool, min_piece: usize) -> Option<usize> {
    let mut end = done.saturating_add(budget).min(len);
    if len - end < min_piece {
        end = len;
    } else if end - done < min_piece && !first {
        return None;
    }
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::piece_end;

    /// Pieces follow the budget, a short rest joins the piece before it, a small share of a step
    /// waits unless it is the step's first, and no budget overflows.
    #[test]
    fn prefill_pieces_keep_the_minimum_and_never_overflow() {
        assert_eq!(piece_end(6, 10, usize::MAX, true, 1), Some(10), "a huge budget after a cached prefix");
        assert_eq!(piece_end(6, 10, usize::MAX, false, 256), Some(10));
        assert_eq!(piece_end(0, 20_000, 8192, true, 256), Some(8192));
        assert_eq!(piece_end(16_384, 20_000, 8192, true, 256), Some(20_000));
        assert_eq!(piece_end(0, 8300, 8192, true, 256), Some(8300), "a 108-token rest joins the piece");
        assert_eq!(piece_end(4900, 5000, 50, false, 256), Some(5000), "the rest joins even past the budget");
        assert_eq!(piece_end(0, 5000, 100, false, 256), None, "a 100-token share waits for the next step");
        assert_eq!(piece_end(0, 5000, 100, true, 256), Some(100), "the step's first sequence always progresses");
        assert_eq!(piece_end(0, 5000, 100, false, 1), Some(100), "the CPU takes any piece");
        assert_eq!(piece_end(0, 200, 8192, false, 256), Some(200), "a short prompt is one piece");
    }
}
