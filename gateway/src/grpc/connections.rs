//! The gRPC listener's connections: capped in total (`grpc.max_connections`)
//! and per client address (`grpc.max_connections_per_ip`), as the WebSocket
//! slots are, and closed when silent for `grpc.keepalive_interval` +
//! `grpc.keepalive_timeout`.
//!
//! A connection over a cap is closed as it is accepted, before a byte of
//! HTTP/2 is read: it costs a file descriptor for a moment, nothing more.
//! The silence bound covers what HTTP/2 keep-alive does not: the server
//! pings a connection only once its handshake is done, so a socket that
//! never sends the preface (or stalls in it) would hold its slot for ever.
//! A live client answers every ping, so it is never silent that long.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::admission::address_key;
use crate::config::{GrpcConfig, WebSocketConfig};
use crate::listener;
use crate::metrics::Metrics;

/// The pod's gRPC connection slots.
pub struct Slots {
    max: usize,
    /// 0: addresses are not counted.
    max_per_ip: usize,
    /// Open connections, in total and per client address prefix (as the
    /// WebSocket listener counts them: [`address_key`]).
    open: Mutex<(usize, HashMap<IpNet, usize>)>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    metrics: Arc<Metrics>,
}

impl Slots {
    /// `websocket`'s address prefixes say what one address is, here too.
    pub fn new(
        config: &GrpcConfig,
        websocket: &WebSocketConfig,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            max: config.max_connections,
            max_per_ip: config.max_connections_per_ip,
            open: Mutex::new((0, HashMap::new())),
            ipv4_prefix: websocket.ipv4_prefix,
            ipv6_prefix: websocket.ipv6_prefix,
            metrics,
        })
    }

    /// A slot for a connection from `ip`; `Err` names the cap it is over
    /// (the `reason` of `herald_grpc_refused_total`).
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_ip) = &mut *open;
        if *total >= self.max {
            return Err("at_capacity");
        }
        let ip = address_key(ip, self.ipv4_prefix, self.ipv6_prefix);
        if self.max_per_ip > 0 {
            let count = per_ip.entry(ip).or_insert(0);
            if *count >= self.max_per_ip {
                return Err("per_ip");
            }
            *count += 1;
        }
        *total += 1;
        self.metrics.grpc_connections.inc();
        Ok(Slot {
            slots: self.clone(),
            ip,
        })
    }
}

/// A connection's slot, given back on drop.
struct Slot {
    slots: Arc<Slots>,
    ip: IpNet,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_ip) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(count) = per_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                per_ip.remove(&self.ip);
            }
        }
        self.slots.metrics.grpc_connections.dec();
    }
}

/// The listener's admitted connections, as tonic serves them.
pub struct Incoming {
    accepted: listener::Accepted,
    slots: Arc<Slots>,
    silence: Duration,
}

impl Incoming {
    pub fn new(listener: TcpListener, slots: Arc<Slots>, config: &GrpcConfig) -> Self {
        Self {
            accepted: listener::Accepted::new(listener),
            slots,
            silence: config
                .keepalive_interval
                .saturating_add(config.keepalive_timeout),
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let stream = match ready!(Pin::new(&mut this.accepted).poll_next(cx)) {
                Some(Ok(stream)) => stream,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            };
            let peer = match stream.peer_addr() {
                Ok(peer) => peer,
                // Gone already.
                Err(_) => continue,
            };
            match this.slots.admit(peer.ip().to_canonical()) {
                Ok(slot) => {
                    return Poll::Ready(Some(Ok(Connection::new(stream, slot, this.silence))));
                }
                Err(reason) => {
                    this.slots
                        .metrics
                        .grpc_refused
                        .with_label_values(&[reason])
                        .inc();
                    tracing::debug!(%peer, reason, "gRPC connection refused");
                }
            }
        }
    }
}

/// An admitted connection: its socket, its slot for as long as it is open,
/// and the silence after which it is closed.
pub struct Connection {
    stream: TcpStream,
    _slot: Slot,
    silence: Duration,
    /// Reset each time bytes arrive.
    deadline: Pin<Box<Sleep>>,
    peer: Option<SocketAddr>,
}

impl Connection {
    fn new(stream: TcpStream, slot: Slot, silence: Duration) -> Self {
        let peer = stream.peer_addr().ok();
        Self {
            stream,
            _slot: slot,
            silence,
            deadline: Box::pin(tokio::time::sleep(silence)),
            peer,
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.silence;
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                ready!(self.deadline.as_mut().poll(cx));
                tracing::debug!(peer = ?self.peer, silence = ?self.silence, "gRPC connection silent; closed");
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the gRPC connection was silent too long",
                )))
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

    use super::*;

    /// As the WebSocket listener counts them: one IPv6 host's /64 is one
    /// address, however many of its addresses it connects from.
    #[test]
    fn connections_per_address_count_an_ipv6_hosts_64_as_one() {
        let grpc = GrpcConfig {
            max_connections_per_ip: 2,
            ..GrpcConfig::default()
        };
        let slots = Slots::new(&grpc, &WebSocketConfig::default(), Arc::new(Metrics::new()));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let first = slots.admit(ip("2001:db8:1:2::1")).unwrap();
        let _second = slots.admit(ip("2001:db8:1:2::ffff")).unwrap();
        assert_eq!(
            slots.admit(ip("2001:db8:1:2:abcd::9")).err(),
            Some("per_ip")
        );
        assert!(slots.admit(ip("2001:db8:1:3::1")).is_ok(), "another /64");
        drop(first);
        assert!(
            slots.admit(ip("2001:db8:1:2::7")).is_ok(),
            "a slot given back"
        );
    }
}
