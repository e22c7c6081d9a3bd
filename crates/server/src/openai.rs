//! OpenAI-compatible endpoints: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`.

use crate::assemble::{Assembler, Delta, Message};
use crate::common::*;
use crate::error::{ApiError, Failure, Flavor};
use crate::scheduler::{Event, FinishReason, TokenOut, Usage};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashseek_model::chat::ThinkingMode;
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::time::Instant;

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<Value>,
    stream: Option<bool>,
    #[serde(default, deserialize_with = "object_or_null")]
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    n: Option<i64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    reasoning_effort: Option<String>,
    thinking: Option<Value>,
    chat_template_kwargs: Option<Map<String, Value>>,
    ignore_eos: Option<bool>,
    logit_bias: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    stream: Option<bool>,
    #[serde(default, deserialize_with = "object_or_null")]
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logprobs: Option<i64>,
    echo: Option<bool>,
    n: Option<i64>,
    best_of: Option<i64>,
    suffix: Option<String>,
    ignore_eos: Option<bool>,
    logit_bias: Option<Value>,
}

/// A chat request's `tools` and `tool_choice` checked as OpenAI's API checks them (the choice's
/// shape; a forced call — `required` or a named function — needs declared tools; a named function
/// must be one of them) and the tools themselves (whatever the choice); returns the tools to write
/// into the prompt (none with `tool_choice` "none").
fn openai_tools(tools: Option<Vec<Value>>, choice: Option<&Value>) -> Result<Option<Vec<Value>>, ApiError> {
    if let Some(tc) = choice {
        let ok = matches!(tc, Value::Null)
            || matches!(tc, Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()))
            || tc.get("function").and_then(|f| f.get("name")).is_some_and(Value::is_string);
        if !ok {
            return Err(ApiError::field("tool_choice", "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}."));
        }
    }
    let has_tools = tools.as_ref().is_some_and(|t| !t.is_empty());
    let forces = matches!(choice, Some(Value::String(s)) if s == "required") || choice.is_some_and(Value::is_object);
    if forces && !has_tools {
        return Err(ApiError::field("tool_choice", "`tool_choice` \"required\" or a named function needs `tools` to declare at least one function."));
    }
    if let Some(name) = choice.and_then(|tc| tc.get("function")).and_then(|f| f.get("name")).and_then(Value::as_str) {
        let declared = tools.iter().flatten().any(|t| t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) == Some(name));
        if !declared {
            return Err(ApiError::field("tool_choice", format!("`tool_choice` names the function `{name}`, which is not among `tools`.")));
        }
    }
    // The tools are checked whatever the choice (as OpenAI's API does); with "none" they are not
    // written into the prompt.
    if let Some(t) = &tools {
        check_openai_tools(t)?;
    }
    let choice_none = matches!(choice, Some(Value::String(s)) if s == "none");
    match tools {
        Some(t) if !t.is_empty() && !choice_none => Ok(Some(t)),
        _ => Ok(None),
    }
}

/// The call an (already checked) OpenAI `tool_choice` forces: `"required"` any function, a named
/// function that one; `"none"`, `"auto"` and no choice force nothing.
fn forced_call<'a>(choice: Option<&'a Value>, names: &'a [String]) -> Option<ForcedCall<'a>> {
    match choice? {
        Value::String(s) if s == "required" => Some(ForcedCall::Any(names)),
        v => v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).map(ForcedCall::Named),
    }
}

/// `logit_bias` is not applied by the sampler: a non-empty map is refused rather than ignored
/// (null and `{}` change nothing and pass).
fn check_logit_bias(b: Option<&Value>) -> Result<(), ApiError> {
    match b {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) if m.is_empty() => Ok(()),
        Some(Value::Object(_)) => Err(ApiError::field("logit_bias", "`logit_bias` is not supported by this server (its sampler applies no per-token bias).")),
        Some(other) => Err(ApiError::field("logit_bias", format!("`logit_bias` must be an object mapping token ids to biases; got {}.", json_kind(other)))),
    }
}

