#!/usr/bin/env bash
# Herald's benchmarks, all of them, and BENCHMARKS.md from their results.
#
# Builds once (release), runs the criterion micro-benchmarks, then every
# herald-loadtest scenario at the sizes issue #4 names, each against fresh
# `herald` processes on free loopback ports (and a redis-server where pods
# share work), and renders BENCHMARKS.md with `herald-loadtest report`. The
# JSON results and logs stay in $OUT. Everything it starts is stopped when
# it exits, however it exits. Takes about 24 minutes on 2 cores.
#
# Load generator and servers share this machine's cores: run it on a quiet
# machine, and read each run's CPU line ("others": CPU of processes not in
# the run; more than a few seconds means the figures are noisy).
#
# Usage: scripts/bench.sh            everything, then BENCHMARKS.md
#        scripts/bench.sh fanout ... only these parts (micro fanout profile slow
#                                    throughput wire storm storm-auth idle-auth idle pods
#                                    publish idle-pods idle-pods-cluster stall chaos
#                                    chaos-cluster),
#                                    then BENCHMARKS.md from what $OUT holds
#   OUT=target/bench  CLIENTS=10000  ROUNDS=40  (optional, defaults shown)
#   BEFORE=<an older herald binary>: `fanout`, `profile`, `throughput` and
#                                    `publish` (single publishes through Redis)
#                                    measure it as well, in the same run, for a
#                                    before/after (BEFORE_LABEL names it in
#                                    BENCHMARKS.md)
#
# `publish` and `idle-pods-cluster` start a Redis Cluster of 3 masters (no
# replicas) on loopback; each of their runs is on its own: one that fails
# (a process that does not start, a run that does not pass) is reported in
# the exit status, and the runs after it still run.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-target/bench}
CLIENTS=${CLIENTS:-10000}
ROUNDS=${ROUNDS:-40}
PARTS=("$@")
ALL_PARTS=(micro fanout profile slow throughput wire storm storm-auth idle-auth idle pods publish idle-pods
           idle-pods-cluster stall chaos chaos-cluster)
