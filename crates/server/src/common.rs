//! What the OpenAI and Anthropic front ends share: reading and checking requests, rendering the
//! prompt, sampling parameters, submission to the scheduler.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::{Event, GenRequest, SchedulerHandle, SubmitError};
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use flashseek_engine::sampler::{ForcedTokens, ReasoningBudget, SamplingParams, MAX_LOGPROBS};
use flashseek_model::chat::{encode_messages, EncodeOptions, ReasoningEffort, ThinkingMode, DSML, THINK_END};
use flashseek_model::tokenizer::Ds4Tokenizer;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use futures_util::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// HTTP-side settings.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Names the model answers to; the first is reported.
    pub model_names: Vec<String>,
    /// Required API key (Bearer or x-api-key), if any.
    pub api_key: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// SSE keep-alive comment interval.
    pub keepalive: Duration,
}

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    /// The engine.
    pub sched: SchedulerHandle,
    /// The tokenizer.
    pub tokenizer: Arc<Ds4Tokenizer>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub http: Arc<HttpSettings>,
    /// Unix time the server started (model `created`).
    pub created: u64,
}

impl AppState {
    /// The reported model name.
    pub fn model_name(&self) -> &str {
        self.http.model_names.first().map(String::as_str).unwrap_or("flashseek-default")
    }

    /// Checks a requested model name (absent = the served model).
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None => Ok(()),
            Some(m) if self.http.model_names.iter().any(|n| n == m) => Ok(()),
            Some(m) => Err(ApiError::status(
                StatusCode::NOT_FOUND,
                format!("The model `{m}` does not exist; this server serves `{}`.", self.model_name()),
            )
            .with_code("model_not_found")
            .field_of("model")),
        }
    }
}

impl ApiError {
    /// Sets `param`.
    pub fn field_of(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }
}

/// Reads the body (at most `limit` bytes) and parses it as `T`, with errors naming the field.
pub async fn read_json<T: DeserializeOwned>(headers: &HeaderMap, body: Body, limit: usize) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::status(StatusCode::PAYLOAD_TOO_LARGE, format!("Request body is larger than the limit of {limit} bytes."))
            .with_code("request_too_large")
    };
    let declared = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    // An oversize body is still read (up to a bound, briefly) before answering, so the client
    // sees the 413 rather than a connection reset while it is still sending.
    const DRAIN_MAX: usize = 64 << 20;
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut over = declared.is_some_and(|len| len > limit as u64);
    let mut seen = 0usize;
    let read = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::bad(None, format!("Could not read the request body: {e}")))?;
            seen += chunk.len();
            if !over && bytes.len() + chunk.len() > limit {
                over = true;
                bytes = Vec::new();
            }
            if over {
                if seen > DRAIN_MAX {
                    break;
                }
            } else {
                bytes.extend_from_slice(&chunk);
            }
        }
        Ok::<(), ApiError>(())
    };
    match tokio::time::timeout(Duration::from_secs(30), read).await {
        Ok(r) => r?,
        Err(_) if over => {}
        Err(_) => return Err(ApiError::status(StatusCode::REQUEST_TIMEOUT, "Timed out reading the request body.")),
    }
    if over {
        return Err(too_large());
    }
    parse_json(&bytes)
}

/// Parses a JSON body as `T` (errors: invalid UTF-8, malformed JSON, wrong field types).
/// `#[serde(deserialize_with = …)]` for an optional nested object such as `stream_options`: serde
/// would also read a struct from an array of its fields in order (`"stream_options": [true]`), which
/// an API request must not do. `null` or absent is `None`; anything but an object is refused with
/// what it was.
pub fn object_or_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    use serde::de::Error;
    use serde::Deserialize;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => T::deserialize(v).map(Some).map_err(D::Error::custom),
        Some(v) => Err(D::Error::custom(format!("expected an object, got {}", json_kind(&v)))),
    }
}

