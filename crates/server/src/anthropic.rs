//! Anthropic-compatible endpoints: `POST /v1/messages`, `POST /v1/messages/count_tokens`.

use crate::assemble::{Assembler, Delta, Message};
use crate::common::*;
use crate::error::{ApiError, Failure, Flavor};
use crate::openai::sse_response;
use crate::scheduler::{Event, FinishReason, Usage};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashseek_model::chat::{ReasoningEffort, ThinkingMode};
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Instant;

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: String,
    max_tokens: Option<i64>,
    messages: Vec<Value>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    thinking: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    ignore_eos: Option<bool>,
    output_config: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CountRequest {
    model: String,
    messages: Vec<Value>,
    system: Option<Value>,
    thinking: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    output_config: Option<Value>,
}

fn fail(e: ApiError) -> Response {
    Failure(e, Flavor::Anthropic).into_response()
}

/// The call an (already checked) Anthropic `tool_choice` forces: type `any` any tool, type `tool`
/// the named one; `auto`, `none` and no choice force nothing.
fn forced_call<'a>(choice: Option<&'a Value>, names: &'a [String]) -> Option<ForcedCall<'a>> {
    let c = choice?;
    match c.get("type").and_then(Value::as_str)? {
        "any" => Some(ForcedCall::Any(names)),
        "tool" => c.get("name").and_then(Value::as_str).map(ForcedCall::Named),
        _ => None,
    }
}

/// Anthropic tools → OpenAI function declarations.
fn tools_to_openai(tools: Vec<Value>, choice: Option<&Value>) -> Result<Option<Vec<Value>>, ApiError> {
    let mut none = false;
    match choice {
        None | Some(Value::Null) => {}
        Some(c) => match c.get("type").and_then(Value::as_str) {
            // The tools are still checked (as Anthropic's API does), then left out of the prompt.
            Some("none") => none = true,
            Some("auto") | Some("any") => {}
            Some("tool") => {
                let Some(name) = c.get("name").and_then(Value::as_str) else {
                    return Err(ApiError::field("tool_choice.name", "`tool_choice` of type tool needs the tool's `name`."));
                };
                // As Anthropic's API: the named tool must be one of `tools`.
                if !tools.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(name)) {
                    return Err(ApiError::field("tool_choice.name", format!("`tool_choice` names the tool `{name}`, which is not among `tools`.")));
                }
            }
            _ => return Err(ApiError::field("tool_choice", "`tool_choice.type` must be auto, any, tool (with name) or none.")),
        },
    }
    if tools.is_empty() {
        // As Anthropic's API: a tool use can be required only where tools are declared.
        if choice.and_then(|c| c.get("type")).and_then(Value::as_str).is_some_and(|t| t == "any" || t == "tool") {
            return Err(ApiError::field("tool_choice", "`tool_choice` of type any or tool needs `tools` to declare at least one tool."));
        }
        return Ok(None);
    }
    let mut out = Vec::with_capacity(tools.len());
    let mut seen = std::collections::HashSet::new();
    for (i, t) in tools.iter().enumerate() {
        if !t.is_object() {
            return Err(ApiError::field(&format!("tools[{i}]"), format!("Each tool must be an object; got {}.", json_kind(t))));
        }
        if let Some(ty) = t.get("type").and_then(Value::as_str) {
            if ty != "custom" {
                return Err(ApiError::field(&format!("tools[{i}].type"), format!("Tools of type `{ty}` are not supported (custom tools only).")));
            }
        }
        // Unique, as Anthropic's API wants ("tools: Tool names must be unique.").
        let name = tool_name(t.get("name"), &mut seen, &format!("tools[{i}].name"), "tool")?;
        let mut f = serde_json::Map::new();
        f.insert("name".into(), Value::String(name.to_string()));
        if let Some(d) = t.get("description") {
            f.insert("description".into(), d.clone());
        }
        // As Anthropic's API: every custom tool has an `input_schema` object.
        match t.get("input_schema") {
            Some(schema @ Value::Object(_)) => {
                f.insert("parameters".into(), schema.clone());
            }
            Some(other) => return Err(ApiError::field(&format!("tools[{i}].input_schema"), format!("`input_schema` must be a JSON Schema object; got {}.", json_kind(other)))),
            None => return Err(ApiError::field(&format!("tools[{i}].input_schema"), "Each tool needs an `input_schema` (a JSON Schema object).")),
        }
        out.push(json!({"type": "function", "function": Value::Object(f)}));
    }
    Ok((!none).then_some(out))
}

