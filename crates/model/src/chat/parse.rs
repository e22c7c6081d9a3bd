//! Completion parsing: `parse_message_from_completion_text` (spec section 10).

use super::pyjson;
use super::{
    ChatError, ParsedMessage, ThinkingMode, ToolCall, BOS, DSML, EOS, THINK_END, THINK_START,
};

/// `"\n\n<｜DSML｜tool_calls"`: where a tool-call block starts (blank line required).
pub(crate) const TOOL_CALLS_START: &str = "\n\n<｜DSML｜tool_calls";
/// `</｜DSML｜tool_calls>`.
pub(crate) const TOOL_CALLS_END: &str = "</｜DSML｜tool_calls>";
/// `<｜DSML｜invoke`.
pub(crate) const INVOKE_OPEN: &str = "<｜DSML｜invoke";
/// `</｜DSML｜invoke` (the `>` is read as part of the following `>\n`).
pub(crate) const INVOKE_CLOSE: &str = "</｜DSML｜invoke";
/// `<｜DSML｜parameter`.
pub(crate) const PARAM_OPEN: &str = "<｜DSML｜parameter";
/// `/｜DSML｜parameter` (the `<` before it ends the value, the `>` after it starts `>\n`).
pub(crate) const PARAM_CLOSE: &str = "/｜DSML｜parameter";

/// Special tokens that content and reasoning must not contain, in the reference's check order.
pub(crate) const FORBIDDEN_IN_TEXT: [&str; 5] = [BOS, EOS, THINK_START, THINK_END, DSML];

/// `_read_until_stop`: from `index`, find the earliest of `stops` (the first listed wins a tie).
/// Returns the index after the stop (or the end of the text), the text before it, and which stop
/// was found.
fn read_until<'a>(
    text: &'a str,
    index: usize,
    stops: &[&'static str],
) -> (usize, &'a str, Option<&'static str>) {
    let rest = &text[index..];
    let mut best: Option<(usize, &'static str)> = None;
    for &s in stops {
        if let Some(p) = rest.find(s) {
            if best.is_none_or(|(bp, _)| p < bp) {
                best = Some((p, s));
            }
        }
    }
    match best {
        Some((p, s)) => (index + p + s.len(), &rest[..p], Some(s)),
        None => (text.len(), rest, None),
    }
}

/// The regex `^\s*name="(.*?)">\n$` (DOTALL) on the text of an `invoke` tag; returns the name.
///
/// Python's `$` also matches before a final newline, so both `name="x">\n` and
/// `name="x">\n\n` match.
pub(crate) fn match_invoke_name(s: &str) -> Option<&str> {
    let rest = s
        .trim_start_matches(pyjson::py_isspace)
        .strip_prefix("name=\"")?;
    rest.strip_suffix("\">\n")
        .or_else(|| rest.strip_suffix("\">\n\n"))
}

/// Where the value of a parameter tag ends: the position of the final `<` that the regex's
/// `<$` matches (the text ends with `<`, or with `<\n`).
pub(crate) fn param_value_end(s: &str) -> Option<usize> {
    if s.ends_with("<\n") {
        Some(s.len() - 2)
    } else if s.ends_with('<') {
        Some(s.len() - 1)
    } else {
        None
    }
}

/// First occurrence, at or after `from`, of `" string="true">` or `" string="false">`:
/// returns its position, the flag and the position after it.
pub(crate) fn find_param_header(s: &str, from: usize) -> Option<(usize, bool, usize)> {
    const LEAD: &str = "\" string=\"";
    let mut at = from;
    while let Some(p) = s.get(at..).and_then(|r| r.find(LEAD)) {
        let k = at + p;
        let after = &s[k + LEAD.len()..];
        if after.starts_with("true\">") {
            return Some((k, true, k + LEAD.len() + 6));
        }
        if after.starts_with("false\">") {
            return Some((k, false, k + LEAD.len() + 7));
        }
        // `LEAD` can overlap itself (it starts and ends with `"`), so step by one byte only.
        at = k + 1;
    }
    None
}

/// The regex `^ name="(.*?)" string="(true|false)">(.*?)<$` (DOTALL) on the text of a parameter
/// tag; returns `(name, is_string, value)`.
pub(crate) fn match_param(s: &str) -> Option<(&str, bool, &str)> {
    const PREFIX: &str = " name=\"";
    if !s.starts_with(PREFIX) {
        return None;
    }
    let end = param_value_end(s)?;
    let (k, is_str, value_start) = find_param_header(s, PREFIX.len())?;
    // The lazy name group takes the first header; a later one could only leave less room.
    if value_start > end {
        return None;
    }
    Some((&s[PREFIX.len()..k], is_str, &s[value_start..end]))
}

/// Builds the arguments text as `decode_dsml_to_arguments` does.
pub(crate) fn arguments_text(params: &[(String, bool, String)]) -> String {
    let mut out = String::from("{");
    for (i, (name, is_str, value)) in params.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&arg_key_prefix(name, *is_str));
        if *is_str {
            pyjson::push_json_str_body(value, &mut out);
            out.push('"');
        } else {
            out.push_str(value);
        }
    }
    out.push('}');
    out
}

