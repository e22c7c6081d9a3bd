//! Turns the generated text of a chat completion into API-neutral deltas: reasoning, content and
//! complete tool calls, as they form.
//!
//! The DeepSeek-V4 [`StreamParser`] decides reasoning / content / DSML tool-call events; this layer
//! adds the guarantees the HTTP APIs need:
//!
//! - a tool call is released only when it is complete and its arguments are a JSON object, so a
//!   client never sees half a call (the name, then the whole arguments, in one delta);
//! - when the text stops parsing (malformed DSML, a stray special token, a cut-off call), every
//!   byte that no event has covered is returned as text (reasoning before `</think>`, else
//!   content) — never dropped;
//! - the end-of-sentence marker never appears in the text.

use flashseek_model::chat::{StreamEvent, StreamParser, ThinkingMode, EOS, THINK_END};
use serde_json::Value;

/// One piece of the assistant message.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Reasoning text.
    Reasoning(String),
    /// Visible content.
    Content(String),
    /// A complete tool call.
    ToolCall {
        /// Position among the message's tool calls.
        index: usize,
        /// Function name.
        name: String,
        /// Arguments as JSON text (an object).
        arguments: String,
        /// Arguments parsed.
        input: Value,
    },
}

/// The assistant message assembled from deltas (for non-streaming responses).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// Reasoning text.
    pub reasoning: String,
    /// Visible content.
    pub content: String,
    /// Tool calls: (name, arguments JSON text, parsed arguments).
    pub tool_calls: Vec<(String, String, Value)>,
}

impl Message {
    /// Adds deltas.
    pub fn extend(&mut self, deltas: impl IntoIterator<Item = Delta>) {
        for d in deltas {
            match d {
                Delta::Reasoning(t) => self.reasoning.push_str(&t),
                Delta::Content(t) => self.content.push_str(&t),
                Delta::ToolCall { name, arguments, input, .. } => self.tool_calls.push((name, arguments, input)),
            }
        }
    }
}

/// Incremental assembler of one chat completion.
#[derive(Debug)]
pub struct Assembler {
    parser: StreamParser,
    mode: ThinkingMode,
    /// Bytes of raw text covered by emitted deltas.
    covered: usize,
    /// Raw text position where content starts (after `</think>` in thinking mode).
    content_start: Option<usize>,
    content_len: usize,
    reasoning_len: usize,
    /// The tool call being formed: (name, arguments so far).
    pending: Option<(String, String)>,
    calls: usize,
    /// The parser failed and the rest was flushed as text: later text goes straight through.
    raw_mode: bool,
    /// In raw mode: the channel of the fallback text.
    raw_reasoning: bool,
    /// In raw mode: text held back because it may be the start of an EOS marker.
    held: String,
}

impl Assembler {
    /// An assembler for a completion generated in `mode`.
    pub fn new(mode: ThinkingMode) -> Self {
        Assembler {
            parser: StreamParser::new(mode),
            mode,
            covered: 0,
            content_start: if mode == ThinkingMode::Chat { Some(0) } else { None },
            content_len: 0,
            reasoning_len: 0,
            pending: None,
            calls: 0,
            raw_mode: false,
            raw_reasoning: false,
            held: String::new(),
        }
    }

    /// Whether any tool call has been released.
    pub fn has_tool_calls(&self) -> bool {
        self.calls > 0
    }

