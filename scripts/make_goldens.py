#!/usr/bin/env python3
"""Reference goldens for flashseek's exact CPU forward pass.

Builds random-weight DeepSeek-V4 models, runs Hugging Face transformers'
`DeepseekV4ForCausalLM` on them in float32 and records, per case, the input ids,
every decoder layer's output streams and the logits.

Every parameter is randomised (including sinks, compressor position biases, mHC
base/scale, router bias and tid2eid, which the library's default init zeroes).
Values come from a counter-based generator (`formula_values`) that the Rust tests
re-implement (crates/engine/src/testing.rs), so a model whose weights are too large
to commit (the full-width case) is rebuilt bit for bit on the Rust side.

Weights are written in the layout `save_pretrained` produces (official names under a
`model.` prefix) and loaded back through `from_pretrained`, which must find every
tensor (no missing or unexpected keys). For the small cases the model is then saved
again with `save_pretrained` and committed, so the Rust loader is tested on a real
transformers output.

Usage (needs torch + transformers >= 5.8; CPU is enough):
    python scripts/make_goldens.py --out tests/fixtures/goldens
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import save_file as np_save_file
from safetensors import safe_open

import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

M64 = (1 << 64) - 1


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h ^= b
        h = (h * 0x100000001B3) & M64
    return h


def formula_uniform(key: str, n: int) -> np.ndarray:
    """n values in [-1, 1): splitmix64 finaliser over key_hash + (i+1)*golden, top 24 bits."""
    k = np.uint64(fnv1a64(key))
    i = np.arange(1, n + 1, dtype=np.uint64)
    z = k + i * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    top = (z >> np.uint64(40)).astype(np.float64)
    return (2.0 * top + 1.0) / 16777216.0 - 1.0


def value_rule(name: str, shape):
    """(offset, scale) of the uniform draw for a canonical (official) tensor name."""
    fan_in = shape[-1]
    if name.endswith("norm.weight"):
        return 1.0, 0.25
    if name.endswith("attn_sink"):
        return 0.0, 2.0
    if name.endswith(".ape"):
        return 0.0, 1.0
    if name.endswith("_base"):
        return 0.0, 0.5
    if name.endswith("_scale") and len(shape) == 1:
        return 1.0, 0.5
    if name.endswith("gate.bias"):
        return 0.0, 0.1
    if name == "embed.weight":
        return 0.0, 1.0
    return 0.0, math.sqrt(3.0 / fan_in)


def formula_values(seed: int, name: str, shape) -> np.ndarray:
    off, scale = value_rule(name, shape)
    n = int(np.prod(shape))
    u = formula_uniform(f"{seed}:{name}", n)
    return (off + scale * u).astype(np.float32).reshape(shape)


def formula_tid2eid(seed: int, name: str, vocab: int, k: int, n_experts: int) -> np.ndarray:
    """Each row: k distinct expert ids, drawn in order, rejecting repeats."""
    out = np.zeros((vocab, k), dtype=np.int64)
    for r in range(vocab):
        chosen = []
        j = 0
        while len(chosen) < k:
            u = formula_uniform(f"{seed}:{name}:{r}:{j}", 1)[0]
            e = int((u + 1.0) * 0.5 * n_experts) % n_experts
            if e not in chosen:
                chosen.append(e)
            j += 1
        out[r] = chosen
    return out


def canonical(saved_name: str) -> str:
    """save_pretrained name -> official name (the formula's key)."""
    n = saved_name
    if n == "model.embed_tokens.weight":
        return "embed.weight"
    if n.startswith("model.hc_head."):
        return "hc_head_" + n[len("model.hc_head.hc_"):]
    if n.startswith("model."):
        n = n[len("model."):]
    # transformers renames the official `.norm.` to `.kv_norm.` on load and back on save, so the
    # attention's own kv_norm (official `attn.kv_norm.weight`) is saved as `attn.norm.weight`.
    if n.endswith(".attn.norm.weight"):
        n = n[: -len("norm.weight")] + "kv_norm.weight"
    return n


CONFIGS = {
    # Flash compress rates (4 / 128) with a shrunk window and top-k so short sequences hit the
    # window limit, partial compressor windows and real top-k selection; both router kinds.
    "tiny_flash_rates": dict(
        seed=11,
        lengths=[1, 3, 4, 5, 127, 128, 129, 300],
        generate=(21, 150),
        config=dict(
            vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2, o_lora_rank=16,
            sliding_window=8,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                         "compressed_sparse_attention"],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            index_n_heads=16, index_head_dim=16, index_topk=4,
            n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=48,
            scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        ),
    ),
    # Non-Flash compress rates (3 / 16), three mHC streams, few Sinkhorn iterations, a different
    # layer order, top-k 3.
    "tiny_odd_rates": dict(
        seed=23,
        lengths=[1, 2, 3, 5, 6, 15, 16, 17, 40, 70],
        generate=(10, 60),
        config=dict(
            vocab_size=384, hidden_size=48, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=1,
            head_dim=24, partial_rotary_factor=1.0 / 3.0, q_lora_rank=40, o_groups=3, o_lora_rank=20,
            sliding_window=6,
            layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                         "compressed_sparse_attention"],
            mlp_layer_types=["hash_moe", "moe", "moe", "hash_moe"],
            compress_rates={"compressed_sparse_attention": 3, "heavily_compressed_attention": 16},
            rope_theta=5000.0, compress_rope_theta=80000.0,
            rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            index_n_heads=6, index_head_dim=16, index_topk=3,
            n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
            scoring_func="sqrtsoftplus", routed_scaling_factor=2.5, swiglu_limit=7.0,
            hc_mult=3, hc_sinkhorn_iters=5, hc_eps=1e-6, rms_norm_eps=1e-6,
            max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        ),
    ),
    # Full Flash widths (hidden 4096, 64 heads x 512, q/o ranks 1024, 8 groups, indexer 64 x 128,
    # window 128, rates 4/128, top-k 512) with 3 layers, 4 experts and a small vocabulary.
    # Weights are not committed: the Rust test rebuilds them from the formula.
    "full_width": dict(
        seed=37,
        lengths=[136],
        keep_positions=[0, 1, 3, 4, 64, 127, 128, 135],
        commit_weights=False,
        config=dict(
            vocab_size=1024, hidden_size=4096, num_hidden_layers=3, num_attention_heads=64, num_key_value_heads=1,
            head_dim=512, partial_rotary_factor=0.125, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
            sliding_window=128,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            mlp_layer_types=["hash_moe", "moe", "moe"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            index_n_heads=64, index_head_dim=128, index_topk=512,
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=256,
            scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            max_position_embeddings=1048576, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        ),
    ),
}


