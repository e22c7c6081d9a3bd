//! `flashseek inspect MODEL_DIR`: the config summary, the checkpoint's naming scheme, the per-layer
//! schedule, weight formats and bytes per component, and total / active parameter counts.
//!
//! Conventions (also printed):
//! - **Parameters** are logical weight elements: FP4 weights count two per stored byte, FP8/FP4
//!   scale companions (`<base>.scale`, `*_scale_inv`) are not parameters, and MTP tensors (`mtp.*`)
//!   are reported apart from the main model's total.
//! - **Active parameters per token**: every main-model weight except the embedding (a one-row lookup,
//!   not a matmul) and except the routed experts, plus `num_experts_per_tok` routed experts per layer
//!   (the shared expert, attention, compressors, indexer, mHC, router, norms and the LM head are all
//!   counted). This is spec §11.1's "active params incl. head" (≈ 13.27 B for Flash).
//! - **Bytes** are stored tensor bytes; a scale's bytes count with its weight (component and format).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use flashseek_model::checkpoint::official::canonical_tensors;
use flashseek_model::checkpoint::Checkpoint;
use flashseek_model::config::{Ds4Config, LayerKind, RopeParams, RouterKind, ScoringFunc};

/// Arguments of `inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors).
    pub model: PathBuf,
}

/// Runs `inspect`: prints [`report`] to stdout.
pub fn run(args: Args) -> anyhow::Result<()> {
    print!("{}", report(&args.model)?);
    Ok(())
}

/// A group of tensors for the per-component byte / format / parameter breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// `embed.weight`.
    Embed,
    /// `head.weight`.
    Head,
    /// `attn.{wq_a,wq_b,wkv,wo_a,wo_b}`, `attn_sink`.
    Attention,
    /// The attention's compressor (`attn.compressor.*` except its norm).
    Compressors,
    /// The lightning indexer, including its own compressor (`attn.indexer.*` except norms).
    Indexer,
    /// `hc_attn_*`, `hc_ffn_*`, `hc_head_*`.
    Mhc,
    /// `ffn.gate.{weight,bias,tid2eid}`.
    Router,
    /// `ffn.shared_experts.*`.
    SharedExperts,
    /// `ffn.experts.*`.
    RoutedExperts,
    /// Every `*norm.weight` (attn/ffn/q/kv/compressor/indexer/final).
    Norms,
    /// `mtp.*` (not part of the main model's counts).
    Mtp,
    /// Anything else.
    Other,
}

impl Component {
    /// All components, in report order.
    pub const ALL: [Component; 12] = [
        Component::Embed,
        Component::Head,
        Component::Attention,
        Component::Compressors,
        Component::Indexer,
        Component::Mhc,
        Component::Router,
        Component::SharedExperts,
        Component::RoutedExperts,
        Component::Norms,
        Component::Mtp,
        Component::Other,
    ];

    /// Label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Component::Embed => "embed",
            Component::Head => "head",
            Component::Attention => "attention",
            Component::Compressors => "compressors",
            Component::Indexer => "indexer",
            Component::Mhc => "mHC",
            Component::Router => "router",
            Component::SharedExperts => "shared experts",
            Component::RoutedExperts => "routed experts",
            Component::Norms => "norms",
            Component::Mtp => "mtp (next-n)",
            Component::Other => "other",
        }
    }
}

