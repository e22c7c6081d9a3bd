#!/usr/bin/env bash
# Client tests with the official `openai` and `anthropic` Python packages against a live
# `flashseek serve` on the embedded default model (loopback only). Installs the packages from PyPI
# into target/venv-test on first use; starts the server on a free port and stops it on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p "$TARGET"
VENV="$TARGET/venv-test"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import openai, anthropic, pytest" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "openai>=1.40" "anthropic>=0.40" "pytest>=7"
fi

BIN="$TARGET/release/flashseek"
if [ ! -x "$BIN" ]; then
    cargo build --release -p flashseek
fi

PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export FLASHSEEK_CACHE="${FLASHSEEK_CACHE:-$TARGET/test-cache}"
LOG="$TARGET/python-serve.log"
"$BIN" serve --host 127.0.0.1 --port "$PORT" --api-key test-key --max-running 8 --max-queue 64 >"$LOG" 2>&1 &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
}
trap cleanup EXIT

# The first start writes the default model (a few seconds); wait up to 3 minutes.
for _ in $(seq 1 360); do
    if "$VENV/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "flashseek serve exited:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 0.5
done

export FLASHSEEK_URL="http://127.0.0.1:$PORT"
export FLASHSEEK_API_KEY=test-key
set +e
timeout 600 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/python
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python client tests: pytest collected no tests" >&2
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    echo "--- server log ---" >&2
    tail -50 "$LOG" >&2
fi
exit "$rc"
