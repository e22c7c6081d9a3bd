//! `flashseek generate --prompt TEXT`: raw-text continuation, streamed to the terminal.

use super::common::{load, stats_line, ModelArgs, SamplingArgs};
use flashseek_engine::generate::generate;
use flashseek_engine::sampler::{Sampler, StopMatcher};
use flashseek_model::tokenizer::StreamDecoder;
use std::io::Write;
use std::ops::ControlFlow;

/// Arguments of `generate`.
#[derive(clap::Args)]
pub struct Args {
    /// The prompt, as raw text (special-token text in it is not treated as special).
    #[arg(long, allow_hyphen_values = true)]
    pub prompt: String,
    /// Do not put BOS before the prompt.
    #[arg(long)]
    pub no_bos: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Runs `generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let m = load(&args.model)?;
    let mut ids = if args.no_bos { Vec::new() } else { vec![m.tokenizer.bos_id()] };
    ids.extend(m.tokenizer.encode_text(&args.prompt)?);
    let params = args.sampling.params(m.tokenizer.eos_id())?;
    let mut stops = StopMatcher::new(&params.stop_strings);
    let mut sampler = Sampler::new(params, &ids)?;
    let mut session = m.sequence()?;
    let mut dec = StreamDecoder::new(&m.tokenizer, true);
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", args.prompt);
    let mut io_err = None;
    let stats = generate(session.as_mut(), &ids, &mut sampler, args.sampling.max_tokens, |s| {
        let piece = match dec.push(s.token) {
            Ok(p) => p,
            Err(e) => {
                io_err = Some(anyhow::Error::from(e));
                return ControlFlow::Break(());
            }
        };
        let (text, stopped) = stops.push(&piece);
        if write!(out, "{text}").and_then(|_| out.flush()).is_err() {
            // stdout closed (e.g. piped into `head`): stop generating.
            return ControlFlow::Break(());
        }
        if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    if let Some(e) = io_err {
        return Err(e);
    }
    if !stops.is_stopped() {
        let (tail, _) = stops.push(&dec.finish());
        let _ = write!(out, "{tail}{}", stops.finish());
    }
    let _ = writeln!(out);
    eprintln!("{}", stats_line(&stats));
    Ok(())
}
