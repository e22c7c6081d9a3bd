//! gpu-check entries for the mHC and MoE families: each kernel (and the whole-layer glue
//! [`Gpu::moe_forward`]) against the CPU reference functions on fresh random inputs.
//!
//! - `hc_pre u/post/comb`: [`mhc::hc_pre`] per token, Flash shapes (n 4, d 4096, 20 Sinkhorn iterations).
//! - `hc_post`: [`mhc::hc_post`] with the CPU's own mixes (rounded to f32 for the device).
//! - `hc_head+norm`: [`head::collapse`] (collapse, then the final RMSNorm) vs `hc_head` + `rms_norm`.
//! - `hc_pre fused …`, `hc_post_mix_f32 … bits`, `hc_pre_norm bits …`, `hc_pre_norm post/comb
//!   records …` (MHC_FUSED): the fused post + mix and pre + RMSNorm vs the CPU, bit for bit vs the
//!   unfused kernels, and the f64 coefficient records vs the f32 post / comb, for four shapes.
//! - `hc_pre_norm_bf16 bits …`, `hc_post_mix_bf16 x / partials / T=7 bits …`, `hc_post_bf16 x bits …`,
//!   `hc_post_mix_bf16 x vs hc_post_mix_f32 …`, `hc_pre fused bf16 …`, `hc_gather_bf16 bits`,
//!   `hc_widen_bf16 bits` (MHC_BF16_STREAMS): the bf16 posts (f32 arithmetic) bit for bit against
//!   their replay on the host and by NMSE against the exact f64 post, the pre's finish and the
//!   partials bit for bit against the f32 kernels on the widened streams, batch invariance, and the
//!   fused pre on bf16 streams vs the CPU on the same values.
//! - `router …`: [`moe::route`] (E 256, top-6; sqrt-softplus score layer with forced ties, hash layer,
//!   sigmoid score layer) on the same logits; expert ids compared exactly, weights γ by NMSE.
//! - `swiglu`: the clamped SwiGLU formula of `forward::moe` elementwise.
//! - `moe_combine bits …`: moe_combine_f32 against its f64 fma sum replayed on the host, bit for bit;
//!   `moe_combine_bf16 bits …` the same on bf16 slots (against the replay over their widening).
//! - `moe_forward …`: a whole MoE layer for 9 tokens, E 16 FP4 experts (top-6) and an FP8 shared
//!   expert, vs [`moe::route`] + [`moe::moe`] (exact numerics) on the dequantized weights, for a score
//!   and a hash layer: ids exact, γ and the output by NMSE.
//!
//! The CPU side calls the real reference functions; the few structs they take
//! ([`LayerWeights`], [`ModelWeights`]) are filled with the tensors under test and empty matrices for
//! everything the function does not read.

use super::check::{differing_bits, differing_values, flag_record, median_ms, random, record, record_tol};
use super::gpu::{Gpu, GpuMatrix, GpuWeight};
use super::ops_mhc::{GpuExpert, GpuHcWeights, GpuMoeLayer, GpuRouter, HcPostCoefs};
use super::CudaError;
use crate::cpu::ops;
use crate::default_model::default_config;
use crate::forward::{head, mhc, moe, Numerics};
use crate::testing::{formula_ids, formula_tid2eid};
use crate::weights::{ExpertWeights, HcWeights, LayerWeights, Matrix, ModelWeights, RouterWeights};
use flashseek_model::config::{Ds4Config, LayerKind, ScoringFunc};
use flashseek_model::quant;
use serde_json::{json, Value};

/// Runs the mHC/MoE checks, appending one record per op to `out`; returns whether all passed.
pub fn run(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    all &= check_hc(gpu, seed, out)?;
    all &= check_router(gpu, seed, out)?;
    all &= check_swiglu(gpu, seed, out)?;
    all &= check_moe_combine(gpu, seed, out)?;
    all &= check_moe_layer(gpu, seed, out)?;
    Ok(all)
}

/// Records an exact comparison of expert ids (`got` from the device, −1 = invalid) and returns it.
fn record_ids(out: &mut Vec<Value>, op: &str, shape: Value, got: &[i32], reference: &[usize]) -> bool {
    let differ = got.len().abs_diff(reference.len()) + got.iter().zip(reference).filter(|(g, r)| usize::try_from(**g).ok() != Some(**r)).count();
    let pass = differ == 0;
    println!("{op:<28} {shape:<28} {differ} of {} expert ids differ (exact)  {}", reference.len(), if pass { "ok" } else { "FAIL" });
    out.push(json!({"op": op, "shape": shape, "exact": true, "total": reference.len(), "mismatches": differ, "pass": pass}));
    pass
}

/// An empty matrix for the fields a reference function does not read.
fn none() -> Matrix {
    Matrix { rows: 0, cols: 0, data: Vec::new() }
}

/// A config for the reference functions: the built-in default's with the fields under test replaced.
pub(crate) fn config(d: usize, e: usize, k: usize, scoring: ScoringFunc, limit: f64) -> Ds4Config {
    let mut c = default_config();
    c.hidden_size = d;
    c.n_routed_experts = e;
    c.num_experts_per_tok = k;
    c.scoring_func = scoring;
    c.routed_scaling_factor = 1.5;
    c.swiglu_limit = limit;
    c.hc_mult = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.rms_norm_eps = 1e-6;
    c
}

/// A layer holding only what `moe::route` / `moe::moe` read (gate, router, shared, experts).
pub(crate) fn moe_layer(gate: Matrix, router: RouterWeights, shared: ExpertWeights, experts: Vec<ExpertWeights>) -> LayerWeights {
    let hc = || HcWeights { fn_: none(), base: Vec::new(), scale: Vec::new() };
    LayerWeights {
        kind: LayerKind::Sliding,
        attn_norm: Vec::new(),
        wq_a: none(),
        q_norm: Vec::new(),
        wq_b: none(),
        wkv: none(),
        kv_norm: Vec::new(),
        wo_a: none(),
        wo_b: none(),
        attn_sink: Vec::new(),
        compressor: None,
        indexer: None,
        hc_attn: hc(),
        hc_ffn: hc(),
        ffn_norm: Vec::new(),
        gate,
        router,
        shared,
        experts,
    }
}

/// Random mHC sub-block weights for `n` streams of `d` like a real model's (inputs `{key}.fn`, `.base`,
/// `.scale`): Φ `[(2+n)·n, n·d]` ~ U(±sqrt(3/(n·d))), b ~ U(±0.5), α ~ 1 + U(±0.5).
fn random_hc(seed: u64, key: &str, n: usize, d: usize) -> HcWeights {
    let (nd, mix) = (n * d, (2 + n) * n);
    HcWeights {
        fn_: Matrix { rows: mix, cols: nd, data: random(seed, &format!("{key}.fn"), mix * nd, (3.0 / nd as f64).sqrt()) },
        base: random(seed, &format!("{key}.base"), mix, 0.5),
        scale: random(seed, &format!("{key}.scale"), 3, 0.5).iter().map(|v| 1.0 + v).collect(),
    }
}

/// Random streams `[t, nd]` (key `<key>.x`) with a different magnitude per token (0.25 + 0.5·t): the
/// RMS factor must cancel in the mix logits.
fn scaled_streams(seed: u64, key: &str, t: usize, nd: usize) -> Vec<f32> {
    let mut x = random(seed, &format!("{key}.x"), t * nd, 1.0);
    for (ti, row) in x.chunks_mut(nd).enumerate() {
        let s = 0.25 + 0.5 * ti as f32;
        row.iter_mut().for_each(|v| *v *= s);
    }
    x
}