pub use flashseek_model::json_kind;

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // A UTF-8 byte-order mark may precede JSON text, and parsers may ignore it (RFC 8259 §8.1).
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(ApiError::bad(None, format!("The request body is not valid UTF-8 ({e}).")));
    }
    // serde decodes a struct from an array of its fields in order too; an API request is an object.
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(ApiError::bad(None, "The request body is empty; expected a JSON object.")),
        Some(b'{') => {}
        Some(_) => {
            return Err(ApiError::bad(
                None,
                match serde_json::from_slice::<serde_json::Value>(bytes) {
                    Ok(v) => format!("The request body must be a JSON object ({{...}}), not {}.", json_kind(&v)),
                    Err(e) => format!("Malformed JSON in the request body: {e}."),
                },
            ))
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut *de) {
        // One object and nothing after it but whitespace.
        Ok(v) => match de.end() {
            Ok(()) => Ok(v),
            Err(e) => Err(ApiError::bad(None, format!("Malformed JSON in the request body: text after the JSON object ({e})."))),
        },
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let text = integer_out_of_range(&inner.to_string()).unwrap_or_else(|| json_terms(&inner.to_string()));
            if inner.is_data() && path != "." {
                Err(ApiError::field(&path, format!("Invalid value for `{path}`: {text}")))
            } else if inner.is_data() {
                Err(ApiError::bad(None, format!("Invalid request: {text}")))
            } else {
                Err(ApiError::bad(None, format!("Malformed JSON in the request body: {text}")))
            }
        }
    }
}

/// An integer field given a whole number beyond its type's range, which serde reports in Rust's
/// terms: a literal beyond 64 bits is parsed by serde_json as a float (``invalid type: floating
/// point `100000000000000000000.0`, expected i64``), one between 2^63 and 2^64 as a `u64` (``invalid
/// value: integer `9223372036854775808`, expected i64``). This says the number is out of range and
/// what the field takes instead: with the number when serde kept it exactly (the integer band), and
/// without it when serde holds only a float's rounding of it (so a literal within a float's
/// spacing of a bound, such as `-9223372036854775809`, which rounds to −2^63, keeps serde's
/// message). `None` for every other message, so that a fractional value or a whole float within
/// range (`1.5`, `2e3`) keeps serde's "floating point" message.
fn integer_out_of_range(msg: &str) -> Option<String> {
    // (type, smallest, largest) of the integer types the request structures use.
    const RANGES: [(&str, i128, i128); 7] = [
        ("i64", i64::MIN as i128, i64::MAX as i128),
        ("i32", i32::MIN as i128, i32::MAX as i128),
        ("u64", 0, u64::MAX as i128),
        ("u32", 0, u32::MAX as i128),
        ("u16", 0, u16::MAX as i128),
        ("u8", 0, u8::MAX as i128),
        ("usize", 0, u64::MAX as i128),
    ];
    let range = |expected: &str| RANGES.iter().find(|(ty, _, _)| expected.split_whitespace().next() == Some(ty)).map(|&(_, lo, hi)| (lo, hi));
    let says = |lo: i128, hi: i128| format!("expected an integer from {lo} to {hi}");
    if let Some(rest) = msg.strip_prefix("invalid type: floating point `") {
        let (number, expected) = rest.split_once("`, expected ")?;
        let (lo, hi) = range(expected)?;
        let v: f64 = number.parse().ok()?;
        // Every bound + 1 is a power of two, exact as f64.
        if !v.is_finite() || v.fract() != 0.0 || (v >= lo as f64 && v < (hi + 1) as f64) {
            return None;
        }
        return Some(format!("the integer is out of range; {}", says(lo, hi)));
    }
    let rest = msg.strip_prefix("invalid value: integer `")?;
    let (number, expected) = rest.split_once("`, expected ")?;
    let (lo, hi) = range(expected)?;
    let n: i128 = number.parse().ok()?;
    (n < lo || n > hi).then(|| format!("`{n}` is out of range; {}", says(lo, hi)))
}

