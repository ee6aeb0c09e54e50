//! The publish path's cost: one 1 KiB publication handed to the hub, encoded
//! once and pushed to 10,000 local subscriber queues. Queues are drained
//! between iterations, outside the measurement.
//!
//! And the direct-write path without the kernel: the same publication
//! fanned out to 10,000 connections whose sockets are counting sinks, the
//! direct writes run to the end. What it measures is Herald's own cost per
//! delivery (queue, lock, task per chunk, metrics), which a loopback
//! `send` hides in a real run; divide by 10,000 for the cost of one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway::hub::Hub;
use gateway::metrics::Metrics;
use gateway::outbound::Outbound;
use gateway::session::{Limits, Overflow, Subscriptions};
use router::{Deliver, Publication, Topic};

const SUBSCRIBERS: usize = 10_000;

/// `SUBSCRIBERS` live subscribers of `topic`, each with the queue `queue`
/// makes.
fn subscribers(hub: &Hub, topic: &Topic, queue: impl Fn(Limits) -> Outbound) -> Vec<Outbound> {
    let limits = Limits {
        frames: 1024,
        bytes: 1 << 20,
        overflow: Overflow::Disconnect,
    };
    (0..SUBSCRIBERS as u64)
        .map(|conn| {
            let out = queue(limits);
            hub.join(topic, conn, out.clone(), Subscriptions::default());
            let live = hub.go_live(
                topic,
                conn,
                &router::Position {
                    epoch: Arc::from("bench"),
                    seq: 0,
                },
            );
            assert!(live, "nothing was held aside");
            out
        })
        .collect()
}

/// The `seq`th publication of `data` to `topic`.
fn publication(topic: &Topic, seq: u64, data: &Bytes) -> Publication {
    Publication {
        topic: topic.clone(),
        epoch: Arc::from("bench"),
        seq,
        data: data.clone(),
    }
}

fn publish_to_local_queues(c: &mut Criterion) {
    // No runtime: the queues have no sockets, and the fan-out wakes their
    // (absent) writers instead of spawning direct writes.
    let hub = Hub::new(Arc::new(Metrics::new()), 1024, 1 << 20);
    let topic = Topic::parse("bench").expect("topic");
    let queues = subscribers(&hub, &topic, Outbound::new);
    let data = Bytes::from(format!("\"{}\"", "x".repeat(1022)));
    let mut seq = 0;
    let mut batch = Vec::new();

    let mut group = c.benchmark_group("publish");
    group.throughput(Throughput::Elements(SUBSCRIBERS as u64));
    group.bench_function("1KiB_to_10k_local_queues", |b| {
        b.iter_custom(|iterations| {
            let mut spent = Duration::ZERO;
            for _ in 0..iterations {
                seq += 1;
                let publication = publication(&topic, seq, &data);
                let start = Instant::now();
                hub.deliver(&publication, None);
                spent += start.elapsed();
                for out in &queues {
                    if let Some(taken) = out.take(&mut batch) {
                        out.written(taken.bytes);
                    }
                    batch.clear();
                }
            }
            spent
        })
    });
    group.finish();
    assert!(
        queues.iter().all(|q| !q.is_closing()),
        "no queue overflowed"
    );
}

fn direct_writes_to_counting_sinks(c: &mut Criterion) {
    // One thread: the figure is the CPU of the fan-out, not of a spread
    // over cores that varies from machine to machine.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let metrics = Arc::new(Metrics::new());
    let hub = Hub::new(metrics.clone(), 1024, 1 << 20);
    let topic = Topic::parse("bench").expect("topic");
    let queues = subscribers(&hub, &topic, |limits| {
        Outbound::with_counting_sink(limits).0
    });
    let data = Bytes::from(format!("\"{}\"", "x".repeat(1022)));
    let mut seq = 0;

    let mut group = c.benchmark_group("publish");
    group.throughput(Throughput::Elements(SUBSCRIBERS as u64));
    group.bench_function("1KiB_direct_writes_to_10k_counting_sinks", |b| {
        b.iter_custom(|iterations| {
            let start = Instant::now();
            for _ in 0..iterations {
                seq += 1;
                let publication = publication(&topic, seq, &data);
                let delivered = metrics.delivered.get() + SUBSCRIBERS as u64;
                runtime.block_on(async {
                    hub.deliver(&publication, None);
                    // The direct writes run in tasks of their own.
                    while metrics.delivered.get() < delivered {
                        tokio::task::yield_now().await;
                    }
                });
            }
            start.elapsed()
        })
    });
    group.finish();
    assert!(
        queues.iter().all(|q| !q.is_closing()),
        "no queue overflowed"
    );
    let given = queues[0].sink_bytes().expect("a counting sink");
    assert!(given > 1024 * seq, "{given} bytes for {seq} frames");
    assert!(
        queues.iter().all(|q| q.sink_bytes() == Some(given)),
        "every sink was given every frame"
    );
}

criterion_group!(
    benches,
    publish_to_local_queues,
    direct_writes_to_counting_sinks
);
criterion_main!(benches);
