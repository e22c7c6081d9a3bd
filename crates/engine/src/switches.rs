//! The switch registry (issue 6 §7): every optimisation that changes *how* a result is computed has
//! a name, an environment variable `FLASHSEEK_<NAME>`, a CLI flag (`--switch NAME=VALUE`, global), a
//! default, and a parity check against the exact path. `flashseek switches` prints this table;
//! `docs/SWITCHES.md` documents each entry with its measured parity.
//!
//! Values are resolved once per process (CLI overrides, then the environment, then the default) the
//! first time any switch is read; [`set_override`] after that is an error. An empty variable means
//! the default. An invalid value in the environment is reported by [`check_environment`] (the CLI
//! calls it after applying its flags, which take precedence) and otherwise falls back to the
//! default. On/off switches also accept 1/0, true/false, yes/no.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// One registered switch.
#[derive(Debug, Clone, Copy)]
pub struct Switch {
    /// Name (`TC_LINEAR`); the env var is `FLASHSEEK_` + name.
    pub name: &'static str,
    /// Accepted values, the default first. Aliases are listed in [`Switch::aliases`].
    pub values: &'static [&'static str],
    /// Other spellings and what they mean (`("1", "on")`).
    pub aliases: &'static [(&'static str, &'static str)],
    /// What the optimisation replaces (the exact path it is checked against).
    pub replaces: &'static str,
    /// Where its parity check lives and what it compares.
    pub parity: &'static str,
}

impl Switch {
    /// The environment variable of this switch.
    pub fn env_var(&self) -> String {
        format!("FLASHSEEK_{}", self.name)
    }

    /// The default value (the first of [`Switch::values`]).
    pub fn default_value(&self) -> &'static str {
        self.values[0]
    }

    /// The accepted spellings for messages: `split, bf16, off (also 1 = split, …)`.
    pub fn accepted(&self) -> String {
        let mut a = self.values.join(", ");
        if !self.aliases.is_empty() {
            let al: Vec<String> = self.aliases.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            a.push_str(&format!(" (also {})", al.join(", ")));
        }
        a
    }

    /// `raw` normalised to one of [`Switch::values`], or None when it is not accepted.
    pub fn normalise(&self, raw: &str) -> Option<&'static str> {
        let v = raw.trim().to_ascii_lowercase();
        if let Some(x) = self.values.iter().find(|x| **x == v) {
            return Some(x);
        }
        self.aliases.iter().find(|(a, _)| *a == v).map(|(_, x)| *x)
    }
}

const ON_OFF_ALIASES: &[(&str, &str)] = &[("1", "on"), ("true", "on"), ("yes", "on"), ("0", "off"), ("false", "off"), ("no", "off")];