/// serde's messages name the Rust type a field decodes to (`expected i64`, `expected f64`); a client
/// sent JSON, so they say the JSON kind instead (`expected an integer`, `expected a number`).
fn json_terms(msg: &str) -> String {
    const TERMS: [(&str, &str); 10] = [
        ("expected i64", "expected an integer"),
        ("expected i32", "expected an integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected u16", "expected a non-negative integer"),
        ("expected u8", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ];
    TERMS.iter().fold(msg.to_string(), |m, (rust, json)| m.replace(rust, json))
}

/// A field that is a string or a list of strings (`stop`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// The sampling fields common to the APIs (already parsed, not yet checked).
#[derive(Debug, Clone, Default)]
pub struct SamplingFields {
    /// temperature
    pub temperature: Option<f64>,
    /// top_p
    pub top_p: Option<f64>,
    /// top_k (0 or -1 = off)
    pub top_k: Option<i64>,
    /// min_p
    pub min_p: Option<f64>,
    /// seed
    pub seed: Option<i64>,
    /// presence_penalty
    pub presence_penalty: Option<f64>,
    /// frequency_penalty
    pub frequency_penalty: Option<f64>,
    /// repetition_penalty
    pub repetition_penalty: Option<f64>,
    /// stop strings
    pub stop: Vec<String>,
    /// top logprobs to report (None = no logprobs)
    pub logprobs: Option<usize>,
    /// generate past EOS
    pub ignore_eos: bool,
}

fn finite_in(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::field(name, format!("`{name}` must be a number in [{lo}, {hi}], got {x}."))),
    }
}

/// As [`finite_in`] over the half-open range (0, hi]: one message for every value outside it.
fn positive_up_to(name: &str, v: Option<f64>, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x > 0.0 && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::field(name, format!("`{name}` must be a number in (0, {hi}], got {x}."))),
    }
}

impl SamplingFields {
    /// Checks every field and builds the sampler parameters (EOS stops unless `ignore_eos`).
    pub fn params(&self, eos: u32) -> Result<SamplingParams, ApiError> {
        let temperature = finite_in("temperature", self.temperature, 0.0, 2.0, 1.0)?;
        let top_p = positive_up_to("top_p", self.top_p, 1.0, 1.0)?;
        let min_p = finite_in("min_p", self.min_p, 0.0, 1.0, 0.0)?;
        let presence_penalty = finite_in("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        let frequency_penalty = finite_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        let repetition_penalty = positive_up_to("repetition_penalty", self.repetition_penalty, 100.0, 1.0)?;
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => return Err(ApiError::field("top_k", format!("`top_k` must be -1, 0 (off) or positive, got {k}."))),
        };
        if self.stop.iter().any(String::is_empty) {
            return Err(ApiError::field("stop", "Stop strings must not be empty."));
        }
        if self.stop.len() > 64 {
            return Err(ApiError::field("stop", "At most 64 stop strings are allowed."));
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return Err(ApiError::field("top_logprobs", format!("At most {MAX_LOGPROBS} top logprobs can be returned.")));
            }
        }
        let p = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed: self.seed.map(|s| s as u64),
            logprobs: self.logprobs,
            stop_token_ids: if self.ignore_eos { Vec::new() } else { vec![eos] },
            stop_strings: self.stop.clone(),
            forced: None,
            reasoning_budget: None,
        };
        p.validate().map_err(|e| ApiError::bad(None, e.to_string()))?;
        Ok(p)
    }
}

