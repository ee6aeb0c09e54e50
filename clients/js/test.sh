#!/usr/bin/env bash
# The TypeScript SDK's suite: installs its pinned dev dependencies from
# package-lock.json (npm ci; playwright-core drives the system's Chromium and
# never downloads a browser), builds it (tsc: ESM and .d.ts), compiles the
# type tests (test/types.ts, against the emitted .d.ts), builds the minified
# browser bundle and prints its gzipped size, then runs the Node tests (the
# frame types in step with herald.proto and docs/protocol.md, the parser, the
# protobuf codec and the Fossil decoder against the Rust side's bytes) and
# the Node and headless-Chromium tests against the real `herald` binary.
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
npm run --silent test:types
npm run --silent bundle
# One file at a time: the browser tests start Chromium and several processes
# each, on a 2-core machine. Every wait inside is bounded, and so is every
# test, by itself (test/harness.mjs: a test that overruns fails, is cleaned up
# and the file goes on). Not `--test-timeout`: in Node 20 it bounds a whole
# file and kills it mid-test, without its cleanup. `--test-force-exit` (Node
# >= 20.14): a file whose tests are done exits, whatever handle a timed-out
# test left open.
force_exit=()
if node --test-force-exit -e '' >/dev/null 2>&1; then force_exit=(--test-force-exit); fi
node --test --test-concurrency=1 "${force_exit[@]}" test/*.test.mjs
