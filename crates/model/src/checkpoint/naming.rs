//! The three tensor naming schemes and their mapping to canonical (official, unprefixed) names.
//!
//! Source: spec §2, the table's "Official name" and "HF name" columns and the paragraph
//! "Observed on disk (transformers 5.17.0, `save_pretrained`)".
//!
//! Each scheme has a *strict vocabulary*: the names it is known to produce. Detection
//! ([`detect`]) intersects, over all stored names that any vocabulary knows, the set of schemes
//! knowing them; the result must be non-empty (else: mixed schemes) and all remaining candidates
//! must map every name identically (else: ambiguous). Stored names that no vocabulary knows do not
//! take part in detection; they are carried into the table through a best-effort prefix/segment
//! rename ([`fallback`]) so that extra tensors (e.g. the `attn.norm.weight` listed in spec §2's
//! observed-on-disk paragraph) stay reachable.

use std::fmt;
use std::path::Path;

use super::error::CheckpointError;

/// How the tensors of a checkpoint are named (spec §2). Auto-detected by
/// [`super::Checkpoint::open`]; canonical names are always the [`NamingScheme::Official`] ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamingScheme {
    /// DeepSeek release names, no prefix: `embed.weight`, `layers.3.attn.wq_a.weight` + `.scale`,
    /// `layers.3.ffn.experts.7.w1.weight`, `hc_head_fn`, `head.weight`, `mtp.0.*` (spec §2 table).
    Official,
    /// transformers `save_pretrained` output (spec §2 "Observed on disk"): the official names under a
    /// `model.` prefix, except `model.embed_tokens.weight`, `model.norm.weight`,
    /// `model.hc_head.{hc_fn,hc_base,hc_scale}` and an unprefixed `head.weight`; `tid2eid` is I64.
    HfSaved,
    /// transformers in-memory module names (spec §2 "HF name" column): `model.layers.3.self_attn.q_a_proj.weight`,
    /// `lm_head.weight`, 3-D routed experts `model.layers.3.mlp.experts.{gate_up_proj,down_proj}`.
    HfModule,
}

impl NamingScheme {
    const ALL: [NamingScheme; 3] = [
        NamingScheme::Official,
        NamingScheme::HfSaved,
        NamingScheme::HfModule,
    ];

    fn bit(self) -> u8 {
        match self {
            NamingScheme::Official => 1,
            NamingScheme::HfSaved => 2,
            NamingScheme::HfModule => 4,
        }
    }
}

impl fmt::Display for NamingScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamingScheme::Official => "official (DeepSeek release)",
            NamingScheme::HfSaved => "HF save_pretrained (`model.`-prefixed official)",
            NamingScheme::HfModule => "HF module-name",
        })
    }
}

fn describe(mask: u8) -> String {
    let v: Vec<String> = NamingScheme::ALL
        .iter()
        .filter(|s| mask & s.bit() != 0)
        .map(|s| s.to_string())
        .collect();
    v.join(" or ")
}

/// Which routed-expert 3-D HF tensor a stored name is (spec §2: `gate_up_proj` [E, 2I, D] =
/// concat(w1, w3) along out per expert; `down_proj` [E, D, I] = w2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertKind {
    GateUp,
    Down,
    GateUpScale,
    DownScale,
}

/// Where a stored name goes in the canonical table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// One stored tensor = one canonical tensor.
    Direct(String),
    /// A 3-D expert tensor of layer `layer` to be split into per-expert 2-D views.
    Experts { layer: String, kind: ExpertKind },
}

/// Per-layer official names (after `layers.{L}.`), excluding routed experts. Spec §2 table.
const OFFICIAL_LAYER: &[&str] = &[
    "attn_norm.weight",
    "attn.wq_a.weight",
    "attn.q_norm.weight",
    "attn.wq_b.weight",
    "attn.wkv.weight",
    "attn.kv_norm.weight",
    "attn.wo_a.weight",
    "attn.wo_b.weight",
    "attn.attn_sink",
    "attn.compressor.wkv.weight",
    "attn.compressor.wgate.weight",
    "attn.compressor.norm.weight",
    "attn.compressor.ape",
    "attn.indexer.wq_b.weight",
    "attn.indexer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight",
    "attn.indexer.compressor.wgate.weight",
    "attn.indexer.compressor.norm.weight",
    "attn.indexer.compressor.ape",
    "hc_attn_fn",
    "hc_attn_base",
    "hc_attn_scale",
    "hc_ffn_fn",
    "hc_ffn_base",
    "hc_ffn_scale",
    "ffn_norm.weight",
    "ffn.gate.weight",
    "ffn.gate.bias",
    "ffn.gate.tid2eid",
    "ffn.shared_experts.w1.weight",
    "ffn.shared_experts.w2.weight",
    "ffn.shared_experts.w3.weight",
];

