//! The HTTP API end to end on loopback, on a tiny random model: shapes, streaming, usage, tool
//! conversations, every error case, API keys, admission (429), cancellation, determinism under
//! batching, keep-alive, graceful shutdown.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

fn chat(base: &str) -> String {
    format!("{base}/v1/chat/completions")
}

/// One server for the tests that need no special settings.
fn shared() -> &'static flashseek_server::RunningServer {
    static S: std::sync::OnceLock<flashseek_server::RunningServer> = std::sync::OnceLock::new();
    S.get_or_init(|| start(config()))
}

#[test]
fn models_health_metrics() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let m = get(&c, &format!("{}/v1/models", s.url())).await;
        assert_eq!(m.status, 200);
        assert_eq!(m.json()["data"][0]["id"], "flashseek-default");
        assert_eq!(m.json()["data"][0]["max_model_len"], 4096);
        assert_eq!(get(&c, &format!("{}/v1/models/flashseek-default", s.url())).await.status, 200);
        assert_eq!(get(&c, &format!("{}/v1/models/gpt-4", s.url())).await.status, 404);
        let h = get(&c, &format!("{}/health", s.url())).await;
        assert_eq!(h.status, 200);
        assert_eq!(h.json()["status"], "ok");
        let mt = get(&c, &format!("{}/metrics", s.url())).await;
        assert_eq!(mt.status, 200);
        for name in [
            "flashseek_requests_total",
            "flashseek_prompt_tokens_total",
            "flashseek_generation_tokens_total",
            "flashseek_running_sequences",
            "flashseek_queued_requests",
            "flashseek_state_memory_bytes",
            "flashseek_prefill_tokens_per_second",
            "flashseek_decode_tokens_per_second",
            "flashseek_time_to_first_token_seconds_bucket",
            "flashseek_inter_token_latency_seconds_bucket",
        ] {
            assert!(mt.body.contains(name), "{name} missing from /metrics");
        }
    });
}

#[test]
fn chat_plain_usage_and_prefix_cache() {
    // Its own server: on the shared one, the other tests running in parallel can push this
    // request's session out of the 4-entry prefix cache before the repeat arrives.
    let own = start(config());
    let s = &own;
    rt().block_on(async {
        let c = client();
        let body = json!({"model": "flashseek-default", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime number bigger than ten, please."}],
            "max_tokens": 6, "seed": 11, "ignore_eos": true});
        let r = post(&c, &chat(&s.url()), &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert!(v["choices"][0]["message"]["content"].is_string());
        assert!(v["choices"][0]["message"].get("reasoning_content").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let u = &v["usage"];
        assert_eq!(u["completion_tokens"], 6);
        let prompt = u["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 10);
        assert_eq!(u["total_tokens"].as_u64().unwrap(), prompt + 6);
        assert!(u["timings"]["prefill_ms"].as_f64().unwrap() > 0.0);
        assert!(u["timings"]["decode_ms"].as_f64().unwrap() > 0.0);
        // The same prompt again reuses the cached prefix, and the seed gives the same answer.
        let r2 = post(&c, &chat(&s.url()), &body).await.json();
        assert_eq!(r2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt - 1);
        assert_eq!(r2["choices"][0]["message"]["content"], v["choices"][0]["message"]["content"]);
        // Thinking mode reports reasoning_content.
        let mut t = body.clone();
        t["thinking"] = json!({"type": "enabled"});
        let r3 = post(&c, &chat(&s.url()), &t).await.json();
        assert!(r3["choices"][0]["message"]["reasoning_content"].is_string(), "{r3}");
        let mut t = body.clone();
        t["chat_template_kwargs"] = json!({"enable_thinking": true});
        let r4 = post(&c, &chat(&s.url()), &t).await.json();
        assert_eq!(r4["choices"][0]["message"]["reasoning_content"], r3["choices"][0]["message"]["reasoning_content"]);
        let mut t = body.clone();
        t["reasoning_effort"] = json!("high");
        let r5 = post(&c, &chat(&s.url()), &t).await.json();
        assert_eq!(r5["usage"]["prompt_tokens"], r3["usage"]["prompt_tokens"]);
        assert!(r5["choices"][0]["message"]["reasoning_content"].is_string());
    });
}

/// Collects the text of an OpenAI chat stream; returns (content, reasoning, finish, usage, n_chunks).
fn chat_stream_text(events: &[Sse]) -> (String, String, Option<String>, Option<Value>) {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut finish = None;
    let mut usage = None;
    assert_eq!(events.last().unwrap().1, "[DONE]");
    for (_, d) in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(ch) = v["choices"].as_array().and_then(|a| a.first()) {
            if let Some(t) = ch["delta"]["content"].as_str() {
                content.push_str(t);
            }
            if let Some(t) = ch["delta"]["reasoning_content"].as_str() {
                reasoning.push_str(t);
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
    }
    (content, reasoning, finish, usage)
}

#[test]
fn chat_stream_equals_plain() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let body = json!({"messages": [{"role": "user", "content": "Stream me something."}],
            "max_tokens": 12, "seed": 5, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "ignore_eos": true});
        let plain = post(&c, &chat(&s.url()), &body).await.json();
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let r = post(&c, &chat(&s.url()), &sb).await;
        assert_eq!(r.status, 200);
        assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let ev = parse_sse(&r.body);
        let first: Value = serde_json::from_str(&ev[0].1).unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let (content, _, finish, usage) = chat_stream_text(&ev);
        assert_eq!(content, plain["choices"][0]["message"]["content"].as_str().unwrap());
        assert_eq!(finish.as_deref(), Some("length"));
        let usage = usage.expect("usage chunk");
        assert_eq!(usage["completion_tokens"], 12);
        // Without include_usage there is no usage chunk.
        sb["stream_options"] = json!(null);
        let ev = parse_sse(&post(&c, &chat(&s.url()), &sb).await.body);
        assert!(chat_stream_text(&ev).3.is_none());
    });
}

/// A forced `tool_choice` (OpenAI `required` / named function, Anthropic `any` / `tool`) makes the
/// reply open a DSML tool-call block (with a named tool: its invoke tag complete), written by the
/// sampler; `auto` leaves the tiny random model to its own tokens; thinking mode waits for the
/// model's `</think>` (which the tiny model does not write within a few tokens).
#[test]
fn forced_tool_choice_opens_the_call() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let f = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let opening = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
        let text_of = |v: &Value| -> String {
            v["choices"][0]["logprobs"]["content"].as_array().expect("logprobs").iter().map(|e| e["token"].as_str().unwrap().to_string()).collect()
        };
        let body = |choice: Value, thinking: bool| {
            json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [f("get_weather"), f("get_time")], "tool_choice": choice, "max_tokens": 24, "temperature": 0,
                "logprobs": true, "ignore_eos": true, "thinking": {"type": if thinking { "enabled" } else { "disabled" }}})
        };
        // A named function: its name; `required`: one of the declared names (chosen under the mask).
        for (choice, wants) in [
            (json!({"type": "function", "function": {"name": "get_time"}}), vec![format!("{opening}get_time\">\n")]),
            (json!("required"), vec![format!("{opening}get_weather\">\n"), format!("{opening}get_time\">\n")]),
        ] {
            let r = post(&c, &chat(&s.url()), &body(choice.clone(), false)).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let text = text_of(&r.json());
            assert!(wants.iter().any(|w| text.starts_with(w.as_str())), "{choice}: {text:?}");
            // Streamed: the same tokens.
            let mut sb = body(choice.clone(), false);
            sb["stream"] = json!(true);
            let ev = parse_sse(&post(&c, &chat(&s.url()), &sb).await.body);
            let chunks: Vec<Value> = ev.iter().filter_map(|(_, d)| serde_json::from_str(d).ok()).collect();
            let streamed: String = chunks.iter().filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array()).flatten().map(|e| e["token"].as_str().unwrap().to_string()).collect();
            assert_eq!(streamed, text, "{choice}");
        }
        let auto = text_of(&post(&c, &chat(&s.url()), &body(json!("auto"), false)).await.json());
        assert!(!auto.contains("｜DSML｜"), "{auto:?}");
        let thinking = text_of(&post(&c, &chat(&s.url()), &body(json!("required"), true)).await.json());
        assert!(!thinking.contains("</think>") && !thinking.contains("｜DSML｜"), "{thinking:?}");
        // Anthropic: type tool; the reply is a tool_use of that tool or text holding its opening.
        let ab = json!({"model": "flashseek-default", "max_tokens": 24, "temperature": 0, "ignore_eos": true,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}, {"name": "get_time", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_time"}});
        let r = post(&c, &format!("{}/v1/messages", s.url()), &ab).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let blocks = v["content"].as_array().unwrap();
        let ok = blocks.iter().any(|b| b["type"] == "tool_use" && b["name"] == "get_time")
            || blocks.iter().any(|b| b["text"].as_str().is_some_and(|t| t.starts_with(&format!("{opening}get_time\">\n"))));
        assert!(ok, "{v}");
        // Type any: one of the declared tools, by name.
        let mut any = ab.clone();
        any["tool_choice"] = json!({"type": "any"});
        let v = post(&c, &format!("{}/v1/messages", s.url()), &any).await.json();
        let blocks = v["content"].as_array().unwrap();
        let ok = blocks.iter().any(|b| b["type"] == "tool_use" && (b["name"] == "get_time" || b["name"] == "get_weather"))
            || blocks.iter().any(|b| b["text"].as_str().is_some_and(|t| ["get_weather", "get_time"].iter().any(|n| t.starts_with(&format!("{opening}{n}\">\n")))));
        assert!(ok, "{v}");
    });
}

