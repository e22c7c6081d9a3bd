//! Tests of the checkpoint module: naming schemes (spec §2), file layouts, formats (spec §6) and the
//! error paths for corrupt or inconsistent input.

use std::path::{Path, PathBuf};

use super::*;
use crate::quant;

type T = (String, StoredDtype, Vec<usize>, Vec<u8>);

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32t(name: &str, shape: &[usize], v: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), v.len());
    (
        name.to_string(),
        StoredDtype::F32,
        shape.to_vec(),
        f32_bytes(v),
    )
}

fn bf16t(name: &str, shape: &[usize], v: &[f32]) -> T {
    let b = v
        .iter()
        .flat_map(|&x| quant::f32_to_bf16(x).to_le_bytes())
        .collect();
    (name.to_string(), StoredDtype::BF16, shape.to_vec(), b)
}

fn i32t(name: &str, shape: &[usize], v: &[i32]) -> T {
    (
        name.to_string(),
        StoredDtype::I32,
        shape.to_vec(),
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

fn i64t(name: &str, shape: &[usize], v: &[i64]) -> T {
    (
        name.to_string(),
        StoredDtype::I64,
        shape.to_vec(),
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

fn seq(n: usize, offset: f32) -> Vec<f32> {
    (0..n).map(|i| offset + i as f32 * 0.25).collect()
}

fn write(dir: &Path, file: &str, tensors: &[T]) -> PathBuf {
    let p = dir.join(file);
    write_safetensors(&p, tensors).unwrap();
    p
}

/// Writes a raw safetensors file with a hand-made header.
fn raw_file(path: &Path, header: &str, data: &[u8]) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

fn err_of(r: Result<Checkpoint, CheckpointError>) -> CheckpointError {
    match r {
        Ok(c) => panic!("expected an error, opened {c:?}"),
        Err(e) => e,
    }
}

fn assert_msg(e: &CheckpointError, parts: &[&str]) {
    let m = e.to_string();
    for p in parts {
        assert!(m.contains(p), "message {m:?} lacks {p:?}");
    }
}

/// (stored name, canonical name) pairs: every tensor gets shape [2, 3] F32 with distinct values so
/// that the mapping can be checked by value.
fn check_pairs(
    pairs: &[(&str, &str)],
    scheme: NamingScheme,
    extra: Vec<T>,
) -> (tempfile::TempDir, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    let mut ts: Vec<T> = pairs
        .iter()
        .enumerate()
        .map(|(k, (s, _))| f32t(s, &[2, 3], &seq(6, k as f32 * 10.0)))
        .collect();
    ts.extend(extra);
    write(dir.path(), "model.safetensors", &ts);
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.scheme(), scheme);
    for (k, (s, c)) in pairs.iter().enumerate() {
        assert_eq!(
            ck.load_f32(c, &[2, 3]).unwrap(),
            seq(6, k as f32 * 10.0),
            "{s} -> {c}"
        );
        let info = ck.info(c).unwrap();
        assert_eq!(info.stored_name, *s);
        assert_eq!(info.file, dir.path().join("model.safetensors"));
        assert_eq!(ck.format_of(c).as_deref(), Some("f32"));
    }
    (dir, ck)
}

const OFFICIAL_LAYER_NAMES: &[&str] = &[
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
    "ffn.shared_experts.w1.weight",
    "ffn.shared_experts.w2.weight",
    "ffn.shared_experts.w3.weight",
    "ffn.experts.0.w1.weight",
    "ffn.experts.0.w2.weight",
    "ffn.experts.1.w3.weight",
];

#[test]
fn checkpoint_official_scheme_single_file() {
    let mut owned: Vec<(String, String)> = [
        "embed.weight",
        "norm.weight",
        "head.weight",
        "hc_head_fn",
        "hc_head_base",
        "hc_head_scale",
        "mtp.0.e_proj.weight",
    ]
    .iter()
    .map(|s| (s.to_string(), s.to_string()))
    .collect();
    for l in [0, 11] {
        owned.extend(
            OFFICIAL_LAYER_NAMES
                .iter()
                .map(|r| (format!("layers.{l}.{r}"), format!("layers.{l}.{r}"))),
        );
    }
    let pairs: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (_dir, ck) = check_pairs(
        &pairs,
        NamingScheme::Official,
        vec![i32t(
            "layers.0.ffn.gate.tid2eid",
            &[4, 2],
            &[0, 1, 2, 3, 4, 5, 6, 7],
        )],
    );
    assert_eq!(
        ck.load_i64("layers.0.ffn.gate.tid2eid", &[4, 2]).unwrap(),
        vec![0, 1, 2, 3, 4, 5, 6, 7]
    );
    assert_eq!(
        ck.format_of("layers.0.ffn.gate.tid2eid").as_deref(),
        Some("i32")
    );
    let names = ck.names();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names.len(), pairs.len() + 1);
    assert!(ck.contains("layers.11.attn.indexer.compressor.ape"));
    assert!(!ck.contains("layers.12.attn.wq_a.weight"));
    assert_eq!(ck.total_bytes(), (pairs.len() * 24 + 32) as u64);
}

#[test]
fn checkpoint_hf_saved_scheme_detected_and_mapped() {
    let mut owned: Vec<(String, String)> = vec![
        ("model.embed_tokens.weight".into(), "embed.weight".into()),
        ("model.norm.weight".into(), "norm.weight".into()),
        ("head.weight".into(), "head.weight".into()),
        ("model.hc_head.hc_fn".into(), "hc_head_fn".into()),
        ("model.hc_head.hc_base".into(), "hc_head_base".into()),
        ("model.hc_head.hc_scale".into(), "hc_head_scale".into()),
        // transformers writes the attention's kv_norm as `attn.norm.weight` (spec §2 "Observed on
        // disk"); it is the official `attn.kv_norm.weight`.
        (
            "model.layers.0.attn.norm.weight".into(),
            "layers.0.attn.kv_norm.weight".into(),
        ),
    ];
    for l in [0, 2] {
        owned.extend(
            OFFICIAL_LAYER_NAMES
                .iter()
                .filter(|r| l != 0 || **r != "attn.kv_norm.weight")
                .map(|r| (format!("model.layers.{l}.{r}"), format!("layers.{l}.{r}"))),
        );
    }
    let pairs: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (_dir, ck) = check_pairs(
        &pairs,
        NamingScheme::HfSaved,
        vec![i64t(
            "model.layers.0.ffn.gate.tid2eid",
            &[3, 2],
            &[5, 4, 3, 2, 1, 1 << 40],
        )],
    );
    assert_eq!(
        ck.load_i64("layers.0.ffn.gate.tid2eid", &[3, 2]).unwrap(),
        vec![5, 4, 3, 2, 1, 1 << 40]
    );
    assert_eq!(
        ck.format_of("layers.0.ffn.gate.tid2eid").as_deref(),
        Some("i64")
    );
    assert!(!ck.names().iter().any(|n| n.starts_with("model.")));
}

#[test]
fn checkpoint_hf_module_scheme_detected_and_mapped() {
    let mut owned: Vec<(String, String)> = vec![
        ("model.embed_tokens.weight".into(), "embed.weight".into()),
        ("model.norm.weight".into(), "norm.weight".into()),
        ("lm_head.weight".into(), "head.weight".into()),
        ("model.hc_head.hc_fn".into(), "hc_head_fn".into()),
        ("model.hc_head.hc_base".into(), "hc_head_base".into()),
        ("model.hc_head.hc_scale".into(), "hc_head_scale".into()),
    ];
    let per_layer: &[(&str, &str)] = &[
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
    for l in [0, 1] {
        owned.extend(
            per_layer
                .iter()
                .map(|(m, o)| (format!("model.layers.{l}.{m}"), format!("layers.{l}.{o}"))),
        );
    }
    // Both variants of the indexer's weights_proj (with and without `scorer.`), one per layer.
    owned.push((
        "model.layers.0.self_attn.compressor.indexer.scorer.weights_proj.weight".into(),
        "layers.0.attn.indexer.weights_proj.weight".into(),
    ));
    owned.push((
        "model.layers.1.self_attn.compressor.indexer.weights_proj.weight".into(),
        "layers.1.attn.indexer.weights_proj.weight".into(),
    ));
    owned.push(("mtp.0.enorm.weight".into(), "mtp.0.enorm.weight".into()));
    let pairs: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();

    // 3-D experts: E=3, I=2, D=5. gate_up [3, 4, 5], down [3, 5, 2].
    let (e, i, d) = (3usize, 2usize, 5usize);
    let gate_up = seq(e * 2 * i * d, 1000.0);
    let down = seq(e * d * i, 2000.0);
    let extra = vec![
        f32t(
            "model.layers.0.mlp.experts.gate_up_proj",
            &[e, 2 * i, d],
            &gate_up,
        ),
        f32t("model.layers.0.mlp.experts.down_proj", &[e, d, i], &down),
        i64t("model.layers.0.mlp.gate.tid2eid", &[2, 2], &[1, 2, 3, 4]),
    ];
    let (_dir, ck) = check_pairs(&pairs, NamingScheme::HfModule, extra);
    for x in 0..e {
        let base = x * 2 * i * d;
        let w1 = ck
            .load_f32(&format!("layers.0.ffn.experts.{x}.w1.weight"), &[i, d])
            .unwrap();
        let w3 = ck
            .load_f32(&format!("layers.0.ffn.experts.{x}.w3.weight"), &[i, d])
            .unwrap();
        let w2 = ck
            .load_f32(&format!("layers.0.ffn.experts.{x}.w2.weight"), &[d, i])
            .unwrap();
        assert_eq!(w1, gate_up[base..base + i * d]);
        assert_eq!(w3, gate_up[base + i * d..base + 2 * i * d]);
        assert_eq!(w2, down[x * d * i..(x + 1) * d * i]);
        let info = ck
            .info(&format!("layers.0.ffn.experts.{x}.w3.weight"))
            .unwrap();
        assert_eq!(info.shape, vec![i, d]);
        assert_eq!(info.stored_name, "model.layers.0.mlp.experts.gate_up_proj");
        assert_eq!(
            ck.raw_bytes(&format!("layers.0.ffn.experts.{x}.w2.weight"))
                .unwrap(),
            f32_bytes(&w2)
        );
    }
    assert!(!ck.contains("layers.0.ffn.experts.3.w1.weight"));
    assert_eq!(
        ck.load_i64("layers.0.ffn.gate.tid2eid", &[2, 2]).unwrap(),
        vec![1, 2, 3, 4]
    );
    // total counts the 3-D tensors once, not per view.
    let expected_total = pairs.len() * 24 + (gate_up.len() + down.len()) * 4 + 32;
    assert_eq!(ck.total_bytes(), expected_total as u64);
}

#[test]
fn checkpoint_hf_module_per_expert_2d_and_unknown_names() {
    let pairs = [
        (
            "model.layers.0.self_attn.q_a_proj.weight",
            "layers.0.attn.wq_a.weight",
        ),
        (
            "model.layers.0.mlp.experts.4.gate_proj.weight",
            "layers.0.ffn.experts.4.w1.weight",
        ),
        (
            "model.layers.0.mlp.experts.4.down_proj.weight",
            "layers.0.ffn.experts.4.w2.weight",
        ),
        (
            "model.layers.0.mlp.experts.4.up_proj.weight",
            "layers.0.ffn.experts.4.w3.weight",
        ),
        // Unknown to every vocabulary: best-effort rename, does not take part in detection.
        (
            "model.layers.0.self_attn.rotary.inv_freq",
            "layers.0.attn.rotary.inv_freq",
        ),
    ];
    check_pairs(&pairs, NamingScheme::HfModule, vec![]);
}

fn fp8_weight(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|k| ((k * 37 % 101) as f32 - 50.0) * 0.013 * (1.0 + (k / cols) as f32))
        .collect()
}

#[test]
fn checkpoint_fp8_ue8m0_and_f32_scales_match_quant() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (130, 200); // partial edge blocks: scale [2, 2]
    let (q, s) = quant::quantize_fp8_blocked(&fp8_weight(rows, cols), rows, cols, 128).unwrap();
    let sf: Vec<f32> = vec![0.5, 1.25, 3.0e-3, 7.0];
    write(
        dir.path(),
        "model.safetensors",
        &[
            (
                "layers.0.attn.wq_a.weight".into(),
                StoredDtype::F8E4M3,
                vec![rows, cols],
                q.clone(),
            ),
            (
                "layers.0.attn.wq_a.scale".into(),
                StoredDtype::F8E8M0,
                vec![2, 2],
                s.clone(),
            ),
            (
                "layers.0.attn.wkv.weight".into(),
                StoredDtype::F8E4M3,
                vec![rows, cols],
                q.clone(),
            ),
            f32t("layers.0.attn.wkv.weight_scale_inv", &[2, 2], &sf),
            (
                "layers.0.attn.wo_b.weight".into(),
                StoredDtype::F8E4M3,
                vec![rows, cols],
                q.clone(),
            ),
        ],
    );
    let ck = Checkpoint::open(&dir.path().join("model.safetensors")).unwrap();
    assert_eq!(ck.scheme(), NamingScheme::Official);
    assert!(
        ck.contains("layers.0.attn.wkv.scale"),
        "weight_scale_inv is normalised to .scale"
    );

    let got = ck
        .load_f32("layers.0.attn.wq_a.weight", &[rows, cols])
        .unwrap();
    let want =
        quant::dequant_fp8_blocked(&q, rows, cols, quant::BlockScales::Ue8m0(&s), 128).unwrap();
    assert_eq!(got, want);
    // Independent spot check of the block rule W[o,i] = e4m3(q) * S[o/128, i/128].
    for (o, i) in [(0, 0), (129, 199), (127, 128), (128, 127)] {
        let v =
            quant::e4m3_to_f32(q[o * cols + i]) * quant::ue8m0_to_f32(s[(o / 128) * 2 + i / 128]);
        assert_eq!(got[o * cols + i], v);
    }
    let got = ck
        .load_f32("layers.0.attn.wkv.weight", &[rows, cols])
        .unwrap();
    let want =
        quant::dequant_fp8_blocked(&q, rows, cols, quant::BlockScales::F32(&sf), 128).unwrap();
    assert_eq!(got, want);
    assert_eq!(
        got[129 * cols + 199],
        quant::e4m3_to_f32(q[129 * cols + 199]) * 7.0
    );

    assert_eq!(
        ck.format_of("layers.0.attn.wq_a.weight").as_deref(),
        Some("fp8-e4m3 (ue8m0 128x128)")
    );
    assert_eq!(
        ck.format_of("layers.0.attn.wkv.weight").as_deref(),
        Some("fp8-e4m3 (f32 128x128)")
    );
    assert_eq!(
        ck.format_of("layers.0.attn.wo_b.weight").as_deref(),
        Some("fp8-e4m3 (no scale)")
    );
    assert_eq!(
        ck.format_of("layers.0.attn.wq_a.scale").as_deref(),
        Some("ue8m0")
    );
    assert_eq!(ck.format_of("nope"), None);
    // A scale tensor can itself be loaded as f32.
    let sv = ck.load_f32("layers.0.attn.wq_a.scale", &[2, 2]).unwrap();
    assert_eq!(
        sv,
        s.iter()
            .map(|&b| quant::ue8m0_to_f32(b))
            .collect::<Vec<_>>()
    );

    let e = ck
        .load_f32("layers.0.attn.wo_b.weight", &[rows, cols])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::MissingScale { .. }));
    assert_msg(
        &e,
        &[
            "layers.0.attn.wo_b.weight",
            "layers.0.attn.wo_b.scale",
            "model.safetensors",
        ],
    );
}

