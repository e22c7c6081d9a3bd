//! flashseek-engine: how a DeepSeek-V4 model runs.
//!
//! - [`weights`]: every tensor of the model dequantized to f32 and shape-checked against the config.
//! - [`cpu`]: exact primitives (f64 accumulation, fixed reduction order).
//! - [`cuda`]: the CUDA backend (NVRTC-compiled kernels; first ops with parity checks).
//! - [`default_model`]: the small random-weight model flashseek runs when no `--model` is given.
//! - [`forward`]: the exact reference forward pass, one module per spec section, with the official
//!   numerics switches (spec §10).
//! - [`state`]: per-sequence incremental state (spec §5): chunked prefill, decode, truncate, snapshot.
//! - [`generate`]: the sample/decode loop with stop handling and timings.
//! - [`sampler`]: token sampling (greedy, temperature, top-k/p, min-p, penalties, seed, logprobs), stop strings.
//! - [`session`]: one sequence: prefill in chunks, decode, prefix reuse.
//! - [`switches`]: the registry of killable optimisations (`FLASHSEEK_<NAME>`, `--switch`).
//! - [`testing`]: the deterministic weight generator shared with `scripts/make_goldens.py`.

pub mod cpu;
pub mod cuda;
pub mod default_model;
pub mod forward;
pub mod generate;
pub mod sampler;
pub mod session;
pub mod state;
pub mod switches;
pub mod testing;
pub mod weights;
