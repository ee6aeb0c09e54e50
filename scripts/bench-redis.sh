#!/usr/bin/env bash
# What crossing pods costs. Starts a redis-server and two `herald` pods
# (broker = redis) on free loopback ports, then runs herald-loadtest:
#   1. pods, one pod:   subscribers on pod A, publisher on pod A
#   2. pods, cross pod: subscribers on pod B, publisher on pod A
#   3. publish:         publish throughput against pod A
# and, for reference, one herald with the embedded memory broker:
#   4. pods, one pod    5. publish
# Prints each run's table and a summary; the JSON results go to $OUT.
# Everything it starts is stopped when it exits, however it exits.
# Load generator and servers share this machine's cores: run it on a quiet
# machine, and read each run's CPU line ("others": CPU of processes not in
# the run; more than a fraction of a second means the figures are noisy).
#
# Usage: scripts/bench-redis.sh
#   CLIENTS=1000 RATE=100 DURATION=10s SIZE=256 CONCURRENCY=16 TOPICS=100
#   OUT=target/loadtest  (all optional, defaults shown)
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-1000}
RATE=${RATE:-100}
DURATION=${DURATION:-10s}
SIZE=${SIZE:-256}
CONCURRENCY=${CONCURRENCY:-16}
TOPICS=${TOPICS:-100}
OUT=${OUT:-target/loadtest}
# herald may hold up to its hard fd limit; leave room for everything else.
MAX_CONNECTIONS=$(( $(ulimit -Hn) - 1000 ))

say() { printf '\n== %s\n' "$*"; }