/// mHC pre / post / head on Flash shapes (spec §4.2, §4.3, §4.12).
fn check_hc(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (t, n, d, iters, eps, hc_eps) = (16usize, 4usize, 4096usize, 20usize, 1e-6f64, 1e-6f64);
    let nd = n * d;
    let fn_scale = (3.0 / nd as f64).sqrt();
    let hw = random_hc(seed, "hc", n, d);
    // Streams with a different magnitude per token (the RMS factor must cancel in the mix logits).
    let mut x = random(seed, "hc.x", t * nd, 1.0);
    for (ti, row) in x.chunks_mut(nd).enumerate() {
        let s = 0.25 + 0.5 * ti as f32;
        row.iter_mut().for_each(|v| *v *= s);
    }
    let mut u_ref = Vec::with_capacity(t * d);
    let mut post_ref = Vec::with_capacity(t * n);
    let mut comb_ref = Vec::with_capacity(t * n * n);
    let mut mixes = Vec::with_capacity(t);
    for xt in x.chunks(nd) {
        let (u, m) = mhc::hc_pre(&hw, xt, n, iters, eps, hc_eps);
        u_ref.extend(u);
        post_ref.extend(m.post.iter().map(|v| *v as f32));
        comb_ref.extend(m.comb.iter().map(|v| *v as f32));
        mixes.push(m);
    }
    let gw = GpuHcWeights::upload(gpu, &hw, n)?;
    let dx = gpu.upload(&x)?;
    let mut du = gpu.zeros::<f32>(t * d)?;
    let mut dpost = gpu.zeros::<f32>(t * n)?;
    let mut dcomb = gpu.zeros::<f32>(t * n * n)?;
    gpu.hc_pre(&gw, &dx, &mut du, &mut dpost, &mut dcomb, t, n, d, iters, eps, hc_eps)?;
    let shape = json!([t, n, d, iters]);
    all &= record(out, "hc_pre u", shape.clone(), &gpu.download(&du)?, &u_ref);
    all &= record(out, "hc_pre post", shape.clone(), &gpu.download(&dpost)?, &post_ref);
    all &= record(out, "hc_pre comb", shape, &gpu.download(&dcomb)?, &comb_ref);
    // Batch invariance: the last 7 tokens alone (a tile of their own) give the bits they got among 16.
    let (t7, skip) = (7usize, t - 7);
    let dx7 = gpu.upload(&x[skip * nd..])?;
    let (mut du7, mut dpost7, mut dcomb7) = (gpu.zeros::<f32>(t7 * d)?, gpu.zeros::<f32>(t7 * n)?, gpu.zeros::<f32>(t7 * n * n)?);
    gpu.hc_pre(&gw, &dx7, &mut du7, &mut dpost7, &mut dcomb7, t7, n, d, iters, eps, hc_eps)?;
    let differ = differing_bits(&gpu.download(&du)?[skip * d..], &gpu.download(&du7)?)
        + differing_bits(&gpu.download(&dpost)?[skip * n..], &gpu.download(&dpost7)?)
        + differing_bits(&gpu.download(&dcomb)?[skip * n * n..], &gpu.download(&dcomb7)?);
    all &= flag_record(out, "hc_pre T=7 bits", json!({"differing_values": differ, "of": t7 * (d + n + n * n), "vs": "the same tokens as the last 7 of 16"}), differ == 0);

    // Post, with the CPU's mixes (as f32 on the device) so that it is checked on its own.
    let y = random(seed, "hc.y", t * d, 1.0);
    let mut x_ref = x.clone();
    for (ti, (xt, m)) in x_ref.chunks_mut(nd).zip(&mixes).enumerate() {
        mhc::hc_post(m, xt, &y[ti * d..(ti + 1) * d], n);
    }
    let mut dx2 = gpu.upload(&x)?;
    let dy = gpu.upload(&y)?;
    let dpost_ref = gpu.upload(&post_ref)?;
    let dcomb_ref = gpu.upload(&comb_ref)?;
    gpu.hc_post(&mut dx2, &dy, &dpost_ref, &dcomb_ref, t, n, d)?;
    all &= record(out, "hc_post", json!([t, n, d]), &gpu.download(&dx2)?, &x_ref);

    all &= check_hc_fused(gpu, seed, out)?;
    all &= check_hc_bf16(gpu, seed, out)?;

    // Head collapse + final RMSNorm (the reference does both).
    let mut cfg = config(d, 16, 4, ScoringFunc::SqrtSoftplus, 10.0);
    cfg.hc_mult = n;
    let mw = ModelWeights {
        config: cfg,
        embed: none(),
        layers: Vec::new(),
        hc_head_fn: Matrix { rows: n, cols: nd, data: random(seed, "hc.head.fn", n * nd, fn_scale) },
        hc_head_base: random(seed, "hc.head.base", n, 0.5),
        hc_head_scale: vec![1.0 + random(seed, "hc.head.scale", 1, 0.5)[0]],
        norm: random(seed, "hc.head.norm", d, 0.25).iter().map(|v| 1.0 + v).collect(),
        head: none(),
    };
    let h_ref: Vec<f32> = x.chunks(nd).flat_map(|xt| head::collapse(&mw, xt)).collect();
    let gh = GpuHcWeights::from_host(gpu, &mw.hc_head_fn.data, &mw.hc_head_base, &mw.hc_head_scale, n)?;
    let mut dh = gpu.zeros::<f32>(t * d)?;
    gpu.hc_head(&gh, &dx, &mut dh, t, n, d, eps, hc_eps)?;
    let dnorm = gpu.upload(&mw.norm)?;
    let mut dhn = gpu.zeros::<f32>(t * d)?;
    gpu.rms_norm(&dh, Some(&dnorm), &mut dhn, t, d, eps as f32)?;
    all &= record(out, "hc_head+norm", json!([t, n, d]), &gpu.download(&dhn)?, &h_ref);
    Ok(all)
}