/// Checks `max_tokens` (≥ 1) and that prompt + max_tokens fits the context; `None` = the rest of
/// the context.
pub fn max_tokens(field: &str, requested: Option<i64>, prompt: usize, context: usize) -> Result<usize, ApiError> {
    if prompt == 0 {
        return Err(ApiError::bad(None, "The prompt is empty."));
    }
    if prompt >= context {
        return Err(ApiError::bad(
            None,
            format!(
                "This model's maximum context length is {context} tokens, but the prompt has {prompt} tokens (leaving no room to generate)."
            ),
        )
        .with_code("context_length_exceeded"));
    }
    match requested {
        None => Ok(context - prompt),
        Some(n) if n < 1 => Err(ApiError::field(field, format!("`{field}` must be at least 1, got {n}."))),
        Some(n) if prompt as u64 + n as u64 > context as u64 => Err(ApiError::field(
            field,
            format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the prompt, {n} for the completion). Reduce the prompt or `{field}`.",
                prompt as u64 + n as u64
            ),
        )
        .with_code("context_length_exceeded")),
        Some(n) => Ok(n as usize),
    }
}

/// Resolves thinking mode and effort from `thinking`, `chat_template_kwargs` and
/// `reasoning_effort` (in that precedence). Default: chat mode (no reasoning).
pub fn thinking_mode(
    thinking: Option<&Value>,
    kwargs: Option<&Map<String, Value>>,
    effort: Option<&str>,
) -> Result<(ThinkingMode, Option<ReasoningEffort>), ApiError> {
    let effort_kw = kwargs.and_then(|k| k.get("reasoning_effort")).and_then(Value::as_str);
    let effort = match effort.or(effort_kw) {
        None => None,
        Some(e) => Some(match e {
            "none" => None,
            "minimal" | "low" | "medium" | "high" => Some(ReasoningEffort::High),
            "max" | "xhigh" => Some(ReasoningEffort::Max),
            other => {
                return Err(ApiError::field(
                    "reasoning_effort",
                    format!("Unknown reasoning_effort `{other}` (expected none, minimal, low, medium, high, xhigh or max)."),
                ))
            }
        }),
    };
    let explicit = match thinking {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            // Anthropic's budget_tokens: a positive whole number of tokens (enforced by
            // reasoning_budget below).
            Some("enabled") | Some("adaptive") if o.get("budget_tokens").is_some_and(|b| !b.is_null() && b.as_u64().is_none_or(|n| n == 0)) => {
                return Err(ApiError::field("thinking.budget_tokens", "`thinking.budget_tokens` must be a positive integer (a number of tokens)."));
            }
            Some("enabled") | Some("adaptive") => Some(true),
            Some("disabled") => Some(false),
            _ => return Err(ApiError::field("thinking.type", "`thinking.type` must be \"enabled\", \"adaptive\" or \"disabled\".")),
        },
        Some(_) => return Err(ApiError::field("thinking", "`thinking` must be an object like {\"type\": \"enabled\"}.")),
    };
    let kw = match kwargs.and_then(|k| k.get("enable_thinking").or_else(|| k.get("thinking"))) {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(ApiError::field("chat_template_kwargs.enable_thinking", "`enable_thinking` must be a boolean.")),
    };
    let on = explicit.or(kw).unwrap_or(matches!(effort, Some(Some(_))));
    let effort = effort.flatten();
    Ok(if on { (ThinkingMode::Thinking, effort) } else { (ThinkingMode::Chat, None) })
}

/// Renders OpenAI-style messages (tools already attached) and tokenizes the prompt.
pub fn render(
    tokenizer: &Ds4Tokenizer,
    messages: &[Value],
    mode: ThinkingMode,
    effort: Option<ReasoningEffort>,
) -> Result<Vec<u32>, ApiError> {
    let opts = EncodeOptions {
        thinking_mode: mode,
        reasoning_effort: effort,
        drop_thinking: true,
        add_default_bos_token: true,
        context: None,
    };
    let prompt = encode_messages(messages, &opts).map_err(|e| ApiError::field("messages", format!("Invalid messages: {e}")))?;
    tokenizer.encode_with_special(&prompt).map_err(|e| ApiError::bad(None, format!("Could not tokenize the prompt: {e}")))
}