/// The component of a canonical tensor name (weights and their `.scale` companions alike).
pub fn component_of(canonical: &str) -> Component {
    if canonical.starts_with("mtp.") {
        return Component::Mtp;
    }
    match canonical {
        "embed.weight" => return Component::Embed,
        "head.weight" => return Component::Head,
        "norm.weight" => return Component::Norms,
        n if n.starts_with("hc_head_") => return Component::Mhc,
        _ => {}
    }
    let Some(rest) = layer_rest(canonical) else {
        return Component::Other;
    };
    if rest.ends_with("norm.weight") {
        Component::Norms
    } else if rest.starts_with("attn.indexer.") {
        Component::Indexer
    } else if rest.starts_with("attn.compressor.") {
        Component::Compressors
    } else if rest.starts_with("attn.") {
        Component::Attention
    } else if rest.starts_with("hc_attn_") || rest.starts_with("hc_ffn_") {
        Component::Mhc
    } else if rest.starts_with("ffn.gate.") {
        Component::Router
    } else if rest.starts_with("ffn.shared_experts.") {
        Component::SharedExperts
    } else if rest.starts_with("ffn.experts.") {
        Component::RoutedExperts
    } else {
        Component::Other
    }
}

/// `layers.{L}.rest` -> `rest`.
fn layer_rest(name: &str) -> Option<&str> {
    let (idx, rest) = name.strip_prefix("layers.")?.split_once('.')?;
    (!idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit())).then_some(rest)
}

/// `layers.{L}.ffn.experts.{e}.…` -> (L, e).
fn routed_expert_of(name: &str) -> Option<(&str, &str)> {
    let (layer, _) = name.strip_prefix("layers.")?.split_once('.')?;
    let rest = layer_rest(name)?.strip_prefix("ffn.experts.")?;
    let (e, _) = rest.split_once('.')?;
    Some((layer, e))
}

/// Parameter counts of a model (see the module docs for the conventions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamCounts {
    /// Main-model parameters (MTP excluded).
    pub total: u64,
    /// Active parameters per token (embedding excluded, `top_k` routed experts per layer).
    pub active: u64,
    /// `embed.weight`.
    pub embed: u64,
    /// All routed experts of the main model.
    pub routed_total: u64,
    /// The routed experts a token uses: per layer, `top_k` × one expert's parameters.
    pub routed_active: u64,
    /// `mtp.*` parameters (not in `total`).
    pub mtp: u64,
    /// Parameters per component (MTP included under [`Component::Mtp`]).
    pub by_component: BTreeMap<Component, u64>,
}

/// Counts parameters from `(canonical name, logical shape)` pairs of weights (scale companions must
/// be left out by the caller; FP4 shapes must be logical, i.e. unpacked). `top_k` is
/// `num_experts_per_tok`. Pure; no I/O.
pub fn count_params<'a>(top_k: usize, tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> ParamCounts {
    let mut c = ParamCounts::default();
    // Per layer: (routed params, distinct experts).
    let mut routed: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
    for (name, shape) in tensors {
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        let comp = component_of(name);
        *c.by_component.entry(comp).or_insert(0) += n;
        match comp {
            Component::Mtp => {
                c.mtp += n;
                continue;
            }
            Component::Embed => c.embed += n,
            Component::RoutedExperts => {
                if let Some((layer, e)) = routed_expert_of(name) {
                    let entry = routed.entry(layer.to_string()).or_default();
                    entry.0 += n;
                    entry.1.insert(e.to_string());
                }
                c.routed_total += n;
            }
            _ => {}
        }
        c.total += n;
    }
    for (params, experts) in routed.values() {
        let e = experts.len() as u64;
        c.routed_active += params / e * (top_k as u64).min(e);
    }
    c.active = c.total - c.embed - c.routed_total + c.routed_active;
    c
}

/// `1234567` -> `1.23M`.
fn human(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2}B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2}K", x / 1e3)
    } else {
        n.to_string()
    }
}

/// Bytes with a binary unit.
fn human_bytes(n: u64) -> String {
    let x = n as f64;
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, s) in units {
        if n >= s {
            return format!("{:.2} {u}", x / s as f64);
        }
    }
    format!("{n} B")
}

fn rope_line(r: &RopeParams) -> String {
    match r.yarn {
        None => format!("theta {}, no scaling", r.theta),
        Some(y) => format!(
            "theta {}, YaRN factor {} (original_max_position_embeddings {}, beta_fast {}, beta_slow {}, attention_factor {}, truncate {})",
            r.theta, y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow, y.attention_factor, y.truncate
        ),
    }
}

