//! flashseek-server: the HTTP front end — OpenAI- and Anthropic-compatible APIs over a
//! continuous-batching scheduler.
//!
//! - [`scheduler`]: the engine thread (continuous batching, chunked prefill, admission control,
//!   cancellation, prefix cache).
//! - [`openai`], [`anthropic`]: the endpoints, request checking and response shapes (JSON and SSE).
//! - [`assemble`]: generated text → reasoning / content / complete tool calls.
//! - [`metrics`]: Prometheus text.
//!
//! [`serve`] runs a server until a shutdown signal; [`spawn`] runs one on a background thread
//! (tests, embedding).

pub mod anthropic;
pub mod assemble;
pub mod common;
pub mod error;
pub mod metrics;
pub mod openai;
pub mod scheduler;

pub use flashseek_engine as engine;

use crate::common::{AppState, HttpSettings};
use crate::error::{ApiError, Flavor};
use crate::metrics::Metrics;
use crate::scheduler::{SchedulerConfig, SchedulerHandle};
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flashseek_engine::session::{Backend, CpuBackend};
use flashseek_engine::weights::ModelWeights;
use flashseek_model::tokenizer::Ds4Tokenizer;
use futures_util::FutureExt;
use serde_json::json;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Everything `flashseek serve` can be told.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind.
    pub host: String,
    /// Port to bind (0 = any free port).
    pub port: u16,
    /// Names the model answers to; the first is reported.
    pub model_names: Vec<String>,
    /// Required API key, if any.
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// SSE keep-alive comment interval.
    pub keepalive: Duration,
    /// On shutdown, how long in-flight requests may run before they are cancelled.
    pub drain_timeout: Duration,
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            model_names: vec!["flashseek-default".into()],
            api_key: None,
            max_body_bytes: 4 << 20,
            keepalive: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            scheduler: SchedulerConfig::default(),
        }
    }
}

fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// API-key check for `/v1/*` (Bearer token or `x-api-key`).
async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.http.api_key {
        let path = req.uri().path();
        if path.starts_with("/v1/") {
            let h = req.headers();
            let bearer = h
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                .map(str::trim);
            let x = h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
            if bearer != Some(key.as_str()) && x != Some(key.as_str()) {
                return ApiError::status(StatusCode::UNAUTHORIZED, "Invalid or missing API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`).")
                    .with_code("invalid_api_key")
                    .response(flavor_of(path));
            }
        }
    }
    next.run(req).await
}

/// Counts responses by endpoint and status; turns a handler panic into a 500 JSON answer.
async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().trim_start_matches('/').replace(['/', '{', '}'], "_"))
        .unwrap_or_else(|| "other".into());
    let flavor = flavor_of(req.uri().path());
    let resp = match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(r) => r,
        Err(_) => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "Internal error while handling the request.").response(flavor),
    };
    st.metrics.request(&endpoint, resp.status().as_u16());
    resp
}

async fn health(State(st): State<AppState>) -> Response {
    if st.sched.is_closing() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "shutting_down"}))).into_response();
    }
    let g = st.metrics.engine_gauges();
    Json(json!({"status": "ok", "model": st.model_name(), "running": g.running, "queued": g.queued})).into_response()
}

async fn metrics(State(st): State<AppState>) -> Response {
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], st.metrics.render()).into_response()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::status(StatusCode::NOT_FOUND, format!("No route for {} {path}.", req.method())).response(flavor_of(&path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::status(StatusCode::METHOD_NOT_ALLOWED, format!("Method {} is not allowed on {path}.", req.method()))
        .response(flavor_of(&path))
}

/// The router over `st`.
pub fn router(st: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(st.clone(), auth))
        .layer(axum::middleware::from_fn_with_state(st.clone(), observe))
        .with_state(st)
}

/// A server's pieces before it listens.
struct Parts {
    state: AppState,
    sched: SchedulerHandle,
    engine: std::thread::JoinHandle<()>,
}

/// The CPU reference as the engine's backend, with the scheduler's forward options.
fn cpu(cfg: &ServerConfig, weights: Arc<ModelWeights>) -> Arc<CpuBackend> {
    Arc::new(CpuBackend { weights, forward: cfg.scheduler.forward })
}

