//! Prompt rendering: `encode_messages` and its preprocessing steps (spec sections 2–9).
//!
//! Messages are handled as JSON objects throughout, the way the reference handles Python dicts,
//! so that every field it reads is read with the same semantics (`dict.get`, truthiness, `==`).

use serde_json::{Map, Value};

use super::pyjson::{self, LoadsError, PyValue};
use super::{
    ChatError, EncodeOptions, ReasoningEffort, ThinkingMode, ASSISTANT, BOS, DSML, EOS,
    LATEST_REMINDER, REASONING_EFFORT_MAX_PREFIX, TASK_TOKENS, THINK_END, THINK_START, USER,
};

/// Messages (and context messages) nested deeper than this many containers, the message object
/// itself included, are rejected: the reference deep-copies every message and Python's
/// recursion limit stops it at about this depth.
pub const MAX_MESSAGE_DEPTH: usize = 497;

type Msg = Map<String, Value>;

/// Text of the tools block before the schema lines (protocol constant, spec section 5.7).
const TOOLS_BLOCK_HEAD: &str = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";

/// Text of the tools block after the schema lines (protocol constant, spec section 5.7).
const TOOLS_BLOCK_TAIL: &str =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/// Head of the response-format block (protocol constant, spec section 5.8).
const RESPONSE_FORMAT_HEAD: &str =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/// Encodes a conversation into the DeepSeek-V4 prompt string.
///
/// `messages` are OpenAI-style JSON objects with roles `system`, `developer`, `user`,
/// `assistant`, `tool` and `latest_reminder`; the fields read are `role`, `content`,
/// `reasoning_content`, `tool_calls` (`[{"id", "type", "function": {"name", "arguments"}}]`,
/// `arguments` normally a JSON string), `tool_call_id`, `tools` and `response_format` (on
/// `system`/`developer`), `task` and `wo_eos`. Tools are declared by a `tools` field on a
/// `system` (or `developer`) message.
///
/// The output is byte-for-byte what DeepSeek's `encode_messages` returns for the same arguments;
/// whenever the reference raises, this returns an error.
pub fn encode_messages(messages: &[Value], opts: &EncodeOptions) -> Result<String, ChatError> {
    let mode = opts.thinking_mode;
    let raw_context: &[Value] = opts.context.as_deref().unwrap_or(&[]);

    // Preprocess: merge tool messages, then order tool results using the (unmerged) context too.
    let merged = merge_tool_messages(messages)?;
    let mut combined: Vec<Msg> = Vec::with_capacity(raw_context.len() + merged.len());
    for (i, m) in raw_context.iter().enumerate() {
        combined.push(as_message(m, "context message", i)?.clone());
    }
    combined.extend(merged);
    sort_tool_results_by_call_order(&mut combined)?;
    let messages = combined.split_off(raw_context.len());

    let context = if raw_context.is_empty() {
        Vec::new()
    } else {
        let mut c = merge_tool_messages(raw_context)?;
        sort_tool_results_by_call_order(&mut c)?;
        c
    };

    let mut prompt = String::new();
    if opts.add_default_bos_token && context.is_empty() {
        prompt.push_str(BOS);
    }

    let mut full: Vec<Msg> = context.clone();
    full.extend(messages.iter().cloned());

    let drop_thinking = opts.drop_thinking && !full.iter().any(|m| truthy(get(m, "tools")));

    let (full, context_len, num_to_render) = if mode == ThinkingMode::Thinking && drop_thinking {
        let full = drop_thinking_messages(&full)?;
        let context_len = drop_thinking_messages(&context)?.len();
        let num = full.len() as isize - context_len as isize;
        (full, context_len, num)
    } else {
        let num = messages.len() as isize;
        (full, context.len(), num)
    };

    for idx in 0..num_to_render.max(0) as usize {
        let r = Renderer {
            messages: &full,
            mode,
            drop_thinking,
            effort: opts.reasoning_effort,
        };
        r.render(idx + context_len, &mut prompt)?;
    }
    Ok(prompt)
}

// ---------------------------------------------------------------------------------------------
// Python dict helpers
// ---------------------------------------------------------------------------------------------

/// `dict.get(key)`: `None` for an absent key or a JSON `null`.
fn get<'a>(m: &'a Msg, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

