//! A TCP proxy that puts a bad network between a client and a server:
//! added latency, lost packets and partitions, changed while connections
//! are open. It stands in for `tc netem` where the kernel cannot do that
//! (netem needs root and the `sch_netem` module): Redis behind a slow or
//! broken link, in tests (`testkit::faults`), in the load tool (`stall`,
//! `herald-loadtest proxy`) and in `scripts/bench.sh`.
//!
//! What a byte stream can show of each fault, and so what the proxy does:
//! - latency: each chunk read is written on half the added round trip
//!   later, in order;
//! - loss: TCP hides a lost segment behind its retransmission, so a lost
//!   chunk goes on [`RETRANSMIT`] late, and holds up what follows it;
//! - a partition: nothing moves either way and connections stay open, as
//!   on a link that drops every packet (no reset); new connections are
//!   accepted but reach the server once healed. What was sent meanwhile
//!   arrives then.
//!
//! And what a "virtual IP" in front of a failover does ([`Proxy::switch`]):
//! the address stays, the server behind it changes and every connection is
//! cut (`chaos`, whose pods know Redis only by the proxy's address, while
//! it holds them back with a partition and reads the new server first).
//!
//! `herald-loadtest proxy` runs one as a process of its own, changed
//! through a control port ([`control`], [`tell`]): one command a line
//! (`delay 200ms`, `loss 10`, `partition`, `heal`, `show`), one answer a
//! line (`ok delay=200ms loss=10% partitioned=false`, or `error: ...`).

use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// How late a lost chunk arrives: Linux's minimum retransmission timeout.
pub const RETRANSMIT: Duration = Duration::from_millis(200);

/// Chunks read ahead of the writer, per direction: past this the proxy
/// stops reading, and the sender's socket buffer fills, as with a slow link.
const IN_FLIGHT: usize = 1024;

/// The biggest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// Longest a control connection may take over a command and its answer:
/// the port serves one connection at a time.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest control line read.
const CONTROL_LINE: usize = 256;

/// Longest connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The network the proxy plays.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Added to every round trip (half each way).
    pub delay: Duration,
    /// The chance that a chunk is lost, in percent.
    pub loss: f64,
    /// Nothing gets through, either way.
    pub partitioned: bool,
}

/// Where new connections go, and which of those open are still carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    upstream: SocketAddr,
    /// Bumped to cut every connection opened before.
    generation: u64,
}