/// A `tool_choice` that forces a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedCall<'a> {
    /// A call of any declared tool (their names): OpenAI `"required"`, Anthropic `{"type": "any"}`.
    Any(&'a [String]),
    /// A call of this tool: OpenAI `{"type": "function", "function": {"name": N}}`, Anthropic
    /// `{"type": "tool", "name": N}`.
    Named(&'a str),
}

/// The sampler's forced tokens for a `tool_choice` that forces a call: the opening of a DSML
/// tool-call block (chat_encoding_v4.md §7: `"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\""`),
/// and with a named tool its name and `">\n` — with any tool, one of the declared names and `">\n`,
/// chosen by the model among them token by token ([`ForcedTokens::choices`]) — so that the model
/// writes the arguments (and any further calls) itself. Chat mode forces them from the first generated token (the prompt ends
/// with `</think>`); thinking mode right after the model's `</think>` (a reply that never closes
/// its reasoning makes no call). The fixed part is tokenized as the prompt is (added tokens
/// recognised), the name as plain text: with the V4 tokenizer this is the prompt format's own
/// tokenization of the block's start (`="` and `">\n` are tokens of their own).
///
/// Errors: a tokenizer failure (500), or a tokenizer without `</think>` in thinking mode.
pub fn forced_tool_call(tokenizer: &Ds4Tokenizer, mode: ThinkingMode, call: ForcedCall<'_>) -> Result<ForcedTokens, ApiError> {
    let internal = |e: String| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, format!("Could not tokenize the forced tool call: {e}"));
    let mut tokens = tokenizer
        .encode_with_special(&format!("\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\""))
        .map_err(|e| internal(e.to_string()))?;
    let close = tokenizer.encode_text("\">\n").map_err(|e| internal(e.to_string()))?;
    let name_tokens = |name: &str| -> Result<Vec<u32>, ApiError> {
        let mut t = tokenizer.encode_text(name).map_err(|e| internal(e.to_string()))?;
        t.extend(&close);
        Ok(t)
    };
    let mut choices = Vec::new();
    match call {
        ForcedCall::Named(name) => tokens.extend(name_tokens(name)?),
        ForcedCall::Any(names) => {
            for name in names {
                let c = name_tokens(name)?;
                if !choices.contains(&c) {
                    choices.push(c);
                }
            }
        }
    }
    let after = match mode {
        ThinkingMode::Chat => None,
        ThinkingMode::Thinking => Some(tokenizer.token_to_id(THINK_END).ok_or_else(|| internal(format!("no {THINK_END} token")))?),
    };
    Ok(ForcedTokens { after, tokens, choices })
}

/// The sampler's reasoning budget for a request in `mode` whose `thinking` object gives
/// `budget_tokens` (Anthropic's field, also read on the OpenAI endpoint's `thinking` extension;
/// checked by [`thinking_mode`]): in thinking mode the model's `</think>` is forced once that many
/// tokens were generated without it ([`ReasoningBudget`]); `None` in chat mode or without a budget.
///
/// Errors: a tokenizer without `</think>` (500).
pub fn reasoning_budget(tokenizer: &Ds4Tokenizer, mode: ThinkingMode, thinking: Option<&Value>) -> Result<Option<ReasoningBudget>, ApiError> {
    let Some(n) = thinking.and_then(|t| t.get("budget_tokens")).and_then(Value::as_u64) else { return Ok(None) };
    if mode != ThinkingMode::Thinking {
        return Ok(None);
    }
    let end = tokenizer.token_to_id(THINK_END).ok_or_else(|| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, format!("The tokenizer has no {THINK_END} token.")))?;
    Ok(Some(ReasoningBudget { tokens: usize::try_from(n).unwrap_or(usize::MAX), end }))
}

/// Attaches tool declarations (OpenAI shape) and a response format to the first system message,
/// inserting an empty one first if there is none (as SGLang does).
pub fn attach_to_system(messages: &mut Vec<Value>, tools: Option<Vec<Value>>, response_format: Option<Value>) {
    if tools.is_none() && response_format.is_none() {
        return;
    }
    let i = match messages.iter().position(|m| m.get("role").and_then(Value::as_str) == Some("system")) {
        Some(i) => i,
        None => {
            messages.insert(0, json!({"role": "system", "content": ""}));
            0
        }
    };
    if let Some(Value::Object(m)) = messages.get_mut(i) {
        if let Some(t) = tools {
            m.insert("tools".into(), Value::Array(t));
        }
        if let Some(r) = response_format {
            m.insert("response_format".into(), r);
        }
    }
}

