//! flashseek-server: the HTTP front end (OpenAI- and Anthropic-compatible APIs).
//!
//! Not built yet (issue 4). The crate exists so the dependency direction
//! `cli → server → engine → model` is fixed from the start.

pub use flashseek_engine as engine;
