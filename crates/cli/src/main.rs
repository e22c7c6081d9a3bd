//! `flashseek`: the DeepSeek-V4 inference engine's command-line entry point.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod cmd;

/// flashseek — an exact DeepSeek-V4 inference engine.
#[derive(Parser)]
#[command(name = "flashseek", version, about)]
struct Cli {
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
    /// Serve the model over HTTP: OpenAI- and Anthropic-compatible APIs with continuous batching.
    Serve(cmd::serve::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Chat(a) => cmd::chat::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::GpuBench(a) => cmd::gpu_bench::run(a),
        Command::GpuCheck(a) => cmd::gpu_check::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
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