fn fp4_weight(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|k| ((k * 13 % 29) as f32 - 14.0) * 0.07 * (1 + k % 3) as f32)
        .collect()
}

#[test]
fn checkpoint_fp4_matches_quant() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (6, 96);
    let (p, s) = quant::quantize_fp4_grouped(&fp4_weight(rows, cols), rows, cols, 32).unwrap();
    let mut p_u8 = p.clone();
    p_u8[0] ^= 0x11;
    write(
        dir.path(),
        "x.safetensors",
        &[
            (
                "layers.3.ffn.experts.2.w1.weight".into(),
                StoredDtype::I8,
                vec![rows, cols / 2],
                p.clone(),
            ),
            (
                "layers.3.ffn.experts.2.w1.scale".into(),
                StoredDtype::F8E8M0,
                vec![rows, cols / 32],
                s.clone(),
            ),
            (
                "layers.3.ffn.experts.2.w2.weight".into(),
                StoredDtype::U8,
                vec![rows, cols / 2],
                p_u8.clone(),
            ),
            (
                "layers.3.ffn.experts.2.w2.scale".into(),
                StoredDtype::U8,
                vec![rows, cols / 32],
                s.clone(),
            ),
            (
                "layers.3.ffn.experts.2.w3.weight".into(),
                StoredDtype::I8,
                vec![rows, cols / 2],
                p.clone(),
            ),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let got = ck
        .load_f32("layers.3.ffn.experts.2.w1.weight", &[rows, cols])
        .unwrap();
    assert_eq!(
        got,
        quant::dequant_fp4_grouped(&p, rows, cols, &s, 32).unwrap()
    );
    // Low nibble = even element (spec §6).
    assert_eq!(
        got[0],
        quant::e2m1_to_f32(p[0] & 0xF) * quant::ue8m0_to_f32(s[0])
    );
    assert_eq!(
        got[1],
        quant::e2m1_to_f32(p[0] >> 4) * quant::ue8m0_to_f32(s[0])
    );
    let got = ck
        .load_f32("layers.3.ffn.experts.2.w2.weight", &[rows, cols])
        .unwrap();
    assert_eq!(
        got,
        quant::dequant_fp4_grouped(&p_u8, rows, cols, &s, 32).unwrap()
    );
    assert_eq!(
        ck.format_of("layers.3.ffn.experts.2.w1.weight").as_deref(),
        Some("fp4-e2m1 (ue8m0 /32)")
    );
    assert_eq!(
        ck.format_of("layers.3.ffn.experts.2.w3.weight").as_deref(),
        Some("i8")
    );
    assert_eq!(
        ck.info("layers.3.ffn.experts.2.w1.weight").unwrap().shape,
        vec![rows, cols / 2]
    );

    // Logical vs packed shape: asking with the stored [out, in/2] shape is a mismatch.
    let e = ck
        .load_f32("layers.3.ffn.experts.2.w1.weight", &[rows, cols / 2])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::ShapeMismatch { .. }));
    assert_msg(
        &e,
        &[
            "layers.3.ffn.experts.2.w1.weight",
            "[6, 48]",
            "[6, 96]",
            "x.safetensors",
        ],
    );
    let e = ck
        .load_f32("layers.3.ffn.experts.2.w3.weight", &[rows, cols])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::MissingScale { .. }));
}

