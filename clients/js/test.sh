#!/usr/bin/env bash
# The TypeScript SDK's suite: installs its pinned dev dependencies from
# package-lock.json (npm ci; playwright-core drives the system's Chromium and
# never downloads a browser), builds it (tsc: ESM and .d.ts), builds the
# minified browser bundle and prints its gzipped size, then runs the Node and
# headless-Chromium tests (node --test) against the real `herald` binary.
# Needs Node >= 20, npm, /usr/bin/chromium and redis-server (scripts/test.sh
# installs them).
set -euo pipefail
cd "$(dirname "$0")"
REPO="$(cd ../.. && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
if [ -z "${HERALD_BIN:-}" ]; then
    (cd "$REPO" && cargo build -p gateway --bin herald --locked --quiet)
fi
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
npm run --silent bundle
# One file at a time: the browser tests start Chromium and several processes
# each, on a 2-core machine. Every wait inside is bounded; this bounds a test.
node --test --test-concurrency=1 --test-timeout=120000 test/*.test.mjs