fn check_n(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::field("n", format!("Only n = 1 is supported, got {n}."))),
    }
}

fn fail(e: ApiError) -> Response {
    Failure(e, Flavor::OpenAi).into_response()
}

fn finish_reason(r: &FinishReason, tool_calls: bool) -> &'static str {
    match r {
        FinishReason::Stop if tool_calls => "tool_calls",
        FinishReason::Stop | FinishReason::StopString(_) => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "timings": {"queue_ms": ms(u.queue_ms), "prefill_ms": ms(u.prefill_ms), "decode_ms": ms(u.decode_ms)},
    })
}

/// Chat-style logprobs entry of one token.
fn chat_logprob(st: &AppState, t: &TokenOut) -> Value {
    let entry = |id: u32, lp: f32| {
        let s = token_text(&st.tokenizer, id);
        json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
    };
    let mut e = entry(t.id, t.logprob.unwrap_or(f32::NAN));
    e["top_logprobs"] = Value::Array(t.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect());
    e
}

/// Converts request messages to the encoder's shape, checking roles and content.
fn chat_messages(msgs: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::field("messages", "`messages` must contain at least one message."));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(mut m) = m else {
            return Err(ApiError::field(&at, "Each message must be an object."));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.clone(),
            Some(_) => return Err(ApiError::field(&format!("{at}.role"), "`role` must be a string.")),
            None => return Err(ApiError::field(&format!("{at}.role"), "Each message needs a `role`.")),
        };
        match role.as_str() {
            "system" | "developer" | "user" | "assistant" | "tool" | "latest_reminder" => {}
            other => {
                return Err(ApiError::field(
                    &format!("{at}.role"),
                    format!("Unknown role `{other}` (expected system, developer, user, assistant or tool)."),
                ))
            }
        }
        // As OpenAI's API: a list of content parts must not be empty.
        if m.get("content").and_then(Value::as_array).is_some_and(Vec::is_empty) {
            return Err(ApiError::field(&format!("{at}.content"), "`content` must not be an empty list (give at least one text part, or a string)."));
        }
        let content = content_text(m.get("content"), &format!("{at}.content"))?;
        match content {
            Some(c) => {
                m.insert("content".into(), Value::String(c));
            }
            None if role == "assistant" => {
                m.insert("content".into(), Value::Null);
            }
            None if role == "latest_reminder" => {
                m.insert("content".into(), Value::String(String::new()));
            }
            // As OpenAI's API: only an assistant message (with tool calls) may omit its content.
            None => {
                return Err(ApiError::field(&format!("{at}.content"), format!("A {role} message needs `content` (a string or a list of text parts).")));
            }
        }
        if role == "assistant" {
            if let Some(r) = m.remove("reasoning") {
                m.entry("reasoning_content").or_insert(r);
            }
            if let Some(tc) = m.get("tool_calls") {
                if !tc.is_array() && !tc.is_null() {
                    return Err(ApiError::field(&format!("{at}.tool_calls"), "`tool_calls` must be a list."));
                }
            }
        }
        if role == "tool" && m.get("tool_call_id").is_some_and(|v| !v.is_string() && !v.is_null()) {
            return Err(ApiError::field(&format!("{at}.tool_call_id"), "`tool_call_id` must be a string."));
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    let req: ChatRequest = match read_json(&headers, body, st.http.max_body_bytes).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    match prepare_chat(&st, req, arrived).await {
        Ok(r) => r,
        Err(e) => fail(e),
    }
}

