//! The exact CPU reference forward pass of DeepSeek-V4 (spec §4), one module per spec section:
//! [`mhc`] (§4.2–4.3), [`attention`] (§4.5–4.7), [`compressor`] (§4.8–4.9), [`indexer`] (§4.10),
//! [`moe`] (§4.11), [`head`] (§4.12).
//!
//! Numerics: f32 storage, f64 accumulation, fixed reduction order; matches transformers'
//! `DeepseekV4ForCausalLM` in float32 (goldens in `tests/fixtures/goldens`, tolerance stated in
//! `crates/engine/tests/golden.rs`). The official quantisation simulations (spec §10) are opt-in
//! through [`Numerics`].

pub mod attention;
pub mod compressor;
pub mod head;
pub mod indexer;
pub mod mhc;
pub mod moe;

use crate::cpu::rope::Rope;
use crate::state::{CompressorState, LayerState, SequenceState};
use crate::weights::ModelWeights;
use flashseek_model::config::LayerKind;
use flashseek_model::quant;
use rayon::prelude::*;
use std::borrow::Cow;

/// DeepSeek's official numerics simulations (spec §10), each off by default (exact HF numerics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Numerics {
    /// §10.1: FP8 e4m3 quant-dequant (block 128, ue8m0 scales) of the inputs of wq_a, wq_b, wkv,
    /// wo_b, indexer wq_b, shared and routed w1/w3/w2.
    pub act_quant_fp8: bool,
    /// §10.2: FP8 round trip (block 64) of the nope dims of raw and compressed K=V rows after RoPE.
    pub kv_fp8: bool,
    /// §10.3: Hadamard rotation + FP4 round trip (block 32) of indexer queries and keys.
    pub indexer_fp4: bool,
}

impl Numerics {
    /// All official simulations on (OFF-M behaviour).
    pub fn official() -> Self {
        Numerics { act_quant_fp8: true, kv_fp8: true, indexer_fp4: true }
    }

    /// The input of a quantised GEMM: `x` (`[T, width]`) unchanged, or its FP8 round trip per
    /// 128-feature block of each row (a shorter final block when `width` is not a multiple of 128).
    pub fn act_in<'a>(&self, x: &'a [f32], width: usize) -> Cow<'a, [f32]> {
        if !self.act_quant_fp8 {
            return Cow::Borrowed(x);
        }
        let mut y = x.to_vec();
        for row in y.chunks_mut(width) {
            for blk in row.chunks_mut(128) {
                let n = blk.len();
                // Non-finite activations are left as they are (they propagate to the output).
                let _ = quant::act_quant_fp8_roundtrip(blk, n);
            }
        }
        Cow::Owned(y)
    }

    /// §10.2 on one K=V row: FP8 round trip of dims `[0, nope)` in blocks of 64.
    pub fn kv_roundtrip(&self, row: &mut [f32], nope: usize) {
        if self.kv_fp8 {
            for blk in row[..nope].chunks_mut(64) {
                let n = blk.len();
                let _ = quant::kv_nope_fp8_roundtrip(blk, n, n);
            }
        }
    }

    /// §10.3 on one indexer query head or key (length a power of two, checked by the caller's config).
    pub fn indexer_roundtrip(&self, v: &mut [f32]) {
        if self.indexer_fp4 {
            let block = v.len().min(32);
            let _ = quant::indexer_hadamard_fp4_roundtrip(v, block);
        }
    }
}

/// Errors of the forward pass (bad inputs; the weights were validated at load).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No tokens were given.
    #[error("the input is empty: at least one token is required")]
    Empty,
    /// A token id is outside the vocabulary.
    #[error("token id {id} at position {pos} is out of range (vocab_size {vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Its position in the input.
        pos: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The official indexer simulation needs a power-of-two `index_head_dim`.
    #[error("official indexer numerics need a power-of-two index_head_dim, found {0}")]
    IndexerDim(usize),
}

/// Options of a forward call.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardOptions {
    /// Official numerics simulations.
    pub numerics: Numerics,
    /// Keep every layer's output streams (for parity tests).
    pub record_streams: bool,
}

/// Which positions of a chunk get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every position of the chunk.
    All,
    /// Only the chunk's last position.
    Last,
    /// None (prefill of a chunk that is not the last).
    None,
}