/// Anthropic messages (+ system) → the encoder's OpenAI-style messages.
fn to_openai_messages(system: Option<Value>, messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::field("messages", "`messages` must contain at least one message."));
    }
    let mut out = Vec::new();
    if let Some(s) = content_text(system.as_ref(), "system")? {
        out.push(json!({"role": "system", "content": s}));
    }
    for (i, m) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(ApiError::field(&at, "Each message must be an object."));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            Some(_) => return Err(ApiError::field(&format!("{at}.role"), "`role` must be a string.")),
            None => return Err(ApiError::field(&format!("{at}.role"), "Each message needs a `role`.")),
        };
        let blocks: Vec<Value> = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) if b.is_empty() && role == "user" => {
                return Err(ApiError::field(&format!("{at}.content"), "A user message's `content` must not be an empty list."));
            }
            Some(Value::Array(b)) => b.clone(),
            _ => return Err(ApiError::field(&format!("{at}.content"), "`content` must be a string or a list of content blocks.")),
        };
        match role {
            "user" => {
                let mut text: Vec<String> = Vec::new();
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => match b.get("text") {
                            Some(Value::String(t)) => text.push(t.clone()),
                            _ => return Err(ApiError::field(&format!("{bat}.text"), "A text block needs a string `text`.")),
                        },
                        Some("tool_result") => {
                            if !text.is_empty() {
                                out.push(json!({"role": "user", "content": text.join("\n")}));
                                text.clear();
                            }
                            let id = match b.get("tool_use_id") {
                                None | Some(Value::Null) => "",
                                Some(Value::String(s)) => s.as_str(),
                                Some(_) => return Err(ApiError::field(&format!("{bat}.tool_use_id"), "`tool_use_id` must be a string.")),
                            };
                            let mut c = match b.get("content") {
                                None | Some(Value::Null) => String::new(),
                                c => content_text(c, &format!("{bat}.content"))?.unwrap_or_default(),
                            };
                            if b.get("is_error").and_then(Value::as_bool) == Some(true) && !c.starts_with("Error") {
                                c = format!("Error: {c}");
                            }
                            out.push(json!({"role": "tool", "tool_call_id": id, "content": c}));
                        }
                        Some(other) => {
                            return Err(ApiError::field(&format!("{bat}.type"), format!("Content blocks of type `{other}` are not supported in user messages.")))
                        }
                        None => return Err(ApiError::field(&bat, "A content block needs a `type`.")),
                    }
                }
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                }
            }
            "assistant" => {
                let mut text = String::new();
                let mut reasoning = String::new();
                let mut calls = Vec::new();
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
                        Some("thinking") => reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or_default()),
                        Some("redacted_thinking") => {}
                        Some("tool_use") => {
                            let Some(name) = b.get("name").and_then(Value::as_str) else {
                                return Err(ApiError::field(&format!("{bat}.name"), "A tool_use block needs a `name`."));
                            };
                            let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                            if !input.is_object() {
                                return Err(ApiError::field(&format!("{bat}.input"), "`input` must be an object."));
                            }
                            calls.push(json!({
                                "id": b.get("id").and_then(Value::as_str).unwrap_or_default(),
                                "type": "function",
                                "function": {"name": name, "arguments": input.to_string()},
                            }));
                        }
                        Some(other) => {
                            return Err(ApiError::field(&format!("{bat}.type"), format!("Content blocks of type `{other}` are not supported in assistant messages.")))
                        }
                        None => return Err(ApiError::field(&bat, "A content block needs a `type`.")),
                    }
                }
                let mut msg = json!({"role": "assistant", "content": text});
                if !reasoning.is_empty() {
                    msg["reasoning_content"] = Value::String(reasoning);
                }
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
            "system" => {
                return Err(ApiError::field(&format!("{at}.role"), "Unknown role `system` (expected user or assistant): the Messages API takes the system prompt as the top-level `system` field."))
            }
            other => {
                return Err(ApiError::field(&format!("{at}.role"), format!("Unknown role `{other}` (expected user or assistant).")))
            }
        }
    }
    Ok(out)
}

