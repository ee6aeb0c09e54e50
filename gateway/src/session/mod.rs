//! One WebSocket connection, in one task: a reader and a writer (in
//! [`crate::outbound`], with the connection's outgoing queue).
//!
//! The reader decodes commands and acts on them: subscriptions go through the
//! hub and the broker, replies and replays go to the connection's outgoing
//! queue, which the writer drains. The session keeps what a resume needs: the
//! subscriptions and, for each, how far the client acked. It also holds who
//! the client is (its token's claims), and every topic it touches is checked
//! against that ([`access`]).
//!
//! Its parts, in the order a connection meets them:
//! - [`serve_upgraded`] (here): splits the socket and runs the connection's
//!   task, the [`Session`] and its writer.
//! - [`reader`] and [`parser`]: the client's frames, read and checked.
//! - [`connection`]: the connection's loop ([`Session::read`]): frames to
//!   commands, the heartbeat, the session's deadlines, and its end.
//! - [`commands`]: each command dispatched, rate-limited ([`rate`]), checked
//!   against the client's grants ([`access`]) and budgets, and answered.
//! - [`hello`]: who the client is (`hello`, its token, `refresh`);
//!   [`connect`]: or who the application's backend says it is (the connect
//!   and refresh proxies).
//! - [`approval`]: the subscribe and publish proxies; [`rpc`]: the client's
//!   calls of the backend.
//! - [`resume`]: a session claimed from whoever held it last, its
//!   subscriptions restored, and the session saved to the store.
//! - [`handshake`]: how a subscription starts, whoever asked for it: hub
//!   join, broker watch and recover, the answer, then [`replay`] to live.
//! - [`catch_up`]: a topic the client lags in, read from history at its
//!   pace beside the connection's loop, then live again.
//! - [`server_side`]: the subscriptions the server makes: a backend's
//!   subscribe and unsubscribe of the user, the token's `topics`.
//! - [`posted`]: commands posted for the session over HTTP
//!   (`POST /stream/<session>`, [`crate::stream_commands`]), run as a
//!   frame's are.
//! - [`subscriptions`]: the subscriptions and acks a resume needs;
//!   [`registry`]: the pod's live sessions.
//! - [`stream`]: the same session over an SSE or HTTP-streaming response.
//! - [`echo`]: the conformance echo, over the same reader and writer.
//! - `fuzzing` (tests and fuzz builds only): what the fuzz targets check.

mod access;
mod approval;
mod catch_up;
mod commands;
mod connect;
mod connection;
pub mod echo;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
mod handshake;
mod hello;
pub(crate) mod parser;
mod posted;
mod rate;
mod reader;
mod registry;
mod replay;
mod resume;
mod rpc;
mod server_side;
mod stream;
mod subscriptions;
#[cfg(test)]
mod tests;