/// `dict.get("role")` as a string, when it is one.
fn role_of(m: &Msg) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// Python truthiness of an optional value (`None` is falsy).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => match pyjson::number_to_py(n) {
            PyValue::Int(d) => d != "0",
            PyValue::Float(f) => f != 0.0,
            _ => true,
        },
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// Short description of a value's Python type, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "None",
        Value::Bool(_) => "bool",
        Value::Number(n) => match pyjson::number_to_py(n) {
            PyValue::Int(_) => "int",
            _ => "float",
        },
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Whether `v` has more than `limit` levels of containers.
fn deeper_than(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit == 0 || a.iter().any(|x| deeper_than(x, limit - 1)),
        Value::Object(o) => limit == 0 || o.values().any(|x| deeper_than(x, limit - 1)),
        _ => false,
    }
}

fn as_message<'a>(v: &'a Value, what: &str, index: usize) -> Result<&'a Msg, ChatError> {
    v.as_object().ok_or_else(|| {
        ChatError::InvalidMessage(format!("{what} {index} is a {}, not an object", kind(v)))
    })
}

/// A value usable as a Python dict key (`hash()` must succeed): comparison key with Python's
/// equality (`1 == 1.0 == True`, `NaN` never equal).
#[derive(Debug, Clone, PartialEq)]
enum PyKey {
    None,
    Str(String),
    /// An integer-valued number (int, bool or integral float), as canonical decimal text.
    Integral(String),
    /// A non-integral or infinite float, by bit pattern.
    Float(u64),
    /// NaN: equal to nothing.
    Nan,
}

impl PyKey {
    fn from_value(v: &Value, what: &str) -> Result<PyKey, ChatError> {
        Ok(match v {
            Value::Null => PyKey::None,
            Value::Bool(b) => PyKey::Integral(if *b { "1" } else { "0" }.to_string()),
            Value::String(s) => PyKey::Str(s.clone()),
            Value::Number(n) => match pyjson::number_to_py(n) {
                PyValue::Int(d) => PyKey::Integral(d),
                PyValue::Float(f) if f.is_nan() => PyKey::Nan,
                PyValue::Float(f) if f.is_finite() && f.fract() == 0.0 => {
                    // Exact decimal expansion of an integral double.
                    let text = format!("{:.0}", f.abs());
                    PyKey::Integral(if f < 0.0 && text != "0" {
                        format!("-{text}")
                    } else {
                        text
                    })
                }
                PyValue::Float(f) => PyKey::Float(f.to_bits()),
                _ => PyKey::Nan,
            },
            Value::Array(_) | Value::Object(_) => {
                return Err(ChatError::InvalidMessage(format!(
                    "{what} must be hashable, got a {}",
                    kind(v)
                )))
            }
        })
    }

    fn matches(&self, other: &PyKey) -> bool {
        !matches!(self, PyKey::Nan) && self == other
    }
}

// ---------------------------------------------------------------------------------------------
// Preprocessing
// ---------------------------------------------------------------------------------------------

/// `merge_tool_messages`: tool results become `tool_result` blocks of user turns, user contents
/// become `text` blocks; consecutive ones are merged into one user turn (spec section 3.1).
fn merge_tool_messages(messages: &[Value]) -> Result<Vec<Msg>, ChatError> {
    let mut merged: Vec<Msg> = Vec::with_capacity(messages.len());
    for (i, v) in messages.iter().enumerate() {
        let msg = as_message(v, "message", i)?;
        if deeper_than(v, MAX_MESSAGE_DEPTH) {
            return Err(ChatError::Unrepresentable(format!(
                "message {i} is nested more than {MAX_MESSAGE_DEPTH} levels deep"
            )));
        }
        let last_is_user_blocks = merged
            .last()
            .is_some_and(|m| role_of(m) == Some("user") && m.contains_key("content_blocks"));
        match role_of(msg) {
            Some("tool") => {
                let mut block = Map::new();
                block.insert("type".into(), Value::from("tool_result"));
                block.insert(
                    "tool_use_id".into(),
                    msg.get("tool_call_id")
                        .cloned()
                        .unwrap_or_else(|| Value::from("")),
                );
                block.insert(
                    "content".into(),
                    msg.get("content")
                        .cloned()
                        .unwrap_or_else(|| Value::from("")),
                );
                if last_is_user_blocks {
                    push_block(merged.last_mut(), block)?;
                } else {
                    let mut m = Map::new();
                    m.insert("role".into(), Value::from("user"));
                    m.insert(
                        "content_blocks".into(),
                        Value::Array(vec![Value::Object(block)]),
                    );
                    merged.push(m);
                }
            }
            Some("user") => {
                let content = msg
                    .get("content")
                    .cloned()
                    .unwrap_or_else(|| Value::from(""));
                let mut block = Map::new();
                block.insert("type".into(), Value::from("text"));
                block.insert("text".into(), content.clone());
                let last_has_task = merged.last().is_some_and(|m| get(m, "task").is_some());
                if last_is_user_blocks && !last_has_task {
                    push_block(merged.last_mut(), block)?;
                } else {
                    let mut m = Map::new();
                    m.insert("role".into(), Value::from("user"));
                    m.insert("content".into(), content);
                    m.insert(
                        "content_blocks".into(),
                        Value::Array(vec![Value::Object(block)]),
                    );
                    for key in ["task", "wo_eos", "mask"] {
                        if let Some(x) = msg.get(key) {
                            m.insert(key.into(), x.clone());
                        }
                    }
                    merged.push(m);
                }
            }
            _ => merged.push(msg.clone()),
        }
    }
    Ok(merged)
}