fn parts<B: Backend + Send + 'static>(cfg: &ServerConfig, backend: Arc<B>, tokenizer: Arc<Ds4Tokenizer>) -> Parts {
    let metrics = Arc::new(Metrics::default());
    let (sched, engine) = scheduler::start(backend, tokenizer.clone(), cfg.scheduler.clone(), metrics.clone());
    let mut names = cfg.model_names.clone();
    if names.is_empty() {
        names.push("flashseek-default".into());
    }
    let http = Arc::new(HttpSettings {
        model_names: names,
        api_key: cfg.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: cfg.max_body_bytes,
        keepalive: cfg.keepalive,
    });
    let state = AppState { sched: sched.clone(), tokenizer, metrics, http, created: common::unix_now() };
    Parts { state, sched, engine }
}

/// Serves on `listener` until `shutdown` completes, then stops accepting connections (a request
/// that reaches the scheduler after that, on a connection already open, gets 503), lets in-flight
/// ones finish for up to `drain_timeout`, cancels the rest, and stops the engine.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    cfg: ServerConfig,
    weights: Arc<ModelWeights>,
    tokenizer: Arc<Ds4Tokenizer>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let backend = cpu(&cfg, weights);
    run_parts(listener, parts(&cfg, backend, tokenizer), cfg.drain_timeout, shutdown, std::future::pending()).await
}

/// How long after the drain timeout a shutdown still waits for connections (a client idling in the
/// middle of a request head or body), before it drops them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// After a second shutdown signal: how long cancelled requests may take to send their last event
/// before the connections still open are dropped.
pub const FORCE_GRACE: Duration = Duration::from_secs(1);

/// Serves until `shutdown`; then drains for `drain`, cancels what is left and drops connections
/// still open `SHUTDOWN_GRACE` later. `force` completing after `shutdown` (a second Ctrl-C) cancels
/// at once and drops the connections still open `FORCE_GRACE` later.
async fn run_parts(
    listener: tokio::net::TcpListener,
    parts: Parts,
    drain: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
    force: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let Parts { state, sched, engine } = parts;
    let app = router(state);
    let closer = sched.clone();
    let watch = sched.clone();
    // The engine thread ending on its own (a panic) shuts the server down too, so that it exits
    // with an error a supervisor sees instead of answering 503 for ever.
    let engine_died = async move {
        while !watch.engine_stopped() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    // Graceful shutdown waits for every connection, also one whose client sent half a request
    // head and went quiet (hyper waits for it): after the drain in-flight requests are cancelled,
    // and a grace period later the connections still open are dropped.
    // Sends whether a second signal cut the drain short.
    let (expired_tx, expired) = tokio::sync::oneshot::channel::<bool>();
    let signal = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = engine_died => eprintln!("flashseek: the engine thread stopped; shutting down"),
        }
        closer.close();
        tokio::spawn(async move {
            tokio::pin!(force);
            let forced = tokio::select! {
                _ = tokio::time::sleep(drain) => false,
                _ = &mut force => true,
            };
            closer.cancel_all();
            if forced {
                // The cancelled streams still write their last event; connections left after
                // FORCE_GRACE are dropped.
                eprintln!("flashseek: second signal; cancelling in-flight requests now");
                tokio::time::sleep(FORCE_GRACE).await;
            } else {
                tokio::select! {
                    _ = tokio::time::sleep(SHUTDOWN_GRACE) => {}
                    _ = &mut force => {}
                }
            }
            let _ = expired_tx.send(forced);
        });
    };
    let served = axum::serve(listener, app).with_graceful_shutdown(signal);
    let r = tokio::select! {
        r = async { served.await } => r,
        Ok(forced) = expired => {
            if !forced {
                eprintln!("flashseek: connections still open {} s after the drain; closing them", SHUTDOWN_GRACE.as_secs());
            }
            Ok(())
        }
    };
    // Every connection is done or dropped: nothing in flight can still want its result.
    sched.close();
    sched.cancel_all();
    drop(sched);
    match tokio::task::spawn_blocking(move || engine.join()).await {
        Ok(Err(_)) => r.and(Err(std::io::Error::other("the engine thread panicked"))),
        _ => r,
    }
}

