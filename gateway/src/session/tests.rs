//! What a connection's task leaves behind when it panics: nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use router::{Deliver, Epoch, MemoryBroker, Position, Publication, SessionUser, Topic};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{LiveSession, Pod, Registry, Replays, Session, Subscriptions, Unregistered};
use crate::admission::Slots;
use crate::budget::Budgets;
use crate::config::Config;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::outbound::{Outbound, Writing};

/// Publications nobody here reads.
struct Nowhere;

impl Deliver for Nowhere {
    fn deliver(&self, _: &Publication, _: Option<&str>) {}
    fn reset(&self, _: &Topic, _: &Position) {}
    fn disconnect(&self, _: &str) {}
}

/// A pod as [`crate::node`] builds it, with the embedded broker (built here:
/// the session does not depend on the node, tests included).
fn pod() -> Arc<Pod> {
    let config = Arc::new(Config::load(None, std::iter::empty()).unwrap());
    let metrics = Arc::new(Metrics::new());
    let namespaces = Arc::new(config.namespaces());
    let memory = MemoryBroker::new(namespaces.clone(), Arc::new(Nowhere));
    let writing = Writing::new(
        &config,
        metrics.clone(),
        CancellationToken::new(),
        Instant::now(),
    );
    Arc::new(Pod {
        hub: Arc::new(Hub::new(
            metrics.clone(),
            config.queue.frames,
            config.queue.bytes,
        )),
        broker: Arc::new(memory.clone()),
        sessions: Arc::new(memory),
        live: Arc::new(Registry::default()),
        verifier: None,
        namespaces,
        replays: Replays::new(&config.replay, metrics.clone()),
        writing: Arc::new(writing),
        flush_soon: None,
        budgets: Arc::new(Budgets::new(&config.session, metrics.clone())),
        metrics,
        config,
    })
}

#[tokio::test]
async fn a_panicking_connection_task_releases_its_session_hub_memberships_and_socket() {
    let node = pod();
    let slots = Arc::new(Slots::new(&node.config.websocket, node.metrics.clone()));
    let admission = slots.admit(IpAddr::from([127, 0, 0, 1])).unwrap();
    let out = Outbound::new(node.config.queue_limits());
    let mut session = Session::new(node.clone(), &admission, out.clone());

    // As a `hello` and a `sub` leave it: registered, and a subscriber.
    let id: Arc<str> = Arc::from("s1");
    session.id = Some(id.clone());
    let arrived = node.live.arrival();
    let live = LiveSession {
        conn: session.conn,
        owner: session.owner.clone(),
        out: out.clone(),
        subscriptions: session.subscriptions.clone(),
    };
    node.live.register(id, live, arrived).unwrap();
    let topic = Topic::parse("news").unwrap();
    node.hub.join(
        &topic,
        session.conn,
        out.clone(),
        session.subscriptions.clone(),
    );
    session
        .subscriptions
        .insert(topic.clone(), Epoch::from("e"), 0);
    assert_eq!((node.live.len(), node.hub.subscribers(&topic)), (1, 1));

    let panicked = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _in_the_task = session;
        panic!("a bug in a connection's task");
    }));
    assert!(panicked.is_err());

    assert_eq!(node.live.len(), 0, "the registry entry is released");
    assert_eq!(node.hub.subscribers(&topic), 0, "the hub let go");
    assert!(out.is_stopped(), "the reader and writer are told to stop");
    assert_eq!(node.metrics.connection_panics.get(), 1);
}

/// A session of `user`'s as a connection registers it.
fn live(conn: u64, user: &str) -> (LiveSession, Outbound) {
    let out = Outbound::new(
        Config::load(None, std::iter::empty())
            .unwrap()
            .queue_limits(),
    );
    let subscriptions = Subscriptions::new(None);
    subscriptions.set_user(Some(SessionUser {
        id: Arc::from(user),
        since_ms: 0,
    }));
    let live = LiveSession {
        conn,
        owner: Arc::from(format!("owner-{conn}")),
        out: out.clone(),
        subscriptions,
    };
    (live, out)
}

#[test]
fn a_disconnect_reaches_a_connection_that_registers_after_its_sweep() {
    let registry = Registry::default();
    // Its `hello` began, then the user was disconnected (the sweep found
    // nothing to close), then it registers: refused.
    let arrived = registry.arrival();
    assert_eq!(registry.disconnect("alice"), 0);
    let (alice, _) = live(1, "alice");
    assert_eq!(
        registry.register(Arc::from("s1"), alice, arrived),
        Err(Unregistered::Disconnected)
    );
    // Another user's connection, and the user's next one, register.
    let (bob, _) = live(2, "bob");
    assert_eq!(registry.register(Arc::from("s2"), bob, arrived), Ok(()));
    let (again, _) = live(3, "alice");
    let later = registry.arrival();
    assert_eq!(registry.register(Arc::from("s3"), again, later), Ok(()));
    assert_eq!(registry.len(), 2);
}

#[tokio::test]
async fn of_two_racing_registrations_of_a_session_the_later_serves_it_and_the_first_is_taken_over()
{
    let registry = Registry::default();
    let (first, _) = live(1, "alice");
    let first_subscriptions = first.subscriptions.clone();
    let (second, second_out) = live(2, "alice");
    let arrived = registry.arrival();
    registry.register(Arc::from("s1"), first, arrived).unwrap();
    registry.register(Arc::from("s1"), second, arrived).unwrap();
    // The first is told to stop, and will not save over the second.
    tokio::time::timeout(Duration::from_secs(5), first_subscriptions.taken_over())
        .await
        .expect("the first connection is taken over");
    assert!(first_subscriptions.superseded());
    // One connection listed, and a disconnect reaches it.
    assert_eq!(registry.len(), 1);
    assert_eq!(registry.disconnect("alice"), 1);
    assert!(second_out.is_closing());
}