#[test]
fn logprobs_and_stop_strings() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let body = json!({"messages": [{"role": "user", "content": "Give me logprobs."}],
            "max_tokens": 5, "seed": 3, "logprobs": true, "top_logprobs": 3, "ignore_eos": true});
        let v = post(&c, &chat(&s.url()), &body).await.json();
        let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(lp.len(), 5);
        for e in lp {
            assert!(e["logprob"].as_f64().unwrap() <= 0.0);
            assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 3);
        }
        // A stop string taken from the unconstrained output ends the text before it.
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let chars: Vec<char> = text.chars().collect();
        if chars.len() >= 4 {
            let stop: String = chars[2..4].iter().collect();
            let mut b = body.clone();
            b["stop"] = json!([stop.clone()]);
            let w = post(&c, &chat(&s.url()), &b).await.json();
            let got = w["choices"][0]["message"]["content"].as_str().unwrap();
            assert!(text.starts_with(got) && !got.contains(&stop), "{got:?} vs {text:?} stop {stop:?}");
            assert_eq!(w["choices"][0]["finish_reason"], "stop");
        }
        // Legacy completions: text, logprobs, echo, stream.
        let url = format!("{}/v1/completions", s.url());
        let cb = json!({"prompt": "Once upon a time", "max_tokens": 7, "seed": 9, "logprobs": 2, "ignore_eos": true});
        let v = post(&c, &url, &cb).await.json();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["usage"]["completion_tokens"], 7);
        assert_eq!(v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 7);
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        let mut e = cb.clone();
        e["echo"] = json!(true);
        let ve = post(&c, &url, &e).await.json();
        assert_eq!(ve["choices"][0]["text"].as_str().unwrap(), format!("Once upon a time{text}"));
        let mut st = cb.clone();
        st["stream"] = json!(true);
        let ev = parse_sse(&post(&c, &url, &st).await.body);
        assert_eq!(ev.last().unwrap().1, "[DONE]");
        let streamed: String = ev[..ev.len() - 1]
            .iter()
            .map(|(_, d)| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(streamed, text);
        // Token-id prompts work too.
        let ids = post(&c, &url, &json!({"prompt": [0, 19923, 14, 2058], "max_tokens": 2})).await;
        assert_eq!(ids.status, 200, "{}", ids.body);
    });
}

#[test]
fn anthropic_messages() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let url = format!("{}/v1/messages", s.url());
        let body = json!({"model": "flashseek-default", "max_tokens": 6, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there"}], "ignore_eos": true, "seed": 2});
        let v = post(&c, &url, &body).await.json();
        assert_eq!(v["type"], "message");
        assert_eq!(v["role"], "assistant");
        assert_eq!(v["content"][0]["type"], "text");
        assert_eq!(v["stop_reason"], "max_tokens");
        assert_eq!(v["usage"]["output_tokens"], 6);
        let count = post(&c, &format!("{url}/count_tokens"), &json!({"model": "flashseek-default", "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there"}]})).await.json();
        let n = count["input_tokens"].as_u64().unwrap();
        assert_eq!(v["usage"]["input_tokens"].as_u64().unwrap() + v["usage"]["cache_read_input_tokens"].as_u64().unwrap(), n);
        // Streaming with thinking: message_start, a thinking block, deltas, message_delta, message_stop.
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        let r = post(&c, &url, &sb).await;
        let ev = parse_sse(&r.body);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap_or("")).collect();
        assert_eq!(names[0], "message_start");
        assert_eq!(*names.last().unwrap(), "message_stop");
        assert!(names.contains(&"message_delta"));
        let starts: Vec<Value> = ev
            .iter()
            .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
            .map(|(_, d)| serde_json::from_str::<Value>(d).unwrap())
            .collect();
        assert_eq!(starts[0]["content_block"]["type"], "thinking", "{starts:?}");
        assert!(ev.iter().any(|(_, d)| d.contains("thinking_delta")));
        let delta: Value = serde_json::from_str(&ev.iter().find(|(n, _)| n.as_deref() == Some("message_delta")).unwrap().1).unwrap();
        assert_eq!(delta["usage"]["output_tokens"], 6);
        // The same request unstreamed (seeded: the same tokens) has the stream's blocks, in order:
        // no empty text block after thinking that max_tokens cut short.
        let mut nb = sb.clone();
        nb["stream"] = json!(false);
        let whole = post(&c, &url, &nb).await.json();
        let kinds: Vec<Value> = whole["content"].as_array().unwrap().iter().map(|b| b["type"].clone()).collect();
        let streamed_kinds: Vec<Value> = starts.iter().map(|b| b["content_block"]["type"].clone()).collect();
        assert_eq!(kinds, streamed_kinds, "{whole}");
        // A budget of 2 reasoning tokens: `</think>` is forced after them, so a text block follows
        // the thinking block within the 10 tokens.
        let mut bb = nb.clone();
        bb["thinking"] = json!({"type": "enabled", "budget_tokens": 2});
        bb["max_tokens"] = json!(10);
        let w = post(&c, &url, &bb).await.json();
        let kinds: Vec<&str> = w["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap_or("")).collect();
        assert_eq!(kinds, ["thinking", "text"], "{w}");
        assert_eq!(w["usage"]["output_tokens"], 10);
        // message_start splits the prompt into new and cached input tokens as message_delta does.
        let start: Value = serde_json::from_str(&ev[0].1).unwrap();
        for k in ["input_tokens", "cache_read_input_tokens"] {
            assert_eq!(start["message"]["usage"][k], delta["usage"][k], "{k}: {start} vs {delta}");
        }
        // Stop sequences report which one matched.
        let plain = post(&c, &url, &body).await.json();
        let text = plain["content"][0]["text"].as_str().unwrap();
        let chars: Vec<char> = text.chars().collect();
        if chars.len() >= 3 {
            let stop: String = chars[1..3].iter().collect();
            let mut b = body.clone();
            b["stop_sequences"] = json!(["zzzzzz-never", stop.clone()]);
            let w = post(&c, &url, &b).await.json();
            assert_eq!(w["stop_reason"], "stop_sequence", "{w}");
            assert_eq!(w["stop_sequence"], json!(stop));
        }
    });
}

