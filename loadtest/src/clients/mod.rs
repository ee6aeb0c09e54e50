//! Many WebSocket clients: tokio-tungstenite, a library Herald did not
//! write, by default; or the load tool's own [`raw`] client ([`Library`]),
//! which can offer permessage-deflate as a browser does and inflate what
//! comes (tungstenite has no released deflate), and counts each frame's
//! bytes on the wire.
//!
//! A TCP connection is named by its four addresses and ports; towards one
//! gateway port, one source address has only the kernel's ephemeral ports
//! (about 28,000 here) to tell its connections apart. So each client binds a
//! source address of its own before it connects, spread round-robin over
//! [`SOURCE_ADDRESSES`] addresses from 127.0.0.2 (all of 127.0.0.0/8 is this
//! machine on Linux): tens of thousands of connections do not run out of ports.
//! Every connection is also a file descriptor: [`raise_fd_limit`] takes what
//! the process may have and says plainly when that is not enough.
//!
//! Layout: connecting and subscribing here; [`reading`] (what a subscriber
//! does once subscribed).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::latency::Stamp;
use crate::raw;
use crate::{Error, Target};

mod reading;

/// Longest one client may take to connect, finish the handshake and have
/// its subscription confirmed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Clients connecting at once (a gateway's accept queue is finite).
pub const CONNECT_CONCURRENCY: usize = 128;
/// Source addresses clients are spread over: 127.0.0.2 and the next ones.
/// Sixteen of them hold some 450,000 connections to one gateway port.
pub const SOURCE_ADDRESSES: u32 = 16;
/// File descriptors kept beyond one per client: the runtime, the publisher's
/// connections, stdio, the report file.
pub const FD_MARGIN: u64 = 64;
/// Each client's read buffer: a frame is read whole however small this is.
/// tungstenite zero-fills it before every read (two per message: the one
/// that gets it and the one that finds the socket empty), which made 16 KiB
/// the clients' largest cost, taken from the cores the gateway runs on;
/// 4 KiB holds a 1 KiB message in one read.
pub(crate) const READ_BUFFER_BYTES: usize = 4 * 1024;
/// The first source address.
const FIRST_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A client's slot in [`Received::latency_us`] that no message filled.
pub const MISSING: u32 = u32::MAX;

/// The WebSocket connection of one client.
pub type Socket = WebSocketStream<TcpStream>;

/// The WebSocket client the subscribers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Library {
    /// tokio-tungstenite, which offers no extension.
    #[default]
    Tungstenite,
    /// The load tool's own client ([`raw`]), offering no extension: the
    /// yardstick of [`Library::Deflate`], the same client without it.
    Raw,
    /// [`raw`], offering permessage-deflate as Chromium does and inflating
    /// every compressed frame.
    Deflate,
}

impl Library {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tungstenite => "tokio-tungstenite",
            Self::Raw => "raw",
            Self::Deflate => "raw, permessage-deflate offered",
        }
    }
}

/// A subscriber's connection, of either client.
enum Link {
    Library(Box<Socket>),
    Raw(raw::Client),
}

/// Raises this process's soft file-descriptor limit as far as the hard limit
/// allows and checks that `needed` fit; the limit now in force.
pub fn raise_fd_limit(needed: u64) -> Result<u64, Error> {
    let limit = rlimit::increase_nofile_limit(u64::MAX).map_err(Error::Rlimit)?;
    if limit < needed {
        let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(limit, |(_, hard)| hard);
        return Err(Error::FdLimit {
            needed,
            limit,
            hard,
        });
    }
    Ok(limit)
}

/// The source address client `client` binds towards `target`: one of
/// [`SOURCE_ADDRESSES`] from 127.0.0.2 for an IPv4 target; none for IPv6,
/// whose loopback is the single address ::1.
pub fn source_addr(target: IpAddr, client: usize) -> Option<SocketAddr> {
    match target {
        IpAddr::V4(_) => {
            let offset = (client as u64 % u64::from(SOURCE_ADDRESSES)) as u32;
            let ip = Ipv4Addr::from(u32::from(FIRST_SOURCE) + offset);
            Some(SocketAddr::new(IpAddr::V4(ip), 0))
        }
        IpAddr::V6(_) => None,
    }
}

/// A connected client whose subscription the gateway confirmed.
pub struct Subscriber {
    /// Its number, from 0.
    pub client: usize,
    /// The index of its gateway among those given.
    pub gateway: usize,
    link: Link,
}

/// What one client received, for the scenario to merge.
#[derive(Debug)]
pub struct Received {
    pub client: usize,
    pub gateway: usize,
    /// By message index: microseconds from the stamp to receipt, or [`MISSING`].
    pub latency_us: Vec<u32>,
    /// Messages received again after their first time.
    pub duplicates: u64,
    /// Frames that were no stamped `msg` of this run.
    pub unexpected: u64,
    /// Bytes of the `msg` frames on the wire, headers included (the raw
    /// client's count; 0 for tungstenite's, which does not tell).
    pub wire_bytes: u64,
    /// Whether the connection negotiated permessage-deflate.
    pub compressed: bool,
    pub end: End,
}