#[test]
fn checkpoint_hf_module_fp4_3d_experts_with_scales() {
    let dir = tempfile::tempdir().unwrap();
    let (e, i, d) = (2usize, 4usize, 64usize);
    let w = fp4_weight(e * 2 * i, d);
    let (p, s) = quant::quantize_fp4_grouped(&w, e * 2 * i, d, 32).unwrap();
    let wd = fp4_weight(e * d, i * 8);
    let (pd, sd) = quant::quantize_fp4_grouped(&wd, e * d, i * 8, 32).unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[
            (
                "model.layers.5.mlp.experts.gate_up_proj".into(),
                StoredDtype::I8,
                vec![e, 2 * i, d / 2],
                p.clone(),
            ),
            (
                "model.layers.5.mlp.experts.gate_up_proj_scale_inv".into(),
                StoredDtype::F8E8M0,
                vec![e, 2 * i, d / 32],
                s.clone(),
            ),
            (
                "model.layers.5.mlp.experts.down_proj".into(),
                StoredDtype::I8,
                vec![e, d, i * 4],
                pd.clone(),
            ),
            (
                "model.layers.5.mlp.experts.down_proj_scale_inv".into(),
                StoredDtype::F8E8M0,
                vec![e, d, i * 8 / 32],
                sd.clone(),
            ),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.scheme(), NamingScheme::HfModule);
    let all = quant::dequant_fp4_grouped(&p, e * 2 * i, d, &s, 32).unwrap();
    let alld = quant::dequant_fp4_grouped(&pd, e * d, i * 8, &sd, 32).unwrap();
    for x in 0..e {
        let w1 = ck
            .load_f32(&format!("layers.5.ffn.experts.{x}.w1.weight"), &[i, d])
            .unwrap();
        let w3 = ck
            .load_f32(&format!("layers.5.ffn.experts.{x}.w3.weight"), &[i, d])
            .unwrap();
        let w2 = ck
            .load_f32(&format!("layers.5.ffn.experts.{x}.w2.weight"), &[d, i * 8])
            .unwrap();
        let b = x * 2 * i * d;
        assert_eq!(w1, all[b..b + i * d]);
        assert_eq!(w3, all[b + i * d..b + 2 * i * d]);
        assert_eq!(w2, alld[x * d * i * 8..(x + 1) * d * i * 8]);
        assert_eq!(
            ck.info(&format!("layers.5.ffn.experts.{x}.w1.scale"))
                .unwrap()
                .shape,
            vec![i, d / 32]
        );
        assert_eq!(
            ck.format_of(&format!("layers.5.ffn.experts.{x}.w2.weight"))
                .as_deref(),
            Some("fp4-e2m1 (ue8m0 /32)")
        );
    }
}

