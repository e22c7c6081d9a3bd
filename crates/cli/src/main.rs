//! `flashseek`: the DeepSeek-V4 inference engine's command-line entry point.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod cmd;

/// `--version`: the crate version and, when the build recorded it (`FLASHSEEK_COMMIT=$(git rev-parse
/// HEAD) cargo build`), the commit — what benchmark reports quote.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| match option_env!("FLASHSEEK_COMMIT") {
    Some(c) => format!("{} (commit {c})", env!("CARGO_PKG_VERSION")),
    None => env!("CARGO_PKG_VERSION").to_string(),
});

/// flashseek — an exact DeepSeek-V4 inference engine.
#[derive(Parser)]
#[command(name = "flashseek", version = VERSION.as_str(), about)]
struct Cli {
    /// Set an optimisation switch, NAME=VALUE (repeatable; overrides FLASHSEEK_<NAME>). `flashseek
    /// switches` lists them.
    #[arg(long = "switch", global = true, value_name = "NAME=VALUE")]
    switch: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Chat with the model in DeepSeek-V4's chat format (one message with --message, else a REPL).
    Chat(cmd::chat::Args),
    /// Continue a raw-text prompt.
    Generate(cmd::generate::Args),
    /// Time prefill and decode of the GPU forward on DeepSeek-V4-Flash shapes (random weights, needs a GPU).
    GpuBench(cmd::gpu_bench::Args),
    /// Check every CUDA op against the CPU reference and time decode-shaped layers (needs a GPU).
    GpuCheck(cmd::gpu_check::Args),
    /// Print a checkpoint's config summary, layer schedule, weight formats and parameter counts.
    Inspect(cmd::inspect::Args),
    /// Write the one-shot fp32 logits of every position of a token-id sequence (tensor `logits` [T, vocab]).
    Logits(cmd::logits::Args),
    /// Qualify the prefill stack: exact-length prompts × every switch configuration, JSON + SVG (needs a GPU).
    Qualify(cmd::qualify::Args),
    /// Serve the model over HTTP: OpenAI- and Anthropic-compatible APIs with continuous batching.
    Serve(cmd::serve::Args),
    /// List the optimisation switches: env var, flag, default, current value, what each replaces.
    Switches(cmd::switches::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = apply_switches(&cli.switch) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Chat(a) => cmd::chat::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::GpuBench(a) => cmd::gpu_bench::run(a),
        Command::GpuCheck(a) => cmd::gpu_check::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Qualify(a) => cmd::qualify::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Switches(a) => cmd::switches::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            // Invalid values of arguments exit 2 like clap's own argument errors.
            if e.downcast_ref::<cmd::common::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Applies the `--switch` flags, then checks the `FLASHSEEK_<NAME>` variables they do not override,
/// before anything reads them.
fn apply_switches(flags: &[String]) -> Result<(), flashseek_engine::switches::SwitchError> {
    for f in flags {
        flashseek_engine::switches::set_override(f)?;
    }
    for v in flashseek_engine::switches::unknown_variables(std::env::vars_os().map(|(k, _)| k)) {
        match flashseek_engine::switches::variable_suggestion(&v) {
            Some(k) => eprintln!("warning: {v} is not a flashseek switch or setting (ignored); did you mean {k}? `flashseek switches` lists the switches"),
            None => eprintln!("warning: {v} is not a flashseek switch or setting (ignored); `flashseek switches` lists the switches"),
        }
    }
    flashseek_engine::switches::check_environment()
}

/// The error and its causes, each printed once (a cause whose text the message already holds is
/// skipped, so a wrapped I/O error is not repeated).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}
