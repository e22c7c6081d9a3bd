//! Incremental completion parsing for streaming responses.

use super::parse::{
    arg_key_prefix, find_param_header, match_invoke_name, match_param, parse_completion,
    FORBIDDEN_IN_TEXT, INVOKE_CLOSE, INVOKE_OPEN, PARAM_CLOSE, PARAM_OPEN, TOOL_CALLS_END,
    TOOL_CALLS_START,
};
use super::pyjson::{self, push_json_str_body};
use super::{ChatError, ParsedMessage, ThinkingMode, EOS, THINK_END};

/// One piece of a streamed assistant message, as decided by [`StreamParser`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// More reasoning text (thinking mode, before `</think>`).
    Reasoning(String),
    /// More visible content.
    Content(String),
    /// A tool call begins; its name is complete. `index` counts calls from 0.
    ToolCallStart {
        /// Position of the call in the message.
        index: usize,
        /// Function name.
        name: String,
    },
    /// More text of the call's arguments. The deltas of one call concatenate to exactly
    /// [`ToolCall::arguments`](super::ToolCall::arguments) (starting with `{`, ending with `}`).
    ToolCallArguments {
        /// Position of the call in the message.
        index: usize,
        /// The next piece of the arguments text.
        delta: String,
    },
    /// The call is complete (its arguments ended with `}`).
    ToolCallEnd {
        /// Position of the call in the message.
        index: usize,
    },
}

/// Where the parser stands, in terms of the reference parser's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading reasoning up to `</think>`.
    Reasoning,
    /// Reading content up to EOS or the tool-call block.
    Content,
    /// Top of the tool-call loop: expecting `>\n` then `<｜DSML｜invoke` or the block end.
    Calls,
    /// Inside `<｜DSML｜invoke ...`, up to the first parameter or the invoke end.
    InvokeName,
    /// Inside `<｜DSML｜parameter ...`, before ` string="..."> ` is complete.
    ParamHeader,
    /// Inside a parameter value (header already emitted).
    ParamValue { value_start: usize, is_str: bool },
    /// After `/｜DSML｜parameter`: expecting `>\n` then another parameter or the invoke end.
    AfterParam,
    /// After the tool-call block: only EOS may follow.
    AfterCalls,
    /// After the final EOS: nothing may follow.
    Done,
    /// The text can no longer parse; no more events.
    Failed,
}

enum Scan {
    /// A stop string was found at this position (and no earlier one can still appear).
    Stop(usize, &'static str),
    /// No stop yet; text before this position cannot belong to a stop or a held-back marker.
    Pending(usize),
    /// End of input and no stop.
    End,
}

/// Incremental parser for a streamed completion.
///
/// Feed decoded text pieces with [`push`](Self::push) as they arrive (any split, even inside a
/// character sequence of a marker); each call returns the [`StreamEvent`]s that the new text
/// decides. Text that might be the start of a marker (`</think>`, `<｜DSML｜...`, EOS, or a special
/// token that would make the completion invalid) is held back until it is decided.
///
/// Events are provisional: once the text is known to be malformed no further events are
/// emitted, and [`finish`](Self::finish) — which parses the whole text with
/// [`parse_completion`] — is authoritative. For a completion that parses, the events concatenate
/// to its reasoning, content, tool-call names and arguments, once [`end_of_input`](Self::end_of_input)
/// has flushed what only the end of the text can decide (a tool-call block cut off right after a
/// complete call, which the reference accepts).
#[derive(Debug, Clone)]
pub struct StreamParser {
    mode: ThinkingMode,
    buf: String,
    state: State,
    /// Start of the current step (the reference's `index`).
    pos: usize,
    /// How far text of the current segment has been emitted.
    emitted: usize,
    /// Where the next search for a stop string starts.
    resume: usize,
    /// Number of tool calls started.
    calls: usize,
    /// Parameter names of the current call.
    params: Vec<String>,
    eof: bool,
}

/// Markers that content/reasoning text must not end with a prefix of before being emitted.
const TEXT_HOLD: [&str; 5] = FORBIDDEN_IN_TEXT;
/// What may follow a parameter value: the `<` that ends it, then `/｜DSML｜parameter`.
const VALUE_HOLD: [&str; 2] = ["</｜DSML｜parameter", "<\n/｜DSML｜parameter"];

impl StreamParser {
    /// A parser for a completion generated in `mode` (the text after the prompt's `<think>` or
    /// `</think>`).
    pub fn new(mode: ThinkingMode) -> Self {
        StreamParser {
            mode,
            buf: String::new(),
            state: match mode {
                ThinkingMode::Thinking => State::Reasoning,
                ThinkingMode::Chat => State::Content,
            },
            pos: 0,
            emitted: 0,
            resume: 0,
            calls: 0,
            params: Vec::new(),
            eof: false,
        }
    }