/// Official-release layout: shards named `model-0000x-of-0000y.safetensors` plus an index.
fn write_sharded(dir: &Path) -> (Vec<T>, Vec<T>) {
    let a = vec![
        bf16t("embed.weight", &[4, 3], &seq(12, 0.0)),
        f32t("layers.0.attn.attn_sink", &[2], &[1.5, -2.0]),
        i32t(
            "layers.0.ffn.gate.tid2eid",
            &[4, 2],
            &[0, 1, 1, 2, 2, 3, 3, 0],
        ),
    ];
    let b = vec![
        bf16t("head.weight", &[4, 3], &seq(12, 5.0)),
        f32t("hc_head_scale", &[1], &[0.125]),
        (
            "layers.0.attn.q_norm.weight".to_string(),
            StoredDtype::F16,
            vec![2],
            [0x3C00u16, 0xC000]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
    ];
    write(dir, "model-00001-of-00002.safetensors", &a);
    write(dir, "model-00002-of-00002.safetensors", &b);
    write_index(
        dir,
        &[
            ("model-00001-of-00002.safetensors", &a),
            ("model-00002-of-00002.safetensors", &b),
        ],
    );
    (a, b)
}

fn write_index(dir: &Path, shards: &[(&str, &[T])]) {
    let mut wm = serde_json::Map::new();
    let mut total = 0;
    for (f, ts) in shards {
        for t in ts.iter() {
            wm.insert(t.0.clone(), serde_json::Value::String(f.to_string()));
            total += t.3.len();
        }
    }
    let j = serde_json::json!({"metadata": {"total_size": total}, "weight_map": wm});
    std::fs::write(dir.join("model.safetensors.index.json"), j.to_string()).unwrap();
}

#[test]
fn checkpoint_sharded_index() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = write_sharded(dir.path());
    for path in [
        dir.path().to_path_buf(),
        dir.path().join("model.safetensors.index.json"),
    ] {
        let ck = Checkpoint::open(&path).unwrap();
        assert_eq!(ck.scheme(), NamingScheme::Official);
        assert_eq!(ck.files().len(), 2);
        assert_eq!(
            ck.names(),
            vec![
                "embed.weight",
                "hc_head_scale",
                "head.weight",
                "layers.0.attn.attn_sink",
                "layers.0.attn.q_norm.weight",
                "layers.0.ffn.gate.tid2eid"
            ]
        );
        assert_eq!(ck.load_f32("embed.weight", &[4, 3]).unwrap(), seq(12, 0.0));
        assert_eq!(ck.load_f32("head.weight", &[4, 3]).unwrap(), seq(12, 5.0));
        assert_eq!(
            ck.load_f32("layers.0.attn.q_norm.weight", &[2]).unwrap(),
            vec![1.0, -2.0]
        );
        assert_eq!(ck.load_f32("hc_head_scale", &[1]).unwrap(), vec![0.125]);
        assert_eq!(
            ck.load_i64("layers.0.ffn.gate.tid2eid", &[4, 2]).unwrap(),
            vec![0, 1, 1, 2, 2, 3, 3, 0]
        );
        assert_eq!(
            ck.info("head.weight").unwrap().file,
            dir.path().join("model-00002-of-00002.safetensors")
        );
        assert_eq!(ck.format_of("embed.weight").as_deref(), Some("bf16"));
        assert_eq!(
            ck.format_of("layers.0.attn.q_norm.weight").as_deref(),
            Some("f16")
        );
        let total: usize = a.iter().chain(b.iter()).map(|t| t.3.len()).sum();
        assert_eq!(ck.total_bytes(), total as u64);
    }
}