/// Checks OpenAI tool declarations: `[{"type": "function", "function": {"name": ..}}]`.
pub fn check_openai_tools(tools: &[Value]) -> Result<(), ApiError> {
    let mut seen = std::collections::HashSet::new();
    for (i, t) in tools.iter().enumerate() {
        if !t.is_object() {
            return Err(ApiError::field(&format!("tools[{i}]"), format!("Each tool must be an object; got {}.", json_kind(t))));
        }
        if t.get("type").and_then(Value::as_str).is_some_and(|ty| ty != "function") {
            return Err(ApiError::field(&format!("tools[{i}].type"), "Only tools of type `function` are supported."));
        }
        let Some(f) = t.get("function").filter(|f| f.is_object()) else {
            return Err(ApiError::field(&format!("tools[{i}].function"), "Each tool needs a `function` object (with its `name`)."));
        };
        // A call names its function: two declarations of one name would leave it ambiguous.
        tool_name(f.get("name"), &mut seen, &format!("tools[{i}].function.name"), "function")?;
        // As OpenAI's API: `parameters`, when given, is a JSON Schema object.
        if let Some(p) = f.get("parameters") {
            if !p.is_object() && !p.is_null() {
                return Err(ApiError::field(&format!("tools[{i}].function.parameters"), format!("`parameters` must be a JSON Schema object; got {}.", json_kind(p))));
            }
        }
    }
    Ok(())
}

/// A tool declaration's `name` field `v` checked (both APIs): a non-empty string not declared
/// before (`seen`, the names so far). `param` names the field in the error, `noun` the declaration
/// (`function` or `tool`).
///
/// Errors (400): a missing, null, empty or non-string name; a name already in `seen`.
pub fn tool_name<'a>(v: Option<&'a Value>, seen: &mut std::collections::HashSet<&'a str>, param: &str, noun: &str) -> Result<&'a str, ApiError> {
    let name = match v {
        Some(Value::String(n)) if !n.is_empty() => n.as_str(),
        Some(Value::String(_)) | None | Some(Value::Null) => return Err(ApiError::field(param, format!("Each {noun} needs a non-empty `name`."))),
        Some(other) => return Err(ApiError::field(param, format!("`name` must be a string; got {}.", json_kind(other)))),
    };
    if !seen.insert(name) {
        let mut noun_cap = noun.to_string();
        noun_cap[..1].make_ascii_uppercase();
        return Err(ApiError::field(param, format!("{noun_cap} names must be unique: `{}` is declared more than once.", shorten(name))));
    }
    Ok(name)
}

/// `s` for an error message: as is up to 64 characters, else its first 64 and `…`.
pub fn shorten(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// A submitted request's event stream.
pub struct Submitted {
    /// Engine events.
    pub rx: UnboundedReceiver<Event>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
}

/// Queues a generation; maps refusals to 429 / 503.
pub fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    params: SamplingParams,
    max_tokens: usize,
    skip_special: bool,
    arrived: Instant,
) -> Result<Submitted, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    let req = GenRequest { prompt, params, max_tokens, skip_special, events: tx, arrived };
    match st.sched.submit(req) {
        Ok(()) => Ok(Submitted { rx, prompt_tokens }),
        Err(SubmitError::QueueFull) => Err(ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            "The server is at capacity (request queue full); retry later.",
        )
        .with_code("rate_limit_exceeded")
        .retry_after(1)),
        Err(SubmitError::ShuttingDown) => Err(shutting_down()),
    }
}

/// The 503 of a server that is shutting down.
pub fn shutting_down() -> ApiError {
    ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "The server is shutting down.").with_code("shutting_down").retry_after(5)
}