pub use crate::config::{Limits, Overflow};
pub use connect::Handshake;
pub use registry::{
    Arrival, LiveSession, MAX_POSTED_COMMANDS, MAX_SERVER_COMMANDS, Post, Registry, TakeOver,
    Unregistered, max_posted_bytes, session_key,
};
pub use replay::Replays;
pub use stream::{Opening, serve_piped, serve_stream};
pub use subscriptions::Subscriptions;

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use rand::RngCore;
use router::{Broker, Namespaces, SessionStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::admission::{Admission, ConnId};
use crate::auth::{Claims, Verifier};
use crate::budget::{Account, Budgets};
use crate::config::Config;
use crate::frame::Format;
use crate::hooks::Hooks;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::outbound::{Outbound, Writing, writer};
use crate::presence::Presence;
use rate::Bucket;
use reader::Reader;

/// What the pod's sessions use of it, and no more: built once by
/// [`crate::node`], which keeps the same handles for the rest of the pod.
pub struct Pod {
    pub config: Arc<Config>,
    pub hub: Arc<Hub>,
    pub broker: Arc<dyn Broker>,
    /// The session store: resumes claim from it, connections save to it.
    pub sessions: Arc<dyn SessionStore>,
    /// The sessions this pod's connections serve.
    pub live: Arc<Registry>,
    /// Checks client tokens; `None` when no key is configured (open mode).
    pub verifier: Option<Verifier>,
    pub namespaces: Arc<Namespaces>,
    pub metrics: Arc<Metrics>,
    /// The pod's replay turns and page size.
    pub replays: Replays,
    /// What every connection's writer needs of the pod.
    pub writing: Arc<Writing>,
    /// Wakes the session flusher before its interval (a shared store's:
    /// `None` with a pod-local one); see [`Subscriptions::new`].
    pub flush_soon: Option<Arc<Notify>>,
    /// What each user and anonymous address may hold and touch across its
    /// connections.
    pub budgets: Arc<Budgets>,
    /// Who is subscribed to the presence topics: subscriptions enter and
    /// leave it as they join and leave the hub.
    pub presence: Arc<Presence>,
    /// The application's backend: proxies and webhooks.
    pub hooks: Arc<Hooks>,
    /// Events to the backend (`[webhooks]`).
    pub webhooks: Arc<crate::webhooks::Webhooks>,
}

/// Serves an upgraded connection until it ends.
///
/// This and [`split`] are plain functions that return the connection's
/// future: an `async fn` keeps its arguments (the upgraded socket) in its
/// state for as long as it runs, next to what it made of them, and an idle
/// connection's task is mostly that state (issue #16).
///
/// `handshake`: what the connect proxy is given of the upgrade request, when
/// there is one (boxed: dropped at `hello`, absent otherwise).
///
/// `format`: how its frames are written and its commands read, as the
/// upgrade negotiated (the subprotocol, permessage-deflate or not).
pub fn serve_upgraded(
    upgraded: Upgraded,
    node: Arc<Pod>,
    admission: Admission,
    handshake: Option<Box<Handshake>>,
    format: Format,
) -> impl Future<Output = ()> {
    let limits = node.config.queue_limits();
    split(
        upgraded,
        limits,
        format,
        Herald {
            node,
            admission,
            handshake,
        },
    )
}

/// What runs over an upgraded connection once it is split: a Herald session,
/// or the conformance echo ([`echo`]), over the same reader and writer.
trait Serve {
    /// Serves `read` (after `early`, bytes read with the handshake), `write`
    /// and `out`.
    fn serve<R, W>(
        self,
        read: R,
        early: Bytes,
        write: W,
        out: Outbound,
    ) -> impl Future<Output = ()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static;
}

struct Herald {
    node: Arc<Pod>,
    admission: Admission,
    handshake: Option<Box<Handshake>>,
}

impl Serve for Herald {
    fn serve<R, W>(self, read: R, early: Bytes, write: W, out: Outbound) -> impl Future<Output = ()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let ws = &self.node.config.websocket;
        let cap = ws.compression.inflated_cap(ws.max_message_bytes);
        let reader = Reader::new(read, ws.max_message_bytes, ws.message_timeout)
            .inflating(out.format(), cap)
            .speaking(out.format())
            .after_handshake(&early);
        serve(
            reader,
            write,
            out,
            self.node,
            self.admission,
            self.handshake,
        )
    }
}

/// Splits `upgraded` into the halves its reader and writer own, with its
/// outgoing queue (of frames in `format`), and serves it with `conn`.
fn split(
    upgraded: Upgraded,
    limits: Limits,
    format: Format,
    conn: impl Serve,
) -> impl Future<Output = ()> {
    // Own the TCP stream's halves directly: no lock between reader and writer.
    match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let (read, write) = parts.io.into_inner().into_split();
            // Shared with the fan-out, which writes to an idle socket itself.
            let (out, write) = Outbound::with_socket_as(limits, write, format);
            // Bytes the client sent right behind its handshake come first
            // (copied: hyper's read buffer, 8 KiB, is dropped here).
            Either::Left(conn.serve(read, parts.read_buf, write, out))
        }
        Err(upgraded) => {
            let (read, write) = tokio::io::split(TokioIo::new(upgraded));
            let out = Outbound::formatted(limits, format);
            Either::Right(conn.serve(read, Bytes::new(), write, out))
        }
    }
}

/// The connection's future, with its session and reader made up front: the
/// future holds them once, where an `async fn` would hold its arguments too.
fn serve<R, W>(
    mut reader: Reader<R>,
    write: W,
    out: Outbound,
    node: Arc<Pod>,
    admission: Admission,
    handshake: Option<Box<Handshake>>,
) -> impl Future<Output = ()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut session = Session::new(node, &admission, out);
    session.handshake = handshake;
    async move {
        let writing = writer::run(write, session.out.clone(), session.node.writing.clone());
        // The writer in the reader's task, not a task of its own: an idle
        // connection is one task's state (issue #16). Each runs until the
        // other tells it to stop (`Outbound::stop`, or a close queued);
        // direct writes from the fan-out never wake this task.
        tokio::join!(writing, session.read(&mut reader));
        drop(reader);
        // Boxed: it runs once, at the end; carried inline, every idle
        // connection would hold its room all along.
        Box::pin(session.end()).await;
        drop(admission);
    }
}