#[test]
fn checkpoint_glob_of_shards_without_index() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.safetensors",
        &[f32t("model.layers.0.self_attn.sinks", &[2], &[1.0, 2.0])],
    );
    write(
        dir.path(),
        "b.safetensors",
        &[f32t("lm_head.weight", &[1, 2], &[3.0, 4.0])],
    );
    std::fs::write(dir.path().join("README.md"), "not a shard").unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.scheme(), NamingScheme::HfModule);
    assert_eq!(ck.names(), vec!["head.weight", "layers.0.attn.attn_sink"]);
    assert_eq!(ck.load_f32("head.weight", &[1, 2]).unwrap(), vec![3.0, 4.0]);
}

#[test]
fn checkpoint_writer_interoperates_with_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "w.safetensors",
        &[
            bf16t("embed.weight", &[2, 3], &seq(6, 1.0)),
            (
                "layers.0.attn.wq_a.weight".into(),
                StoredDtype::F8E4M3,
                vec![1, 3],
                vec![1, 2, 3],
            ),
            (
                "layers.0.attn.wq_a.scale".into(),
                StoredDtype::F8E8M0,
                vec![1, 1],
                vec![127],
            ),
            i64t("layers.0.ffn.gate.tid2eid", &[1], &[7]),
        ],
    );
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(
        u64::from_le_bytes(bytes[..8].try_into().unwrap()) % 8,
        0,
        "header padded to 8"
    );
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("layers.0.attn.wq_a.weight").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F8_E4M3);
    assert_eq!(t.data(), &[1, 2, 3]);
    assert_eq!(
        st.tensor("layers.0.ffn.gate.tid2eid").unwrap().dtype(),
        safetensors::Dtype::I64
    );

    // And the other way: a file written by the safetensors crate opens here.
    let data = f32_bytes(&[1.0, 2.0]);
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
    let p2 = dir.path().join("crate.safetensors");
    safetensors::serialize_to_file([("norm.weight", view)], None, &p2).unwrap();
    let ck = Checkpoint::open(&p2).unwrap();
    assert_eq!(ck.load_f32("norm.weight", &[2]).unwrap(), vec![1.0, 2.0]);

    // Writer input validation.
    let e = write_safetensors(
        &dir.path().join("bad.safetensors"),
        &[f32t("a", &[1], &[1.0]), f32t("a", &[1], &[1.0])],
    )
    .unwrap_err();
    assert_msg(&e, &["bad.safetensors", "`a`", "duplicate"]);
    let e = write_safetensors(
        &dir.path().join("bad.safetensors"),
        &[("a".into(), StoredDtype::F32, vec![2], vec![0; 4])],
    )
    .unwrap_err();
    assert_msg(&e, &["needs 8 bytes, found 4"]);
}