[ ${#PARTS[@]} -gt 0 ] || PARTS=("${ALL_PARTS[@]}")
BEFORE=${BEFORE:-}
HERALD=target/release/herald
# A gateway may hold up to its hard fd limit; leave room for everything else.
MAX_CONNECTIONS=$(( $(ulimit -Hn) - 500 ))

say() { printf '\n== %s\n' "$*"; }
wants() { local p; for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

# Only what this script sets: no HERALD_* from the caller's environment.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^HERALD_' || true)

pids=()
# Directories to remove once what uses them has stopped (a cluster's node files).
scratch=()
stop_all() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
    for dir in "${scratch[@]}"; do rm -rf "$dir"; done
    scratch=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# free_port <var>: sets <var> to a loopback port nobody listens on (nor got
# from here before), below the ephemeral range (32768+) that the clients' own
# connections use. (Not `$(free_port)`: a subshell would forget what it gave.)
used_ports=" "
free_port() {
    local candidate
    while :; do
        candidate=$(( 20000 + RANDOM % 12000 ))
        case "$used_ports" in *" $candidate "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
            used_ports+="$candidate "
            printf -v "$1" '%s' "$candidate"
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

# start_herald <name> [VAR=value...]: a herald on a free loopback port; sets
# $port and $pid.
start_herald() {
    local name=$1 grpc budgets=()
    shift
    free_port port
    free_port grpc
    # Every client comes from 127.0.0.1 (storm-auth's are all one user): the
    # budgets per address and per user are off, as the connection cap per
    # address is. Only for this build: a $BEFORE build may not know the keys.
    if [ "$HERALD" = target/release/herald ]; then
        budgets=(HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP=0 HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_USER=0
            HERALD_SESSION__TOPICS_PER_MINUTE=0 HERALD_SESSION__ANONYMOUS_MAX_TOPICS=0)
    fi
    env HERALD_LISTEN="127.0.0.1:$port" \
        HERALD_GRPC__LISTEN="127.0.0.1:$grpc" \
        HERALD_WEBSOCKET__MAX_CONNECTIONS="$MAX_CONNECTIONS" \
        HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP=0 \
        HERALD_LOG__LEVEL=warn \
        ${budgets[@]+"${budgets[@]}"} \
        "$@" "$HERALD" >"$OUT/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    wait_until 20 "$name" "$pid" curl -sf "http://127.0.0.1:$port/readyz"
    echo "$name: 127.0.0.1:$port (pid $pid)"
}

# start_redis: a redis-server on a free loopback port, no persistence; sets
# $redis_url and $redis_pid.
start_redis() {
    local redis_port
    free_port redis_port
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --protected-mode no >"$OUT/redis.log" 2>&1 &
    redis_pid=$!
    pids+=("$redis_pid")
    redis_up() { [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ]; }
    wait_until 10 redis "$redis_pid" redis_up
    redis_url="redis://127.0.0.1:$redis_port"
    echo "redis: $redis_url (pid $redis_pid)"
}

# free_cluster_port <var>: as free_port, for a cluster node: its bus port
# (the port + 10000) free too, and below the ephemeral range as well.
free_cluster_port() {
    local node_candidate bus
    while :; do
        free_port node_candidate
        bus=$(( node_candidate + 10000 ))
        [ "$bus" -lt 32768 ] || continue
        case "$used_ports" in *" $bus "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$bus") 2>/dev/null; then
            used_ports+="$bus "
            printf -v "$1" '%s' "$node_candidate"
            return
        fi
    done
}

# start_redis_cluster: a Redis Cluster of 3 masters and no replicas, each a
# redis-server on a free loopback port without persistence, its node file in
# a scratch directory; returns once every node says cluster_state:ok. Sets
# $cluster_urls (for HERALD_REDIS__CLUSTER), $cluster_ports and $cluster_pids.
start_redis_cluster() {
    local dir n node_port node_pid ok
    dir=$(mktemp -d "${TMPDIR:-/tmp}/herald-bench-cluster.XXXXXX")
    scratch+=("$dir")
    cluster_ports=() cluster_pids=() cluster_urls=""
    for n in 1 2 3; do
        free_cluster_port node_port
        redis-server --port "$node_port" --bind 127.0.0.1 --protected-mode no --dir "$dir" \
            --cluster-enabled yes --cluster-config-file "$dir/nodes-$node_port.conf" --cluster-node-timeout 2000 \
            --save '' --appendonly no >"$OUT/redis-cluster-$n.log" 2>&1 &
        node_pid=$!
        pids+=("$node_pid")
        node_up() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }
        wait_until 10 "redis-cluster-$n" "$node_pid" node_up "$node_port"
        cluster_ports+=("$node_port")
        cluster_pids+=("$node_pid")
        cluster_urls+="${cluster_urls:+,}redis://127.0.0.1:$node_port"
    done
    if ! redis-cli --cluster create "${cluster_ports[@]/#/127.0.0.1:}" --cluster-yes \
        >"$OUT/redis-cluster-create.log" 2>&1; then
        echo "redis-cli --cluster create failed; its output:" >&2
        cat "$OUT/redis-cluster-create.log" >&2
        exit 1
    fi
    for _ in $(seq 600); do   # 30 s
        ok=0
        for n in 0 1 2; do
            if ! kill -0 "${cluster_pids[$n]}" 2>/dev/null; then
                echo "redis-cluster-$(( n + 1 )) exited; its log:" >&2
                cat "$OUT/redis-cluster-$(( n + 1 )).log" >&2 || true
                exit 1
            fi
            if redis-cli -p "${cluster_ports[$n]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
                ok=$(( ok + 1 ))
            fi
        done
        if [ "$ok" = 3 ]; then
            echo "redis cluster: $cluster_urls (pids ${cluster_pids[*]})"
            return 0
        fi
        sleep 0.05
    done
    echo "redis cluster not ok within 30 s" >&2
    for n in 0 1 2; do redis-cli -p "${cluster_ports[$n]}" cluster info >&2 || true; done
    exit 1
}

failed=0
# loadtest <name> <scenario> <flags...>: one run; a failed run is reported at the end.
loadtest() {
    local name=$1
    shift
    target/release/herald-loadtest "$@" --out "$OUT/$name.json" || failed=1
}

# isolated <command...>: runs the command in a subshell that stops what it
# started when it ends, however it ends; if anything in it fails (a process
# that does not start exits the subshell, a failed run sets failed), that is
# reported at the end and what follows still runs.
isolated() {
    local status
    set +e
    (
        set -e
        trap stop_all EXIT
        trap 'exit 130' INT TERM
        pids=() scratch=()
        "$@"
        exit "$failed"
    )
    status=$?
    set -e
    [ "$status" != 130 ] || exit 130
    [ "$status" = 0 ] || { echo "failed: $* (exit status $status)" >&2; failed=1; }
}

# Python (PyJWT for storm-auth's token) is the
# scripts' venv, as in scripts/test.sh: made and filled here when missing.
. scripts/python-venv.sh
venv_install 'pyjwt[crypto]>=2.8,<3'
export PATH="$VENV/bin:$PATH"

say "build (release)"
cargo build --release -p gateway -p herald-loadtest --bins --example idle_memory
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

# before <name> <command...>: runs the command again against $BEFORE, with
# "-before" appended to the result's name, when $BEFORE is set.
before() {
    [ -n "$BEFORE" ] || return 0
    local name=$1
    shift
    say "$name, again with the build before: $BEFORE"
    printf '%s\n' "${BEFORE_LABEL:-$BEFORE}" >"$OUT/$name-before.label"
    HERALD=$BEFORE "$@" "$name-before"
    HERALD=target/release/herald
}

fanout_run() {
    start_herald "$1"
    loadtest "$1" fanout --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" --floor "${fanout[@]}"
    stop_all
}

# profile_run <name>: the gateway's CPU during the fan-out, sampled by perf
# (cpu-clock, 999 Hz), by shared object and symbol, into $OUT/<name>.txt.
profile_run() {
    local name=$1 perf_pid
    start_herald "$name"
    perf record -e cpu-clock -F 999 -o "$OUT/$name.data" -p "$pid" >"$OUT/$name-perf.log" 2>&1 &
    perf_pid=$!
    loadtest "$name-load" fanout --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" "${fanout[@]}"
    kill -INT "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" || true
    stop_all
    perf report -i "$OUT/$name.data" --stdio --no-children --sort dso,sym --percent-limit 0.2 \
        >"$OUT/$name.txt" 2>/dev/null || failed=1
}

if wants fanout; then
    say "fanout: $CLIENTS clients, 1 topic, 1 KiB, $ROUNDS rounds 500 ms apart, against the floor"
    fanout_run fanout
    before fanout fanout_run
fi

if wants profile; then
    say "profile: where the gateway's CPU goes during the fan-out (perf)"
    if perf record -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
        profile_run profile
        before profile profile_run
    else
        echo "perf cannot sample here (not installed, or perf_event_paranoid): no profile"
    fi
fi

if wants slow; then
    say "slow: the same, with one client that never reads"
    start_herald slow
    loadtest slow slow --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" --slow 1 "${fanout[@]}"
    stop_all
    say "slow, large frames: 20 clients, 60 KB, 50 ms apart (fills the kernel's buffers, so the close shows)"
    start_herald slow-close
    loadtest slow-close slow --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" --slow 1 \
        --clients 20 --size 60000 --rounds 80 --interval 50ms
    stop_all
fi

throughput_run() {
    start_herald "$1"
    loadtest "$1" throughput --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" \
        --clients 200 --topics 100 --subscriptions 50 --concurrency 8 --duration 10s --size 64
    stop_all
}

if wants throughput; then
    say "throughput: 64-byte messages, 200 clients on 50 of 100 topics each"
    throughput_run throughput
    before throughput throughput_run
fi

if wants wire; then
    say "wire: bytes on the wire per payload size"
    start_herald wire HERALD_HTTP__MAX_BODY_BYTES=2097152 HERALD_QUEUE__BYTES=4194304
    loadtest wire wire --gateway "ws://127.0.0.1:$port/ws"
    stop_all
fi

if wants storm; then
    say "storm: $CLIENTS sessions cut at once, every one resumes"
    start_herald storm
    loadtest storm storm --gateway "ws://127.0.0.1:$port/ws" --watch-pid "$pid" \
        --clients "$CLIENTS" --topics 10 --rate 50 --duration 10s --cut-at 3s --drain 20s --connections 16
    stop_all
fi

if wants storm-auth; then
    say "storm-auth: the same, every hello with an RS256 token that herald verifies"
    # The test key pair; the token is minted by PyJWT, from the venv.
    keys=gateway/src/auth/testdata
    token=$(python3 -c 'import jwt, sys, time
print(jwt.encode({"sub": "storm", "exp": int(time.time()) + 3600, "subscribe": ["*"]},
                 open(sys.argv[1]).read(), algorithm="RS256"))' "$keys/rsa.key.pem")
    start_herald storm-auth HERALD_AUTH__PUBLIC_KEY="$(cat "$keys/rsa.pub.pem")"
    loadtest storm-auth storm --gateway "ws://127.0.0.1:$port/ws" --watch-pid "$pid" --token "$token" \
        --clients "$CLIENTS" --topics 10 --rate 50 --duration 10s --cut-at 3s --drain 20s --connections 16
    stop_all
fi

if wants idle-auth; then
    say "idle-auth: what an idle subscribed connection costs, without and with a token"
    target/release/examples/idle_memory target/release/herald 5000 | tee "$OUT/idle-auth-off.txt" || failed=1
    target/release/examples/idle_memory target/release/herald 5000 auth | tee "$OUT/idle-auth-on.txt" || failed=1
fi

if wants idle; then
    say "idle: 19,000 connections held for 60 s, heartbeats every 5 s"
    start_herald idle HERALD_WEBSOCKET__PING_INTERVAL=5s
    loadtest idle idle --gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid" --clients 19000 --duration 60s
    stop_all
fi

if wants pods; then
    say "pods: 1,000 clients, 100 msg/s, 256 B; one pod against two over Redis"
    start_redis
    start_herald pod-a HERALD_BROKER=redis HERALD_REDIS__URL="$redis_url"
    a=$port pid_a=$pid
    start_herald pod-b HERALD_BROKER=redis HERALD_REDIS__URL="$redis_url"
    b=$port pid_b=$pid
    watch=(--watch-pid "$pid_a" --watch-pid "$pid_b" --watch-pid "$redis_pid")
    pods=(--clients 1000 --rate 100 --duration 10s --size 256)
    loadtest pods-one-pod pods --gateway "ws://127.0.0.1:$a/ws" --publish-to "http://127.0.0.1:$a" "${pods[@]}" "${watch[@]}"
    loadtest pods-cross-pod pods --gateway "ws://127.0.0.1:$b/ws" --publish-to "http://127.0.0.1:$a" "${pods[@]}" "${watch[@]}"
    stop_all
    start_herald memory
    loadtest pods-memory pods --gateway "ws://127.0.0.1:$port/ws" "${pods[@]}" --watch-pid "$pid"
    stop_all
fi

# Publishes back to back over 16 keep-alive HTTP connections for 10 s; nobody
# subscribes. Each run against a fresh herald (and fresh Redis).
publish=(--concurrency 16 --duration 10s)

# publish_memory_run <name>: one herald, embedded broker, single publishes.
publish_memory_run() {
    start_herald "$1"
    loadtest "$1" publish --publish-to "http://127.0.0.1:$port" "${publish[@]}" --topics 100 --watch-pid "$pid"
    stop_all
}

# publish_redis_run <name> [--batch N] [--topics N]: one herald, one
# redis-server; 100 topics unless told.
publish_redis_run() {
    local name=$1 n
    shift
    local flags=("$@")
    case " ${flags[*]} " in *" --topics "*) ;; *) flags+=(--topics 100) ;; esac
    start_redis
    # SUBSCRIBERS=<n>: that many connections (standing for pods) subscribed
    # to every publish's channel, reading all: what announcements cost Redis.
    for ((n = 0; n < ${SUBSCRIBERS:-0}; n++)); do
        python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
pattern = b"herald:{loadtest.publish.*"
s.sendall(b"*2\r\n$10\r\nPSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(pattern), pattern))
while s.recv(1 << 20):
    pass
' "${redis_url##*:}" &
        pids+=("$!")
    done
    start_herald "$name" HERALD_BROKER=redis HERALD_REDIS__URL="$redis_url"
    loadtest "$name" publish --publish-to "http://127.0.0.1:$port" "${publish[@]}" "${flags[@]}" \
        --watch-pid "$pid" --watch-pid "$redis_pid"
    stop_all
}

# publish_cluster_run <name> [flags...]: one herald on a Redis Cluster of 3
# masters; its CPU and every node's are watched.
publish_cluster_run() {
    local name=$1 node
    shift
    start_redis_cluster
    start_herald "$name" HERALD_BROKER=redis HERALD_REDIS__CLUSTER="$cluster_urls"
    local watch=(--watch-pid "$pid")
    for node in "${cluster_pids[@]}"; do watch+=(--watch-pid "$node"); done
    loadtest "$name" publish --publish-to "http://127.0.0.1:$port" "${publish[@]}" "$@" "${watch[@]}"
    # Every node holds some of the topics' keys, or the publishes did not
    # spread over the shards (or went to some other Redis).
    local keys=()
    for node in "${cluster_ports[@]}"; do keys+=("$(redis-cli -p "$node" dbsize 2>/dev/null || echo '?')"); done
    echo "$name: keys on each cluster node: ${keys[*]}"
    case " ${keys[*]} " in
        *" 0 "* | *" ? "*) echo "$name: a cluster node holds no key: the publishes did not spread over it" >&2; failed=1 ;;
    esac
    stop_all
}

if wants publish; then
    say "publish: 16 connections back to back, 10 s; embedded broker, one Redis, a Redis Cluster of 3 masters"
    isolated publish_memory_run publish-memory
    isolated publish_redis_run publish-redis
    # The build before has no batch endpoint: single publishes only.
    isolated before publish-redis publish_redis_run
    say "publish through one Redis, 100 per request"
    isolated publish_redis_run publish-redis-batch --batch 100
    say "publish through one Redis, 100 per request, 1,000 topics"
    isolated publish_redis_run publish-redis-batch-1000t --batch 100 --topics 1000
    say "publish through one Redis, 100 per request, 4 subscribers reading every announcement"
    SUBSCRIBERS=4 isolated publish_redis_run publish-redis-batch-4subs --batch 100
    say "publish through a Redis Cluster of 3 masters, 100 per request, 1,000 topics"
    isolated publish_cluster_run publish-cluster-batch --batch 100 --topics 1000
fi

# idle_pods_run <name> <pod log prefix> <VAR=value...> -- <redis pid...>:
# 60,000 connections over 4 pods with the broker settings given, held 60 s
# with heartbeats every 5 s; the redis pids are watched.
idle_pods_run() {
    local name=$1 prefix=$2 n settings=() watch=() gateways=()
    shift 2
    while [ "$1" != -- ]; do settings+=("$1"); shift; done
    shift
    for n in "$@"; do watch+=(--watch-pid "$n"); done
    for n in 1 2 3 4; do
        start_herald "$prefix-$n" "${settings[@]}" HERALD_WEBSOCKET__PING_INTERVAL=5s
        gateways+=(--gateway "ws://127.0.0.1:$port/ws" --gateway-pid "$pid")
    done
    loadtest "$name" idle "${gateways[@]}" --clients 60000 --duration 60s "${watch[@]}"
    stop_all
}

if wants idle-pods; then
    say "idle over 4 pods: 60,000 connections, Redis, 60 s"
    start_redis
    idle_pods_run idle-pods idle-pod HERALD_BROKER=redis HERALD_REDIS__URL="$redis_url" -- "$redis_pid"
fi

idle_pods_cluster_run() {
    start_redis_cluster
    idle_pods_run "$1" idle-cluster-pod HERALD_BROKER=redis HERALD_REDIS__CLUSTER="$cluster_urls" -- "${cluster_pids[@]}"
}

if wants idle-pods-cluster; then
    say "idle over 4 pods: 60,000 connections, a Redis Cluster of 3 masters, 60 s"
    isolated idle_pods_cluster_run idle-pods-cluster
fi

if wants stall; then
    say "stall: a pod watching 20,000 topics, Redis 200 ms away; a burst of 100 new topics, then a pub/sub reconnect"
    start_redis
    # Only the pod's path to Redis is slow: it goes through herald-loadtest
    # proxy (the kernel's netem needs root and a module this may not have),
    # whose control port the scenario sets the delay with once its 20,000
    # subscriptions are in place. CLIENT KILL goes to Redis directly.
    free_port proxy_port
    free_port control_port
    target/release/herald-loadtest proxy --listen "127.0.0.1:$proxy_port" --upstream "${redis_url#redis://}" \
        --control "127.0.0.1:$control_port" --for 30m >"$OUT/stall-proxy.log" 2>&1 &
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_until 10 stall-proxy "$proxy_pid" bash -c "exec 3<>/dev/tcp/127.0.0.1/$control_port"
    start_herald stall HERALD_BROKER=redis HERALD_REDIS__URL="redis://127.0.0.1:$proxy_port"
    loadtest stall stall --gateway "ws://127.0.0.1:$port/ws" --redis "$redis_url" \
        --proxy-control "127.0.0.1:$control_port" --redis-delay 200ms \
        --connections 200 --topics-per-connection 100 --burst-topics 100 --canary-interval 10ms
    stop_all
fi

if wants chaos; then
    say "chaos: 3 pods, Redis master + replica behind a proxy, 200 resuming clients, 50 msg/s for 2 min;"
    say "       Redis frozen, delayed, failed over to a lagging replica, restored from an old dump; pods killed"
    # It runs its own redis-servers and pods; their logs and dumps stay in $OUT/chaos.
    rm -rf "$OUT/chaos"
    loadtest chaos chaos --herald target/release/herald --dir "$OUT/chaos" \
        --pods 3 --clients 200 --topics 4 --subscriptions 2 --publishers 2 --rate 50 --duration 2m
fi

if wants chaos-cluster; then
    say "chaos-cluster: 3 pods, a Redis Cluster (3 masters, a replica each), 200 resuming clients, 50 msg/s for 2 min;"
    say "       masters killed, failed over by hand and to a lagging replica, topics' slots migrated; pods killed"
    # The same soak on its own Redis Cluster (six redis-servers); 6 topics,
    # 2 on each master. Logs stay in $OUT/chaos-cluster.
    rm -rf "$OUT/chaos-cluster"
    loadtest chaos-cluster chaos --herald target/release/herald --redis cluster --dir "$OUT/chaos-cluster" \
        --pods 3 --clients 200 --topics 6 --subscriptions 2 --publishers 2 --rate 50 --duration 2m
fi

say "BENCHMARKS.md"
target/release/herald-loadtest report "$OUT" >BENCHMARKS.md
echo "written: BENCHMARKS.md (results in $OUT/)"
exit "$failed"