/// MHC_FUSED (spec §4.2 / §4.3 as hc_post_mix_f32 + hc_pre_norm_f32 compute them), on fresh random
/// inputs for each shape, against the CPU reference (pre + RMSNorm, post) and bit for bit against the
/// unfused kernels where they promise it, with batch invariance at every shape (the last 7 tokens
/// alone; T − 7 is not a multiple of 4, so some token moves between a full warp of four tokens and
/// the last warp of fewer): (n 4, d 4,096, T 16: Flash), (n 3, d 4,100, T 13: the wide finish hc_pre_norm_wide_f32 and
/// a last channel run of 4 channels), (n 1, d 8,192, T 10: the widest hidden size), (n 2, d 1,000,
/// T 9: a narrow row, a last warp of one token). Also: the mix alone
/// leaves the streams as they were, the with- and without-post forms give the same partials for the
/// same streams, and partials made with another Φ are refused.
fn check_hc_fused(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (iters, eps, hc_eps, norm_eps) = (20usize, 1e-6f64, 1e-6f64, 1e-6f32);
    for (n, d, t) in [(4usize, 4096usize, 16usize), (3, 4100, 13), (1, 8192, 10), (2, 1000, 9)] {
        let nd = n * d;
        let key = format!("hcw{n}_{d}");
        let hw = random_hc(seed, &key, n, d);
        let gw = GpuHcWeights::upload(gpu, &hw, n)?;
        let x = scaled_streams(seed, &key, t, nd);
        let y = random(seed, &format!("{key}.y"), t * d, 1.0);
        let nw: Vec<f32> = random(seed, &format!("{key}.norm"), d, 0.25).iter().map(|v| 1.0 + v).collect();
        let (mut a_ref, mut post_ref, mut comb_ref, mut x_ref) = (Vec::new(), Vec::new(), Vec::new(), x.clone());
        for (ti, xt) in x_ref.chunks_mut(nd).enumerate() {
            let (mut u, m) = mhc::hc_pre(&hw, xt, n, iters, eps, hc_eps);
            ops::rms_norm(&mut u, &nw, norm_eps as f64);
            a_ref.extend(u);
            post_ref.extend(m.post.iter().map(|v| *v as f32));
            comb_ref.extend(m.comb.iter().map(|v| *v as f32));
            let mf = mhc::HcMix { post: m.post.iter().map(|v| *v as f32 as f64).collect(), comb: m.comb.iter().map(|v| *v as f32 as f64).collect() };
            mhc::hc_post(&mf, xt, &y[ti * d..(ti + 1) * d], n);
        }
        let shape = json!([t, n, d, iters]);
        let dnw = gpu.upload(&nw)?;
        let mut dx = gpu.upload(&x)?;
        let (mut da, mut dpost, mut dcomb) = (gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?);
        let mix = gpu.hc_post_mix(&mut dx, None, &gw, t, n, d)?;
        let mut coefs = gpu.hc_pre_norm(&gw, &mix, &dx, Some(&dnw), &mut da, &mut dpost, &mut dcomb, t, n, d, iters, eps, hc_eps, norm_eps)?;
        all &= record(out, &format!("hc_pre fused normed u (n {n}, d {d})"), shape.clone(), &gpu.download(&da)?, &a_ref);
        all &= record(out, &format!("hc_pre fused post (n {n}, d {d})"), shape.clone(), &gpu.download(&dpost)?, &post_ref);
        all &= record(out, &format!("hc_pre fused comb (n {n}, d {d})"), shape.clone(), &gpu.download(&dcomb)?, &comb_ref);
        let untouched = differing_bits(&gpu.download(&dx)?, &x);
        all &= flag_record(out, &format!("hc_post_mix without post: x unchanged (n {n}, d {d})"), json!({"differing_values": untouched, "of": t * nd}), untouched == 0);
        if t > 7 {
            // Batch invariance: the last 7 tokens alone give the bits they got among t.
            let (t7, skip) = (7usize, t - 7);
            let mut dx7 = gpu.upload(&x[skip * nd..])?;
            let (mut da7, mut dpost7, mut dcomb7) = (gpu.zeros::<f32>(t7 * d)?, gpu.zeros::<f32>(t7 * n)?, gpu.zeros::<f32>(t7 * n * n)?);
            let mix7 = gpu.hc_post_mix(&mut dx7, None, &gw, t7, n, d)?;
            gpu.hc_pre_norm(&gw, &mix7, &dx7, Some(&dnw), &mut da7, &mut dpost7, &mut dcomb7, t7, n, d, iters, eps, hc_eps, norm_eps)?;
            let differ = differing_bits(&gpu.download(&da)?[skip * d..], &gpu.download(&da7)?)
                + differing_bits(&gpu.download(&dpost)?[skip * n..], &gpu.download(&dpost7)?)
                + differing_bits(&gpu.download(&dcomb)?[skip * n * n..], &gpu.download(&dcomb7)?);
            all &= flag_record(out, &format!("hc_pre fused T=7 bits (n {n}, d {d})"), json!({"differing_values": differ, "of": t7 * (d + n + n * n), "vs": format!("the same tokens as the last 7 of {t}")}), differ == 0);
        }
        if d > 1024 {
            // Gpu::rms_norm runs rms_norm_f32 above 1,024 values a row: the finish's bits on the
            // unfused kernels' own partials.
            let split = gpu.hc_split_partials(&dx, &gw, t, n, d)?;
            coefs = gpu.hc_pre_norm(&gw, &split, &dx, Some(&dnw), &mut da, &mut dpost, &mut dcomb, t, n, d, iters, eps, hc_eps, norm_eps)?;
            let (mut du2, mut dp2, mut dc2, mut da2) = (gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?, gpu.zeros::<f32>(t * d)?);
            gpu.hc_pre(&gw, &dx, &mut du2, &mut dp2, &mut dc2, t, n, d, iters, eps, hc_eps)?;
            gpu.rms_norm(&du2, Some(&dnw), &mut da2, t, d, norm_eps)?;
            let differ = differing_bits(&gpu.download(&da)?, &gpu.download(&da2)?)
                + differing_bits(&gpu.download(&dpost)?, &gpu.download(&dp2)?)
                + differing_bits(&gpu.download(&dcomb)?, &gpu.download(&dc2)?);
            all &= flag_record(out, &format!("hc_pre_norm bits (n {n}, d {d})"), json!({"differing_values": differ, "of": t * (d + n + n * n), "vs": "hc_pre_f32 + rms_norm_f32 on the same partials"}), differ == 0);
        }
        // The post with the device's own post / comb, and its partials against those of its
        // output computed on their own.
        let dy = gpu.upload(&y)?;
        let mut dref = gpu.upload(&x)?;
        gpu.hc_post(&mut dref, &dy, &dpost, &dcomb, t, n, d)?;
        // The records hold post and comb exactly (as built from the f32 values on the host).
        let host_rec = HcPostCoefs::from_f32(gpu, &dpost, &dcomb, t, n)?;
        let rec_bits = coefs.differing_post_comb(gpu, &host_rec)?;
        all &= flag_record(out, &format!("hc_pre_norm post/comb records (n {n}, d {d})"), json!({"differing_values": rec_bits, "of": 2 * t * (n + n * n), "vs": "post and comb as f32, widened and as f32 copies, packed on the host (HcPostCoefs::from_f32)"}), rec_bits == 0);
        let withpost = gpu.hc_post_mix(&mut dx, Some((&dy, &coefs)), &gw, t, n, d)?;
        let got = gpu.download(&dx)?;
        all &= record(out, &format!("hc_post_mix x (n {n}, d {d})"), json!([t, n, d]), &got, &x_ref);
        let bits = differing_bits(&got, &gpu.download(&dref)?);
        all &= flag_record(out, &format!("hc_post_mix_f32 x bits (n {n}, d {d})"), json!({"differing_values": bits, "of": t * nd, "vs": "hc_post_f32"}), bits == 0);
        let alone = gpu.hc_post_mix(&mut dref, None, &gw, t, n, d)?;
        let (mut db, mut dpb, mut dcb) = (gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?);
        gpu.hc_pre_norm(&gw, &withpost, &dx, None, &mut da, &mut dpost, &mut dcomb, t, n, d, iters, eps, hc_eps, norm_eps)?;
        gpu.hc_pre_norm(&gw, &alone, &dref, None, &mut db, &mut dpb, &mut dcb, t, n, d, iters, eps, hc_eps, norm_eps)?;
        let pbits = differing_bits(&gpu.download(&da)?, &gpu.download(&db)?) + differing_bits(&gpu.download(&dcomb)?, &gpu.download(&dcb)?);
        all &= flag_record(out, &format!("hc_post_mix_f32 partials bits (n {n}, d {d})"), json!({"differing_values": pbits, "of": t * (d + n * n), "vs": "the partials of hc_post_f32's output (unweighted normed pre output and comb compared)"}), pbits == 0);
        // Partials made with another Φ of the same shape are refused.
        let other = GpuHcWeights::upload(gpu, &random_hc(seed, &format!("{key}.other"), n, d), n)?;
        let refused = gpu.hc_pre_norm(&other, &alone, &dref, None, &mut db, &mut dpb, &mut dcb, t, n, d, iters, eps, hc_eps, norm_eps).is_err();
        all &= flag_record(out, &format!("hc_pre_norm refuses another Φ's partials (n {n}, d {d})"), json!({"refused": refused}), refused);
    }
    Ok(all)
}