fn effort(output_config: Option<&Value>) -> Option<&str> {
    output_config.and_then(|o| o.get("effort")).and_then(Value::as_str)
}

fn prompt_of(
    st: &AppState,
    system: Option<Value>,
    messages: Vec<Value>,
    thinking: Option<&Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<&Value>,
    output_config: Option<&Value>,
) -> Result<(Vec<u32>, ThinkingMode), ApiError> {
    let (mode, eff): (ThinkingMode, Option<ReasoningEffort>) = thinking_mode(thinking, None, effort(output_config))?;
    let mut msgs = to_openai_messages(system, messages)?;
    // Without tools the choice is still checked (a named tool is then an error).
    let tools = tools_to_openai(tools.unwrap_or_default(), tool_choice)?;
    attach_to_system(&mut msgs, tools, None);
    Ok((render(&st.tokenizer, &msgs, mode, eff)?, mode))
}

/// `POST /v1/messages/count_tokens`.
pub async fn count_tokens(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let req: CountRequest = match read_json(&headers, body, st.http.max_body_bytes).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Err(e) = st.check_model(Some(&req.model)) {
        return fail(e);
    }
    let st2 = st.clone();
    let r = tokio::task::spawn_blocking(move || {
        prompt_of(&st2, req.system, req.messages, req.thinking.as_ref(), req.tools, req.tool_choice.as_ref(), req.output_config.as_ref())
    })
    .await;
    match r {
        Ok(Ok((ids, _))) => Json(json!({"input_tokens": ids.len()})).into_response(),
        Ok(Err(e)) => fail(e),
        Err(e) => fail(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    let req: MessagesRequest = match read_json(&headers, body, st.http.max_body_bytes).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    match prepare(&st, req, arrived).await {
        Ok(r) => r,
        Err(e) => fail(e),
    }
}

struct Ctx {
    st: AppState,
    id: String,
    mode: ThinkingMode,
}

async fn prepare(st: &AppState, req: MessagesRequest, arrived: Instant) -> Result<Response, ApiError> {
    st.check_model(Some(&req.model))?;
    let Some(requested) = req.max_tokens else {
        return Err(ApiError::field("max_tokens", "`max_tokens` is required."));
    };
    let st2 = st.clone();
    let (thinking, tools, tool_choice, output_config) = (req.thinking, req.tools, req.tool_choice, req.output_config);
    let tool_choice_kept = tool_choice.clone();
    let thinking_kept = thinking.clone();
    let tool_names: Vec<String> = tools.iter().flatten().filter_map(|t| t.get("name")?.as_str().map(str::to_string)).collect();
    let (system, msgs) = (req.system, req.messages);
    let (prompt, mode) = tokio::task::spawn_blocking(move || {
        prompt_of(&st2, system, msgs, thinking.as_ref(), tools, tool_choice.as_ref(), output_config.as_ref())
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let max_tokens = max_tokens("max_tokens", Some(requested), prompt.len(), st.sched.info.context)?;
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        seed: req.seed,
        stop: req.stop_sequences.unwrap_or_default(),
        ignore_eos: req.ignore_eos.unwrap_or(false),
        ..SamplingFields::default()
    };
    let params = fields.params(st.tokenizer.eos_id()).map_err(|mut e| {
        if e.param.as_deref() == Some("stop") {
            e.param = Some("stop_sequences".into());
        }
        e
    })?;
    let mut params = params;
    if let Some(call) = forced_call(tool_choice_kept.as_ref(), &tool_names) {
        params.forced = Some(forced_tool_call(&st.tokenizer, mode, call)?);
    }
    params.reasoning_budget = reasoning_budget(&st.tokenizer, mode, thinking_kept.as_ref())?;
    let sub = submit(st, prompt, params, max_tokens, false, arrived)?;
    let ctx = Ctx { st: st.clone(), id: new_id("msg_"), mode };
    if req.stream.unwrap_or(false) {
        Ok(stream_response(ctx, sub))
    } else {
        whole(ctx, sub).await
    }
}

fn stop_reason(r: &FinishReason, tool_calls: bool) -> (&'static str, Value) {
    match r {
        FinishReason::Stop if tool_calls => ("tool_use", Value::Null),
        FinishReason::Stop | FinishReason::Cancelled => ("end_turn", Value::Null),
        FinishReason::StopString(s) => ("stop_sequence", Value::String(s.clone())),
        FinishReason::Length => ("max_tokens", Value::Null),
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": u.completion_tokens,
        "timings": {"queue_ms": ms(u.queue_ms), "prefill_ms": ms(u.prefill_ms), "decode_ms": ms(u.decode_ms)},
    })
}

fn cancelled_error() -> ApiError {
    ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "The request was cancelled: the server is shutting down.")
}

async fn whole(ctx: Ctx, mut sub: Submitted) -> Result<Response, ApiError> {
    let mut asm = Assembler::new(ctx.mode);
    let mut msg = Message::default();
    let (reason, usage) = loop {
        match sub.rx.recv().await {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => msg.extend(asm.push(&t.text)),
            Some(Event::Done { tail, reason, usage }) => {
                msg.extend(asm.push(&tail));
                msg.extend(asm.finish());
                break (reason, usage);
            }
            Some(Event::Error(e)) => return Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, format!("Generation failed: {e}"))),
            None => return Err(ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "The engine stopped before the request finished.")),
        }
    };
    if reason == FinishReason::Cancelled {
        return Err(cancelled_error());
    }
    let mut content = Vec::new();
    if ctx.mode == ThinkingMode::Thinking && !msg.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": msg.reasoning, "signature": ""}));
    }
    // An empty text block only when there is no other block (as the stream, which opens a text
    // block only for text, has none after thinking cut short by max_tokens).
    if !msg.content.is_empty() || (msg.tool_calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": msg.content}));
    }
    for (name, _, input) in &msg.tool_calls {
        content.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": input}));
    }
    let (sr, ss) = stop_reason(&reason, !msg.tool_calls.is_empty());
    Ok(Json(json!({
        "id": ctx.id,
        "type": "message",
        "role": "assistant",
        "model": ctx.st.model_name(),
        "content": content,
        "stop_reason": sr,
        "stop_sequence": ss,
        "usage": usage_json(&usage),
    }))
    .into_response())
}