async fn prepare_chat(st: &AppState, req: ChatRequest, arrived: Instant) -> Result<Response, ApiError> {
    st.check_model(req.model.as_deref())?;
    check_n(req.n)?;
    check_logit_bias(req.logit_bias.as_ref())?;
    let (mode, effort) = thinking_mode(req.thinking.as_ref(), req.chat_template_kwargs.as_ref(), req.reasoning_effort.as_deref())?;
    let mut messages = chat_messages(req.messages)?;
    let tools = openai_tools(req.tools, req.tool_choice.as_ref())?;
    let tool_names: Vec<String> = tools.iter().flatten().filter_map(|t| t.get("function")?.get("name")?.as_str().map(str::to_string)).collect();
    let response_format = match req.response_format {
        None | Some(Value::Null) => None,
        Some(r) => match r.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(r),
            // As OpenAI's API: the schema object with its name.
            Some("json_schema") if r.get("json_schema").and_then(|j| j.get("name")).is_some_and(Value::is_string) => Some(r),
            Some("json_schema") => {
                return Err(ApiError::field("response_format.json_schema", "`response_format` of type \"json_schema\" needs `json_schema`: {\"name\": ..., \"schema\": {...}}."));
            }
            _ => {
                let got = if r.is_object() { "an object without a \"type\" of \"text\", \"json_object\" or \"json_schema\"" } else { json_kind(&r) };
                return Err(ApiError::field("response_format", format!("`response_format` must be an object such as {{\"type\": \"json_object\"}}; got {got}.")));
            }
        },
    };
    attach_to_system(&mut messages, tools, response_format);
    let tok = st.tokenizer.clone();
    let prompt = tokio::task::spawn_blocking(move || render(&tok, &messages, mode, effort))
        .await
        .map_err(|e| ApiError::status(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let max_field = if req.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = max_tokens(max_field, req.max_completion_tokens.or(req.max_tokens), prompt.len(), st.sched.info.context)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), n) => Some(match n {
            None => 0,
            Some(n) if (0..=20).contains(&n) => n as usize,
            Some(n) => return Err(ApiError::field("top_logprobs", format!("`top_logprobs` must be in [0, 20], got {n}."))),
        }),
        (_, Some(n)) if n > 0 => return Err(ApiError::field("top_logprobs", "`top_logprobs` needs `logprobs: true`.")),
        _ => None,
    };
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        seed: req.seed,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        stop: req.stop.map(OneOrMany::into_vec).unwrap_or_default(),
        logprobs,
        ignore_eos: req.ignore_eos.unwrap_or(false),
    };
    let mut params = fields.params(st.tokenizer.eos_id())?;
    if let Some(call) = forced_call(req.tool_choice.as_ref(), &tool_names) {
        params.forced = Some(forced_tool_call(&st.tokenizer, mode, call)?);
    }
    params.reasoning_budget = reasoning_budget(&st.tokenizer, mode, req.thinking.as_ref())?;
    let sub = submit(st, prompt, params, max_tokens, false, arrived)?;
    let ctx = ChatCtx {
        st: st.clone(),
        id: new_id("chatcmpl-"),
        created: unix_now(),
        mode,
        want_logprobs: logprobs.is_some(),
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        Ok(chat_stream(ctx, sub, include_usage))
    } else {
        chat_whole(ctx, sub).await
    }
}

struct ChatCtx {
    st: AppState,
    id: String,
    created: u64,
    mode: ThinkingMode,
    want_logprobs: bool,
}

/// Closes an OpenAI stream: the usage chunk (when `stream_options.include_usage` asked for it,
/// with `(id, object, created, model)` as its head), then `[DONE]`.
fn close_stream(out: &mut Vec<SseEvent>, head: (&str, &str, u64, &str), usage: Option<&Usage>) {
    if let Some(usage) = usage {
        let (id, object, created, model) = head;
        let v = json!({"id": id, "object": object, "created": created, "model": model, "choices": [], "usage": usage_json(usage)});
        out.push(SseEvent::default().data(v.to_string()));
    }
    out.push(SseEvent::default().data("[DONE]"));
}

/// Ends an OpenAI stream on an engine error (or a scheduler that went away): the error, then `[DONE]`.
fn fail_stream(out: &mut Vec<SseEvent>, e: ApiError) {
    out.push(SseEvent::default().data(e.body(Flavor::OpenAi).to_string()));
    out.push(SseEvent::default().data("[DONE]"));
}

fn engine_gone() -> ApiError {
    ApiError::status(axum::http::StatusCode::SERVICE_UNAVAILABLE, "The engine stopped before the request finished.")
}

