//! `flashseek generate --prompt TEXT`: raw-text continuation, streamed to the terminal.

use super::common::{generate_text, load, stats_line, ModelArgs, SamplingArgs};
use flashseek_engine::sampler::Sampler;
use std::io::Write;

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
    // Bad sampling values are reported before the model loads.
    args.sampling.params(0)?;
    let m = load(&args.model)?;
    let mut ids = if args.no_bos { Vec::new() } else { vec![m.tokenizer.bos_id()] };
    ids.extend(m.tokenizer.encode_text(&args.prompt)?);
    let params = args.sampling.params(m.tokenizer.eos_id())?;
    let mut sampler = Sampler::new(params, &ids)?;
    let mut session = m.sequence()?;
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", args.prompt);
    let stats = generate_text(session.as_mut(), &m.tokenizer, &ids, &mut sampler, args.sampling.max_tokens, true, |text| {
        // A closed stdout (e.g. piped into `head`) stops generation.
        write!(out, "{text}").and_then(|_| out.flush()).is_ok()
    })?;
    let _ = writeln!(out);
    eprintln!("{}", stats_line(&stats));
    Ok(())
}
