#!/usr/bin/env bash
# Herald's benchmarks, all of them, and BENCHMARKS.md from their results.
#
# Builds once (release), runs the criterion micro-benchmarks, then every
# herald-loadtest scenario at the sizes issue #4 names: each line below is one
# `herald-loadtest run`, which starts what the run needs (fresh `herald` pods
# of the build on free loopback ports, a redis-server or a Redis Cluster
# where pods share work, a delaying proxy), runs the scenario against them
# and stops them, however it ends. `herald-loadtest report` renders
# BENCHMARKS.md from the results. The JSON results and logs stay in $OUT.
# Takes about 30 minutes on 2 cores.
#
# Load generator and servers share this machine's cores: run it on a quiet
# machine, and read each run's CPU line ("others": CPU of processes not in
# the run; more than a few seconds means the figures are noisy).
#
# Usage: scripts/bench.sh            everything, then BENCHMARKS.md
#        scripts/bench.sh fanout ... only these parts (micro fanout profile slow lag
#                                    throughput wire storm storm-auth idle-auth idle pods
#                                    publish idle-pods idle-pods-cluster stall chaos
#                                    chaos-cluster presence fanout-presence hooks
#                                    streams idle-sse sse-failover deflate formats),
#                                    then BENCHMARKS.md from what $OUT holds
#   The parts of issue #25 (SSE and HTTP-streaming):
#     streams       `throughput` over WebSocket, SSE and HTTP-streaming
#                   clients, in two shapes (1,000 clients on 10 of 100
#                   topics: streams-ws, -sse, -stream; 1,000 on 1 of 10:
#                   streams-one-*), 64 B, 10 s, three rounds (-2, -3): each
#                   stream transport's deliveries per gateway CPU-second as
#                   a ratio of the WebSocket's in its round, the median
#                   round's reported (target >= 0.8x)
#     idle-sse      $CLIENTS idle SSE streams held 60 s, heartbeats every 5 s:
#                   gateway RSS per stream, as `idle` measures a WebSocket's
#                   (target <= 6 KiB)
#     sse-failover  $FAILOVER_CLIENTS EventSource-style clients round-robin
#                   over 2 pods sharing a Redis, 50 msg/s; the second pod
#                   killed with kill -9 at 3 s, its clients back at the first
#                   with Last-Event-ID: lost and duplicated per client
#                   (target 0 and 0)
#   The parts of issue #26 (compression, the binary subprotocol, deltas):
#     deflate       permessage-deflate on and off, in one run of each shape,
#                   against the same build: the fan-out of `fanout` ($CLIENTS
#                   clients, 1 topic, 1 KiB, $ROUNDS rounds 500 ms apart), its
#                   clients the load tool's own (tokio-tungstenite has no
#                   deflate) without (`--raw`) and with (`--compression`) the
#                   offer: gateway CPU per delivery on against off (target
#                   <= 1.1x), user space and kernel apart (the kernel's share
#                   with the smaller frames), wire bytes per delivery; the
#                   `throughput` shape (200 clients on 50 of 100 topics, 1 KiB)
#                   without and with: deliveries per gateway CPU-second
#                   (target >= 0.9x); $CLIENTS idle connections held 60 s
#                   without and with deflate negotiated: gateway memory per
#                   connection (target: no more with it)
#     formats       bytes on the wire and gateway CPU per delivery in each
#                   wire format: JSON, JSON+deflate, protobuf
#                   (herald.v1.protobuf), protobuf+deflate, and each with
#                   deltas (the namespace's delta on), for a chat payload
#                   (~200 B JSON) and a 2-4 KiB scoreboard a few fields of
#                   which change per update; $FORMATS_CLIENTS clients per
#                   phase, 200 updates 20 ms apart; every payload put back
#                   together and checked against the one published (targets,
#                   state: delta+deflate <= 0.15x the JSON bytes,
#                   JSON+deflate <= 0.4x)
#   OUT=target/bench  CLIENTS=10000  ROUNDS=40  FAILOVER_CLIENTS=1000  FORMATS_CLIENTS=1000
#                                    (optional, defaults shown)
#   LAG_CLIENTS=100  LAG_ROUNDS=10000: `lag`'s healthy clients and pause
#   BEFORE=<an older herald binary>: `fanout`, `profile`, `throughput` and
#                                    `publish` (single publishes through Redis)
#                                    measure it as well, in the same run, for a
#                                    before/after (BEFORE_LABEL names it in
#                                    BENCHMARKS.md)
#   HOOKS_QUICK=1: `hooks` at its --quick size (well under a minute)
#   BUILD=debug: debug binaries, to check the plumbing quickly with small
#                sizes (CLIENTS=50 ROUNDS=3 BUILD=debug scripts/bench.sh fanout);
#                its figures mean nothing, so its page is $OUT/BENCHMARKS.md
#
# `publish` and `idle-pods-cluster` start a Redis Cluster of 3 masters (no
# replicas) on loopback. Each run is on its own: one that fails (a process
# that does not start, a run that does not pass) is reported in the exit
# status, and the runs after it still run.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-target/bench}
CLIENTS=${CLIENTS:-10000}
ROUNDS=${ROUNDS:-40}
FAILOVER_CLIENTS=${FAILOVER_CLIENTS:-1000}
FORMATS_CLIENTS=${FORMATS_CLIENTS:-1000}
BUILD=${BUILD:-release}
PARTS=("$@")
ALL_PARTS=(micro fanout profile slow lag throughput wire storm storm-auth idle-auth idle pods publish idle-pods
           idle-pods-cluster stall chaos chaos-cluster presence fanout-presence hooks streams idle-sse
           sse-failover deflate formats)