fn engine_error(msg: String) -> ApiError {
    ApiError::status(axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("Generation failed: {msg}"))
}

async fn chat_whole(ctx: ChatCtx, mut sub: Submitted) -> Result<Response, ApiError> {
    let mut asm = Assembler::new(ctx.mode);
    let mut msg = Message::default();
    let mut lps = Vec::new();
    let (reason, usage) = loop {
        match sub.rx.recv().await {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => {
                if ctx.want_logprobs {
                    lps.push(chat_logprob(&ctx.st, &t));
                }
                msg.extend(asm.push(&t.text));
            }
            Some(Event::Done { tail, reason, usage }) => {
                msg.extend(asm.push(&tail));
                msg.extend(asm.finish());
                break (reason, usage);
            }
            Some(Event::Error(e)) => return Err(engine_error(e)),
            None => return Err(engine_gone()),
        }
    };
    let finish = finish_reason(&reason, !msg.tool_calls.is_empty());
    let message = message_json(msg, ctx.mode);
    let body = json!({
        "id": ctx.id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.st.model_name(),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": if ctx.want_logprobs { json!({"content": lps}) } else { Value::Null },
            "finish_reason": finish,
        }],
        "usage": usage_json(&usage),
    });
    Ok(Json(body).into_response())
}

