//! One HTTP/1.1 request at a time: through hyper for an in-process gateway
//! ([`http`]), or written by hand for a process that may not answer at all
//! yet ([`get`], [`request`]: the rig's, [`rig::http`]); metrics; the gRPC
//! client.

use std::net::SocketAddr;

use proto::v1::publisher_client::PublisherClient;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

pub use rig::http::{HTTP_WAIT, get, parse_response, request};

use crate::WAIT;

/// A metric's value from the `/metrics` of the gateway at `addr` (its first
/// sample whose line starts with `name`).
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics", &[], b"").await;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} in:\n{body}"))
}

/// Polls the metric `name` of the gateway at `addr` until it reads `want`,
/// for at most [`WAIT`]. A closed connection is counted once its task has
/// finished, just after its TCP connection ends: there is no event to await.
pub async fn await_metric(addr: SocketAddr, name: &str, want: f64) {
    crate::eventually(WAIT, || async {
        let value = metric(addr, name).await;
        if value == want {
            Ok(())
        } else {
            Err(format!("{name} is {value}, expected {want}"))
        }
    })
    .await;
}

/// The sum of every sample of metric `name` at `addr` (all its label
/// values; 0 when it has none yet), e.g. every close whatever its reason.
pub async fn metric_sum(addr: SocketAddr, name: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics", &[], b"").await;
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let (status, _, body) = http_with_headers(addr, method, path, headers, body).await;
    (status, body)
}

/// One HTTP/1.1 request over a fresh connection: (status, headers, body).
pub async fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::{BodyExt, Full};
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::copy_from_slice(body)))
        .expect("request");
    let response = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(WAIT, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// A client of the gRPC publish API at `addr`; every call is bounded by
/// [`WAIT`].
pub async fn grpc_client(addr: SocketAddr) -> PublisherClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect_timeout(WAIT)
        .timeout(WAIT)
        .connect()
        .await
        .expect("connect over gRPC");
    PublisherClient::new(channel)
}
