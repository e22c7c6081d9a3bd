#!/usr/bin/env python3
"""`flashseek serve --device cuda` against `flashseek serve --device cpu`, over HTTP (stdlib only).

Starts both servers on the embedded default model (or --model DIR), sends the same greedy requests
to each and compares what comes back:
  - chat completions (non-streaming and streaming), a text completion and an Anthropic message,
    greedy (temperature 0) with logprobs where the API has them: the generated text must be equal
    and the first token's logprob within 1e-3;
  - a chat with a system prompt, then the same chat again and another question under the same
    system prompt: the GPU server must report cached prompt tokens for both (its prefix cache
    copied the shared prefix of a cached GPU sequence) and answer as the CPU does;
  - 6 different prompts at once (continuous batching on one GPU): each must equal the CPU's answer.
Writes a JSON report (the requests' texts, logprobs, cached tokens, timings, verdict) and exits 1
on any difference.

Usage: python3 scripts/serve_parity.py BIN OUT.json [--model DIR] [--device cuda]
"""
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(binary, device, model, log):
    port = free_port()
    cmd = [binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", device, "--max-running", "8"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{device} server exited with {proc.returncode} (see its log)")
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return proc, base
        except Exception:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{device} server did not come up in 5 minutes")


def post(base, path, body, stream=False):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read().decode()
    ms = (time.time() - t) * 1e3
    if not stream:
        return json.loads(raw), ms
    # Server-sent events: the concatenated content deltas.
    text = ""
    for line in raw.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                text += (ch.get("delta") or {}).get("content") or ""
    return {"streamed_text": text}, ms


MODEL = "flashseek-default"  # replaced by the served name (GET /v1/models) at start


# A system prompt long enough (at least MIN_FORK_TOKENS = 16 shared tokens) that repeating a chat,
# or asking another question under it, reuses a cached GPU sequence: the server copies the shared
# prefix (GPU fork) instead of recomputing it; shorter shared prefixes are recomputed on purpose.
MIN_FORK_TOKENS = 16
SYSTEM = ("You are a careful assistant. Answer in one short sentence, use plain words, "
          "and never repeat the question back to the user.")


