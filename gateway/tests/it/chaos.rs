//! `herald-loadtest chaos` at CI size against the real binary: two pods and
//! a Redis master and replica that the scenario runs itself, clients
//! resuming across the pods, a publisher, while Redis fails over to a
//! replica that lagged and is restarted from an older dump, a pod is
//! killed, and Redis is frozen if time allows. Every client's stream must come out complete and
//! duplicate-free within each epoch, each message the publish acknowledged
//! at its seq, and every reset after a fault that lost writes. The full
//! soak is `scripts/bench.sh chaos`; on a Redis Cluster (the second test
//! here, at CI size), `scripts/bench.sh chaos-cluster`.

use std::time::Duration;

use loadtest::report::{self, Outcome};
use loadtest::scenarios::chaos::{self, Redis, faults::Kind};

use crate::pod::HERALD;

/// The CI size: two pods, 30 clients on 2 of `topics` topics each, one
/// publisher at 20/s for 22 s, `faults` in turn a second or two apart.
fn ci_size(redis: Redis, topics: usize, faults: Vec<Kind>) -> chaos::Options {
    let mut options = chaos::Options::new(HERALD.into());
    options.redis = redis;
    options.pods = 2;
    options.clients = 30;
    options.topics = topics;
    options.subscriptions = 2;
    options.publishers = 1;
    options.rate = 20.0;
    options.duration = Duration::from_secs(22);
    options.churn = Duration::from_secs(5);
    options.faults = faults;
    options.warmup = Duration::from_secs(2);
    options.tail = Duration::from_secs(3);
    options.gap = (Duration::from_secs(1), Duration::from_secs(2));
    options.seed = Some(11);
    options.drain = Duration::from_secs(20);
    options
}

/// Runs the scenario; it must pass, with clients that resumed and streams
/// checked, its faults starting with `first`.
async fn passes(options: chaos::Options, first: &[Kind]) -> chaos::Chaos {
    let outcome = chaos::run(options).await.expect("the scenario runs");
    let table = report::table(&outcome);
    println!("{table}");
    assert!(outcome.failures().is_empty(), "{table}");
    let kinds: Vec<Kind> = outcome.faults.iter().map(|f| f.kind).collect();
    assert!(kinds.starts_with(first), "{kinds:?}");
    assert!(outcome.checked > 0 && outcome.resumes > 0, "{table}");
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_stay_whole_across_failover_restore_pod_kill_and_freeze() {
    let options = ci_size(
        Redis::One,
        2,
        vec![Kind::Failover, Kind::Restore, Kind::PodKill, Kind::Freeze],
    );
    let outcome = passes(options, &[Kind::Failover, Kind::Restore, Kind::PodKill]).await;
    // Both lost writes Redis had acknowledged, and the clients were told.
    for fault in &outcome.faults[..2] {
        assert!(fault.lost_acked > 0, "{fault:?}");
        assert!(fault.resets > 0, "{fault:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_streams_stay_whole_and_only_the_lagging_masters_topics_reset() {
    let options = ci_size(
        Redis::Cluster,
        6,
        vec![
            Kind::LaggingFailover,
            Kind::MasterKill,
            Kind::Migrate,
            Kind::ManualFailover,
            Kind::PodKill,
        ],
    );
    let first = [Kind::LaggingFailover, Kind::MasterKill, Kind::Migrate];
    let outcome = passes(options, &first).await;
    // The master that took writes its frozen replica never got lost them,
    // and the clients of its topics (two of the six: a reset of any other
    // would have failed the run) were told.
    let lagging = &outcome.faults[0];
    let scope = lagging.topics.clone().unwrap_or_default();
    assert!(lagging.master.is_some(), "{lagging:?}");
    assert_eq!(scope.len(), 2, "{lagging:?}");
    assert!(lagging.lost_acked > 0 && lagging.resets > 0, "{lagging:?}");
}
