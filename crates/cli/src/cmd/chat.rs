//! `flashseek chat`: a one-shot message (`--message`) or an interactive REPL, in DeepSeek-V4's chat
//! format (chat_encoding_v4.md), with thinking on or off. Reasoning is shown dimmed; each answer
//! ends with a statistics line. Turns reuse the previous turns' state (prefix reuse).

use super::common::{generate_text, load, stats_line, ModelArgs, SamplingArgs};
use flashseek_engine::sampler::Sampler;
use flashseek_model::chat::{encode_messages, EncodeOptions, ReasoningEffort, StreamEvent, StreamParser, ThinkingMode};
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};

/// Arguments of `chat`.
#[derive(clap::Args)]
pub struct Args {
    /// Send this one message, print the answer and exit (otherwise: an interactive session).
    #[arg(long, short, allow_hyphen_values = true)]
    pub message: Option<String>,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Thinking mode: the model reasons (shown dimmed) before answering.
    #[arg(long, overrides_with = "no_think")]
    pub think: bool,
    /// Chat mode without reasoning (the default).
    #[arg(long, overrides_with = "think")]
    pub no_think: bool,
    /// Reasoning effort prefix: `high` or `max`; turns thinking on (as `reasoning_effort` does on
    /// the server) unless `--no-think` is given, which refuses it.
    #[arg(long, value_parser = ["high", "max"])]
    pub reasoning_effort: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Runs `chat`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.no_think && args.reasoning_effort.is_some() {
        anyhow::bail!("--reasoning-effort needs thinking mode; drop --no-think");
    }
    // Bad sampling values are reported before the model loads.
    args.sampling.params(0)?;
    let m = load(&args.model)?;
    let thinking = (args.think || args.reasoning_effort.is_some()) && !args.no_think;
    let mode = if thinking { ThinkingMode::Thinking } else { ThinkingMode::Chat };
    let effort = match args.reasoning_effort.as_deref() {
        Some("high") => Some(ReasoningEffort::High),
        Some("max") => Some(ReasoningEffort::Max),
        _ => None,
    };
    let mut session = m.sequence()?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let color = std::io::stdout().is_terminal();
    let interactive = args.message.is_none();
    if interactive {
        eprintln!("flashseek chat — type a message and press Enter; /reset clears the conversation, /exit or Ctrl-D quits.");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let user = match &args.message {
            Some(msg) => msg.clone(),
            None => {
                eprint!("> ");
                let _ = std::io::stderr().flush();
                match lines.next() {
                    Some(Ok(l)) => l,
                    Some(Err(e)) => return Err(e.into()),
                    None => {
                        // End of input (Ctrl-D): end the prompt's line.
                        eprintln!();
                        break;
                    }
                }
            }
        };
        match user.trim() {
            "" if interactive => continue,
            "/exit" | "/quit" if interactive => break,
            "/reset" if interactive => {
                messages.retain(|m: &serde_json::Value| m["role"] == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": user}));
        let prompt = encode_messages(
            &messages,
            &EncodeOptions {
                thinking_mode: mode,
                reasoning_effort: effort,
                drop_thinking: true,
                add_default_bos_token: true,
                context: None,
            },
        )?;
        let ids = m.tokenizer.encode_with_special(&prompt)?;
        let params = args.sampling.params(m.tokenizer.eos_id())?;
        let mut sampler = Sampler::new(params, &ids)?;
        let mut parser = StreamParser::new(mode);
        let mut raw = String::new();
        let mut out = std::io::stdout().lock();
        let mut shown_reasoning = false;
        let broken = std::cell::Cell::new(false);
        let mut print = |events: Vec<StreamEvent>, out: &mut std::io::StdoutLock<'_>| {
            for e in events {
                match e {
                    StreamEvent::Reasoning(t) => {
                        shown_reasoning = true;
                        if color {
                            let _ = write!(out, "\x1b[2m{t}\x1b[0m");
                        } else {
                            let _ = write!(out, "{t}");
                        }
                    }
                    StreamEvent::Content(t) => {
                        if shown_reasoning {
                            let _ = writeln!(out);
                            shown_reasoning = false;
                        }
                        let _ = write!(out, "{t}");
                    }
                    StreamEvent::ToolCallStart { name, .. } => {
                        let _ = write!(out, "\n[tool call {name}(");
                    }
                    StreamEvent::ToolCallArguments { delta, .. } => {
                        let _ = write!(out, "{delta}");
                    }
                    StreamEvent::ToolCallEnd { .. } => {
                        let _ = write!(out, ")]");
                    }
                }
            }
            if out.flush().is_err() {
                broken.set(true);
            }
        };
        let stats = generate_text(session.as_mut(), &m.tokenizer, &ids, &mut sampler, args.sampling.max_tokens, false, |text| {
            raw.push_str(text);
            print(parser.push(text), &mut out);
            // A closed stdout stops generation.
            !broken.get()
        })?;
        print(parser.end_of_input(), &mut out);
        let _ = writeln!(out);
        drop(out);
        eprintln!("{}", stats_line(&stats));
        // Keep the turn in the conversation (a malformed completion is kept as plain content).
        let parsed = parser.finish();
        let (content, reasoning) = match parsed {
            Ok(p) => (p.content, p.reasoning_content),
            Err(_) => (raw.trim_end_matches(flashseek_model::chat::EOS).to_string(), String::new()),
        };
        messages.push(json!({"role": "assistant", "content": content, "reasoning_content": reasoning}));
        if !interactive {
            break;
        }
    }
    Ok(())
}
