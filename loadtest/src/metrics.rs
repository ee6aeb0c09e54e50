//! A gateway's `/metrics` (Prometheus text), for what a client cannot see
//! for itself: a client that never reads cannot read the close frame the
//! gateway sends it either, so `slow` learns when the gateway closed it from
//! `herald_connections_closed_total{reason}` (docs/metrics.md).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::http1::SendRequest;
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::Error;
use crate::publish::round_trip;

/// Longest one scrape may take, connecting included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// The counter of closed connections, by `reason`.
pub const CLOSED_TOTAL: &str = "herald_connections_closed_total";

/// Reads one gateway's `/metrics` over a keep-alive connection, opened on
/// first use and again after a failure.
pub struct Scraper {
    target: SocketAddr,
    sender: Option<SendRequest<Empty<Bytes>>>,
}

impl Scraper {
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            sender: None,
        }
    }

    /// `herald_connections_closed_total`, by reason.
    pub async fn closes(&mut self) -> Result<BTreeMap<String, u64>, Error> {
        Ok(closes_in(&self.get("/metrics").await?))
    }

    /// The body of `GET path`, at most [`SCRAPE_TIMEOUT`].
    pub async fn get(&mut self, path: &str) -> Result<String, Error> {
        let target = self.target;
        let fail = |reason: String| Error::Scrape { target, reason };
        let exchange = async {
            let mut sender = match self.sender.take() {
                Some(s) => s,
                None => {
                    let stream = TcpStream::connect(target)
                        .await
                        .map_err(|e| fail(format!("connect: {e}")))?;
                    let (sender, conn) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(|e| fail(format!("HTTP handshake: {e}")))?;
                    // The connection's I/O runs beside; it ends with `sender`.
                    tokio::spawn(conn);
                    sender
                }
            };
            let request = Request::get(path)
                .header(HOST, target.to_string())
                .body(Empty::new())
                .map_err(|e| fail(format!("request: {e}")))?;
            let (status, body) = round_trip(&mut sender, request).await.map_err(fail)?;
            if status != StatusCode::OK {
                return Err(fail(format!("{status}")));
            }
            // Kept only after a whole, good exchange.
            self.sender = Some(sender);
            String::from_utf8(body.to_vec()).map_err(|e| fail(format!("not UTF-8: {e}")))
        };
        tokio::time::timeout(SCRAPE_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("no answer within {SCRAPE_TIMEOUT:?}")))?
    }
}

/// The samples of [`CLOSED_TOTAL`] in Prometheus text, by `reason`.
pub fn closes_in(text: &str) -> BTreeMap<String, u64> {
    let prefix = format!("{CLOSED_TOTAL}{{reason=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (reason, rest) = rest.split_once('"')?;
            let value = rest.strip_prefix('}')?.split_whitespace().next()?;
            // Counters print as integers or as floats (`3`, `3e0`).
            let value: f64 = value.parse().ok()?;
            Some((reason.to_owned(), value as u64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_are_read_by_reason() {
        let text = "# HELP herald_connections_closed_total WebSocket connections closed.\n\
                    # TYPE herald_connections_closed_total counter\n\
                    herald_connections_closed_total{reason=\"client_closed\"} 12\n\
                    herald_connections_closed_total{reason=\"write_timeout\"} 1\n\
                    herald_connections_opened_total 13\n";
        let closes = closes_in(text);
        assert_eq!(closes.len(), 2);
        assert_eq!(closes["client_closed"], 12);
        assert_eq!(closes["write_timeout"], 1);
    }
}