fn push_block(last: Option<&mut Msg>, block: Msg) -> Result<(), ChatError> {
    match last.and_then(|m| m.get_mut("content_blocks")) {
        Some(Value::Array(blocks)) => {
            blocks.push(Value::Object(block));
            Ok(())
        }
        _ => Err(ChatError::InvalidMessage(
            "user message content_blocks is not a list".into(),
        )),
    }
}

/// `sort_tool_results_by_call_order`: within each user turn, tool results are stably sorted by
/// the position of their call in the latest assistant message with tool calls (spec 3.2).
fn sort_tool_results_by_call_order(messages: &mut [Msg]) -> Result<(), ChatError> {
    // Python dict `tool_call id -> position`, insertion-ordered, later assignments win.
    let mut order: Vec<(PyKey, usize)> = Vec::new();
    for msg in messages.iter_mut() {
        let role = role_of(msg);
        if role == Some("assistant") && truthy(get(msg, "tool_calls")) {
            order.clear();
            let calls = list_of_objects(get(msg, "tool_calls"), "tool_calls")?;
            for (idx, tc) in calls.into_iter().enumerate() {
                let id = match get(tc, "id") {
                    Some(id) if truthy(Some(id)) => Some(id),
                    _ => match tc.get("function") {
                        None => None,
                        Some(Value::Object(f)) => f.get("id"),
                        Some(other) => {
                            return Err(ChatError::InvalidMessage(format!(
                                "tool call function is a {}, not an object",
                                kind(other)
                            )))
                        }
                    },
                };
                if let Some(id) = id.filter(|v| truthy(Some(v))) {
                    let key = PyKey::from_value(id, "tool call id")?;
                    match order.iter_mut().find(|(k, _)| k.matches(&key)) {
                        Some(slot) => slot.1 = idx,
                        None => order.push((key, idx)),
                    }
                }
            }
        } else if role == Some("user") && truthy(get(msg, "content_blocks")) {
            let blocks = list_of_objects(get(msg, "content_blocks"), "content_blocks")?;
            let slots: Vec<usize> = blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                .map(|(i, _)| i)
                .collect();
            if slots.len() > 1 && !order.is_empty() {
                let mut keyed: Vec<(usize, usize)> = Vec::with_capacity(slots.len());
                for &slot in &slots {
                    let id = blocks[slot]
                        .get("tool_use_id")
                        .cloned()
                        .unwrap_or_else(|| Value::from(""));
                    let key = PyKey::from_value(&id, "tool_use_id")?;
                    let pos = order
                        .iter()
                        .find(|(k, _)| k.matches(&key))
                        .map_or(0, |(_, p)| *p);
                    keyed.push((pos, slot));
                }
                keyed.sort_by_key(|&(pos, _)| pos); // stable
                let sorted: Vec<Value> = keyed
                    .iter()
                    .map(|&(_, slot)| Value::Object(blocks[slot].clone()))
                    .collect();
                if let Some(Value::Array(arr)) = msg.get_mut("content_blocks") {
                    for (slot, block) in slots.iter().zip(sorted) {
                        arr[*slot] = block;
                    }
                }
            }
        }
    }
    Ok(())
}