def chat(prompt, n=24, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return {"model": MODEL, "messages": msgs, "max_tokens": n, "temperature": 0, "logprobs": True, "top_logprobs": 2}


def chat_text(r):
    m = r["choices"][0]["message"]
    return (m.get("reasoning_content") or "") + "|" + (m.get("content") or "")


def first_logprob(r):
    lp = r["choices"][0].get("logprobs") or {}
    content = lp.get("content") or []
    return content[0]["logprob"] if content else None


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        raise SystemExit(__doc__)
    binary, out = args[0], args[1]
    model = args[args.index("--model") + 1] if "--model" in args else None
    device = args[args.index("--device") + 1] if "--device" in args else "cuda"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        gpu_name = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu_name = "none"
    switches = {k: v for k, v in sorted(os.environ.items()) if k.upper().startswith("FLASHSEEK_")}
    report = {"binary": binary, "version": version, "gpu": gpu_name, "command": " ".join(sys.argv), "switch_environment": switches, "device": device, "model": model or "embedded default", "cases": []}
    ok = True
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    logs = {d: open(f"{os.path.splitext(out)[0]}_{d.replace(':', '')}.log", "w") for d in (device, "cpu")}
    gpu, gbase = start(binary, device, model, logs[device])
    cpu, cbase = start(binary, "cpu", model, logs["cpu"])
    global MODEL
    with urllib.request.urlopen(gbase + "/v1/models", timeout=10) as r:
        MODEL = json.loads(r.read())["data"][0]["id"]
    try:
        def case(name, path, body, text_of, stream=False, lp_of=None):
            nonlocal ok
            g, gms = post(gbase, path, body, stream)
            c, cms = post(cbase, path, body, stream)
            gt, ct = text_of(g), text_of(c)
            same = gt == ct
            rec = {"case": name, "gpu_text": gt, "cpu_text": ct, "equal": same, "gpu_ms": gms, "cpu_ms": cms}
            if lp_of:
                gl, cl = lp_of(g), lp_of(c)
                rec["gpu_first_logprob"], rec["cpu_first_logprob"] = gl, cl
                if gl is not None and cl is not None and abs(gl - cl) > 1e-3:
                    same = False
            if not stream and isinstance(g, dict) and "usage" in g:
                rec["gpu_usage"] = g["usage"]
            rec["pass"] = same
            ok &= same
            report["cases"].append(rec)
            print(f"{name:<28} {'ok' if same else 'FAIL'}  gpu {gms:.0f} ms  cpu {cms:.0f} ms  {gt[:60]!r}")
            return g

        prompt = "Write one sentence about the sea."
        case("chat", "/v1/chat/completions", chat(prompt), chat_text, lp_of=first_logprob)
        case("chat (stream)", "/v1/chat/completions", {**{k: v for k, v in chat(prompt).items() if k not in ("logprobs", "top_logprobs")}, "stream": True}, lambda r: r["streamed_text"], stream=True)
        case("completion", "/v1/completions", {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}, lambda r: r["choices"][0]["text"])
        case("anthropic message", "/v1/messages", {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}, lambda r: "".join(b.get("text", "") for b in r["content"]))
        # Prefix cache: a chat under SYSTEM, the same chat again (its whole prompt is held by the
        # first one's cached sequence, which holds more: copied), then another question under
        # SYSTEM (only the system part shared: copied). Each must report cached tokens.
        case("chat with system prompt", "/v1/chat/completions", chat(prompt, system=SYSTEM), chat_text, lp_of=first_logprob)
        report["prefix_cache_cached_tokens"] = {}
        for name, body in (("chat again (prefix cache)", chat(prompt, system=SYSTEM)),
                           ("other question (prefix copy)", chat("Name one large ocean.", system=SYSTEM))):
            g = case(name, "/v1/chat/completions", body, chat_text, lp_of=first_logprob)
            cached = ((g.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            report["prefix_cache_cached_tokens"][name] = cached
            if cached < MIN_FORK_TOKENS:
                ok = False
                print(f"prefix cache: {cached} cached tokens (expected at least {MIN_FORK_TOKENS})  FAIL")
            else:
                print(f"prefix cache: {cached} cached tokens  ok")
        # Six prompts at once: continuous batching on the GPU.
        prompts = [f"Count to {i} and stop." for i in range(3, 9)]
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            t = time.time()
            gres = list(ex.map(lambda p: post(gbase, "/v1/chat/completions", chat(p, 16))[0], prompts))
            batch_ms = (time.time() - t) * 1e3
        for p, gr in zip(prompts, gres):
            cr, _ = post(cbase, "/v1/chat/completions", chat(p, 16))
            same = chat_text(gr) == chat_text(cr)
            ok &= same
            report["cases"].append({"case": f"batched: {p}", "gpu_text": chat_text(gr), "cpu_text": chat_text(cr), "equal": same, "pass": same})
        report["batched_6_wall_ms"] = batch_ms
        print(f"6 concurrent chats on the GPU server: {batch_ms:.0f} ms, equal to the CPU: {all(c['pass'] for c in report['cases'][-6:])}")
    finally:
        for p in (gpu, cpu):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    # A failed copy falls back to taking the cached session (the cached tokens above would not show
    # it): the server says so in its log.
    for d, f in logs.items():
        f.flush()
    with open(logs[device].name) as f:
        fork_failures = [l.strip() for l in f if "copying a cached prefix failed" in l]
    report["fork_failures"] = fork_failures
    if fork_failures:
        ok = False
        print(f"prefix copies failed on the {device} server: {fork_failures[:3]}  FAIL")
    report["pass"] = ok
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print("serve parity:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
