#!/usr/bin/env bash
# The project's test command (README): lint, then every test of the workspace.
# It also installs NVRTC 13.0.88 from PyPI into .venv-nvrtc (once) so that every CUDA kernel is
# compiled for sm_90a on this CPU-only machine: a kernel that does not compile fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_VERSION=13.0.88
if [ ! -f .venv-nvrtc/ok-$NVRTC_VERSION ]; then
  rm -rf .venv-nvrtc
  python3 -m venv .venv-nvrtc
  .venv-nvrtc/bin/pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc==$NVRTC_VERSION"
  touch .venv-nvrtc/ok-$NVRTC_VERSION
fi
NVRTC_LIB=$(echo "$PWD"/.venv-nvrtc/lib/python3*/site-packages/nvidia/cu13/lib)
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FLASHSEEK_REQUIRE_NVRTC=1

cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace

# The server's load-test figures (written by crates/server/tests/load.rs).
cat "${CARGO_TARGET_DIR:-target}/tmp/load_test.txt" 2>/dev/null || true
# Client tests with the official openai and anthropic Python packages against a live `flashseek serve`.
bash tests/python/run.sh