/// MHC_BF16_STREAMS: the bf16-stream pre against its f32 twin fed the same streams widened (bit for
/// bit: every sum over the streams runs over the stored values), the bf16 posts (f32 arithmetic)
/// against their replay on the host (bit for bit) and against the exact f64 post (NMSE), the next
/// pre's partials against the mix alone over the stored output (bit for bit), the fused pre on bf16
/// streams against the CPU reference on the same values, and the embedding gather / widening against
/// the host's rounding,
/// on fresh random inputs: (n 4, d 4,096, T 40: Flash; more than one 16-token tile, so that the
/// last 7 tokens alone take hc_post_mix_tc_bf16's split form and among 40 its tiled one), (n 3, d
/// 4,100, T 13: the wide finish and a last run of 4 channels), (n 1, d 8,192, T 10), (n 2, d 1,000,
/// T 40: the tiled form at n < 4, with a last run of 104 channels).
fn check_hc_bf16(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (iters, eps, hc_eps, norm_eps) = (20usize, 1e-6f64, 1e-6f64, 1e-6f32);
    let widen = |b: &[u16]| -> Vec<f32> { b.iter().map(|v| quant::bf16_to_f32(*v)).collect() };
    let narrow = |f: &[f32]| -> Vec<u16> { f.iter().map(|v| quant::f32_to_bf16(*v)).collect() };
    for (n, d, t) in [(4usize, 4096usize, 40usize), (3, 4100, 13), (1, 8192, 10), (2, 1000, 40)] {
        let nd = n * d;
        let key = format!("hcb{n}_{d}");
        let hw = random_hc(seed, &key, n, d);
        let gw = GpuHcWeights::upload(gpu, &hw, n)?;
        let x = scaled_streams(seed, &key, t, nd);
        let xb = narrow(&x);
        let xw = widen(&xb);
        let y = random(seed, &format!("{key}.y"), t * d, 1.0);
        let nw: Vec<f32> = random(seed, &format!("{key}.norm"), d, 0.25).iter().map(|v| 1.0 + v).collect();
        let dnw = gpu.upload(&nw)?;
        let dy = gpu.upload(&y)?;
        let shape = json!([t, n, d, iters]);
        // The first pre (mix only, then the finish) on bf16 streams and on their widening.
        let (mut dxb, mut dxw) = (gpu.upload(&xb)?, gpu.upload(&xw)?);
        let buffers = || -> Result<_, CudaError> { Ok((gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?)) };
        let ((mut dab, mut dpb, mut dcb), (mut daw, mut dpw, mut dcw)) = (buffers()?, buffers()?);
        let mixb = gpu.hc_post_mix(&mut dxb, None, &gw, t, n, d)?;
        let mixw = gpu.hc_post_mix(&mut dxw, None, &gw, t, n, d)?;
        let coefs = gpu.hc_pre_norm(&gw, &mixb, &dxb, Some(&dnw), &mut dab, &mut dpb, &mut dcb, t, n, d, iters, eps, hc_eps, norm_eps)?;
        gpu.hc_pre_norm(&gw, &mixw, &dxw, Some(&dnw), &mut daw, &mut dpw, &mut dcw, t, n, d, iters, eps, hc_eps, norm_eps)?;
        let (ab, pb, cb) = (gpu.download(&dab)?, gpu.download(&dpb)?, gpu.download(&dcb)?);
        let differ = differing_bits(&ab, &gpu.download(&daw)?) + differing_bits(&pb, &gpu.download(&dpw)?) + differing_bits(&cb, &gpu.download(&dcw)?);
        all &= flag_record(out, &format!("hc_pre_norm_bf16 bits (n {n}, d {d})"), json!({"differing_values": differ, "of": t * (d + n + n * n), "vs": "hc_post_mix_f32 (mix only) + hc_pre_norm_f32 on the bf16 streams widened"}), differ == 0);
        // The CPU reference on the same (rounded) streams.
        let (a_ref, post_ref, comb_ref) = cpu_pre_normed(&hw, &xw, &nw, n, (iters, eps, hc_eps, norm_eps));
        all &= record(out, &format!("hc_pre fused bf16 normed u (n {n}, d {d})"), shape.clone(), &ab, &a_ref);
        all &= record(out, &format!("hc_pre fused bf16 post (n {n}, d {d})"), shape.clone(), &pb, &post_ref);
        all &= record(out, &format!("hc_pre fused bf16 comb (n {n}, d {d})"), shape.clone(), &cb, &comb_ref);
        // The post (with the next pre's partials) on bf16 streams against the f32 kernel on their
        // widening: the stored values are the f32 outputs rounded; the partials are those of the
        // rounded streams (the mix alone over them, through the same finish).
        let withpost = gpu.hc_post_mix(&mut dxb, Some((&dy, &coefs)), &gw, t, n, d)?;
        gpu.hc_post_mix(&mut dxw, Some((&dy, &coefs)), &gw, t, n, d)?;
        let got = gpu.download(&dxb)?;
        let bits = differing_values(&got, &post_bf16_replay(&xb, &y, &pb, &cb, n, d));
        all &= flag_record(out, &format!("hc_post_mix_bf16 x bits (n {n}, d {d})"), json!({"differing_values": bits, "of": t * nd, "vs": "the f32 post (hc_post_f32_expr) replayed on the host, rounded to bf16"}), bits == 0);
        // And against the exact path's post (f64, hc_post_mix_f32) on the same streams: the f32
        // arithmetic and the bf16 rounding.
        all &= record(out, &format!("hc_post_mix_bf16 x vs hc_post_mix_f32 (n {n}, d {d})"), json!([t, n, d]), &widen(&got), &gpu.download(&dxw)?);
        let mut dref = gpu.upload(&widen(&got))?;
        let alone = gpu.hc_post_mix(&mut dref, None, &gw, t, n, d)?;
        gpu.hc_pre_norm(&gw, &withpost, &dxb, None, &mut dab, &mut dpb, &mut dcb, t, n, d, iters, eps, hc_eps, norm_eps)?;
        gpu.hc_pre_norm(&gw, &alone, &dref, None, &mut daw, &mut dpw, &mut dcw, t, n, d, iters, eps, hc_eps, norm_eps)?;
        let pbits = differing_bits(&gpu.download(&dab)?, &gpu.download(&daw)?) + differing_bits(&gpu.download(&dpb)?, &gpu.download(&dpw)?) + differing_bits(&gpu.download(&dcb)?, &gpu.download(&dcw)?);
        all &= flag_record(out, &format!("hc_post_mix_bf16 partials bits (n {n}, d {d})"), json!({"differing_values": pbits, "of": t * (d + n + n * n), "vs": "the partials of its output widened, made by hc_post_mix_f32's mix alone (unweighted normed pre output, post and comb compared)"}), pbits == 0);
        // Batch invariance: the post + next pre of the last 7 tokens alone give the bits they got among t.
        if t > 7 {
            let (t7, skip) = (7usize, t - 7);
            let mut dx7 = gpu.upload(&xb[skip * nd..])?;
            let (mut da7, mut dp7, mut dc7) = (gpu.zeros::<f32>(t7 * d)?, gpu.zeros::<f32>(t7 * n)?, gpu.zeros::<f32>(t7 * n * n)?);
            let mix7 = gpu.hc_post_mix(&mut dx7, None, &gw, t7, n, d)?;
            let coefs7 = gpu.hc_pre_norm(&gw, &mix7, &dx7, Some(&dnw), &mut da7, &mut dp7, &mut dc7, t7, n, d, iters, eps, hc_eps, norm_eps)?;
            let dy7 = gpu.upload(&y[skip * d..])?;
            let next7 = gpu.hc_post_mix(&mut dx7, Some((&dy7, &coefs7)), &gw, t7, n, d)?;
            gpu.hc_pre_norm(&gw, &next7, &dx7, None, &mut da7, &mut dp7, &mut dc7, t7, n, d, iters, eps, hc_eps, norm_eps)?;
            let differ = differing_values(&got[skip * nd..], &gpu.download(&dx7)?) + differing_bits(&gpu.download(&dab)?[skip * d..], &gpu.download(&da7)?) + differing_bits(&gpu.download(&dcb)?[skip * n * n..], &gpu.download(&dc7)?);
            all &= flag_record(out, &format!("hc_post_mix_bf16 T=7 bits (n {n}, d {d})"), json!({"differing_values": differ, "of": t7 * (nd + d + n * n), "vs": format!("the same tokens as the last 7 of {t} (streams after the post, the next pre's normed output and comb)")}), differ == 0);
        }
        // The plain post (the last layer's): the same f32 post as hc_post_mix_bf16.
        let dpost_b = {
            let mut v = gpu.upload(&xb)?;
            gpu.hc_post(&mut v, &dy, &dpb, &dcb, t, n, d)?;
            v
        };
        let pb_bits = differing_values(&gpu.download(&dpost_b)?, &post_bf16_replay(&xb, &y, &gpu.download(&dpb)?, &gpu.download(&dcb)?, n, d));
        all &= flag_record(out, &format!("hc_post_bf16 x bits (n {n}, d {d})"), json!({"differing_values": pb_bits, "of": t * nd, "vs": "the f32 post (hc_post_f32_expr) replayed on the host, rounded to bf16"}), pb_bits == 0);
        // MHC_MIX_TC: the same post with the next pre's mix on tensor cores (d a multiple of 8).
        if d.is_multiple_of(8) {
            all &= check_mix_tc(gpu, &gw, &hw, &xb, &y, &nw, &coefs, &got, t, n, d, out)?;
        } else {
            let refused = gpu.hc_post_mix_tc(&mut gpu.upload(&xb)?, None, &gw, t, n, d).is_err();
            all &= flag_record(out, &format!("hc_post_mix_tc refuses d {d} (not a multiple of 8)"), json!({"refused": refused}), refused);
        }
    }
    // The embedding rows as bf16 (values exact in bf16 and not, one index out of range: a NaN row)
    // and the widening of the streams.
    let (rows, d) = (37usize, 1000usize);
    let mut emb = random(seed, "hcb.embed", rows * d, 1.0);
    emb.iter_mut().step_by(2).for_each(|v| *v = quant::bf16_to_f32(quant::f32_to_bf16(*v)));
    let idx: Vec<i32> = (0..12).map(|i| if i == 5 { rows as i32 } else { (i * 7 % rows) as i32 }).collect();
    let (demb, didx) = (gpu.upload(&emb)?, gpu.upload(&idx)?);
    let mut dg = gpu.zeros::<u16>(idx.len() * d)?;
    gpu.hc_gather_bf16(&demb, rows, &didx.slice(0..idx.len()), &mut dg, d)?;
    let want: Vec<u16> = idx.iter().flat_map(|&r| if (0..rows as i32).contains(&r) { narrow(&emb[r as usize * d..(r as usize + 1) * d]) } else { vec![0x7fc0; d] }).collect();
    let gbits = differing_values(&gpu.download(&dg)?, &want);
    all &= flag_record(out, "hc_gather_bf16 bits", json!({"differing_values": gbits, "of": idx.len() * d, "vs": "the host's round-to-nearest-even of the gathered rows (a NaN row for an index past the table)"}), gbits == 0);
    let mut dw = gpu.zeros::<f32>(idx.len() * d)?;
    gpu.hc_widen_bf16(&dg.slice(0..idx.len() * d), &mut dw)?;
    let wbits = differing_bits(&gpu.download(&dw)?, &widen(&want));
    all &= flag_record(out, "hc_widen_bf16 bits", json!({"differing_values": wbits, "of": idx.len() * d, "vs": "the host's widening"}), wbits == 0);
    Ok(all)
}