    /// Appends the next piece of generated text; returns the events it decides.
    ///
    /// After [`end_of_input`](Self::end_of_input), text is still recorded for
    /// [`finish`](Self::finish) but produces no events.
    pub fn push(&mut self, text: &str) -> Vec<StreamEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if !self.eof {
            self.step(&mut out);
        }
        out
    }

    /// Declares that no more text will come; returns the events that only the end of the text
    /// decides (empty for any completion that ends with EOS or `</｜DSML｜tool_calls>`).
    pub fn end_of_input(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if !self.eof {
            self.eof = true;
            self.step(&mut out);
        }
        out
    }

    /// All text pushed so far.
    pub fn text(&self) -> &str {
        &self.buf
    }

    /// Whether the text pushed so far can no longer parse (no more events will come).
    pub fn is_failed(&self) -> bool {
        self.state == State::Failed
    }

    /// The parsed message: exactly [`parse_completion`] of all text pushed (or its error).
    pub fn finish(self) -> Result<ParsedMessage, ChatError> {
        parse_completion(&self.buf, self.mode)
    }

    // -----------------------------------------------------------------------------------------

    fn step(&mut self, out: &mut Vec<StreamEvent>) {
        loop {
            let advanced = match self.state {
                State::Reasoning => self.step_text(true, out),
                State::Content => self.step_text(false, out),
                State::Calls => self.step_calls(),
                State::InvokeName => self.step_invoke_name(out),
                State::ParamHeader => self.step_param_header(out),
                State::ParamValue {
                    value_start,
                    is_str,
                } => self.step_param_value(value_start, is_str, out),
                State::AfterParam => self.step_after_param(out),
                State::AfterCalls => self.step_after_calls(),
                State::Done => {
                    if self.buf.len() > self.pos {
                        self.fail();
                    }
                    false
                }
                State::Failed => false,
            };
            if !advanced {
                break;
            }
        }
    }

    fn enter(&mut self, state: State, pos: usize) {
        self.state = state;
        self.pos = pos;
        self.emitted = pos;
        self.resume = pos;
    }

    fn fail(&mut self) -> bool {
        self.state = State::Failed;
        false
    }