/// Every switch, in the order `flashseek switches` lists them.
pub const SWITCHES: &[Switch] = &[
    Switch {
        name: "TC_LINEAR",
        values: &["split", "bf16", "fp8", "off"],
        aliases: &[("1", "split"), ("on", "split"), ("true", "split"), ("yes", "split"), ("x2", "split"), ("0", "off"), ("false", "off"), ("no", "off")],
        replaces: "the exact f32 linear kernel (linear.cu) for GPU linear layers with T >= 64 tokens: tensor cores with split (hi+lo) or plain bf16 activations; fp8 = DeepSeek's official numerics (spec §10.1: e4m3 activations per 128 features on FP8 tensor cores, γ before the expert down projection), compared with the CPU reference in those numerics",
        parity: "gpu-check `tc …` records (per-shape NMSE vs the CPU), every whole-model check, the switch matrix (`gpu-check --only switches`); fp8: `linear_q8`/`linear_w8 …` (`--only q8`) and `moe_q8 …` (`--only moe`) records vs the CPU in official numerics",
    },
    Switch {
        name: "BF16_WGMMA",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the mma.sync m16n8k16 bf16 GEMMs (split or bf16 activations) of the tensor-core linear layers and the grouped MoE (gemm_tc_*, moe_gemm_*) for bf16/FP8/FP4 weights with K a multiple of 64 on sm_90a: Hopper warpgroup MMA (wgmma m64n128k16 / m64n256k16 bf16 from 128-byte-swizzled shared memory, weights dequantized exactly to bf16 one K step ahead while the previous step multiplies; gemm_wb_*, moe_wb_*), and the 128-row (x 256) MoE tile for split activations when experts hold >= 96 tokens on average",
        parity: "gpu-check `linear_tc_<fmt>[_x2] … Wgmma` / `WgmmaWide` records (`--only tc`: every format, ragged T and N, split tolerance 1e-8, exact FP8/FP4 decode, the same bits as the mma.sync Large tile), `moe_grouped …` records (`--only moe`: the grouped MoE matrix runs on it by default) and `moe_grouped … BF16_WGMMA=off vs cpu` / `bits` (the mma.sync kernels against the same CPU reference, and the same bits); the switch matrix and qualify (`BF16_WGMMA=off alone`: same bits)",
    },
    Switch {
        name: "FP8_WGMMA",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the mma.sync m16n8k32 FP8 GEMMs of TC_LINEAR=fp8 (gemm_q8_*, moe_q8_*): Hopper warpgroup MMA (wgmma m64n128k32 e4m3 from 128-byte-swizzled shared memory, gemm_w8_*, moe_w8_*), same per-128 promotion",
        parity: "gpu-check `linear_w8 …` (`--only q8`) and `moe_q8 …` / `moe_q8 … mma.sync` (`--only moe`) records against the CPU in official numerics; the switch matrix (with TC_LINEAR=fp8, reported)",
    },
    Switch {
        name: "MOE_FP8_WS",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped FP8 wgmma MoE GEMMs of 128-row tiles under TC_LINEAR=fp8 (moe_w8_*_128_*: two warpgroups that each copy, convert FP4 weights, multiply and promote, one block barrier per K step): warp specialisation (moe_ws_*: two producer warpgroups copy and convert into a 5-6 stage ring, two multiply warpgroups wait on mbarriers and promote, registers moved to them with setmaxnreg; the same MMAs and promotion order, so the same bits)",
        parity: "gpu-check (`--only moe`) `moe_q8 <fmt> MOE_FP8_WS=off bits` (bitwise equal to moe_w8 on the parity layer, both formats; FP4 all on runs moe_wt there, which MOE_FP8_WS=off turns off too; the other `moe_q8 …` records run on it by default: against the CPU in official numerics and bit for bit against all on) and `moe_q8 flash T=… MOE_FP8_WS=off bits` (Flash shapes with 128-row tiles forced, so that moe_ws runs at every listed token count); qualify (`MOE_FP8_WS=off alone (with TC_LINEAR=fp8)`: the same logits bits as all on with TC_LINEAR=fp8); the switch matrix row checks only the plumbing (its 200-token prefill takes 64-row tiles)",
    },
    Switch {
        name: "MOE_FP8_WT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped FP8 MoE's 128-row tiles (moe_ws_fp4_128_*) for FP4 experts under TC_LINEAR=fp8 when experts hold >= 128 routed pairs on average (a Flash prefill chunk of 8,192 tokens: 192; of 32,768: 768): 256-row tiles (moe_wt_fp4_256_*: one producer warpgroup converts each weight tile once per 256 token rows instead of once per 128 and copies the activations, stored pre-swizzled in 64-row blocks by the gather and the activation quantizer, with one cp.async.bulk per 64-row sub-tile; two multiply warpgroups run moe_ws's MMAs and promotion per sub-tile and skip sub-tiles of padding rows alone; so the same bits)",
        parity: "gpu-check (`--only moe`) `moe_q8 fp4 MOE_FP8_WT=off bits` (bitwise equal to moe_ws on the parity layer; the other `moe_q8 fp4 …` records of 1,000 tokens run on it by default: against the CPU in official numerics and bit for bit against all on, which includes the forced 128-row tile) and `moe_q8 flash T=… MOE_FP8_WT=off bits` (Flash shapes with 256-row tiles forced against 128-row tiles, so that moe_wt runs at every listed token count); qualify (`MOE_FP8_WT=off alone (with TC_LINEAR=fp8)`: the same logits bits as all on with TC_LINEAR=fp8); the switch matrix row checks only the plumbing (its 200-token prefill has fewer than 128 pairs per expert)",
    },
    Switch {
        name: "MOE_DOWN_BF16_OUT",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the f32 rows of the routed experts' down projection (one per (token, slot), [T·k, d]) that the 256-row-tile grouped FP8 MoE (MOE_FP8_WT) scatters and the combine reads: the scatter rounds each row to bf16 as it stores it, as DeepSeek's FP8/FP4 GEMMs write their outputs (spec §6 \"Output is bf16\"; OFF-M then accumulates the routed outputs in fp32, spec §10.4), and the combine widens them (moe_combine_bf16) — half the bytes written and read (48 KiB per token and layer at top-6 of 4,096); not exact, off by default",
        parity: "gpu-check (`--only moe`) `moe_q8 fp4 MOE_DOWN_BF16_OUT bits` (every routed row's bf16 values against the f32 scatter's rounded to nearest even, bit for bit, on the parity layer with the 256-row tiles run) and `moe_q8 fp4 MOE_DOWN_BF16_OUT=on vs cpu` (the MoE output against the CPU in official numerics, the FP8 MoE's tolerance; against the f32 rows' output, NMSE reported); gpu-check (`--only mhc`) `moe_combine_bf16 bits` (against moe_combine_f32 on the widened values); the switch matrix (plumbing only: its 200-token prompts do not reach the 256-row tiles) and qualify (reported, not judged)",
    },
    Switch {
        name: "MOE_BF16_WS",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped bf16 wgmma MoE GEMMs of the exact default (split activations, FP4 experts, 128 x 256 tiles: moe_wb_fp4_128_x2_*, two warpgroups that each copy, convert FP4 weights to bf16 and multiply, one block barrier per K step): warp specialisation (moe_wbs_fp4_128_x2_*: one producer warpgroup copies both activation planes and the packed weights into a 3-stage ring and converts them a step later, two multiply warpgroups wait on mbarriers; the same MMAs in the same order on the same bf16 values, so the same bits)",
        parity: "gpu-check (`--only moe`) `moe_grouped fp4 split MOE_BF16_WS=off bits`, `moe_grouped fp4 split scales > 128 …` (scale bytes above 128 on every third weight row, also with a grid of 7 blocks) and `moe_grouped inter 192 fp4 split MOE_BF16_WS=off bits` (bitwise equal to moe_wb on the parity layers; the other `moe_grouped fp4 split …` records with 128-row tiles run on it by default: against the CPU at NMSE <= 1e-8 and bit for bit against all on) and `moe_grouped flash T=… MOE_BF16_WS=off bits` (Flash shapes with 128-row tiles forced); qualify and the switch matrix (`MOE_BF16_WS=off alone`: the same logits bits as all on; the matrix's 200-token prefill takes 64-row tiles, so its row checks only the plumbing)",
    },
    Switch {
        name: "FP8_CUBLASLT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "gemm_q8.cu's FP8 GEMM (wgmma or mma.sync) for FP8 weights (rows and columns multiples of 128) under TC_LINEAR=fp8 with T >= 256 tokens: cuBLASLt's block-scaled FP8 GEMM (1x128 activation scales x 128x128 weight scales, f32 out; needs cuBLASLt from CUDA 12.9 or newer at run time, else falls back)",
        parity: "gpu-check `linear_lt …` records (`--only q8`): cuBLASLt against the CPU in official numerics, against gemm_q8.cu's wgmma kernel and run twice (same bits), with timings; `moe_q8 …` (`--only moe`: the shared expert through it); qualify (`FP8_CUBLASLT=off alone`, with TC_LINEAR=fp8, reported; the switch matrix's prompts are under 256 tokens and do not reach it)",
    },
    Switch {
        name: "LINEAR_CUBLASLT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "gemm.cu's split-activation GEMMs (TC_LINEAR=split, and wo_a / bf16 weights under TC_LINEAR=fp8) for BF16/FP8 weights at T >= 256: cuBLASLt bf16 GEMMs on the same hi and lo planes (y = W·hi + W·lo, f32 accumulation; FP8 weights converted to bf16 exactly per call), the grouped wo_a with strided rows instead of gather/scatter (needs cuBLASLt from CUDA 12.9 or newer at run time, else falls back)",
        parity: "gpu-check `linear_split_lt …` / `grouped_linear_lt …` records (`--only tc`): cuBLASLt against the CPU (split tolerance 1e-8), against gemm.cu and run twice (same bits), with timings; qualify `LINEAR_CUBLASLT=off alone` (8K+ prompts; the switch matrix's prompts are under 256 tokens and do not reach it)",
    },
    Switch {
        name: "SAMPLE_ON_DEVICE",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "downloading each decode step's whole logits row (vocab f32) for the host sampler: for greedy and top-k (k <= 1024) requests without penalties or logprobs, the GPU selects the k most likely tokens (logits_topk_f32) and the host sampler finishes top-p/min-p on them (sampler::TopLogits; the same tokens by construction)",
        parity: "CPU test sampler::tests::top_logits_sample_like_the_full_row (same tokens and RNG state as the full row); gpu-check `logits_top …` records (the device selection equals TopLogits::from_row exactly) and `generate on-device sampling` (same tokens with the switch on and off); scripts/serve_parity.py",
    },
    Switch {
        name: "MLA_STREAM_TOPK",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "sparse_attention_f32 (one block per token and head, every K=V row read once per head, f32 CUDA cores): one block per token reading each window/selected row once for all 64 heads, split-bf16 tensor-core products (H = 64, c = 512 only)",
        parity: "gpu-check `sparse_attention_stream …` records vs the CPU reference (NMSE, max-abs), every whole-model check, the switch matrix",
    },
    Switch {
        name: "MLA_SPLIT_OUT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the streaming attention's f32 output [T, 64, 512] converted to split bf16 planes by gemm_x_bf16 for the grouped output projection on cuBLASLt (wo_a, LINEAR_CUBLASLT): the attention kernel writes the planes itself (the same split of the same values, so the same bits), one pass over 4 bytes per value less",
        parity: "gpu-check (`--only attention`) `sparse_attention split planes …` (the kernel's planes against gemm_x_bf16's split of its own f32 output, bit for bit, both streaming kernels, sliding / HCA / CSA cases, the lo plane placed by its offset, nothing written outside the planes); qualify (`MLA_SPLIT_OUT=off alone`: the same logits bits as all on); the switch matrix row checks only the plumbing (its 200-token prompts are below cuBLASLt's 256-token minimum)",
    },
    Switch {
        name: "MLA_FUSED_Q_NORM",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the per-head q RMSNorm + RoPE pass (rms_norm_rows_f32: the wq_b output [T, 64, 512] read and the normed queries written, 8 bytes per value) before the streaming attention (MLA_STREAM_TOPK): the attention kernel reads the raw wq_b output and norms and rotates each head while it stages Q, computing that kernel's bits",
        parity: "gpu-check (`--only attention`) `sparse_attention fused q norm …` (raw queries against rms_norm_rope's output fed to the kernel, bit for bit, f32 and split-plane output, both streaming kernels, sliding / HCA / CSA cases); qualify and the switch matrix (`MLA_FUSED_Q_NORM=off alone`: the same logits bits as all on)",
    },
    Switch {
        name: "WQ_B_BF16_OUT",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the f32 output of the wq_b FP8 GEMM (official numerics, TC_LINEAR=fp8) that the streaming attention's fused q norm reads (MLA_FUSED_Q_NORM): the GEMM writes bf16, as DeepSeek's fp8_gemm does (spec §6 \"Output is bf16\"; cuBLASLt's bf16-output block-scaled GEMM under FP8_CUBLASLT, else the f32 product rounded to nearest even), and the attention kernel widens it as it loads it — half the bytes written by the GEMM and read by the attention (64 KiB written and 64 KiB read less per token and layer at 64 heads of 512; below 256 tokens, decode, the f32 product is rounded in one more pass: a launch and a scratch buffer more, no gain); not exact (the queries rounded to bf16 before their RMSNorm), off by default",
        parity: "gpu-check (`--only attention`) `sparse_attention fused q norm bf16 …` records (bf16 raw queries against their exact widening fed as f32 raw queries, bit for bit, every streaming kernel, f32 and plane/bf16 output), gpu-check (`--only q8`) `linear_official_bf16 …` records (against the f32 product rounded to bf16: at most 1 bf16 ulp apart, NMSE ≤ 1e-5; vs the CPU's FP8 product rounded to bf16); the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "WO_A_FP8",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped output projection wo_a (spec §4.7) at >= 256 tokens as one bf16 product on cuBLASLt over the attention output rounded to bf16 (MLA_BF16's OFF-M numerics; OFF-CV dequantises wo_a to bf16): vLLM's numerics for it on sm_90 (fp8_einsum; spec §4.7 \"vLLM keeps it FP8\") — the candidate-split attention kernel writes its output quantized to e4m3 with one power-of-two scale per 128 channels of a head (DeepSeek's activation rule, after the inverse RoPE; half the bytes of the bf16 output) and each group is cuBLASLt's block-scaled FP8 GEMM on it with wo_a's FP8 weights and 128 x 128 scales, f32 out (twice bf16's tensor-core rate); should cuBLASLt decline a group, the forward recomputes the f32 output for the gather path, as with MLA_SPLIT_OUT; not exact, off by default",
        parity: "gpu-check (`--only attention`) `sparse_attention_wc fp8 out bits` (the kernel's e4m3 bytes and scales against act_quant_fp8 on the same kernel's f32 output, bit for bit, sliding / HCA / CSA cases) and `wo_a fp8 …` (the grouped FP8 product against the CPU's f64 sums of the same e4m3 values and scales, NMSE tolerance 1e-5 as the FP8 linears' records, measured 1.2e-8, and against the bf16 product of the bf16 output, NMSE reported); the switch matrix (plumbing only: its 200-token prompts are below cuBLASLt's 256-token minimum) and qualify (reported, not judged)",
    },
    Switch {
        name: "MLA_STREAM_FAST_EXP",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "expf in the online softmax of the streaming attention kernel (MLA_STREAM_TOPK): the hardware __expf (ex2.approx); not exact, off by default; no effect on MLA_BF16_CAND_SPLIT's kernel (its softmax is on ex2.approx already)",
        parity: "gpu-check `sparse_attention_fast_exp …` records (NMSE and max-abs vs the CPU reference and vs the precise streaming kernel), the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "MLA_BF16",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the streaming attention's split-bf16 products (three mma.sync per fragment, f32-level error; MLA_STREAM_TOPK) by DeepSeek's own attention numerics (OFF-K sparse_attn_kernel: Q, K=V and P rounded to bf16, f32 accumulation) on one wgmma product per fragment, the rows copied into shared memory by a dedicated warpgroup from bf16 copies made once per call (sm_90a; elsewhere the split kernels); by default (MLA_BF16_CAND_SPLIT) sparse_attention_wc, else sparse_attention_wg; where wo_a runs on cuBLASLt (>= 256 tokens) the output is bf16 and wo_a one bf16 product on it; not exact, off by default",
        parity: "gpu-check (`--only attention`) `sparse_attention_bf16 …` records (NMSE and max-abs vs the CPU reference and vs the split kernel, tolerance 1e-4: bf16 rounding of Q, K=V and P; and vs the CPU's replay of sparse_attention_wg's numerics, forward::attention::attend_bf16, tolerance 1e-7; MLA_BF16_CAND_SPLIT's kernel has its own records), `sparse_attention split planes StreamBf16 …`, `sparse_attention fused q norm StreamBf16 …` and `sparse_attention_mask StreamBf16 …` (bit for bit, as for the split kernels), `sparse_attention_bf16_fast_exp …` (with MLA_STREAM_FAST_EXP); the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "MLA_BF16_CAND_SPLIT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "MLA_BF16's sparse_attention_wg (the multiply warpgroups split O's channels: each adds the other's partial logits of every 32-candidate tile through shared memory, one barrier per tile) by sparse_attention_wc: each multiply warpgroup takes its own 64 of every 128 candidates (logits over all 512 channels on wgmma m64n64k16), the running max and its P tile exchanged through shared memory, and adds both blocks' P · V for its half of O's channels; the K=V rows in four half-blocks with their own barriers, refilled as soon as their last reader frees them, the copy warpgroup computing its own rows; the softmax's 2^x on ex2.approx (MLA_STREAM_FAST_EXP does not change it); not exact (MLA_BF16's numerics class), acts only with MLA_BF16=on",
        parity: "gpu-check (`--only attention`) `sparse_attention_bf16_cand …` records (NMSE and max-abs vs the CPU reference, vs the split kernel and vs sparse_attention_wg, tolerance 1e-4 as MLA_BF16), `sparse_attention split planes StreamBf16Cand …`, `sparse_attention fused q norm StreamBf16Cand …` and `sparse_attention_mask StreamBf16Cand …` (bit for bit, as for the other streaming kernels); the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "DIRECT_INDEXER_TOPK",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the mask path: the indexer's top-k lists turned into a [T × entries] byte mask that attention scans for the visible entries it marks; on = the lists go straight to attention (no mask built)",
        parity: "gpu-check `sparse_attention_mask …` records (bitwise equal to the lists, both kernels), the switch matrix and qualify (same bits as all on)",
    },
    Switch {
        name: "INDEXER_TC",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "indexer_scores_f32 (f32 CUDA cores, the whole query reloaded per 16 keys): indexer scores on split-bf16 tensor cores, queries held in registers across 512 keys (64 heads of 128 only)",
        parity: "gpu-check `indexer_scores_tc …` records (NMSE vs the CPU, top-k vs the reference selection), every whole-model check, the switch matrix",
    },
    Switch {
        name: "INDEXER_STREAM_TOPK",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the [T × entries] f32 score matrix (indexer_scores_tc) then a radix top-k over it (indexer_topk_f32): scores and top-k in one streaming pass per token pair, a running top-k buffer in shared memory, no score matrix (with INDEXER_TC, 64 heads of 128, chunks of >= 256 tokens)",
        parity: "gpu-check `indexer_topk_stream …` records (lists identical to scores + top-k, exact); qualify (same bits as all on at 8K/32K/128K; the switch matrix's 200-token prompts are below its 256-token minimum)",
    },
    Switch {
        name: "INDEXER_WGMMA",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "indexer_topk_stream (scores on mma.sync, two tokens per block, block barriers in every 64-key tile): indexer_topk_wgmma — the keys split into bf16 hi/lo tiles once per call, copied by cp.async.bulk into a 4-stage ring; four tokens per block, each warpgroup multiplies its token's 64 heads on wgmma (queries in registers; the same three products per 16 dims in the same order) and selects on its own buffer with warpgroup barriers (sm_90a, 64 heads of 128, chunks of >= 256 tokens; for the exact scores it needs INDEXER_STREAM_TOPK acting: INDEXER_TC on, INDEXER_FP8 off). With INDEXER_FP8 on it replaces indexer_topk_stream_fp8 instead: indexer_topk_wgmma_fp8, the e4m3 keys in 8 KB tiles, one wgmma m64n64k32 e4m3 per 32 dims",
        parity: "gpu-check `indexer_topk_wgmma …` records (lists identical to indexer_scores_tc + indexer_topk on the cases of `indexer_topk_stream …`) and `indexer_scores_wgmma …` (scores vs the CPU at NMSE <= 1e-4, measured ~1e-11, and bit for bit vs indexer_scores_tc); with INDEXER_FP8, `indexer_topk_wgmma_fp8 …` (as `indexer_topk_stream_fp8 …`: the selection rule on the CPU's f64 scores of the quantized values, up to near ties; entries in only one of its and indexer_topk_stream_fp8's lists reported), `indexer_scores_wgmma_fp8 …` (vs those scores, NMSE <= 1e-7, max-abs <= 5e-4 of the largest) and `indexer_topk_wgmma_fp8 exact …` (lists identical to indexer_topk on its own scores, on every case of `indexer_topk_stream …`); qualify (`INDEXER_WGMMA=off alone`: same bits as all on at 8K/32K/128K; the switch matrix's 200-token prompts are below its 256-token minimum)",
    },
    Switch {
        name: "INDEXER_FP8",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the exact indexer scores (split-bf16 tensor cores): index queries and keys quantized to e4m3 with one power-of-two scale per 128-wide row, one FP8 tensor-core product, inside the streaming top-k (64 heads of 128, chunks of >= 256 tokens: decode steps keep the exact scores); not exact, off by default",
        parity: "gpu-check `indexer_topk_stream_fp8 …` records (selection vs the rule on the CPU's f64 scores of the quantized values, up to near ties; agreement with the exact selection reported); qualify (logits NMSE reported; the switch matrix's 200-token prompts are below its 256-token minimum)",
    },
    Switch {
        name: "MOE_GROUPED",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "one expert at a time (gather, three linears, scatter) with a host sync to group tokens: tokens grouped by expert on the device and one GEMM launch for all experts' gate/up and one for down",
        parity: "gpu-check `moe_grouped …` records (parity matrix vs the CPU reference and the per-expert GPU path), the switch matrix",
    },
    Switch {
        name: "MOE_GROUPED_DECODE",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the per-expert MoE for chunks under 64 tokens (decode steps), which downloads each layer's routing to group tokens on the host (a synchronisation per layer): the grouped device path of MOE_GROUPED at any token count",
        parity: "gpu-check `moe_grouped <fmt> split T=1 / T=3 vs cpu` (the grouped path on 1 and 3 tokens) and the `moe_grouped …` matrix (1, 2 and 9 tokens per expert), `time moe layer T=1`; the switch matrix (`MOE_GROUPED_DECODE=off alone`, 16 greedy decode steps); `gpu-bench` decode with and without it",
    },
    Switch {
        name: "WO_A_STRIDED",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped output projection wo_a below 64 tokens (decode steps, short chunks) as a gather of each group's columns of the attention output, a gemv and a scatter into z, with a row-index upload and two zero fills per group: each group's gemv (linear.cu with row strides) reads its columns and writes its columns of z in place, all groups in one launch (linear_<fmt>[_t1]_grouped over the layer's table of group addresses)",
        parity: "gpu-check `wo_a strided vs gather bits` / `wo_a one launch vs gather bits` (bitwise equal at 1, 3, 17 and 63 tokens) and `wo_a strided vs cpu`, `time wo_a grouped T=1` (`--only wo_a`); the switch matrix (`WO_A_STRIDED=off alone`: same bits); `gpu-bench` decode",
    },
    Switch {
        name: "INDEXER_TC_DECODE_TILES",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "indexer_scores_tc's 512 keys per block whatever the call (a decode step's 2,048 entries at 8K context in 4 blocks of 132 SMs): for calls whose grid would have fewer than 264 blocks, the fewest keys per block (a multiple of 64, at least 64) that give about that many (32 blocks instead of 4 at 8K context, 256 at 128K); each key's score from the same 64-key tile code, so the same bits",
        parity: "gpu-check `--only attention`: `indexer_scores_tc kb 64 / 128 vs 512 bits` (bitwise equal, masked tiles included); the switch matrix (`INDEXER_TC_DECODE_TILES=off alone`: same bits) and qualify; `gpu-bench` decode",
    },
    Switch {
        name: "COMPRESSOR_FUSED_DECODE",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "below 64 tokens (decode steps, short chunks), a compressor's projections as one gemv launch per weight (wkv and wgate; in a CSA layer also the indexer compressor's two and weights_proj: five), a position-bias pass over the gate logits and two copies appending kv and logits to the compressor state, and two zero-filled temporaries and a copy per completed-entry batch: one launch of all the layer's compressor gemvs (linear.cu linear_<fmt>[_t1|_t1p]_multi, f32 or bf16 weights) writing straight into the states with the bias added as it stores, and the entries pooled into scratch and normed into place; each value from the same row code, so the same bits",
        parity: "gpu-check `--only attention`: `linear_multi_into <fmt> T=… bits` (bitwise equal to one gemv per weight, then add_position_bias, at 1, 3 and 9 tokens, with LINEAR_T1_PREFETCH on and off); the switch matrix (`COMPRESSOR_FUSED_DECODE=off alone`: same bits) and qualify; `gpu-bench` decode",
    },
    Switch {
        name: "COMPRESSOR_BF16",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "at >= 64 tokens (prefill), the compressors' projections (wkv and wgate; in a CSA layer also the indexer compressor's two and weights_proj) on split activations (the attn-normed input as bf16 hi and lo planes, two bf16 GEMMs per weight: OFF-M's fp32 arithmetic to ~16 bits of the input) under TC_LINEAR=split or fp8: the input rounded to bf16 once, one bf16 GEMM per weight with f32 accumulation (cuBLASLt where it takes the shape) — HF's model-dtype compressor in bf16 and vLLM's (spec §9), half the tensor-core work and half the conversion's writes; not exact, off by default",
        parity: "gpu-check `linear_multi COMPRESSOR_BF16 …` records (`--only tc`: the single-plane products against the CPU's f64 products of the bf16-rounded input, NMSE tolerance 1e-8 as the split linears' records, with LINEAR_CUBLASLT on and off, and against the split products, NMSE reported); the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "MOE_DECODE_GEMV",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the grouped MoE GEMMs for calls of at most 192 routed pairs (decode steps of up to 32 tokens) over FP4 experts — grouping (scan, plan, scan), gather into 64-row tiles of one or two live rows, each expert's weights converted for the whole tile (to e4m3 under TC_LINEAR=fp8, to bf16 for the exact split activations): one gemv per (pair, output row) on CUDA cores, each FP4 weight read once per pair (moe.cu moe_gemv_fp4_swiglu / moe_gemv_fp4_down on e4m3 inputs with γ before W2 under TC_LINEAR=fp8; moe_gemv_fp4_swiglu_f32 / moe_gemv_fp4_down_f32 on f32 inputs, γ in the combine, in the exact modes); products exact in f32, not the tensor cores' bits",
        parity: "gpu-check (`--only moe`): `moe_q8 fp4 gemv vs cpu`, `moe_q8 fp4 T=1 / T=3 vs cpu` (NMSE ≤ 1e-4 against the CPU in official numerics), `moe_grouped fp4 gemv f32 vs cpu`, `moe_grouped fp4 split T=1 / T=3 vs cpu` (NMSE ≤ 1e-8 against the exact CPU), `… gemv masked` / `… gemv f32 masked` (γ = 0: the shared expert's bits), `moe_q8 fp4 gemv unrouted ids vs grouped`, `moe_q8 flash T=… gemv vs grouped` and `moe_grouped flash T=… gemv f32 vs grouped split`, `time moe layer T=… gemv …` (1 … 64 tokens); the switch matrix and qualify (`MOE_DECODE_GEMV=off alone`: exact, other bits; `… (with TC_LINEAR=fp8)`: reported); `gpu-bench` decode",
    },
    Switch {
        name: "MOE_GEMV_MMA",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "MOE_DECODE_GEMV's official-numerics gemvs (moe.cu moe_gemv_fp4_swiglu / moe_gemv_fp4_down: each 32-value group's dot product as 32 f32 products of decoded nibbles on CUDA cores): moe_gemv_fp4_mma_swiglu / moe_gemv_fp4_mma_down, each group's sum on the tensor cores (mma.sync m16n8k32 e4m3, the FP4 nibbles spread into e4m3 bytes of value e2m1·2^-6, 16 rows per warp; for decode steps of at most 12 pairs the _ks4 entries split each tile's groups over the block's 4 warps, widths multiples of 1,024), then the same scaling, γ and SwiGLU in f32; widths multiples of 256 (Flash's 4,096 and 2,048), other widths keep the CUDA-core gemvs; the MMA unit's group sums, so not the CUDA-core gemv's bits",
        parity: "gpu-check (`--only moe`): `moe_q8 fp4 gemv vs cpu`, `… flash widths vs cpu` and `moe_q8 fp4 T=1 / T=3 vs cpu` (on by default; NMSE ≤ 1e-4 against the CPU in official numerics), `… MOE_GEMV_MMA=off vs cpu`, `… mma k-split 1 / 4 vs cpu` (each split forced), `moe_q8 fp4 gemv mma vs cuda-core gemv` and `moe_q8 flash T=… gemv mma vs cuda-core gemv` (NMSE ≤ 1e-4 against MOE_GEMV_MMA=off), `… gemv masked` (γ = 0: the shared expert's bits), `time moe layer T=… gemv MOE_GEMV_MMA=off` and `… gemv mma k-split 1 / 4 (forced)`; the switch matrix and qualify (`MOE_GEMV_MMA=off alone (with TC_LINEAR=fp8)`: reported); `gpu-bench` decode",
    },
    Switch {
        name: "LINEAR_GEMV_MMA",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the official numerics' small-batch linears over FP8 weights at 1 to 8 tokens (decode steps: wq_a, wkv, wq_b, wo_b, the indexer's wq_b, the shared expert; linear.cu linear_fp8[_t1[p]]_q with LINEAR_FUSED_QUANT: the input quantize-dequantized as staged, each 16-value chunk decoded to f32 and summed on CUDA cores): linear_fp8_mma_q_ks<1|2|4|8>, the inputs quantized to e4m3 bytes as staged and each 128-value block's products on the tensor cores (mma.sync m16n8k32 e4m3 with the weight bytes as loaded as the A fragment and up to 8 tokens as its columns), scaled by the block's two power-of-two scales; widths multiples of 256 up to 8,192 with tokens·(width + 16) ≤ 32,768 bytes, other shapes keep the CUDA-core gemv; the MMA unit's sums, so not that gemv's bits",
        parity: "gpu-check `--only gemv`: `linear_official mma fp8 <weight> T=1 / 3 / 8 vs cpu` (NMSE ≤ 1e-5 against the CPU's linear(act_in(x), W)), `… vs LINEAR_GEMV_MMA=off` (NMSE ≤ 1e-5, the shapes taken and declined as the host rule says), `… nan block` (NaN only in the token whose input holds one), `time linear official T=1 fp8 …` on and off; the switch matrix and qualify (`LINEAR_GEMV_MMA=off alone (with TC_LINEAR=fp8)`: reported); `gpu-bench` decode",
    },
    Switch {
        name: "LINEAR_T1_PREFETCH",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the one-token gemvs (linear.cu linear_<fmt>_t1[_q|_grouped]: decode steps' linears in every numerics, wo_a's groups, the official path's fused quantisation) taking each of a warp's rows in turn — its loads, its dot products, its reduction and store, then the next row's loads: linear_<fmt>_t1p[_q|_grouped], which issues the next row's (or batch's) loads before it uses the current ones, in a grid of the blocks every SM holds at once (no second wave); each row summed in the same order, so the same bits",
        parity: "gpu-check `--only gemv` (or `wo_a`): `linear exact / official T=1 prefetch <fmt> … bits` (bitwise equal to LINEAR_T1_PREFETCH=off on Flash's decode shapes and odd row counts, every weight format), `… vs cpu`, `wo_a one launch T=1 prefetch bits`, `time linear T=1 …` and `time wo_a grouped T=1 one launch …`; the switch matrix (`LINEAR_T1_PREFETCH=off alone`: same bits); `gpu-bench` decode",
    },
    Switch {
        name: "LINEAR_FUSED_QUANT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "under TC_LINEAR=fp8, a linear of fewer than 64 tokens (decode steps, short chunks) as three launches — a copy of the input, act_quant_fp8's quantize-dequantize of the copy per 128 values, the exact gemv (linear.cu) on it: one launch of linear_<fmt>[_t1]_q, which quantize-dequantizes the input (the same rule, common.cuh fs_q8_quant4) while it stages it in shared memory; inputs a multiple of 128 wide with min(T, 8)·width ≤ 8,192 (every Flash decode linear); the same bits",
        parity: "gpu-check `--only q8`: `linear_official fused quant T=… bits` (bitwise equal to the copy, roundtrip and gemv at 1, 3, 8 and 63 tokens, FP8 / FP4 / bf16 / f32 weights, spread block magnitudes and a NaN block) and `… vs cpu` (NMSE ≤ 1e-4 against linear(act_in(x), W) in f64), `time q8 official T=1 …` (both forms); the switch matrix (`LINEAR_FUSED_QUANT=off alone (with TC_LINEAR=fp8)`: the same bits as the official all-on run); `gpu-bench` decode",
    },
    Switch {
        name: "DECODE_CUDA_GRAPH",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "launching a decode step's kernels one by one: the step recorded by stream capture and launched as one CUDA graph (a kept executable graph updated with the step's arguments, or instantiated for a new topology); temporaries from a graph memory pool, uploads from pinned staging memory. Each step is captured one step ahead, while the previous one runs on the GPU. Needs MOE_GROUPED and MOE_GROUPED_DECODE on (the per-expert MoE synchronises every layer) and expert formats the grouped MoE takes; not while profiling stages",
        parity: "gpu-check `graph <model> decode ×1 / ×2` on the stored-format and full-width models (bitwise equal logits to the same steps without graphs, one sequence and two in turns, every step launched as a graph), the switch matrix (`DECODE_CUDA_GRAPH=off alone`: same bits as all on); `gpu-bench` decode with and without graphs",
    },
    Switch {
        name: "MOE_FUSED_SWIGLU",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "separate gate and up GEMMs, a SwiGLU kernel and a bf16 conversion: gate and up in one tile with the clamped SwiGLU in the epilogue (grouped MoE only)",
        parity: "gpu-check `moe_grouped …` records with fused on and off (same bits, checked), the switch matrix",
    },
    Switch {
        name: "MOE_ADAPTIVE_TILES",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "a fixed 128-row expert tile: 64-row tiles when the average tokens per expert is below 96 or activations are split (grouped MoE only)",
        parity: "gpu-check `moe_grouped …` records with both tile heights (same bits, checked), the switch matrix",
    },
    Switch {
        name: "LONG_CONTEXT_CHUNK",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "2,048-token prefill chunks: 32,768-token chunks (every layer's weights read once per 32,768 tokens, MoE tiles fuller; `serve` caps its per-step prefill budget at 8,192); attention and the indexer work per query token and a tail under 256 tokens joins the chunk before it, so chunks of >= 256 tokens change no bit of the result (measured by qualify)",
        parity: "qualify: all on with a quarter of the chunk gives the same logits bits and ids; the switch matrix and qualify compare LONG_CONTEXT_CHUNK=off alone with all on bit for bit",
    },
    Switch {
        name: "MHC_FUSED",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "the mHC pre as its own two passes over the streams (hc_mix_partial_f32: the (2+n)·n mix dot products and the squared norm in 64 splits per token; hc_pre_f32: coefficients, Sinkhorn, u) and the sub-block's input RMSNorm as a third kernel (rms_norm_f32 reading u): the previous sub-block's post computes the next pre's mix partials over the streams it writes (hc_post_mix_f32, partials per 64-channel run, the post's bits unchanged), and the pre's finish is a warp per token for the coefficients and Sinkhorn (hc_pre_coef_f32, which also keeps post and comb as doubles for the post) and a kernel that norms u in registers (hc_pre_norm_f32): the bits of hc_pre_f32 + rms_norm_f32 on the same partials; hidden size <= 8,192",
        parity: "gpu-check (`--only mhc`) `hc_pre fused …` records vs the CPU reference (u normed, post, comb), `hc_post_mix_f32 x bits` (= hc_post_f32), `hc_pre_norm bits` (= hc_pre_f32 + rms_norm_f32 on the same partials), `hc_pre_norm post/comb records` (the doubles = the f32 values), batch invariance (T=7 bits), other stream counts and widths; the switch matrix and qualify (`MHC_FUSED=off alone`: exact, other bits: the mix sums run in another order, and for rows of <= 1,024 values the norm's too)",
    },
    Switch {
        name: "MHC_BF16_STREAMS",
        values: &["off", "on"],
        aliases: ON_OFF_ALIASES,
        replaces: "the f32 residual streams [T, n, d] between sub-blocks: stored as bf16, as DeepSeek's reference keeps them (spec §4.1 \"stored in the activation dtype (bf16 in OFF-M)\", §4.3 \"cast back to the stream dtype\"): the post (hc_post_mix_bf16, hc_post_bf16) computes in f32 as OFF-M does (the exact path: f64), rounds to bf16 (nearest even) and computes the next pre's mix partials over the rounded values, the pre (hc_pre_norm_bf16) reads them; the embedding rows are gathered as bf16 (exact for a bf16 embedding) and the head widens the rows it reads — half the bytes the mHC kernels move (n·d·2 instead of ·4 per token, read and written by each post, read by each pre); not exact, off by default; acts with MHC_FUSED (its kernels) only, so not for hidden sizes above 8,192",
        parity: "gpu-check (`--only mhc`) `hc_post_mix_bf16 x bits` / `hc_post_bf16 x bits` (= the f32 post replayed on the host, rounded to bf16), `hc_post_mix_bf16 x vs hc_post_mix_f32` (NMSE against the exact post), `hc_post_mix_bf16 partials bits` (= hc_post_mix_f32's mix alone over the widened stored streams, through the fused finish), `hc_post_mix_bf16 T=7 bits` (batch invariance), `hc_pre_norm_bf16 bits` (= hc_pre_norm_f32 on the widened streams), `hc_gather_bf16 bits` / `hc_widen_bf16 bits`, `hc_pre fused bf16 …` vs the CPU on bf16-rounded streams; the switch matrix and qualify (reported, not judged)",
    },
    Switch {
        name: "MHC_MIX_TC",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "with MHC_BF16_STREAMS: the next pre's mix dot products on the CUDA cores (hc_post_mix_bf16: fmaf chains per lane, a tree over the lanes, per 64-channel run): on tensor cores (hc_post_mix_tc_bf16: mma.sync m16n8k16 over the stored bf16 streams — exact operands — and Φ split into three bf16 planes that add up to it exactly, f32 accumulation; per 128-channel run), the post's stored bits unchanged; f32-accurate sums in another order, so not the bits of the CUDA-core mix; hidden sizes that are multiples of 8",
        parity: "gpu-check (`--only mhc`) `hc_post_mix_tc x bits` (= hc_post_mix_bf16's streams), `hc_post_mix_tc … vs the CUDA-core mix` and `hc_pre fused bf16 tc …` vs the CPU on the same streams (NMSE), `hc_post_mix_tc T=7 bits` (batch invariance); host tests `phi_planes_are_exact`, `phi_tc_fragments_multiply_as_mma`; the switch matrix (`MHC_MIX_TC=off alone` with the serving numerics)",
    },
    Switch {
        name: "MOE_PERSISTENT",
        values: &["on", "off"],
        aliases: ON_OFF_ALIASES,
        replaces: "one block per (expert tile, column tile) work unit: a grid of a few blocks per SM walking the on-device queue of non-empty tiles (grouped MoE only)",
        parity: "gpu-check `moe_grouped …` records with both grids (same bits, checked), the switch matrix",
    },
];

/// Errors of the registry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwitchError {
    /// No switch of that name.
    #[error("unknown switch `{0}` (known: {known})", known = SWITCHES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "))]
    Unknown(String),
    /// A value the switch does not accept.
    #[error("switch {name} does not accept `{value}` (from {source_}); accepted: {accepted}")]
    BadValue {
        /// Switch name.
        name: &'static str,
        /// The rejected value.
        value: String,
        /// Where it came from (flag or env var).
        source_: String,
        /// Accepted values.
        accepted: String,
    },
    /// `--switch` without `=`.
    #[error("`--switch {0}`: expected NAME=VALUE")]
    Syntax(String),
    /// An override after the values were resolved.
    #[error("switch {0} set after the switches were read (set overrides before running anything)")]
    TooLate(&'static str),
}

/// The switch named `name` (case-insensitive, `FLASHSEEK_` prefix allowed).
pub fn find(name: &str) -> Result<&'static Switch, SwitchError> {
    let n = name.trim().to_ascii_uppercase();
    let n = n.strip_prefix("FLASHSEEK_").unwrap_or(&n);
    SWITCHES.iter().find(|s| s.name == n).ok_or_else(|| SwitchError::Unknown(name.to_string()))
}

fn bad_value(s: &Switch, value: &str, source: String) -> SwitchError {
    SwitchError::BadValue { name: s.name, value: value.to_string(), source_: source, accepted: s.accepted() }
}

static OVERRIDES: Mutex<Option<HashMap<&'static str, &'static str>>> = Mutex::new(None);
static RESOLVED: OnceLock<HashMap<&'static str, (&'static str, Origin)>> = OnceLock::new();

/// Where a resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// The environment variable.
    Env,
    /// A `--switch` flag.
    Flag,
}

/// Sets `NAME=VALUE` (the CLI's `--switch`), overriding the environment. Must run before any
/// switch is read.
///
/// Errors: syntax, unknown switch, value not accepted, or values already resolved.
pub fn set_override(spec: &str) -> Result<(), SwitchError> {
    let (name, value) = spec.split_once('=').filter(|(n, _)| !n.trim().is_empty()).ok_or_else(|| SwitchError::Syntax(spec.to_string()))?;
    let s = find(name)?;
    let v = s.normalise(value).ok_or_else(|| bad_value(s, value, format!("--switch {spec}")))?;
    if RESOLVED.get().is_some() {
        return Err(SwitchError::TooLate(s.name));
    }
    OVERRIDES.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(s.name, v);
    Ok(())
}

/// The environment value of a switch: None when unset or empty (both mean "the default").
fn env_value(s: &Switch) -> Option<String> {
    std::env::var(s.env_var()).ok().filter(|v| !v.trim().is_empty())
}

/// `FLASHSEEK_*` variables that are not switches: the model cache, the build's commit, the test
/// and script settings, and the kernels' development knob `FLASHSEEK_KERNEL_DEFINES` (timing
/// variants compiled in; `cuda::nvrtc::full_source`).
pub const OTHER_VARIABLES: &[&str] = &["FLASHSEEK_CACHE", "FLASHSEEK_COMMIT", "FLASHSEEK_REQUIRE_NVRTC", "FLASHSEEK_URL", "FLASHSEEK_API_KEY", "FLASHSEEK_BIN", KERNEL_DEFINES_VAR];

/// The environment variable of the kernels' compile-time variants (`cuda::nvrtc::full_source`).
pub const KERNEL_DEFINES_VAR: &str = "FLASHSEEK_KERNEL_DEFINES";

/// Variable names in `vars` that start with `FLASHSEEK_` in any case but are neither a switch's
/// variable nor one of [`OTHER_VARIABLES`] as spelt (a misspelt or lower-case switch would otherwise
/// be ignored without a word), sorted. Names that are not valid UTF-8 are skipped.
pub fn unknown_variables(vars: impl Iterator<Item = std::ffi::OsString>) -> Vec<String> {
    let mut v: Vec<String> = vars
        .filter_map(|k| k.into_string().ok())
        .filter(|k| k.to_ascii_uppercase().starts_with("FLASHSEEK_"))
        .filter(|k| !OTHER_VARIABLES.contains(&k.as_str()) && !SWITCHES.iter().any(|s| s.env_var() == *k))
        .collect();
    v.sort();
    v
}

/// The known variable an [`unknown_variables`] name was probably meant to be: the same name in
/// upper case, or the switch or setting variable within two edits of its upper-case spelling
/// (the closest; `None` when there is none or two are equally close).
pub fn variable_suggestion(name: &str) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    let known: Vec<String> = OTHER_VARIABLES.iter().map(|k| k.to_string()).chain(SWITCHES.iter().map(|s| s.env_var())).collect();
    if let Some(k) = known.iter().find(|k| **k == upper) {
        return Some(k.clone());
    }
    let mut best: Option<(usize, &String, bool)> = None;
    for k in &known {
        // Names whose lengths differ by more than two are more than two edits apart.
        if upper.len().abs_diff(k.len()) > 2 {
            continue;
        }
        let d = edit_distance(&upper, k);
        match best {
            Some((bd, _, _)) if d > bd => {}
            Some((bd, bk, _)) if d == bd => best = Some((bd, bk, true)),
            _ => best = Some((d, k, false)),
        }
    }
    match best {
        Some((d, k, false)) if d <= 2 => Some(k.clone()),
        _ => None,
    }
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Checks every `FLASHSEEK_<NAME>` variable that is set (and not empty), except those of switches a
/// `--switch` flag already set ([`set_override`]; the flag wins, so a stale variable does not
/// matter).
///
/// Errors: the first value a switch does not accept.
pub fn check_environment() -> Result<(), SwitchError> {
    let flags = OVERRIDES.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
    for s in SWITCHES {
        if flags.contains_key(s.name) {
            continue;
        }
        if let Some(raw) = env_value(s) {
            if s.normalise(&raw).is_none() {
                return Err(bad_value(s, &raw, s.env_var()));
            }
        }
    }
    Ok(())
}

fn resolved() -> &'static HashMap<&'static str, (&'static str, Origin)> {
    RESOLVED.get_or_init(|| {
        let flags = OVERRIDES.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
        SWITCHES
            .iter()
            .map(|s| {
                let v = if let Some(v) = flags.get(s.name) {
                    (*v, Origin::Flag)
                } else {
                    match env_value(s).and_then(|raw| s.normalise(&raw)) {
                        Some(v) => (v, Origin::Env),
                        None => (s.default_value(), Origin::Default),
                    }
                };
                (s.name, v)
            })
            .collect()
    })
}

thread_local! {
    static SCOPED: std::cell::RefCell<Vec<(&'static str, &'static str)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with switch values overridden on this thread (`[(name, value)]`; later entries win),
/// e.g. a parity check comparing every switch configuration in one process. Values read inside
/// `f` report [`Origin::Flag`].
///
/// Errors: an unknown switch or a value it does not accept (then `f` does not run).
pub fn scoped<R>(overrides: &[(&str, &str)], f: impl FnOnce() -> R) -> Result<R, SwitchError> {
    let mut resolved_pairs = Vec::with_capacity(overrides.len());
    for (name, value) in overrides {
        let s = find(name)?;
        let v = s.normalise(value).ok_or_else(|| bad_value(s, value, "a scoped override".into()))?;
        resolved_pairs.push((s.name, v));
    }
    let saved = SCOPED.with(|c| std::mem::replace(&mut *c.borrow_mut(), resolved_pairs));
    struct Restore(Option<Vec<(&'static str, &'static str)>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(v) = self.0.take() {
                SCOPED.with(|c| *c.borrow_mut() = v);
            }
        }
    }
    let _restore = Restore(Some(saved));
    Ok(f())
}

/// The value of switch `name` (one of its [`Switch::values`]) and its origin: a [`scoped`]
/// override on this thread, else the process value.
///
/// Panics only on a name that is not registered (a programming error caught by the tests).
pub fn value_of(name: &str) -> (&'static str, Origin) {
    if let Some(v) = SCOPED.with(|c| c.borrow().iter().rev().find(|(n, _)| *n == name).map(|(_, v)| *v)) {
        return (v, Origin::Flag);
    }
    *resolved().get(name).unwrap_or_else(|| panic!("switch {name} is not registered"))
}

/// The command line that reproduces this process's switch values, for reports' `command` field:
/// `FLASHSEEK_<NAME>=<value>` for each switch set through the environment (those set by
/// `--switch` are among the arguments) and `FLASHSEEK_KERNEL_DEFINES` when set (the kernels then
/// differ from the build's), then `args` (the process's arguments), space-separated.
pub fn reproducible_command(args: impl IntoIterator<Item = String>) -> String {
    let mut env: Vec<(String, String)> = SWITCHES
        .iter()
        .filter_map(|s| {
            let (v, origin) = value_of(s.name);
            (origin == Origin::Env).then(|| (s.env_var(), v.to_string()))
        })
        .collect();
    if let Some(d) = std::env::var(KERNEL_DEFINES_VAR).ok().filter(|v| !v.trim().is_empty()) {
        env.push((KERNEL_DEFINES_VAR.to_string(), shell_word(&d)));
    }
    with_env_prefix(&env, args)
}

/// `v` as one POSIX shell word: as is when it holds only ASCII letters, digits and `_=,.:/+-`, else
/// in single quotes (a quote inside closed, escaped and reopened).
fn shell_word(v: &str) -> String {
    if !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || "_=,.:/+-".contains(c)) {
        return v.to_string();
    }
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// `NAME=value` for each pair, then the arguments, space-separated.
fn with_env_prefix(env: &[(String, String)], args: impl IntoIterator<Item = String>) -> String {
    env.iter().map(|(n, v)| format!("{n}={v}")).chain(args).collect::<Vec<_>>().join(" ")
}

/// The value of switch `name` (see [`value_of`]).
pub fn value(name: &str) -> &'static str {
    value_of(name).0
}