/// The CPU reference pre of every token of `xw` (`[t, n·d]` f32) followed by the RMSNorm with weight
/// `nw`, given (Sinkhorn iterations, the RMS eps, hc_eps, the norm's eps): (normed u `[t, d]`, post
/// `[t, n]`, comb `[t, n, n]`).
fn cpu_pre_normed(hw: &HcWeights, xw: &[f32], nw: &[f32], n: usize, (iters, eps, hc_eps, norm_eps): (usize, f64, f64, f32)) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut a, mut post, mut comb) = (Vec::new(), Vec::new(), Vec::new());
    for xt in xw.chunks(n * nw.len()) {
        let (mut u, m) = mhc::hc_pre(hw, xt, n, iters, eps, hc_eps);
        ops::rms_norm(&mut u, nw, norm_eps as f64);
        a.extend(u);
        post.extend(m.post.iter().map(|v| *v as f32));
        comb.extend(m.comb.iter().map(|v| *v as f32));
    }
    (a, post, comb)
}

/// NMSE bound of the pre after hc_post_mix_tc's partials (`MHC_MIX_TC`) against the CPU on the same
/// streams and against the pre after the CUDA-core partials: both mixes are f32-accurate sums (NMSE
/// ~1e-14 measured for the CUDA-core one), a fragment-layout error gives O(1).
const MIX_TC_TOL: f64 = 1e-10;

/// MHC_MIX_TC on one shape (d a multiple of 8; `xb` the bf16 streams `[t, n, d]`, `y` the sub-block
/// output, `coefs` the coefficients hc_post_mix_bf16 posted `xpost` with): hc_post_mix_tc's stored
/// streams against `xpost` bit for bit; the pre after its partials (normed u, post, comb) — the first
/// pre (mix only) and the next one (after its own post) — against the CPU on the same streams and
/// the first against the pre after the CUDA-core partials, by NMSE ([`MIX_TC_TOL`]); batch
/// invariance (the last 7 tokens alone give the bits they got among t).
#[allow(clippy::too_many_arguments)]
fn check_mix_tc(gpu: &Gpu, gw: &GpuHcWeights, hw: &HcWeights, xb: &[u16], y: &[f32], nw: &[f32], coefs: &HcPostCoefs, xpost: &[u16], t: usize, n: usize, d: usize, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (iters, eps, hc_eps, norm_eps) = (20usize, 1e-6f64, 1e-6f64, 1e-6f32);
    let nd = n * d;
    let widen = |b: &[u16]| -> Vec<f32> { b.iter().map(|v| quant::bf16_to_f32(*v)).collect() };
    let dnw = gpu.upload(nw)?;
    // The streams hc_post_mix_bf16 wrote, with the same coefficients.
    let mut dxq = gpu.upload(xb)?;
    gpu.hc_post_mix_tc(&mut dxq, Some((&gpu.upload(y)?, coefs)), gw, t, n, d)?;
    let bits = differing_values(&gpu.download(&dxq)?, xpost);
    all &= flag_record(out, &format!("hc_post_mix_tc x bits (n {n}, d {d})"), json!({"differing_values": bits, "of": t * nd, "vs": "hc_post_mix_bf16's streams (the same post)"}), bits == 0);
    // A forward's first pre (mix only) and the next one after the post, on tokens `skip..t`:
    // (first normed u, post, comb; streams after the post; next normed u, post, comb).
    type Pre = (Vec<f32>, Vec<f32>, Vec<f32>);
    let chain = |skip: usize| -> Result<(Pre, Vec<u16>, Pre), CudaError> {
        let tt = t - skip;
        let mut dx = gpu.upload(&xb[skip * nd..])?;
        let dy = gpu.upload(&y[skip * d..])?;
        let (mut da, mut dp, mut dc) = (gpu.zeros::<f32>(tt * d)?, gpu.zeros::<f32>(tt * n)?, gpu.zeros::<f32>(tt * n * n)?);
        let first = gpu.hc_post_mix_tc(&mut dx, None, gw, tt, n, d)?;
        let cf = gpu.hc_pre_norm(gw, &first, &dx, Some(&dnw), &mut da, &mut dp, &mut dc, tt, n, d, iters, eps, hc_eps, norm_eps)?;
        let pre1 = (gpu.download(&da)?, gpu.download(&dp)?, gpu.download(&dc)?);
        let next = gpu.hc_post_mix_tc(&mut dx, Some((&dy, &cf)), gw, tt, n, d)?;
        gpu.hc_pre_norm(gw, &next, &dx, Some(&dnw), &mut da, &mut dp, &mut dc, tt, n, d, iters, eps, hc_eps, norm_eps)?;
        Ok((pre1, gpu.download(&dx)?, (gpu.download(&da)?, gpu.download(&dp)?, gpu.download(&dc)?)))
    };
    let ((a1, p1, c1), xs, (a2, p2, c2)) = chain(0)?;
    let shape = json!([t, n, d, iters]);
    let (ra, rp, rc) = cpu_pre_normed(hw, &widen(xb), nw, n, (iters, eps, hc_eps, norm_eps));
    all &= record_tol(out, &format!("hc_pre fused bf16 tc normed u (n {n}, d {d})"), shape.clone(), &a1, &ra, MIX_TC_TOL);
    all &= record_tol(out, &format!("hc_pre fused bf16 tc post (n {n}, d {d})"), shape.clone(), &p1, &rp, MIX_TC_TOL);
    all &= record_tol(out, &format!("hc_pre fused bf16 tc comb (n {n}, d {d})"), shape.clone(), &c1, &rc, MIX_TC_TOL);
    let (ra, rp, rc) = cpu_pre_normed(hw, &widen(&xs), nw, n, (iters, eps, hc_eps, norm_eps));
    all &= record_tol(out, &format!("hc_post_mix_tc next pre normed u (n {n}, d {d})"), shape.clone(), &a2, &ra, MIX_TC_TOL);
    all &= record_tol(out, &format!("hc_post_mix_tc next pre post (n {n}, d {d})"), shape.clone(), &p2, &rp, MIX_TC_TOL);
    all &= record_tol(out, &format!("hc_post_mix_tc next pre comb (n {n}, d {d})"), shape.clone(), &c2, &rc, MIX_TC_TOL);
    // Against the CUDA-core mix's pre on the same streams.
    let mut dxf = gpu.upload(xb)?;
    let (mut da, mut dp, mut dc) = (gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?);
    let mixf = gpu.hc_post_mix(&mut dxf, None, gw, t, n, d)?;
    gpu.hc_pre_norm(gw, &mixf, &dxf, Some(&dnw), &mut da, &mut dp, &mut dc, t, n, d, iters, eps, hc_eps, norm_eps)?;
    let f = [gpu.download(&da)?, gpu.download(&dp)?, gpu.download(&dc)?].concat();
    all &= record_tol(out, &format!("hc_post_mix_tc pre vs the CUDA-core mix (n {n}, d {d})"), shape, &[a1.as_slice(), &p1, &c1].concat(), &f, MIX_TC_TOL);
    // Batch invariance.
    if t > 7 {
        let skip = t - 7;
        let ((b1, _, e1), xs7, (b2, _, e2)) = chain(skip)?;
        let differ = differing_values(&xs[skip * nd..], &xs7)
            + differing_bits(&a1[skip * d..], &b1)
            + differing_bits(&c1[skip * n * n..], &e1)
            + differing_bits(&a2[skip * d..], &b2)
            + differing_bits(&c2[skip * n * n..], &e2);
        all &= flag_record(out, &format!("hc_post_mix_tc T=7 bits (n {n}, d {d})"), json!({"differing_values": differ, "of": 7 * (nd + 2 * d + 2 * n * n), "vs": format!("the same tokens as the last 7 of {t} (both pres' normed outputs and comb, the streams after the post)")}), differ == 0);
    }
    Ok(all)
}

/// The bf16 streams' post (`MHC_BF16_STREAMS`, mhc.cu `hc_post_f32_expr`) replayed on the host: for
/// each token t, stream k and channel i, `post[t,k]·y[t,i]`, then `mul_add(C[t][j][k], x[t,j,i], ·)`
/// for j = 0 … n − 1 in f32, rounded to bf16 (nearest even). `xb` `[t, n, d]` bf16 bits, `y` `[t, d]`,
/// `post` `[t, n]`, `comb` `[t, n, n]` f32.
fn post_bf16_replay(xb: &[u16], y: &[f32], post: &[f32], comb: &[f32], n: usize, d: usize) -> Vec<u16> {
    let mut out = xb.to_vec();
    for (ti, xt) in xb.chunks(n * d).enumerate() {
        for i in 0..d {
            for k in 0..n {
                let mut s = post[ti * n + k] * y[ti * d + i];
                for j in 0..n {
                    s = comb[ti * n * n + j * n + k].mul_add(quant::bf16_to_f32(xt[j * d + i]), s);
                }
                out[(ti * n + k) * d + i] = quant::f32_to_bf16(s);
            }
        }
    }
    out
}

