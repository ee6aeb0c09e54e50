#!/usr/bin/env python3
"""Renders BENCHMARKS.md from the results scripts/bench.sh leaves in a
directory (herald-loadtest's JSON files) and from criterion's estimates under
target/criterion. Each table: the figure, the target issue #4 sets, and the
reference figure where the issue gives one. A figure that was not measured
says so; nothing here is typed in by hand but the targets and references.

The JSON files are read by `herald-loadtest report <dir>`, through the types
that wrote them: a result field renamed in the tool fails its build (or the
report), not this page. The one exception: what `report` does not carry of a
`publish` run (publishes, batch size, each watched process's CPU, whether it
passed) is read from its file (`publish_result`), and shows as "n/a" if gone.

Usage: scripts/benchmarks.py <results dir>  (writes Markdown to stdout)
  HERALD_LOADTEST=target/release/herald-loadtest  (optional, default shown)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "target/bench")
CRITERION = Path("target/criterion")
LOADTEST = os.environ.get("HERALD_LOADTEST", "target/release/herald-loadtest")


def report():
    """Every result file in OUT, by name: the figures `herald-loadtest report` reads out of it."""
    if not OUT.is_dir():
        return {}
    out = subprocess.run([LOADTEST, "report", str(OUT)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


RESULTS = report()


def load(name):
    return RESULTS.get(name)


def ms(us):
    return "n/a" if us is None else f"{us / 1000:.1f} ms"


def x(v):
    return "n/a" if v is None else f"{v:.2f}×"


def verdict(ok):
    return "met" if ok else "**missed**"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_line(result):
    cpu = (result or {}).get("cpu") or {}
    if not cpu:
        return ""
    return (f"Machine busy {cpu.get('machine_busy_cores', 0):.2f} of {cpu.get('cores')} cores; "
            f"CPU of processes outside the run: {cpu.get('other_cpu_s', 0):.1f} s "
            f"(more than a few seconds means the figures are noisy).")


def criterion(group, bench):
    est = CRITERION / group / bench / "new" / "estimates.json"
    if not est.exists():
        return None
    return json.loads(est.read_text())["mean"]["point_estimate"]  # ns


def header():
    any_run = next((load(n) for n in ("fanout", "slow", "idle", "storm", "throughput") if load(n)), None)
    machine = (any_run or {}).get("machine") or {}
    when = time.strftime("%Y-%m-%d", time.gmtime((any_run or {}).get("finished_unix_s", time.time())))
    return f"""# Herald benchmarks

Produced by `scripts/bench.sh` (this file is its output: do not edit by hand).
Load generator (`herald-loadtest`) and gateways run on the same machine, so
every latency includes the clients' own share of the CPU.

