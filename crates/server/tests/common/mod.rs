//! Shared by the server's integration tests: a tiny model, servers on loopback, a small HTTP client.

#![allow(dead_code)]

use flashseek_engine::testing::FormulaSource;
use flashseek_engine::weights::ModelWeights;
use flashseek_model::config::Ds4Config;
use flashseek_model::tokenizer::Ds4Tokenizer;
use flashseek_server::{RunningServer, ServerConfig};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A tiny random DeepSeek-V4 (the real vocabulary, so the tokenizer and chat format run for real;
/// hidden 64, 3 layers: sliding, CSA 4, HCA 128) — fast enough for many requests on 2 cores.
pub fn tiny_weights() -> Arc<ModelWeights> {
    static W: OnceLock<Arc<ModelWeights>> = OnceLock::new();
    W.get_or_init(|| {
        let text = r#"{
            "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 32,
            "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32, "sliding_window": 16,
            "compress_ratios": [0, 4, 128], "num_hash_layers": 1,
            "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
            "index_n_heads": 2, "index_head_dim": 64, "index_topk": 8,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64,
            "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
            "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false
        }"#;
        let v: Value = serde_json::from_str(text).unwrap();
        let cfg = Ds4Config::from_json(&v).unwrap();
        let src = FormulaSource { seed: 4, n_experts: cfg.n_routed_experts };
        Arc::new(ModelWeights::load(&cfg, &src).unwrap())
    })
    .clone()
}

/// The embedded tokenizer.
pub fn tokenizer() -> Arc<Ds4Tokenizer> {
    Arc::new(Ds4Tokenizer::shared().unwrap().clone())
}

/// Test settings: loopback, free port, tiny model.
pub fn config() -> ServerConfig {
    let mut c = ServerConfig { port: 0, ..ServerConfig::default() };
    c.scheduler.prefill_chunk = 64;
    c.scheduler.max_running = 16;
    c.drain_timeout = Duration::from_secs(5);
    c
}

/// Starts a server on the tiny model.
pub fn start(cfg: ServerConfig) -> RunningServer {
    flashseek_server::spawn(cfg, tiny_weights(), tokenizer()).unwrap()
}

/// A runtime for the client side.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response: status, headers, body text.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends a request with raw body bytes and extra headers.
pub async fn send(c: &HttpClient, method: &str, url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Resp {
    let mut b = hyper::Request::builder().method(method).uri(url).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body))).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(120), c.request(req)).await.expect("response in time").expect("request sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let bytes = tokio::time::timeout(Duration::from_secs(120), r.into_body().collect()).await.expect("body in time").unwrap().to_bytes();
    Resp { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

pub async fn post(c: &HttpClient, url: &str, body: &Value) -> Resp {
    send(c, "POST", url, body.to_string().into_bytes(), &[]).await
}

pub async fn get(c: &HttpClient, url: &str) -> Resp {
    send(c, "GET", url, Vec::new(), &[]).await
}

/// An SSE event: (event name, data).
pub type Sse = (Option<String>, String);

/// Parses an SSE body into events (comments dropped).
pub fn parse_sse(text: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        if !data.is_empty() {
            out.push((name, data.join("\n")));
        }
    }
    out
}

/// A streaming response read incrementally.
pub struct Stream {
    pub status: u16,
    body: hyper::body::Incoming,
    buf: String,
}

impl Stream {
    /// Reads until the next complete SSE block (None at the end). Comments are returned as
    /// `(Some(":"), text)`.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(p) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..p + 2).collect();
                if block.starts_with(':') {
                    return Some((Some(":".into()), block));
                }
                if let Some(e) = parse_sse(&block).into_iter().next() {
                    return Some(e);
                }
                continue;
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(d) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&d));
            }
        }
    }
}

pub async fn open_stream(c: &HttpClient, url: &str, body: &Value) -> Stream {
    let req = hyper::Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let r = c.request(req).await.unwrap();
    Stream { status: r.status().as_u16(), body: r.into_body(), buf: String::new() }
}

/// `flashseek_state_memory_bytes{kind="running"}` and the running/queued gauges from /metrics.
pub async fn gauges(c: &HttpClient, base: &str) -> (f64, f64, f64) {
    let m = get(c, &format!("{base}/metrics")).await.body;
    let read = |key: &str| {
        m.lines().find(|l| l.starts_with(key)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(-1.0)
    };
    (read("flashseek_state_memory_bytes{kind=\"running\"}"), read("flashseek_running_sequences "), read("flashseek_queued_requests "))
}

/// Waits (bounded) until no sequence runs and none waits; returns the running state bytes.
pub async fn wait_idle(c: &HttpClient, base: &str) -> f64 {
    for _ in 0..200 {
        let (bytes, running, queued) = gauges(c, base).await;
        if running == 0.0 && queued == 0.0 && bytes == 0.0 {
            return bytes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gauges(c, base).await.0
}
