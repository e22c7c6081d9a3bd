#!/usr/bin/env python3
"""Compare two versions of a kernel file entry point by entry point, in PTX, without a GPU.

For a refactor of a .cu file that must not change what the kernels compute: compiles both versions
with the NVRTC of `.venv-nvrtc` (installed by scripts/test.sh) for compute_90a with the engine's
options, then reports per `extern "C"` entry whether the PTX is identical, the same multiset of
instructions once register numbers, labels and function-local statics' mangled prefixes are
normalised (a reordering), or different (with the instructions only one side has).

Usage: python3 scripts/ptx_same.py [--define NAME] OLD.cu NEW.cu [OLD_COMMON.cuh]
  e.g. OLD from `git show REV:path > old.cu`. Both versions are prefixed with the current
  kernels/common.cuh, or the old one with OLD_COMMON.cuh when the change moved code into it.
  --define NAME compiles both with `#define NAME 1` (FS_GEMM_WGMMA_ONLY: gemm.cu's wgmma half).
Exit code 1 when any entry differs beyond a reordering.
"""
import collections
import ctypes
import glob
import re
import sys

ROOT = __file__.rsplit("/scripts/", 1)[0]


def nvrtc():
    libs = glob.glob(f"{ROOT}/.venv-nvrtc/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so*")
    if not libs:
        sys.exit("no NVRTC in .venv-nvrtc: run `bash scripts/test.sh` once (it installs nvidia-cuda-nvrtc)")
    return ctypes.CDLL(sorted(libs)[0])


def ptx(lib, src, name):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) != 0:
        sys.exit(f"{name}: nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=compute_90a", b"--std=c++17", b"--fmad=true", b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    if rc != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{name}: compilation failed (is LD_LIBRARY_PATH set to the venv's nvidia/cu13/lib?)\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def entries(text):
    out = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\((.*?)\n\}\n", text, re.S):
        body = re.sub(r"_param_\d+", "_param_N", m.group(0))
        # A function-local static (e.g. a __shared__ array) is named after its function's mangled
        # signature, which a new template parameter changes: keep the variable's own name.
        body = re.sub(r"_ZZ\w*E\d+(\w+)", r"_ZZlocal_\1", body)
        out[m.group(1)] = re.sub(r"\$L__BB\d+_\d+", "LBL", body)
    return out


def instructions(body):
    body = re.sub(r"%(r|rd|f|fd|p|rs|h|hh)\d+", r"%\1", body)
    body = re.sub(r"__local_depot\d+", "depot", body)
    return collections.Counter(l.strip() for l in body.splitlines() if l.strip() and not l.strip().startswith(".reg"))


def main():
    args = sys.argv[1:]
    prefix = ""
    if len(args) >= 2 and args[0] == "--define":
        prefix = f"#define {args[1]} 1\n"
        args = args[2:]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    lib = nvrtc()
    common = open(f"{ROOT}/crates/engine/src/cuda/kernels/common.cuh").read()
    old_common = open(args[2]).read() if len(args) == 3 else common
    a = entries(ptx(lib, prefix + old_common + "\n" + open(args[0]).read(), "old.cu"))
    b = entries(ptx(lib, prefix + common + "\n" + open(args[1]).read(), "new.cu"))
    bad = 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print(f"only in {'new' if k in b else 'old'}: {k}")
            bad += 1
        elif a[k] == b[k]:
            print(f"identical        {k}")
        elif instructions(a[k]) == instructions(b[k]):
            print(f"reordered only   {k}")
        else:
            ca, cb = instructions(a[k]), instructions(b[k])
            print(f"DIFFERENT        {k}: old only {dict(ca - cb)}; new only {dict(cb - ca)}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