def formula_ids(seed: int, length: int, vocab: int) -> list:
    u = formula_uniform(f"{seed}:ids:{length}", length)
    return [int((x + 1.0) * 0.5 * vocab) % vocab for x in u]


def build(name: str, spec: dict, out_root: str, work: str):
    seed = spec["seed"]
    cfg = DeepseekV4Config(**spec["config"])
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).to(torch.float32)
    raw_dir = os.path.join(work, name + "_init")
    model.save_pretrained(raw_dir)
    del model

    # Replace every saved tensor by its formula value.
    tensors = {}
    for fname in sorted(os.listdir(raw_dir)):
        if not fname.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(raw_dir, fname), "np") as f:
            for key in f.keys():
                shape = list(f.get_slice(key).get_shape())
                canon = canonical(key)
                if canon.endswith("tid2eid"):
                    tensors[key] = formula_tid2eid(seed, canon, shape[0], shape[1], cfg.n_routed_experts)
                else:
                    tensors[key] = formula_values(seed, canon, shape)
    formula_dir = os.path.join(work, name + "_formula")
    os.makedirs(formula_dir, exist_ok=True)
    shutil.copy(os.path.join(raw_dir, "config.json"), formula_dir)
    np_save_file(tensors, os.path.join(formula_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(raw_dir)
    del tensors

    model, info = DeepseekV4ForCausalLM.from_pretrained(
        formula_dir, dtype=torch.float32, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"{name}: from_pretrained did not take the formula weights cleanly: {bad}")
    model.eval()

    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    if spec.get("commit_weights", True):
        model.save_pretrained(os.path.join(out_dir, "model"))
    else:
        os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
        shutil.copy(os.path.join(formula_dir, "config.json"), os.path.join(out_dir, "model", "config.json"))
    shutil.rmtree(formula_dir)

    captured = {}
    hooks = [
        layer.register_forward_hook(lambda mod, args, out, i=i: captured.__setitem__(i, out))
        for i, layer in enumerate(model.model.layers)
    ]
    # Indexer scores, to reject cases whose top-k boundary is an exact tie (the reference's choice
    # among tied entries is unspecified, so such a case would test torch's tie-breaking).
    scores = {}
    for i, layer in enumerate(model.model.layers):
        comp = getattr(layer.self_attn, "compressor", None)
        idx = getattr(comp, "indexer", None) if comp is not None else None
        if idx is not None:
            hooks.append(idx.scorer.register_forward_hook(lambda mod, args, out, i=i: scores.__setitem__(i, out)))
    ratio_csa = cfg.compress_rates["compressed_sparse_attention"]
    record = {}
    summary = []
    keep = spec.get("keep_positions")
    for length in spec["lengths"]:
        ids = formula_ids(seed, length, cfg.vocab_size)
        captured.clear()
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
        logits = out.logits[0].float().numpy()
        for li, sc in scores.items():
            sc = sc[0].float().numpy()
            for t in range(length):
                visible = min((t + 1) // ratio_csa, sc.shape[1])
                if visible <= cfg.index_topk:
                    continue
                s = np.sort(sc[t, :visible])[::-1]
                k = cfg.index_topk
                if not (s[k - 1] - s[k] > 1e-6 * max(1.0, abs(s[k - 1]))):
                    raise SystemExit(f"{name} T={length} layer {li} query {t}: top-k boundary tie "
                                     f"({s[k - 1]!r} vs {s[k]!r}); change the seed or the config")
        record[f"ids.{length}"] = np.array(ids, dtype=np.int64)
        record[f"logits.{length}"] = logits
        pos = np.array(keep if keep is not None else list(range(length)), dtype=np.int64)
        record[f"positions.{length}"] = pos
        for i in range(cfg.num_hidden_layers):
            streams = captured[i]
            streams = streams[0] if isinstance(streams, tuple) else streams
            record[f"streams.{length}.{i}"] = streams[0].float().numpy()[pos]
        summary.append({"length": length, "logits_absmax": float(np.abs(logits).max())})
    for h in hooks:
        h.remove()
    # Greedy generation through transformers' own cache (prefill, then one token per step).
    gen = spec.get("generate")
    if gen is not None:
        prompt_len, new_tokens = gen
        ids = formula_ids(seed, prompt_len, cfg.vocab_size)
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, prompt_len, dtype=torch.long),
                max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                eos_token_id=None, pad_token_id=0,
            )
        record[f"generate.prompt"] = np.array(ids, dtype=np.int64)
        record[f"generate.output"] = out[0, prompt_len:].numpy().astype(np.int64)
        summary.append({"generate": [prompt_len, new_tokens]})
    np_save_file(record, os.path.join(out_dir, "golden.safetensors"))
    meta = {
        "name": name,
        "seed": seed,
        "lengths": spec["lengths"],
        "keep_positions": keep,
        "generate": spec.get("generate"),
        "weights": "committed (save_pretrained)" if spec.get("commit_weights", True) else "formula (rebuild in Rust)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(sys.argv),
        "summary": summary,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(name, json.dumps(summary))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/goldens")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as work:
        for name, spec in CONFIGS.items():
            if args.only and name not in args.only:
                continue
            build(name, spec, args.out, work)


if __name__ == "__main__":
    main()