/// Result of a forward call over T tokens.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `[T', vocab]` f32 logits for the positions selected by [`LogitsFor`].
    pub logits: Vec<f32>,
    /// With `record_streams`: per layer, its output streams `[T, hc_mult, hidden]`.
    pub layer_streams: Vec<Vec<f32>>,
    /// The chunk's hidden streams after the last layer, `[T, hc_mult, hidden]` (input of the MTP head).
    pub final_streams: Vec<f32>,
}

/// The rope tables of a model.
pub struct Ropes {
    /// Sliding layers (main rope).
    pub main: Rope,
    /// CSA/HCA layers, compressors and indexer (compress rope).
    pub compress: Rope,
}

impl Ropes {
    /// Builds both tables from the config.
    pub fn new(w: &ModelWeights) -> Self {
        let c = &w.config;
        Ropes { main: Rope::new(&c.rope_main, c.qk_rope_head_dim), compress: Rope::new(&c.rope_compress, c.qk_rope_head_dim) }
    }
    /// The table a layer of kind `kind` uses.
    pub fn for_kind(&self, kind: LayerKind) -> &Rope {
        if kind.uses_compress_rope() {
            &self.compress
        } else {
            &self.main
        }
    }
}

/// Checks token ids against the vocabulary.
pub fn check_ids(ids: &[u32], vocab: usize) -> Result<(), ForwardError> {
    if ids.is_empty() {
        return Err(ForwardError::Empty);
    }
    if let Some((pos, &id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= vocab) {
        return Err(ForwardError::TokenOutOfRange { id, pos, vocab });
    }
    Ok(())
}

/// One-shot forward over a whole sequence starting at position 0 (spec §4; HF stateless mode),
/// logits for every position. Equal to [`forward_chunk`] on a fresh state.
///
/// Errors: see [`forward_chunk`].
pub fn forward(w: &ModelWeights, ids: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput, ForwardError> {
    let mut state = SequenceState::new(&w.config, Some(0));
    forward_chunk(w, &mut state, ids, LogitsFor::All, opts)
}

/// Processes `ids` as the next tokens of the sequence in `state` (positions `state.pos..`), layer by
/// layer over the whole chunk (spec §4): embedding → `hc_mult` streams → per layer mHC / attention /
/// mHC / MoE → hc head, norm, LM head for the positions `logits_for` selects. Updates `state`.
///
/// Errors (state untouched): empty input, a token id ≥ vocab_size, or official indexer numerics on
/// a non-power-of-two indexer head dim.
pub fn forward_chunk(
    w: &ModelWeights,
    state: &mut SequenceState,
    ids: &[u32],
    logits_for: LogitsFor,
    opts: &ForwardOptions,
) -> Result<ForwardOutput, ForwardError> {
    let c = &w.config;
    check_ids(ids, c.vocab_size)?;
    if opts.numerics.indexer_fp4 && !c.index_head_dim.is_power_of_two() {
        return Err(ForwardError::IndexerDim(c.index_head_dim));
    }
    let num = &opts.numerics;
    let (d, n, t) = (c.hidden_size, c.hc_mult, ids.len());
    let ropes = Ropes::new(w);
    let pos0 = state.pos;

    // §4.1: the embedding row copied into every stream.
    let mut x = vec![0f32; t * n * d];
    for (ti, id) in ids.iter().enumerate() {
        for j in 0..n {
            x[(ti * n + j) * d..(ti * n + j + 1) * d].copy_from_slice(w.embed.row(*id as usize));
        }
    }
    let mut layer_streams = Vec::new();
    for (lw, ls) in w.layers.iter().zip(state.layers.iter_mut()) {
        // Attention sub-block.
        let (mut a, mixes) = pre_all(&lw.hc_attn, &x, c.hc_mult, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps, d);
        crate::cpu::ops::rms_norm(&mut a, &lw.attn_norm, c.rms_norm_eps);
        let y = attention_chunk(w, lw, ls, &a, pos0, &ropes, num);
        post_all(&mixes, &mut x, &y, n, d);
        // MoE sub-block.
        let (mut f, mixes) = pre_all(&lw.hc_ffn, &x, c.hc_mult, c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps, d);
        crate::cpu::ops::rms_norm(&mut f, &lw.ffn_norm, c.rms_norm_eps);
        let routes = moe::route(c, lw, &f, ids);
        let y = moe::moe(c, lw, &f, &routes, num);
        post_all(&mixes, &mut x, &y, n, d);
        if opts.record_streams {
            layer_streams.push(x.clone());
        }
    }
    state.pos += t;
    state.trim();
    let rows: &[f32] = match logits_for {
        LogitsFor::All => &x,
        LogitsFor::Last => &x[(t - 1) * n * d..],
        LogitsFor::None => &[],
    };
    let h: Vec<f32> = rows.par_chunks(n * d).flat_map_iter(|xt| head::collapse(w, xt)).collect();
    let logits = if h.is_empty() { Vec::new() } else { head::logits(w, &h) };
    Ok(ForwardOutput { logits, layer_streams, final_streams: x })
}

/// mHC pre over all tokens (parallel; per-token results are independent).
pub fn pre_all(
    hw: &crate::weights::HcWeights,
    x: &[f32],
    n: usize,
    iters: usize,
    eps: f64,
    hc_eps: f64,
    d: usize,
) -> (Vec<f32>, Vec<mhc::HcMix>) {
    let per: Vec<(Vec<f32>, mhc::HcMix)> = x.par_chunks(n * d).map(|xt| mhc::hc_pre(hw, xt, n, iters, eps, hc_eps)).collect();
    let mut u = Vec::with_capacity(per.len() * d);
    let mut mixes = Vec::with_capacity(per.len());
    for (ut, m) in per {
        u.extend(ut);
        mixes.push(m);
    }
    (u, mixes)
}

/// mHC post over all tokens.
pub fn post_all(mixes: &[mhc::HcMix], x: &mut [f32], y: &[f32], n: usize, d: usize) {
    x.par_chunks_mut(n * d)
        .zip(mixes.par_iter())
        .enumerate()
        .for_each(|(ti, (xt, m))| mhc::hc_post(m, xt, &y[ti * d..(ti + 1) * d], n));
}

/// Appends the chunk's compressor projections to `cs` and emits every entry whose window is now
/// complete (spec §4.8/§4.9 streaming: the incomplete window stays buffered; CSA reads the previous
/// window's A half from the stored rows). `post` is applied to each new entry (official simulation).
fn compress_chunk(
    cw: &crate::weights::CompressorWeights,
    cs: &mut CompressorState,
    a: &[f32],
    pos0: usize,
    eps: f64,
    rope: &Rope,
    post: impl Fn(&mut [f32]),
) {
    let p = compressor::project(cw, a, pos0);
    cs.kv.extend(&p.kv);
    cs.logit.extend(&p.logit);
    let end = pos0 + a.len() / cw.wkv.cols;
    let complete = end / cs.ratio;
    let kv = &cs.kv;
    let logit = &cs.logit;
    let rows = |t: usize| (kv.get(t), logit.get(t));
    let mut new = Vec::new();
    for e in cs.entries.len() / cs.width..complete {
        let slots = compressor::window_slots(e, cs.ratio, cs.width, cs.overlap, rows);
        let mut entry = compressor::pool(&slots, &cw.norm, eps, rope, e * cs.ratio);
        post(&mut entry);
        new.extend(entry);
    }
    cs.entries.extend(new);
}

/// One layer's attention for a chunk at positions `pos0..`, reading and extending the layer state.
fn attention_chunk(
    w: &ModelWeights,
    lw: &crate::weights::LayerWeights,
    ls: &mut LayerState,
    a: &[f32],
    pos0: usize,
    ropes: &Ropes,
    num: &Numerics,
) -> Vec<f32> {
    let c = &w.config;
    let (d, hd) = (c.hidden_size, c.head_dim);
    let t = a.len() / d;
    let rope = ropes.for_kind(lw.kind);
    let qp = attention::project_queries(c, lw, a, pos0, rope, num);
    ls.kv.extend(&attention::project_kv(c, lw, a, pos0, rope, num));
    if let (Some(cw), Some(cs)) = (&lw.compressor, &mut ls.compressor) {
        compress_chunk(cw, cs, a, pos0, c.rms_norm_eps, &ropes.compress, |e| num.kv_roundtrip(e, c.nope_head_dim()));
    }
    let iq = match (&lw.indexer, &mut ls.indexer) {
        (Some(iw), Some(is)) => {
            compress_chunk(&iw.compressor, is, a, pos0, c.rms_norm_eps, &ropes.compress, |k| num.indexer_roundtrip(k));
            Some(indexer::queries(iw, &qp.qr, a, pos0, &ropes.compress, num))
        }
        _ => None,
    };
    let ls = &*ls;
    let entries: &[f32] = ls.compressor.as_ref().map_or(&[], |cs| &cs.entries);
    let n_entries = entries.len() / hd;
    let o: Vec<f32> = (0..t)
        .into_par_iter()
        .flat_map_iter(|ti| {
            let pos = pos0 + ti;
            let mut keys: Vec<&[f32]> = attention::window_range(pos, c.sliding_window).map(|j| ls.kv.get(j)).collect();
            let visible: Vec<usize> = match (lw.kind, &iq, &ls.indexer) {
                (LayerKind::Sliding, _, _) => Vec::new(),
                (LayerKind::Hca { ratio }, _, _) => (0..((pos + 1) / ratio).min(n_entries)).collect(),
                (LayerKind::Csa { ratio }, Some(iq), Some(is)) => indexer::select(iq, ti, pos, ratio, &is.entries, c.index_topk),
                (LayerKind::Csa { .. }, _, _) => unreachable!("CSA layers always carry an indexer (checked at load)"),
            };
            keys.extend(visible.iter().map(|e| &entries[e * hd..(e + 1) * hd]));
            let qt = &qp.q[ti * c.num_attention_heads * hd..(ti + 1) * c.num_attention_heads * hd];
            attention::attend(qt, &keys, &lw.attn_sink, hd, rope, pos)
        })
        .collect();
    attention::output_projection(c, lw, &o, num)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{formula_ids, nmse, FormulaSource};
    use flashseek_model::config::Ds4Config;

    /// A small config with power-of-two indexer heads and 128-multiple widths, so every official
    /// simulation applies exactly as on Flash (full 128-blocks, 64-blocks of nope dims, 32-blocks).
    fn tiny() -> ModelWeights {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"model_type": "deepseek_v4", "vocab_size": 300, "hidden_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
            "o_groups": 2, "o_lora_rank": 64, "sliding_window": 8,
            "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            "mlp_layer_types": ["hash_moe", "moe", "moe"],
            "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            "index_n_heads": 4, "index_head_dim": 128, "index_topk": 3,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536}}"#,
        )
        .unwrap();
        let cfg = Ds4Config::from_json(&v).unwrap();
        ModelWeights::load(&cfg, &FormulaSource { seed: 5, n_experts: 4 }).unwrap()
    }


    #[test]
    fn act_in_is_the_fp8_roundtrip_per_128_block() {
        // Hand case: a row of 128 with amax 1.0 → s = 2^ceil(log2(1/448)) = 2^-8; 0.3 → 0.3125
        // (e4m3 grid at 0.3/2^-8 = 76.8 → 80 × 2^-8), 1.0 stays 1.0, and a second row is independent.
        let mut x = vec![0f32; 256];
        x[0] = 1.0;
        x[1] = 0.3;
        x[128] = 448.0;
        x[129] = 3.0;
        let on = Numerics { act_quant_fp8: true, ..Default::default() };
        let y = on.act_in(&x, 256);
        assert_eq!((y[0], y[1]), (1.0, 0.3125));
        // Second block: amax 448 → s = 1 → 3.0 exact.
        assert_eq!((y[128], y[129]), (448.0, 3.0));
        let off = Numerics::default().act_in(&x, 256);
        assert_eq!(&off[..], &x[..]);
    }

    #[test]
    fn kv_roundtrip_touches_only_nope_dims() {
        let on = Numerics { kv_fp8: true, ..Default::default() };
        let mut row: Vec<f32> = (0..128).map(|i| 0.1 + i as f32 * 0.013).collect();
        let orig = row.clone();
        on.kv_roundtrip(&mut row, 64);
        assert_eq!(&row[64..], &orig[64..], "rope dims untouched");
        assert_ne!(&row[..64], &orig[..64], "nope dims quantised");
        // Hand value: block amax 0.919 → s = 2^ceil(log2(0.919/448)) = 2^-8; 0.1/2^-8 = 25.6 → e4m3 26 → 0.1015625.
        assert_eq!(row[0], 0.1015625);
    }

    #[test]
    fn indexer_roundtrip_keeps_dot_products_close() {
        let on = Numerics { indexer_fp4: true, ..Default::default() };
        let q: Vec<f32> = (0..128).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let k: Vec<f32> = (0..128).map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0).collect();
        let (mut q2, mut k2) = (q.clone(), k.clone());
        on.indexer_roundtrip(&mut q2);
        on.indexer_roundtrip(&mut k2);
        let exact = crate::cpu::ops::dot(&q, &k);
        let sim = crate::cpu::ops::dot(&q2, &k2);
        // Hadamard is orthonormal, so the only change is FP4 noise (relative to |q||k|).
        let scale = crate::cpu::ops::dot(&q, &q).sqrt() * crate::cpu::ops::dot(&k, &k).sqrt();
        assert!(((sim - exact) / scale).abs() < 0.05, "exact {exact} sim {sim}");
        assert_ne!(q2, q);
    }

    /// DeepSeek's activation quantisation rounds every §10.1 GEMM input to e4m3 (3 mantissa bits):
    /// a last-bit difference before a rounding can move a value by a whole e4m3 step, and the next
    /// quantisation in the same layer amplifies it again. This is why the GPU's `TC_LINEAR=fp8` rows
    /// are judged per GEMM and per MoE layer on identical inputs, not end to end (see
    /// `cuda/check_switches.rs`): here a 1e-5 relative change of the embeddings stays at ~1e-10 per
    /// layer in HF numerics but grows by orders of magnitude in official numerics.
    #[test]
    fn official_numerics_amplify_last_bit_differences() {
        let w = tiny();
        let ids = formula_ids(3, 40, w.config.vocab_size);
        let mut wp = tiny();
        // A relative change of ~1e-5 per element: the size of the GPU's split-bf16 tensor-core
        // rounding (NMSE ~1e-10) that reaches the quantisation points on the GPU.
        for (i, v) in wp.embed.data.iter_mut().enumerate() {
            *v *= 1.0 + if i % 2 == 0 { 1e-5 } else { -1e-5 };
        }
        let gap = |num: Numerics| -> Vec<f64> {
            let opts = ForwardOptions { numerics: num, record_streams: true };
            let a = forward(&w, &ids, &opts).unwrap().layer_streams;
            let b = forward(&wp, &ids, &opts).unwrap().layer_streams;
            a.iter().zip(&b).map(|(x, y)| nmse(y, x)).collect()
        };
        let hf = gap(Numerics::default());
        let official = gap(Numerics { act_quant_fp8: true, ..Default::default() });
        let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.2e}")).collect::<Vec<_>>().join(", ");
        println!("1e-5 embedding change, per-layer stream NMSE: HF [{}], official act_quant_fp8 [{}]", fmt(&hf), fmt(&official));
        assert!(hf.iter().all(|v| *v < 1e-8), "HF numerics stay near the input change: {hf:?}");
        assert!(official.iter().any(|v| *v > 1e3 * hf.iter().cloned().fold(1e-30, f64::max)), "official numerics amplify: {official:?} vs {hf:?}");
    }

    #[test]
    fn each_switch_alone_changes_logits_by_quantisation_noise_only() {
        let w = tiny();
        let ids = formula_ids(3, 40, w.config.vocab_size);
        let exact = forward(&w, &ids, &ForwardOptions::default()).unwrap().logits;
        for (name, num) in [
            ("act_quant_fp8", Numerics { act_quant_fp8: true, ..Default::default() }),
            ("kv_fp8", Numerics { kv_fp8: true, ..Default::default() }),
            ("indexer_fp4", Numerics { indexer_fp4: true, ..Default::default() }),
            ("official", Numerics::official()),
        ] {
            let opts = ForwardOptions { numerics: num, record_streams: false };
            let a = forward(&w, &ids, &opts).unwrap().logits;
            let b = forward(&w, &ids, &opts).unwrap().logits;
            assert_eq!(a, b, "{name}: deterministic");
            let e = nmse(&a, &exact);
            println!("{name}: logits NMSE vs exact {e:.3e}");
            assert!(e > 0.0, "{name}: switch had no effect");
            assert!(e < 0.3, "{name}: NMSE {e} too large for quantisation noise");
        }
    }
}