/// The router on Flash shapes (E 256, top-6), score (sqrt-softplus and sigmoid) and hash layers.
fn check_router(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (t, d, e, k, vocab) = (16usize, 4096usize, 256usize, 6usize, 1000usize);
    let gate = Matrix { rows: e, cols: d, data: random(seed, "router.gate", e * d, (3.0 / d as f64).sqrt()) };
    let mut f = random(seed, "router.f", t * d, 1.7);
    // Token 0 has all-zero logits: equal scores, so selection is decided by the bias and its ties.
    f[..d].iter_mut().for_each(|v| *v = 0.0);
    // A coarse bias (nine levels) so that ties of score + bias really occur and go to the lower index.
    let bias: Vec<f32> = random(seed, "router.bias", e, 1.0).iter().map(|v| (v * 4.0).round() / 40.0).collect();
    let tid2eid: Vec<u32> = formula_tid2eid(seed, "router.tid2eid", vocab, k, e).iter().map(|v| *v as u32).collect();
    let ids = formula_ids(seed, t, vocab);
    // Both sides route the same logits (the CPU's), so ids must agree exactly.
    let logits = ops::linear(&f, &gate);
    let dlogits = gpu.upload(&logits)?;
    let dids = gpu.upload(&ids.iter().map(|v| *v as i32).collect::<Vec<_>>())?;
    let cases: [(&str, ScoringFunc, bool); 3] = [("router score", ScoringFunc::SqrtSoftplus, false), ("router hash", ScoringFunc::SqrtSoftplus, true), ("router score sigmoid", ScoringFunc::Sigmoid, false)];
    for (name, scoring, hash) in cases {
        let cfg = config(d, e, k, scoring, 10.0);
        let (rw, grouter) = if hash {
            let table: Vec<i32> = tid2eid.iter().map(|v| *v as i32).collect();
            (RouterWeights::Hash { tid2eid: tid2eid.clone() }, GpuRouter::Hash { tid2eid: gpu.upload(&table)?, vocab })
        } else {
            (RouterWeights::Score { bias: bias.clone() }, GpuRouter::Score { bias: gpu.upload(&bias)? })
        };
        let lw = moe_layer(gate.clone(), rw, ExpertWeights { w1: none(), w2: none(), w3: none() }, Vec::new());
        let routes = moe::route(&cfg, &lw, &f, &ids);
        let mut dexp = gpu.zeros::<i32>(t * k)?;
        let mut dw = gpu.zeros::<f32>(t * k)?;
        gpu.router(&dlogits, &grouter, &dids, &mut dexp, &mut dw, t, e, k, scoring, cfg.routed_scaling_factor)?;
        let ref_ids: Vec<usize> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
        let ref_w: Vec<f32> = routes.iter().flat_map(|r| r.weights.iter().map(|v| *v as f32)).collect();
        let shape = json!([t, e, k]);
        all &= record_ids(out, &format!("{name} ids"), shape.clone(), &gpu.download(&dexp)?, &ref_ids);
        all &= record(out, &format!("{name} weights"), shape, &gpu.download(&dw)?, &ref_w);
    }
    Ok(all)
}

/// Clamped SwiGLU at Flash's limit 10 with inputs well past it on both sides (spec §4.11).
fn check_swiglu(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let (rows, inter, limit) = (7usize, 2048usize, 10.0f64);
    let g = random(seed, "swiglu.g", rows * inter, 20.0);
    let u = random(seed, "swiglu.u", rows * inter, 20.0);
    let h_ref: Vec<f32> = g.iter().zip(&u).map(|(g, u)| (ops::silu((*g as f64).min(limit)) * (*u as f64).clamp(-limit, limit)) as f32).collect();
    let (dg, du) = (gpu.upload(&g)?, gpu.upload(&u)?);
    let mut dh = gpu.zeros::<f32>(rows * inter)?;
    gpu.swiglu(&dg, &du, &mut dh, rows * inter, limit as f32)?;
    Ok(record(out, "swiglu", json!([rows, inter, limit]), &gpu.download(&dh)?, &h_ref))
}

/// moe_combine_f32 bit for bit against its sum replayed on the host (`acc = γ.mul_add(v, acc)` in f64
/// per slot in order, + shared, rounded to f32; each γ·v is exact in f64, so this pins the order and
/// the rounding of the sum): k 6 with unrouted slots (experts −1 and E, their values NaN, so a slot
/// counted instead of zeroed would show) at d 4,096 (four channels per thread) with γ and the shared
/// expert and without either; k 10 (more slots than the kernel loads at once) at d 4,100 (a last
/// block of one thread's four channels) without expert ids (every slot counts); k 10 at d 4,104 with
/// them (the bf16 form's eight channels per thread over two slot batches, a last block of one
/// thread); d 1,030 (one channel per thread). And moe_combine_bf16 (`MOE_DOWN_BF16_OUT`) on the same slots rounded to bf16 against
/// the same replay over their exact widening.
fn check_moe_combine(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    let (t, e) = (9usize, 16usize);
    for (k, d, with_w, with_shared, with_ids) in [(6usize, 4096usize, true, true, true), (6, 4096, false, false, true), (10, 4100, true, true, false), (10, 4104, true, true, true), (6, 1030, true, true, true)] {
        let key = format!("combine.{k}.{d}.{with_w}");
        let mut slot = random(seed, &format!("{key}.slot"), t * k * d, 2.0);
        let w = random(seed, &format!("{key}.w"), t * k, 0.5);
        let sh = random(seed, &format!("{key}.shared"), t * d, 1.0);
        // With ids: every third slot of every other token unrouted (−1 or E), its values NaN.
        let experts: Vec<i32> = (0..t * k).map(|i| if with_ids && (i / k) % 2 == 1 && i % 3 == 0 { if i % 2 == 0 { -1 } else { e as i32 } } else { (i % e) as i32 }).collect();
        for (i, x) in experts.iter().enumerate() {
            if *x < 0 || *x >= e as i32 {
                slot[i * d..(i + 1) * d].iter_mut().for_each(|v| *v = f32::NAN);
            }
        }
        // The f64 fma sum replayed on the host over slot values `sv`.
        let replay = |sv: &[f32]| {
            let mut want = vec![0f32; t * d];
            for ti in 0..t {
                for i in 0..d {
                    let mut acc = 0f64;
                    for s in 0..k {
                        let ts = ti * k + s;
                        let g = if with_w { w[ts] as f64 } else { 1.0 };
                        let routed = experts[ts] >= 0 && experts[ts] < e as i32;
                        acc = g.mul_add(if routed { sv[ts * d + i] as f64 } else { 0.0 }, acc);
                    }
                    if with_shared {
                        acc += sh[ti * d + i] as f64;
                    }
                    want[ti * d + i] = acc as f32;
                }
            }
            want
        };
        let (ds, dw, dx, dsh) = (gpu.upload(&slot)?, gpu.upload(&w)?, gpu.upload(&experts)?, gpu.upload(&sh)?);
        let mut dout = gpu.zeros::<f32>(t * d)?;
        gpu.moe_combine(&ds, with_w.then_some(&dw), with_ids.then_some((&dx, e)), with_shared.then_some(&dsh), &mut dout, t, k, d)?;
        let differ = differing_bits(&gpu.download(&dout)?, &replay(&slot));
        let what = format!("k {k}, d {d}{}{}{}", if with_w { ", γ" } else { "" }, if with_shared { ", shared" } else { "" }, if with_ids { ", unrouted slots" } else { "" });
        all &= flag_record(out, &format!("moe_combine bits ({what})"), json!({"differing_values": differ, "of": t * d, "vs": "the f64 fma sum replayed on the host"}), differ == 0);
        // moe_combine_bf16 (MOE_DOWN_BF16_OUT): the slots rounded to bf16, against the replay over
        // their exact widening.
        let bits: Vec<u16> = slot.iter().map(|v| quant::f32_to_bf16(*v)).collect();
        let widened: Vec<f32> = bits.iter().map(|b| quant::bf16_to_f32(*b)).collect();
        let db = gpu.upload(&bits)?;
        let mut dout = gpu.zeros::<f32>(t * d)?;
        gpu.moe_combine_bf16(&db, with_w.then_some(&dw), with_ids.then_some((&dx, e)), with_shared.then_some(&dsh), &mut dout, t, k, d)?;
        let differ = differing_bits(&gpu.download(&dout)?, &replay(&widened));
        all &= flag_record(out, &format!("moe_combine_bf16 bits ({what})"), json!({"differing_values": differ, "of": t * d, "vs": "the f64 fma sum replayed on the host over the widened bf16 slots"}), differ == 0);
    }
    Ok(all)
}