/// A running proxy; stops (closing its connections) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    route: watch::Sender<Route>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `listen` (port 0: any free port; see [`addr`](Self::addr))
    /// and forwards every connection to `upstream`, on a thread and runtime
    /// of its own, so that it keeps time whatever the caller's runtime does.
    pub fn start(listen: SocketAddr, upstream: SocketAddr, faults: Faults) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (sender, watched) = watch::channel(faults);
        let (route, routes) = watch::channel(Route {
            upstream,
            generation: 0,
        });
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("proxy {addr}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept(listener, routes, watched) => {}
                    }
                });
                // Dropping the runtime drops every connection's tasks, and
                // so closes their sockets.
            })?;
        Ok(Self {
            addr,
            faults: sender,
            route,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The network as it is now.
    pub fn faults(&self) -> Faults {
        *self.faults.borrow()
    }

    /// Changes the network; chunks already read keep the delay they got.
    pub fn set(&self, faults: Faults) {
        self.faults.send_replace(faults);
    }

    /// Changes part of the network.
    pub fn update(&self, change: impl FnOnce(&mut Faults)) {
        self.faults.send_modify(change);
    }

    /// Closes every connection open now (their clients see them drop);
    /// new ones are carried as before.
    pub fn cut(&self) {
        self.route.send_modify(|r| r.generation += 1);
    }

    /// Sends new connections to `upstream`, and cuts the old ones.
    pub fn switch(&self, upstream: SocketAddr) {
        self.route.send_modify(|r| {
            r.upstream = upstream;
            r.generation += 1;
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves `proxy`'s control port until the listener fails: one connection
/// at a time, each for up to [`CONTROL_TIMEOUT`].
pub async fn control(listener: TcpListener, proxy: &Proxy) -> io::Result<()> {
    loop {
        let (socket, _) = listener.accept().await?;
        let _ = tokio::time::timeout(CONTROL_TIMEOUT, converse(socket, proxy)).await;
    }
}

/// Answers each command line of one control connection.
async fn converse(socket: TcpStream, proxy: &Proxy) -> io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut lines = tokio::io::BufReader::new(read.take(64 * CONTROL_LINE as u64)).lines();
    while let Some(line) = lines.next_line().await? {
        let answer = match command(proxy, line.trim()) {
            Ok(()) => format!("ok {}\n", describe(&proxy.faults())),
            Err(e) => format!("error: {e}\n"),
        };
        write.write_all(answer.as_bytes()).await?;
    }
    Ok(())
}

/// Applies one control command.
fn command(proxy: &Proxy, line: &str) -> Result<(), String> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("show") | None, None, None) => {}
        (Some("delay"), Some(delay), None) => {
            let delay = humantime::parse_duration(delay).map_err(|e| format!("{delay}: {e}"))?;
            proxy.update(|f| f.delay = delay);
        }
        (Some("loss"), Some(percent), None) => {
            let loss = percent
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .ok_or_else(|| format!("{percent}: a percentage, 0 to 100"))?;
            proxy.update(|f| f.loss = loss);
        }
        (Some("partition"), None, None) => proxy.update(|f| f.partitioned = true),
        (Some("heal"), None, None) => proxy.update(|f| f.partitioned = false),
        _ => {
            return Err(format!(
                "`{line}`: delay <time>, loss <percent>, partition, heal or show"
            ));
        }
    }
    Ok(())
}

/// `delay=200ms loss=10% partitioned=false`.
pub fn describe(faults: &Faults) -> String {
    format!(
        "delay={} loss={}% partitioned={}",
        humantime::format_duration(faults.delay),
        faults.loss,
        faults.partitioned
    )
}

/// Sends `command` to the control port at `control`; its `ok` answer.
pub async fn tell(control: SocketAddr, command: &str) -> io::Result<String> {
    let exchange = async {
        let mut socket = TcpStream::connect(control).await?;
        socket.write_all(format!("{command}\n").as_bytes()).await?;
        let mut answer = String::new();
        tokio::io::BufReader::new(socket.take(CONTROL_LINE as u64))
            .read_line(&mut answer)
            .await?;
        match answer.trim().strip_prefix("ok") {
            Some(state) => Ok(state.trim().to_owned()),
            None => Err(io::Error::other(format!(
                "proxy at {control} answered `{}` to `{command}`",
                answer.trim()
            ))),
        }
    };
    tokio::time::timeout(CONTROL_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::other(format!("no answer from the proxy at {control}")))?
}

async fn accept(
    listener: TcpListener,
    routes: watch::Receiver<Route>,
    faults: watch::Receiver<Faults>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors, say: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let faults = faults.clone();
        let mut routes = routes.clone();
        tokio::spawn(async move {
            let mut watched = faults.clone();
            // The server is on the other side of the partition.
            if watched.wait_for(|f| !f.partitioned).await.is_err() {
                return;
            }
            // Where it is now: a switch during the partition counts.
            let route = *routes.borrow_and_update();
            let Ok(Ok(server)) =
                tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(route.upstream)).await
            else {
                // Nothing there (Redis restarting): the client sees its
                // connection close.
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let carry = async {
                tokio::join!(
                    pump(client_read, server_write, faults.clone()),
                    pump(server_read, client_write, faults),
                )
            };
            // A cut drops both directions, and so closes both sockets.
            let cut = routes.wait_for(|r| r.generation != route.generation);
            tokio::select! {
                _ = carry => {}
                _ = cut => {}
            }
        });
    }
}

/// Carries one direction until its reader ends, then ends the writer's
/// side too, as the other end of a TCP connection would see it.
async fn pump(from: OwnedReadHalf, to: OwnedWriteHalf, faults: watch::Receiver<Faults>) {
    let (chunks, queued) = mpsc::channel(IN_FLIGHT);
    tokio::join!(
        read(from, chunks, faults.clone()),
        write(queued, to, faults)
    );
}

/// Reads chunks and stamps each with when it may go on.
async fn read(
    mut from: OwnedReadHalf,
    chunks: mpsc::Sender<(Instant, Bytes)>,
    faults: watch::Receiver<Faults>,
) {
    let mut last = Instant::now();
    let mut buf = BytesMut::with_capacity(CHUNK);
    loop {
        buf.reserve(CHUNK);
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let now = Instant::now();
        let Faults { delay, loss, .. } = *faults.borrow();
        let mut due = now + delay / 2;
        if loss > 0.0 && rand::thread_rng().gen_bool((loss / 100.0).clamp(0.0, 1.0)) {
            due += RETRANSMIT;
        }
        // TCP delivers in order: nothing overtakes a late chunk.
        due = due.max(last);
        last = due;
        if chunks.send((due, buf.split().freeze())).await.is_err() {
            return;
        }
    }
}