#[test]
fn tool_conversations_render_alike_in_both_apis() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let openai = json!({"messages": [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": schema}}],
            "max_tokens": 4, "seed": 1});
        let o = post(&c, &chat(&s.url()), &openai).await;
        assert_eq!(o.status, 200, "{}", o.body);
        let anthropic = json!({"model": "flashseek-default", "max_tokens": 4, "system": "You help.", "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18C and sunny"}]}],
            "tools": [{"name": "get_weather", "description": "Weather of a city", "input_schema": schema}]});
        let a = post(&c, &format!("{}/v1/messages/count_tokens", s.url()), &anthropic).await;
        assert_eq!(a.status, 200, "{}", a.body);
        // Same conversation, same prompt.
        assert_eq!(o.json()["usage"]["prompt_tokens"], a.json()["input_tokens"]);
        let m = post(&c, &format!("{}/v1/messages", s.url()), &anthropic).await;
        assert_eq!(m.status, 200, "{}", m.body);
        // tool_choice none drops the tools block: a shorter prompt.
        let mut none = openai.clone();
        none["tool_choice"] = json!("none");
        let n = post(&c, &chat(&s.url()), &none).await.json();
        assert!(n["usage"]["prompt_tokens"].as_u64() < o.json()["usage"]["prompt_tokens"].as_u64());
    });
}

async fn expect_error(c: &HttpClient, url: &str, body: Vec<u8>, status: u16, anthropic: bool) -> Value {
    let r = send(c, "POST", url, body.clone(), &[]).await;
    assert_eq!(r.status, status, "body {:?} → {}", String::from_utf8_lossy(&body), r.body);
    let v = r.json();
    if anthropic {
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string(), "{v}");
    } else {
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    }
    v
}