/// Quantizes `vals` (`[rows, cols]`) to `fmt` ("fp4": e2m1 with ue8m0 per 32; "fp8": e4m3 with ue8m0
/// per 128×128); returns the device weight and the CPU-side dequantized matrix.
fn quantized(gpu: &Gpu, fmt: &str, vals: &[f32], rows: usize, cols: usize) -> Result<(GpuWeight, Matrix), CudaError> {
    let q = |e: quant::QuantError| CudaError::Unsupported { what: "quantize", detail: e.to_string() };
    let (data, deq) = if fmt == "fp4" {
        let (w, s) = quant::quantize_fp4_grouped(vals, rows, cols, 32).map_err(q)?;
        let deq = quant::dequant_fp4_grouped(&w, rows, cols, &s, 32).map_err(q)?;
        (GpuMatrix::Fp4 { w: gpu.upload(&w)?, scales: gpu.upload(&s)?, fold: super::ops_q8::fp4_fold_exact(&s, cols) }, deq)
    } else {
        let (w, s) = quant::quantize_fp8_blocked(vals, rows, cols, 128).map_err(q)?;
        let deq = quant::dequant_fp8_blocked(&w, rows, cols, quant::BlockScales::Ue8m0(&s), 128).map_err(q)?;
        (GpuMatrix::Fp8 { w: gpu.upload(&w)?, scales: gpu.upload(&s)? }, deq)
    };
    Ok((GpuWeight { rows, cols, data }, Matrix { rows, cols, data: deq }))
}

/// A random SwiGLU expert `[inter, d]` / `[d, inter]` in `fmt`, on both sides.
fn expert(gpu: &Gpu, seed: u64, key: &str, fmt: &str, d: usize, inter: usize) -> Result<(GpuExpert, ExpertWeights), CudaError> {
    let (w1, c1) = quantized(gpu, fmt, &random(seed, &format!("{key}.w1"), inter * d, (3.0 / d as f64).sqrt()), inter, d)?;
    let (w2, c2) = quantized(gpu, fmt, &random(seed, &format!("{key}.w2"), d * inter, (3.0 / inter as f64).sqrt()), d, inter)?;
    let (w3, c3) = quantized(gpu, fmt, &random(seed, &format!("{key}.w3"), inter * d, (3.0 / d as f64).sqrt()), inter, d)?;
    Ok((GpuExpert { w1, w2, w3 }, ExpertWeights { w1: c1, w2: c2, w3: c3 }))
}

/// A whole MoE layer (spec §4.11) through [`Gpu::moe_forward`] vs `moe::route` + `moe::moe`.
fn check_moe_layer(gpu: &Gpu, seed: u64, out: &mut Vec<Value>) -> Result<bool, CudaError> {
    let mut all = true;
    // SwiGLU limit 1 (not Flash's 10) so that both clamps are active at these activation sizes.
    let (t, d, inter, e, k, vocab, limit) = (9usize, 1024usize, 512usize, 16usize, 6usize, 500usize, 1.0f64);
    let f = random(seed, "moe.f", t * d, 2.0);
    let ids = formula_ids(seed ^ 0x5eed, t, vocab);
    let gate_vals = random(seed, "moe.gate", e * d, (3.0 / d as f64).sqrt());
    let bias = random(seed, "moe.bias", e, 0.1);
    let tid2eid: Vec<u32> = formula_tid2eid(seed, "moe.tid2eid", vocab, k, e).iter().map(|v| *v as u32).collect();
    let mut g_experts = Vec::with_capacity(e);
    let mut c_experts = Vec::with_capacity(e);
    for x in 0..e {
        let (g, c) = expert(gpu, seed, &format!("moe.expert{x}"), "fp4", d, inter)?;
        g_experts.push(g);
        c_experts.push(c);
    }
    let (g_shared, c_shared) = expert(gpu, seed, "moe.shared", "fp8", d, inter)?;
    let cfg = config(d, e, k, ScoringFunc::SqrtSoftplus, limit);
    let gate = Matrix { rows: e, cols: d, data: gate_vals };
    let mut layer = GpuMoeLayer {
        gate: GpuWeight { rows: e, cols: d, data: GpuMatrix::F32(gpu.upload(&gate.data)?) },
        router: GpuRouter::Score { bias: gpu.upload(&bias)? },
        shared: g_shared,
        experts: g_experts,
        tables: std::sync::OnceLock::new(),
    };
    let mut lw = moe_layer(gate, RouterWeights::Score { bias }, c_shared, c_experts);
    let df = gpu.upload(&f)?;
    let dids = gpu.upload(&ids.iter().map(|v| *v as i32).collect::<Vec<_>>())?;
    for hash in [false, true] {
        if hash {
            let table: Vec<i32> = tid2eid.iter().map(|v| *v as i32).collect();
            layer.router = GpuRouter::Hash { tid2eid: gpu.upload(&table)?, vocab };
            lw.router = RouterWeights::Hash { tid2eid: tid2eid.clone() };
        }
        let name = if hash { "moe_forward hash" } else { "moe_forward score" };
        let routes = moe::route(&cfg, &lw, &f, &ids);
        let y_ref = moe::moe(&cfg, &lw, &f, &routes, &Numerics::default());
        let got = gpu.moe_forward(&cfg, &layer, &df, &dids, t)?;
        let ref_ids: Vec<usize> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
        let ref_w: Vec<f32> = routes.iter().flat_map(|r| r.weights.iter().map(|v| *v as f32)).collect();
        let shape = json!([t, d, inter, e, k]);
        all &= record_ids(out, &format!("{name} ids"), shape.clone(), &gpu.download(&got.experts)?, &ref_ids);
        all &= record(out, &format!("{name} weights"), shape.clone(), &gpu.download(&got.weights)?, &ref_w);
        all &= record(out, name, shape, &gpu.download(&got.out)?, &y_ref);
    }
    Ok(all)
}

