//! DeepSeek-V4 chat prompt encoding and completion parsing.
//!
//! A port of the behaviour of DeepSeek's `encoding/encoding_dsv4.py` (the normative renderer of
//! the V4-Flash/Pro release), as described in `shared/chat_encoding_v4.md` and pinned by the
//! fixtures `shared/fixtures/chat_v4.jsonl` and `chat_v4_parse.jsonl`:
//!
//! - [`encode_messages`] renders OpenAI-style messages into the prompt string (section 2–9);
//! - [`parse_completion`] turns generated text back into reasoning, content and tool calls
//!   (section 10), rejecting exactly what the reference rejects;
//! - [`StreamParser`] does the same incrementally, emitting [`StreamEvent`]s as text arrives.
//!
//! JSON embedded in prompts (tool schemas, `response_format`, non-string tool arguments) is written
//! the way Python's `json.dumps(value, ensure_ascii=False)` writes it: `", "`/`": "` separators,
//! keys in input order, Python float repr (`1000.0`, `1e+20`, `1.5e-07`), integers with all their
//! digits. Non-string values that the reference interpolates with `str()` get Python's `str()`.
//!
//! Known, deliberate differences from the Python module (all on inputs no API client sends):
//! - numbers inside `serde_json::Value` inputs are only as exact as `serde_json` keeps them: without
//!   its `arbitrary_precision` feature an integer beyond the 64-bit range arrives as a float and
//!   the literal `-0` as `-0.0` (tool-call `arguments` strings are decoded here and are exact);
//! - a lone UTF-16 surrogate escape in tool-call arguments (`"\ud800"`) is an error, because the
//!   prompt could not be a Rust `String` (nor be tokenized by the reference tokenizer);
//! - Python's recursion limit is imitated with fixed depths (messages nested deeper than
//!   [`MAX_MESSAGE_DEPTH`] are rejected, arguments nested deeper than 990 count as undecodable);
//!   the true Python limits depend on its call stack.

mod encode;
mod parse;
mod printable;
mod pyjson;
mod stream;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

pub use encode::{encode_messages, MAX_MESSAGE_DEPTH};
pub use parse::parse_completion;
pub use stream::{StreamEvent, StreamParser};

/// `<｜begin▁of▁sentence｜>` (token id 0), written first in a prompt.
pub const BOS: &str = "<｜begin▁of▁sentence｜>";
/// `<｜end▁of▁sentence｜>` (token id 1), ends every assistant turn; the generation stop token.
pub const EOS: &str = "<｜end▁of▁sentence｜>";
/// `<｜User｜>` (token id 128803), opens a user (or developer) turn.
pub const USER: &str = "<｜User｜>";
/// `<｜Assistant｜>` (token id 128804), opens an assistant turn.
pub const ASSISTANT: &str = "<｜Assistant｜>";
/// `<think>` (token id 128821), opens the reasoning of an assistant turn.
pub const THINK_START: &str = "<think>";
/// `</think>` (token id 128822), closes the reasoning of an assistant turn.
pub const THINK_END: &str = "</think>";
/// `｜DSML｜` (token id 128825), the prefix of every tool-call markup tag.
pub const DSML: &str = "｜DSML｜";
/// `<｜latest_reminder｜>` (token id 128828), opens a `latest_reminder` message.
pub const LATEST_REMINDER: &str = "<｜latest_reminder｜>";

/// Task tokens of the internal quick-instruction tasks (`task` field of a message), as
/// `(task name, token)`.
pub const TASK_TOKENS: [(&str, &str); 6] = [
    ("action", "<｜action｜>"),
    ("query", "<｜query｜>"),
    ("authority", "<｜authority｜>"),
    ("domain", "<｜domain｜>"),
    ("title", "<｜title｜>"),
    ("read_url", "<｜read_url｜>"),
];

/// The prefix written before the first message in thinking mode with
/// [`ReasoningEffort::Max`] (protocol constant, spec section 5.1).
pub const REASONING_EFFORT_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// Whether the model reasons before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThinkingMode {
    /// `"chat"`: the assistant prefix ends with `</think>`, no reasoning is rendered or parsed.
    Chat,
    /// `"thinking"`: the assistant prefix ends with `<think>`; the completion starts with the
    /// reasoning, closed by `</think>`.
    Thinking,
}

impl ThinkingMode {
    /// The reference's name for the mode: `"chat"` or `"thinking"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingMode::Chat => "chat",
            ThinkingMode::Thinking => "thinking",
        }
    }
}

impl fmt::Display for ThinkingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ThinkingMode {
    type Err = ChatError;

    /// Accepts exactly `"chat"` and `"thinking"`, like the reference.
    fn from_str(s: &str) -> Result<Self, ChatError> {
        match s {
            "chat" => Ok(ThinkingMode::Chat),
            "thinking" => Ok(ThinkingMode::Thinking),
            other => Err(ChatError::InvalidThinkingMode(other.to_string())),
        }
    }
}

/// Requested reasoning effort. Only [`ReasoningEffort::Max`] changes the prompt (in thinking
/// mode); [`ReasoningEffort::High`] renders exactly like no effort at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningEffort {
    /// `"high"`.
    High,
    /// `"max"`: prefixes the prompt with [`REASONING_EFFORT_MAX_PREFIX`] in thinking mode.
    Max,
}