    /// Looks for the earliest of `stops` in the current segment (starting at `seg`).
    fn scan(&mut self, seg: usize, stops: &[&'static str], hold: &[&str]) -> Scan {
        let buf = self.buf.as_str();
        let from = self.resume.max(seg);
        let mut best: Option<(usize, &'static str)> = None;
        for &s in stops {
            if let Some(p) = buf[from..].find(s) {
                let p = from + p;
                if best.is_none_or(|(bp, _)| p < bp) {
                    best = Some((p, s));
                }
            }
        }
        match best {
            Some((p, s)) => {
                // An earlier, longer stop may still be completing at the end of the buffer.
                let blocked = !self.eof && earliest_partial(buf, seg, stops).is_some_and(|q| q < p);
                if !blocked {
                    return Scan::Stop(p, s);
                }
            }
            None if self.eof => return Scan::End,
            None => {}
        }
        let safe = match (
            earliest_partial(buf, seg, stops),
            earliest_partial(buf, seg, hold),
        ) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(buf.len()),
        };
        let max_stop = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        self.resume = floor_boundary(buf, buf.len().saturating_sub(max_stop)).max(seg);
        Scan::Pending(safe)
    }

    /// Emits `buf[emitted..upto]` as reasoning or content, unless the segment so far contains a
    /// marker that makes the completion invalid.
    fn emit_text(&mut self, upto: usize, reasoning: bool, out: &mut Vec<StreamEvent>) -> bool {
        if upto <= self.emitted {
            return true;
        }
        let max_tok = FORBIDDEN_IN_TEXT.iter().map(|t| t.len()).max().unwrap_or(0);
        let window_start =
            floor_boundary(&self.buf, self.emitted.saturating_sub(max_tok)).max(self.pos);
        let window = &self.buf[window_start..upto];
        if FORBIDDEN_IN_TEXT.iter().any(|t| window.contains(t)) {
            return self.fail();
        }
        let piece = self.buf[self.emitted..upto].to_string();
        self.emitted = upto;
        push_event(
            out,
            if reasoning {
                StreamEvent::Reasoning(piece)
            } else {
                StreamEvent::Content(piece)
            },
        );
        true
    }

    fn step_text(&mut self, reasoning: bool, out: &mut Vec<StreamEvent>) -> bool {
        let stops: [&'static str; 2] = if reasoning {
            [THINK_END, TOOL_CALLS_START]
        } else {
            [EOS, TOOL_CALLS_START]
        };
        match self.scan(self.pos, &stops, &TEXT_HOLD) {
            Scan::Stop(p, s) => {
                if reasoning && s != THINK_END {
                    // A tool-call block before `</think>`.
                    return self.fail();
                }
                if !self.emit_text(p, reasoning, out) {
                    return false;
                }
                let next = p + s.len();
                match (reasoning, s) {
                    (true, THINK_END) => self.enter(State::Content, next),
                    (true, _) => return self.fail(),
                    (false, EOS) => self.enter(State::Done, next),
                    (false, _) => self.enter(State::Calls, next),
                }
                true
            }
            Scan::Pending(safe) => {
                self.emit_text(safe, reasoning, out);
                false
            }
            Scan::End => self.fail(),
        }
    }

    fn step_calls(&mut self) -> bool {
        if self.pos >= self.buf.len() {
            if self.eof {
                // `while index < len(text)` ends: the block is cut off after a complete call.
                self.enter(State::AfterCalls, self.pos);
                return true;
            }
            return false;
        }
        match self.scan(self.pos, &[INVOKE_OPEN, TOOL_CALLS_END], &[]) {
            Scan::Stop(p, s) => {
                if &self.buf[self.pos..p] != ">\n" {
                    return self.fail();
                }
                let state = if s == TOOL_CALLS_END {
                    State::AfterCalls
                } else {
                    State::InvokeName
                };
                self.enter(state, p + s.len());
                true
            }
            Scan::Pending(_) => {
                if !compatible(&self.buf[self.pos..], ">\n", &[INVOKE_OPEN, TOOL_CALLS_END]) {
                    self.fail();
                }
                false
            }
            Scan::End => self.fail(),
        }
    }

    fn start_call(&mut self, name: &str, out: &mut Vec<StreamEvent>) {
        self.params.clear();
        push_event(
            out,
            StreamEvent::ToolCallStart {
                index: self.calls,
                name: name.to_string(),
            },
        );
        self.push_args("{", out);
    }

    fn end_call(&mut self, out: &mut Vec<StreamEvent>) {
        self.push_args("}", out);
        push_event(out, StreamEvent::ToolCallEnd { index: self.calls });
        self.calls += 1;
    }

    fn push_args(&self, delta: &str, out: &mut Vec<StreamEvent>) {
        if !delta.is_empty() {
            push_event(
                out,
                StreamEvent::ToolCallArguments {
                    index: self.calls,
                    delta: delta.to_string(),
                },
            );
        }
    }

    fn push_value(&self, piece: &str, is_str: bool, out: &mut Vec<StreamEvent>) {
        if is_str {
            let mut s = String::with_capacity(piece.len());
            push_json_str_body(piece, &mut s);
            self.push_args(&s, out);
        } else {
            self.push_args(piece, out);
        }
    }

    fn step_invoke_name(&mut self, out: &mut Vec<StreamEvent>) -> bool {
        let (end, stop) = match self.scan(self.pos, &[PARAM_OPEN, INVOKE_CLOSE], &[]) {
            Scan::Stop(p, s) => (p, Some(s)),
            Scan::End => (self.buf.len(), None),
            Scan::Pending(_) => {
                let t = self.buf[self.pos..].trim_start_matches(pyjson::py_isspace);
                if !(t.starts_with("name=\"") || "name=\"".starts_with(t)) {
                    self.fail();
                }
                return false;
            }
        };
        let Some(name) = match_invoke_name(&self.buf[self.pos..end]).map(str::to_string) else {
            return self.fail();
        };
        self.start_call(&name, out);
        match stop {
            Some(PARAM_OPEN) => self.enter(State::ParamHeader, end + PARAM_OPEN.len()),
            Some(s) => {
                self.end_call(out);
                self.enter(State::Calls, end + s.len());
            }
            None => {
                self.end_call(out);
                self.enter(State::Calls, end);
            }
        }
        true
    }

    /// Emits the `"name": ` part of a parameter; fails on a repeated name.
    fn start_param(&mut self, name: &str, is_str: bool, out: &mut Vec<StreamEvent>) -> bool {
        if self.params.iter().any(|p| p == name) {
            return self.fail();
        }
        let mut delta = String::new();
        if !self.params.is_empty() {
            delta.push_str(", ");
        }
        delta.push_str(&arg_key_prefix(name, is_str));
        self.push_args(&delta, out);
        self.params.push(name.to_string());
        true
    }

    fn step_param_header(&mut self, out: &mut Vec<StreamEvent>) -> bool {
        const PREFIX: &str = " name=\"";
        match self.scan(self.pos, &[PARAM_CLOSE], &[]) {
            Scan::Stop(p, s) => {
                // The whole parameter arrived at once.
                let Some((name, is_str, value)) = match_param(&self.buf[self.pos..p]) else {
                    return self.fail();
                };
                let (name, value) = (name.to_string(), value.to_string());
                if !self.start_param(&name, is_str, out) {
                    return false;
                }
                self.push_value(&value, is_str, out);
                if is_str {
                    self.push_args("\"", out);
                }
                self.enter(State::AfterParam, p + s.len());
                true
            }
            Scan::End => self.fail(),
            Scan::Pending(_) => {
                let avail = &self.buf[self.pos..];
                if !(avail.starts_with(PREFIX) || PREFIX.starts_with(avail)) {
                    return self.fail();
                }
                if avail.len() < PREFIX.len() {
                    return false;
                }
                let Some((k, is_str, value_start)) =
                    find_param_header(&self.buf, self.pos + PREFIX.len())
                else {
                    return false;
                };
                let name = self.buf[self.pos + PREFIX.len()..k].to_string();
                if !self.start_param(&name, is_str, out) {
                    return false;
                }
                self.state = State::ParamValue {
                    value_start,
                    is_str,
                };
                self.emitted = value_start;
                self.resume = value_start;
                true
            }
        }
    }

    fn step_param_value(
        &mut self,
        value_start: usize,
        is_str: bool,
        out: &mut Vec<StreamEvent>,
    ) -> bool {
        match self.scan(value_start, &[PARAM_CLOSE], &VALUE_HOLD) {
            Scan::Stop(p, s) => {
                let text = &self.buf[self.pos..p];
                let Some((name, flag, value)) = match_param(text) else {
                    return self.fail();
                };
                let value_end = value_start + value.len();
                let consistent = flag == is_str
                    && self.params.last().is_some_and(|n| n == name)
                    && self.pos + (value.as_ptr() as usize - text.as_ptr() as usize) == value_start
                    && self.emitted <= value_end;
                if !consistent {
                    return self.fail();
                }
                let rest = self.buf[self.emitted..value_end].to_string();
                self.push_value(&rest, is_str, out);
                if is_str {
                    self.push_args("\"", out);
                }
                self.enter(State::AfterParam, p + s.len());
                true
            }
            Scan::Pending(safe) => {
                if safe > self.emitted {
                    let piece = self.buf[self.emitted..safe].to_string();
                    self.emitted = safe;
                    self.push_value(&piece, is_str, out);
                }
                false
            }
            Scan::End => self.fail(),
        }
    }

    fn step_after_param(&mut self, out: &mut Vec<StreamEvent>) -> bool {
        match self.scan(self.pos, &[PARAM_OPEN, INVOKE_CLOSE], &[]) {
            Scan::Stop(p, s) => {
                if &self.buf[self.pos..p] != ">\n" {
                    return self.fail();
                }
                if s == PARAM_OPEN {
                    self.enter(State::ParamHeader, p + s.len());
                } else {
                    self.end_call(out);
                    self.enter(State::Calls, p + s.len());
                }
                true
            }
            Scan::End => {
                if &self.buf[self.pos..] != ">\n" {
                    return self.fail();
                }
                self.end_call(out);
                self.enter(State::Calls, self.buf.len());
                true
            }
            Scan::Pending(_) => {
                if !compatible(&self.buf[self.pos..], ">\n", &[PARAM_OPEN, INVOKE_CLOSE]) {
                    self.fail();
                }
                false
            }
        }
    }

    fn step_after_calls(&mut self) -> bool {
        match self.scan(self.pos, &[EOS], &[]) {
            Scan::Stop(p, s) => {
                if p != self.pos {
                    return self.fail();
                }
                self.enter(State::Done, p + s.len());
                true
            }
            Scan::End => {
                if self.pos != self.buf.len() {
                    return self.fail();
                }
                self.enter(State::Done, self.pos);
                true
            }
            Scan::Pending(_) => {
                if !EOS.starts_with(&self.buf[self.pos..]) {
                    self.fail();
                }
                false
            }
        }
    }
}

/// Appends an event, merging it into the previous one when both are text of the same kind.
fn push_event(out: &mut Vec<StreamEvent>, ev: StreamEvent) {
    match (out.last_mut(), ev) {
        (Some(StreamEvent::Reasoning(a)), StreamEvent::Reasoning(b)) => a.push_str(&b),
        (Some(StreamEvent::Content(a)), StreamEvent::Content(b)) => a.push_str(&b),
        (
            Some(StreamEvent::ToolCallArguments { index: i, delta: a }),
            StreamEvent::ToolCallArguments { index: j, delta: b },
        ) if *i == j => a.push_str(&b),
        (_, ev) => out.push(ev),
    }
}

/// Whether `avail` (the text so far of a step that must read exactly `lead` and then one of
/// `next`) can still turn out well-formed.
fn compatible(avail: &str, lead: &str, next: &[&str]) -> bool {
    if lead.starts_with(avail) {
        return true;
    }
    match avail.strip_prefix(lead) {
        Some(rest) => next.iter().any(|n| n.starts_with(rest)),
        None => false,
    }
}

/// Largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Earliest position `q >= seg` where the rest of `buf` is a proper prefix of one of `toks`.
fn earliest_partial(buf: &str, seg: usize, toks: &[&str]) -> Option<usize> {
    let max_len = toks.iter().map(|t| t.len()).max()?;
    let lo = buf.len().saturating_sub(max_len.saturating_sub(1)).max(seg);
    (lo..buf.len())
        .filter(|&q| buf.is_char_boundary(q))
        .find(|&q| {
            let tail = &buf[q..];
            toks.iter()
                .any(|t| t.len() > tail.len() && t.starts_with(tail))
        })
}