/// Per-layer module names (after `model.layers.{L}.`) -> official names. Spec §2 "HF name" column.
const MODULE_LAYER: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_a_proj.weight", "attn.wq_a.weight"),
    ("self_attn.q_a_norm.weight", "attn.q_norm.weight"),
    ("self_attn.q_b_proj.weight", "attn.wq_b.weight"),
    ("self_attn.kv_proj.weight", "attn.wkv.weight"),
    ("self_attn.kv_norm.weight", "attn.kv_norm.weight"),
    ("self_attn.o_a_proj.weight", "attn.wo_a.weight"),
    ("self_attn.o_b_proj.weight", "attn.wo_b.weight"),
    ("self_attn.sinks", "attn.attn_sink"),
    (
        "self_attn.compressor.kv_proj.weight",
        "attn.compressor.wkv.weight",
    ),
    (
        "self_attn.compressor.gate_proj.weight",
        "attn.compressor.wgate.weight",
    ),
    (
        "self_attn.compressor.kv_norm.weight",
        "attn.compressor.norm.weight",
    ),
    ("self_attn.compressor.position_bias", "attn.compressor.ape"),
    (
        "self_attn.compressor.indexer.q_b_proj.weight",
        "attn.indexer.wq_b.weight",
    ),
    (
        "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "attn.indexer.weights_proj.weight",
    ),
    (
        "self_attn.compressor.indexer.weights_proj.weight",
        "attn.indexer.weights_proj.weight",
    ),
    (
        "self_attn.compressor.indexer.kv_proj.weight",
        "attn.indexer.compressor.wkv.weight",
    ),
    (
        "self_attn.compressor.indexer.gate_proj.weight",
        "attn.indexer.compressor.wgate.weight",
    ),
    (
        "self_attn.compressor.indexer.kv_norm.weight",
        "attn.indexer.compressor.norm.weight",
    ),
    (
        "self_attn.compressor.indexer.position_bias",
        "attn.indexer.compressor.ape",
    ),
    ("attn_hc.fn", "hc_attn_fn"),
    ("attn_hc.base", "hc_attn_base"),
    ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"),
    ("ffn_hc.base", "hc_ffn_base"),
    ("ffn_hc.scale", "hc_ffn_scale"),
    ("mlp.gate.weight", "ffn.gate.weight"),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.gate.tid2eid", "ffn.gate.tid2eid"),
    (
        "mlp.shared_experts.gate_proj.weight",
        "ffn.shared_experts.w1.weight",
    ),
    (
        "mlp.shared_experts.down_proj.weight",
        "ffn.shared_experts.w2.weight",
    ),
    (
        "mlp.shared_experts.up_proj.weight",
        "ffn.shared_experts.w3.weight",
    ),
];

/// 3-D routed-expert module tensors (after `model.layers.{L}.mlp.experts.`), with their FP8/FP4
/// scale companions in transformers' `<param>_scale_inv` naming (also `<param>_scale`).
const MODULE_EXPERTS_3D: &[(&str, ExpertKind)] = &[
    ("gate_up_proj", ExpertKind::GateUp),
    ("down_proj", ExpertKind::Down),
    ("gate_up_proj_scale_inv", ExpertKind::GateUpScale),
    ("down_proj_scale_inv", ExpertKind::DownScale),
    ("gate_up_proj_scale", ExpertKind::GateUpScale),
    ("down_proj_scale", ExpertKind::DownScale),
];

