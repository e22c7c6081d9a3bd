#!/usr/bin/env python3
"""transformers' DeepseekV4ForCausalLM on the GPU, for the speed ratio of issue 5.

Builds a random-weight model of the comparison config (DeepSeek-V4-Flash widths, few layers and
experts so eager transformers fits and runs in minutes), times cold one-shot prefill (CUDA events,
median of repeats after a warm-up) and cached greedy decode, writes the config (HF schema) for
`flashseek gpu-bench --config` and a JSON report.

Usage on the GPU machine (torch + transformers >= 5.8):
    python scripts/bench_transformers.py --out DIR [--contexts 512,2048] [--dtype bfloat16]
"""
import argparse
import json
import os
import statistics
import sys

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

CONFIG = dict(
    vocab_size=129280, hidden_size=4096, num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=1,
    head_dim=512, partial_rotary_factor=0.125, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
    sliding_window=128,
    layer_types=["sliding_attention", "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    mlp_layer_types=["hash_moe", "hash_moe", "hash_moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32.0, "beta_slow": 1.0},
    index_n_heads=64, index_head_dim=128, index_topk=512,
    n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=1, moe_intermediate_size=2048,
    scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    max_position_embeddings=1048576, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
)


def timed(fn, repeats):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = DeepseekV4Config(**CONFIG)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        f.write(cfg.to_json_string())
    dtype = getattr(torch, args.dtype)
    torch.set_default_dtype(dtype)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    runs = []
    for ctx in [int(c) for c in args.contexts.split(",")]:
        ids = torch.randint(2, cfg.vocab_size, (1, ctx), device="cuda")
        with torch.no_grad():
            prefill_s = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), args.repeats)
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            nxt = out.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(args.decode_steps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                b.record()
                b.synchronize()
                steps.append(a.elapsed_time(b) / 1e3)
                cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
                nxt = out.logits[:, -1:].argmax(-1)
        decode_s = statistics.median(steps)
        row = {"context": ctx, "prefill_s": prefill_s, "prefill_tok_s": ctx / prefill_s,
               "decode_ms_per_token": decode_s * 1e3, "decode_tok_s": 1 / decode_s}
        print(json.dumps(row), flush=True)
        runs.append(row)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": args.dtype, "attention": "eager (the only implementation transformers ships for V4)",
              "config": "scripts/bench_transformers.py CONFIG (Flash widths, 4 layers, 64 experts)",
              "command": " ".join(sys.argv), "runs": runs}
    with open(os.path.join(args.out, "transformers_bench.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