/// Writes each chunk when it is due and the link is up.
async fn write(
    mut queued: mpsc::Receiver<(Instant, Bytes)>,
    mut to: OwnedWriteHalf,
    mut faults: watch::Receiver<Faults>,
) {
    while let Some((due, chunk)) = queued.recv().await {
        // A timer fires on the next millisecond tick at the earliest: a
        // chunk already due goes at once.
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        if faults.wait_for(|f| !f.partitioned).await.is_err() {
            return;
        }
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; its address.
    async fn echo() -> io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        Ok(addr)
    }

    async fn round_trip(client: &mut TcpStream) -> io::Result<Duration> {
        let start = Instant::now();
        client.write_all(b"ping").await?;
        let mut back = [0; 4];
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut back))
            .await
            .map_err(|_| io::Error::other("no echo in time"))??;
        assert_eq!(&back, b"ping");
        Ok(start.elapsed())
    }

    #[tokio::test]
    async fn the_proxy_adds_its_delay_to_each_round_trip_and_holds_everything_while_partitioned()
    -> io::Result<()> {
        let delay = Duration::from_millis(100);
        let faults = Faults {
            delay,
            ..Faults::default()
        };
        let proxy = Proxy::start(
            "127.0.0.1:0".parse().map_err(io::Error::other)?,
            echo().await?,
            faults,
        )?;
        let mut client = TcpStream::connect(proxy.addr()).await?;
        for _ in 0..3 {
            let took = round_trip(&mut client).await?;
            assert!(
                delay <= took && took < delay * 3,
                "a round trip took {took:?}"
            );
        }

        proxy.update(|f| f.partitioned = true);
        client.write_all(b"ping").await?;
        let mut back = [0; 4];
        let held = tokio::time::timeout(delay * 5, client.read_exact(&mut back)).await;
        assert!(held.is_err(), "nothing crosses a partition");
        proxy.update(|f| f.partitioned = false);
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut back))
            .await
            .map_err(|_| io::Error::other("nothing after the heal"))??;
        assert_eq!(&back, b"ping", "what was sent arrives once healed");
        Ok(())
    }

    #[tokio::test]
    async fn the_control_port_changes_the_network() -> io::Result<()> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let proxy = Proxy::start(any, echo().await?, Faults::default())?;
        let listener = TcpListener::bind(any).await?;
        let port = listener.local_addr()?;
        let serving = async { control(listener, &proxy).await };
        let telling = async {
            let said = tell(port, "delay 200ms").await?;
            assert_eq!(said, "delay=200ms loss=0% partitioned=false");
            assert_eq!(
                tell(port, "loss 12.5").await?,
                "delay=200ms loss=12.5% partitioned=false"
            );
            assert_eq!(
                tell(port, "partition").await?,
                "delay=200ms loss=12.5% partitioned=true"
            );
            let refused = tell(port, "delay soon").await;
            assert!(refused.is_err_and(|e| e.to_string().contains("delay soon")));
            io::Result::Ok(())
        };
        tokio::select! {
            told = telling => told?,
            served = serving => served?,
        }
        assert_eq!(
            proxy.faults(),
            Faults {
                delay: Duration::from_millis(200),
                loss: 12.5,
                partitioned: true
            }
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_lost_chunk_comes_a_retransmission_late() -> io::Result<()> {
        let faults = Faults {
            loss: 100.0,
            ..Faults::default()
        };
        let proxy = Proxy::start(
            "127.0.0.1:0".parse().map_err(io::Error::other)?,
            echo().await?,
            faults,
        )?;
        let mut client = TcpStream::connect(proxy.addr()).await?;
        let took = round_trip(&mut client).await?;
        // Lost on the way there and on the way back.
        assert!(took >= RETRANSMIT * 2, "a round trip took {took:?}");
        Ok(())
    }

    #[tokio::test]
    async fn a_switch_cuts_every_connection_and_sends_new_ones_to_the_new_server() -> io::Result<()>
    {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let proxy = Proxy::start(any, echo().await?, Faults::default())?;
        let mut old = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut old).await?;

        // Held while the new server is looked at: a new connection waits.
        proxy.update(|f| f.partitioned = true);
        proxy.switch(echo().await?);
        let mut byte = [0; 1];
        let end = tokio::time::timeout(Duration::from_secs(10), old.read(&mut byte))
            .await
            .map_err(|_| io::Error::other("not cut in time"))?;
        assert!(matches!(end, Ok(0) | Err(_)), "cut: {end:?}");
        let mut fresh = TcpStream::connect(proxy.addr()).await?;
        proxy.update(|f| f.partitioned = false);
        round_trip(&mut fresh).await?;

        proxy.cut();
        let end = tokio::time::timeout(Duration::from_secs(10), fresh.read(&mut byte))
            .await
            .map_err(|_| io::Error::other("not cut in time"))?;
        assert!(matches!(end, Ok(0) | Err(_)), "cut: {end:?}");
        Ok(())
    }
}