/// Top-level names per scheme -> official.
const OFFICIAL_TOP: &[(&str, &str)] = &[
    ("embed.weight", "embed.weight"),
    ("norm.weight", "norm.weight"),
    ("head.weight", "head.weight"),
    ("hc_head_fn", "hc_head_fn"),
    ("hc_head_base", "hc_head_base"),
    ("hc_head_scale", "hc_head_scale"),
];
const SAVED_TOP: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "embed.weight"),
    ("model.norm.weight", "norm.weight"),
    ("head.weight", "head.weight"),
    ("model.hc_head.hc_fn", "hc_head_fn"),
    ("model.hc_head.hc_base", "hc_head_base"),
    ("model.hc_head.hc_scale", "hc_head_scale"),
];
const MODULE_TOP: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "embed.weight"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "head.weight"),
    ("model.hc_head.hc_fn", "hc_head_fn"),
    ("model.hc_head.hc_base", "hc_head_base"),
    ("model.hc_head.hc_scale", "hc_head_scale"),
];

fn is_index(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `prefix` `{digits}` `.` `rest` -> (digits, rest).
fn split_indexed<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let tail = name.strip_prefix(prefix)?;
    let (idx, rest) = tail.split_once('.')?;
    is_index(idx).then_some((idx, rest))
}

fn official_layer_rest_ok(rest: &str) -> bool {
    if OFFICIAL_LAYER.contains(&rest) {
        return true;
    }
    // ffn.experts.{e}.w{1,2,3}.weight
    matches!(
        split_indexed(rest, "ffn.experts."),
        Some((_, "w1.weight" | "w2.weight" | "w3.weight"))
    )
}

fn module_layer_rest(layer: &str, rest: &str) -> Option<Mapped> {
    if let Some((_, off)) = MODULE_LAYER.iter().find(|(m, _)| *m == rest) {
        return Some(Mapped::Direct(format!("layers.{layer}.{off}")));
    }
    let experts = rest.strip_prefix("mlp.experts.")?;
    if let Some((_, kind)) = MODULE_EXPERTS_3D.iter().find(|(m, _)| *m == experts) {
        return Some(Mapped::Experts {
            layer: layer.to_string(),
            kind: *kind,
        });
    }
    // Per-expert 2-D module names: mlp.experts.{e}.{gate_proj,down_proj,up_proj}.weight
    let (e, proj) = split_indexed(rest, "mlp.experts.")?;
    let w = match proj {
        "gate_proj.weight" => "w1",
        "down_proj.weight" => "w2",
        "up_proj.weight" => "w3",
        _ => return None,
    };
    Some(Mapped::Direct(format!(
        "layers.{layer}.ffn.experts.{e}.{w}.weight"
    )))
}

fn top(table: &[(&str, &str)], name: &str) -> Option<Mapped> {
    table
        .iter()
        .find(|(s, _)| *s == name)
        .map(|(_, c)| Mapped::Direct((*c).to_string()))
}

/// Strict vocabulary lookup without scale-companion handling.
fn recognize_exact(scheme: NamingScheme, name: &str) -> Option<Mapped> {
    match scheme {
        NamingScheme::Official => {
            if let Some(m) = top(OFFICIAL_TOP, name) {
                return Some(m);
            }
            let (_, rest) = split_indexed(name, "layers.")?;
            official_layer_rest_ok(rest).then(|| Mapped::Direct(name.to_string()))
        }
        NamingScheme::HfSaved => {
            if let Some(m) = top(SAVED_TOP, name) {
                return Some(m);
            }
            let (l, rest) = split_indexed(name, "model.layers.")?;
            // transformers renames the official `.norm.` to `.kv_norm.` on load and back on save, so
            // the attention's own kv_norm (official `attn.kv_norm.weight`) is written as
            // `attn.norm.weight` (observed with transformers 5.24 `save_pretrained`).
            if rest == "attn.norm.weight" {
                return Some(Mapped::Direct(format!("layers.{l}.attn.kv_norm.weight")));
            }
            official_layer_rest_ok(rest).then(|| Mapped::Direct(format!("layers.{l}.{rest}")))
        }
        NamingScheme::HfModule => {
            if let Some(m) = top(MODULE_TOP, name) {
                return Some(m);
            }
            let (l, rest) = split_indexed(name, "model.layers.")?;
            module_layer_rest(l, rest)
        }
    }
}