Machine: {machine.get('cores', '?')} cores, {machine.get('cpu', '?')}, Linux {machine.get('kernel', '?')}; run on {when}.
"""


def fanout_section():
    r = load("fanout")
    out = ["## fanout: 10,000 clients, 1 topic, 1 KiB, 40 rounds 500 ms apart",
           "`herald-loadtest fanout --floor`: the floor (one thread writing the same frames to as many "
           "plain loopback sockets, no WebSocket library) runs first in the same invocation."]
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    floor = res.get("floor") or {}
    vs = res.get("vs_floor") or {}
    proc = (res.get("processes") or [{}])[0]
    rss = proc.get("rss_bytes") or []
    rows = [
        ["last client, median", ms(res["last_client"]["p50_us"]),
         f"≤ 1.0× floor ({ms(floor.get('last_client', {}).get('p50_us'))}): {x(vs.get('last_client_p50_x'))}, "
         f"{verdict((vs.get('last_client_p50_x') or 99) <= 1.0)}",
         "Go: sequential 90.9 ms, 10 sharded workers 30.8 ms, goroutine per client 31.4 ms (10 vCPU)"],
        ["last client, p99", ms(res["last_client"]["p99_us"]),
         f"≤ 1.2× floor ({ms(floor.get('last_client', {}).get('p99_us'))}): {x(vs.get('last_client_p99_x'))}, "
         f"{verdict((vs.get('last_client_p99_x') or 99) <= 1.2)}",
         "Go: 98.9 / 42.7 / 69.7 ms"],
        ["all deliveries p50 / p99", f"{ms(res['latency']['p50_us'])} / {ms(res['latency']['p99_us'])}", "", ""],
        ["gateway CPU per round", f"{proc.get('cpu_per_round_s', 0) * 1000:.1f} ms",
         f"≤ 1.15× the floor writer's ({floor.get('writer_cpu_per_round_s', 0) * 1000:.1f} ms): "
         f"{x(vs.get('cpu_per_round_x'))}, {verdict((vs.get('cpu_per_round_x') or 99) <= 1.15)}", ""],
        ["gateway RSS", f"{(max(rss) if rss else 0) / 2**20:.1f} MiB (max over rounds)", "",
         "Go: ~240 to 292 MB (goroutine per client)"],
        ["delivered / lost / duplicated", f"{res['deliveries']} / {res['lost']} / {res['duplicated']}", "0 lost, 0 duplicated", ""],
    ]
    out.append(table(["figure", "Herald", "target", "reference"], rows))
    split = res.get("gateway_cpu")
    if split:
        out.append(f"herald user-space cost per delivery: {split['user_ns_per_delivery']:.0f} ns; "
                   f"kernel {split['system_ns_per_delivery']:.0f} ns "
                   f"(gateway CPU per round: user {split['user_per_round_s'] * 1000:.1f} ms, "
                   f"kernel {split['system_per_round_s'] * 1000:.1f} ms; from /proc, 10 ms ticks).")
    out.append(cpu_line(res))
    before = load("fanout-before")
    if before:
        b = before["result"]
        bvs = b.get("vs_floor") or {}
        bsplit = b.get("gateway_cpu") or {}
        out.append(f"The build before ({before_label('fanout')}), measured right after in the same run: gateway CPU per "
                   f"round {x(bvs.get('cpu_per_round_x'))} its floor writer's, last client median "
                   f"{x(bvs.get('last_client_p50_x'))} and p99 {x(bvs.get('last_client_p99_x'))} its floor; "
                   f"user-space cost per delivery {bsplit.get('user_ns_per_delivery', 0):.0f} ns, kernel "
                   f"{bsplit.get('system_ns_per_delivery', 0):.0f} ns.")
    return "\n\n".join(out)


def before_label(name):
    """What the `BEFORE=` build of result `name` was (BEFORE_LABEL)."""
    for label in (OUT / f"{name}-before.label", OUT / "before-label.txt"):
        if label.exists():
            return label.read_text().strip()
    return "an older build"


def perf_profile(name):
    """A `perf report --sort dso,sym` text: [(percent, object, symbol)], or None."""
    path = OUT / f"{name}.txt"
    if not path.exists():
        return None
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%") and not line.startswith("#"):
            try:
                percent = float(parts[0].rstrip("%"))
            except ValueError:
                continue
            symbol = parts[3].split("] ", 1)[-1]
            # Rust's legacy mangling leaves a hash: `::h0123456789abcdef`.
            if "::h" in symbol and len(symbol.rsplit("::h", 1)[1]) == 16:
                symbol = symbol.rsplit("::h", 1)[0]
            rows.append((percent, parts[1], symbol))
    return rows


def profile_section():
    out = ["## profile: where the gateway's CPU goes during the fan-out",
           "`perf record -e cpu-clock` on the gateway during the `fanout` scenario above (no floor run), "
           "`perf report --sort dso,sym`: shares of the gateway's samples."]
    runs = [(name, label) for name, label in (("profile", "this build"), ("profile-before", before_label('profile')))
            if perf_profile(name)]
    if not runs:
        return "\n\n".join(out + ["Not run (perf unavailable, or the part was not asked for)."])
    rows = []
    for name, label in runs:
        prof = perf_profile(name)
        kernel = sum(p for p, obj, _ in prof if obj.startswith("[kernel"))
        herald = sum(p for p, obj, _ in prof if obj == "herald")
        libc = sum(p for p, obj, _ in prof if obj.startswith("libc"))
        top = [f"{s} {p:.1f}%" for p, obj, s in sorted(prof, reverse=True) if obj == "herald"][:8]
        rows.append([label, f"{kernel:.0f}%", f"{herald:.0f}%", f"{libc:.0f}%", "; ".join(f"`{t}`" for t in top)])
    out.append(table(["build", "kernel", "herald", "libc", "top symbols in herald (share of all samples)"], rows))
    return "\n\n".join(out)


def slow_section():
    out = ["## slow: the same, with one client that never reads"]
    r = load("slow")
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    ratio = res.get("p99_with_over_without")
    slow = (res.get("slow_clients") or [{}])[0]
    growth = max((g.get("growth", 0) for g in res.get("rss") or []), default=None)
    rows = [
        ["healthy clients' p99 without / with it",
         f"{ms(res['without']['latency']['p99_us'])} / {ms(res['with']['latency']['p99_us'])} ({x(ratio)})",
         f"within 10%: {verdict(ratio is not None and ratio <= 1.10)}",
         "Go, sequential loop: every client waited 1.1 s"],
        ["last client, median without / with",
         f"{ms(res['without']['last_client']['p50_us'])} / {ms(res['with']['last_client']['p50_us'])}", "", ""],
        ["slow client closed", slow.get("end") if not slow.get("closed") else
         f"after {slow.get('closed_after_s', 0):.2f} s ({slow.get('reason')})", "within write timeout + 1 s", ""],
        ["gateway RSS growth from round 5", "n/a" if growth is None else f"{growth * 100:.1f}%",
         f"within 10%: {verdict(growth is not None and growth <= 0.10)}", ""],
    ]
    out.append(table(["figure", "Herald", "target", "reference"], rows))
    out.append(cpu_line(res["run"]))
    big = load("slow-close")
    if big:
        b = big["result"]
        s = (b.get("slow_clients") or [{}])[0]
        out.append(
            "At 1 KiB × 40 rounds the kernel buffers everything the slow client is sent (a loopback socket "
            "takes a few MB), so the gateway's writes never block and there is nothing to close. With 60 KB "
            f"frames (20 clients, 80 rounds 50 ms apart) the slow client was "
            + (f"closed {s.get('closed_after_s', 0):.2f} s into the slow phase, reason `{s.get('reason')}`, "
               f"its write stuck at most {s.get('blocked_for_s') or 0:.2f} s (write timeout 5 s)"
               if s.get("closed") else f"not closed ({s.get('end')})")
            + f"; healthy p99 {ms(b['without']['latency']['p99_us'])} without it, "
              f"{ms(b['with']['latency']['p99_us'])} with it.")
    return "\n\n".join(out)


def idle_section():
    out = ["## idle: connections held with heartbeats running"]
    rows = []
    # With the log bench.sh leaves of the run's (first) herald: there and no result means the run failed.
    for name, label, log in (("idle", "19,000 on one gateway, 60 s, ping every 5 s", "idle"),
                             ("idle-pods", "60,000 over 4 gateways with Redis, 60 s", "idle-pod-1"),
                             ("idle-pods-cluster", "60,000 over 4 gateways with a Redis Cluster (3 masters), 60 s",
                              "idle-cluster-pod-1")):
        r = load(name)
        if not r:
            failed = (OUT / f"{log}.log").exists()
            rows.append([label, f"**failed**: no result (`{log}.log` in the results)" if failed else "not run", "", ""])
            continue
        res = r["result"]
        per = res.get("rss_per_connection_bytes") or 0
        pods = ", ".join(f"{p['connections']:,}" for p in res.get("pods", []))
        rows.append([label, f"{per / 1024:.2f} KiB per connection; {res['unexpected_closes']} unexpected closes; "
                     f"pings answered {res.get('pings_answered', 0):,}; per pod: {pods}",
                     f"≤ 4 KiB, 0 closes: {verdict(per <= 4096 and res['unexpected_closes'] == 0)}", ""])
    out.append(table(["run", "Herald", "target", "reference"], rows))
    return "\n\n".join(out)


def storm_section():
    out = ["## storm: 10,000 sessions cut at once, every one resumes"]
    r = load("storm")
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    ok = (res["all_resumed_s"] or 99) <= 5 and res["lost"] == 0 and res["app_duplicates"] == 0 \
        and res["resumed"] == res["cut_clients"]
    rows = [
        ["all resumed after the cut", f"{res['all_resumed_s']:.2f} s ({res['resumed']:,} of {res['cut_clients']:,})",
         f"≤ 5 s: {verdict(ok)}", ""],
        ["per-client resume p50 / p99", f"{ms(res['resume_time']['p50_us'])} / {ms(res['resume_time']['p99_us'])}", "", ""],
        ["lost / duplicated (application)", f"{res['lost']} / {res['app_duplicates']}", "0 / 0", ""],
        ["redelivered on the wire (dropped by the client rule)", f"{res['wire_duplicates']:,}", "", ""],
    ]
    out.append(table(["figure", "Herald", "target", "reference"], rows))
    out.append(f"Cut: {res.get('cut')}; {res['clients']:,} clients on {res['topics']} topics, "
               f"{res['rate_per_s']:.0f} msg/s, acks every {res['ack_interval_ms']} ms. " + cpu_line(res))
    return "\n\n".join(out)


def stall_section():
    out = ["## stall: one pod, 20,000 watched topics, Redis 200 ms away",
           "`herald-loadtest stall`: a canary topic published every 10 ms on a pod that watches 20,000 "
           "other topics, Redis behind `herald-loadtest proxy`. Phases: steady; a burst of new topics; the "
           "pod's pub/sub connection killed (`CLIENT KILL TYPE pubsub`), so that it resyncs every topic. "
           "A slow Redis must not stop fan-out for the topics that have nothing to do with it.",
           "Before the pub/sub task stopped waiting for Redis itself (2f95892, the same command): burst "
           "p99 640 ms, longest gap 463 ms; resync: no canary delivered for the whole 20 s phase (2,004 "
           "of 2,004), the pod reading 20,033 topics one 200 ms round trip at a time, over an hour."]
    r = load("stall")
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    rows = []
    for p in res["phases"]:
        lat = p["latency"]
        none = p["delivered"] == 0
        rows.append([f"{p['name']} ({p['seconds']:.0f} s)", "none delivered" if none else ms(lat["p99_us"]),
                     "none delivered" if none else ms(lat["max_us"]),
                     f"{p['longest_gap_ms']:.0f} ms", f"{p['undelivered']} of {p['sent']}"])
    out.append(table(["phase", "canary p99", "canary max", "longest gap", "not delivered"], rows))
    burst = res["burst_confirmed_s"]
    after = res["first_delivery_after_kill_s"]
    out.append(f"{res['burst_topics']} new topics confirmed: "
               f"{'not within the phase' if burst is None else f'{burst:.1f} s'}; first canary sent after the kill delivered after: "
               f"{'none' if after is None else f'{after:.2f} s'}. Canary lost / duplicated / out of order / resets: "
               f"{res['lost']} / {res['duplicated']} / {res['out_of_order']} / {res['resets']}.")
    return "\n\n".join(out)


def chaos_section():
    return chaos_table("chaos", "## chaos: Redis frozen, delayed, failed over and restored from an old dump; every stream checked",
                       "A fault lost writes when the Redis the pods came back to held less of a topic's epoch than had been "
                       "acknowledged or delivered; Herald moves every topic to a new epoch then, so each subscription gets a "
                       "reset. ")


def chaos_cluster_section():
    return chaos_table("chaos-cluster", "## chaos on a Redis Cluster: masters killed, failed over by hand and to a lagging "
                                        "replica, slots migrated; every stream checked",
                       "The pods use a Redis Cluster of three masters with a replica each (`--redis cluster`), the "
                       "topics two on each master at the start. `master-kill`: kill -9 of a master, its replica promoted "
                       "by the cluster after the node timeout (1 s), a fresh replica in the dead master's place after "
                       "the hold; `manual-failover`: `CLUSTER FAILOVER` (the master waits for its replica, nothing "
                       "lost); `lagging-failover`: the replica frozen (SIGSTOP) and its link cut while the master takes "
                       "writes for the hold, then the master killed and the replica promoted (`CLUSTER FAILOVER "
                       "FORCE`); `migrate`: a topic's slot moved to the next master, mid-migration (`ASK`) for the "
                       "hold; `pod-kill`: kill -9 of a pod. A fault hits one master (the masters in turn): the writes "
                       "it lost are counted on that master's topics, read from the replica before it could be "
                       "promoted, and only a reset of one of those topics is explained by it; Herald keeps a lineage "
                       "per hash slot, so only the topics whose slot lost writes move to a new epoch. ")


def chaos_table(name, title, how):
    out = [title]
    r = load(name)
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    faults = res["faults"]
    kinds = ", ".join(f"{k} {n}" for k, n in res["faults_by_kind"].items())
    lossy = sum(1 for f in faults if f["lost_writes"] > 0)
    clean = res["lost"] == 0 and res["duplicated"] == 0 and res["mismatched"] == 0 and res["ack_conflicts"] == 0
    rows = [
        ["ran", f"{res['ran_s']:.0f} s: {res['pods']} pods, {res['clients']} clients with sessions "
                f"({res['subscriptions']} of {res['topics']} topics each), {res['publishers']} publishers, "
                f"{res['rate_per_s']:.0f} msg/s", "", ""],
        ["faults injected", f"{len(faults)} ({kinds})", "", ""],
        ["writes Redis lost", f"{res['lost_writes']:,} ({res['lost_acked_writes']:,} acknowledged) in {lossy} faults",
         "", ""],
        ["publishes acknowledged", f"{res['acked']:,} of {res['published']:,}", "", ""],
        ["messages checked", f"{res['checked']:,} ({res['processed']:,} processed, {res['redelivered']:,} "
                             f"redelivered after resumes and dropped by the seq rule)", "", ""],
        ["lost / duplicated / mismatched", f"{res['lost']} / {res['duplicated']} / {res['mismatched']}",
         f"0 / 0 / 0: {verdict(clean)}", ""],
        ["resets after faults that lost writes / history gaps / elsewhere",
         f"{res['resets_expected']:,} / {res['resets_history']} / {res['resets_unexpected']}",
         f"none elsewhere: {verdict(res['resets_unexpected'] == 0)}", ""],
        ["sessions resumed / lost", f"{res['resumes']:,} / {res['sessions_lost']}", "", ""],
    ]
    out.append(table(["figure", "Herald", "target", "reference"], rows))
    if any(f.get("master") for f in faults):
        out.append(table(["fault", "at", "master (its topics)", "writes lost (acknowledged)", "resets"],
                         [[f["kind"], f"{f['at_s']:.1f} s",
                           f"{f['master']} ({', '.join(map(str, f.get('topics') or [])) or 'none'})" if f.get("master")
                           else "", f"{f['lost_writes']} ({f['lost_acked']})", f["resets"]]
                          for f in faults]))
        by_kind = {}
        for f in faults:
            n, lost, resets = by_kind.get(f["kind"], (0, 0, 0))
            by_kind[f["kind"]] = (n + 1, lost + f["lost_writes"], resets + f["resets"])
        out.append("Masters are named by port. Writes lost and resets by kind: "
                   + "; ".join(f"{k} {lost} lost, {resets} resets in {n}" for k, (n, lost, resets) in by_kind.items())
                   + ". Publishes that failed, by reason: "
                   + ("; ".join(res.get("publish_error_reasons") or []) or "none") + ".")
    else:
        out.append(table(["fault", "at", "writes lost (acknowledged)", "resets"],
                         [[f["kind"], f"{f['at_s']:.1f} s", f"{f['lost_writes']} ({f['lost_acked']})", f["resets"]]
                          for f in faults]))
    problems = res.get("problem_counts") or {}
    if problems:
        out.append("Streams that failed the check, by kind: "
                   + ", ".join(f"{k} {n}" for k, n in problems.items())
                   + " (the run's `streams.txt` shows the first few of each, with the session stored at the end).")
    out.append(f"Seed {res['seed']} (`--seed` replays the schedule). Each client checks its stream per topic: split "
               "at every `reset`, seqs contiguous and never processed twice within an epoch, every message the "
               "publish its publisher was acknowledged for at that `(topic, epoch, seq)`, the last segment up to "
               "the topic's newest acknowledged seq. " + how + cpu_line(res))
    return "\n\n".join(out)


def pods_section():
    out = ["## pods: the cross-pod cost (1,000 clients, 100 msg/s, 256 B)"]
    rows = []
    for name, label in (("pods-memory", "one pod, memory broker"), ("pods-one-pod", "Redis, subscribers on the publisher's pod"),
                        ("pods-cross-pod", "Redis, subscribers on the other pod")):
        r = load(name)
        if not r:
            rows.append([label, "not run", "", "", ""])
            continue
        res = r["result"]
        rows.append([label, ms(res["latency"]["p50_us"]), ms(res["latency"]["p99_us"]), ms(res["latency"]["max_us"]),
                     f"{res['lost']} / {res['duplicated']}"])
    out.append(table(["run", "p50", "p99", "max", "lost / dup"], rows))
    one, cross = load("pods-one-pod"), load("pods-cross-pod")
    if one and cross:
        delta = (cross["result"]["latency"]["p99_us"] - one["result"]["latency"]["p99_us"]) / 1000
        out.append(f"Cross-pod p99 minus same-pod p99: {delta:+.1f} ms (target ≤ 2 ms: {verdict(delta <= 2)}). "
                   + cpu_line(cross["result"]))
    out.append("Publish throughput, through one Redis and through a cluster, is the `publish` section's.")
    return "\n\n".join(out)


def publish_result(name):
    """A `publish` run's figures: `report`'s, and what it does not carry, read from the result file itself:
    publishes, batch, topics, errors, passed and failures, and the CPU of each watched process
    (`cpu.watched`: pid, name, cpu_s). None if the run left no file."""
    r = load(name)
    if not r:
        return None
    res = dict(r["result"])
    path = OUT / f"{name}.json"
    envelope = json.loads(path.read_text()) if path.exists() else {}
    raw = envelope.get("result") or {}
    for key in ("publishes", "batch", "topics", "concurrency", "errors", "first_error"):
        res.setdefault(key, raw.get(key))
    cpu = dict(raw.get("cpu") or {})
    cpu.update(res.get("cpu") or {})
    res["cpu"] = cpu
    res["passed"] = envelope.get("passed", True)
    res["failures"] = envelope.get("failures") or []
    return res


def cpu_per_publish(res, redis):
    """Microseconds of CPU per accepted publish, of the watched Redis processes (redis=True: summed, and each
    node's) or of the others (the gateway): (total, [each]), or (None, []) if not measured."""
    watched = [w for w in (res.get("cpu") or {}).get("watched") or []
               if (w.get("name") or "").startswith("redis") == redis]
    publishes = res.get("publishes")
    if not watched or not publishes or any(w.get("cpu_s") is None for w in watched):
        return None, []
    each = [w["cpu_s"] / publishes * 1e6 for w in watched]
    return sum(each), each


def us(v):
    return "n/a" if v is None else f"{v:.1f} µs"


def fine_ms(v):
    """Microseconds as milliseconds, two decimals below 10 ms (a publish's round trip is a fraction of one)."""
    return "n/a" if v is None else f"{v / 1000:.2f} ms" if v < 10_000 else ms(v)


def publish_section():
    out = ["## publish: through one Redis and through a cluster",
           "`herald-loadtest publish`: 16 keep-alive HTTP connections publish back to back for 10 s, nobody "
           "subscribed; single publishes go to `/v1/publish`, batches (`--batch`) to `/v1/publish/batch`, one "
           "request each; latency is a request's (a whole batch's). Every run against a fresh herald and a fresh "
           "Redis: one `redis-server`, or a Redis Cluster of 3 masters without replicas (`HERALD_REDIS__CLUSTER`), "
           "all on this machine. CPU per publish: a process's CPU seconds over the run divided by the publishes "
           "accepted; the cluster's is its three nodes' summed (each node's in brackets)."]
    runs = (("publish-memory", "embedded broker, single publishes, 100 topics"),
            ("publish-redis", "one Redis, single publishes, 100 topics"),
            ("publish-redis-batch", "one Redis, 100 per request, 100 topics"),
            ("publish-redis-batch-4subs", "one Redis, 100 per request, 100 topics, 4 subscribers reading every announcement"),
            ("publish-redis-batch-1000t", "one Redis, 100 per request, 1,000 topics"),
            ("publish-cluster-batch", "Redis Cluster (3 masters), 100 per request, 1,000 topics"))
    rows = []
    for name, label in runs:
        res = publish_result(name)
        if not res:
            # bench.sh names the run's herald log after it: there and no result means it did not get to run.
            failed = (OUT / f"{name}.log").exists()
            rows.append([label, f"**failed**: no result (`{name}.log` in the results)" if failed else "not run",
                         "", "", "", "", ""])
            continue
        herald, _ = cpu_per_publish(res, redis=False)
        redis, each = cpu_per_publish(res, redis=True)
        if name == "publish-memory":
            redis_cell = "(none)"
        elif len(each) > 1:
            redis_cell = f"{us(redis)} ({' + '.join(f'{e:.1f}' for e in each)})"
        else:
            redis_cell = us(redis)
        rate = f"{res['per_second']:,.0f}"
        if not res["passed"]:
            rate += f" (**failed**: {'; '.join(res['failures'])})"
        cpu = res.get("cpu") or {}
        busy = f"{cpu['machine_busy_cores']:.2f} of {cpu.get('cores')}" if "machine_busy_cores" in cpu else "n/a"
        rows.append([label, rate, fine_ms(res["latency"]["p50_us"]), fine_ms(res["latency"]["p99_us"]), us(herald),
                     redis_cell, busy])
    out.append(table(["run", "publishes/s", "p50", "p99", "herald CPU per publish", "Redis CPU per publish",
                      "machine busy (cores)"], rows))
    one, cluster = publish_result("publish-redis-batch-1000t"), publish_result("publish-cluster-batch")
    if one and cluster and one["per_second"]:
        r1, _ = cpu_per_publish(one, redis=True)
        rc, _ = cpu_per_publish(cluster, redis=True)
        out.append(f"At 1,000 topics and 100 per request, three masters against one Redis: "
                   f"{cluster['per_second'] / one['per_second']:.2f}× the publishes/s, "
                   + (f"{rc / r1:.2f}× Redis's CPU per publish" if r1 and rc else "Redis CPU per publish n/a")
                   + ". Load generator, herald and every Redis share this machine's cores: where the machine "
                     "is busy on all of them, publishes/s is bounded by the cores, not by Redis, and the CPU "
                     "per publish is the figure to compare. A script call holds the publishes of one hash "
                     "slot only (its keys must share one), so with 1,000 topics a batch's publishes rarely "
                     "share a call on a cluster, and each pays the call's own cost; on one Redis, up to 64 "
                     "of any topics share one.")
        masters = [w for w in (cluster.get("cpu") or {}).get("watched") or []
                   if (w.get("name") or "").startswith("redis")]
        wall = (cluster.get("cpu") or {}).get("wall_s")
        if masters and wall:
            busiest = max(m["cpu_s"] for m in masters) / wall
            if busiest:
                out.append(f"Each master was {busiest:.2f} of a core busy at most: with a core each, three "
                           f"masters would take about {cluster['per_second'] / busiest:,.0f} publishes/s "
                           "(estimated: the run's rate over its busiest master's share of a core).")
    quiet, heard = publish_result("publish-redis-batch"), publish_result("publish-redis-batch-4subs")
    if quiet and heard:
        r0, _ = cpu_per_publish(quiet, redis=True)
        r4, _ = cpu_per_publish(heard, redis=True)
        if r0 and r4:
            out.append(f"What an announcement costs Redis: with 4 connections subscribed to every topic (each "
                       f"standing for a pod; a pattern subscription, since the load tool names its topics per "
                       f"run) Redis spent {r4 - r0:.1f} µs more per publish than with none: "
                       f"{(r4 - r0) / 4:.2f} µs per announcement, with Redis busy (the announcements for one "
                       f"subscriber leave together, in one write per turn of its event loop).")
    target = publish_result("publish-redis-batch")
    if target:
        rate = target["per_second"]
        out.append(f"Target (issue #14): through one Redis at least 3× the 12,224 publishes/s measured when the "
                   f"issue was filed (36,672): {rate:,.0f} with batches of 100 ({rate / 12224:.1f}×): "
                   + ("met." if rate >= 3 * 12224 else "**not met**."))
    before = publish_result("publish-redis-before")
    if before:
        herald, _ = cpu_per_publish(before, redis=False)
        redis, _ = cpu_per_publish(before, redis=True)
        out.append(f"The build before ({before_label('publish-redis')}), measured right after in the same run, single publishes "
                   f"through one Redis: {before['per_second']:,.0f} publishes/s, p50 {fine_ms(before['latency']['p50_us'])}, "
                   f"p99 {fine_ms(before['latency']['p99_us'])}; CPU per publish: herald {us(herald)}, Redis {us(redis)}"
                   + ("" if before["passed"] else f" (**failed**: {'; '.join(before['failures'])})") + ".")
    return "\n\n".join(out)


def throughput_section():
    out = ["## throughput: many topics, 64-byte messages, as fast as the gateway takes them"]
    r = load("throughput")
    if not r:
        return "\n\n".join(out + ["Not run."])
    res = r["result"]
    per_cpu = res.get("deliveries_per_gateway_cpu_s") or 0
    rows = [
        ["deliveries per gateway CPU-second", f"{per_cpu:,.0f}", f"≥ 300,000: {verdict(per_cpu >= 300_000)}"],
        ["deliveries per second", f"{res['deliveries_per_s']:,.0f}", ""],
        ["publishes per second", f"{res['publishes_per_s']:,.0f}", ""],
        ["lost / duplicated", f"{res['lost']} / {res['duplicated']}", "0 / 0"],
    ]
    out.append(table(["figure", "Herald", "target"], rows))
    out.append(f"{res['clients']} clients, each on {res['subscriptions_per_client']} of {res['topics']} topics "
               f"({res['fanout']:.0f} subscribers per topic), {res['concurrency']} publishing connections. " + cpu_line(res))
    before = load("throughput-before")
    if before:
        b = before["result"]
        out.append(f"The build before ({before_label('throughput')}), measured right after in the same run: "
                   f"{b.get('deliveries_per_gateway_cpu_s') or 0:,.0f} deliveries per gateway CPU-second, "
                   f"{b['deliveries_per_s']:,.0f} per second.")
    return "\n\n".join(out)


def wire_section():
    out = ["## Wire overhead: server to client, against an HTTP/1.1 POST of the same payload"]
    r = load("wire")
    if not r:
        return "\n\n".join(out + ["Not run."])
    rows = []
    for s in r["result"]["sizes"]:
        if s.get("error"):
            rows.append([s["payload_bytes"], "error: " + s["error"], "", "", ""])
            continue
        p = s["payload_bytes"]
        rows.append([f"{p:,} B", f"{s['herald_bytes']:,}", f"{s['herald_bytes'] - p:,} ({s['header_bytes']} header + "
                     f"{s['envelope_bytes']} envelope)", f"{s['http_post_bytes']:,}", f"{s['http_post_bytes'] - p:,}"])
    out.append("Payload: a JSON string of that many bytes. Herald's bytes: the WebSocket frame a subscriber reads "
               "(header, the `msg` envelope with topic and seq, the payload), measured off a raw socket. "
               "HTTP: a minimal POST (Host, Content-Type, Content-Length) of the same body.")
    out.append(table(["payload", "Herald frame", "Herald overhead", "HTTP POST", "HTTP overhead"], rows))
    return "\n\n".join(out)


def identity_section():
    out = ["## Identity: the cost of checking tokens"]
    rows = []
    for bench, label in (("HS256", "HS256"), ("RS256_2048", "RS256 (2048-bit key)"), ("ES256", "ES256 (P-256)"),
                         ("EdDSA", "EdDSA (Ed25519)")):
        ns = criterion("verify", bench)
        rows.append([f"verify one token per `hello`, {label}",
                     "n/a" if ns is None else f"{ns / 1000:.1f} µs", ""])
    r = load("storm-auth")
    if r:
        res = r["result"]
        ok = (res["all_resumed_s"] or 99) <= 5 and res["lost"] == 0 and res["app_duplicates"] == 0 \
            and res["resumed"] == res["cut_clients"]
        rows.append(["storm with RS256 tokens: all resumed after the cut",
                     f"{res['all_resumed_s']:.2f} s ({res['resumed']:,} of {res['cut_clients']:,}), "
                     f"{res['lost']} lost, {res['app_duplicates']} duplicated", f"≤ 5 s, 0 lost: {verdict(ok)}"])
    else:
        rows.append(["storm with RS256 tokens", "not run", "≤ 5 s, 0 lost"])
    for name, label in (("idle-auth-off", "idle subscribed connection, open mode"),
                        ("idle-auth-on", "idle subscribed connection, with a token (HS256)")):
        path = OUT / f"{name}.txt"
        text = path.read_text() if path.exists() else ""
        per = next((w for w in text.split(", ")[-1:] if "bytes per connection" in w), None)
        rows.append([label, per.split(" bytes")[0] + " B of herald RSS" if per else "not run",
                     "(5,000 connections, `gateway/examples/idle_memory`)"])
    out.append(table(["figure", "Herald", "target / note"], rows))
    out.append("Verification is criterion's `cargo bench -p gateway --bench auth` (one `verify` per iteration: "
               "header, signature, claims, grants). The storm is the one above with every `hello` carrying "
               "an RS256 token, minted by PyJWT, that the pod verifies.")
    return "\n\n".join(out)


def micro_section():
    out = ["## Micro-benchmarks (criterion, `cargo bench -p gateway --bench wire --bench fanout`)"]
    rows = []
    mib = 1 << 20
    for bench, label in (("reader_unmask", "unmask 1 MiB, Herald's reader (fastwebsockets::unmask)"),
                         ("byte_loop", "unmask 1 MiB, plain byte loop"), ("copy_from_slice", "memcpy 1 MiB (ceiling)")):
        ns = criterion("unmask_1MiB", bench)
        rows.append([label, "n/a" if ns is None else f"{ns / 1000:.1f} µs",
                     "n/a" if ns is None else f"{mib / ns:.1f} GB/s",
                     f"≥ 10 GB/s: {verdict(ns is not None and mib / ns >= 10)}" if bench == "reader_unmask" else "",
                     "naive XOR 0.29 ms (3.5 GB/s)" if bench == "byte_loop" else ""])
    for group, bench, label in (("encode_frame", "msg_1KiB_publication", "encode the `msg` frame of a 1 KiB publication"),
                                ("encode_frame", "ok_reply", "encode an `ok` reply"),
                                ("decode_command", "sub", "JSON decode of a `sub` command"),
                                ("publish", "1KiB_to_10k_local_queues", "publish 1 KiB to 10,000 local subscriber queues"),
                                ("publish", "1KiB_direct_writes_to_10k_counting_sinks",
                                 "publish 1 KiB to 10,000 connections, written directly into counting sinks "
                                 "(Herald's own cost per delivery, without the kernel's)")):
        ns = criterion(group, bench)
        value = "n/a" if ns is None else (f"{ns / 1000:.0f} µs" if ns > 10_000 else f"{ns:.0f} ns")
        rate = f"{ns / 10_000:.0f} ns per delivery" if ns is not None and "10k" in bench else ""
        rows.append([label, value, rate, "", ""])
    out.append(table(["benchmark", "time", "rate", "target", "reference"], rows))
    return "\n\n".join(out)


def misses_section():
    return """## How the figures come about, and what cannot be judged here

- **fanout against the floor.** The hub fills each subscriber's queue under its topic's lock, then
  writes straight to the sockets it found idle, from tasks of 128 connections each, so that both
  cores write at once; only what a socket does not take at once is left to the connection's writer.
  The profile section shows where the gateway's CPU goes: about three quarters in the kernel's
  `send` path (TCP, the loopback receive, the wake-up of the reading client), the path the floor's
  writer spends its time in too; most of Herald's own share is cache misses on 10,000 connections'
  queues and sockets (`write_now`, `push`, the socket's `as_fd`), which a loop over plain sockets
  does not have. So the gateway's CPU per round stays a little above the floor writer's,
  and the last client beats the floor because the writes are spread over both cores while the
  floor's one thread writes alone. Before, every frame woke the connection's writer task: on the
  same machine 173 ms of gateway CPU per round, and the last client at 1.00× (p99 1.06×) the floor.
- **throughput.** The tasks that write directly yield once before they write, so that
  publications already arriving are queued first and one `send` carries several frames. Without
  that, a run on the same machine gave 169,192 deliveries per gateway CPU-second; the build before
  direct writes, 194,613.
- **idle, ≤ 4 KiB per connection.** What an idle subscribed connection holds, by allocation
  (heaptrack on `gateway/examples/idle_memory`, 5,000 connections, bytes asked of malloc;
  2026-12-01): its one task 1.83 KiB (reader, writer, session and socket halves in one future, with
  one timer for heartbeats and deadlines; commands and the session's end are boxed while they run);
  its entries in the maps it belongs to (its subscriptions, the topic's subscribers, the pod's live
  sessions) 0.44 KiB; the outgoing queue's shared state 0.35 KiB; tokio's registration of the
  socket 0.26 KiB; the session's shared state 0.24 KiB; the drain token 0.11 KiB; ids 0.1 KiB; the
  socket's halves 0.05 KiB; malloc's own headers make up the rest of the RSS. Before issue #16 the
  reader and the writer were two tasks (3.0 KiB and 0.7 KiB of future) with a second timer for
  pings, three more cancellation tokens, and an emptied queue kept its buffer: 6.7 KiB here.
- **slow, healthy p99 within 10%.** Within the run-to-run spread of the fan-out itself. At 1 KiB ×
  40 rounds the slow client is never closed, because the kernel buffers all it is sent; the
  large-frame run shows the close.
- **pods, ≤ 2 ms cross-pod p99.** Not a measurement to lean on here: the 1,000 clients, two pods and
  Redis saturate the two cores, so the p99 is CPU queueing and the delta changes sign from run to
  run.
- **Absolute times.** Machines differ: this run's floor spent {per_send} of CPU per 1 KiB loopback
  `send`; an earlier machine took 5.8 µs. Compare ratios to the floor of the same run, not
  milliseconds across runs.""".format(per_send=floor_send_cost())


def floor_send_cost():
    r = load("fanout")
    floor = ((r or {}).get("result") or {}).get("floor") or {}
    cpu, clients = floor.get("writer_cpu_per_round_s"), floor.get("clients")
    return f"{cpu / clients * 1e6:.1f} µs" if cpu and clients else "(not measured)"


print("\n\n".join([header(), fanout_section(), profile_section(), slow_section(), idle_section(), storm_section(), identity_section(),
                   chaos_section(), chaos_cluster_section(), pods_section(), publish_section(), stall_section(), throughput_section(), wire_section(),
                   micro_section(), misses_section()]) + "\n")