/// A truthy value the reference iterates and calls `.get` on: must be a list of objects.
fn list_of_objects<'a>(v: Option<&'a Value>, what: &str) -> Result<Vec<&'a Msg>, ChatError> {
    match v {
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| {
                x.as_object().ok_or_else(|| {
                    ChatError::InvalidMessage(format!(
                        "{what} entries must be objects, got a {}",
                        kind(x)
                    ))
                })
            })
            .collect(),
        Some(other) => Err(ChatError::InvalidMessage(format!(
            "{what} must be a list, got a {}",
            kind(other)
        ))),
        None => Ok(Vec::new()),
    }
}

/// `find_last_user_index`: index of the last `user` or `developer` message, or -1.
fn find_last_user_index(messages: &[Msg]) -> isize {
    messages
        .iter()
        .rposition(|m| matches!(role_of(m), Some("user" | "developer")))
        .map_or(-1, |i| i as isize)
}

/// `_drop_thinking_messages` (spec 3.4): before the last user/developer message, assistant turns
/// lose their reasoning and messages of other roles than user/system/tool/latest_reminder/
/// direct_search_results are removed.
fn drop_thinking_messages(messages: &[Msg]) -> Result<Vec<Msg>, ChatError> {
    let last_user = find_last_user_index(messages);
    let mut out = Vec::with_capacity(messages.len());
    for (idx, msg) in messages.iter().enumerate() {
        let role = msg.get("role");
        if let Some(v @ (Value::Array(_) | Value::Object(_))) = role {
            return Err(ChatError::InvalidMessage(format!(
                "role must be hashable, got a {}",
                kind(v)
            )));
        }
        let role = role.and_then(Value::as_str);
        let keep = matches!(
            role,
            Some("user" | "system" | "tool" | "latest_reminder" | "direct_search_results")
        );
        if keep || idx as isize >= last_user {
            out.push(msg.clone());
        } else if role == Some("assistant") {
            let mut m = msg.clone();
            m.shift_remove("reasoning_content");
            out.push(m);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

struct Renderer<'a> {
    messages: &'a [Msg],
    mode: ThinkingMode,
    drop_thinking: bool,
    effort: Option<ReasoningEffort>,
}

/// One tool call as `tool_calls_from_openai_format` extracts it.
struct CallRef<'a> {
    name: &'a Value,
    arguments: &'a Value,
}

impl Renderer<'_> {
    /// `render_message(index, ...)`, appended to `out`.
    fn render(&self, index: usize, out: &mut String) -> Result<(), ChatError> {
        let msgs = self.messages;
        let msg = &msgs[index];
        let thinking = self.mode == ThinkingMode::Thinking;
        let last_user = find_last_user_index(msgs);

        let role = msg.get("role");
        let content = get(msg, "content");
        let response_format = get(msg, "response_format");

        // Both conversions run for every role, as in the reference.
        let tools = if truthy(get(msg, "tools")) {
            tool_functions(get(msg, "tools"))?
        } else {
            Vec::new()
        };
        let tool_calls = if truthy(get(msg, "tool_calls")) {
            tool_call_refs(get(msg, "tool_calls"))?
        } else {
            Vec::new()
        };

        if index == 0 && thinking && self.effort == Some(ReasoningEffort::Max) {
            out.push_str(REASONING_EFFORT_MAX_PREFIX);
        }

        match role.and_then(Value::as_str) {
            Some("system") => {
                if truthy(content) {
                    out.push_str(&pyjson::value_py_str(content)?);
                }
                push_tools_and_format(out, &tools, response_format)?;
            }
            Some("developer") => {
                if !truthy(content) {
                    return Err(ChatError::EmptyDeveloperContent);
                }
                let Some(Value::String(text)) = content else {
                    return Err(ChatError::InvalidMessage(format!(
                        "developer content must be a string, got a {}",
                        content.map_or("None", kind)
                    )));
                };
                out.push_str(USER);
                out.push_str(text);
                push_tools_and_format(out, &tools, response_format)?;
            }
            Some("user") => {
                out.push_str(USER);
                if truthy(get(msg, "content_blocks")) {
                    out.push_str(&render_user_blocks(get(msg, "content_blocks"))?);
                } else if truthy(content) {
                    match content {
                        Some(Value::String(s)) => out.push_str(s),
                        Some(other) => {
                            return Err(ChatError::InvalidMessage(format!(
                                "user content must be a string, got a {}",
                                kind(other)
                            )))
                        }
                        None => {}
                    }
                }
            }
            Some("latest_reminder") => {
                out.push_str(LATEST_REMINDER);
                out.push_str(&pyjson::value_py_str(content)?);
            }
            Some("tool") => {
                return Err(ChatError::InvalidMessage(
                    "tool message left unmerged".to_string(),
                ))
            }
            Some("assistant") => {
                let mut tc_content = String::new();
                if !tool_calls.is_empty() {
                    let mut invokes = Vec::with_capacity(tool_calls.len());
                    for call in &tool_calls {
                        let name = pyjson::value_py_str(Some(call.name))?;
                        let params = encode_arguments_to_dsml(call.arguments)?;
                        invokes.push(format!(
                            "<{DSML}invoke name=\"{name}\">\n{params}\n</{DSML}invoke>"
                        ));
                    }
                    tc_content = format!(
                        "\n\n<{DSML}tool_calls>\n{}\n</{DSML}tool_calls>",
                        invokes.join("\n")
                    );
                }
                let summary = if truthy(content) {
                    pyjson::value_py_str(content)?
                } else {
                    String::new()
                };
                let reasoning = get(msg, "reasoning_content");
                let reasoning = if truthy(reasoning) {
                    pyjson::value_py_str(reasoning)?
                } else {
                    String::new()
                };

                let prev_has_task = index > 0 && get(&msgs[index - 1], "task").is_some();
                if thinking && !prev_has_task && (!self.drop_thinking || index as isize > last_user)
                {
                    out.push_str(&reasoning);
                    out.push_str(THINK_END);
                }
                out.push_str(&summary);
                out.push_str(&tc_content);
                if !truthy(msg.get("wo_eos")) {
                    out.push_str(EOS);
                }
            }
            _ => {
                let name = match role {
                    None => "None".to_string(),
                    Some(v) => pyjson::value_py_str(Some(v))?,
                };
                return Err(ChatError::UnknownRole(name));
            }
        }

        // Transition: assistant prefix or task token, unless another turn follows directly.
        if let Some(next) = msgs.get(index + 1) {
            if !matches!(role_of(next), Some("assistant" | "latest_reminder")) {
                return Ok(());
            }
        }
        if let Some(task) = get(msg, "task") {
            let token = match task {
                Value::String(t) => TASK_TOKENS
                    .iter()
                    .find(|(name, _)| name == t)
                    .map(|(_, tok)| *tok),
                _ => None,
            };
            let Some(token) = token else {
                return Err(ChatError::InvalidTask(pyjson::value_py_str(Some(task))?));
            };
            if task.as_str() == Some("action") {
                out.push_str(ASSISTANT);
                out.push_str(if thinking { THINK_START } else { THINK_END });
            }
            out.push_str(token);
        } else if matches!(role.and_then(Value::as_str), Some("user" | "developer")) {
            out.push_str(ASSISTANT);
            if thinking && (!self.drop_thinking || index as isize >= last_user) {
                out.push_str(THINK_START);
            } else {
                out.push_str(THINK_END);
            }
        }
        Ok(())
    }
}