impl ReasoningEffort {
    /// The reference's name: `"high"` or `"max"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::High => "high",
            ReasoningEffort::Max => "max",
        }
    }
}

impl fmt::Display for ReasoningEffort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReasoningEffort {
    type Err = ChatError;

    /// Accepts exactly `"high"` and `"max"`, like the reference.
    fn from_str(s: &str) -> Result<Self, ChatError> {
        match s {
            "high" => Ok(ReasoningEffort::High),
            "max" => Ok(ReasoningEffort::Max),
            other => Err(ChatError::InvalidReasoningEffort(other.to_string())),
        }
    }
}

/// Options of [`encode_messages`], mirroring the keyword arguments of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodeOptions {
    /// Chat or thinking mode.
    pub thinking_mode: ThinkingMode,
    /// Reasoning effort (`None`, `high` or `max`).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Drop the reasoning of assistant turns before the last user turn (and developer messages
    /// before it) in thinking mode. Forced off when any message carries `tools`. Reference
    /// default: `true`.
    pub drop_thinking: bool,
    /// Write [`BOS`] first (only when there is no context). Reference default: `true`.
    pub add_default_bos_token: bool,
    /// Messages already encoded earlier: they steer the rendering (indices, tool-call order,
    /// dropping) but are not emitted, and no BOS is written when this is non-empty.
    pub context: Option<Vec<serde_json::Value>>,
}

impl EncodeOptions {
    /// The reference defaults for `mode`: no reasoning effort, `drop_thinking = true`,
    /// `add_default_bos_token = true`, no context.
    pub fn new(thinking_mode: ThinkingMode) -> Self {
        EncodeOptions {
            thinking_mode,
            reasoning_effort: None,
            drop_thinking: true,
            add_default_bos_token: true,
            context: None,
        }
    }
}

/// An assistant message parsed from a completion (`parse_message_from_completion_text`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedMessage {
    /// Visible answer text, untrimmed (without the reasoning and the tool-call block).
    pub content: String,
    /// Reasoning text before `</think>`, untrimmed; empty in chat mode.
    pub reasoning_content: String,
    /// Tool calls in order (the caller assigns ids).
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call parsed from DSML markup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Function name, as written in `<｜DSML｜invoke name="...">`.
    pub name: String,
    /// The arguments text exactly as the reference builds it:
    /// `{"key": value, ...}` where `string="true"` values are JSON-quoted and `string="false"`
    /// values are inserted verbatim (so it is not always valid JSON).
    pub arguments: String,
}

/// Errors of encoding and parsing. Every input the reference rejects is rejected; the messages
/// need not match the Python exception texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    /// A thinking mode other than `chat`/`thinking` (from [`ThinkingMode::from_str`]).
    #[error("invalid thinking mode `{0}` (expected `chat` or `thinking`)")]
    InvalidThinkingMode(String),
    /// A reasoning effort other than `high`/`max` (from [`ReasoningEffort::from_str`]).
    #[error("invalid reasoning effort `{0}` (expected `high` or `max`)")]
    InvalidReasoningEffort(String),
    /// A message or one of its fields has a shape the reference cannot handle (it would raise
    /// a `TypeError`, `KeyError` or `AttributeError`).
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// A `developer` message whose content is empty or missing.
    #[error("developer message with empty content")]
    EmptyDeveloperContent,
    /// A role the encoder does not render.
    #[error("unknown role: {0}")]
    UnknownRole(String),
    /// A `task` value other than `action`, `query`, `authority`, `domain`, `title`, `read_url`.
    #[error("invalid task: {0}")]
    InvalidTask(String),
    /// Tool-call `arguments` decoded to JSON that is not an object.
    #[error("tool call arguments decode to {0}, not a JSON object")]
    ToolArgumentsNotObject(String),
    /// The input can be rendered by Python but not represented here (see the module docs).
    #[error("unrepresentable input: {0}")]
    Unrepresentable(String),

    /// Thinking-mode completion without `</think>` (or with a tool-call block before it).
    #[error("invalid thinking format: missing </think>")]
    MissingThinkEnd,
    /// Completion ends without EOS and without a tool-call block.
    #[error("invalid format: missing EOS token")]
    MissingEos,
    /// Text other than EOS after the tool-call block.
    #[error("unexpected content after tool calls")]
    ContentAfterToolCalls,
    /// Text after the final EOS.
    #[error("unexpected content at end")]
    ContentAfterEos,
    /// The text between tool-call tags is not exactly `>\n`.
    #[error("tool call format error: expected '>\\n' but got {0:?}")]
    ToolCallFormat(String),
    /// The tool-call block is cut off (no `<｜DSML｜invoke` or `</｜DSML｜tool_calls>`).
    #[error("missing special token in tool calls")]
    MissingToolCallToken,
    /// The `invoke` tag does not match `name="...">`.
    #[error("tool name format error: {0:?}")]
    ToolNameFormat(String),
    /// A `parameter` tag does not match ` name="..." string="true|false">...<`, or is not
    /// followed by `>\n`.
    #[error("parameter format error: {0:?}")]
    ParameterFormat(String),
    /// The same parameter name twice in one call.
    #[error("duplicate parameter name: {0:?}")]
    DuplicateParameter(String),
    /// BOS, EOS, `<think>`, `</think>` or `｜DSML｜` inside content or reasoning.
    #[error("unexpected special token {0:?} in content")]
    SpecialTokenInContent(&'static str),
}