/// Timings of the mHC kernels and the row norms at a Flash prefill chunk (T tokens, n 4, d 4,096):
/// `hc_pre` (partial pass + finish), `hc_post`, the hidden-size RMSNorm and the fused per-head q
/// norm + RoPE (64 heads × 512), each with the bytes it must move and the fraction of 4.2 TB/s.
pub fn timings(gpu: &Gpu, seed: u64, repeats: usize, t: usize) -> Result<Vec<Value>, CudaError> {
    let (n, d, iters, eps) = (4usize, 4096usize, 20usize, 1e-6f64);
    let nd = n * d;
    let hw = random_hc(seed, "hct", n, d);
    let gw = GpuHcWeights::upload(gpu, &hw, n)?;
    let mut dx = gpu.upload(&random(seed, "hct.x", t * nd, 1.0))?;
    let (mut du, mut dpost, mut dcomb) = (gpu.zeros::<f32>(t * d)?, gpu.zeros::<f32>(t * n)?, gpu.zeros::<f32>(t * n * n)?);
    let mut rows = Vec::new();
    let report = |rows: &mut Vec<Value>, op: &str, ms: f64, bytes: f64| {
        let gbps = bytes / (ms * 1e-3) / 1e9;
        println!("time {op:<28} T={t} {ms:.3} ms  {gbps:.0} GB/s  ({:.0}% of 4.2 TB/s)", 100.0 * gbps / 4200.0);
        rows.push(json!({"op": op, "tokens": t, "median_ms": ms, "bytes": bytes, "gb_per_s": gbps, "fraction_of_4_2_tb_s": gbps / 4200.0}));
    };
    // A decode-size (T = 1) timing row; `l2_warm`: Φ stays in L2 between the repeats (unlike a
    // real decode step).
    let report_t1 = |rows: &mut Vec<Value>, op: &str, ms1: f64, l2_warm: bool| {
        println!("time {op:<28} T=1 {:.1} us{}", ms1 * 1e3, if l2_warm { " (Φ L2-warm)" } else { "" });
        let mut row = json!({"op": op, "tokens": 1, "median_ms": ms1});
        if l2_warm {
            row["note"] = json!("Φ L2-warm between repeats");
        }
        rows.push(row);
    };
    let f4 = 4.0 * t as f64;
    // pre: x read by the partial pass and again by the finish, u written.
    let ms = median_ms(gpu, repeats, || gpu.hc_pre(&gw, &dx, &mut du, &mut dpost, &mut dcomb, t, n, d, iters, eps, 1e-6))?;
    report(&mut rows, "hc_pre (n 4, d 4096)", ms, f4 * (2.0 * nd as f64 + d as f64));
    // Decode size (one token; Φ stays in L2 between the repeats, unlike a real decode step).
    let ms1 = median_ms(gpu, repeats, || gpu.hc_pre(&gw, &dx, &mut du, &mut dpost, &mut dcomb, 1, n, d, iters, eps, 1e-6))?;
    report_t1(&mut rows, "hc_pre (n 4, d 4096)", ms1, true);
    // post: x read and written, y read.
    let dy = gpu.upload(&random(seed, "hct.y", t * d, 1.0))?;
    let ms = median_ms(gpu, repeats, || gpu.hc_post(&mut dx, &dy, &dpost, &dcomb, t, n, d))?;
    report(&mut rows, "hc_post (n 4, d 4096)", ms, f4 * (2.0 * nd as f64 + d as f64));
    let dw = gpu.upload(&vec![1.0f32; d])?;
    let mut dn = gpu.zeros::<f32>(t * d)?;
    let ms = median_ms(gpu, repeats, || gpu.rms_norm(&du, Some(&dw), &mut dn, t, d, 1e-6))?;
    report(&mut rows, "rms_norm (4096)", ms, f4 * 2.0 * d as f64);
    // MHC_FUSED: the post that also computes the next pre's partials (x read and written, y read,
    // 25 partials per 64 channels written), and the finish that norms u (x read, partials read,
    // the normed u written). Together they replace hc_post + hc_pre + rms_norm.
    let parts = (d.div_ceil(64) * 25) as f64;
    let coefs = HcPostCoefs::from_f32(gpu, &dpost, &dcomb, t, n)?;
    let ms = median_ms(gpu, repeats, || gpu.hc_post_mix(&mut dx, Some((&dy, &coefs)), &gw, t, n, d).map(|_| ()))?;
    report(&mut rows, "hc_post_mix (n 4, d 4096)", ms, f4 * (2.0 * nd as f64 + d as f64 + parts));
    let ms1 = median_ms(gpu, repeats, || gpu.hc_post_mix(&mut dx, Some((&dy, &coefs)), &gw, 1, n, d).map(|_| ()))?;
    report_t1(&mut rows, "hc_post_mix (n 4, d 4096)", ms1, true);
    let ms = median_ms(gpu, repeats, || gpu.hc_post_mix(&mut dx, None, &gw, t, n, d).map(|_| ()))?;
    report(&mut rows, "hc_post_mix, mix only", ms, f4 * (nd as f64 + parts));
    let mix = gpu.hc_post_mix(&mut dx, None, &gw, t, n, d)?;
    let ms = median_ms(gpu, repeats, || gpu.hc_pre_norm(&gw, &mix, &dx, Some(&dw), &mut dn, &mut dpost, &mut dcomb, t, n, d, iters, eps, 1e-6, 1e-6).map(|_| ()))?;
    report(&mut rows, "hc_pre_norm (n 4, d 4096)", ms, f4 * (nd as f64 + d as f64 + parts));
    let ms1 = median_ms(gpu, repeats, || gpu.hc_pre_norm(&gw, &mix, &dx, Some(&dw), &mut dn, &mut dpost, &mut dcomb, 1, n, d, iters, eps, 1e-6, 1e-6).map(|_| ()))?;
    report_t1(&mut rows, "hc_pre_norm (n 4, d 4096)", ms1, false);
    // MHC_BF16_STREAMS: the same two kernels on bf16 streams (2 bytes per stream value).
    let mut dxb = gpu.upload(&gpu.download(&dx)?.iter().map(|v| quant::f32_to_bf16(*v)).collect::<Vec<u16>>())?;
    let ms = median_ms(gpu, repeats, || gpu.hc_post_mix(&mut dxb, Some((&dy, &coefs)), &gw, t, n, d).map(|_| ()))?;
    report(&mut rows, "hc_post_mix bf16 streams", ms, f4 * (nd as f64 + d as f64 + parts));
    let ms1 = median_ms(gpu, repeats, || gpu.hc_post_mix(&mut dxb, Some((&dy, &coefs)), &gw, 1, n, d).map(|_| ()))?;
    report_t1(&mut rows, "hc_post_mix bf16 streams", ms1, true);
    let mixb = gpu.hc_post_mix(&mut dxb, None, &gw, t, n, d)?;
    let ms = median_ms(gpu, repeats, || gpu.hc_pre_norm(&gw, &mixb, &dxb, Some(&dw), &mut dn, &mut dpost, &mut dcomb, t, n, d, iters, eps, 1e-6, 1e-6).map(|_| ()))?;
    report(&mut rows, "hc_pre_norm bf16 streams", ms, f4 * (nd as f64 / 2.0 + d as f64 + parts));
    let ms1 = median_ms(gpu, repeats, || gpu.hc_pre_norm(&gw, &mixb, &dxb, Some(&dw), &mut dn, &mut dpost, &mut dcomb, 1, n, d, iters, eps, 1e-6, 1e-6).map(|_| ()))?;
    report_t1(&mut rows, "hc_pre_norm bf16 streams", ms1, false);
    // MHC_MIX_TC: the bf16 post with the mix on tensor cores (partials per 128 channels).
    let parts_tc = (d.div_ceil(128) * 25) as f64;
    let ms = median_ms(gpu, repeats, || gpu.hc_post_mix_tc(&mut dxb, Some((&dy, &coefs)), &gw, t, n, d).map(|_| ()))?;
    report(&mut rows, "hc_post_mix_tc bf16 streams", ms, f4 * (nd as f64 + d as f64 + parts_tc));
    let ms1 = median_ms(gpu, repeats, || gpu.hc_post_mix_tc(&mut dxb, Some((&dy, &coefs)), &gw, 1, n, d).map(|_| ()))?;
    report_t1(&mut rows, "hc_post_mix_tc bf16 streams", ms1, true);
    let mixt = gpu.hc_post_mix_tc(&mut dxb, None, &gw, t, n, d)?;
    let ms = median_ms(gpu, repeats, || gpu.hc_pre_norm(&gw, &mixt, &dxb, Some(&dw), &mut dn, &mut dpost, &mut dcomb, t, n, d, iters, eps, 1e-6, 1e-6).map(|_| ()))?;
    report(&mut rows, "hc_pre_norm bf16 after tc mix", ms, f4 * (nd as f64 / 2.0 + d as f64 + parts_tc));
    drop((dx, dxb, dn));
    // The MoE combine of a Flash layer: k 6 routed outputs and the shared expert per token.
    let k = 6usize;
    let slot = random(seed, "hct.slot", t * k * d, 1.0);
    let dslot = gpu.upload(&slot)?;
    let dwk = gpu.upload(&random(seed, "hct.gamma", t * k, 0.5))?;
    let dexp = gpu.upload(&(0..t * k).map(|i| (i % 256) as i32).collect::<Vec<_>>())?;
    let dsh = gpu.upload(&random(seed, "hct.shared", t * d, 1.0))?;
    let mut dco = gpu.zeros::<f32>(t * d)?;
    let ms = median_ms(gpu, repeats, || gpu.moe_combine(&dslot, Some(&dwk), Some((&dexp, 256)), Some(&dsh), &mut dco, t, k, d))?;
    report(&mut rows, "moe_combine (k 6, d 4096)", ms, f4 * ((k + 2) * d) as f64);
    // MOE_DOWN_BF16_OUT's combine on the same slots as bf16 (2 bytes a slot value).
    drop(dslot);
    let dslot_b = gpu.upload(&slot.iter().map(|v| flashseek_model::quant::f32_to_bf16(*v)).collect::<Vec<u16>>())?;
    drop(slot);
    let ms = median_ms(gpu, repeats, || gpu.moe_combine_bf16(&dslot_b, Some(&dwk), Some((&dexp, 256)), Some(&dsh), &mut dco, t, k, d))?;
    report(&mut rows, "moe_combine_bf16 (k 6, d 4096)", ms, (t * d) as f64 * (2.0 * k as f64 + 8.0));
    drop((dslot_b, dsh, dco));
    let (heads, hd) = (64usize, 512usize);
    let rope = super::check_attention::flash_compress_rope();
    let inv = gpu.upload(rope.inv_freq())?;
    let dq = gpu.upload(&random(seed, "hct.q", t * heads * hd, 1.0))?;
    let mut dqn = gpu.zeros::<f32>(t * heads * hd)?;
    let ms = median_ms(gpu, repeats, || gpu.rms_norm_rope(&dq, None, &mut dqn, t, heads, hd, 1e-6, &inv, &rope, 4096))?;
    report(&mut rows, "rms_norm+rope (64 × 512)", ms, f4 * 2.0 * (heads * hd) as f64);
    Ok(rows)
}
