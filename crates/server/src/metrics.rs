//! Server metrics in the Prometheus text exposition format (`GET /metrics`).

use crate::scheduler::Usage;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const TTFT_BUCKETS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
const ITL_BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
const E2E_BUCKETS: [f64; 13] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// A cumulative histogram.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }
    fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Throughput over a sliding window of recent work.
#[derive(Debug, Default)]
struct Rate {
    /// (when, tokens, busy seconds)
    recent: std::collections::VecDeque<(Instant, u64, f64)>,
}

impl Rate {
    const WINDOW_SECS: f64 = 10.0;
    fn add(&mut self, tokens: u64, secs: f64) {
        let now = Instant::now();
        self.recent.push_back((now, tokens, secs));
        while self.recent.front().is_some_and(|(t, _, _)| now.duration_since(*t).as_secs_f64() > Self::WINDOW_SECS) {
            self.recent.pop_front();
        }
    }
    /// Tokens per busy second over the window (0 when idle for the whole window).
    fn value(&self) -> f64 {
        let now = Instant::now();
        let (mut tok, mut secs) = (0u64, 0.0f64);
        for (t, n, s) in &self.recent {
            if now.duration_since(*t).as_secs_f64() <= Self::WINDOW_SECS {
                tok += n;
                secs += s;
            }
        }
        if secs > 0.0 {
            tok as f64 / secs
        } else {
            0.0
        }
    }
}

#[derive(Debug)]
struct Timed {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill_rate: Rate,
    decode_rate: Rate,
    prefill_secs: f64,
    decode_secs: f64,
    requests: BTreeMap<(String, u16), u64>,
}

/// All counters, gauges and histograms.
#[derive(Debug)]
pub struct Metrics {
    timed: Mutex<Timed>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    cancelled: AtomicU64,
    running: AtomicUsize,
    queued: AtomicUsize,
    state_running: AtomicUsize,
    state_cached: AtomicUsize,
    state_reserved: AtomicUsize,
    state_budget: AtomicUsize,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            timed: Mutex::new(Timed {
                ttft: Histogram::new(&TTFT_BUCKETS),
                itl: Histogram::new(&ITL_BUCKETS),
                e2e: Histogram::new(&E2E_BUCKETS),
                queue: Histogram::new(&TTFT_BUCKETS),
                prefill_rate: Rate::default(),
                decode_rate: Rate::default(),
                prefill_secs: 0.0,
                decode_secs: 0.0,
                requests: BTreeMap::new(),
            }),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            state_running: AtomicUsize::new(0),
            state_cached: AtomicUsize::new(0),
            state_reserved: AtomicUsize::new(0),
            state_budget: AtomicUsize::new(0),
        }
    }
}

/// A snapshot of the engine's gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineGauges {
    /// Sequences prefilling or decoding.
    pub running: usize,
    /// Requests waiting for admission.
    pub queued: usize,
    /// State bytes of running sequences (measured).
    pub state_running_bytes: usize,
    /// State bytes of the prefix cache (measured).
    pub state_cached_bytes: usize,
}