fn kind_name(k: LayerKind) -> &'static str {
    match k {
        LayerKind::Sliding => "sliding",
        LayerKind::Csa { .. } => "CSA",
        LayerKind::Hca { .. } => "HCA",
    }
}

/// The rates of the layers of one kind, with their layer counts: `4 (21 layers)` / `none`.
fn rates_of(cfg: &Ds4Config, pick: fn(LayerKind) -> Option<usize>) -> String {
    let mut m: BTreeMap<usize, usize> = BTreeMap::new();
    for k in &cfg.layer_kinds {
        if let Some(r) = pick(*k) {
            *m.entry(r).or_insert(0) += 1;
        }
    }
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(r, n)| format!("{r} ({n} layer{})", if *n == 1 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join(", ")
}

fn config_summary(out: &mut String, cfg: &Ds4Config) {
    let c = cfg;
    let w = |out: &mut String, s: String| {
        out.push_str("  ");
        out.push_str(&s);
        out.push('\n');
    };
    out.push_str("config:\n");
    w(out, format!("vocab {}, hidden {}, layers {}", c.vocab_size, c.hidden_size, c.num_hidden_layers));
    w(
        out,
        format!(
            "attention: {} heads x head_dim {} (rope dims {}, nope dims {}), 1 shared K=V head",
            c.num_attention_heads,
            c.head_dim,
            c.qk_rope_head_dim,
            c.nope_head_dim()
        ),
    );
    w(
        out,
        format!(
            "q_lora_rank {}, output: {} groups x o_lora_rank {}, sliding window {}",
            c.q_lora_rank, c.o_groups, c.o_lora_rank, c.sliding_window
        ),
    );
    w(
        out,
        format!(
            "compress rates: CSA {}; HCA {}",
            rates_of(c, |k| match k {
                LayerKind::Csa { ratio } => Some(ratio),
                _ => None,
            }),
            rates_of(c, |k| match k {
                LayerKind::Hca { ratio } => Some(ratio),
                _ => None,
            })
        ),
    );
    w(out, format!("indexer: {} heads x dim {}, top-k {}", c.index_n_heads, c.index_head_dim, c.index_topk));
    let hash = c.router_kinds.iter().filter(|k| **k == RouterKind::Hash).count();
    w(
        out,
        format!(
            "experts: {} routed, top-{}, 1 shared, moe_intermediate_size {}; scoring {}, routed_scaling_factor {}, swiglu_limit {}; {} hash-routed / {} score-routed layers",
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size,
            match c.scoring_func {
                ScoringFunc::SqrtSoftplus => "sqrtsoftplus",
                ScoringFunc::Sigmoid => "sigmoid",
            },
            c.routed_scaling_factor,
            c.swiglu_limit,
            hash,
            c.router_kinds.len() - hash
        ),
    );
    w(
        out,
        format!(
            "mHC: {} streams, {} Sinkhorn iterations, hc_eps {:e}; rms_norm_eps {:e}",
            c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        ),
    );
    w(out, format!("rope main (sliding layers): {}", rope_line(&c.rope_main)));
    w(out, format!("rope compress (CSA/HCA layers, compressors, indexer): {}", rope_line(&c.rope_compress)));
    w(
        out,
        format!(
            "MTP layers {}, max positions {}, bos {}, eos {:?}",
            c.num_nextn_predict_layers,
            c.max_position_embeddings,
            c.bos_token_id.map_or("none".to_string(), |b| b.to_string()),
            c.eos_token_ids
        ),
    );
    let q = &c.quant;
    w(
        out,
        format!(
            "declared storage: quant_method {}, scale_fmt {}, weight_block_size {}, expert_dtype {}",
            q.method.as_deref().unwrap_or("none"),
            q.scale_fmt.as_deref().unwrap_or("none"),
            q.weight_block_size.map_or("none".to_string(), |b| format!("{b:?}")),
            q.expert_dtype.as_deref().unwrap_or("none")
        ),
    );
}

/// Per component: weight tensors, params, bytes, bytes per format.
#[derive(Default)]
struct Row {
    tensors: usize,
    params: u64,
    bytes: u64,
    formats: BTreeMap<String, u64>,
}

/// The full `inspect` report for the checkpoint directory `dir`.
///
/// Errors: `dir` missing or not a directory; an unreadable / invalid `config.json`; a checkpoint that
/// does not open (each message names the path).
pub fn report(dir: &Path) -> anyhow::Result<String> {
    match std::fs::metadata(dir) {
        Err(e) => bail!("model directory {} cannot be read: {e}", dir.display()),
        Ok(m) if !m.is_dir() => {
            bail!("{} is not a directory (expected a model directory with config.json and *.safetensors)", dir.display())
        }
        Ok(_) => {}
    }
    let cfg = Ds4Config::from_file(dir).with_context(|| format!("invalid model config in {}", dir.display()))?;
    let ck = Checkpoint::open(dir).with_context(|| format!("invalid checkpoint in {}", dir.display()))?;

    let mut out = String::new();
    let _ = writeln!(out, "model: {}", dir.display());
    config_summary(&mut out, &cfg);

    // Checkpoint overview.
    let names = ck.names();
    let name_set: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    // A scale companion -> its weight.
    let weight_of = |n: &str| -> Option<String> {
        if let Some(b) = n.strip_suffix(".scale") {
            let w = format!("{b}.weight");
            return name_set.contains(w.as_str()).then_some(w);
        }
        let w = n.strip_suffix("_scale_inv")?;
        name_set.contains(w).then(|| w.to_string())
    };
    let files = ck.files();
    out.push_str("checkpoint:\n");
    let _ = writeln!(out, "  naming scheme: {:?} ({})", ck.scheme(), ck.scheme());
    let file_names: Vec<String> =
        files.iter().map(|f| f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned())).collect();
    let shown = if file_names.len() <= 4 {
        file_names.join(", ")
    } else {
        format!("{}, …, {}", file_names[0], file_names[file_names.len() - 1])
    };
    let _ = writeln!(out, "  files: {} ({shown})", files.len());

    let mut rows: BTreeMap<Component, Row> = BTreeMap::new();
    let mut weights: Vec<(String, Vec<usize>)> = Vec::new();
    let mut n_scales = 0usize;
    for n in &names {
        let info = ck.info(n).with_context(|| format!("tensor `{n}` vanished from the table"))?;
        let bytes = ck.raw_bytes(n).with_context(|| format!("reading tensor `{n}`"))?.len() as u64;
        let comp = component_of(n);
        let row = rows.entry(comp).or_default();
        row.bytes += bytes;
        if let Some(w) = weight_of(n) {
            n_scales += 1;
            let fmt = ck.format_of(&w).unwrap_or_else(|| "?".into());
            *row.formats.entry(fmt).or_insert(0) += bytes;
            continue;
        }
        let fmt = ck.format_of(n).unwrap_or_else(|| "?".into());
        let mut shape = info.shape.clone();
        if fmt.starts_with("fp4") {
            if let Some(last) = shape.last_mut() {
                *last *= 2;
            }
        }
        row.tensors += 1;
        row.params += shape.iter().map(|&d| d as u64).product::<u64>();
        *row.formats.entry(fmt).or_insert(0) += bytes;
        weights.push((n.clone(), shape));
    }
    let _ = writeln!(
        out,
        "  tensors: {} stored ({} weights/tables, {} scale companions), {} bytes of tensor data ({})",
        names.len(),
        weights.len(),
        n_scales,
        ck.total_bytes(),
        human_bytes(ck.total_bytes())
    );

    // What the forward pass needs, checked against what is there.
    let shapes: BTreeMap<&str, &[usize]> = weights.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let needed = canonical_tensors(&cfg);
    let mut problems: Vec<String> = Vec::new();
    for t in &needed {
        match shapes.get(t.name.as_str()) {
            None => problems.push(format!("missing `{}`", t.name)),
            Some(s) if *s != t.shape.as_slice() => {
                problems.push(format!("`{}` has logical shape {s:?}, expected {:?}", t.name, t.shape))
            }
            Some(_) => {}
        }
    }
    let needed_names: BTreeSet<&str> = needed.iter().map(|t| t.name.as_str()).collect();
    let unused = weights.iter().filter(|(n, _)| !n.starts_with("mtp.") && !needed_names.contains(n.as_str())).count();
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "  forward check: all {} tensors the forward pass reads are present with the expected shapes; {unused} other non-MTP tensors",
            needed.len()
        );
    } else {
        let _ = writeln!(
            out,
            "  forward check: WARNING: {} of {} tensors the forward pass reads are missing or mis-shaped ({unused} other non-MTP tensors):",
            problems.len(),
            needed.len()
        );
        for p in problems.iter().take(10) {
            let _ = writeln!(out, "    {p}");
        }
        if problems.len() > 10 {
            let _ = writeln!(out, "    … and {} more", problems.len() - 10);
        }
    }

    // Schedule.
    out.push_str("layer schedule:\n");
    let width = cfg.num_hidden_layers.saturating_sub(1).to_string().len();
    for (l, (k, r)) in cfg.layer_kinds.iter().zip(&cfg.router_kinds).enumerate() {
        let router = match r {
            RouterKind::Hash => "hash",
            RouterKind::Score => "score",
        };
        let _ = writeln!(out, "  layer {l:>width$}: {:<7} ratio {:<4} router {router}", kind_name(*k), k.ratio());
    }

    // Components.
    let counts = count_params(cfg.num_experts_per_tok, weights.iter().map(|(n, s)| (n.as_str(), s.as_slice())));
    out.push_str("weights by component (bytes include scale companions; formats by share of bytes):\n");
    let _ = writeln!(out, "  {:<15} {:>8} {:>15} {:>15}  formats", "component", "tensors", "params", "bytes");
    for comp in Component::ALL {
        let Some(row) = rows.get(&comp) else { continue };
        let mix: Vec<String> = {
            let mut f: Vec<(&String, &u64)> = row.formats.iter().collect();
            f.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            f.iter().map(|(k, v)| format!("{k} {:.1}%", 100.0 * **v as f64 / row.bytes.max(1) as f64)).collect()
        };
        let _ = writeln!(
            out,
            "  {:<15} {:>8} {:>15} {:>15}  {}",
            comp.label(),
            row.tensors,
            row.params,
            row.bytes,
            mix.join(", ")
        );
    }
    let _ = writeln!(out, "  {:<15} {:>8} {:>15} {:>15}", "all", weights.len(), counts.total + counts.mtp, ck.total_bytes());

    // Parameters.
    out.push_str(
        "parameters (logical weight elements: FP4 counts 2 per stored byte, scale companions excluded, MTP reported apart):\n",
    );
    let _ = writeln!(out, "  total parameters: {} ({})", counts.total, human(counts.total));
    let _ = writeln!(
        out,
        "  active parameters per token: {} ({})",
        counts.active,
        human(counts.active)
    );
    let _ = writeln!(
        out,
        "    convention: all main-model weights except the embedding (a row lookup, not a matmul: {} params) \
         and the routed experts, plus top-{} routed experts per layer ({} of {} routed params); head included",
        counts.embed,
        cfg.num_experts_per_tok,
        counts.routed_active,
        counts.routed_total
    );
    let _ = writeln!(out, "  MTP parameters (not in the total): {}", counts.mtp);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_of_canonical_names() {
        use Component::*;
        for (n, c) in [
            ("embed.weight", Embed),
            ("head.weight", Head),
            ("norm.weight", Norms),
            ("hc_head_fn", Mhc),
            ("layers.3.attn_norm.weight", Norms),
            ("layers.3.attn.kv_norm.weight", Norms),
            ("layers.3.attn.compressor.norm.weight", Norms),
            ("layers.3.attn.wq_a.weight", Attention),
            ("layers.3.attn.wq_a.scale", Attention),
            ("layers.3.attn.attn_sink", Attention),
            ("layers.3.attn.compressor.ape", Compressors),
            ("layers.3.attn.indexer.compressor.wkv.weight", Indexer),
            ("layers.3.attn.indexer.wq_b.scale", Indexer),
            ("layers.3.hc_ffn_scale", Mhc),
            ("layers.3.ffn.gate.tid2eid", Router),
            ("layers.3.ffn.shared_experts.w2.scale", SharedExperts),
            ("layers.3.ffn.experts.17.w2.scale", RoutedExperts),
            ("mtp.0.e_proj.weight", Mtp),
            ("layers.x.attn.wq_a.weight", Other),
            ("something", Other),
        ] {
            assert_eq!(component_of(n), c, "{n}");
        }
        assert_eq!(routed_expert_of("layers.12.ffn.experts.5.w1.weight"), Some(("12", "5")));
        assert_eq!(routed_expert_of("layers.12.ffn.shared_experts.w1.weight"), None);
    }

    /// Full Flash (spec §1.1 / §1.2) counted from the canonical tensor list agrees with spec §11.1.
    #[test]
    fn flash_parameter_budget_matches_spec() {
        let cfg = Ds4Config::from_json(&flashseek_model::config::flash_official_json())
        .unwrap();
        let tensors = canonical_tensors(&cfg);
        let c = count_params(cfg.num_experts_per_tok, tensors.iter().map(|t| (t.name.as_str(), t.shape.as_slice())));
        // Spec §11.1: total ≈ 284.33 B (no MTP), active ≈ 13.27 B incl. head; embed/head 529,530,880 each;
        // one expert 25,165,824.
        assert_eq!(c.embed, 529_530_880);
        assert_eq!(c.by_component[&Component::Head], 529_530_880);
        assert_eq!(c.routed_total, 43 * 256 * 25_165_824);
        assert_eq!(c.routed_active, 43 * 6 * 25_165_824);
        assert!((c.total as f64 / 1e9 - 284.33).abs() < 0.01, "total {}", c.total);
        assert!((c.active as f64 / 1e9 - 13.27).abs() < 0.01, "active {}", c.active);
        assert_eq!(c.mtp, 0);
        assert_eq!(c.total, tensors.iter().map(|t| t.numel() as u64).sum::<u64>());
        assert_eq!(human(c.total), format!("{:.2}B", c.total as f64 / 1e9));
    }

    #[test]
    fn mtp_is_counted_apart() {
        let t: Vec<(&str, Vec<usize>)> = vec![
            ("embed.weight", vec![10, 4]),
            ("head.weight", vec![10, 4]),
            ("layers.0.ffn.experts.0.w1.weight", vec![8, 4]),
            ("layers.0.ffn.experts.1.w1.weight", vec![8, 4]),
            ("layers.0.ffn.experts.2.w1.weight", vec![8, 4]),
            ("layers.0.attn.wq_a.weight", vec![3, 4]),
            ("mtp.0.e_proj.weight", vec![4, 4]),
        ];
        let c = count_params(2, t.iter().map(|(n, s)| (*n, s.as_slice())));
        assert_eq!(c.total, 40 + 40 + 96 + 12);
        assert_eq!(c.mtp, 16);
        assert_eq!(c.routed_active, 64);
        assert_eq!(c.active, 40 + 64 + 12);
    }
}