    /// Feeds the next piece of generated text (special tokens included).
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        if self.raw_mode {
            self.parser.push(text);
            self.held.push_str(text);
            return self.release_held(false);
        }
        let events = self.parser.push(text);
        let mut out = Vec::new();
        self.absorb(events, &mut out);
        if self.parser.is_failed() {
            self.fail(&mut out);
        }
        out
    }

    /// Declares the end of the text; returns the last deltas.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        if self.raw_mode {
            return self.release_held(true);
        }
        let events = self.parser.end_of_input();
        self.absorb(events, &mut out);
        let complete = !self.parser.is_failed() && self.pending.is_none();
        // Everything not covered by a delta comes back as text, except a final EOS and, after
        // complete tool calls, the closing markup that only ends the block.
        if !complete || self.covered < self.parser.text().len() {
            if !complete {
                // Text after a `</think>` the parser had not yet released (the reply cut short
                // right after it, or inside a tool-call block that follows it) is content.
                self.end_reasoning_if_closed();
            }
            let rest = self.parser.text()[self.covered.min(self.parser.text().len())..].to_string();
            let rest = rest.strip_suffix(EOS).unwrap_or(&rest).to_string();
            let closing_only = self.calls > 0
                && self.pending.is_none()
                && !rest.is_empty()
                && "\n</｜DSML｜tool_calls>".starts_with(rest.trim_start_matches(['\n', '>']).trim_start_matches('\n'));
            if !complete && !rest.is_empty() && !closing_only {
                self.raw_reasoning = self.in_reasoning();
                out.extend(self.raw_text(rest));
            }
            self.covered = self.parser.text().len();
        }
        self.raw_mode = true;
        out
    }

    fn in_reasoning(&self) -> bool {
        self.mode == ThinkingMode::Thinking && self.content_start.is_none()
    }

    /// Raw mode: releases held text without EOS markers, keeping back (unless `all`) a suffix
    /// that may be the start of one.
    fn release_held(&mut self, all: bool) -> Vec<Delta> {
        let mut text = self.held.replace(EOS, "");
        let keep = if all {
            0
        } else {
            (1..EOS.len()).rev().find(|&k| text.len() >= k && text.is_char_boundary(text.len() - k) && EOS.starts_with(&text[text.len() - k..])).unwrap_or(0)
        };
        self.held = text.split_off(text.len() - keep);
        self.raw_text(text)
    }

    fn raw_text(&self, t: String) -> Vec<Delta> {
        if t.is_empty() {
            Vec::new()
        } else if self.raw_reasoning {
            vec![Delta::Reasoning(t)]
        } else {
            vec![Delta::Content(t)]
        }
    }

    fn absorb(&mut self, events: Vec<StreamEvent>, out: &mut Vec<Delta>) {
        for e in events {
            match e {
                StreamEvent::Reasoning(t) => {
                    self.reasoning_len += t.len();
                    self.covered = self.reasoning_len;
                    out.push(Delta::Reasoning(t));
                }
                StreamEvent::Content(t) => {
                    let start = *self.content_start.get_or_insert(self.reasoning_len + THINK_END.len());
                    self.content_len += t.len();
                    self.covered = start + self.content_len;
                    out.push(Delta::Content(t));
                }
                StreamEvent::ToolCallStart { name, .. } => {
                    if self.content_start.is_none() && self.mode == ThinkingMode::Thinking {
                        self.content_start = Some(self.reasoning_len + THINK_END.len());
                    }
                    self.pending = Some((name, String::new()));
                }
                StreamEvent::ToolCallArguments { delta, .. } => {
                    if let Some((_, args)) = &mut self.pending {
                        args.push_str(&delta);
                    }
                }
                StreamEvent::ToolCallEnd { .. } => {
                    let Some((name, arguments)) = self.pending.take() else { continue };
                    match serde_json::from_str::<Value>(&arguments) {
                        Ok(input @ Value::Object(_)) => {
                            // The call's raw text ends at the last invoke close seen so far.
                            let text = self.parser.text();
                            if let Some(p) = text.rfind("</｜DSML｜invoke>") {
                                self.covered = self.covered.max(p + "</｜DSML｜invoke>".len());
                            }
                            out.push(Delta::ToolCall { index: self.calls, name, arguments, input });
                            self.calls += 1;
                        }
                        // Arguments that are not a JSON object: the call is not usable; return
                        // its text instead (from here on, everything is text).
                        _ => {
                            self.fail(out);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Still in the reasoning with `</think>` already in the text right after it: the reasoning
    /// ends there (content starts past it, and the marker itself is covered).
    fn end_reasoning_if_closed(&mut self) {
        if self.content_start.is_some() || self.mode != ThinkingMode::Thinking {
            return;
        }
        if self.parser.text().get(self.reasoning_len..).is_some_and(|after| after.starts_with(THINK_END)) {
            self.content_start = Some(self.reasoning_len + THINK_END.len());
            self.covered = self.covered.max(self.reasoning_len + THINK_END.len());
        }
    }

    /// The text can no longer parse: return what no delta covered as text and switch to raw mode.
    fn fail(&mut self, out: &mut Vec<Delta>) {
        // Still in the reasoning: if `</think>` has arrived, the rest is content.
        self.end_reasoning_if_closed();
        self.raw_reasoning = self.in_reasoning();
        let text = self.parser.text();
        self.held = text[self.covered.min(text.len())..].to_string();
        self.covered = text.len();
        self.pending = None;
        self.raw_mode = true;
        out.extend(self.release_held(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` characters and collects the message.
    fn run(mode: ThinkingMode, text: &str, step: usize) -> (Message, Vec<Delta>) {
        let mut a = Assembler::new(mode);
        let mut all = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(step) {
            all.extend(a.push(&c.iter().collect::<String>()));
        }
        all.extend(a.finish());
        let mut m = Message::default();
        m.extend(all.clone());
        (m, all)
    }

    const CALLS: &str = "I'll check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"tz\" string=\"true\">CET \"x\"</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

    #[test]
    fn tool_calls_stream_whole_in_any_split() {
        for step in [1, 2, 3, 7, 1000] {
            let (m, deltas) = run(ThinkingMode::Chat, CALLS, step);
            assert_eq!(m.content, "I'll check.", "step {step}");
            assert_eq!(m.tool_calls.len(), 2);
            assert_eq!(m.tool_calls[0].0, "get_weather");
            assert_eq!(m.tool_calls[0].2, serde_json::json!({"city": "Paris", "days": 3}));
            assert_eq!(m.tool_calls[1].2, serde_json::json!({"tz": "CET \"x\""}));
            // The first call is released before the second one's text is complete.
            let first = deltas.iter().position(|d| matches!(d, Delta::ToolCall { index: 0, .. })).unwrap();
            let second = deltas.iter().position(|d| matches!(d, Delta::ToolCall { index: 1, .. })).unwrap();
            assert!(first < second);
        }
    }

    #[test]
    fn tool_call_released_as_it_completes() {
        let mut a = Assembler::new(ThinkingMode::Chat);
        let cut = CALLS.find("<｜DSML｜invoke name=\"get_time\"").unwrap();
        let d = a.push(&CALLS[..cut]);
        assert!(d.iter().any(|d| matches!(d, Delta::ToolCall { index: 0, .. })), "{d:?}");
        let d = a.push(&CALLS[cut..]);
        assert!(d.iter().any(|d| matches!(d, Delta::ToolCall { index: 1, .. })), "{d:?}");
        assert!(a.finish().is_empty());
    }

    #[test]
    fn thinking_then_content() {
        let (m, _) = run(ThinkingMode::Thinking, "Let me think.</think>The answer is 4.<｜end▁of▁sentence｜>", 2);
        assert_eq!(m.reasoning, "Let me think.");
        assert_eq!(m.content, "The answer is 4.");
        assert!(m.tool_calls.is_empty());
    }

    /// A reply cut short right after `</think>`, or inside a tool-call block that follows it (a
    /// thinking budget's forced `</think>`, then a forced call): the reasoning ends at the marker,
    /// which appears in neither channel, and the rest is content.
    #[test]
    fn cut_after_think_end_is_content() {
        for step in [1, 2, 5, 1000] {
            let (m, _) = run(ThinkingMode::Thinking, "abc</think>", step);
            assert_eq!((m.reasoning.as_str(), m.content.as_str()), ("abc", ""), "step {step}");
            let call = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n xyz";
            let (m, _) = run(ThinkingMode::Thinking, &format!("abc</think>{call}"), step);
            assert_eq!((m.reasoning.as_str(), m.content.as_str()), ("abc", call), "step {step}");
            assert!(m.tool_calls.is_empty());
            let (m, _) = run(ThinkingMode::Thinking, "abc</think>\n\n<｜DSML｜tool_calls>\n", step);
            assert_eq!((m.reasoning.as_str(), m.content.as_str()), ("abc", "\n\n<｜DSML｜tool_calls>\n"), "step {step}");
            // Still in the reasoning when cut: it all stays reasoning.
            let (m, _) = run(ThinkingMode::Thinking, "abc</thi", step);
            assert_eq!((m.reasoning.as_str(), m.content.as_str()), ("abc</thi", ""), "step {step}");
        }
    }

    #[test]
    fn malformed_call_comes_back_as_text() {
        // A parameter tag that does not close properly.
        let bad = "Hi\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" strin=\"true\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
        for step in [1, 5, 1000] {
            let (m, _) = run(ThinkingMode::Chat, bad, step);
            assert!(m.tool_calls.is_empty());
            assert_eq!(m.content, bad.strip_suffix(EOS).unwrap(), "step {step}");
        }
    }

    #[test]
    fn non_object_arguments_come_back_as_text() {
        let bad = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
        let (m, _) = run(ThinkingMode::Chat, bad, 3);
        assert!(m.tool_calls.is_empty());
        assert_eq!(m.content, bad.strip_suffix(EOS).unwrap());
    }

    #[test]
    fn cut_off_call_comes_back_as_text() {
        // max_tokens reached inside the second call: the first one is complete and kept.
        let cut = CALLS.find("<｜DSML｜parameter name=\"tz\"").unwrap() + 20;
        let (m, _) = run(ThinkingMode::Chat, &CALLS[..cut], 4);
        assert_eq!(m.tool_calls.len(), 1);
        assert!(m.content.starts_with("I'll check.<｜DSML｜invoke name=\"get_time\"") || m.content.starts_with("I'll check.\n<｜DSML｜invoke"), "{:?}", m.content);
        assert!(m.content.ends_with(&CALLS[cut - 20..cut]));
    }

    #[test]
    fn plain_text_cut_by_length_is_kept() {
        for step in [1, 4] {
            let (m, _) = run(ThinkingMode::Chat, "Hello <｜DSML", step);
            assert_eq!(m.content, "Hello <｜DSML");
            let (m, _) = run(ThinkingMode::Thinking, "still thinking <", step);
            assert_eq!(m.reasoning, "still thinking <");
            assert_eq!(m.content, "");
        }
    }

    #[test]
    fn stray_special_token_is_text() {
        let (m, _) = run(ThinkingMode::Chat, "a<think>b<｜end▁of▁sentence｜>", 1);
        assert_eq!(m.content, "a<think>b");
    }
}
