#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Presence through the client against a real gateway (in this process, on
//! port 0): a page that shows the asker once subscribed, pages after a
//! cursor, a tracked topic whose members follow joins and leaves (a user
//! with two connections counted once), and `disabled` where the namespace
//! keeps none.

mod common;
#[path = "common/rooms.rs"]
mod rooms;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{until, user};
use herald_client::{Client, Error, ErrorCode, Event, Events};
use rooms::with_users;
use serde_json::json;

/// Subscribes `client` to `topic` and waits for the `ok`.
async fn subscribed(client: &Client, events: &mut Events, topic: &str) {
    client.subscribe(topic, None).unwrap();
    until(events, |e| {
        matches!(e, Event::Subscribed { topic: t, .. } if &**t == topic).then_some(())
    })
    .await;
}

/// Reads [`Event::Presence`] of `topic`, applying each to `members`, until
/// `want` holds of them.
async fn members_until(
    events: &mut Events,
    topic: &str,
    members: &mut BTreeSet<Arc<str>>,
    want: impl Fn(&BTreeSet<Arc<str>>) -> bool,
) {
    until(events, |e| {
        if let Event::Presence {
            topic: t, change, ..
        } = e
            && &**t == topic
        {
            for m in &change.joins {
                assert!(members.insert(m.user.clone()), "a join of a member: {e:?}");
            }
            for u in &change.leaves {
                assert!(members.remove(u), "a leave of no member: {e:?}");
            }
            return want(members).then_some(());
        }
        None
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_subscribed_sees_itself_in_the_page_with_its_info() {
    let gateway = with_users().await;
    let (alice, mut events) = user(&gateway, "alice", json!({"info": {"name": "Alice"}}));
    subscribed(&alice, &mut events, "room:1").await;
    let page = alice.presence("room:1", None, None).await.unwrap();
    assert_eq!((page.users, page.connections), (1, 1), "{page:?}");
    assert_eq!(page.members.len(), 1, "{page:?}");
    assert_eq!(&*page.members[0].user, "alice");
    let info: serde_json::Value =
        serde_json::from_str(page.members[0].info.as_deref().unwrap()).unwrap();
    assert_eq!(info, json!({"name": "Alice"}));
    assert_eq!(page.cursor, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_go_on_after_their_cursor_and_presence_all_merges_them() {
    let gateway = with_users().await;
    let mut clients = Vec::new();
    for name in ["carol", "alice", "bob"] {
        let (client, mut events) = user(&gateway, name, json!({}));
        subscribed(&client, &mut events, "quiet:1").await;
        clients.push((client, events));
    }
    let asker = &clients[0].0;
    let first = asker.presence("quiet:1", None, Some(2)).await.unwrap();
    let names = |p: &herald_client::PresencePage| {
        p.members
            .iter()
            .map(|m| m.user.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&first), ["alice", "bob"], "{first:?}");
    let cursor = first.cursor.clone().expect("a cursor: one more member");
    let second = asker
        .presence("quiet:1", Some(&cursor), Some(2))
        .await
        .unwrap();
    assert_eq!(names(&second), ["carol"], "{second:?}");
    assert_eq!(second.cursor, None);
    let room = asker.presence_all("quiet:1").await.unwrap();
    let all: Vec<&str> = room.members().map(|m| &*m.user).collect();
    assert_eq!(all, ["alice", "bob", "carol"]);
    assert_eq!(room.users(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracked_topic_follows_joins_and_leaves_and_counts_a_user_once() {
    let gateway = with_users().await;
    let (alice, mut alice_events) = user(&gateway, "alice", json!({}));
    alice.track_presence("room:2").unwrap();
    subscribed(&alice, &mut alice_events, "room:2").await;
    let mut members = BTreeSet::new();
    members_until(&mut alice_events, "room:2", &mut members, |m| {
        m.iter().map(|u| &**u).eq(["alice"])
    })
    .await;

    // Bob on two connections: one join.
    let (bob1, mut bob1_events) = user(&gateway, "bob", json!({}));
    subscribed(&bob1, &mut bob1_events, "room:2").await;
    let (bob2, mut bob2_events) = user(&gateway, "bob", json!({}));
    subscribed(&bob2, &mut bob2_events, "room:2").await;
    members_until(&mut alice_events, "room:2", &mut members, |m| {
        m.iter().map(|u| &**u).eq(["alice", "bob"])
    })
    .await;
    let stats = alice.presence("room:2", None, None).await.unwrap();
    assert_eq!((stats.users, stats.connections), (2, 3), "{stats:?}");

    // One of bob's connections leaves: still a member; the other: a leave.
    bob1.unsubscribe("room:2").unwrap();
    let page = testkit::eventually(testkit::WAIT, || async {
        let page = alice.presence("room:2", None, None).await.unwrap();
        if page.connections == 2 {
            Ok(page)
        } else {
            Err(format!("{page:?}"))
        }
    })
    .await;
    assert_eq!(page.users, 2, "{page:?}");
    bob2.unsubscribe("room:2").unwrap();
    members_until(&mut alice_events, "room:2", &mut members, |m| {
        m.iter().map(|u| &**u).eq(["alice"])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_where_the_namespace_keeps_none_is_disabled() {
    let gateway = with_users().await;
    let (alice, _events) = user(&gateway, "alice", json!({}));
    match alice.presence("news", None, None).await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::Disabled),
        other => panic!("not `disabled`: {other:?}"),
    }
}