/// Whether an on/off switch is on.
pub fn on(name: &str) -> bool {
    value(name) == "on"
}

/// A switch and the values it must have for another to act.
pub type Requirement = (&'static str, &'static [&'static str]);

/// Switches that act only when others have given values: (switch, [(required switch, values it
/// must have)]). Read from the code paths that consult each switch (`cuda/model.rs`,
/// `ops_moe.rs`, `ops_q8.rs`, `ops_attention.rs`, `gpu.rs`).
pub const REQUIRES: &[(&str, &[Requirement])] = &[
    ("DECODE_CUDA_GRAPH", &[("MOE_GROUPED", &["on"]), ("MOE_GROUPED_DECODE", &["on"])]),
    ("MOE_GROUPED_DECODE", &[("MOE_GROUPED", &["on"])]),
    // Below 64 tokens only the grouped decode path reaches it (64 tokens of top-6 are past its 192 pairs).
    ("MOE_DECODE_GEMV", &[("MOE_GROUPED", &["on"]), ("MOE_GROUPED_DECODE", &["on"])]),
    ("MOE_GEMV_MMA", &[("TC_LINEAR", &["fp8"]), ("MOE_GROUPED", &["on"]), ("MOE_GROUPED_DECODE", &["on"]), ("MOE_DECODE_GEMV", &["on"])]),
    ("MOE_FUSED_SWIGLU", &[("MOE_GROUPED", &["on"])]),
    ("MOE_ADAPTIVE_TILES", &[("MOE_GROUPED", &["on"])]),
    ("MOE_PERSISTENT", &[("MOE_GROUPED", &["on"])]),
    ("FP8_WGMMA", &[("TC_LINEAR", &["fp8"])]),
    ("LINEAR_FUSED_QUANT", &[("TC_LINEAR", &["fp8"])]),
    ("LINEAR_GEMV_MMA", &[("TC_LINEAR", &["fp8"])]),
    ("MOE_FP8_WS", &[("TC_LINEAR", &["fp8"]), ("FP8_WGMMA", &["on"]), ("MOE_GROUPED", &["on"])]),
    // Its 256-row tiles are an adaptive choice (ops_q8::wt_tiles; only checks force them).
    ("MOE_FP8_WT", &[("TC_LINEAR", &["fp8"]), ("FP8_WGMMA", &["on"]), ("MOE_GROUPED", &["on"]), ("MOE_FP8_WS", &["on"]), ("MOE_ADAPTIVE_TILES", &["on"])]),
    ("MOE_DOWN_BF16_OUT", &[("TC_LINEAR", &["fp8"]), ("FP8_WGMMA", &["on"]), ("MOE_GROUPED", &["on"]), ("MOE_FP8_WS", &["on"]), ("MOE_ADAPTIVE_TILES", &["on"]), ("MOE_FP8_WT", &["on"])]),
    // Under TC_LINEAR=off the grouped MoE still runs split activations (ops_mhc.rs moe_forward).
    ("MOE_BF16_WS", &[("TC_LINEAR", &["split", "off"]), ("BF16_WGMMA", &["on"]), ("MOE_GROUPED", &["on"])]),
    ("FP8_CUBLASLT", &[("TC_LINEAR", &["fp8"])]),
    ("LINEAR_CUBLASLT", &[("TC_LINEAR", &["split", "fp8"])]),
    ("MLA_STREAM_FAST_EXP", &[("MLA_STREAM_TOPK", &["on"])]),
    ("MLA_BF16", &[("MLA_STREAM_TOPK", &["on"])]),
    ("MLA_BF16_CAND_SPLIT", &[("MLA_STREAM_TOPK", &["on"]), ("MLA_BF16", &["on"])]),
    ("MLA_SPLIT_OUT", &[("MLA_STREAM_TOPK", &["on"]), ("LINEAR_CUBLASLT", &["on"]), ("TC_LINEAR", &["split", "fp8"])]),
    ("MLA_FUSED_Q_NORM", &[("MLA_STREAM_TOPK", &["on"])]),
    ("WQ_B_BF16_OUT", &[("TC_LINEAR", &["fp8"]), ("MLA_STREAM_TOPK", &["on"]), ("MLA_FUSED_Q_NORM", &["on"])]),
    ("WO_A_FP8", &[("TC_LINEAR", &["fp8"]), ("FP8_CUBLASLT", &["on"]), ("MLA_STREAM_TOPK", &["on"]), ("MLA_BF16", &["on"]), ("MLA_BF16_CAND_SPLIT", &["on"])]),
    ("COMPRESSOR_BF16", &[("TC_LINEAR", &["split", "fp8"])]),
    ("MHC_BF16_STREAMS", &[("MHC_FUSED", &["on"])]),
    ("MHC_MIX_TC", &[("MHC_FUSED", &["on"]), ("MHC_BF16_STREAMS", &["on"])]),
    ("INDEXER_STREAM_TOPK", &[("INDEXER_TC", &["on"]), ("INDEXER_FP8", &["off"])]),
    ("INDEXER_TC_DECODE_TILES", &[("INDEXER_TC", &["on"])]),
];

/// Switches that act when *any* of the listed values holds (alternatives [`REQUIRES`] cannot
/// state); an alternative `X=on` holds only while X itself acts. `BF16_WGMMA` runs the tensor-core
/// linears (TC_LINEAR not off) and the grouped MoE; `INDEXER_WGMMA` the exact streaming top-k
/// (`INDEXER_STREAM_TOPK` acting: `INDEXER_TC` on, `INDEXER_FP8` off) and the FP8 one.
pub const REQUIRES_ANY: &[(&str, &[Requirement])] = &[
    ("BF16_WGMMA", &[("TC_LINEAR", &["split", "bf16", "fp8"]), ("MOE_GROUPED", &["on"])]),
    ("INDEXER_WGMMA", &[("INDEXER_STREAM_TOPK", &["on"]), ("INDEXER_FP8", &["on"])]),
    // The candidate-split bf16 kernel's softmax is on ex2.approx whatever this switch says.
    ("MLA_STREAM_FAST_EXP", &[("MLA_BF16", &["off"]), ("MLA_BF16_CAND_SPLIT", &["off"])]),
];

/// Why switch `name` has no effect with the current values, if it has none: every switch it
/// requires ([`REQUIRES`]) that has another value, in the order listed, e.g. `needs
/// MOE_GROUPED_DECODE=on` or `needs INDEXER_TC=on and INDEXER_FP8=off` (a [`REQUIRES`] entry asks
/// only for the value, not that the named switch acts itself), or all of its alternatives
/// ([`REQUIRES_ANY`]) unmet, e.g. `needs TC_LINEAR=split or bf16 or fp8, or MOE_GROUPED=on`; an
/// alternative `X=on` that is set while X does not act reads `X=on (set, but idle: <why>)`,
/// e.g. `needs INDEXER_STREAM_TOPK=on (set, but idle: needs INDEXER_TC=on), or INDEXER_FP8=on`.
pub fn inactive_because(name: &str) -> Option<String> {
    let unmet = |(r, vals): &&Requirement| !vals.contains(&value(r));
    let say = |(r, vals): &Requirement| format!("{r}={}", vals.join(" or "));
    if let Some((_, reqs)) = REQUIRES.iter().find(|(n, _)| *n == name) {
        let missing: Vec<String> = reqs.iter().filter(unmet).map(say).collect();
        if !missing.is_empty() {
            return Some(format!("needs {}", missing.join(" and ")));
        }
    }
    let (_, any) = REQUIRES_ANY.iter().find(|(n, _)| *n == name)?;
    // An alternative X=on that is set but does not act says why (REQUIRES_ANY lists no cycles).
    let why_not = |r: &Requirement| -> Option<String> {
        if unmet(&r) {
            return Some(say(r));
        }
        let on_but_idle = r.1 == ["on"] && r.0 != name;
        on_but_idle.then(|| inactive_because(r.0)).flatten().map(|w| format!("{} (set, but idle: {w})", say(r)))
    };
    let reasons: Vec<String> = any.iter().map(why_not).collect::<Option<Vec<_>>>()?;
    Some(format!("needs {}", reasons.join(", or ")))
}

/// Prefill chunk with `LONG_CONTEXT_CHUNK` on (tokens). Measured on the H200 (20 Flash layers,
/// `TC_LINEAR=fp8 MLA_BF16=on INDEXER_FP8=on`): 24,448 / 26,536 / 27,296 prefill tok/s at 32K and
/// 21,308 / 22,812 / 23,508 at 128K with 8,192-, 16,384- and 32,768-token chunks (the first at
/// 15c1d3c, the others at 6fcd719: `bench/gpu_bench_h200_20layers_fp8_bf16att_idx8_chunk*`); the
/// grouped MoE layer alone 413 / 437 / 460 TFLOP/s at those token counts
/// (`bench/moe_chunks_h200.json`). docs/SWITCHES.md `LONG_CONTEXT_CHUNK` has the citations.
pub const LONG_CONTEXT_CHUNK_TOKENS: usize = 32768;
/// Prefill chunk with `LONG_CONTEXT_CHUNK` off (tokens).
pub const SHORT_CONTEXT_CHUNK_TOKENS: usize = 2048;
/// The most prompt tokens `serve` prefills per scheduler step by default (with `LONG_CONTEXT_CHUNK`
/// on): a step's prefill delays every running sequence's next token, so the server keeps the
/// budget of the serving stacks' chunked prefill (vLLM's `max_num_batched_tokens`, SGLang's
/// `chunked_prefill_size`: a few thousand to 16K tokens) rather than the 32,768-token chunk that
/// is fastest for one prompt alone (`--prefill-chunk` sets it).
pub const SERVE_PREFILL_CHUNK_TOKENS: usize = 8192;

/// The prefill chunk the switches ask for: [`LONG_CONTEXT_CHUNK_TOKENS`] with `LONG_CONTEXT_CHUNK`
/// on (default), else [`SHORT_CONTEXT_CHUNK_TOKENS`].
pub fn prefill_chunk_tokens() -> usize {
    if on("LONG_CONTEXT_CHUNK") {
        LONG_CONTEXT_CHUNK_TOKENS
    } else {
        SHORT_CONTEXT_CHUNK_TOKENS
    }
}

/// `serve`'s default prefill budget per scheduler step on CUDA: [`prefill_chunk_tokens`] capped at
/// [`SERVE_PREFILL_CHUNK_TOKENS`] (8,192 with `LONG_CONTEXT_CHUNK` on, 2,048 with it off).
pub fn serve_prefill_chunk_tokens() -> usize {
    prefill_chunk_tokens().min(SERVE_PREFILL_CHUNK_TOKENS)
}

/// Which configurations of the switches the parity matrix (`gpu-check --only switches`) and the
/// qualification (`flashseek qualify`) compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every optimisation off: the exact kernels everything else is compared with.
    Baseline,
    /// One optimisation on, the others off.
    AloneOn,
    /// The defaults.
    AllOn,
    /// One optimisation off, the others at their defaults.
    AloneOff,
    /// The defaults plus an off-by-default variant: another `TC_LINEAR` mode (the inexact `bf16`;
    /// `fp8` alone is [`Role::OfficialAllOn`]), a faster inexact kernel (`MLA_STREAM_FAST_EXP`,
    /// `INDEXER_FP8`, `MLA_BF16`) or an exact one not on by default.
    Fast,
    /// The defaults with `TC_LINEAR=fp8` (official numerics): the run that official configurations
    /// promising the same bits ([`Configuration::same_bits_as_all_on`]) are compared with.
    OfficialAllOn,
}

/// One switch configuration of the comparison matrix.
#[derive(Debug, Clone)]
pub struct Configuration {
    /// Label in reports.
    pub label: String,
    /// Switch values set (through [`scoped`]); the rest stay at their defaults.
    pub overrides: Vec<(&'static str, &'static str)>,
    /// Its place in the matrix.
    pub role: Role,
    /// The design promises its reference's tokens end to end (everything but `TC_LINEAR=bf16`,
    /// `MLA_STREAM_FAST_EXP=on`, `INDEXER_FP8=on`, `MLA_BF16=on` and `TC_LINEAR=fp8`; the latter's parity is judged per GEMM and per
    /// MoE layer, see `forward::tests::official_numerics_amplify_last_bit_differences`).
    pub exact: bool,
    /// Its reference is DeepSeek's official numerics (`TC_LINEAR=fp8`: the CPU forward with
    /// `Numerics { act_quant_fp8 }`), not the HF numerics of the baseline: its tokens are not
    /// expected to equal the baseline's.
    pub official: bool,
    /// The design promises the same bits as [`Role::AllOn`] (MoE fusion, tile height, grid), or for
    /// an official configuration as [`Role::OfficialAllOn`] (it runs after that one).
    pub same_bits_as_all_on: bool,
    /// Runs the per-expert MoE or f32 kernels everywhere: slow at long prompts.
    pub slow: bool,
}

/// The run whose logits bits a configuration promises, as reports name it: `all on (defaults)`, for
/// an official configuration `all on, TC_LINEAR=fp8` ([`Role::OfficialAllOn`]), `-` without a promise
/// ([`Configuration::same_bits_as_all_on`]).
pub fn bits_reference(same_bits_as_all_on: bool, official: bool) -> &'static str {
    match (same_bits_as_all_on, official) {
        (false, _) => "-",
        (true, true) => "all on, TC_LINEAR=fp8",
        (true, false) => "all on (defaults)",
    }
}