[ ${#PARTS[@]} -gt 0 ] || PARTS=("${ALL_PARTS[@]}")
BEFORE=${BEFORE:-}
case "$BUILD" in
    release) cargo_build=(--release) ;;
    debug) cargo_build=() ;;
    *) echo "BUILD=$BUILD: release or debug" >&2; exit 64 ;;
esac
HERALD=target/$BUILD/herald
LOADTEST=target/$BUILD/herald-loadtest

say() { printf '\n== %s\n' "$*"; }
wants() { local p; for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

failed=0
# run <name> [run flags...] -- <scenario> <flags...>: one run of the load
# tool against the servers it starts (see `herald-loadtest run --help`); a
# failed run is reported at the end.
run() {
    local name=$1
    shift
    "$LOADTEST" run "$name" --dir "$OUT" --herald "$HERALD" "$@" || failed=1
}
# With BEFORE=, the runs that compare builds run it as well (`<name>-before`).
before=()
[ -z "$BEFORE" ] || before=(--before "$BEFORE" --before-label "${BEFORE_LABEL:-$BEFORE}")

# Python (PyJWT for storm-auth's token) is the scripts' venv, as in
# scripts/test.sh: made and filled here when missing.
if wants storm-auth; then
    . scripts/python-venv.sh
    venv_install 'pyjwt[crypto]>=2.8,<3'
    export PATH="$VENV/bin:$PATH"
fi

say "build ($BUILD)"
cargo build ${cargo_build[@]+"${cargo_build[@]}"} -p gateway -p herald-loadtest --bins --example idle_memory
mkdir -p "$OUT"
# A part's results are <part>.json and <part>-*.json, except those of a part
# whose name starts with its own (idle-pods-cluster.json is not idle-pods',
# nor idle's).
owner() {
    local file=$1 p best=""
    for p in "${ALL_PARTS[@]}"; do
        case "$file" in "$p".json | "$p"-*.json) if [ ${#p} -gt ${#best} ]; then best=$p; fi ;; esac
    done
    printf '%s' "$best"
}
for part in "${PARTS[@]}"; do
    for file in "$OUT/$part".json "$OUT/$part"-*.json; do
        if [ -e "$file" ] && [ "$(owner "${file##*/}")" = "$part" ]; then rm -f "$file"; fi
    done
done
printf 'machine: %s cores, %s, kernel %s\n' "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(uname -r)"

fanout=(--clients "$CLIENTS" --topics 1 --size 1024 --rounds "$ROUNDS" --interval 500ms)

if wants micro; then
    say "micro-benchmarks (criterion)"
    cargo bench -p gateway --bench wire --bench fanout --bench auth -- --noplot | tee "$OUT/micro.log"
    # Criterion keeps its estimates under target/criterion; `herald-loadtest report` reads them there.
fi

if wants fanout; then
    say "fanout: $CLIENTS clients, 1 topic, 1 KiB, $ROUNDS rounds 500 ms apart, against the floor"
    run fanout ${before[@]+"${before[@]}"} -- fanout --floor "${fanout[@]}"
fi

if wants profile; then
    say "profile: where the gateway's CPU goes during the fan-out (perf)"
    if perf record -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
        run profile --perf ${before[@]+"${before[@]}"} -- fanout "${fanout[@]}"
    else
        echo "perf cannot sample here (not installed, or perf_event_paranoid): no profile"
    fi
fi

if wants slow; then
    say "slow: the same, with one client that never reads"
    # A write stuck 5 s closes the client that never reads (the default, 30 s,
    # lets a live client pause: see `lag`).
    run slow --env HERALD_WEBSOCKET__WRITE_TIMEOUT=5s -- slow --slow 1 "${fanout[@]}"
    say "slow, large frames: 20 clients, 60 KB, 50 ms apart (fills the kernel's buffers, so the close shows)"
    run slow-close --env HERALD_WEBSOCKET__WRITE_TIMEOUT=5s -- slow --slow 1 --clients 20 --size 60000 --rounds 80 --interval 50ms
fi

if wants lag; then
    # Issue #25: lagging clients caught up from history. History long enough
    # for the pause (10,000 rounds), so that no one needs a reset.
    say "lag: 100 of 200 clients stop reading for 10 s while 10,000 messages flow, then read again"
    lag=(--catch-up 20 --clients "${LAG_CLIENTS:-100}" --topics 1 --size 256
         --rounds "${LAG_ROUNDS:-10000}" --interval 1ms)
    run lag --env HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE=20000 -- slow --slow 100 "${lag[@]}"
    # The same rounds without the slow clients: the healthy clients' p99
    # over the pause's rounds, against the run above's (target: within 10%).
    say "lag, baseline: the same run without the 100 slow clients"
    run lag-baseline --env HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE=20000 -- slow --slow 0 "${lag[@]}"
fi

if wants throughput; then
    say "throughput: 64-byte messages, 200 clients on 50 of 100 topics each"
    run throughput ${before[@]+"${before[@]}"} -- throughput \
        --clients 200 --topics 100 --subscriptions 50 --concurrency 8 --duration 10s --size 64
fi

if wants streams; then
    say "streams: deliveries per gateway CPU-second over WebSocket, SSE and HTTP-streaming clients"
    # Two shapes for the three, each against a fresh pod, 100 subscribers
    # per topic (as in `throughput`): 1,000 clients on 10 of 100 topics each
    # (within SSE's streams.max_topics, 16), and 1,000 on one of 10 topics
    # each (an SSE event's id grows with its stream's topics).
    streams=(--clients 1000 --topics 100 --subscriptions 10 --concurrency 8 --duration 10s --size 64)
    streams_one=(--clients 1000 --topics 10 --subscriptions 1 --concurrency 8 --duration 10s --size 64)
    # Three rounds, each running the three transports one after the
    # other: one run's figure moves by a fifth between runs here, so the
    # report takes the median round's ratio (rounds 2 and 3 are `-2`, `-3`).
    for round in 1 2 3; do
        suffix=$([ "$round" = 1 ] || echo "-$round")
        for transport in ws sse stream; do
            run "streams-$transport$suffix" -- throughput --transport "$transport" "${streams[@]}"
        done
        for transport in ws sse stream; do
            run "streams-one-$transport$suffix" -- throughput --transport "$transport" "${streams_one[@]}"
        done
    done
fi

if wants deflate; then
    # permessage-deflate on and off in one run, against the same build. The
    # fan-out's clients are the load tool's own both times (`--raw`: no
    # offer; `--compression`: Chromium's offer, every frame inflated), so
    # that only the offer differs; their payload is fanout's stamp padded
    # with one repeated byte (compression's best case: `formats` has
    # realistic payloads).
    say "deflate: fanout, $CLIENTS clients, 1 topic, 1 KiB, $ROUNDS rounds, without and with permessage-deflate"
    run deflate-fanout-off -- fanout --raw "${fanout[@]}"
    run deflate-fanout-on -- fanout --compression "${fanout[@]}"
    deflate_throughput=(--clients 200 --topics 100 --subscriptions 50 --concurrency 8 --duration 10s --size 1024)
    say "deflate: throughput, 1 KiB, 200 clients on 50 of 100 topics, without and with"
    run deflate-throughput-off -- throughput "${deflate_throughput[@]}"
    run deflate-throughput-on -- throughput "${deflate_throughput[@]}" --compression
    say "deflate: $CLIENTS idle connections held 60 s, without and with compression negotiated"
    run deflate-idle-off --env HERALD_WEBSOCKET__PING_INTERVAL=5s -- idle --clients "$CLIENTS" --duration 60s
    run deflate-idle-on --env HERALD_WEBSOCKET__PING_INTERVAL=5s -- idle --clients "$CLIENTS" --duration 60s --compression
fi

if wants formats; then
    say "formats: bytes and gateway CPU per delivery in each wire format, chat and state payloads"
    # Deltas on in the default namespace: only the subscriptions that ask
    # get them, so the other formats' phases are as without.
    run formats --env HERALD_NAMESPACES__DEFAULT__DELTA=true -- formats --clients "$FORMATS_CLIENTS" \
        --updates 200 --interval 20ms
fi

if wants wire; then
    say "wire: bytes on the wire per payload size"
    run wire --env HERALD_HTTP__MAX_BODY_BYTES=2097152 --env HERALD_QUEUE__BYTES=4194304 -- wire
fi

storm=(--clients "$CLIENTS" --topics 10 --rate 50 --duration 10s --cut-at 3s --drain 20s --connections 16)

if wants storm; then
    say "storm: $CLIENTS sessions cut at once, every one resumes"
    run storm -- storm "${storm[@]}"
fi

if wants storm-auth; then
    say "storm-auth: the same, every hello with an RS256 token that herald verifies"
    # The test key pair; the token is minted by PyJWT, from the venv.
    keys=gateway/src/auth/testdata
    token=$(python3 -c 'import jwt, sys, time
print(jwt.encode({"sub": "storm", "exp": int(time.time()) + 3600, "subscribe": ["*"]},
                 open(sys.argv[1]).read(), algorithm="RS256"))' "$keys/rsa.key.pem")
    run storm-auth --env HERALD_AUTH__PUBLIC_KEY="$(cat "$keys/rsa.pub.pem")" -- storm --token "$token" "${storm[@]}"
fi

if wants idle-auth; then
    say "idle-auth: what an idle subscribed connection costs, without and with a token"
    "target/$BUILD/examples/idle_memory" "$HERALD" 5000 | tee "$OUT/idle-auth-off.txt" || failed=1
    "target/$BUILD/examples/idle_memory" "$HERALD" 5000 auth | tee "$OUT/idle-auth-on.txt" || failed=1
fi

if wants idle; then
    say "idle: 19,000 connections held for 60 s, heartbeats every 5 s"
    run idle --env HERALD_WEBSOCKET__PING_INTERVAL=5s -- idle --clients 19000 --duration 60s
fi

if wants idle-sse; then
    say "idle-sse: $CLIENTS SSE streams held for 60 s, heartbeats every 5 s"
    run idle-sse --env HERALD_WEBSOCKET__PING_INTERVAL=5s -- idle --transport sse --clients "$CLIENTS" --duration 60s
fi

if wants sse-failover; then
    say "sse-failover: $FAILOVER_CLIENTS SSE clients over 2 pods sharing a Redis, 50 msg/s; the second pod killed (kill -9) at 3 s"
    # The load tool kills the run's last pod and publishes to the first; the
    # clients come back with Last-Event-ID (history: 100 per topic, 5 msg/s
    # per topic).
    run sse-failover --pods 2 --redis one -- sse-failover --clients "$FAILOVER_CLIENTS" --topics 10 \
        --rate 50 --duration 10s --kill-at 3s
fi

if wants pods; then
    say "pods: 1,000 clients, 100 msg/s, 256 B; one pod against two over Redis"
    pods=(--clients 1000 --rate 100 --duration 10s --size 256)
    # Two pods on one Redis; the publisher posts to the first.
    run pods-one-pod --pods 2 --redis one --clients-on 0 -- pods "${pods[@]}"
    run pods-cross-pod --pods 2 --redis one --clients-on 1 -- pods "${pods[@]}"
    run pods-memory -- pods "${pods[@]}"
fi

if wants publish; then
    # Publishes back to back over 16 keep-alive HTTP connections for 10 s;
    # nobody subscribes. Each run against a fresh herald (and fresh Redis).
    publish=(--concurrency 16 --duration 10s)
    say "publish: 16 connections back to back, 10 s; embedded broker, one Redis, a Redis Cluster of 3 masters"
    run publish-memory -- publish "${publish[@]}" --topics 100
    # The build before has no batch endpoint: single publishes only.
    run publish-redis --redis one ${before[@]+"${before[@]}"} -- publish "${publish[@]}" --topics 100
    say "publish through one Redis, 100 per request"
    run publish-redis-batch --redis one -- publish "${publish[@]}" --batch 100 --topics 100
    say "publish through one Redis, 100 per request, 1,000 topics"
    run publish-redis-batch-1000t --redis one -- publish "${publish[@]}" --batch 100 --topics 1000
    say "publish through one Redis, 100 per request, 4 subscribers reading every announcement"
    run publish-redis-batch-4subs --redis one --redis-subscribers 4 -- publish "${publish[@]}" --batch 100 --topics 100
    say "publish through a Redis Cluster of 3 masters, 100 per request, 1,000 topics"
    run publish-cluster-batch --redis cluster -- publish "${publish[@]}" --batch 100 --topics 1000
fi

# 60,000 connections over 4 pods, held 60 s with heartbeats every 5 s.
idle_pods=(--pods 4 --env HERALD_WEBSOCKET__PING_INTERVAL=5s)

if wants idle-pods; then
    say "idle over 4 pods: 60,000 connections, Redis, 60 s"
    run idle-pods "${idle_pods[@]}" --redis one -- idle --clients 60000 --duration 60s
fi

if wants idle-pods-cluster; then
    say "idle over 4 pods: 60,000 connections, a Redis Cluster of 3 masters, 60 s"
    run idle-pods-cluster "${idle_pods[@]}" --redis cluster -- idle --clients 60000 --duration 60s
fi

if wants stall; then
    say "stall: a pod watching 20,000 topics, Redis 200 ms away; a burst of 100 new topics, then a pub/sub reconnect"
    # Only the pod's path to Redis is slow: it goes through the load tool's
    # proxy (the kernel's netem needs root and a module this may not have),
    # whose control port the scenario sets the delay with once its 20,000
    # subscriptions are in place. CLIENT KILL goes to Redis directly.
    run stall --redis one --redis-proxy -- stall --redis-delay 200ms \
        --connections 200 --topics-per-connection 100 --burst-topics 100 --canary-interval 10ms
fi

if wants chaos; then
    say "chaos: 3 pods, Redis master + replica behind a proxy, 200 resuming clients, 50 msg/s for 2 min;"
    say "       Redis frozen, delayed, failed over to a lagging replica, restored from an old dump; pods killed"
    # It runs its own redis-servers and pods; their logs and dumps stay in $OUT/chaos.
    rm -rf "$OUT/chaos"
    "$LOADTEST" chaos --herald "$HERALD" --dir "$OUT/chaos" --out "$OUT/chaos.json" \
        --pods 3 --clients 200 --topics 4 --subscriptions 2 --publishers 2 --rate 50 --duration 2m || failed=1
fi

if wants chaos-cluster; then
    say "chaos-cluster: 3 pods, a Redis Cluster (3 masters, a replica each), 200 resuming clients, 50 msg/s for 2 min;"
    say "       masters killed, failed over by hand and to a lagging replica, topics' slots migrated; pods killed"
    # The same soak on its own Redis Cluster (six redis-servers); 6 topics,
    # 2 on each master. Logs stay in $OUT/chaos-cluster.
    rm -rf "$OUT/chaos-cluster"
    "$LOADTEST" chaos --herald "$HERALD" --redis cluster --dir "$OUT/chaos-cluster" --out "$OUT/chaos-cluster.json" \
        --pods 3 --clients 200 --topics 6 --subscriptions 2 --publishers 2 --rate 50 --duration 2m || failed=1
fi

if wants presence; then
    say "presence: a $CLIENTS-member room on 4 pods sharing one Redis; members churn while messages flow,"
    say "          a quiet window, timed pages and stats, a rolling restart of every pod, kill -9 of one"
    # It runs its own redis-server and pods (to drain, restart and kill
    # them); their logs stay in $OUT/presence. Then the same room with the
    # namespace's presence off, for the message latency without it.
    rm -rf "$OUT/presence" "$OUT/presence-off"
    "$LOADTEST" presence --herald "$HERALD" --dir "$OUT/presence" --out "$OUT/presence.json" \
        --pods 4 --members "$CLIENTS" --churn $((CLIENTS / 20)) || failed=1
    "$LOADTEST" presence --herald "$HERALD" --dir "$OUT/presence-off" --out "$OUT/presence-off.json" \
        --pods 4 --members "$CLIENTS" --churn $((CLIENTS / 20)) --presence-off || failed=1
fi

if wants fanout-presence; then
    say "fanout-presence: the fanout run with its topic's namespace without presence, then with it (and join/leave)"
    # The room at rest is compared: 12 rounds (6 s) untimed, as the join
    # storm's last counts-only diff goes out up to 5 s after it; and 100
    # rounds timed, as the p99 of 40 is their slowest.
    fanout_presence=(--clients "$CLIENTS" --topics 1 --size 1024 --rounds 112 --warmup 12 --interval 500ms)
    run fanout-presence-off -- fanout "${fanout_presence[@]}"
    run fanout-presence-on --env HERALD_NAMESPACES__DEFAULT__PRESENCE=true \
        --env HERALD_NAMESPACES__DEFAULT__JOIN_LEAVE=true -- fanout "${fanout_presence[@]}"
fi

if wants hooks; then
    say "hooks: $CLIENTS handshakes through the connect proxy (backend 1 ms), then $CLIENTS with HS256 tokens, same pod;"
    say "       pubs through the publish proxy beside pubs without; webhooks while clients connect, publish, close"
    # It runs its own pods (their configuration names its backend's port);
    # their logs stay in $OUT/hooks. HOOKS_QUICK=1:
    # the run of well under a minute (1,000 handshakes of each kind).
    rm -rf "$OUT/hooks"
    size=(--handshakes "$CLIENTS")
    [ -z "${HOOKS_QUICK:-}" ] || size=(--quick)
    "$LOADTEST" hooks --herald "$HERALD" --dir "$OUT/hooks" --out "$OUT/hooks.json" "${size[@]}" || failed=1
fi

# A debug build's figures mean nothing: its page stays beside its results.
page=BENCHMARKS.md
[ "$BUILD" = release ] || page=$OUT/BENCHMARKS.md
say "$page"
"$LOADTEST" report "$OUT" >"$page"
echo "written: $page (results in $OUT/)"
exit "$failed"