/// One SSE event before rendering: (event name, data).
type Ev = (&'static str, Value);

fn ev(name: &'static str, data: Value) -> Ev {
    (name, data)
}

fn render_ev((name, data): Ev) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Open {
    None,
    Thinking,
    Text,
}

struct Blocks {
    open: Open,
    index: usize,
    tool_calls: bool,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Ev>) {
        if self.open != Open::None {
            out.push(ev("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
            self.index += 1;
            self.open = Open::None;
        }
    }
    fn delta(&mut self, d: Delta, out: &mut Vec<Ev>) {
        match d {
            Delta::Reasoning(t) => {
                if self.open != Open::Thinking {
                    self.close(out);
                    out.push(ev("content_block_start", json!({"type": "content_block_start", "index": self.index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
                    self.open = Open::Thinking;
                }
                out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "thinking_delta", "thinking": t}})));
            }
            Delta::Content(t) => {
                if self.open != Open::Text {
                    self.close(out);
                    out.push(ev("content_block_start", json!({"type": "content_block_start", "index": self.index,
                        "content_block": {"type": "text", "text": ""}})));
                    self.open = Open::Text;
                }
                out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "text_delta", "text": t}})));
            }
            Delta::ToolCall { name, arguments, .. } => {
                self.close(out);
                self.tool_calls = true;
                out.push(ev("content_block_start", json!({"type": "content_block_start", "index": self.index,
                    "content_block": {"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}}})));
                out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments}})));
                out.push(ev("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
                self.index += 1;
            }
        }
    }
}