# Only what this script sets: no HERALD_* from the caller's environment.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^HERALD_' || true)

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port <var>: sets <var> to a loopback port nobody listens on (nor got
# from here before), below the ephemeral range (32768+) that the clients' own
# connections use. (Not `$(free_port)`: a subshell would forget what it gave.)
used_ports=" "
free_port() {
    local port
    while :; do
        port=$(( 20000 + RANDOM % 12000 ))
        case "$used_ports" in *" $port "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            used_ports+="$port "
            printf -v "$1" '%s' "$port"
            return
        fi
    done
}

# wait_until <seconds> <what> <pid> <command...>: polls the command until it
# succeeds; fails if the process dies or the time runs out.
wait_until() {
    local seconds=$1 what=$2 pid=$3
    shift 3
    for _ in $(seq $(( seconds * 20 ))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$what exited; its log:" >&2
            cat "$OUT/$what.log" >&2 || true
            exit 1
        fi
        sleep 0.05
    done
    echo "$what not ready within ${seconds}s" >&2
    exit 1
}

# start_herald <name> <port> [VAR=value...]: a herald on 127.0.0.1:<port>;
# its pid in $last_pid.
start_herald() {
    local name=$1 port=$2 grpc
    shift 2
    free_port grpc
    env HERALD_LISTEN="127.0.0.1:$port" \
        HERALD_GRPC__LISTEN="127.0.0.1:$grpc" \
        HERALD_WEBSOCKET__MAX_CONNECTIONS="$MAX_CONNECTIONS" \
        HERALD_LOG__LEVEL=warn \
        "$@" target/release/herald >"$OUT/$name.log" 2>&1 &
    last_pid=$!
    pids+=("$last_pid")
    wait_until 20 "$name" "$last_pid" curl -sf "http://127.0.0.1:$port/readyz"
    echo "$name: 127.0.0.1:$port (pid $last_pid)"
}

failed=0
# loadtest <name> <scenario> <flags...>: one run; a failed run is reported at the end.
loadtest() {
    local name=$1
    shift
    target/release/herald-loadtest "$@" --out "$OUT/$name.json" || failed=1
}

say "build (release)"
cargo build --release -p gateway -p herald-loadtest
mkdir -p "$OUT"
rm -f "$OUT"/*.json  # no figures of an earlier run in the summary
printf 'machine: %s cores, %s, kernel %s\n' "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(uname -r)"

say "redis and two pods"
free_port redis_port
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --protected-mode no >"$OUT/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
redis_up() { [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ]; }
wait_until 10 redis "$redis_pid" redis_up
echo "redis: 127.0.0.1:$redis_port (pid $redis_pid), $(redis-server --version | cut -d' ' -f3)"
free_port a
free_port b
redis=(HERALD_BROKER=redis HERALD_REDIS__URL="redis://127.0.0.1:$redis_port")
start_herald pod-a "$a" "${redis[@]}"
pid_a=$last_pid
start_herald pod-b "$b" "${redis[@]}"
pid_b=$last_pid
# CPU time of the servers, reported with each run.
watch=(--watch-pid "$pid_a" --watch-pid "$pid_b" --watch-pid "$redis_pid")

pods=(--clients "$CLIENTS" --rate "$RATE" --duration "$DURATION" --size "$SIZE")
publish=(--concurrency "$CONCURRENCY" --topics "$TOPICS" --duration "$DURATION" --size "$SIZE")

say "1. pods, one pod (redis): subscribers on pod A, publisher on pod A"
loadtest pods-one-pod pods --gateway "ws://127.0.0.1:$a/ws" --publish-to "http://127.0.0.1:$a" "${pods[@]}" "${watch[@]}"

say "2. pods, cross pod (redis): subscribers on pod B, publisher on pod A"
loadtest pods-cross-pod pods --gateway "ws://127.0.0.1:$b/ws" --publish-to "http://127.0.0.1:$a" "${pods[@]}" "${watch[@]}"

say "3. publish (redis): against pod A"
loadtest publish-redis publish --publish-to "http://127.0.0.1:$a" "${publish[@]}" "${watch[@]}"

cleanup
pids=()

say "reference: one herald with the memory broker"
free_port m
start_herald memory "$m"
watch=(--watch-pid "$last_pid")

say "4. pods, one pod (memory)"
loadtest pods-memory pods --gateway "ws://127.0.0.1:$m/ws" "${pods[@]}" "${watch[@]}"

say "5. publish (memory)"
loadtest publish-memory publish --publish-to "http://127.0.0.1:$m" "${publish[@]}" "${watch[@]}"

say "summary (ms; busy-cores: the machine's average; other-cpu-s: CPU seconds of processes not in the run; results in $OUT/)"
if command -v jq >/dev/null 2>&1; then
    printf '%-16s %9s %9s %9s %15s %6s %6s %11s %12s\n' run p50 p99 max last-client-p50 lost dup busy-cores other-cpu-s
    for run in pods-memory pods-one-pod pods-cross-pod; do
        [ -f "$OUT/$run.json" ] || continue
        jq -r --arg run "$run" '.result | [$run,
            (.latency.p50_us/1000), (.latency.p99_us/1000), (.latency.max_us/1000),
            (.last_client.p50_us/1000), .lost, .duplicated, .cpu.machine_busy_cores, .cpu.other_cpu_s] | @tsv' "$OUT/$run.json" |
            awk -F'\t' '{ printf "%-16s %9.3f %9.3f %9.3f %15.3f %6d %6d %11.2f %12.2f\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
    done
    printf '%-16s %12s %9s %9s %11s %12s\n' run publishes/s p50 p99 busy-cores other-cpu-s
    for run in publish-memory publish-redis; do
        [ -f "$OUT/$run.json" ] || continue
        jq -r --arg run "$run" '.result | [$run, .per_second,
            (.latency.p50_us/1000), (.latency.p99_us/1000), .cpu.machine_busy_cores, .cpu.other_cpu_s] | @tsv' "$OUT/$run.json" |
            awk -F'\t' '{ printf "%-16s %12.0f %9.3f %9.3f %11.2f %12.2f\n", $1, $2, $3, $4, $5, $6 }'
    done
else
    echo "(install jq for the summary table; the JSON files hold every figure)"
fi
exit "$failed"
