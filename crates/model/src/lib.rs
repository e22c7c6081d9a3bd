//! flashseek-model: what a DeepSeek-V4 model *is*.
//!
//! - [`config`]: `config.json` in the current Hugging Face schema and the legacy/official schema,
//!   validated once into [`config::Ds4Config`] (spec §1).
//! - [`quant`]: exact CPU codecs for every stored weight format (spec §6) and the official numerics
//!   simulations (spec §10).
//! - [`checkpoint`]: memory-mapped safetensors (single file or sharded), three naming schemes mapped to
//!   one canonical tensor table (spec §2).
//!
//! No compute beyond exact decoders lives here.

#![recursion_limit = "256"]

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod quant;
pub mod tokenizer;

/// "an object", "an array", "a string", … (or "null"): a JSON value's kind for error messages
/// (checkpoint headers here, API requests in the server).
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