/// `tools_from_openai_format`: `[tool["function"] for tool in tools]`.
fn tool_functions(tools: Option<&Value>) -> Result<Vec<&Value>, ChatError> {
    list_of_objects(tools, "tools")?
        .into_iter()
        .map(|t| {
            t.get("function").ok_or_else(|| {
                ChatError::InvalidMessage("tool declaration without a `function` key".into())
            })
        })
        .collect()
}

/// `tool_calls_from_openai_format`: `function.name` and `function.arguments` of every call.
fn tool_call_refs(calls: Option<&Value>) -> Result<Vec<CallRef<'_>>, ChatError> {
    list_of_objects(calls, "tool_calls")?
        .into_iter()
        .map(|tc| {
            let f = match tc.get("function") {
                Some(Value::Object(f)) => f,
                Some(other) => {
                    return Err(ChatError::InvalidMessage(format!(
                        "tool call function is a {}, not an object",
                        kind(other)
                    )))
                }
                None => {
                    return Err(ChatError::InvalidMessage(
                        "tool call without `function`".into(),
                    ))
                }
            };
            match (f.get("name"), f.get("arguments")) {
                (Some(name), Some(arguments)) => Ok(CallRef { name, arguments }),
                _ => Err(ChatError::InvalidMessage(
                    "tool call function needs `name` and `arguments`".into(),
                )),
            }
        })
        .collect()
}

