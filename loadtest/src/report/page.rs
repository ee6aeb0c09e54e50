//! BENCHMARKS.md: the header, every section in order, and the notes on how
//! the figures come about. Each table gives the figure, the target issue #4
//! sets, and the reference figure where the issue gives one; a figure that
//! was not measured says so. Nothing on the page is typed in by hand but
//! the targets, the references and the notes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::results::Results;
use super::{
    chaos, deflate, fanout, formats, hooks, identity, idle, micro, pods, presence, profile,
    publish, slow, stall, storm, streams, throughput, wire,
};

/// The whole page, from a results directory.
pub fn render(results: &Results) -> String {
    let sections = [
        header(results),
        fanout::section(results),
        profile::section(results),
        slow::section(results),
        idle::section(results),
        storm::section(results),
        identity::section(results),
        chaos::one_redis_section(results),
        chaos::cluster_section(results),
        pods::section(results),
        presence::section(results),
        hooks::section(results),
        publish::section(results),
        stall::section(results),
        throughput::section(results),
        streams::section(results),
        deflate::section(results),
        formats::section(results),
        wire::section(results),
        micro::section(results),
        notes(results),
    ];
    format!("{}\n\n", sections.join("\n\n"))
}

/// The title, what made the page, the machine and the day of the run.
fn header(results: &Results) -> String {
    let run = ["fanout", "slow", "idle", "storm", "throughput"]
        .into_iter()
        .find_map(|name| results.file(name));
    let (cores, cpu, kernel) = run.map_or_else(
        || ("?".to_owned(), "?".to_owned(), "?".to_owned()),
        |r| {
            (
                r.machine.cores.to_string(),
                r.machine.cpu.clone(),
                r.machine.kernel.clone(),
            )
        },
    );
    let when = run.map_or_else(SystemTime::now, |r| {
        UNIX_EPOCH + Duration::from_secs(r.finished_unix_s)
    });
    let day: String = humantime::format_rfc3339_seconds(when)
        .to_string()
        .chars()
        .take(10)
        .collect();
    format!(
        "# Herald benchmarks\n\
         \n\
         Produced by `scripts/bench.sh` (this file is its output: do not edit by hand).\n\
         Load generator (`herald-loadtest`) and gateways run on the same machine, so\n\
         every latency includes the clients' own share of the CPU.\n\
         \n\
         Machine: {cores} cores, {cpu}, Linux {kernel}; run on {day}.\n"
    )
}

/// How the figures come about, and what this machine cannot judge.
fn notes(results: &Results) -> String {
    format!(
        "## How the figures come about, and what cannot be judged here

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
  pings, three more cancellation tokens, and an emptied queue kept its buffer: 6.7 KiB here. Since
  that count: issue #23's server-side commands added 72 B to the task, and the drain's advice moved
  from a token watched per connection to the registry, which took the drain token and 96 B of the
  task away; issue #24 made `hello`'s deadline and the token's one field, 8 B more (its future is
  1,576 B: `cargo test -p gateway --lib sizes -- --nocapture`).
- **slow, healthy p99 within 10%.** Within the run-to-run spread of the fan-out itself. At 1 KiB ×
  40 rounds the slow client is never closed, because the kernel buffers all it is sent; the
  large-frame run shows the close.
- **pods, ≤ 2 ms cross-pod p99.** Not a measurement to lean on here: the 1,000 clients, two pods and
  Redis saturate the two cores, so the p99 is CPU queueing and the delta changes sign from run to
  run.
- **Absolute times.** Machines differ: this run's floor spent {per_send} of CPU per 1 KiB loopback
  `send`; an earlier machine took 5.8 µs. Compare ratios to the floor of the same run, not
  milliseconds across runs.",
        per_send = fanout::floor_send_cost(results)
    )
}
