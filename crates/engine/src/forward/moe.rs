//! Mixture of experts (spec §4.11): router (hash via tid2eid, or sqrt-softplus scores with a
//! bias-steered top-k), renormalised weights × routed_scaling_factor, clamped SwiGLU experts, the
//! shared expert. Source: HF `DeepseekV4TopKRouter` / `DeepseekV4HashRouter` / `DeepseekV4Experts`
//! / `DeepseekV4MLP`, OFF-M `Gate` / `Expert` / `MoE`.

use crate::cpu::ops::{linear, sigmoid, silu, softplus};
use crate::forward::Numerics;
use crate::weights::{ExpertWeights, LayerWeights, RouterWeights};
use flashseek_model::config::{Ds4Config, ScoringFunc};

/// The routing of one token: expert ids and weights γ (already × routed_scaling_factor).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Selected experts, `num_experts_per_tok` of them.
    pub experts: Vec<usize>,
    /// Their weights γ.
    pub weights: Vec<f64>,
}

/// Routes tokens `f` (`[T, d]`, the ffn-normed inputs) with ids `ids` (spec §4.11 router).
pub fn route(cfg: &Ds4Config, lw: &LayerWeights, f: &[f32], ids: &[u32]) -> Vec<Route> {
    let e = cfg.n_routed_experts;
    let k = cfg.num_experts_per_tok;
    let logits = linear(f, &lw.gate);
    logits
        .chunks(e)
        .zip(ids)
        .map(|(lg, &id)| {
            let scores: Vec<f32> = lg
                .iter()
                .map(|x| match cfg.scoring_func {
                    ScoringFunc::SqrtSoftplus => softplus(*x as f64).sqrt() as f32,
                    ScoringFunc::Sigmoid => sigmoid(*x as f64) as f32,
                })
                .collect();
            let experts: Vec<usize> = match &lw.router {
                RouterWeights::Hash { tid2eid } => {
                    tid2eid[id as usize * k..(id as usize + 1) * k].iter().map(|x| *x as usize).collect()
                }
                RouterWeights::Score { bias } => {
                    let mut order: Vec<(f32, usize)> = scores.iter().zip(bias).enumerate().map(|(i, (s, b))| (s + b, i)).collect();
                    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    order[..k].iter().map(|o| o.1).collect()
                }
            };
            let sum: f64 = experts.iter().map(|x| scores[*x] as f64).sum();
            let weights = experts
                .iter()
                .map(|x| scores[*x] as f64 / (sum + 1e-20) * cfg.routed_scaling_factor)
                .collect();
            Route { experts, weights }
        })
        .collect()
}

/// Clamped SwiGLU hidden of one expert for tokens `f` (`[n, d]`): `silu(min(W1 f, L)) ⊙ clamp(W3 f, ±L)`.
fn expert_hidden(w: &ExpertWeights, f: &[f32], limit: f64, num: &Numerics) -> Vec<f32> {
    let x = num.act_in(f, w.w1.cols);
    let g = linear(&x, &w.w1);
    let u = linear(&x, &w.w3);
    g.iter()
        .zip(&u)
        .map(|(g, u)| (silu((*g as f64).min(limit)) * (*u as f64).clamp(-limit, limit)) as f32)
        .collect()
}

/// MoE output for tokens `f` (`[T, d]`): `Σ_i γ_i·expert_i(f) + shared(f)`.
///
/// Tokens are grouped by expert (one linear per expert over its tokens); each token's routed
/// outputs are then summed in its route's slot order, then the shared expert added — a fixed order.
/// Exact mode applies γ after `W2` (HF); with official activation quantisation γ scales the hidden
/// before `W2` (OFF-M), since the FP8 quantisation of `γ·h` is what the official kernel sees.
pub fn moe(cfg: &Ds4Config, lw: &LayerWeights, f: &[f32], routes: &[Route], num: &Numerics) -> Vec<f32> {
    let d = cfg.hidden_size;
    let t = routes.len();
    let limit = cfg.swiglu_limit;
    // out_slot[token][slot] = routed output, filled expert by expert.
    let k = cfg.num_experts_per_tok;
    let mut slot_out: Vec<Vec<f32>> = vec![Vec::new(); t * k];
    for (ex, w) in lw.experts.iter().enumerate() {
        let members: Vec<(usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(ti, r)| r.experts.iter().enumerate().filter(|(_, e)| **e == ex).map(move |(s, _)| (ti, s)))
            .collect();
        if members.is_empty() {
            continue;
        }
        let xs: Vec<f32> = members.iter().flat_map(|(ti, _)| f[ti * d..(ti + 1) * d].iter().copied()).collect();
        let mut h = expert_hidden(w, &xs, limit, num);
        let inter = w.w2.cols;
        let y = if num.act_quant_fp8 {
            for (m, (ti, s)) in members.iter().enumerate() {
                let g = routes[*ti].weights[*s];
                for v in &mut h[m * inter..(m + 1) * inter] {
                    *v = (*v as f64 * g) as f32;
                }
            }
            linear(&num.act_in(&h, inter), &w.w2)
        } else {
            let mut y = linear(&h, &w.w2);
            for (m, (ti, s)) in members.iter().enumerate() {
                let g = routes[*ti].weights[*s];
                for v in &mut y[m * d..(m + 1) * d] {
                    *v = (*v as f64 * g) as f32;
                }
            }
            y
        };
        for (m, (ti, s)) in members.iter().enumerate() {
            slot_out[ti * k + s] = y[m * d..(m + 1) * d].to_vec();
        }
    }
    let sh_h = expert_hidden(&lw.shared, f, limit, num);
    let shared = linear(&num.act_in(&sh_h, lw.shared.w2.cols), &lw.shared.w2);
    let mut out = vec![0f32; t * d];
    for ti in 0..t {
        for i in 0..d {
            let mut s = 0f64;
            for slot in 0..k {
                s += slot_out[ti * k + slot][i] as f64;
            }
            out[ti * d + i] = (s + shared[ti * d + i] as f64) as f32;
        }
    }
    out
}
