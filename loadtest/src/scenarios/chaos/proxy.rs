//! The "virtual IP" between the pods and Redis: a TCP proxy in this process
//! that every pod connects to instead of Redis. Herald has no Sentinel
//! support yet, so this is how a failover looks to it: the address stays,
//! the server behind it changes and every connection is cut. It can also
//! add latency each way, and hold all traffic (bytes are not forwarded, new
//! connections wait) while the scenario looks at a Redis before the pods
//! may.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Error;

/// Longest connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read at once from either side.
const CHUNK_BYTES: usize = 16 * 1024;
/// Chunks in flight per direction (delayed, or held): the reader waits
/// beyond, so a held connection pushes back through TCP.
const CHUNKS_IN_FLIGHT: usize = 256;
/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// Where and how traffic goes; every connection watches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    upstream: SocketAddr,
    /// Bumped to cut every connection opened before.
    generation: u64,
    /// Nothing forwarded, nothing connected upstream.
    held: bool,
    /// Added to every chunk, each way.
    delay: Duration,
}

pub struct Proxy {
    pub addr: SocketAddr,
    route: watch::Sender<Route>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::Cluster(format!("proxy bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Cluster(format!("proxy address: {e}")))?;
        let (route, routes) = watch::channel(Route {
            upstream,
            generation: 0,
            held: false,
            delay: Duration::ZERO,
        });
        let accept = tokio::spawn(accept(listener, routes));
        Ok(Self {
            addr,
            route,
            accept,
        })
    }

    /// Stops forwarding and connecting until [`Proxy::release`].
    pub fn hold(&self) {
        self.route.send_modify(|r| r.held = true);
    }

    pub fn release(&self) {
        self.route.send_modify(|r| r.held = false);
    }

    /// Latency added to every chunk, each way, from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.route.send_modify(|r| r.delay = delay);
    }

    /// Closes every connection (the pods see their Redis connections drop).
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
        // The connections end too: their watch channel closes.
        self.accept.abort();
    }
}

async fn accept(listener: TcpListener, routes: watch::Receiver<Route>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(serve(client, routes.clone()));
            }
            Err(_) => tokio::time::sleep(ACCEPT_PAUSE).await,
        }
    }
}

/// One pod connection: waits while held, connects upstream, forwards both
/// ways until either side ends or the connection is cut.
async fn serve(client: TcpStream, mut routes: watch::Receiver<Route>) {
    let route = loop {
        let route = *routes.borrow_and_update();
        if !route.held {
            break route;
        }
        if routes.changed().await.is_err() {
            return;
        }
    };
    let Ok(Ok(server)) =
        tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(route.upstream)).await
    else {
        // Nothing there (Redis restarting): the pod sees its connection close.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, routes.clone(), route.generation);
    let down = pump(server_read, client_write, routes.clone(), route.generation);
    // Either direction ending ends both (the halves close when dropped).
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Copies `from` to `to`, each chunk delayed by the route's delay at the
/// time it was read and held while the route is held, in order; ends at
/// EOF (after writing what was read), on an error, or when cut.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    routes: watch::Receiver<Route>,
    generation: u64,
) {
    let (chunks, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    let reading = {
        let routes = routes.clone();
        async move {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let due = Instant::now() + routes.borrow().delay;
                if chunks.send((due, buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    };
    let writing = {
        let mut routes = routes.clone();
        async move {
            while let Some((due, chunk)) = queue.recv().await {
                tokio::time::sleep_until(due).await;
                loop {
                    let route = *routes.borrow_and_update();
                    if route.generation != generation {
                        return;
                    }
                    if !route.held {
                        break;
                    }
                    if routes.changed().await.is_err() {
                        return;
                    }
                }
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    let cut = {
        let mut routes = routes;
        async move {
            loop {
                if routes.borrow_and_update().generation != generation {
                    return;
                }
                if routes.changed().await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(reading, writing) } => {}
        _ = cut => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port; its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Vec<u8> {
        stream.write_all(text).await.expect("write");
        let mut back = vec![0u8; text.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
            .await
            .expect("in time")
            .expect("read");
        back
    }

    #[tokio::test]
    async fn forwards_delays_holds_and_cuts() {
        let proxy = Proxy::start(echo().await).await.expect("proxy");
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        assert_eq!(round_trip(&mut stream, b"one").await, b"one");

        proxy.set_delay(Duration::from_millis(100));
        let sent = Instant::now();
        assert_eq!(round_trip(&mut stream, b"two").await, b"two");
        assert!(sent.elapsed() >= Duration::from_millis(200), "both ways");
        proxy.set_delay(Duration::ZERO);

        proxy.hold();
        stream.write_all(b"three").await.expect("write");
        let mut byte = [0u8; 1];
        let held =
            tokio::time::timeout(Duration::from_millis(200), stream.read_exact(&mut byte)).await;
        assert!(held.is_err(), "nothing comes back while held");
        proxy.release();
        let mut back = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&back, b"three");

        // A switch cuts the old connection; new ones reach the new upstream.
        proxy.switch(echo().await);
        let end = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .expect("cut in time");
        assert!(matches!(end, Ok(0) | Err(_)), "closed: {end:?}");
        let mut fresh = TcpStream::connect(proxy.addr).await.expect("connect");
        assert_eq!(round_trip(&mut fresh, b"four").await, b"four");
    }
}