/// Maps a stored name under `scheme` using the strict vocabulary, or `None` if the vocabulary does not
/// know it. Handles FP8/FP4 scale companions: stored `<w>.scale` (official) and `<w>.weight_scale_inv`
/// (HF FP8) both become canonical `<canonical w without .weight>.scale` (spec §2, §6). `mtp.*` names
/// are known to every scheme and pass through unchanged.
pub(crate) fn recognize(scheme: NamingScheme, name: &str) -> Option<Mapped> {
    if name.starts_with("mtp.") {
        return Some(Mapped::Direct(name.to_string()));
    }
    if let Some(m) = recognize_exact(scheme, name) {
        return Some(m);
    }
    let weight = if let Some(w) = name
        .strip_suffix("_scale_inv")
        .filter(|w| w.ends_with(".weight"))
    {
        w.to_string()
    } else {
        format!("{}.weight", name.strip_suffix(".scale")?)
    };
    match recognize_exact(scheme, &weight)? {
        Mapped::Direct(c) => Some(Mapped::Direct(format!(
            "{}.scale",
            c.strip_suffix(".weight")?
        ))),
        Mapped::Experts { .. } => None,
    }
}

/// Best-effort canonical name for a stored name outside every vocabulary, under the detected scheme:
/// strip the `model.` prefix (HF schemes), rename the `self_attn`/`mlp` path segments (HF module),
/// and normalise a `.weight_scale_inv` suffix to `.scale`.
pub(crate) fn fallback(scheme: NamingScheme, name: &str) -> String {
    let mut s = match scheme {
        NamingScheme::Official => name.to_string(),
        NamingScheme::HfSaved => name.strip_prefix("model.").unwrap_or(name).to_string(),
        NamingScheme::HfModule => name
            .strip_prefix("model.")
            .unwrap_or(name)
            .split('.')
            .map(|seg| match seg {
                "self_attn" => "attn",
                "mlp" => "ffn",
                other => other,
            })
            .collect::<Vec<_>>()
            .join("."),
    };
    if !s.starts_with("mtp.") {
        if let Some(b) = s.strip_suffix(".weight_scale_inv") {
            s = format!("{b}.scale");
        }
    }
    s
}