/// Binds `cfg.host:cfg.port` and serves the CPU reference until SIGINT/SIGTERM.
pub async fn serve(cfg: ServerConfig, weights: Arc<ModelWeights>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<()> {
    let backend = cpu(&cfg, weights);
    serve_backend(cfg, backend, tokenizer).await
}

/// Binds `cfg.host:cfg.port` and serves `backend` (the CPU reference or a GPU, see
/// [`flashseek_engine::session::Backend`]) until SIGINT/SIGTERM.
pub async fn serve_backend<B: Backend + Send + 'static>(cfg: ServerConfig, backend: Arc<B>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {}:{}: {e}", cfg.host, cfg.port)))?;
    let addr = listener.local_addr()?;
    eprintln!("flashseek: serving `{}` on http://{addr} (OpenAI: /v1/chat/completions, /v1/completions; Anthropic: /v1/messages)", cfg.model_names.first().map(String::as_str).unwrap_or("flashseek-default"));
    let drain = cfg.drain_timeout;
    // The first SIGINT/SIGTERM starts the graceful shutdown, a second one cuts it short (run_parts
    // polls `force` only once the shutdown has begun, so it waits for the next signal).
    run_parts(listener, parts(&cfg, backend, tokenizer), drain, shutdown_signal(), termination_signal()).await
}

/// [`serve`] on a new multi-threaded runtime, blocking until shutdown.
pub fn serve_blocking(cfg: ServerConfig, weights: Arc<ModelWeights>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<()> {
    let backend = cpu(&cfg, weights);
    serve_backend_blocking(cfg, backend, tokenizer)
}

/// [`serve_backend`] on a new multi-threaded runtime, blocking until shutdown.
pub fn serve_backend_blocking<B: Backend + Send + 'static>(cfg: ServerConfig, backend: Arc<B>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve_backend(cfg, backend, tokenizer))
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM, saying that the server finishes in-flight requests (a
/// second signal stops at once: see [`serve_backend`]).
pub async fn shutdown_signal() {
    termination_signal().await;
    eprintln!("flashseek: shutting down (finishing in-flight requests; Ctrl-C or SIGTERM again to stop now)");
}

/// Completes on the next SIGINT (Ctrl-C) or SIGTERM.
async fn termination_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// A server running on a background thread (see [`spawn`]).
pub struct RunningServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its metrics (for tests).
    pub metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    force: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl RunningServer {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the server has stopped on its own (its engine thread ended: see `run_parts`).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Triggers a graceful shutdown and waits for it.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.stop_and_join()
    }

    /// Starts a graceful shutdown (the first SIGINT of `serve`) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Cuts a graceful shutdown short (the second SIGINT of `serve`): in-flight requests are
    /// cancelled and connections dropped now; then waits for the server to stop.
    pub fn force_shutdown(mut self) -> std::io::Result<()> {
        self.begin_shutdown();
        if let Some(f) = self.force.take() {
            let _ = f.send(());
        }
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> std::io::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(std::io::Error::other("server thread panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Starts a server on its own thread and runtime (`cfg.port` 0 picks a free port); returns once
/// it listens.
pub fn spawn(cfg: ServerConfig, weights: Arc<ModelWeights>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<RunningServer> {
    let backend = cpu(&cfg, weights);
    spawn_backend(cfg, backend, tokenizer)
}

/// [`spawn`] on any [`Backend`].
pub fn spawn_backend<B: Backend + Send + 'static>(cfg: ServerConfig, backend: Arc<B>, tokenizer: Arc<Ds4Tokenizer>) -> std::io::Result<RunningServer> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)))?;
    let addr = listener.local_addr()?;
    let parts = parts(&cfg, backend, tokenizer);
    let metrics = parts.state.metrics.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (force_tx, force_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = cfg.drain_timeout;
    let thread = std::thread::Builder::new().name("flashseek-http".into()).spawn(move || {
        let stop = async move {
            let _ = rx.await;
        };
        // A dropped sender (no force) must not read as a force.
        let force = async move {
            if force_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        rt.block_on(run_parts(listener, parts, drain, stop, force))
    })?;
    Ok(RunningServer { addr, metrics, stop: Some(tx), force: Some(force_tx), thread: Some(thread) })
}