// ---------------------------------------------------------------- error paths

fn small_official(dir: &Path) -> PathBuf {
    write(
        dir,
        "model.safetensors",
        &[
            bf16t("embed.weight", &[2, 3], &seq(6, 0.0)),
            f32t("norm.weight", &[3], &[1.0, 2.0, 3.0]),
        ],
    )
}

#[test]
fn checkpoint_error_truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_official(dir.path());
    let full = std::fs::read(&p).unwrap();
    std::fs::write(&p, &full[..5]).unwrap();
    let e = err_of(Checkpoint::open(&p));
    assert!(
        matches!(e, CheckpointError::Truncated { len: 5, .. }),
        "{e}"
    );
    assert_msg(&e, &["model.safetensors", "5 bytes", "at least 8"]);

    // Truncated inside the data section: the last tensor's offsets now point past the end.
    std::fs::write(&p, &full[..full.len() - 3]).unwrap();
    let e = err_of(Checkpoint::open(&p));
    assert!(matches!(e, CheckpointError::BadOffsets { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "norm.weight",
            "beyond the data section",
        ],
    );

    // Empty file.
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(
        err_of(Checkpoint::open(&p)),
        CheckpointError::Truncated { len: 0, .. }
    ));
}

#[test]
fn checkpoint_error_header_length_larger_than_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_official(dir.path());
    let mut b = std::fs::read(&p).unwrap();
    let len = b.len() as u64;
    b[..8].copy_from_slice(&(len * 3).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = err_of(Checkpoint::open(&p));
    assert!(matches!(e, CheckpointError::HeaderTooLarge { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            &format!("header length {}", len * 3),
            &format!("file size {len}"),
        ],
    );
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert!(matches!(
        err_of(Checkpoint::open(&p)),
        CheckpointError::HeaderTooLarge { .. }
    ));
}

#[test]
fn checkpoint_error_corrupt_json_header() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_official(dir.path());
    let mut b = std::fs::read(&p).unwrap();
    b[8] = b'[';
    b[9] = b'}';
    std::fs::write(&p, &b).unwrap();
    let e = err_of(Checkpoint::open(&p));
    assert!(matches!(e, CheckpointError::BadHeader { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "corrupt safetensors header",
            "does not parse",
        ],
    );

    let q = dir.path().join("q.safetensors");
    raw_file(
        &q,
        r#"{"embed.weight": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}"#,
        &[0; 4],
    );
    let e = err_of(Checkpoint::open(&q));
    assert_msg(
        &e,
        &[
            "q.safetensors",
            "embed.weight",
            "shape entry",
            "non-negative integer",
            "-1",
        ],
    );
    raw_file(
        &q,
        r#"{"embed.weight": {"dtype": "F32", "shape": [1]}}"#,
        &[0; 4],
    );
    assert_msg(
        &err_of(Checkpoint::open(&q)),
        &["embed.weight", "data_offsets", "found nothing"],
    );
    raw_file(&q, r#"[1, 2]"#, &[]);
    assert_msg(
        &err_of(Checkpoint::open(&q)),
        &["expected a JSON object", "found an array"],
    );
    raw_file(&q, "{\"a\": \u{1}}", &[]);
    assert!(matches!(
        err_of(Checkpoint::open(&q)),
        CheckpointError::BadHeader { .. }
    ));
}

#[test]
fn checkpoint_error_data_offsets_outside_file() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("model.safetensors");
    raw_file(
        &q,
        r#"{"norm.weight": {"dtype": "F32", "shape": [250], "data_offsets": [0, 1000]}}"#,
        &[0; 16],
    );
    let e = err_of(Checkpoint::open(&q));
    assert!(matches!(e, CheckpointError::BadOffsets { .. }), "{e}");
    assert_msg(
        &e,
        &["model.safetensors", "norm.weight", "[0, 1000]", "16 bytes"],
    );
    // Offsets inside the file but not dtype x shape bytes.
    raw_file(
        &q,
        r#"{"norm.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}"#,
        &[0; 16],
    );
    let e = err_of(Checkpoint::open(&q));
    assert_msg(&e, &["norm.weight", "needs 12 bytes", "span 16"]);
    // Reversed.
    raw_file(
        &q,
        r#"{"norm.weight": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}"#,
        &[0; 16],
    );
    assert_msg(&err_of(Checkpoint::open(&q)), &["norm.weight", "reversed"]);
    // Overflowing shape.
    raw_file(
        &q,
        r#"{"norm.weight": {"dtype": "F32", "shape": [18446744073709551615, 4], "data_offsets": [0, 4]}}"#,
        &[0; 16],
    );
    assert_msg(&err_of(Checkpoint::open(&q)), &["norm.weight", "overflows"]);
}

#[test]
fn checkpoint_error_index_names_missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path());
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::MissingShard { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors.index.json",
            "model-00002-of-00002.safetensors",
            "does not exist",
        ],
    );

    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        "{\"weight_map\": 3}",
    )
    .unwrap();
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::BadIndex { .. }), "{e}");
    assert_msg(&e, &["model.safetensors.index.json", "weight_map"]);
}