/// Detects the naming scheme from `(stored name, file)` pairs (spec §2).
///
/// Errors ([`CheckpointError::Scheme`], naming an offending tensor and its file):
/// no tensors at all; no name known to any scheme; a name whose schemes are disjoint from those of
/// an earlier name (mixed schemes); two schemes that fit all names but map them differently.
pub(crate) fn detect(
    root: &Path,
    names: &[(&str, &Path)],
) -> Result<NamingScheme, CheckpointError> {
    let Some(&(first, first_file)) = names.first() else {
        return Err(CheckpointError::Scheme {
            file: root.to_path_buf(),
            tensor: "<none>".into(),
            detail: "the checkpoint holds no tensors; expected DeepSeek-V4 weights (spec §2)"
                .into(),
        });
    };
    let mut cand: u8 = 7;
    let mut witness: Option<(&str, &Path)> = None;
    let mut any = false;
    for &(name, file) in names {
        let mask = NamingScheme::ALL
            .iter()
            .filter(|s| recognize(**s, name).is_some())
            .fold(0u8, |m, s| m | s.bit());
        if mask == 0 {
            continue;
        }
        any = true;
        let next = cand & mask;
        if next == 0 {
            let (wn, wf) = witness.unwrap_or((name, file));
            return Err(CheckpointError::Scheme {
                file: file.to_path_buf(),
                tensor: name.to_string(),
                detail: format!(
                    "mixed naming schemes: this name follows the {} scheme, but tensor `{wn}` in {} follows the \
                     {} scheme; expected one scheme for the whole checkpoint (spec §2)",
                    describe(mask),
                    wf.display(),
                    describe(cand)
                ),
            });
        }
        if next != cand {
            witness = Some((name, file));
            cand = next;
        }
    }
    if !any {
        return Err(CheckpointError::Scheme {
            file: first_file.to_path_buf(),
            tensor: first.to_string(),
            detail: format!(
                "no tensor name is recognizable: expected official DeepSeek-V4 names (e.g. `embed.weight`, \
                 `layers.0.attn.wq_a.weight`), HF saved names (`model.layers.0.attn.wq_a.weight`) or HF module \
                 names (`model.layers.0.self_attn.q_a_proj.weight`), found {} names such as this one (spec §2)",
                names.len()
            ),
        });
    }
    let cands: Vec<NamingScheme> = NamingScheme::ALL
        .iter()
        .copied()
        .filter(|s| cand & s.bit() != 0)
        .collect();
    let chosen = cands[0];
    for &other in &cands[1..] {
        for &(name, file) in names {
            if recognize(chosen, name) != recognize(other, name) {
                return Err(CheckpointError::Scheme {
                    file: file.to_path_buf(),
                    tensor: name.to_string(),
                    detail: format!("ambiguous naming scheme: both {chosen} and {other} fit, but map this name differently"),
                });
            }
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Option<Mapped> {
        Some(Mapped::Direct(s.to_string()))
    }

    #[test]
    fn checkpoint_naming_module_table() {
        let m = |n: &str| recognize(NamingScheme::HfModule, n);
        assert_eq!(
            m("model.layers.3.self_attn.q_a_proj.weight"),
            d("layers.3.attn.wq_a.weight")
        );
        assert_eq!(
            m("model.layers.3.self_attn.q_a_proj.weight_scale_inv"),
            d("layers.3.attn.wq_a.scale")
        );
        assert_eq!(
            m("model.layers.3.self_attn.q_a_proj.scale"),
            d("layers.3.attn.wq_a.scale")
        );
        assert_eq!(
            m("model.layers.3.attn_hc.scale"),
            d("layers.3.hc_attn_scale")
        );
        assert_eq!(
            m("model.layers.3.self_attn.compressor.kv_norm.weight"),
            d("layers.3.attn.compressor.norm.weight")
        );
        assert_eq!(
            m("model.layers.3.self_attn.compressor.indexer.kv_norm.weight"),
            d("layers.3.attn.indexer.compressor.norm.weight")
        );
        assert_eq!(
            m("model.layers.3.self_attn.kv_norm.weight"),
            d("layers.3.attn.kv_norm.weight")
        );
        assert_eq!(
            m("model.layers.3.mlp.gate.e_score_correction_bias"),
            d("layers.3.ffn.gate.bias")
        );
        assert_eq!(
            m("model.layers.3.mlp.experts.5.up_proj.weight"),
            d("layers.3.ffn.experts.5.w3.weight")
        );
        assert_eq!(m("lm_head.weight"), d("head.weight"));
        assert_eq!(m("model.hc_head.hc_scale"), d("hc_head_scale"));
        assert_eq!(
            m("model.layers.12.mlp.experts.gate_up_proj"),
            Some(Mapped::Experts {
                layer: "12".into(),
                kind: ExpertKind::GateUp
            })
        );
        assert_eq!(m("model.layers.3.attn.wq_a.weight"), None);
        assert_eq!(m("head.weight"), None);
    }

    #[test]
    fn checkpoint_naming_official_and_saved() {
        let o = |n: &str| recognize(NamingScheme::Official, n);
        let s = |n: &str| recognize(NamingScheme::HfSaved, n);
        assert_eq!(
            o("layers.0.ffn.experts.255.w2.scale"),
            d("layers.0.ffn.experts.255.w2.scale")
        );
        assert_eq!(
            o("layers.0.attn.wkv.weight_scale_inv"),
            d("layers.0.attn.wkv.scale")
        );
        assert_eq!(o("layers.x.attn.wkv.weight"), None);
        assert_eq!(o("hc_head_scale"), d("hc_head_scale"));
        assert_eq!(o("model.layers.0.attn.wkv.weight"), None);
        assert_eq!(
            s("model.layers.0.attn.wkv.weight"),
            d("layers.0.attn.wkv.weight")
        );
        assert_eq!(s("model.hc_head.hc_fn"), d("hc_head_fn"));
        assert_eq!(s("model.layers.1.self_attn.kv_proj.weight"), None);
        assert_eq!(
            s("mtp.0.e_proj.weight_scale_inv"),
            d("mtp.0.e_proj.weight_scale_inv")
        );
        assert_eq!(
            fallback(
                NamingScheme::HfModule,
                "model.layers.1.self_attn.foo.weight_scale_inv"
            ),
            "layers.1.attn.foo.scale"
        );
    }
}
