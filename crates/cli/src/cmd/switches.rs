//! `flashseek switches`: the registry of killable optimisations (flashseek_engine::switches) with
//! each one's env var, flag, default, value in this process and what it replaces.

use flashseek_engine::switches::{value_of, Origin, SWITCHES};
use std::io::Write;

/// Arguments of `switches`.
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (every field) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print each switch's accepted values, what it replaces and its parity check under it.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs `switches`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.json {
        let rows: Vec<_> = SWITCHES
            .iter()
            .map(|s| {
                let (v, o) = value_of(s.name);
                serde_json::json!({"name": s.name, "env": s.env_var(), "flag": format!("--switch {}=<value>", s.name), "values": s.values, "aliases": s.aliases.iter().map(|(a, v)| serde_json::json!({"alias": a, "value": v})).collect::<Vec<_>>(), "default": s.default_value(), "value": v, "origin": match o { Origin::Default => "default", Origin::Env => "env", Origin::Flag => "switch-flag" }, "inactive_because": flashseek_engine::switches::inactive_because(s.name), "replaces": s.replaces, "parity": s.parity})
            })
            .collect();
        return quiet_on_closed_pipe(writeln!(std::io::stdout().lock(), "{}", serde_json::to_string_pretty(&rows)?));
    }
    let mut out = std::io::stdout().lock();
    // The name column fits the longest name (at least the 20 the verbose lines indent by).
    let w = SWITCHES.iter().map(|s| s.name.len()).max().unwrap_or(0).max(20);
    let mut table = || -> std::io::Result<()> {
        if !args.verbose {
            // One line per switch: name, value in this process, default, where the value came from.
            writeln!(out, "{:<w$} {:<8} {:<8} {:<9} note", "switch", "value", "default", "set by")?;
        }
        for s in SWITCHES {
            let (v, o) = value_of(s.name);
            let origin = match o {
                Origin::Default => "default",
                Origin::Env => "env",
                Origin::Flag => "--switch",
            };
            let inactive = flashseek_engine::switches::inactive_because(s.name).map(|w| format!("no effect now: {w}"));
            if !args.verbose {
                let line = format!("{:<w$} {v:<8} {:<8} {origin:<9} {}", s.name, s.default_value(), inactive.unwrap_or_default());
                writeln!(out, "{}", line.trim_end())?;
                continue;
            }
            let inactive = inactive.map(|w| format!("; {w}")).unwrap_or_default();
            writeln!(out, "{:<w$} {} = {v} (set by {origin}{inactive}); accepted: {}; default {}", s.name, s.env_var(), s.accepted(), s.default_value())?;
            writeln!(out, "{:<w$} replaces: {}", "", s.replaces)?;
            writeln!(out, "{:<w$} parity:   {}", "", s.parity)?;
        }
        if args.verbose {
            writeln!(out, "\nSet one with the env var or the global flag `--switch NAME=VALUE` (before the subcommand or after it).")
        } else {
            writeln!(out, "\nSet one with FLASHSEEK_<NAME>=VALUE or the global flag `--switch NAME=VALUE`; `--verbose` for what each replaces and its parity check, docs/SWITCHES.md for more.")
        }
    };
    quiet_on_closed_pipe(table())
}

/// A reader that stopped reading (`flashseek switches | head`) is not an error.
fn quiet_on_closed_pipe(r: std::io::Result<()>) -> anyhow::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
