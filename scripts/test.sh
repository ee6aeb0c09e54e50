#!/usr/bin/env bash
# Herald's whole test suite, on a fresh Debian machine with a Rust toolchain:
# installs what the tests need, checks formatting and lints, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

say "test dependencies"
# The cluster tests start their own redis-server (and use redis-cli).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends redis-server redis-tools
fi
redis-server --version
# The Python client test talks to herald through the `websockets` package.
if ! python3 -c 'import websockets' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check 'websockets>=12,<16'
fi
python3 -c 'import websockets; print("python websockets", websockets.__version__)'

say "format"
cargo fmt --all --check

say "lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

say "tests"
if cargo nextest --version >/dev/null 2>&1; then
    # nextest runs no doctests; run them first so that its summary closes the run.
    cargo test --workspace --locked --doc
    cargo nextest run --workspace --locked --profile "${NEXTEST_PROFILE:-default}"
else
    cargo test --workspace --locked
fi