fn stream_response(ctx: Ctx, sub: Submitted) -> Response {
    struct S {
        ctx: Ctx,
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        asm: Assembler,
        blocks: Blocks,
        prompt_tokens: usize,
        started: bool,
        done: bool,
    }
    let st = ctx.st.clone();
    let s = S {
        asm: Assembler::new(ctx.mode),
        ctx,
        rx: sub.rx,
        blocks: Blocks { open: Open::None, index: 0, tool_calls: false },
        prompt_tokens: sub.prompt_tokens,
        started: false,
        done: false,
    };
    let events = stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = Vec::new();
        let event = s.rx.recv().await;
        if !s.started {
            // message_start waits for admission so that its usage splits the prompt into new and
            // cached input tokens as the final message_delta does (0 cached if it never started).
            s.started = true;
            let cached = match event {
                Some(Event::Started { cached }) => cached,
                _ => 0,
            };
            out.push(ev("message_start", json!({"type": "message_start", "message": {
                "id": s.ctx.id, "type": "message", "role": "assistant", "model": s.ctx.st.model_name(),
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": s.prompt_tokens.saturating_sub(cached), "cache_read_input_tokens": cached,
                          "cache_creation_input_tokens": 0, "output_tokens": 0},
            }})));
            out.push(ev("ping", json!({"type": "ping"})));
        }
        let error = |out: &mut Vec<Ev>, e: ApiError| {
            out.push(ev("error", e.body(Flavor::Anthropic)));
        };
        match event {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => {
                for d in s.asm.push(&t.text) {
                    s.blocks.delta(d, &mut out);
                }
            }
            Some(Event::Done { tail, reason, usage }) => {
                let mut deltas = s.asm.push(&tail);
                deltas.extend(s.asm.finish());
                for d in deltas {
                    s.blocks.delta(d, &mut out);
                }
                if reason == FinishReason::Cancelled {
                    s.blocks.close(&mut out);
                    error(&mut out, cancelled_error());
                } else {
                    if s.blocks.index == 0 && s.blocks.open == Open::None {
                        // Always at least one (possibly empty) text block.
                        s.blocks.delta(Delta::Content(String::new()), &mut out);
                    }
                    s.blocks.close(&mut out);
                    let (sr, ss) = stop_reason(&reason, s.blocks.tool_calls);
                    out.push(ev("message_delta", json!({"type": "message_delta",
                        "delta": {"stop_reason": sr, "stop_sequence": ss}, "usage": usage_json(&usage)})));
                    out.push(ev("message_stop", json!({"type": "message_stop"})));
                }
                s.done = true;
            }
            Some(Event::Error(e)) => {
                s.blocks.close(&mut out);
                error(&mut out, ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, format!("Generation failed: {e}")));
                s.done = true;
            }
            None => {
                s.blocks.close(&mut out);
                error(&mut out, ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "The engine stopped before the request finished."));
                s.done = true;
            }
        }
        Some((stream::iter(out.into_iter().map(render_ev)), s))
    })
    .flatten();
    sse_response(&st, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DSML completion streamed token-sized through the assembler and the block builder gives
    /// text, then one complete tool_use block per call with its input as one JSON delta.
    #[test]
    fn tool_calls_stream_as_tool_use_blocks() {
        let text = "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"utc\" string=\"false\">true</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
        let mut asm = Assembler::new(ThinkingMode::Chat);
        let mut blocks = Blocks { open: Open::None, index: 0, tool_calls: false };
        let mut out = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            for d in asm.push(&piece.iter().collect::<String>()) {
                blocks.delta(d, &mut out);
            }
        }
        for d in asm.finish() {
            blocks.delta(d, &mut out);
        }
        blocks.close(&mut out);
        assert!(blocks.tool_calls);
        let starts: Vec<&Value> = out.iter().filter(|(n, _)| *n == "content_block_start").map(|(_, v)| v).collect();
        assert_eq!(starts.len(), 3);
        assert_eq!(starts[0]["content_block"]["type"], "text");
        assert_eq!(starts[1]["content_block"]["type"], "tool_use");
        assert_eq!(starts[1]["content_block"]["name"], "get_weather");
        assert_eq!(starts[2]["content_block"]["name"], "get_time");
        assert_eq!(starts[2]["index"], 2);
        let inputs: Vec<Value> = out
            .iter()
            .filter(|(_, v)| v["delta"]["type"] == "input_json_delta")
            .map(|(_, v)| serde_json::from_str(v["delta"]["partial_json"].as_str().unwrap()).unwrap())
            .collect();
        assert_eq!(inputs, vec![json!({"city": "Paris"}), json!({"utc": true})]);
        let text: String = out.iter().filter_map(|(_, v)| v["delta"]["text"].as_str()).collect();
        assert_eq!(text, "Checking.");
        // Every started block is stopped, in order.
        let stops: Vec<u64> = out.iter().filter(|(n, _)| *n == "content_block_stop").map(|(_, v)| v["index"].as_u64().unwrap()).collect();
        assert_eq!(stops, vec![0, 1, 2]);
        assert_eq!(stop_reason(&FinishReason::Stop, blocks.tool_calls).0, "tool_use");
    }
}