#[test]
fn checkpoint_error_index_names_tensor_shard_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = write_sharded(dir.path());
    let mut b2 = b.clone();
    b2.push(f32t("norm.weight", &[1], &[0.0]));
    // Index claims norm.weight lives in shard 2, but shard 2 was written without it.
    write_index(
        dir.path(),
        &[
            ("model-00001-of-00002.safetensors", &a),
            ("model-00002-of-00002.safetensors", &b2),
        ],
    );
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(
        matches!(e, CheckpointError::IndexTensorMissing { .. }),
        "{e}"
    );
    assert_msg(
        &e,
        &[
            "model.safetensors.index.json",
            "norm.weight",
            "model-00002-of-00002.safetensors",
            "no such tensor",
        ],
    );
}

#[test]
fn checkpoint_error_duplicate_tensor_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.safetensors",
        &[f32t("norm.weight", &[1], &[0.0])],
    );
    write(
        dir.path(),
        "b.safetensors",
        &[
            f32t("norm.weight", &[1], &[1.0]),
            f32t("embed.weight", &[1], &[1.0]),
        ],
    );
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::DuplicateTensor { .. }), "{e}");
    assert_msg(&e, &["norm.weight", "a.safetensors", "b.safetensors"]);

    // Same through an index.
    let idx = serde_json::json!({"weight_map": {"norm.weight": "a.safetensors", "embed.weight": "b.safetensors"}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        idx.to_string(),
    )
    .unwrap();
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::DuplicateTensor { .. }), "{e}");

    // Two stored names with one canonical name.
    let d2 = tempfile::tempdir().unwrap();
    write(
        d2.path(),
        "model.safetensors",
        &[
            f32t(
                "model.layers.0.self_attn.compressor.indexer.scorer.weights_proj.weight",
                &[1],
                &[0.0],
            ),
            f32t(
                "model.layers.0.self_attn.compressor.indexer.weights_proj.weight",
                &[1],
                &[0.0],
            ),
        ],
    );
    let e = err_of(Checkpoint::open(d2.path()));
    assert!(matches!(e, CheckpointError::DuplicateTensor { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "layers.0.attn.indexer.weights_proj.weight",
            "scorer.weights_proj",
            "indexer.weights_proj.weight",
        ],
    );
}

#[test]
fn checkpoint_error_missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    small_official(dir.path());
    let ck = Checkpoint::open(dir.path()).unwrap();
    let e = ck.load_f32("head.weight", &[2, 3]).unwrap_err();
    assert!(matches!(e, CheckpointError::MissingTensor { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "`head.weight`",
            "not found",
            &dir.path().display().to_string(),
        ],
    );
    assert!(ck.raw_bytes("head.weight").is_err());
    assert!(ck.load_i64("head.weight", &[1]).is_err());
    assert!(ck.info("head.weight").is_none());
    // Asking with a non-canonical name gets a hint.
    let e = ck
        .load_f32("model.embed_tokens.weight", &[2, 3])
        .unwrap_err();
    assert_msg(&e, &["`embed.weight`"]);
}

#[test]
fn checkpoint_error_wrong_shape() {
    let dir = tempfile::tempdir().unwrap();
    small_official(dir.path());
    let ck = Checkpoint::open(dir.path()).unwrap();
    let e = ck.load_f32("embed.weight", &[3, 2]).unwrap_err();
    assert!(matches!(e, CheckpointError::ShapeMismatch { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "embed.weight",
            "expected shape [3, 2], found [2, 3]",
        ],
    );
    let e = ck.load_f32("norm.weight", &[3, 1]).unwrap_err();
    assert_msg(&e, &["norm.weight", "[3, 1]", "[3]"]);
}

#[test]
fn checkpoint_error_wrong_dtype() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[
            bf16t("embed.weight", &[2], &[1.0, 2.0]),
            i32t("layers.0.ffn.gate.tid2eid", &[2], &[1, 2]),
            (
                "layers.0.ffn.gate.bias".into(),
                StoredDtype::Other("F64".into()),
                vec![1],
                vec![0; 8],
            ),
            (
                "layers.0.attn.wq_a.weight".into(),
                StoredDtype::F8E4M3,
                vec![1, 2],
                vec![0x38, 0x40],
            ),
            bf16t("layers.0.attn.wq_a.scale", &[1, 1], &[1.0]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let e = ck.load_i64("embed.weight", &[2]).unwrap_err();
    assert!(matches!(e, CheckpointError::DtypeMismatch { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "embed.weight",
            "expected dtype I32 or I64",
            "found BF16",
        ],
    );
    let e = ck.load_f32("layers.0.ffn.gate.tid2eid", &[2]).unwrap_err();
    assert_msg(&e, &["layers.0.ffn.gate.tid2eid", "found I32"]);
    let e = ck.load_f32("layers.0.ffn.gate.bias", &[1]).unwrap_err();
    assert_msg(&e, &["layers.0.ffn.gate.bias", "found F64"]);
    assert_eq!(
        ck.format_of("layers.0.ffn.gate.bias").as_deref(),
        Some("f64")
    );
    assert_eq!(
        ck.info("layers.0.ffn.gate.bias").unwrap().dtype,
        StoredDtype::Other("F64".into())
    );
    // Wrong scale dtype.
    let e = ck
        .load_f32("layers.0.attn.wq_a.weight", &[1, 2])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::DtypeMismatch { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "layers.0.attn.wq_a.scale",
            "F8_E8M0 (ue8m0) or F32",
            "found BF16",
        ],
    );
    assert_eq!(
        ck.format_of("layers.0.attn.wq_a.weight").as_deref(),
        Some("fp8-e4m3 (bf16 scale)")
    );
}

#[test]
fn checkpoint_error_wrong_scale_shape() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[
            (
                "layers.0.attn.wq_b.weight".into(),
                StoredDtype::F8E4M3,
                vec![256, 130],
                vec![0; 256 * 130],
            ),
            (
                "layers.0.attn.wq_b.scale".into(),
                StoredDtype::F8E8M0,
                vec![2, 1],
                vec![127; 2],
            ),
            (
                "layers.0.ffn.experts.0.w2.weight".into(),
                StoredDtype::I8,
                vec![4, 32],
                vec![0; 128],
            ),
            (
                "layers.0.ffn.experts.0.w2.scale".into(),
                StoredDtype::F8E8M0,
                vec![4, 1],
                vec![127; 4],
            ),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let e = ck
        .load_f32("layers.0.attn.wq_b.weight", &[256, 130])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::ScaleShape { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "layers.0.attn.wq_b.scale",
            "layers.0.attn.wq_b.weight",
            "expected scale shape [2, 2]",
            "found [2, 1]",
        ],
    );
    let e = ck
        .load_f32("layers.0.ffn.experts.0.w2.weight", &[4, 64])
        .unwrap_err();
    assert!(matches!(e, CheckpointError::ScaleShape { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "layers.0.ffn.experts.0.w2.scale",
            "expected scale shape [4, 2]",
            "found [4, 1]",
        ],
    );
}

#[test]
fn checkpoint_error_mixed_schemes() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[
            f32t("model.layers.0.attn.wq_a.weight", &[1], &[0.0]),
            f32t("model.layers.0.self_attn.kv_proj.weight", &[1], &[0.0]),
            f32t("model.norm.weight", &[1], &[0.0]),
        ],
    );
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::Scheme { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "mixed naming schemes",
            "model.layers.0.self_attn.kv_proj.weight",
            "model.layers.0.attn.wq_a.weight",
        ],
    );

    // Official + HF module.
    let d2 = tempfile::tempdir().unwrap();
    write(
        d2.path(),
        "a.safetensors",
        &[f32t("layers.0.attn.wq_a.weight", &[1], &[0.0])],
    );
    write(
        d2.path(),
        "b.safetensors",
        &[f32t("lm_head.weight", &[1], &[0.0])],
    );
    let e = err_of(Checkpoint::open(d2.path()));
    assert!(matches!(e, CheckpointError::Scheme { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "mixed naming schemes",
            "lm_head.weight",
            "layers.0.attn.wq_a.weight",
        ],
    );
}