/// The non-streamed reply's `message`: role, `content` (null when the reply is tool calls alone, as
/// OpenAI's API answers; text of whitespace alone stays a string), `reasoning_content` in thinking
/// mode, and `tool_calls` (each with a fresh `call_` id and its arguments as JSON text) when there
/// are any. The streamed reply cannot know in advance: its first delta carries `content: ""`.
fn message_json(msg: Message, mode: ThinkingMode) -> Value {
    let tool_calls: Vec<Value> = msg
        .tool_calls
        .iter()
        .map(|(name, args, _)| json!({"id": new_id("call_"), "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    let content = if msg.content.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(msg.content) };
    let mut message = json!({"role": "assistant", "content": content});
    if mode == ThinkingMode::Thinking {
        message["reasoning_content"] = Value::String(msg.reasoning);
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    message
}

fn chunk(ctx: &ChatCtx, delta: Value, finish: Option<&str>, logprobs: Option<Value>) -> SseEvent {
    let mut choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
    if let Some(l) = logprobs {
        choice["logprobs"] = json!({"content": l});
    }
    let v = json!({
        "id": ctx.id,
        "object": "chat.completion.chunk",
        "created": ctx.created,
        "model": ctx.st.model_name(),
        "choices": [choice],
    });
    SseEvent::default().data(v.to_string())
}

fn delta_json(d: Delta) -> Value {
    match d {
        Delta::Reasoning(t) => json!({"reasoning_content": t}),
        Delta::Content(t) => json!({"content": t}),
        Delta::ToolCall { index, name, arguments, .. } => json!({"tool_calls": [{
            "index": index, "id": new_id("call_"), "type": "function",
            "function": {"name": name, "arguments": arguments},
        }]}),
    }
}

/// The SSE response of a streamed request: `events` turns each engine event into SSE events.
pub fn sse_response<S>(st: &AppState, events: S) -> Response
where
    S: futures_util::Stream<Item = SseEvent> + Send + 'static,
{
    Sse::new(events.map(Ok::<_, Infallible>)).keep_alive(KeepAlive::new().interval(st.http.keepalive)).into_response()
}

fn chat_stream(ctx: ChatCtx, sub: Submitted, include_usage: bool) -> Response {
    struct S {
        ctx: ChatCtx,
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        asm: Assembler,
        started: bool,
        done: bool,
        include_usage: bool,
    }
    let st = ctx.st.clone();
    let s = S { asm: Assembler::new(ctx.mode), ctx, rx: sub.rx, started: false, done: false, include_usage };
    let events = stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = Vec::new();
        if !s.started {
            s.started = true;
            out.push(chunk(&s.ctx, json!({"role": "assistant", "content": ""}), None, None));
        }
        match s.rx.recv().await {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => {
                let lp = s.ctx.want_logprobs.then(|| vec![chat_logprob(&s.ctx.st, &t)]);
                let deltas = s.asm.push(&t.text);
                let mut lp = lp;
                if deltas.is_empty() {
                    if let Some(lp) = lp.take() {
                        out.push(chunk(&s.ctx, json!({}), None, Some(Value::Array(lp))));
                    }
                }
                for d in deltas {
                    out.push(chunk(&s.ctx, delta_json(d), None, lp.take().map(Value::Array)));
                }
            }
            Some(Event::Done { tail, reason, usage }) => {
                let mut deltas = s.asm.push(&tail);
                deltas.extend(s.asm.finish());
                for d in deltas {
                    out.push(chunk(&s.ctx, delta_json(d), None, None));
                }
                out.push(chunk(&s.ctx, json!({}), Some(finish_reason(&reason, s.asm.has_tool_calls())), None));
                let head = (s.ctx.id.as_str(), "chat.completion.chunk", s.ctx.created, s.ctx.st.model_name());
                close_stream(&mut out, head, s.include_usage.then_some(&usage));
                s.done = true;
            }
            Some(Event::Error(e)) => {
                fail_stream(&mut out, engine_error(e));
                s.done = true;
            }
            None => {
                fail_stream(&mut out, engine_gone());
                s.done = true;
            }
        }
        Some((stream::iter(out), s))
    })
    .flatten();
    sse_response(&st, events)
}

// ---------------------------------------------------------------------------------------------
// /v1/completions

/// `POST /v1/completions`.
pub async fn completions(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    let req: CompletionRequest = match read_json(&headers, body, st.http.max_body_bytes).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    match prepare_completion(&st, req, arrived).await {
        Ok(r) => r,
        Err(e) => fail(e),
    }
}

fn completion_prompt(st: &AppState, prompt: Value) -> Result<(Vec<u32>, String), ApiError> {
    let bad = || ApiError::field("prompt", "`prompt` must be a string, a list of one string, or a list of token ids.");
    let text_ids = |s: &str| -> Result<(Vec<u32>, String), ApiError> {
        let mut ids = vec![st.tokenizer.bos_id()];
        ids.extend(st.tokenizer.encode_text(s).map_err(|e| ApiError::field("prompt", e.to_string()))?);
        Ok((ids, s.to_string()))
    };
    match prompt {
        Value::String(s) => text_ids(&s),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => text_ids(a[0].as_str().unwrap_or_default()),
        Value::Array(a) if a.len() == 1 && a[0].is_array() => completion_prompt(st, a[0].clone()),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let vocab = st.sched.info.vocab_size.min(st.tokenizer.vocab_size());
            let mut ids = Vec::with_capacity(a.len());
            for (i, v) in a.iter().enumerate() {
                match v.as_u64() {
                    Some(id) if (id as usize) < vocab => ids.push(id as u32),
                    _ => return Err(ApiError::field(&format!("prompt[{i}]"), format!("Token id {v} is outside the vocabulary (size {vocab})."))),
                }
            }
            let text = st.tokenizer.decode(&ids, false).unwrap_or_default();
            Ok((ids, text))
        }
        Value::Array(a) if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => {
            Err(ApiError::field("prompt", "Only one prompt per request is supported."))
        }
        _ => Err(bad()),
    }
}

async fn prepare_completion(st: &AppState, req: CompletionRequest, arrived: Instant) -> Result<Response, ApiError> {
    st.check_model(req.model.as_deref())?;
    check_n(req.n)?;
    check_logit_bias(req.logit_bias.as_ref())?;
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::field("best_of", "Only best_of = 1 is supported."));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "`suffix` is not supported."));
    }
    let st2 = st.clone();
    let prompt_value = req.prompt;
    let (prompt, prompt_text) = tokio::task::spawn_blocking(move || completion_prompt(&st2, prompt_value))
        .await
        .map_err(|e| ApiError::status(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    // OpenAI's default for this endpoint is 16 tokens.
    let max_tokens = max_tokens("max_tokens", Some(req.max_tokens.unwrap_or(16)), prompt.len(), st.sched.info.context)?;
    let logprobs = match req.logprobs {
        None => None,
        Some(n) if (0..=20).contains(&n) => Some(n as usize),
        Some(n) => return Err(ApiError::field("logprobs", format!("`logprobs` must be in [0, 20], got {n}."))),
    };
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        seed: req.seed,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        stop: req.stop.map(OneOrMany::into_vec).unwrap_or_default(),
        logprobs,
        ignore_eos: req.ignore_eos.unwrap_or(false),
    };
    let params = fields.params(st.tokenizer.eos_id())?;
    let sub = submit(st, prompt, params, max_tokens, true, arrived)?;
    let ctx = CmplCtx {
        st: st.clone(),
        id: new_id("cmpl-"),
        created: unix_now(),
        want_logprobs: logprobs.is_some(),
        echo: req.echo.unwrap_or(false).then_some(prompt_text),
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        Ok(completion_stream(ctx, sub, include_usage))
    } else {
        completion_whole(ctx, sub).await
    }
}