/// The comparison matrix: all off, each optimisation alone on, all on, each switch alone off, and
/// all on with `TC_LINEAR=bf16`.
pub fn configurations() -> Vec<Configuration> {
    const OFF: [(&str, &str); 4] = [("TC_LINEAR", "off"), ("MLA_STREAM_TOPK", "off"), ("INDEXER_TC", "off"), ("MOE_GROUPED", "off")];
    let c = |label: String, overrides: Vec<(&'static str, &'static str)>, role, exact, same_bits_as_all_on, slow| {
        let official = overrides.contains(&("TC_LINEAR", "fp8"));
        Configuration { label, overrides, role, exact, official, same_bits_as_all_on, slow }
    };
    let mut v = vec![c("all off (baseline: exact kernels)".into(), OFF.to_vec(), Role::Baseline, true, false, true)];
    for (name, value) in [("TC_LINEAR", "split"), ("TC_LINEAR", "bf16"), ("TC_LINEAR", "fp8"), ("MLA_STREAM_TOPK", "on"), ("INDEXER_TC", "on"), ("MOE_GROUPED", "on")] {
        let mut o = OFF.to_vec();
        o.push((name, value));
        v.push(c(format!("{name}={value} alone"), o, Role::AloneOn, value != "bf16" && value != "fp8", false, true));
    }
    v.push(c("all on (defaults)".into(), Vec::new(), Role::AllOn, true, false, false));
    for (name, same_bits) in [
        ("TC_LINEAR", false),
        ("MLA_STREAM_TOPK", false),
        ("INDEXER_TC", false),
        ("MOE_GROUPED", false),
        ("MOE_FUSED_SWIGLU", true),
        ("MOE_ADAPTIVE_TILES", true),
        ("MOE_PERSISTENT", true),
        ("MOE_BF16_WS", true),
        ("LONG_CONTEXT_CHUNK", true),
        ("DIRECT_INDEXER_TOPK", true),
        ("INDEXER_STREAM_TOPK", true),
        ("INDEXER_WGMMA", true),
        ("MLA_SPLIT_OUT", true),
        ("MLA_FUSED_Q_NORM", true),
        ("MHC_FUSED", false),
    ] {
        v.push(c(format!("{name}=off alone"), vec![(name, "off")], Role::AloneOff, true, same_bits, matches!(name, "MOE_GROUPED" | "TC_LINEAR")));
    }
    // Decode steps: the per-expert MoE (other kernels, exact) and launching kernel by kernel (the
    // same kernels as the graphs: the same bits).
    v.push(c("MOE_GROUPED_DECODE=off alone".into(), vec![("MOE_GROUPED_DECODE", "off")], Role::AloneOff, true, false, false));
    v.push(c("DECODE_CUDA_GRAPH=off alone".into(), vec![("DECODE_CUDA_GRAPH", "off")], Role::AloneOff, true, true, false));
    // The grouped wo_a below 64 tokens gathered per group: the same gemv on the same values.
    v.push(c("WO_A_STRIDED=off alone".into(), vec![("WO_A_STRIDED", "off")], Role::AloneOff, true, true, false));
    // indexer_scores_tc with fewer keys per block at decode: the same tile code per key.
    v.push(c("INDEXER_TC_DECODE_TILES=off alone".into(), vec![("INDEXER_TC_DECODE_TILES", "off")], Role::AloneOff, true, true, false));
    // The decode compressors' gemvs in one launch straight into the states: the same row code.
    v.push(c("COMPRESSOR_FUSED_DECODE=off alone".into(), vec![("COMPRESSOR_FUSED_DECODE", "off")], Role::AloneOff, true, true, false));
    // The one-token gemvs taking their rows one after another: the same sums, the same bits.
    v.push(c("LINEAR_T1_PREFETCH=off alone".into(), vec![("LINEAR_T1_PREFETCH", "off")], Role::AloneOff, true, true, false));
    // The decode MoE's gemvs: the grouped GEMMs' definition (exact, or the official numerics), other bits.
    v.push(c("MOE_DECODE_GEMV=off alone".into(), vec![("MOE_DECODE_GEMV", "off")], Role::AloneOff, true, false, false));
    v.push(c("MOE_DECODE_GEMV=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("MOE_DECODE_GEMV", "off")], Role::AloneOff, false, false, false));
    // … and its official gemvs' group sums on CUDA cores instead of the tensor cores: other bits.
    v.push(c("MOE_GEMV_MMA=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("MOE_GEMV_MMA", "off")], Role::AloneOff, false, false, false));
    // The official small-batch FP8 linears' block sums on CUDA cores instead of the tensor cores.
    v.push(c("LINEAR_GEMV_MMA=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("LINEAR_GEMV_MMA", "off")], Role::AloneOff, false, false, false));
    // The bf16 wgmma kernels give the mma.sync kernels' bits (measured per GEMM and MoE layer on
    // H200, asserted by gpu-check): the same bits end to end.
    v.push(c("BF16_WGMMA=off alone".into(), vec![("BF16_WGMMA", "off")], Role::AloneOff, true, true, false));
    // FP8_WGMMA only matters under TC_LINEAR=fp8.
    v.push(c("FP8_WGMMA=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("FP8_WGMMA", "off")], Role::AloneOff, false, false, false));
    v.push(c("FP8_CUBLASLT=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("FP8_CUBLASLT", "off")], Role::AloneOff, false, false, false));
    v.push(c("LINEAR_CUBLASLT=off alone".into(), vec![("LINEAR_CUBLASLT", "off")], Role::AloneOff, true, false, false));
    // MLA_STREAM_FAST_EXP and INDEXER_FP8 are off by default (not exact): each on, with the other
    // defaults.
    v.push(c("MLA_STREAM_FAST_EXP=on (with the defaults)".into(), vec![("MLA_STREAM_FAST_EXP", "on")], Role::Fast, false, false, false));
    v.push(c("INDEXER_FP8=on (with the defaults)".into(), vec![("INDEXER_FP8", "on")], Role::Fast, false, false, false));
    // MLA_BF16 (off by default, not exact): on with the defaults, and with the official numerics
    // whose attention (OFF-K) it follows.
    v.push(c("MLA_BF16=on (with the defaults)".into(), vec![("MLA_BF16", "on")], Role::Fast, false, false, false));
    v.push(c("all on, TC_LINEAR=bf16".into(), vec![("TC_LINEAR", "bf16")], Role::Fast, false, false, false));
    v.push(c("all on, TC_LINEAR=fp8 (official numerics)".into(), vec![("TC_LINEAR", "fp8")], Role::OfficialAllOn, false, false, false));
    // The warp-specialised grouped FP8 MoE runs the same MMAs and promotion as moe_w8: the same bits
    // as the official all-on run above.
    v.push(c("MOE_FP8_WS=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("MOE_FP8_WS", "off")], Role::AloneOff, false, true, false));
    // The 256-row tiles run moe_ws's MMAs and promotion per 64-row sub-tile: the same bits again.
    v.push(c("MOE_FP8_WT=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("MOE_FP8_WT", "off")], Role::AloneOff, false, true, false));
    // The official small-batch linears with the input's copy and quantize-dequantize launched
    // apart: the same gemv on the same values, the same bits as the official all-on run.
    v.push(c("LINEAR_FUSED_QUANT=off alone (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("LINEAR_FUSED_QUANT", "off")], Role::AloneOff, false, true, false));
    v.push(c("MLA_BF16=on (with TC_LINEAR=fp8)".into(), vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on")], Role::Fast, false, false, false));
    // The serving stacks' numerics: FP8 GEMMs, bf16 attention, FP8 indexer scores (spec §9).
    v.push(c("INDEXER_FP8=on (with TC_LINEAR=fp8 and MLA_BF16=on)".into(), vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on")], Role::Fast, false, false, false));
    // The wq_b output in bf16 (off by default, not exact) with the serving stacks' numerics (the
    // matrix's 200-token prompts take the rounding pass, below cuBLASLt's 256 tokens; qualify's
    // prompts the bf16-output GEMM).
    v.push(c(
        "WQ_B_BF16_OUT=on (with TC_LINEAR=fp8, MLA_BF16=on and INDEXER_FP8=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on")],
        Role::Fast,
        false,
        false,
        false,
    ));
    // bf16 residual streams (off by default, not exact): with the defaults, and with the serving
    // stacks' numerics (bench-serving's configuration).
    v.push(c("MHC_BF16_STREAMS=on (with the defaults)".into(), vec![("MHC_BF16_STREAMS", "on")], Role::Fast, false, false, false));
    v.push(c(
        "MHC_BF16_STREAMS=on (with TC_LINEAR=fp8, MLA_BF16=on, INDEXER_FP8=on and WQ_B_BF16_OUT=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on")],
        Role::Fast,
        false,
        false,
        false,
    ));
    // The bf16 streams' mix on the CUDA cores (MHC_MIX_TC, on by default, acts only with them).
    v.push(c(
        "MHC_MIX_TC=off alone (with TC_LINEAR=fp8, MLA_BF16=on, INDEXER_FP8=on, WQ_B_BF16_OUT=on and MHC_BF16_STREAMS=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on"), ("MHC_MIX_TC", "off")],
        Role::AloneOff,
        false,
        false,
        false,
    ));
    // wo_a in FP8 (off by default, not exact) with the serving configuration (bench-serving's
    // switches): the matrix's 200-token prompts stay below cuBLASLt's 256 tokens (plumbing only),
    // qualify's reach it.
    v.push(c(
        "WO_A_FP8=on (with TC_LINEAR=fp8, MLA_BF16=on, INDEXER_FP8=on, WQ_B_BF16_OUT=on and MHC_BF16_STREAMS=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on"), ("WO_A_FP8", "on")],
        Role::Fast,
        false,
        false,
        false,
    ));
    // The compressors' projections on the bf16-rounded input (off by default, not exact), with the
    // serving configuration (bench-serving's switches).
    v.push(c(
        "COMPRESSOR_BF16=on (with TC_LINEAR=fp8, MLA_BF16=on, INDEXER_FP8=on, WQ_B_BF16_OUT=on, MHC_BF16_STREAMS=on and WO_A_FP8=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on"), ("WO_A_FP8", "on"), ("COMPRESSOR_BF16", "on")],
        Role::Fast,
        false,
        false,
        false,
    ));
    // The routed down projection's rows in bf16 (off by default, not exact), with the serving
    // configuration (plumbing only in the matrix: its 200-token prompts do not reach the 256-row
    // tiles; qualify's do).
    v.push(c(
        "MOE_DOWN_BF16_OUT=on (with TC_LINEAR=fp8, MLA_BF16=on, INDEXER_FP8=on, WQ_B_BF16_OUT=on, MHC_BF16_STREAMS=on and WO_A_FP8=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on"), ("WO_A_FP8", "on"), ("MOE_DOWN_BF16_OUT", "on")],
        Role::Fast,
        false,
        false,
        false,
    ));
    // The MLA_BF16 rows above run the candidate-split kernel (MLA_BF16_CAND_SPLIT's default); its
    // predecessor with the serving stacks' numerics.
    v.push(c(
        "MLA_BF16_CAND_SPLIT=off alone (with TC_LINEAR=fp8, MLA_BF16=on and INDEXER_FP8=on)".into(),
        vec![("TC_LINEAR", "fp8"), ("MLA_BF16", "on"), ("INDEXER_FP8", "on"), ("MLA_BF16_CAND_SPLIT", "off")],
        Role::AloneOff,
        false,
        false,
        false,
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switch_is_well_formed() {
        let mut names = std::collections::HashSet::new();
        for s in SWITCHES {
            assert!(names.insert(s.name), "{} registered twice", s.name);
            assert!(!s.values.is_empty());
            assert_eq!(s.normalise(s.default_value()), Some(s.default_value()));
            for (alias, target) in s.aliases {
                assert!(s.values.contains(target), "{}: alias {alias} → {target} is not a value", s.name);
            }
            assert!(s.env_var().starts_with("FLASHSEEK_"));
            assert!(!s.replaces.is_empty() && !s.parity.is_empty());
        }
    }

    #[test]
    fn reproducible_commands_put_environment_switches_first() {
        let env = [("FLASHSEEK_TC_LINEAR", "fp8"), ("FLASHSEEK_MLA_BF16", "on")].map(|(n, v)| (n.to_string(), v.to_string()));
        let args = ["flashseek", "gpu-bench", "--layers", "20"].map(String::from);
        assert_eq!(with_env_prefix(&env, args.clone()), "FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_MLA_BF16=on flashseek gpu-bench --layers 20");
        assert_eq!(with_env_prefix(&[], args), "flashseek gpu-bench --layers 20");
    }

    /// Kernel defines go into the command as one shell word; the variable is not "unknown".
    #[test]
    fn kernel_defines_are_recorded_as_one_shell_word() {
        assert_eq!(shell_word("GWT_EPI_STAGED=0,MOE_WT_DIAG=75"), "GWT_EPI_STAGED=0,MOE_WT_DIAG=75");
        assert_eq!(shell_word("A=1, B=2"), "'A=1, B=2'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        let vars = ["FLASHSEEK_KERNEL_DEFINES", "FLASHSEEK_KERNEL_DEFINE"].map(std::ffi::OsString::from);
        assert_eq!(unknown_variables(vars.into_iter()), vec!["FLASHSEEK_KERNEL_DEFINE".to_string()]);
    }

    #[test]
    fn prefill_chunks_follow_the_switch_and_serve_caps_its_budget() {
        let (one, serve) = scoped(&[("LONG_CONTEXT_CHUNK", "on")], || (prefill_chunk_tokens(), serve_prefill_chunk_tokens())).unwrap();
        assert_eq!((one, serve), (LONG_CONTEXT_CHUNK_TOKENS, SERVE_PREFILL_CHUNK_TOKENS));
        let (one, serve) = scoped(&[("LONG_CONTEXT_CHUNK", "off")], || (prefill_chunk_tokens(), serve_prefill_chunk_tokens())).unwrap();
        assert_eq!((one, serve), (SHORT_CONTEXT_CHUNK_TOKENS, SHORT_CONTEXT_CHUNK_TOKENS));
    }

    #[test]
    fn values_normalise_and_reject() {
        let tc = find("tc_linear").unwrap();
        assert_eq!(tc.normalise(" BF16 "), Some("bf16"));
        assert_eq!(tc.normalise("1"), Some("split"));
        assert_eq!(tc.normalise("0"), Some("off"));
        assert_eq!(tc.normalise("fast"), None);
        let g = find("FLASHSEEK_MOE_GROUPED").unwrap();
        assert_eq!(g.normalise("false"), Some("off"));
        assert_eq!(g.normalise("On"), Some("on"));
        assert!(matches!(find("NOPE"), Err(SwitchError::Unknown(_))));
    }

    #[test]
    fn scoped_overrides_apply_and_restore() {
        let before = value("MOE_PERSISTENT");
        let inner = scoped(&[("MOE_PERSISTENT", "off"), ("tc_linear", "0")], || {
            let nested = scoped(&[("MOE_PERSISTENT", "on")], || value("MOE_PERSISTENT")).unwrap();
            (value("MOE_PERSISTENT"), value("TC_LINEAR"), nested)
        })
        .unwrap();
        assert_eq!(inner, ("off", "off", "on"));
        assert_eq!(value("MOE_PERSISTENT"), before);
        assert!(scoped(&[("MOE_PERSISTENT", "sometimes")], || ()).is_err());
        assert!(scoped(&[("NOPE", "on")], || ()).is_err());
    }

    /// Every switch is turned off alone (on, where off is its default: with the defaults or with
    /// what it needs to act), every override is a valid value, and exactly one baseline and one
    /// all-on configuration exist.
    #[test]
    fn configurations_cover_every_switch() {
        let cs = configurations();
        for s in SWITCHES {
            // Outside the forward pass (the logits are the same): checked by gpu-check and the
            // sampler's tests instead of the forward's parity matrix.
            if s.name == "SAMPLE_ON_DEVICE" {
                continue;
            }
            if s.default_value() == "off" {
                // On with the defaults, or — a switch with requirements (REQUIRES) — in a row where
                // it and every other switch the row sets act.
                let has_requirements = REQUIRES.iter().any(|(n, _)| *n == s.name);
                let acts_on = |c: &&Configuration| {
                    c.overrides.contains(&(s.name, "on")) && scoped(&c.overrides, || c.overrides.iter().all(|(n, _)| inactive_because(n).is_none())).unwrap_or(false)
                };
                assert!(cs.iter().any(|c| c.overrides == [(s.name, "on")]) || (has_requirements && cs.iter().any(|c| acts_on(&c))), "{} (off by default) never on where it acts", s.name);
            } else {
                assert!(cs.iter().any(|c| c.role == Role::AloneOff && c.overrides.contains(&(s.name, "off"))), "{} never off alone", s.name);
            }
        }
        for c in &cs {
            assert!(scoped(&c.overrides, || ()).is_ok(), "{}", c.label);
        }
        assert_eq!(cs.iter().filter(|c| c.role == Role::Baseline).count(), 1);
        assert_eq!(cs.iter().filter(|c| c.role == Role::AllOn).count(), 1);
        // qualify: past --full-matrix-max the defaults' run is the reference of the promised tokens,
        // so every configuration before it must be one of the skipped (slow) ones.
        let all_on = cs.iter().position(|c| c.role == Role::AllOn).expect("all-on run");
        assert!(cs[..all_on].iter().all(|c| c.slow), "a configuration before the defaults' run that is not slow");
        // Official configurations promising bits come after the official all-on run they are compared with.
        assert_eq!(cs.iter().filter(|c| c.role == Role::OfficialAllOn).count(), 1);
        let official_all_on = cs.iter().position(|c| c.role == Role::OfficialAllOn).expect("official all-on run");
        assert_eq!(cs[official_all_on].overrides, [("TC_LINEAR", "fp8")]);
        assert!(cs.iter().enumerate().all(|(i, c)| !(c.official && c.same_bits_as_all_on) || i > official_all_on));
        let inexact = |c: &Configuration| c.official || [("TC_LINEAR", "bf16"), ("MLA_STREAM_FAST_EXP", "on"), ("INDEXER_FP8", "on"), ("MLA_BF16", "on"), ("WQ_B_BF16_OUT", "on"), ("MHC_BF16_STREAMS", "on"), ("WO_A_FP8", "on"), ("COMPRESSOR_BF16", "on"), ("MOE_DOWN_BF16_OUT", "on")].iter().any(|o| c.overrides.contains(o));
        assert!(cs.iter().all(|c| c.exact != inexact(c)));
        assert!(cs.iter().filter(|c| c.official).count() >= 3);
    }

    #[test]
    fn requirements_name_registered_values() {
        for (name, reqs) in REQUIRES.iter().chain(REQUIRES_ANY) {
            assert!(find(name).is_ok(), "{name}");
            for (r, vals) in *reqs {
                let s = find(r).unwrap_or_else(|_| panic!("{r}"));
                assert!(vals.iter().all(|v| s.values.contains(v)), "{r}: {vals:?}");
            }
        }
        let off = scoped(&[("MOE_GROUPED_DECODE", "off")], || inactive_because("DECODE_CUDA_GRAPH")).unwrap();
        assert_eq!(off.as_deref(), Some("needs MOE_GROUPED_DECODE=on"));
        let fp8 = scoped(&[("TC_LINEAR", "fp8")], || inactive_because("FP8_WGMMA")).unwrap();
        assert_eq!(fp8, None);
        let split = scoped(&[("TC_LINEAR", "split")], || (inactive_because("FP8_WGMMA"), inactive_because("LINEAR_CUBLASLT"))).unwrap();
        assert_eq!(split, (Some("needs TC_LINEAR=fp8".into()), None));
        // Every unmet requirement is named, in the order listed.
        let two = scoped(&[("INDEXER_TC", "off"), ("INDEXER_FP8", "on")], || inactive_because("INDEXER_STREAM_TOPK")).unwrap();
        assert_eq!(two.as_deref(), Some("needs INDEXER_TC=on and INDEXER_FP8=off"));
        // INDEXER_WGMMA runs the FP8 scores whatever INDEXER_TC says, the exact ones only while
        // INDEXER_STREAM_TOPK acts; a set but idle alternative says why it is idle.
        let fp8 = scoped(&[("INDEXER_TC", "off"), ("INDEXER_FP8", "on")], || inactive_because("INDEXER_WGMMA")).unwrap();
        assert_eq!(fp8, None);
        let idle = scoped(&[("INDEXER_TC", "off")], || inactive_because("INDEXER_WGMMA")).unwrap();
        assert_eq!(idle.as_deref(), Some("needs INDEXER_STREAM_TOPK=on (set, but idle: needs INDEXER_TC=on), or INDEXER_FP8=on"));
        let neither = scoped(&[("INDEXER_STREAM_TOPK", "off")], || inactive_because("INDEXER_WGMMA")).unwrap();
        assert_eq!(neither.as_deref(), Some("needs INDEXER_STREAM_TOPK=on, or INDEXER_FP8=on"));
        // inactive_because follows "=on" alternatives of REQUIRES_ANY into their own alternatives:
        // that chain must end (no switch reached again), or it would recurse forever.
        for (name, _) in REQUIRES_ANY {
            let mut seen = vec![*name];
            let mut frontier = vec![*name];
            while let Some(n) = frontier.pop() {
                for (r, vals) in REQUIRES_ANY.iter().filter(|(m, _)| *m == n).flat_map(|(_, alts)| alts.iter()) {
                    if *vals == ["on"] && *r != n {
                        assert!(!seen.contains(r), "REQUIRES_ANY cycle through {r} from {name}");
                        seen.push(r);
                        frontier.push(r);
                    }
                }
            }
        }
        // Alternatives: BF16_WGMMA acts while either the linears or the grouped MoE use it.
        let neither = scoped(&[("TC_LINEAR", "off"), ("MOE_GROUPED", "off")], || inactive_because("BF16_WGMMA")).unwrap();
        assert_eq!(neither.as_deref(), Some("needs TC_LINEAR=split or bf16 or fp8, or MOE_GROUPED=on"));
        let moe_only = scoped(&[("TC_LINEAR", "off")], || inactive_because("BF16_WGMMA")).unwrap();
        assert_eq!(moe_only, None);
    }

    #[test]
    fn misspelt_variables_are_found() {
        let vars = ["FLASHSEEK_LINEAR_CUBLAST", "FLASHSEEK_LINEAR_CUBLASLT", "FLASHSEEK_CACHE", "PATH", "FLASHSEEK_TC_LINEAR", "flashseek_tc_linear"].map(std::ffi::OsString::from);
        assert_eq!(unknown_variables(vars.into_iter()), ["FLASHSEEK_LINEAR_CUBLAST", "flashseek_tc_linear"]);
        // What each was probably meant to be: the upper-case name, or a switch two edits away.
        assert_eq!(variable_suggestion("flashseek_tc_linear").as_deref(), Some("FLASHSEEK_TC_LINEAR"));
        assert_eq!(variable_suggestion("FLASHSEEK_LINEAR_CUBLAST").as_deref(), Some("FLASHSEEK_LINEAR_CUBLASLT"));
        assert_eq!(variable_suggestion("flashseek_cache").as_deref(), Some("FLASHSEEK_CACHE"));
        assert_eq!(variable_suggestion("FLASHSEEK_SOMETHING_ELSE_ENTIRELY"), None);
        // Equally close to two variables (MOE_FP8_WS, MOE_FP8_WT): no guess.
        assert_eq!(variable_suggestion("FLASHSEEK_MOE_FP8_W"), None);
        assert_eq!(variable_suggestion(&format!("FLASHSEEK_{}", "X".repeat(10_000))), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn flag_errors_are_clear() {
        assert_eq!(set_override("MOE_GROUPED"), Err(SwitchError::Syntax("MOE_GROUPED".into())));
        assert_eq!(set_override("=on"), Err(SwitchError::Syntax("=on".into())));
        let e = set_override("MOE_GROUPED=maybe").unwrap_err();
        assert!(e.to_string().contains("accepted: on, off (also 1 = on"), "{e}");
        assert_eq!(find("TC_LINEAR").unwrap().normalise("true"), Some("split"));
        assert!(matches!(set_override("WHAT=on"), Err(SwitchError::Unknown(_))));
    }
}