/// Appends the tools block and the response-format block of a system/developer message.
fn push_tools_and_format(
    out: &mut String,
    tools: &[&Value],
    response_format: Option<&Value>,
) -> Result<(), ChatError> {
    if !tools.is_empty() {
        let schemas = tools
            .iter()
            .map(|t| pyjson::value_to_json(t))
            .collect::<Result<Vec<_>, _>>()?;
        out.push_str("\n\n");
        out.push_str(TOOLS_BLOCK_HEAD);
        out.push_str(&schemas.join("\n"));
        out.push_str(TOOLS_BLOCK_TAIL);
    }
    if let Some(rf) = response_format.filter(|v| truthy(Some(v))) {
        out.push_str("\n\n");
        out.push_str(RESPONSE_FORMAT_HEAD);
        out.push_str(&pyjson::value_to_json(rf)?);
    }
    Ok(())
}

fn require_str<'a>(
    v: Option<&'a Value>,
    absent: &'a str,
    what: &str,
) -> Result<&'a str, ChatError> {
    match v {
        None => Ok(absent),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ChatError::InvalidMessage(format!(
            "{what} must be a string, got a {}",
            kind(other)
        ))),
    }
}

/// The body of a merged user turn: blocks joined with a blank line.
fn render_user_blocks(blocks: Option<&Value>) -> Result<String, ChatError> {
    let mut parts: Vec<String> = Vec::new();
    for block in list_of_objects(blocks, "content_blocks")? {
        let block_type = block.get("type");
        match block_type.and_then(Value::as_str) {
            Some("text") => {
                parts.push(require_str(block.get("text"), "", "user content")?.to_string());
            }
            Some("tool_result") => {
                let content = block.get("content");
                let text = match content {
                    Some(Value::Array(items)) => {
                        let mut sub: Vec<String> = Vec::with_capacity(items.len());
                        for item in items {
                            let Some(item) = item.as_object() else {
                                return Err(ChatError::InvalidMessage(format!(
                                    "tool result parts must be objects, got a {}",
                                    kind(item)
                                )));
                            };
                            let part_type = item.get("type");
                            if part_type.and_then(Value::as_str) == Some("text") {
                                sub.push(
                                    require_str(item.get("text"), "", "tool result text")?
                                        .to_string(),
                                );
                            } else {
                                sub.push(format!(
                                    "[Unsupported {}]",
                                    pyjson::value_py_str(part_type)?
                                ));
                            }
                        }
                        sub.join("\n\n")
                    }
                    None => String::new(),
                    Some(other) => pyjson::value_py_str(Some(other))?,
                };
                parts.push(format!("<tool_result>{text}</tool_result>"));
            }
            _ => parts.push(format!(
                "[Unsupported {}]",
                pyjson::value_py_str(block_type)?
            )),
        }
    }
    Ok(parts.join("\n\n"))
}

/// `encode_arguments_to_dsml`: one `parameter` line per argument (spec section 7).
fn encode_arguments_to_dsml(arguments: &Value) -> Result<String, ChatError> {
    let fallback = || -> Result<Vec<(String, PyValue)>, ChatError> {
        Ok(vec![(
            "arguments".to_string(),
            PyValue::from_json(arguments)?,
        )])
    };
    let items = match arguments {
        Value::String(text) => match pyjson::loads(text) {
            Ok(PyValue::Dict(items)) => items,
            Ok(other) => {
                let what = match other {
                    PyValue::None => "None",
                    PyValue::Bool(_) => "a bool",
                    PyValue::Int(_) => "an int",
                    PyValue::Float(_) => "a float",
                    PyValue::Str(_) => "a string",
                    PyValue::List(_) => "a list",
                    PyValue::Dict(_) => "a dict",
                };
                return Err(ChatError::ToolArgumentsNotObject(what.to_string()));
            }
            Err(LoadsError::Invalid) => fallback()?,
            Err(LoadsError::LoneSurrogate) => {
                return Err(ChatError::Unrepresentable(
                    "tool call arguments contain a lone surrogate escape".to_string(),
                ))
            }
        },
        _ => fallback()?,
    };
    let mut lines = Vec::with_capacity(items.len());
    for (key, value) in &items {
        let (is_str, text) = match value {
            PyValue::Str(s) => ("true", s.clone()),
            other => ("false", pyjson::to_json(other)?),
        };
        lines.push(format!(
            "<{DSML}parameter name=\"{key}\" string=\"{is_str}\">{text}</{DSML}parameter>"
        ));
    }
    Ok(lines.join("\n"))
}
