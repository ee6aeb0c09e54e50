//! What the logs of a real `herald` say about sessions: enough to follow
//! one (a short tag), never the id that would resume it. Whoever reads the
//! logs must not be able to take a client's stream.

use testkit::Herald;
use testkit::{Client, WAIT, eventually};
use tokio::time::Duration;

use crate::pod::HERALD;

#[tokio::test]
async fn session_ids_never_reach_the_logs_even_at_debug() {
    let mut herald = Herald::start(HERALD, &[("HERALD_LOG__LEVEL", "debug")], &[]).await;
    let mut ids = Vec::new();
    // A session that ends, is resumed, is taken over, and ends again; and a
    // resume of a session that does not exist.
    let mut first = Client::connect_url(&herald.ws_url()).await;
    let id = first.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    first.sub(1, "news").await;
    drop(first);
    let mut second = Client::connect_url(&herald.ws_url()).await;
    let welcome = second.hello(Some(&id)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    let mut third = Client::connect_url(&herald.ws_url()).await;
    assert_eq!(third.hello(Some(&id)).await["resumed"], true);
    assert_eq!(second.closed().await, Some(4501), "taken over");
    ids.push(id);
    let unknown = "0123456789abcdef0123456789abcdef".to_owned();
    let mut fourth = Client::connect_url(&herald.ws_url()).await;
    let fresh = fourth.hello(Some(&unknown)).await;
    assert_eq!(fresh["resumed"], false);
    ids.push(unknown);
    ids.push(fresh["session"].as_str().expect("session").to_owned());
    drop((third, fourth));

    // The closes are logged as the connections end: wait for all four.
    eventually(WAIT, || async {
        let log = herald.log();
        if log.matches("connection closed").count() >= 4 {
            Ok(())
        } else {
            Err(format!("closes not logged:\n{log}"))
        }
    })
    .await;
    herald.sigterm();
    herald.wait_exit(Duration::from_secs(10)).await;
    let log = herald.log();
    assert!(
        log.contains("session="),
        "closes name their session's tag:\n{log}"
    );
    for id in &ids {
        assert!(
            !log.contains(id.as_str()),
            "session id {id} in the log:\n{log}"
        );
    }
}

#[tokio::test]
async fn a_pod_says_at_start_what_it_leaves_open() {
    // Open mode, and an API without keys on every interface (port 0: no
    // traffic comes to it; it only has to be bound there).
    let mut open = Herald::start(HERALD, &[("HERALD_HTTP__API_LISTEN", "0.0.0.0:0")], &[]).await;
    open.sigterm();
    open.wait_exit(Duration::from_secs(10)).await;
    let log = open.log();
    assert!(log.contains("no [auth] key is configured"), "{log}");
    // Its stderr is a file here: no colour codes in it.
    assert!(!log.contains('\u{1b}'), "ANSI codes off a terminal:\n{log}");
    assert!(
        log.contains("the HTTP API and metrics has no http.api_keys"),
        "{log}"
    );
    // Keys for both, the API on loopback: nothing to warn about.
    let mut closed = Herald::start(
        HERALD,
        &[
            (
                "HERALD_AUTH__HMAC_SECRET",
                "a-secret-of-at-least-thirty-two-bytes!",
            ),
            ("HERALD_HTTP__API_KEYS", "backend-key"),
        ],
        &[],
    )
    .await;
    closed.sigterm();
    closed.wait_exit(Duration::from_secs(10)).await;
    let log = closed.log();
    assert!(!log.contains("WARN"), "{log}");
}
