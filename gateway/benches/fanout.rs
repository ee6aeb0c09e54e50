//! The publish path's cost: one 1 KiB publication handed to the hub, encoded
//! once and pushed to 10,000 local subscriber queues. Queues are drained
//! between iterations, outside the measurement.

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

fn publish_to_local_queues(c: &mut Criterion) {
    // No runtime: the queues have no sockets, and the fan-out wakes their
    // (absent) writer tasks instead of spawning direct writes.
    let hub = Hub::new(Arc::new(Metrics::new()), 1024);
    let topic = Topic::parse("bench").expect("topic");
    let limits = Limits {
        frames: 1024,
        bytes: 1 << 20,
        overflow: Overflow::Disconnect,
    };
    let queues: Vec<Outbound> = (0..SUBSCRIBERS as u64)
        .map(|conn| {
            let out = Outbound::new(limits);
            hub.join(&topic, conn, out.clone(), Subscriptions::default());
            hub.go_live(
                &topic,
                conn,
                &router::Position {
                    epoch: Arc::from("bench"),
                    seq: 0,
                },
            );
            out
        })
        .collect();
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
                let publication = Publication {
                    topic: topic.clone(),
                    epoch: Arc::from("bench"),
                    seq,
                    data: data.clone(),
                };
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

criterion_group!(benches, publish_to_local_queues);
criterion_main!(benches);