#[test]
fn bad_input_gets_shaped_4xx() {
    let mut cfg = config();
    cfg.max_body_bytes = 64 << 10;
    let s = start(cfg);
    rt().block_on(async {
        let c = client();
        let u = chat(&s.url());
        let ok = |extra: Value| {
            let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            b.to_string().into_bytes()
        };
        // Malformed JSON, empty body, invalid UTF-8, not an object.
        expect_error(&c, &u, b"{\"messages\": [".to_vec(), 400, false).await;
        expect_error(&c, &u, b"".to_vec(), 400, false).await;
        expect_error(&c, &u, b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), 400, false).await;
        expect_error(&c, &u, b"[1, 2]".to_vec(), 400, false).await;
        // An array with one element per field is not a request either (serde would take it).
        let fields = [json!([{"role": "user", "content": "hi"}])].into_iter().chain(std::iter::repeat_n(Value::Null, 40)).collect::<Vec<_>>();
        let v = expect_error(&c, &u, serde_json::to_vec(&fields).unwrap(), 400, false).await;
        assert!(v["error"]["message"].as_str().unwrap().contains("JSON object"), "{v}");
        // Wrong field types name the field.
        let v = expect_error(&c, &u, ok(json!({"temperature": "hot"})), 400, false).await;
        assert_eq!(v["error"]["param"], "temperature");
        // … in JSON's terms, not Rust's (`expected f64`, `untagged enum OneOrMany`).
        let message = |v: &Value| v["error"]["message"].as_str().unwrap_or("").to_string();
        assert!(message(&v).contains("expected a number") && !message(&v).contains("f64"), "{v}");
        let v = expect_error(&c, &u, ok(json!({"max_tokens": "ten"})), 400, false).await;
        assert_eq!(v["error"]["param"], "max_tokens");
        assert!(message(&v).contains("an integer") && !message(&v).contains("i64") && !message(&v).contains("u32"), "{v}");
        let v = expect_error(&c, &u, ok(json!({"stop": 5})), 400, false).await;
        assert_eq!(v["error"]["param"], "stop");
        assert!(message(&v).contains("a string or an array of strings") && !message(&v).contains("OneOrMany"), "{v}");
        let v = expect_error(&c, &u, ok(json!({"max_tokens": 1.5})), 400, false).await;
        assert_eq!(v["error"]["param"], "max_tokens");
        // An integer beyond 64 bits (serde_json reads it as a float) is called out of range, not a float.
        let body = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "max_tokens": {}}}"#, "1".repeat(25));
        let v = expect_error(&c, &u, body.into_bytes(), 400, false).await;
        assert_eq!(v["error"]["param"], "max_tokens");
        assert!(message(&v).contains("out of range") && message(&v).contains("9223372036854775807") && !message(&v).contains("floating point"), "{v}");
        // … and so is one between 2^63 and 2^64 (serde_json reads it as a u64), repeated exactly,
        // or a negative one beyond 64 bits; a fraction is still a floating-point value.
        for (number, shown) in [("9223372036854775808", "`9223372036854775808` is out of range"), ("-99999999999999999999", "the integer is out of range")] {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "seed": {number}}}"#);
            let v = expect_error(&c, &u, body.into_bytes(), 400, false).await;
            assert_eq!(v["error"]["param"], "seed");
            assert!(message(&v).contains(shown) && message(&v).contains("from -9223372036854775808 to 9223372036854775807"), "{v}");
        }
        let v = expect_error(&c, &u, ok(json!({"max_tokens": 1.5})), 400, false).await;
        assert!(message(&v).contains("floating point") && message(&v).contains("an integer"), "{v}");
        expect_error(&c, &u, br#"{"messages": "hi"}"#.to_vec(), 400, false).await;
        expect_error(&c, &u, br#"{"max_tokens": 3}"#.to_vec(), 400, false).await;
        // Unknown model.
        let v = expect_error(&c, &u, ok(json!({"model": "gpt-4o"})), 404, false).await;
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error", "OpenAI's type for an unknown model");
        // Empty messages, unknown roles, bad content.
        expect_error(&c, &u, br#"{"messages": []}"#.to_vec(), 400, false).await;
        let v = expect_error(&c, &u, br#"{"messages": [{"role": "wizard", "content": "x"}]}"#.to_vec(), 400, false).await;
        assert!(v["error"]["message"].as_str().unwrap().contains("wizard"));
        expect_error(&c, &u, br#"{"messages": [{"content": "x"}]}"#.to_vec(), 400, false).await;
        expect_error(&c, &u, br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#.to_vec(), 400, false).await;
        expect_error(&c, &u, br#"{"messages": [{"role": "developer", "content": ""}]}"#.to_vec(), 400, false).await;
        // max_tokens ≤ 0, n > 1, prompt + max_tokens beyond the context.
        expect_error(&c, &u, ok(json!({"max_tokens": 0})), 400, false).await;
        expect_error(&c, &u, ok(json!({"max_tokens": -5})), 400, false).await;
        expect_error(&c, &u, ok(json!({"max_completion_tokens": 0})), 400, false).await;
        let v = expect_error(&c, &u, ok(json!({"n": 2})), 400, false).await;
        assert_eq!(v["error"]["param"], "n");
        let v = expect_error(&c, &u, ok(json!({"max_tokens": 5000})), 400, false).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        let long = "word ".repeat(5000);
        let v = expect_error(&c, &u, json!({"messages": [{"role": "user", "content": long}]}).to_string().into_bytes(), 400, false).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        // NaN/Inf cannot be written in JSON; huge or out-of-range numbers are refused.
        expect_error(&c, &u, br#"{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}"#.to_vec(), 400, false).await;
        expect_error(&c, &u, br#"{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}"#.to_vec(), 400, false).await;
        expect_error(&c, &u, br#"{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}"#.to_vec(), 400, false).await;
        for (k, v) in [("temperature", json!(-1)), ("temperature", json!(3)), ("top_p", json!(0)), ("top_p", json!(1.5)),
            ("presence_penalty", json!(9)), ("frequency_penalty", json!(-3)), ("repetition_penalty", json!(0)),
            ("min_p", json!(2)), ("top_k", json!(-7)), ("top_logprobs", json!(50)), ("stop", json!([""])),
            ("stop", json!(5)), ("seed", json!("x")), ("reasoning_effort", json!("extreme")),
            ("thinking", json!({"type": "maybe"})), ("tool_choice", json!(7)), ("tools", json!([{"type": "function"}])),
            ("stream", json!("yes")), ("stream_options", json!([true])), ("stream_options", json!("usage")),
            ("response_format", json!("json")), ("response_format", json!({"type": "yaml"})), ("response_format", json!([{"type": "json_object"}])),
            ("response_format", json!({"type": "json_schema"})), ("response_format", json!({"type": "json_schema", "json_schema": "oops"}))] {
            let v = expect_error(&c, &u, ok(json!({k: v})), 400, false).await;
            assert!(v["error"]["param"].as_str().unwrap_or("").starts_with(k) || k == "top_logprobs", "{k}: {v}");
        }
        // A message without content (only an assistant message may omit it); a named tool_choice
        // that names no declared tool; a body that is not JSON at all.
        for role in ["user", "system", "tool"] {
            let v = expect_error(&c, &u, json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}, {"role": role}]}).to_string().into_bytes(), 400, false).await;
            assert_eq!(v["error"]["param"], "messages[1].content", "{role}: {v}");
        }
        let f = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
        let v = expect_error(&c, &u, ok(json!({"tools": [f("get_weather")], "tool_choice": {"type": "function", "function": {"name": "nope"}}})), 400, false).await;
        assert_eq!(v["error"]["param"], "tool_choice", "{v}");
        expect_error(&c, &u, ok(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})), 400, false).await;
        assert_eq!(send(&c, "POST", &u, ok(json!({"tools": [f("get_weather")], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})), &[]).await.status, 200);
        // A tool whose parameters are no schema object, a tool call forced with no tools declared,
        // an empty content list, a logit_bias the sampler would not apply (fresh-user trial).
        for (body, param) in [
            (ok(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "bad"}}]})), "tools[0].function.parameters"),
            (ok(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]})), "tools[0].function.parameters"),
            // Two declarations of one function name (a call could not say which it means), also
            // with tool_choice "none" (the tools are checked whatever the choice; adversarial trial),
            // a tool that is no object, a function without a name object, a name that is no string.
            (ok(json!({"tools": [f("get_weather"), f("get_time"), f("get_weather")]})), "tools[2].function.name"),
            (ok(json!({"tools": [f("a"), f("a")], "tool_choice": "none"})), "tools[1].function.name"),
            (ok(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}], "tool_choice": "none"})), "tools[0].function.parameters"),
            (ok(json!({"tools": [1]})), "tools[0]"),
            (ok(json!({"tools": [{"type": "function", "function": "a"}]})), "tools[0].function"),
            (ok(json!({"tools": [{"type": "function", "function": {"name": 7}}]})), "tools[0].function.name"),
            (ok(json!({"tool_choice": "required"})), "tool_choice"),
            (ok(json!({"tools": [], "tool_choice": "required"})), "tool_choice"),
            (json!({"max_tokens": 2, "messages": [{"role": "user", "content": []}]}).to_string().into_bytes(), "messages[0].content"),
            (ok(json!({"logit_bias": {"5": 100}})), "logit_bias"),
            (ok(json!({"logit_bias": 7})), "logit_bias"),
        ] {
            let v = expect_error(&c, &u, body, 400, false).await;
            assert_eq!(v["error"]["param"], param, "{v}");
        }
        // A long duplicated name is shortened in the message (not echoed whole).
        let long = "n".repeat(10_000);
        let v = expect_error(&c, &u, ok(json!({"tools": [f(&long), f(&long)]})), 400, false).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.len() < 300 && m.contains('…')), "{v}");
        for extra in [json!({"logit_bias": {}}), json!({"logit_bias": null}), json!({"tool_choice": "auto"}), json!({"tools": [f("g")], "tool_choice": "required"})] {
            assert_eq!(send(&c, "POST", &u, ok(extra.clone()), &[]).await.status, 200, "{extra}");
        }
        expect_error(&c, &format!("{}/v1/completions", s.url()), br#"{"prompt": "x", "max_tokens": 1, "logit_bias": {"5": 1}}"#.to_vec(), 400, false).await;
        let v = expect_error(&c, &u, b"not json".to_vec(), 400, false).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("Malformed JSON")), "{v}");
        let v = expect_error(&c, &u, b"[1, 2]".to_vec(), 400, false).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("must be a JSON object")), "{v}");
        // The response formats OpenAI names are taken (text adds nothing to the prompt).
        for rf in [json!({"type": "text"}), json!({"type": "json_object"}), json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}), Value::Null] {
            assert_eq!(send(&c, "POST", &u, ok(json!({"response_format": rf.clone()})), &[]).await.status, 200, "{rf}");
        }
        // Oversize bodies → 413 (with and without Content-Length).
        let big = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "a".repeat(100 << 10));
        expect_error(&c, &u, big.into_bytes(), 413, false).await;
        // Completions.
        let cu = format!("{}/v1/completions", s.url());
        expect_error(&c, &cu, br#"{"prompt": 5}"#.to_vec(), 400, false).await;
        expect_error(&c, &cu, br#"{"prompt": ["a", "b"]}"#.to_vec(), 400, false).await;
        expect_error(&c, &cu, br#"{"prompt": [0, 999999999]}"#.to_vec(), 400, false).await;
        expect_error(&c, &cu, br#"{"prompt": "x", "max_tokens": 0}"#.to_vec(), 400, false).await;
        expect_error(&c, &cu, br#"{"prompt": "x", "best_of": 3}"#.to_vec(), 400, false).await;
        // An empty prompt is just BOS: fine.
        assert_eq!(send(&c, "POST", &cu, br#"{"prompt": "", "max_tokens": 1}"#.to_vec(), &[]).await.status, 200);
        // Anthropic shapes.
        let au = format!("{}/v1/messages", s.url());
        expect_error(&c, &au, b"{oops".to_vec(), 400, true).await;
        expect_error(&c, &au, br#"{"model": "flashseek-default", "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400, true).await;
        expect_error(&c, &au, br#"{"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 404, true).await;
        let v = expect_error(&c, &au, br#"{"model": "flashseek-default", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#.to_vec(), 400, true).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("top-level `system` field")), "{v}");
        expect_error(&c, &au, br#"{"model": "flashseek-default", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400, true).await;
        expect_error(&c, &au, br#"{"model": "flashseek-default", "max_tokens": 5, "messages": []}"#.to_vec(), 400, true).await;
        expect_error(&c, &au, br#"{"model": "flashseek-default", "max_tokens": 5, "temperature": 7, "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400, true).await;
        expect_error(&c, &au, br#"{"model": "flashseek-default", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}"#.to_vec(), 400, true).await;
        // A tool_choice naming a tool that is not declared (with tools and without).
        let tc = |tools: &str| format!(r#"{{"model": "flashseek-default", "max_tokens": 2, "messages": [{{"role": "user", "content": "x"}}]{tools}, "tool_choice": {{"type": "tool", "name": "nope"}}}}"#).into_bytes();
        let v = expect_error(&c, &au, tc(r#", "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]"#), 400, true).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("not among `tools`")), "{v}");
        expect_error(&c, &au, tc(""), 400, true).await;
        // Tools without an input_schema object, a tool use forced with no tools, an empty user
        // content list, a system prompt of the wrong type (named as `system`; fresh-user trial).
        let m = |extra: &str| format!(r#"{{"model": "flashseek-default", "max_tokens": 2, "messages": [{{"role": "user", "content": "x"}}]{extra}}}"#).into_bytes();
        for (body, needle) in [
            (m(r#", "tools": [{"name": "f"}]"#), "input_schema"),
            (m(r#", "tools": [{"name": "f", "input_schema": "notaschema"}]"#), "input_schema"),
            (m(r#", "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"name": "g", "input_schema": {"type": "object"}}, {"name": "f", "input_schema": {}}]"#), "tools[2].name: Tool names must be unique: `f` is declared more than once"),
            // Checked with tool_choice none too (adversarial trial), and malformed entries named.
            (m(r#", "tools": [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}], "tool_choice": {"type": "none"}"#), "tools[1].name"),
            (m(r#", "tools": [{"name": "f"}], "tool_choice": {"type": "none"}"#), "input_schema"),
            (m(r#", "tools": [null]"#), "must be an object"),
            (m(r#", "tools": [{"name": 1, "input_schema": {}}]"#), "must be a string"),
            (m(r#", "tool_choice": {"type": "any"}"#), "needs `tools`"),
            (m(r#", "system": 42"#), "`system`"),
            (m(r#", "system": {"a": 1}"#), "`system`"),
            (br#"{"model": "flashseek-default", "max_tokens": 2, "messages": [{"role": "user", "content": []}]}"#.to_vec(), "empty list"),
        ] {
            let v = expect_error(&c, &au, body, 400, true).await;
            assert!(v["error"]["message"].as_str().is_some_and(|s| s.contains(needle)), "{needle}: {v}");
        }
        assert_eq!(send(&c, "POST", &au, m(r#", "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}"#), &[]).await.status, 200);
        // Tool results: an id is optional (results match calls by order) but must be a string when given.
        let tr = |id: &str| format!(r#"{{"model": "flashseek-default", "max_tokens": 2, "messages": [{{"role": "user", "content": "x"}}, {{"role": "assistant", "content": [{{"type": "tool_use", "id": "t1", "name": "f", "input": {{}}}}]}}, {{"role": "user", "content": [{{"type": "tool_result"{id}, "content": "ok"}}]}}]}}"#).into_bytes();
        let v = expect_error(&c, &au, tr(r#", "tool_use_id": 7"#), 400, true).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("tool_use_id")), "{v}");
        assert_eq!(send(&c, "POST", &au, tr(""), &[]).await.status, 200);
        assert_eq!(send(&c, "POST", &au, tr(r#", "tool_use_id": "t1""#), &[]).await.status, 200);
        let tm = |id: &str| format!(r#"{{"max_tokens": 2, "messages": [{{"role": "user", "content": "x"}}, {{"role": "tool"{id}, "content": "ok"}}]}}"#).into_bytes();
        expect_error(&c, &u, tm(r#", "tool_call_id": 7"#), 400, false).await;
        assert_eq!(send(&c, "POST", &u, tm(""), &[]).await.status, 200);
        expect_error(&c, &format!("{au}/count_tokens"), br#"{"model": "flashseek-default"}"#.to_vec(), 400, true).await;
        // Unknown routes and methods are JSON too.
        let r = get(&c, &format!("{}/v2/nothing", s.url())).await;
        assert_eq!(r.status, 404);
        assert!(r.json()["error"]["message"].is_string());
        let r = get(&c, &u).await;
        assert_eq!(r.status, 405);
        assert!(r.json()["error"]["message"].is_string());
        // None of that was a 500, and the server still answers.
        let m = get(&c, &format!("{}/metrics", s.url())).await.body;
        assert!(!m.contains("status=\"500\""), "{m}");
        assert_eq!(post(&c, &u, &json!({"messages": [{"role": "user", "content": "still alive?"}], "max_tokens": 2})).await.status, 200);
    });
}

#[test]
fn api_key_is_required_when_set() {
    let mut cfg = config();
    cfg.api_key = Some("sekret".into());
    let s = start(cfg);
    rt().block_on(async {
        let c = client();
        let u = chat(&s.url());
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).to_string().into_bytes();
        let r = send(&c, "POST", &u, body.clone(), &[]).await;
        assert_eq!(r.status, 401);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert_eq!(send(&c, "POST", &u, body.clone(), &[("authorization", "Bearer wrong")]).await.status, 401);
        assert_eq!(send(&c, "POST", &u, body.clone(), &[("authorization", "Bearer sekret")]).await.status, 200);
        assert_eq!(send(&c, "POST", &u, body.clone(), &[("x-api-key", "sekret")]).await.status, 200);
        let a = send(&c, "POST", &format!("{}/v1/messages", s.url()), b"{}".to_vec(), &[]).await;
        assert_eq!(a.status, 401);
        assert_eq!(a.json()["error"]["type"], "authentication_error");
        assert_eq!(get(&c, &format!("{}/health", s.url())).await.status, 200);
    });
}

#[test]
fn full_queue_answers_429_and_cancellation_frees_state() {
    let mut cfg = config();
    cfg.scheduler.max_running = 1;
    cfg.scheduler.max_queue = 1;
    cfg.scheduler.prefix_cache_entries = 0;
    let s = start(cfg);
    rt().block_on(async {
        let c = client();
        let u = chat(&s.url());
        let long = json!({"messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 3000, "ignore_eos": true, "stream": true});
        let mut a = open_stream(&c, &u, &long).await;
        assert_eq!(a.status, 200);
        // Wait for generation to start.
        let mut seen = 0;
        while seen < 3 {
            let (_, d) = a.next().await.expect("tokens");
            if d.contains("\"content\"") {
                seen += 1;
            }
        }
        let b = open_stream(&c, &u, &long).await; // queued
        assert_eq!(b.status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (bytes, running, queued) = gauges(&c, &s.url()).await;
        assert_eq!((running, queued), (1.0, 1.0));
        assert!(bytes > 0.0);
        let r = post(&c, &u, &json!({"messages": [{"role": "user", "content": "me too"}], "max_tokens": 2})).await;
        assert_eq!(r.status, 429, "{}", r.body);
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(r.json()["error"]["type"], "rate_limit_error");
        let ar = post(&c, &format!("{}/v1/messages", s.url()), &json!({"model": "flashseek-default", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})).await;
        assert_eq!(ar.status, 429);
        assert_eq!(ar.json()["error"]["type"], "rate_limit_error");
        // Client disconnects: both requests are cancelled and their state is freed.
        drop(a);
        drop(b);
        assert_eq!(wait_idle(&c, &s.url()).await, 0.0);
        let m = get(&c, &format!("{}/metrics", s.url())).await.body;
        assert!(m.contains("flashseek_cancelled_requests_total 2"), "{m}");
        // A non-streamed request whose client gives up is cancelled too. The request goes over a raw
        // socket that is then closed, so the disconnect is certain (a pooled HTTP client may keep
        // the connection open after its future is dropped).
        let mut plain = long.clone();
        plain["stream"] = json!(false);
        {
            use std::io::Write;
            let addr = s.url().trim_start_matches("http://").to_string();
            let body = plain.to_string();
            let mut sock = std::net::TcpStream::connect(&addr).expect("connect");
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).unwrap();
            sock.write_all(body.as_bytes()).unwrap();
            // Let it start generating, then hang up.
            let mut started = false;
            for _ in 0..100 {
                let (_, running, _) = gauges(&c, &s.url()).await;
                if running >= 1.0 {
                    started = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(started, "the non-streamed request never started");
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(sock);
        }
        assert_eq!(wait_idle(&c, &s.url()).await, 0.0);
        let m = get(&c, &format!("{}/metrics", s.url())).await.body;
        assert!(m.contains("flashseek_cancelled_requests_total 3"), "{m}");
        // And the server takes work again.
        assert_eq!(post(&c, &u, &json!({"messages": [{"role": "user", "content": "again"}], "max_tokens": 2})).await.status, 200);
    });
}

#[test]
fn seeded_tokens_are_the_same_alone_and_batched() {
    let mut cfg = config();
    cfg.scheduler.prefix_cache_entries = 0;
    cfg.scheduler.prefill_chunk = 16;
    let s = start(cfg);
    rt().block_on(async {
        let c = client();
        let u = chat(&s.url());
        let probe = |seed: Option<u64>| {
            let mut b = json!({"messages": [{"role": "user", "content": "Tell me about determinism in batched inference."}],
                "max_tokens": 24, "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
            match seed {
                Some(sd) => {
                    b["seed"] = json!(sd);
                    b["temperature"] = json!(1.0);
                }
                None => b["temperature"] = json!(0),
            }
            b
        };
        for seed in [Some(1234u64), None] {
            let alone = post(&c, &u, &probe(seed)).await.json();
            // The same request among 8 others of different lengths, all in flight together.
            let mut others = Vec::new();
            for i in 0..8u64 {
                let c2 = c.clone();
                let u2 = u.clone();
                let words = "lorem ipsum ".repeat(1 + 9 * i as usize);
                others.push(tokio::spawn(async move {
                    let b = json!({"messages": [{"role": "user", "content": words}], "max_tokens": 4 + 5 * i, "seed": i, "ignore_eos": true});
                    post(&c2, &u2, &b).await.status
                }));
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            let batched = post(&c, &u, &probe(seed)).await.json();
            for o in others {
                assert_eq!(o.await.unwrap(), 200);
            }
            assert_eq!(alone["choices"][0]["message"]["content"], batched["choices"][0]["message"]["content"]);
            assert_eq!(alone["choices"][0]["logprobs"], batched["choices"][0]["logprobs"], "logprobs differ (seed {seed:?})");
        }
    });
}

#[test]
fn keepalive_comments_during_long_prefill() {
    let mut cfg = config();
    cfg.keepalive = Duration::from_millis(50);
    cfg.scheduler.prefill_chunk = 32;
    let s = start(cfg);
    rt().block_on(async {
        let c = client();
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(300);
        let mut st = open_stream(&c, &chat(&s.url()), &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "stream": true})).await;
        let mut comments = 0;
        loop {
            let (n, d) = st.next().await.expect("stream");
            if n.as_deref() == Some(":") {
                comments += 1;
            } else if d.contains("\"content\":\"") && !d.contains("\"role\"") || d == "[DONE]" {
                break;
            }
        }
        assert!(comments >= 1, "no keep-alive comment during a long prefill");
        while st.next().await.is_some() {}
    });
}

#[test]
fn graceful_shutdown_finishes_in_flight_streams() {
    let s = start(config());
    let url = s.url();
    let r = rt();
    let c = client();
    let mut st = r.block_on(open_stream(&c, &chat(&url), &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 40, "ignore_eos": true, "stream": true})));
    r.block_on(async { st.next().await.unwrap() });
    let stopper = std::thread::spawn(move || s.shutdown());
    let events = r.block_on(async {
        let mut ev = Vec::new();
        while let Some(e) = tokio::time::timeout(Duration::from_secs(60), st.next()).await.expect("stream ends in time") {
            ev.push(e);
        }
        ev
    });
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let (_, _, finish, _) = chat_stream_text(&events.iter().filter(|(n, _)| n.as_deref() != Some(":")).cloned().collect::<Vec<_>>());
    assert_eq!(finish.as_deref(), Some("length"));
    stopper.join().unwrap().unwrap();
    // Nothing listens any more.
    let after = r.block_on(async { tokio::time::timeout(Duration::from_secs(10), client().request(hyper::Request::get(format!("{url}/health")).body(Default::default()).unwrap())).await });
    assert!(matches!(after, Ok(Err(_))), "server still answering after shutdown");
}

#[test]
fn state_estimate_matches_measured_bytes() {
    let w = tiny_weights();
    let mut s = flashseek_engine::session::Session::new(&w, Default::default(), None);
    let ids: Vec<u32> = (0..640u32).map(|i| (i * 7919) % 120000 + 10).collect();
    s.prefill(&ids).unwrap();
    let est = flashseek_server::scheduler::state_bytes_per_token(&w.config) * ids.len();
    let real = s.state().bytes();
    assert!(est >= real && est - real < real / 100, "estimate {est} vs measured {real}");
}

#[test]
fn closing_scheduler_refuses_with_503() {
    use flashseek_server::scheduler::{start as start_engine, GenRequest, SchedulerConfig, SubmitError};
    let metrics = std::sync::Arc::new(flashseek_server::metrics::Metrics::default());
    let cfg = SchedulerConfig::default();
    let backend = flashseek_engine::session::CpuBackend { weights: tiny_weights(), forward: cfg.forward };
    let (h, engine) = start_engine(std::sync::Arc::new(backend), tokenizer(), cfg, metrics);
    let req = || {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            GenRequest {
                prompt: vec![0, 100, 200],
                params: flashseek_engine::sampler::SamplingParams::greedy(),
                max_tokens: 2,
                skip_special: true,
                events: tx,
                arrived: std::time::Instant::now(),
            },
            rx,
        )
    };
    let (r, mut rx) = req();
    h.submit(r).unwrap();
    let (mut n, mut started) = (0, 0);
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            flashseek_server::scheduler::Event::Started { cached } => {
                assert_eq!((n, cached), (0, 0), "Started comes first, nothing cached");
                started += 1;
            }
            flashseek_server::scheduler::Event::Token(_) => n += 1,
            flashseek_server::scheduler::Event::Done { usage, .. } => {
                assert_eq!(usage.completion_tokens, 2);
                break;
            }
            flashseek_server::scheduler::Event::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!((n, started), (2, 1));
    h.close();
    assert!(h.is_closing());
    assert_eq!(h.submit(req().0), Err(SubmitError::ShuttingDown));
    let e = flashseek_server::common::shutting_down();
    assert_eq!(e.status.as_u16(), 503);
    assert!(e.retry_after.is_some());
    // A closed, idle engine exits.
    engine.join().unwrap();
}

/// A backend that allocates like the GPU one (`GpuBackend`): sequences sized up front for their
/// request's length rounded up to a granule, at most `cap` tokens — on the CPU reference.
struct Capped {
    inner: flashseek_engine::session::CpuBackend,
    cap: usize,
    granule: usize,
}

impl flashseek_engine::session::Backend for Capped {
    type Seq<'a> = flashseek_engine::session::Session<'a>;
    fn config(&self) -> &flashseek_model::config::Ds4Config {
        self.inner.config()
    }
    fn max_sequence_len(&self) -> usize {
        self.cap
    }
    fn capacity_for(&self, needed: usize) -> usize {
        flashseek_engine::session::granular_capacity(needed, self.granule, self.cap)
    }
    fn new_sequence(&self, needed: usize) -> Result<Self::Seq<'_>, flashseek_engine::session::SessionError> {
        let mut s = self.inner.new_sequence(needed)?;
        s.max_len = self.capacity_for(needed);
        Ok(s)
    }
    fn parallel_decode(&self) -> bool {
        false
    }
}

#[test]
fn a_shared_prefix_is_copied_so_the_first_conversation_stays_cached() {
    // Two conversations that begin with the same long system prompt: the second copies the first
    // one's prefix (Backend::fork_sequence) instead of taking its session, so the first one's
    // follow-up still finds its whole first exchange; the second's answer equals a server's
    // without any prefix cache.
    let own = start(config());
    let mut plain = config();
    plain.scheduler.prefix_cache_entries = 0;
    let reference = start(plain);
    rt().block_on(async {
        let c = client();
        let system = "You answer in one short sentence and never use lists. ".repeat(4);
        let turn = |user: &str| json!({"model": "flashseek-default", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
        let a = post(&c, &chat(&own.url()), &turn("What is the capital of France?")).await.json();
        let prompt_a = a["usage"]["prompt_tokens"].as_u64().unwrap();
        // An unrelated chat shares only the template's first tokens (< MIN_FORK_TOKENS) with the
        // cached conversation: it gets a fresh sequence and leaves that one alone.
        let other = json!({"model": "flashseek-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "ignore_eos": true});
        let o = post(&c, &chat(&own.url()), &other).await.json();
        assert!(o["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() < flashseek_server::scheduler::MIN_FORK_TOKENS as u64, "{o}");
        let b = post(&c, &chat(&own.url()), &turn("Name a colour of the sky.")).await.json();
        let (prompt_b, cached_b) = (b["usage"]["prompt_tokens"].as_u64().unwrap(), b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
        assert!(cached_b >= flashseek_server::scheduler::MIN_FORK_TOKENS as u64 && cached_b < prompt_b, "b reused {cached_b} of {prompt_b}: {b}");
        let b_ref = post(&c, &chat(&reference.url()), &turn("Name a colour of the sky.")).await.json();
        assert_eq!(b_ref["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(b["choices"][0]["message"]["content"], b_ref["choices"][0]["message"]["content"]);
        let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let follow = json!({"model": "flashseek-default", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": answer}, {"role": "user", "content": "And of Spain?"}],
            "max_tokens": 2, "temperature": 0, "ignore_eos": true});
        let a2 = post(&c, &chat(&own.url()), &follow).await.json();
        let cached_a2 = a2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached_a2 >= prompt_a, "the follow-up reused {cached_a2} tokens, fewer than the first prompt's {prompt_a}: {a2}");
        let a2_ref = post(&c, &chat(&reference.url()), &follow).await.json();
        assert_eq!(a2["choices"][0]["message"]["content"], a2_ref["choices"][0]["message"]["content"]);
    });
}

#[test]
fn a_cached_conversation_spared_by_an_unrelated_prompt_is_not_counted_as_used() {
    // Two cached conversations, A then B, in a cache of two. A short prompt that shares only a few
    // template tokens with A gets a fresh sequence beside it; that is no use of A, so when the
    // third session is cached the least recently used — A — goes, and B's follow-up still finds
    // all of B.
    let mut cfg = config();
    cfg.scheduler.prefix_cache_entries = 2;
    let own = start(cfg);
    rt().block_on(async {
        let c = client();
        let ask = |system: &str, user: &str| json!({"model": "flashseek-default", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
        let a = post(&c, &chat(&own.url()), &ask("Be brief.", "What is the capital of France? Answer with the city only.")).await.json();
        let held_a = a["usage"]["total_tokens"].as_u64().unwrap();
        let b_sys = "You are a patient teacher of geography for children.";
        let b_user = "Which ocean is the largest one on Earth?";
        let b = post(&c, &chat(&own.url()), &ask(b_sys, b_user)).await.json();
        let prompt_b = b["usage"]["prompt_tokens"].as_u64().unwrap();
        // Shares A's system prompt only (a few tokens): a fresh sequence, A untouched.
        let o = post(&c, &chat(&own.url()), &ask("Be brief.", "hi")).await.json();
        let shared = o["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(shared < flashseek_server::scheduler::MIN_FORK_TOKENS as u64 && 2 * shared < held_a, "{o}");
        let answer = b["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let follow = json!({"model": "flashseek-default", "messages": [
            {"role": "system", "content": b_sys}, {"role": "user", "content": b_user},
            {"role": "assistant", "content": answer}, {"role": "user", "content": "And the smallest?"}],
            "max_tokens": 2, "temperature": 0, "ignore_eos": true});
        let b2 = post(&c, &chat(&own.url()), &follow).await.json();
        let cached_b2 = b2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached_b2 >= prompt_b, "B's follow-up reused {cached_b2} tokens, fewer than B's prompt ({prompt_b}): B was evicted: {b2}");
    });
}

#[test]
fn sized_sequences_limit_the_context_and_are_reused_when_they_fit() {
    let cfg = config();
    let backend = Capped { inner: flashseek_engine::session::CpuBackend { weights: tiny_weights(), forward: cfg.scheduler.forward }, cap: 96, granule: 32 };
    let s = flashseek_server::spawn_backend(cfg, std::sync::Arc::new(backend), tokenizer()).unwrap();
    rt().block_on(async {
        let c = client();
        // The backend's limit is the served context: /v1/models says so, a longer prompt is a 400.
        let m = get(&c, &format!("{}/v1/models", s.url())).await.json();
        assert_eq!(m["data"][0]["max_model_len"], 96);
        let long = "word ".repeat(120);
        let r = post(&c, &format!("{}/v1/completions", s.url()), &json!({"model": "flashseek-default", "prompt": long, "max_tokens": 4})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("context"), "{}", r.body);
        // A chat without max_tokens may grow to the limit: it ends there ("length").
        let r = post(&c, &chat(&s.url()), &json!({"model": "flashseek-default", "messages": [{"role": "user", "content": "one two three"}], "ignore_eos": true})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["total_tokens"], 96);
        // A follow-up turn that fits the first request's (rounded-up) sequence reuses its prefix.
        let first = json!({"model": "flashseek-default", "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 3, "ignore_eos": true});
        let a = post(&c, &chat(&s.url()), &first).await.json();
        let prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
        let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let second = json!({"model": "flashseek-default", "messages": [
            {"role": "user", "content": "Hello there."}, {"role": "assistant", "content": answer},
            {"role": "user", "content": "Again."}], "max_tokens": 2, "ignore_eos": true});
        let b = post(&c, &chat(&s.url()), &second).await.json();
        let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached >= prompt.min(8), "cached {cached} of a {prompt}-token first prompt: {b}");
    });
}

/// A backend whose sequences panic on their first prefill: the engine thread dies.
struct Broken(Capped);

impl flashseek_engine::session::Backend for Broken {
    type Seq<'a> = flashseek_engine::session::Session<'a>;
    fn config(&self) -> &flashseek_model::config::Ds4Config {
        self.0.config()
    }
    fn max_sequence_len(&self) -> usize {
        self.0.max_sequence_len()
    }
    fn capacity_for(&self, needed: usize) -> usize {
        self.0.capacity_for(needed)
    }
    fn new_sequence(&self, _needed: usize) -> Result<Self::Seq<'_>, flashseek_engine::session::SessionError> {
        panic!("a broken backend (test)")
    }
    fn parallel_decode(&self) -> bool {
        false
    }
}

#[test]
fn a_dead_engine_shuts_the_server_down_with_an_error() {
    // Found by a fresh-user trial: after the engine thread panicked the server answered 503 for
    // ever and exited 0 on SIGINT, so no supervisor would restart it.
    let cfg = config();
    let inner = Capped { inner: flashseek_engine::session::CpuBackend { weights: tiny_weights(), forward: cfg.scheduler.forward }, cap: 96, granule: 32 };
    let s = flashseek_server::spawn_backend(cfg, std::sync::Arc::new(Broken(inner)), tokenizer()).unwrap();
    rt().block_on(async {
        let c = client();
        let r = post(&c, &chat(&s.url()), &json!({"model": "flashseek-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
        assert_eq!(r.status, 503, "{}", r.body);
    });
    let t = std::time::Instant::now();
    while !s.is_finished() {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "the server kept running without its engine");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let e = s.shutdown().expect_err("a dead engine is an error");
    assert!(e.to_string().contains("engine thread panicked"), "{e}");
}

#[test]
fn shutdown_does_not_wait_for_a_half_sent_request_for_ever() {
    // Found by a break-it pass: a client that sent half a request head and went quiet held the
    // graceful shutdown open for as long as it kept the connection (hyper waits for it).
    use std::io::Write;
    let mut cfg = config();
    cfg.drain_timeout = std::time::Duration::from_secs(1);
    let s = start(cfg);
    let mut half = std::net::TcpStream::connect(s.addr).unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t = std::time::Instant::now();
    s.shutdown().unwrap();
    let took = t.elapsed();
    assert!(took < std::time::Duration::from_secs(1) + flashseek_server::SHUTDOWN_GRACE + std::time::Duration::from_secs(3), "shutdown took {took:?}");
    drop(half);
}

#[test]
fn a_body_is_one_json_object() {
    let s = shared();
    rt().block_on(async {
        let c = client();
        let body = json!({"model": "flashseek-default", "prompt": "hi", "max_tokens": 2}).to_string();
        let url = format!("{}/v1/completions", s.url());
        // Text or a second object after the object is malformed; a byte-order mark before it is not.
        for bad in [format!("{body} trailing"), format!("{body}{body}")] {
            let r = send(&c, "POST", &url, bad.into_bytes(), &[]).await;
            assert_eq!(r.status, 400, "{}", r.body);
            assert!(r.body.contains("after the JSON object"), "{}", r.body);
        }
        let r = send(&c, "POST", &url, [b"\xEF\xBB\xBF".as_slice(), body.as_bytes(), b"\n  "].concat(), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    });
}

/// A second signal during the drain (`RunningServer::force_shutdown`, serve's second Ctrl-C)
/// cancels what is in flight and stops the server at once instead of after the drain timeout.
#[test]
fn a_second_signal_cuts_the_drain_short() {
    let mut cfg = config();
    cfg.drain_timeout = Duration::from_secs(300);
    let mut s = start(cfg);
    let url = s.url();
    let r = rt();
    let c = client();
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let mut st = r.block_on(open_stream(&c, &chat(&url), &body));
    r.block_on(async { st.next().await.unwrap() });
    s.begin_shutdown();
    // The drain goes on: more tokens arrive after the first signal.
    let during = r.block_on(async {
        let mut n = 0;
        while n < 5 {
            tokio::time::timeout(Duration::from_secs(60), st.next()).await.expect("tokens during the drain").expect("stream open");
            n += 1;
        }
        n
    });
    assert_eq!(during, 5);
    let t0 = std::time::Instant::now();
    s.force_shutdown().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30), "stopped after {:?}", t0.elapsed());
    // The stream ends without its 4,000 tokens.
    let events = r.block_on(async {
        let mut ev = Vec::new();
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(30), st.next()).await {
            ev.push(e);
        }
        ev
    });
    let (content, _, finish, _) = chat_stream_text(&events.iter().filter(|(n, _)| n.as_deref() != Some(":")).cloned().collect::<Vec<_>>());
    assert_ne!(finish.as_deref(), Some("length"), "the request ran to its end: {} chars", content.len());
}
