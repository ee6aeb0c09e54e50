//! SIGTERM drains the pod, as Kubernetes stops it: the real `herald` binary
//! refuses new WebSocket upgrades, `/readyz` turns 503, every client is told to
//! `reconnect` after a random delay within the drain window (so that they do
//! not all come back at once) and is closed with 1012; the process exits 0 as
//! soon as they are gone, and never much later than `shutdown.drain_timeout`,
//! whatever its clients do. A client that says `hello` once the drain began
//! is advised as it registers.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use testkit::Herald;
use testkit::{Client, WAIT, eventually};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::pod::HERALD;

const DRAIN: Duration = Duration::from_secs(3);
const DRAIN_ENV: (&str, &str) = ("HERALD_SHUTDOWN__DRAIN_TIMEOUT", "3s");
/// Time allowed past the drain timeout for the process to wind down and for
/// the test to see it.
const MARGIN: Duration = Duration::from_secs(3);
const CLIENTS: usize = 20;

/// A client that has said hello and subscribed to `news`.
async fn subscriber(herald: &Herald) -> Client {
    let mut client = Client::connect_url(&herald.ws_url()).await;
    client.hello(None).await;
    client.sub(1, "news").await;
    client
}

/// What a draining client sees: the `reconnect` delay and the close code.
/// Reads on after the close so that tungstenite sends its answer to it, until
/// the server ends the connection.
async fn drained(mut client: Client) -> (u64, Option<u16>) {
    let advice = client.expect("reconnect").await;
    assert_eq!(advice["reason"], "draining", "{advice}");
    let after_ms = advice["after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("after_ms is a number: {advice}"));
    let mut code = None;
    loop {
        let next = tokio::time::timeout(WAIT, client.ws.next())
            .await
            .expect("the server ends the connection in time");
        match next {
            Some(Ok(Message::Close(frame))) => {
                assert!(code.is_none(), "two close frames");
                code = Some(frame.map_or(1005, |f| u16::from(f.code)));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(other)) => panic!("after `reconnect`, expected the close, got {other:?}"),
            Some(Err(_)) | None => return (after_ms, code),
        }
    }
}

/// `/readyz` during the drain: the listener stays open so that probes see
/// 503 (the first probe may still beat the signal and see 200), and a new
/// WebSocket upgrade is refused with 503.
async fn refuses_while_draining(addr: SocketAddr) {
    eventually(WAIT, || async {
        let (status, body) = testkit::http::get(addr, "/readyz")
            .await
            .expect("readyz during the drain");
        if status == 503 {
            assert_eq!(body, "draining\n");
            return Ok(());
        }
        assert_eq!(status, 200, "readyz answers 200 or 503");
        Err("/readyz never turned 503 during the drain")
    })
    .await;
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503)
        }
        other => panic!("an upgrade during the drain must get 503, got {other:?}"),
    }
}

#[tokio::test]
async fn sigterm_drains_every_client_and_exits_zero() {
    let mut herald = Herald::start(HERALD, &[DRAIN_ENV], &[]).await;
    let clients = join_all((0..CLIENTS).map(|_| subscriber(&herald))).await;

    herald.sigterm();
    let signalled = Instant::now();
    let results = join_all(clients.into_iter().map(drained)).await;

    for (after_ms, code) in &results {
        assert!(
            *after_ms < DRAIN.as_millis() as u64,
            "after_ms {after_ms} within the drain window"
        );
        assert_eq!(*code, Some(1012), "closed with 1012 (service restart)");
    }
    let delays: BTreeSet<u64> = results.iter().map(|(after_ms, _)| *after_ms).collect();
    assert!(
        delays.len() > 1,
        "reconnect delays are spread, not all {delays:?}"
    );

    let status = herald
        .wait_exit(DRAIN + MARGIN)
        .await
        .unwrap_or_else(|| panic!("herald still running {:?} after SIGTERM", DRAIN + MARGIN));
    assert_eq!(status.code(), Some(0), "exit status {status}");
    // Every client answered the close: nothing was left to wait for.
    let took = signalled.elapsed();
    assert!(
        took < DRAIN,
        "herald waited out the drain timeout ({took:?}) with no client left"
    );
}

