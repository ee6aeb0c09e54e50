#!/usr/bin/env bash
# The ticker demo in one command: herald with its embedded broker, a
# publisher that posts a price to `ticker` every second over the HTTP API,
# and the page (examples/ticker, using the TypeScript SDK) to open in a
# browser. Ctrl-C stops all three. Ports: HERALD_PORT (8080), PAGE_PORT (8000).
set -euo pipefail
cd "$(dirname "$0")/.."
herald_port="${HERALD_PORT:-8080}"
page_port="${PAGE_PORT:-8000}"

cargo build -p gateway --bin herald --quiet
(cd clients/js && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && npm run --silent build)

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
HERALD_LISTEN="127.0.0.1:$herald_port" HERALD_GRPC__LISTEN="127.0.0.1:0" \
    "${CARGO_TARGET_DIR:-target}/debug/herald" &
pids+=($!)
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$herald_port/readyz" >/dev/null && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$herald_port/readyz" >/dev/null || { echo "herald did not start" >&2; exit 1; }

# The publisher: a price a second.
(
    while sleep 1; do
        price="$(printf '%d.%02d' $((100 + RANDOM % 10)) $((RANDOM % 100)))"
        curl -s -o /dev/null "http://127.0.0.1:$herald_port/v1/publish" \
            -d "{\"topic\":\"ticker\",\"data\":{\"price\":\"$price\"}}" || true
    done
) &
pids+=($!)

echo "open http://127.0.0.1:$page_port/?ws=ws://127.0.0.1:$herald_port/ws"
node examples/ticker/serve.mjs "$page_port" &
pids+=($!)
wait "${pids[-1]}"
