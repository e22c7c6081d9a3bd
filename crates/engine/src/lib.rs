//! flashseek-engine: how a DeepSeek-V4 model runs.
//!
//! - [`weights`]: every tensor of the model dequantized to f32 and shape-checked against the config.
//! - [`cpu`]: exact primitives (f64 accumulation, fixed reduction order).
//! - [`forward`]: the exact reference forward pass, one module per spec section, with the official
//!   numerics switches (spec §10).
//! - [`testing`]: the deterministic weight generator shared with `scripts/make_goldens.py`.

pub mod cpu;
pub mod forward;
pub mod testing;
pub mod weights;