struct CmplCtx {
    st: AppState,
    id: String,
    created: u64,
    want_logprobs: bool,
    echo: Option<String>,
}

/// Legacy-completions logprobs of some tokens, text offsets starting at `offset`.
fn cmpl_logprobs(st: &AppState, toks: &[TokenOut], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for t in toks {
        let s = token_text(&st.tokenizer, t.id);
        offsets.push(offset);
        offset += t.text.len();
        tokens.push(s);
        lps.push(t.logprob);
        let mut m = Map::new();
        for &(id, lp) in &t.top_logprobs {
            m.insert(token_text(&st.tokenizer, id), json!(lp));
        }
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

async fn completion_whole(ctx: CmplCtx, mut sub: Submitted) -> Result<Response, ApiError> {
    let mut text = ctx.echo.clone().unwrap_or_default();
    let start = text.len();
    let mut toks = Vec::new();
    let (reason, usage) = loop {
        match sub.rx.recv().await {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => {
                text.push_str(&t.text);
                if ctx.want_logprobs {
                    toks.push(t);
                }
            }
            Some(Event::Done { tail, reason, usage }) => {
                text.push_str(&tail);
                break (reason, usage);
            }
            Some(Event::Error(e)) => return Err(engine_error(e)),
            None => return Err(engine_gone()),
        }
    };
    let body = json!({
        "id": ctx.id,
        "object": "text_completion",
        "created": ctx.created,
        "model": ctx.st.model_name(),
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": if ctx.want_logprobs { cmpl_logprobs(&ctx.st, &toks, start) } else { Value::Null },
            "finish_reason": finish_reason(&reason, false),
        }],
        "usage": usage_json(&usage),
    });
    Ok(Json(body).into_response())
}

fn completion_stream(ctx: CmplCtx, sub: Submitted, include_usage: bool) -> Response {
    struct S {
        ctx: CmplCtx,
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        offset: usize,
        started: bool,
        done: bool,
        include_usage: bool,
    }
    fn piece(ctx: &CmplCtx, text: &str, logprobs: Value, finish: Option<&str>) -> SseEvent {
        let v = json!({
            "id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.st.model_name(),
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        });
        SseEvent::default().data(v.to_string())
    }
    let st = ctx.st.clone();
    let s = S { ctx, rx: sub.rx, offset: 0, started: false, done: false, include_usage };
    let events = stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = Vec::new();
        if !s.started {
            s.started = true;
            if let Some(e) = s.ctx.echo.clone() {
                s.offset = e.len();
                out.push(piece(&s.ctx, &e, Value::Null, None));
            }
        }
        match s.rx.recv().await {
            Some(Event::Started { .. }) => {}
            Some(Event::Token(t)) => {
                // One chunk per token (its text may be empty while a character is incomplete).
                let lp = if s.ctx.want_logprobs { cmpl_logprobs(&s.ctx.st, std::slice::from_ref(&t), s.offset) } else { Value::Null };
                s.offset += t.text.len();
                out.push(piece(&s.ctx, &t.text, lp, None));
            }
            Some(Event::Done { tail, reason, usage }) => {
                out.push(piece(&s.ctx, &tail, Value::Null, Some(finish_reason(&reason, false))));
                let head = (s.ctx.id.as_str(), "text_completion", s.ctx.created, s.ctx.st.model_name());
                close_stream(&mut out, head, s.include_usage.then_some(&usage));
                s.done = true;
            }
            Some(Event::Error(e)) => {
                fail_stream(&mut out, engine_error(e));
                s.done = true;
            }
            None => {
                fail_stream(&mut out, engine_gone());
                s.done = true;
            }
        }
        Some((stream::iter(out), s))
    })
    .flatten();
    sse_response(&st, events)
}

