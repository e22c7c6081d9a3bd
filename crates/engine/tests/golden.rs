//! Parity of the CPU reference forward pass with transformers' `DeepseekV4ForCausalLM` (float32)
//! on the goldens made by `scripts/make_goldens.py` (see `tests/fixtures/goldens/*/meta.json`).
//!
//! Metric, per tensor (logits of a case, or one layer's output streams of a case):
//! `max|ours − ref| / max|ref|` ≤ 1e-4 (the tolerance). Measured values are printed.

use flashseek_engine::forward::{forward, ForwardOptions};
use flashseek_engine::testing::{formula_ids, FormulaSource};
use flashseek_engine::weights::{ModelWeights, TensorSource};
use flashseek_model::checkpoint::Checkpoint;
use flashseek_model::config::Ds4Config;
use safetensors::SafeTensors;
use std::path::PathBuf;

const TOL: f64 = 1e-4;

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/goldens").join(name)
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("golden tensor {name}: {e}"));
    t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn i64s(st: &SafeTensors<'_>, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("golden tensor {name}: {e}"));
    t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect()
}

/// `max|a − b| / max|b|`.
fn rel_err(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length mismatch");
    let scale = reference.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let diff = ours.iter().zip(reference).fold(0f64, |m, (a, b)| m.max((*a as f64 - *b as f64).abs()));
    assert!(ours.iter().all(|v| v.is_finite()), "non-finite output");
    diff / scale.max(1e-30)
}

/// Runs every case of golden `name` with weights from `src`; returns the worst logits and streams errors.
fn check(name: &str, seed: u64, src: &dyn TensorSource) -> (f64, f64) {
    let dir = golden_dir(name);
    let cfg = Ds4Config::from_file(&dir.join("model")).expect("golden config parses");
    let weights = ModelWeights::load(&cfg, src).expect("golden weights load");
    let bytes = std::fs::read(dir.join("golden.safetensors")).expect("golden file");
    let st = SafeTensors::deserialize(&bytes).expect("golden file parses");
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let (mut worst_logits, mut worst_streams) = (0f64, 0f64);
    let (n, d) = (cfg.hc_mult, cfg.hidden_size);
    for len in meta["lengths"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize) {
        let ids: Vec<u32> = i64s(&st, &format!("ids.{len}")).iter().map(|v| *v as u32).collect();
        assert_eq!(ids, formula_ids(seed, len, cfg.vocab_size), "ids formula mirrors the script");
        let out = forward(&weights, &ids, &ForwardOptions { record_streams: true, ..Default::default() }).unwrap();
        let e_logits = rel_err(&out.logits, &f32s(&st, &format!("logits.{len}")));
        let positions = i64s(&st, &format!("positions.{len}"));
        let mut e_streams = 0f64;
        for (l, streams) in out.layer_streams.iter().enumerate() {
            let ours: Vec<f32> =
                positions.iter().flat_map(|p| streams[*p as usize * n * d..(*p as usize + 1) * n * d].iter().copied()).collect();
            e_streams = e_streams.max(rel_err(&ours, &f32s(&st, &format!("streams.{len}.{l}"))));
        }
        println!("{name} T={len}: logits rel err {e_logits:.3e}, layer streams rel err {e_streams:.3e}");
        assert!(e_logits <= TOL, "{name} T={len}: logits rel err {e_logits:.3e} > {TOL:e}");
        assert!(e_streams <= TOL, "{name} T={len}: streams rel err {e_streams:.3e} > {TOL:e}");
        worst_logits = worst_logits.max(e_logits);
        worst_streams = worst_streams.max(e_streams);
    }
    println!("{name}: worst logits {worst_logits:.3e}, worst streams {worst_streams:.3e} (tolerance {TOL:e})");
    (worst_logits, worst_streams)
}

fn seed_of(name: &str) -> u64 {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir(name).join("meta.json")).unwrap()).unwrap();
    meta["seed"].as_u64().unwrap()
}

fn n_experts(name: &str) -> usize {
    Ds4Config::from_file(&golden_dir(name).join("model")).unwrap().n_routed_experts
}

/// Loads the committed `save_pretrained` checkpoint (transformers' on-disk layout).
fn check_saved(name: &str) {
    let ckpt = Checkpoint::open(&golden_dir(name).join("model")).expect("golden checkpoint opens");
    check(name, seed_of(name), &ckpt);
}

#[test]
fn golden_tiny_flash_rates_from_saved_checkpoint() {
    check_saved("tiny_flash_rates");
}

#[test]
fn golden_tiny_odd_rates_from_saved_checkpoint() {
    check_saved("tiny_odd_rates");
}

#[test]
fn golden_tiny_formula_weights_equal_saved_weights() {
    // The generator reproduces the committed weights exactly, which is what lets the full-width
    // case (weights not committed) be rebuilt in Rust.
    for name in ["tiny_flash_rates", "tiny_odd_rates"] {
        let dir = golden_dir(name).join("model");
        let cfg = Ds4Config::from_file(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let src = FormulaSource { seed: seed_of(name), n_experts: cfg.n_routed_experts };
        let mut checked = 0;
        for canon in ckpt.names() {
            let info = ckpt.info(&canon).unwrap();
            if canon.ends_with("tid2eid") {
                assert_eq!(ckpt.load_i64(&canon, &info.shape).unwrap(), src.load_i64(&canon, &info.shape).unwrap(), "{canon}");
            } else {
                assert_eq!(ckpt.load_f32(&canon, &info.shape).unwrap(), src.load_f32(&canon, &info.shape).unwrap(), "{canon}");
            }
            checked += 1;
        }
        assert!(checked > 50, "{name}: only {checked} tensors");
    }
}

#[test]
fn golden_full_width_from_formula() {
    let name = "full_width";
    check(name, seed_of(name), &FormulaSource { seed: seed_of(name), n_experts: n_experts(name) });
}