impl Metrics {
    fn timed(&self) -> std::sync::MutexGuard<'_, Timed> {
        self.timed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One HTTP response.
    pub fn request(&self, endpoint: &str, status: u16) {
        *self.timed().requests.entry((endpoint.to_string(), status)).or_insert(0) += 1;
    }
    /// Time to first token of one request.
    pub fn ttft(&self, secs: f64) {
        self.timed().ttft.observe(secs);
    }
    /// Time between two tokens of one request.
    pub fn itl(&self, secs: f64) {
        self.timed().itl.observe(secs);
    }
    /// Time a request waited for admission.
    pub fn queue_wait(&self, secs: f64) {
        self.timed().queue.observe(secs);
    }
    /// A prefill chunk of `tokens` took `secs`.
    pub fn prefill(&self, tokens: usize, secs: f64) {
        self.prefill_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        let mut t = self.timed();
        t.prefill_rate.add(tokens as u64, secs);
        t.prefill_secs += secs;
    }
    /// A decode step over `seqs` sequences took `secs`.
    pub fn decode(&self, seqs: usize, secs: f64) {
        let mut t = self.timed();
        t.decode_rate.add(seqs as u64, secs);
        t.decode_secs += secs;
    }
    /// Requests cancelled by their client.
    pub fn cancelled(&self, n: usize) {
        self.cancelled.fetch_add(n as u64, Ordering::Relaxed);
    }
    /// A request finished (normally or cancelled by the server).
    pub fn finished(&self, u: &Usage) {
        self.prompt_tokens.fetch_add(u.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(u.cached_tokens as u64, Ordering::Relaxed);
        self.generation_tokens.fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
        self.timed().e2e.observe((u.queue_ms + u.prefill_ms + u.decode_ms) / 1e3);
    }
    /// The state-memory budget.
    pub fn set_budget(&self, bytes: usize) {
        self.state_budget.store(bytes, Ordering::Relaxed);
    }
    /// The engine's gauges, after each loop iteration.
    pub fn set_engine_gauges(&self, running: usize, queued: usize, state_running: usize, state_cached: usize, reserved: usize) {
        self.running.store(running, Ordering::Relaxed);
        self.queued.store(queued, Ordering::Relaxed);
        self.state_running.store(state_running, Ordering::Relaxed);
        self.state_cached.store(state_cached, Ordering::Relaxed);
        self.state_reserved.store(reserved, Ordering::Relaxed);
    }
    /// The engine's gauges as last published.
    pub fn engine_gauges(&self) -> EngineGauges {
        EngineGauges {
            running: self.running.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            state_running_bytes: self.state_running.load(Ordering::Relaxed),
            state_cached_bytes: self.state_cached.load(Ordering::Relaxed),
        }
    }

    /// The Prometheus text exposition of everything.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let t = self.timed();
        let _ = writeln!(o, "# HELP flashseek_requests_total HTTP responses by endpoint and status.\n# TYPE flashseek_requests_total counter");
        for ((ep, st), n) in &t.requests {
            let _ = writeln!(o, "flashseek_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
        }
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |o: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(&mut o, "flashseek_prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens.load(Ordering::Relaxed));
        counter(&mut o, "flashseek_cached_prompt_tokens_total", "Prompt tokens reused from the prefix cache.", self.cached_tokens.load(Ordering::Relaxed));
        counter(&mut o, "flashseek_generation_tokens_total", "Generated tokens of finished requests.", self.generation_tokens.load(Ordering::Relaxed));
        counter(&mut o, "flashseek_prefill_tokens_total", "Prompt tokens computed by prefill.", self.prefill_tokens.load(Ordering::Relaxed));
        counter(&mut o, "flashseek_cancelled_requests_total", "Requests cancelled because their client went away.", self.cancelled.load(Ordering::Relaxed));
        let _ = writeln!(o, "# HELP flashseek_engine_seconds_total Engine busy time by phase.\n# TYPE flashseek_engine_seconds_total counter");
        let _ = writeln!(o, "flashseek_engine_seconds_total{{phase=\"prefill\"}} {}", t.prefill_secs);
        let _ = writeln!(o, "flashseek_engine_seconds_total{{phase=\"decode\"}} {}", t.decode_secs);
        gauge(&mut o, "flashseek_running_sequences", "Sequences prefilling or decoding.", self.running.load(Ordering::Relaxed) as f64);
        gauge(&mut o, "flashseek_queued_requests", "Requests waiting for admission.", self.queued.load(Ordering::Relaxed) as f64);
        let _ = writeln!(o, "# HELP flashseek_state_memory_bytes Sequence state memory.\n# TYPE flashseek_state_memory_bytes gauge");
        let _ = writeln!(o, "flashseek_state_memory_bytes{{kind=\"running\"}} {}", self.state_running.load(Ordering::Relaxed));
        let _ = writeln!(o, "flashseek_state_memory_bytes{{kind=\"prefix_cache\"}} {}", self.state_cached.load(Ordering::Relaxed));
        let _ = writeln!(o, "flashseek_state_memory_bytes{{kind=\"reserved\"}} {}", self.state_reserved.load(Ordering::Relaxed));
        gauge(&mut o, "flashseek_state_memory_budget_bytes", "State memory budget for admission.", self.state_budget.load(Ordering::Relaxed) as f64);
        gauge(&mut o, "flashseek_prefill_tokens_per_second", "Prefill throughput over the last 10 s of prefill work.", t.prefill_rate.value());
        gauge(&mut o, "flashseek_decode_tokens_per_second", "Decode throughput (tokens of all sequences) over the last 10 s of decode work.", t.decode_rate.value());
        t.ttft.write(&mut o, "flashseek_time_to_first_token_seconds", "Arrival to first generated token.");
        t.itl.write(&mut o, "flashseek_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
        t.e2e.write(&mut o, "flashseek_request_duration_seconds", "Arrival to last token of finished requests.");
        t.queue.write(&mut o, "flashseek_queue_wait_seconds", "Arrival to admission.");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.request("chat_completions", 200);
        m.request("chat_completions", 400);
        m.ttft(0.02);
        m.itl(0.003);
        m.prefill(100, 0.5);
        m.decode(4, 0.1);
        m.finished(&Usage { prompt_tokens: 10, cached_tokens: 2, completion_tokens: 5, ..Usage::default() });
        let t = m.render();
        assert!(t.contains("flashseek_requests_total{endpoint=\"chat_completions\",status=\"400\"} 1"), "{t}");
        assert!(t.contains("flashseek_prompt_tokens_total 10"));
        assert!(t.contains("flashseek_generation_tokens_total 5"));
        assert!(t.contains("flashseek_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(t.contains("flashseek_time_to_first_token_seconds_bucket{le=\"0.01\"} 0"));
        assert!(t.contains("flashseek_inter_token_latency_seconds_count 1"));
        assert!(t.contains("flashseek_prefill_tokens_per_second 200"));
        assert!(t.contains("flashseek_decode_tokens_per_second 40"));
        // Every non-comment line is `name{labels} value` with a numeric value.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}