/// `"name": ` (plus the opening quote of a string value).
pub(crate) fn arg_key_prefix(name: &str, is_str: bool) -> String {
    let mut s = pyjson::json_str(name);
    s.push_str(": ");
    if is_str {
        s.push('"');
    }
    s
}

/// `parse_tool_calls`: parses the block after `"\n\n<｜DSML｜tool_calls"`; returns the index
/// reached and the calls.
fn parse_tool_calls(text: &str, mut index: usize) -> Result<(usize, Vec<ToolCall>), ChatError> {
    let mut calls = Vec::new();
    while index < text.len() {
        let (next, between, stop) = read_until(text, index, &[INVOKE_OPEN, TOOL_CALLS_END]);
        index = next;
        if between != ">\n" {
            return Err(ChatError::ToolCallFormat(between.to_string()));
        }
        match stop {
            Some(TOOL_CALLS_END) => break,
            None => return Err(ChatError::MissingToolCallToken),
            _ => {}
        }

        let (next, name_text, mut stop) = read_until(text, index, &[PARAM_OPEN, INVOKE_CLOSE]);
        index = next;
        let name = match_invoke_name(name_text)
            .ok_or_else(|| ChatError::ToolNameFormat(name_text.to_string()))?;

        let mut params: Vec<(String, bool, String)> = Vec::new();
        while stop == Some(PARAM_OPEN) {
            let (next, param_text, _) = read_until(text, index, &[PARAM_CLOSE]);
            index = next;
            let (pname, is_str, value) = match_param(param_text)
                .ok_or_else(|| ChatError::ParameterFormat(param_text.to_string()))?;
            if params.iter().any(|(n, _, _)| n == pname) {
                return Err(ChatError::DuplicateParameter(pname.to_string()));
            }
            params.push((pname.to_string(), is_str, value.to_string()));

            let (next, after, s) = read_until(text, index, &[PARAM_OPEN, INVOKE_CLOSE]);
            index = next;
            stop = s;
            if after != ">\n" {
                return Err(ChatError::ParameterFormat(after.to_string()));
            }
        }
        calls.push(ToolCall {
            name: name.to_string(),
            arguments: arguments_text(&params),
        });
    }
    Ok((index, calls))
}

/// Parses a model completion (the generated text after the prompt's `<think>` or `</think>`,
/// normally ending with EOS) into reasoning, content and tool calls, exactly as DeepSeek's
/// `parse_message_from_completion_text` does, and rejects every text it rejects.
///
/// Content and reasoning are returned untrimmed. Tool-call `arguments` are the text the reference
/// builds (see [`ToolCall::arguments`]).
pub fn parse_completion(text: &str, mode: ThinkingMode) -> Result<ParsedMessage, ChatError> {
    let mut index = 0;
    let mut reasoning = "";
    if mode == ThinkingMode::Thinking {
        let (next, r, stop) = read_until(text, 0, &[THINK_END, TOOL_CALLS_START]);
        if stop != Some(THINK_END) {
            return Err(ChatError::MissingThinkEnd);
        }
        index = next;
        reasoning = r;
    }

    let (next, content, stop) = read_until(text, index, &[EOS, TOOL_CALLS_START]);
    index = next;
    let mut tool_calls = Vec::new();
    match stop {
        Some(TOOL_CALLS_START) => {
            let (next, calls) = parse_tool_calls(text, index)?;
            tool_calls = calls;
            let (next, tail, _) = read_until(text, next, &[EOS]);
            if !tail.is_empty() {
                return Err(ChatError::ContentAfterToolCalls);
            }
            index = next;
        }
        Some(_) => {}
        None => return Err(ChatError::MissingEos),
    }
    if index != text.len() {
        return Err(ChatError::ContentAfterEos);
    }

    for tok in FORBIDDEN_IN_TEXT {
        if content.contains(tok) || reasoning.contains(tok) {
            return Err(ChatError::SpecialTokenInContent(tok));
        }
    }

    Ok(ParsedMessage {
        content: content.to_string(),
        reasoning_content: reasoning.to_string(),
        tool_calls,
    })
}