/// How a client's reading ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The scenario was done with it.
    Stopped,
    /// The gateway closed the connection, with this close code if any.
    Closed(Option<u16>),
    /// The connection failed.
    Failed(String),
}

/// A server frame, as far as the load generator cares.
#[derive(Deserialize)]
struct ServerFrame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    /// A `msg`'s data: the publisher's stamp.
    data: Option<Stamp>,
}

/// Opens `count` clients, client `i` to `gateways[i % gateways.len()]`, each
/// subscribed to `topic`, at most [`CONNECT_CONCURRENCY`] connecting at
/// once. The first failure stops the others and is returned.
pub async fn subscribe_all(
    gateways: &[Target],
    count: usize,
    topic: &str,
) -> Result<Vec<Subscriber>, Error> {
    subscribe_spread(gateways, count, &[topic.to_owned()], Library::Tungstenite).await
}

/// As [`subscribe_all`], with client `i` subscribed to `topics[i % topics.len()]`,
/// each a client of `library`.
pub async fn subscribe_spread(
    gateways: &[Target],
    count: usize,
    topics: &[String],
    library: Library,
) -> Result<Vec<Subscriber>, Error> {
    if gateways.is_empty() || topics.is_empty() {
        return Err(Error::Options(
            "no gateway to connect to, or no topic".to_owned(),
        ));
    }
    let gateways: Arc<[Target]> = gateways.into();
    let topics: Arc<[String]> = topics.into();
    open_all(count, move |client| {
        let (gateways, topics) = (gateways.clone(), topics.clone());
        async move {
            let gateway = client % gateways.len();
            let topic = &topics[client % topics.len()];
            let target = &gateways[gateway];
            match library {
                Library::Tungstenite => Subscriber::open(client, gateway, target, topic).await,
                Library::Raw | Library::Deflate => {
                    let deflate = library == Library::Deflate;
                    Subscriber::open_raw(client, gateway, target, topic, deflate).await
                }
            }
        }
    })
    .await
}

/// How a failure of client `client` (from `source_addr`, to `target`)
/// becomes an [`Error::Client`], given the reason.
pub(crate) fn client_failure(
    client: usize,
    source_addr: Option<SocketAddr>,
    target: SocketAddr,
) -> impl Fn(String) -> Error + Copy {
    move |reason| Error::Client {
        client,
        source_addr,
        target,
        reason,
    }
}

/// Opens clients `0..count` with `open`, at most [`CONNECT_CONCURRENCY`] at
/// once, sorted by number. The first failure stops the others and is returned.
pub async fn open_all<T, F, Fut>(count: usize, open: F) -> Result<Vec<T>, Error>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, Error>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut workers = JoinSet::new();
    for _ in 0..CONNECT_CONCURRENCY.min(count) {
        let (open, next, failed) = (open.clone(), next.clone(), failed.clone());
        workers.spawn(async move {
            let mut opened = Vec::new();
            loop {
                let client = next.fetch_add(1, Ordering::Relaxed);
                if client >= count || failed.load(Ordering::Relaxed) {
                    return Ok(opened);
                }
                match open(client).await {
                    Ok(one) => opened.push((client, one)),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
        });
    }
    let mut all = Vec::with_capacity(count);
    let mut first_error = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(opened)) => all.extend(opened),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    all.sort_by_key(|&(client, _)| client);
    Ok(all.into_iter().map(|(_, one)| one).collect())
}

impl Subscriber {
    /// Connects client `client` to `target` from its source address, and
    /// subscribes it to `topic` (the `welcome` and the `ok` are read here).
    pub async fn open(
        client: usize,
        gateway: usize,
        target: &Target,
        topic: &str,
    ) -> Result<Self, Error> {
        Self::open_with(client, gateway, target, topic, None).await
    }