#[tokio::test]
async fn a_client_that_never_answers_the_close_does_not_hold_the_process() {
    // Only the drain timeout can end this client's connection: the server
    // would wait a minute for its close answer, or for a write to it.
    let mut herald = Herald::start(
        HERALD,
        &[
            DRAIN_ENV,
            ("HERALD_WEBSOCKET__CLOSE_TIMEOUT", "60s"),
            ("HERALD_WEBSOCKET__WRITE_TIMEOUT", "60s"),
        ],
        &[],
    )
    .await;
    let mut mute = subscriber(&herald).await;

    herald.sigterm();
    let signalled = Instant::now();
    // The mute client holds the drain open: probes and upgrades are refused.
    refuses_while_draining(herald.addr).await;
    let status = herald.wait_exit(DRAIN + MARGIN).await.unwrap_or_else(|| {
        panic!(
            "a mute client kept herald running {:?} after SIGTERM",
            DRAIN + MARGIN
        )
    });
    assert_eq!(status.code(), Some(0), "exit status {status}");
    let took = signalled.elapsed();
    assert!(
        took >= DRAIN - Duration::from_millis(500),
        "herald left before the drain timeout ({took:?}) although a client was still connected"
    );

    // The advice and the close were sent all the same.
    assert!(
        mute.expect("reconnect").await["after_ms"]
            .as_u64()
            .is_some()
    );
    assert_eq!(mute.closed().await, Some(1012));
}

/// A connection opened before the signal whose request comes after it (a
/// probe that raced the SIGTERM, say) still gets its answer: hyper's graceful
/// shutdown closes a connection that has no request yet, unanswered.
#[tokio::test]
async fn a_request_on_a_connection_opened_before_the_drain_is_answered() {
    // A client that never answers the close keeps the drain open.
    let mut herald = Herald::start(
        HERALD,
        &[DRAIN_ENV, ("HERALD_WEBSOCKET__CLOSE_TIMEOUT", "60s")],
        &[],
    )
    .await;
    let _mute = subscriber(&herald).await;
    let mut early = tokio::time::timeout(WAIT, TcpStream::connect(herald.addr))
        .await
        .expect("connect in time")
        .expect("connect");
    // Served after `early` was accepted (one listener, accepted in order).
    let (status, _) = testkit::http::get(herald.addr, "/readyz").await.unwrap();
    assert_eq!(status, 200);

    herald.sigterm();
    eventually(WAIT, || async {
        match testkit::http::get(herald.addr, "/readyz").await {
            Ok((503, _)) => Ok(()),
            _ => Err("/readyz never turned 503"),
        }
    })
    .await;
    let answer = testkit::http::request(
        &mut early,
        &format!(
            "GET /readyz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            herald.addr
        ),
    )
    .await
    .expect("an answer on the connection opened before the drain");
    assert_eq!(answer, (503, "draining\n".to_owned()));
    let status = herald
        .wait_exit(DRAIN + MARGIN)
        .await
        .expect("herald exits");
    assert_eq!(status.code(), Some(0), "exit status {status}");
}

#[tokio::test]
async fn a_half_sent_handshake_does_not_hold_the_process() {
    let mut herald = Herald::start(
        HERALD,
        &[DRAIN_ENV, ("HERALD_WEBSOCKET__HANDSHAKE_TIMEOUT", "60s")],
        &[],
    )
    .await;
    let mut stalled = TcpStream::connect(herald.addr).await.expect("connect");
    stalled
        .write_all(b"GET /ws HTTP/1.1\r\nHost: herald\r\nUpgrade: websocket\r\n")
        .await
        .expect("half a request head");
    // Make sure the server has taken it (see `probes_in_flight`).
    assert_eq!(
        testkit::http::get(herald.addr, "/readyz")
            .await
            .expect("readyz")
            .0,
        200
    );

    herald.sigterm();
    let status = herald.wait_exit(DRAIN + MARGIN).await.unwrap_or_else(|| {
        panic!(
            "a half-sent handshake kept herald running {:?} after SIGTERM",
            DRAIN + MARGIN
        )
    });
    assert_eq!(status.code(), Some(0), "exit status {status}");
    drop(stalled);
}

#[tokio::test]
async fn a_client_that_says_hello_once_the_drain_began_is_advised_too() {
    let mut herald = Herald::start(HERALD, &[DRAIN_ENV], &[]).await;
    // Upgraded before the signal, silent until the pod drains.
    let mut late = Client::connect_url(&herald.ws_url()).await;
    let early = subscriber(&herald).await;

    herald.sigterm();
    refuses_while_draining(herald.addr).await;
    late.send(serde_json::json!({"op": "hello"})).await;
    let welcome = late.expect("welcome").await;
    assert!(welcome["session"].is_string(), "{welcome}");

    for (after_ms, code) in join_all([drained(early), drained(late)]).await {
        assert!(after_ms < DRAIN.as_millis() as u64, "after_ms {after_ms}");
        assert_eq!(code, Some(1012), "closed with 1012 (service restart)");
    }
    let status = herald
        .wait_exit(DRAIN + MARGIN)
        .await
        .unwrap_or_else(|| panic!("herald still running {:?} after SIGTERM", DRAIN + MARGIN));
    assert_eq!(status.code(), Some(0), "exit status {status}");
}