struct Session {
    conn: ConnId,
    /// This connection's token as its session's owner in the store.
    owner: Arc<str>,
    /// Set by the first command (an explicit or implied `hello`).
    id: Option<Arc<str>>,
    resumed: bool,
    out: Outbound,
    subscriptions: Subscriptions,
    /// The client's address prefix: an anonymous client's budgets are its.
    address: IpNet,
    /// The budgets this connection draws on, from `hello` on. Boxed: an
    /// idle connection's task should stay small (issue #16).
    account: Option<Box<Account>>,
    /// What the client's token says; `None` for an anonymous client.
    /// Boxed: most of a pod's connections may be anonymous.
    claims: Option<Box<Claims>>,
    /// The session's own deadline ([`Session::deadline`]): until `hello`,
    /// when the first command must have come; then when the token expires
    /// (the connection closes, unless a `refresh` moves it), or, for a
    /// client the connect proxy let in, when to ask the refresh proxy. One
    /// field for both: an idle connection's task should stay small.
    due: Option<Instant>,
    /// The upgrade request's headers and address, for the connect proxy:
    /// taken (and dropped) by `hello`; `None` without a connect proxy.
    handshake: Option<Box<Handshake>>,
    /// The connect proxy let the client in: its expiry is a refresh
    /// proxy's call (`due` says when), not a token's end.
    proxied: bool,
    commands: Bucket,
    limited_in_a_row: u32,
    bad_in_a_row: u32,
    /// The pod's parts this session uses.
    node: Arc<Pod>,
    /// [`Session::end`] has run to its end: nothing is left to release.
    ended: bool,
}

/// Whatever ends a connection's task, what it holds in the pod's shared
/// state is given back: its hub memberships (and the watches they keep),
/// its registry entry (which the flusher would keep extending in the store)
/// and, with both, the last handles on its socket's write half. Normally
/// [`Session::end`] has done it, with the session saved; this covers a panic
/// anywhere in the task, so that a bug costs one connection and leaks
/// nothing (issue #21: a token's `exp` once overflowed the clock).
impl Drop for Session {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if std::thread::panicking() {
            self.node.metrics.connection_panics.inc();
            tracing::error!(
                conn = self.conn,
                "a connection's task panicked: its client is disconnected, what it held released, its session not saved"
            );
        }
        for topic in self.subscriptions.topics() {
            handshake::leave_now(&self.node, topic, self.conn);
        }
        if let Some(id) = &self.id {
            self.node.live.deregister(id, self.conn);
        }
        self.subscriptions.end();
        self.out.finish();
        self.out.stop();
    }
}

impl Session {
    fn new(node: Arc<Pod>, admission: &Admission, out: Outbound) -> Self {
        let ws = &node.config.websocket;
        Session {
            conn: admission.conn,
            owner: random_id(),
            id: None,
            resumed: false,
            out,
            subscriptions: Subscriptions::new(node.flush_soon.clone()),
            address: admission.address,
            account: None,
            claims: None,
            due: Some(Instant::now() + ws.hello_timeout),
            handshake: None,
            proxied: false,
            commands: Bucket::new(ws.commands_per_second, ws.commands_burst),
            limited_in_a_row: 0,
            bad_in_a_row: 0,
            node,
            ended: false,
        }
    }
}

/// A session id as logs show it: a short hash, enough to follow one
/// session's lines, useless to resume it with.
fn tag(id: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// 128 random bits from a CSPRNG, hex: unguessable, and safe in any header.
/// A session's id, and a connection's owner token.
fn random_id() -> Arc<str> {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Arc::from(hex)
}

#[cfg(test)]
mod sizes {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returns<A, B, C, D, E, F, Fut>(_: F) -> usize
    where
        F: Fn(A, B, C, D, E) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    fn returns4<A, B, C, D, F, Fut>(_: F) -> usize
    where
        F: Fn(A, B, C, D) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// What an idle connection's own task holds, by part (issue #16):
    /// printed with `--nocapture`.
    #[test]
    fn sizes_of_a_connections_task() {
        println!(
            "connection task future {} (Session {}, Reader {})",
            returns(serve_upgraded),
            std::mem::size_of::<Session>(),
            std::mem::size_of::<Reader<tokio::net::tcp::OwnedReadHalf>>(),
        );
        // An SSE or HTTP-streaming connection's task (issue #25).
        println!("stream task future {}", returns4(serve_stream));
    }
}