/// A fresh id with `prefix`: 24 hex digits, unique in the process, unpredictable across runs.
pub fn new_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(base ^ n);
    format!("{prefix}{:016x}{:08x}", h.finish(), n as u32)
}

/// Unix time now, in seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The text of a token id (special tokens kept; invalid UTF-8 as U+FFFD).
pub fn token_text(tok: &Ds4Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Joins the text parts of an OpenAI/Anthropic content value (a string, null, or a list of
/// `{"type": "text", "text": ...}` parts); other part types are rejected.
pub fn content_text(v: Option<&Value>, at: &str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") | Some("output_text") => match p.get("text") {
                        Some(Value::String(t)) => out.push(t.as_str()),
                        _ => return Err(ApiError::field(&format!("{at}[{i}].text"), "A text part needs a string `text`.")),
                    },
                    Some(other) => {
                        return Err(ApiError::field(
                            &format!("{at}[{i}].type"),
                            format!("Content parts of type `{other}` are not supported (text only)."),
                        ))
                    }
                    None => return Err(ApiError::field(&format!("{at}[{i}]"), "A content part needs a `type`.")),
                }
            }
            Ok(Some(out.join("\n")))
        }
        Some(_) => Err(ApiError::field(at, format!("`{at}` must be a string, null or a list of content parts."))),
    }
}

