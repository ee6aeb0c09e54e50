//! What every listener does with an accepted connection, HTTP or gRPC: socket
//! options, a pause after a failed accept, and who the client is behind a
//! proxy.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use hyper::HeaderMap;
use ipnet::IpNet;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// Keepalive probes start after this much TCP silence.
const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (out of file descriptors, say), so that the
/// loop does not spin while the condition lasts.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// TCP_NODELAY (frames go out as soon as they are written), keepalive
/// (half-open connections are found even where no ping gets through) and,
/// where `unsent` is not 0, at most that many bytes the network has not
/// carried yet in the kernel (`TCP_NOTSENT_LOWAT`: see
/// `websocket.unsent_bytes`).
pub fn tune(stream: &TcpStream, unsent: u32) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    let socket = SockRef::from(stream);
    socket.set_tcp_keepalive(&keepalive)?;
    if unsent > 0 {
        socket.set_tcp_notsent_lowat(unsent)?;
    }
    Ok(())
}

/// The client's address: the peer's, unless the peer is a trusted proxy;
/// then the nearest address in `X-Forwarded-For` that is not one (each
/// proxy appends the address it got the request from, so only the entries
/// our own proxies added can be believed).
pub fn client_ip(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    let peer = peer.ip().to_canonical();
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect::<Vec<_>>();
    for hop in forwarded.iter().rev() {
        let Ok(ip) = hop.parse::<IpAddr>() else {
            // Garbage from the client's side: stop at the last good hop.
            break;
        };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

/// A listener's connections as a stream (what tonic serves), tuned as the
/// HTTP listener's are. A failed
/// accept (out of file descriptors, say) pauses the stream for
/// [`ACCEPT_BACKOFF`]: tonic would otherwise ask again at once, and
/// spin while the condition lasts.
pub struct Accepted {
    listener: TcpListener,
    backoff: Option<Pin<Box<Sleep>>>,
}

impl Accepted {
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            backoff: None,
        }
    }
}

impl Stream for Accepted {
    type Item = io::Result<TcpStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(backoff) = &mut this.backoff {
                ready!(backoff.as_mut().poll(cx));
                this.backoff = None;
            }
            match ready!(this.listener.poll_accept(cx)) {
                Ok((stream, peer)) => {
                    if let Err(e) = tune(&stream, 0) {
                        tracing::debug!(%peer, error = %e, "socket options not set");
                    }
                    return Poll::Ready(Some(Ok(stream)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed");
                    this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn headers(xff: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(xff).unwrap());
        h
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let from_proxy: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let from_client: SocketAddr = "203.0.113.9:5000".parse().unwrap();
        let forged = headers("1.2.3.4, 198.51.100.7, 10.9.9.9");
        // The proxies' own hops are skipped; what the client wrote is not read.
        assert_eq!(
            client_ip(from_proxy, &forged, &proxies),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        // From anyone else the header is ignored.
        assert_eq!(
            client_ip(from_client, &forged, &proxies),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        // No header: the proxy itself.
        assert_eq!(
            client_ip(from_proxy, &HeaderMap::new(), &proxies),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip(from_proxy, &headers("nonsense"), &proxies),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }

    /// What the kernel takes of a connection whose peer reads nothing:
    /// with `unsent` set, about that much beside the peer's own window
    /// (megabytes without it, into an autotuned send buffer).
    async fn taken_by_a_stalled_peer(unsent: u32) -> usize {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        peer.set_recv_buffer_size(4096).unwrap();
        peer.connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        tune(&stream, unsent).unwrap();
        let chunk = [0u8; 1024];
        let mut taken = 0;
        // Bounded: the kernel stops taking bytes at some point either way.
        while taken < 64 << 20 {
            match stream.try_write(&chunk) {
                Ok(n) => taken += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        drop(peer);
        taken
    }

    #[tokio::test]
    async fn unsent_bytes_bound_what_the_kernel_takes_of_a_stalled_peer() {
        let bounded = taken_by_a_stalled_peer(16 * 1024).await;
        assert!(bounded < 128 * 1024, "{bounded} bytes taken");
        let unbounded = taken_by_a_stalled_peer(0).await;
        assert!(
            unbounded > 4 * bounded,
            "{unbounded} bytes taken without a bound, {bounded} with"
        );
    }
}