    /// As [`open`](Self::open), with the socket's receive buffer
    /// (`SO_RCVBUF`) set to `recv_buffer` bytes before connecting: a client
    /// that then stops reading fills its gateway's buffers soon.
    pub async fn open_with(
        client: usize,
        gateway: usize,
        target: &Target,
        topic: &str,
        recv_buffer: Option<u32>,
    ) -> Result<Self, Error> {
        let source = source_addr(target.addr.ip(), client);
        let fail = client_failure(client, source, target.addr);
        let opening = async {
            let stream = connect_with(source, target.addr, recv_buffer)
                .await
                .map_err(|e| fail(describe(&e)))?;
            let (mut ws, _) = tokio_tungstenite::client_async_with_config(
                target.ws_url(),
                stream,
                Some(config()),
            )
            .await
            .map_err(|e| {
                let hint = if e.to_string().contains("503") {
                    " (over the gateway's websocket.max_connections, or draining)"
                } else {
                    ""
                };
                fail(format!("WebSocket handshake: {e}{hint}"))
            })?;
            let sub = serde_json::json!({"op": "sub", "id": 1, "topic": topic}).to_string();
            ws.send(Message::text(sub))
                .await
                .map_err(|e| fail(format!("sending sub: {e}")))?;
            // `welcome` comes first, then the `ok` (or `err`) of the `sub`.
            loop {
                let text = match ws.next().await {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(other)) => return Err(fail(format!("unexpected {other:?}"))),
                    Some(Err(e)) => return Err(fail(format!("reading: {e}"))),
                    None => return Err(fail("closed before the sub was confirmed".to_owned())),
                };
                let frame: ServerFrame<'_> = serde_json::from_str(text.as_str())
                    .map_err(|e| fail(format!("not a server frame ({e}): {}", text.as_str())))?;
                match frame.op.as_ref() {
                    "welcome" | "presence_diff" => {}
                    "ok" => return Ok(ws),
                    _ => return Err(fail(format!("sub refused: {}", text.as_str()))),
                }
            }
        };
        let ws = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))??;
        Ok(Self {
            client,
            gateway,
            link: Link::Library(Box::new(ws)),
        })
    }

    /// As [`open`](Self::open), with the load tool's own client; offering
    /// permessage-deflate when `deflate`.
    pub async fn open_raw(
        client: usize,
        gateway: usize,
        target: &Target,
        topic: &str,
        deflate: bool,
    ) -> Result<Self, Error> {
        let source = source_addr(target.addr.ip(), client);
        let fail = client_failure(client, source, target.addr);
        let offer = [("Sec-WebSocket-Extensions", raw::DEFLATE_OFFER)];
        let headers: &[(&str, &str)] = if deflate { &offer } else { &[] };
        let opening = async {
            let mut c = raw::Client::connect_with_headers(
                source,
                target,
                READ_BUFFER_BYTES,
                client as u64,
                headers,
            )
            .await
            .map_err(|e| fail(format!("WebSocket handshake: {}", describe(&e))))?;
            c.subscribe(&[topic]).await.map_err(fail)?;
            Ok::<_, Error>(c)
        };
        let c = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))??;
        Ok(Self {
            client,
            gateway,
            link: Link::Raw(c),
        })
    }

    /// Client `client` on a connection that speaks WebSocket from its first
    /// byte, without a handshake: `floor`'s readers, whose writer is no
    /// WebSocket server. It reads as a gateway's client does.
    pub async fn raw(client: usize, stream: TcpStream) -> Self {
        let ws = WebSocketStream::from_raw_socket(stream, Role::Client, Some(config())).await;
        Self {
            client,
            gateway: 0,
            link: Link::Library(Box::new(ws)),
        }
    }

    /// Reads the first message, which must be the text `greeting`.
    pub async fn greeted(&mut self, greeting: &str) -> Result<(), String> {
        let Link::Library(ws) = &mut self.link else {
            return Err("a greeting is read by the library's client".to_owned());
        };
        match ws.next().await {
            Some(Ok(Message::Text(text))) if text.as_str() == greeting => Ok(()),
            Some(Ok(other)) => Err(format!("expected {greeting}, got {other:?}")),
            Some(Err(e)) => Err(format!("reading the greeting: {e}")),
            None => Err("closed before the greeting".to_owned()),
        }
    }
}

/// Every client's WebSocket settings.
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
}

/// A TCP connection to `target`, from `source` if given.
pub(crate) async fn connect(
    source: Option<SocketAddr>,
    target: SocketAddr,
) -> std::io::Result<TcpStream> {
    connect_with(source, target, None).await
}

/// As [`connect`], with `SO_RCVBUF` set to `recv_buffer` bytes if given.
async fn connect_with(
    source: Option<SocketAddr>,
    target: SocketAddr,
    recv_buffer: Option<u32>,
) -> std::io::Result<TcpStream> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(bytes) = recv_buffer {
        socket.set_recv_buffer_size(bytes)?;
    }
    if let Some(source) = source {
        socket.bind(source)?;
    }
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// An I/O error with what it usually means here.
pub(crate) fn describe(e: &std::io::Error) -> String {
    // Linux errno values: this tool runs where the gateway runs.
    let hint = match e.raw_os_error() {
        Some(24) => " (out of file descriptors: see `ulimit -n`)",
        Some(99) => " (no local port left for this source address)",
        Some(111) => " (nothing listens there: is the gateway running?)",
        _ => "",
    };
    format!("{e}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_spread_over_source_addresses_from_127_0_0_2() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let at = |client| source_addr(v4, client).map(|a| a.to_string());
        assert_eq!(at(0).as_deref(), Some("127.0.0.2:0"));
        assert_eq!(at(1).as_deref(), Some("127.0.0.3:0"));
        assert_eq!(at(15).as_deref(), Some("127.0.0.17:0"));
        assert_eq!(at(16).as_deref(), Some("127.0.0.2:0"));
        assert_eq!(source_addr("::1".parse().expect("ip"), 3), None);
    }
}