/// `GET /v1/models`.
pub async fn models(State(st): State<AppState>) -> Response {
    let data: Vec<Value> = st
        .http
        .model_names
        .iter()
        .map(|n| {
            json!({"id": n, "object": "model", "created": st.created, "owned_by": "flashseek",
                   "max_model_len": st.sched.info.context})
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`.
pub async fn model(State(st): State<AppState>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if let Err(e) = st.check_model(Some(&id)) {
        return fail(e);
    }
    Json(json!({"id": id, "object": "model", "created": st.created, "owned_by": "flashseek", "max_model_len": st.sched.info.context}))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DSML completion streamed token-sized through the assembler gives OpenAI deltas: content,
    /// then each tool call whole (name and JSON arguments) with its index.
    #[test]
    fn tool_calls_stream_as_openai_deltas() {
        let text = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">rust \"sse\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"k\" string=\"false\">5</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
        let mut asm = Assembler::new(ThinkingMode::Thinking);
        let full = format!("plan</think>{text}");
        let mut deltas = Vec::new();
        for piece in full.split_inclusive(['>', '"', '\n']) {
            deltas.extend(asm.push(piece));
        }
        deltas.extend(asm.finish());
        assert!(asm.has_tool_calls());
        let js: Vec<Value> = deltas.into_iter().map(delta_json).collect();
        let reasoning: String = js.iter().filter_map(|v| v["reasoning_content"].as_str()).collect();
        assert_eq!(reasoning, "plan");
        let calls: Vec<&Value> = js.iter().filter(|v| v.get("tool_calls").is_some()).collect();
        assert_eq!(calls.len(), 1);
        let c = &calls[0]["tool_calls"][0];
        assert_eq!(c["index"], 0);
        assert_eq!(c["type"], "function");
        assert!(c["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(c["function"]["name"], "search");
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"q": "rust \"sse\"", "k": 5}));
        assert!(js.iter().all(|v| v.get("content").is_none_or(|t| t.as_str().is_some_and(|t| !t.contains("DSML")))));
        assert_eq!(finish_reason(&FinishReason::Stop, true), "tool_calls");
    }

    /// The non-streamed message: `content` is null only for a reply of tool calls alone; text with
    /// tool calls, and an empty reply without them, keep a string.
    #[test]
    fn message_content_null_only_for_tool_calls_alone() {
        let call = ("search".to_string(), "{\"q\":\"x\"}".to_string(), json!({"q": "x"}));
        let only_calls = Message { reasoning: "plan".into(), content: String::new(), tool_calls: vec![call.clone()] };
        let m = message_json(only_calls, ThinkingMode::Thinking);
        assert_eq!(m["content"], Value::Null);
        assert_eq!(m["reasoning_content"], "plan");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "search");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"q\":\"x\"}");
        let with_text = Message { reasoning: String::new(), content: "Let me look.".into(), tool_calls: vec![call] };
        assert_eq!(message_json(with_text, ThinkingMode::Chat)["content"], "Let me look.");
        let empty = message_json(Message::default(), ThinkingMode::Chat);
        assert_eq!(empty["content"], "");
        assert!(empty.get("tool_calls").is_none() && empty.get("reasoning_content").is_none());
    }
}