/// Milliseconds, rounded to 0.001.
pub fn ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anthropic's `thinking.budget_tokens` must be a positive integer when given; absent or null
    /// it is not needed. In thinking mode it becomes the sampler's budget on `</think>`.
    #[test]
    fn thinking_budget_tokens_is_checked() {
        let mode = |v: Value| thinking_mode(Some(&v), None, None);
        for bad in [json!("x"), json!(-1), json!(0), json!(1.5), json!([1])] {
            let e = mode(json!({"type": "enabled", "budget_tokens": bad})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"), "{bad}");
        }
        for ok in [json!({"type": "enabled", "budget_tokens": 1024}), json!({"type": "enabled"}), json!({"type": "enabled", "budget_tokens": null})] {
            assert!(matches!(mode(ok).unwrap().0, ThinkingMode::Thinking));
        }
        assert!(matches!(mode(json!({"type": "disabled", "budget_tokens": "x"})).unwrap().0, ThinkingMode::Chat));
        let tok = Ds4Tokenizer::shared().unwrap();
        let t = json!({"type": "enabled", "budget_tokens": 2048});
        let b = reasoning_budget(tok, ThinkingMode::Thinking, Some(&t)).unwrap().unwrap();
        assert_eq!((b.tokens, Some(b.end)), (2048, tok.token_to_id(THINK_END)));
        assert_eq!(reasoning_budget(tok, ThinkingMode::Chat, Some(&t)).unwrap(), None);
        assert_eq!(reasoning_budget(tok, ThinkingMode::Thinking, Some(&json!({"type": "enabled"}))).unwrap(), None);
        assert_eq!(reasoning_budget(tok, ThinkingMode::Thinking, None).unwrap(), None);
    }

    /// Each range names its own bounds for every value outside it (0 and 1.5 alike for top_p).
    #[test]
    fn sampling_ranges_have_one_message_each() {
        let msg = |f: SamplingFields| f.params(1).unwrap_err();
        for x in [0.0, -0.5, 1.5] {
            let e = msg(SamplingFields { top_p: Some(x), ..Default::default() });
            assert_eq!((e.param.as_deref(), e.message), (Some("top_p"), format!("`top_p` must be a number in (0, 1], got {x}.")));
        }
        for x in [0.0, 101.0] {
            let e = msg(SamplingFields { repetition_penalty: Some(x), ..Default::default() });
            assert_eq!(e.message, format!("`repetition_penalty` must be a number in (0, 100], got {x}."));
        }
        let p = SamplingFields { top_p: Some(1.0), repetition_penalty: Some(100.0), ..Default::default() }.params(1).unwrap();
        assert_eq!((p.top_p, p.repetition_penalty), (1.0, 100.0));
    }

    /// The forced tokens are the V4 tokenizer's own tokenization of a whole DSML block's start
    /// (the prompt format's tokens, as a finished assistant turn in a prompt is encoded), with and
    /// without a name; chat mode forces from the first token, thinking mode after `</think>`.
    #[test]
    fn forced_tool_call_is_the_blocks_own_tokenization() {
        let tok = Ds4Tokenizer::shared().unwrap();
        let block = |name: &str| format!("</think>\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"{name}\">\n<{DSML}parameter name=\"city\" string=\"true\">Paris</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>");
        for name in ["get_weather", "lookup2", "search-web"] {
            let whole = tok.encode_with_special(&block(name)).unwrap();
            assert_eq!(whole[0], tok.token_to_id(THINK_END).unwrap());
            let named = forced_tool_call(tok, ThinkingMode::Chat, ForcedCall::Named(name)).unwrap();
            assert_eq!(named.after, None);
            assert_eq!(named.tokens[..], whole[1..1 + named.tokens.len()], "{name}");
            assert_eq!(tok.decode(&named.tokens, false).unwrap(), format!("\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"{name}\">\n"));
            let names = vec!["other".to_string(), name.to_string()];
            let any = forced_tool_call(tok, ThinkingMode::Thinking, ForcedCall::Any(&names)).unwrap();
            assert_eq!(any.after, tok.token_to_id(THINK_END));
            assert_eq!(any.tokens[..], whole[1..1 + any.tokens.len()], "{name}");
            assert!(named.tokens.starts_with(&any.tokens));
            // Its choices: each name's tokens and `">\n`, the named call's own continuation among them.
            assert_eq!(any.choices.len(), 2);
            assert_eq!(any.choices[1][..], named.tokens[any.tokens.len()..], "{name}");
            assert!(named.choices.is_empty());
        }
    }

    /// serde_json's own message for `json` decoded as `T`.
    fn serde_message<T: serde::de::DeserializeOwned + std::fmt::Debug>(json: &str) -> String {
        serde_json::from_str::<T>(json).expect_err(json).to_string()
    }

    #[test]
    fn integers_beyond_their_range_are_called_out_of_range() {
        let i64_range = "expected an integer from -9223372036854775808 to 9223372036854775807";
        // Beyond 64 bits, either sign: serde holds a float, so the number is not echoed.
        for json in ["1111111111111111111111111", "-99999999999999999999", "9.223372036854775808e18", "1e300"] {
            assert_eq!(integer_out_of_range(&serde_message::<i64>(json)), Some(format!("the integer is out of range; {i64_range}")), "{json}");
        }
        // Between 2^63 and 2^64: serde holds the integer, which the message repeats exactly.
        assert_eq!(integer_out_of_range(&serde_message::<i64>("9223372036854775808")), Some(format!("`9223372036854775808` is out of range; {i64_range}")));
        assert_eq!(integer_out_of_range(&serde_message::<u32>("4294967296")), Some("`4294967296` is out of range; expected an integer from 0 to 4294967295".into()));
        assert_eq!(integer_out_of_range(&serde_message::<u32>("-1")), Some("`-1` is out of range; expected an integer from 0 to 4294967295".into()));
        assert_eq!(integer_out_of_range(&serde_message::<u64>("1e20")), Some("the integer is out of range; expected an integer from 0 to 18446744073709551615".into()));
        // Fractions, and whole floats within the range, keep serde's "floating point" message.
        for json in ["1.5", "2e3", "9.21e18", "-9.2e18"] {
            let m = serde_message::<i64>(json);
            assert!(m.contains("floating point"), "{m}");
            assert_eq!(integer_out_of_range(&m), None, "{json}");
        }
        // Other messages are left alone.
        assert_eq!(integer_out_of_range(&serde_message::<i64>("\"ten\"")), None);
        assert_eq!(integer_out_of_range(&serde_message::<f64>("true")), None);
    }
}
