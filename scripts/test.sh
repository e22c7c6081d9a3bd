#!/usr/bin/env bash
# The project's test command (README): lint, then every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