#[test]
fn checkpoint_error_no_recognizable_names() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[f32t("transformer.h.0.attn.c_attn.weight", &[1], &[0.0])],
    );
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::Scheme { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "model.safetensors",
            "transformer.h.0.attn.c_attn.weight",
            "no tensor name is recognizable",
        ],
    );

    write(dir.path(), "model.safetensors", &[]);
    assert!(matches!(
        err_of(Checkpoint::open(dir.path())),
        CheckpointError::Scheme { .. }
    ));
}

#[test]
fn checkpoint_error_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::NotFound { .. }), "{e}");
    assert_msg(
        &e,
        &[&dir.path().display().to_string(), "no model.safetensors"],
    );
    let e = err_of(Checkpoint::open(&dir.path().join("nope.safetensors")));
    assert!(matches!(e, CheckpointError::NotFound { .. }), "{e}");
}

#[test]
fn checkpoint_error_bad_expert_split() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &[f32t(
            "model.layers.0.mlp.experts.gate_up_proj",
            &[2, 3, 1],
            &[0.0; 6],
        )],
    );
    let e = err_of(Checkpoint::open(dir.path()));
    assert!(matches!(e, CheckpointError::ExpertSplit { .. }), "{e}");
    assert_msg(&e, &["gate_up_proj", "must be even", "[2, 3, 1]"]);
    write(
        dir.path(),
        "model.safetensors",
        &[f32t(
            "model.layers.0.mlp.experts.down_proj",
            &[6],
            &[0.0; 6],
        )],
    );
    assert_msg(
        &err_of(Checkpoint::open(dir.path())),
        &["down_proj", "3-D", "[6]"],
    );
}

/// Corrupting or truncating any byte of a valid file never panics; open either succeeds or errs.
#[test]
fn checkpoint_corruption_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "model.safetensors",
        &[
            (
                "layers.0.attn.wq_a.weight".into(),
                StoredDtype::F8E4M3,
                vec![2, 2],
                vec![1, 2, 3, 4],
            ),
            (
                "layers.0.attn.wq_a.scale".into(),
                StoredDtype::F8E8M0,
                vec![1, 1],
                vec![127],
            ),
            i64t("layers.0.ffn.gate.tid2eid", &[1], &[3]),
        ],
    );
    let good = std::fs::read(&p).unwrap();
    let q = dir.path().join("c.safetensors");
    for cut in 0..good.len() {
        std::fs::write(&q, &good[..cut]).unwrap();
        let _ = Checkpoint::open(&q);
    }
    for pos in 0..good.len() {
        for v in [0u8, b'9', b'"', b'-', 0xFF] {
            let mut b = good.clone();
            b[pos] = v;
            std::fs::write(&q, &b).unwrap();
            if let Ok(ck) = Checkpoint::open(&q) {
                for n in ck.names() {
                    let info = ck.info(&n).unwrap();
                    let _ = ck.load_f32(&n, &info.shape);
                    let _ = ck.load_i64(&n, &info.shape);
                    let _ = ck.format_of(&n);
                    let _ = ck.raw_bytes(&n).unwrap();
                }
            }
        }
    }
}

#[test]
fn checkpoint_is_send_and_sync() {
    fn assert_send_sync<X: Send + Sync>() {}
    assert_send_sync::<Checkpoint>();
    assert_send_sync::<CheckpointError>();
}
