//! `wire`: bytes on the wire per message, measured. For each payload size,
//! the payload (a JSON string of exactly that many bytes) is published
//! through a real gateway and received by a [`raw::Client`], which counts
//! the bytes of the frame that carried it: the WebSocket header, Herald's
//! `msg` envelope (`{"op":"msg","topic":…,"seq":…,"data":` and `}`) and the
//! payload. Against it, the same payload in a minimal HTTP/1.1 POST
//! (request line, `Host`, `Content-Type`, `Content-Length`), written on a
//! loopback socket to a listener of this tool that counts what it reads.
//! A POST's answer, TCP/IP headers and the publish that fed Herald are not
//! counted: this is what one message costs on the way to its reader.
//!
//! Payloads over 64 KiB need a gateway with larger limits: publish bodies
//! (`http.max_body_bytes`) and each client's queue (`queue.bytes`), see the
//! usage text.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::clients::client_failure;
use crate::publish::{Connection, body};
use crate::raw::{self, Client};
use crate::report::{Outcome, Row};
use crate::{Error, Target};

/// The sizes the issue asks for: around the 125/126 header step, 1 KiB,
/// 64 KiB (the 16/64-bit length step) and 1 MiB.
pub const DEFAULT_SIZES: [usize; 6] = [10, 125, 126, 1024, 65_536, 1_048_576];
/// Largest payload measured.
pub const MAX_SIZE: usize = 8 * 1024 * 1024;
/// Longest wait for one frame, or one POST to be read.
const WAIT: Duration = Duration::from_secs(10);
/// The client's first buffer; it grows for a large frame.
const BUFFER_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    pub gateway: Target,
    pub publish_to: Target,
    /// Payload sizes in bytes (each at least 2: a JSON string).
    pub sizes: Vec<usize>,
    /// The topic; by default a fresh 8-character one (`wire` and 4 digits),
    /// so that its length and seq, which are in every frame, stay the same
    /// from run to run.
    pub topic: Option<String>,
}

impl Options {
    pub fn new(gateway: Target) -> Self {
        Self {
            publish_to: gateway.clone(),
            gateway,
            sizes: DEFAULT_SIZES.to_vec(),
            topic: None,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if self.sizes.is_empty() || self.sizes.iter().any(|&s| !(2..=MAX_SIZE).contains(&s)) {
            return Err(Error::Options(format!(
                "--sizes must each be 2 to {MAX_SIZE} bytes"
            )));
        }
        Ok(())
    }
}

/// One payload size's bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    pub payload_bytes: usize,
    /// The whole WebSocket frame as read off the socket.
    pub herald_bytes: Option<usize>,
    /// Of those, the WebSocket header.
    pub header_bytes: Option<usize>,
    /// Herald's `msg` envelope around the payload.
    pub envelope_bytes: Option<usize>,
    /// The minimal HTTP/1.1 POST carrying the payload, as the listener read it.
    pub http_post_bytes: Option<usize>,
    /// Why a figure is missing.
    pub error: Option<String>,
}

/// The result of a `wire` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Wire {
    pub gateway: String,
    pub topic: String,
    pub sizes: Vec<Measured>,
}

pub async fn run(options: Options) -> Result<Wire, Error> {
    options.validate()?;
    let topic = options
        .topic
        .clone()
        .unwrap_or_else(|| format!("wire{:04}", crate::latency::now_micros() % 10_000));
    let target = &options.gateway;
    let fail = client_failure(0, None, target.addr);
    let mut client = tokio::time::timeout(WAIT, async {
        let mut c = Client::connect(None, target, BUFFER_BYTES, 0)
            .await
            .map_err(|e| fail(e.to_string()))?;
        c.subscribe(&[&topic]).await.map_err(fail)?;
        Ok::<_, Error>(c)
    })
    .await
    .map_err(|_| fail(format!("not subscribed within {WAIT:?}")))??;
    let mut publisher = Connection::open(options.publish_to.addr).await?;
    let listener = TcpListener::bind((options.gateway.addr.ip(), 0))
        .await
        .map_err(|e| Error::Options(format!("binding the POST listener: {e}")))?;

    let mut sizes = Vec::with_capacity(options.sizes.len());
    for &size in &options.sizes {
        let payload = super::throughput::payload(size);
        let mut m = Measured {
            payload_bytes: size,
            herald_bytes: None,
            header_bytes: None,
            envelope_bytes: None,
            http_post_bytes: None,
            error: None,
        };
        match http_post(&listener, payload.as_bytes()).await {
            Ok(n) => m.http_post_bytes = Some(n),
            Err(e) => m.error = Some(format!("HTTP POST: {e}")),
        }
        match publisher.publish(body(&topic, &payload)).await {
            Ok(published) => match receive(&mut client, &topic, published.seq, &payload).await {
                Ok((frame, payload_len)) => {
                    m.herald_bytes = Some(frame);
                    m.header_bytes = Some(frame - payload_len);
                    m.envelope_bytes = Some(payload_len - size);
                }
                Err(e) => {
                    m.error.get_or_insert(e);
                }
            },
            Err(e) => {
                let hint = if size > 60 * 1024 {
                    " (a payload over 64 KiB needs HERALD_HTTP__MAX_BODY_BYTES and \
                     HERALD_QUEUE__BYTES raised: see --help)"
                } else {
                    ""
                };
                m.error.get_or_insert(format!("publish: {e}{hint}"));
                // A refused body may leave the connection closed.
                publisher = Connection::open(options.publish_to.addr).await?;
            }
        }
        sizes.push(m);
    }
    Ok(Wire {
        gateway: options.gateway.ws_url(),
        topic,
        sizes,
    })
}

/// Reads frames until the `msg` of `seq` on `topic` (answering pings);
/// checks that it carries `payload`; (frame bytes, frame payload bytes).
async fn receive(
    client: &mut Client,
    topic: &str,
    seq: u64,
    payload: &str,
) -> Result<(usize, usize), String> {
    let reading = async {
        loop {
            let frame = match client.next().await {
                Ok(Some(f)) => f,
                Ok(None) => return Err("the gateway closed the connection".to_owned()),
                Err(e) => return Err(format!("reading: {e}")),
            };
            match frame.opcode {
                raw::OP_TEXT => {}
                raw::OP_PING => {
                    let ping = frame.payload.to_vec();
                    client
                        .send(raw::OP_PONG, &ping)
                        .await
                        .map_err(|e| format!("pong: {e}"))?;
                    continue;
                }
                raw::OP_CLOSE => {
                    return Err(format!(
                        "closed: {} (a large frame needs HERALD_QUEUE__BYTES over its size)",
                        raw::describe_close(frame.payload)
                    ));
                }
                op => return Err(format!("unexpected opcode {op}")),
            }
            if raw::msg_topic_seq(frame.payload) != Some((topic.as_bytes(), seq)) {
                let shown = &frame.payload[..frame.payload.len().min(100)];
                return Err(format!(
                    "expected the msg of seq {seq}, got {}",
                    String::from_utf8_lossy(shown)
                ));
            }
            if !frame.payload.ends_with(format!("{payload}}}").as_bytes()) {
                return Err("the msg does not carry the payload as published".to_owned());
            }
            return Ok((frame.wire_bytes, frame.payload.len()));
        }
    };
    tokio::time::timeout(WAIT, reading)
        .await
        .map_err(|_| format!("no msg within {WAIT:?}"))?
}

/// Sends a minimal POST carrying `payload` to `listener` over loopback and
/// returns the bytes the listener read for it.
async fn http_post(listener: &TcpListener, payload: &[u8]) -> std::io::Result<usize> {
    let addr = listener.local_addr()?;
    let mut request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        payload.len()
    )
    .into_bytes();
    request.extend_from_slice(payload);
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let (mut server, _) = listener.accept().await?;
        let (_, read) = tokio::try_join!(
            async {
                stream.write_all(&request).await?;
                stream.shutdown().await
            },
            async {
                let mut seen = Vec::new();
                server.read_to_end(&mut seen).await?;
                if seen != request {
                    return Err(std::io::Error::other("the listener read another request"));
                }
                Ok(seen.len())
            }
        )?;
        Ok(read)
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .map_err(|_| std::io::Error::other(format!("not done within {WAIT:?}")))?
}

/// `123 B`, `1 KiB`, `1 MiB`.
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// `n B (+o B, p%)` of `total` over `payload`.
fn with_overhead(total: Option<usize>, payload: usize) -> String {
    match total {
        None => "-".to_owned(),
        Some(t) => format!(
            "{t} B (+{} B, {:.1}%)",
            t - payload,
            (t - payload) as f64 * 100.0 / payload as f64
        ),
    }
}

impl Outcome for Wire {
    const SCENARIO: &'static str = "wire";

    fn rows(&self) -> Vec<Row> {
        let mut rows = vec![
            Row::new(
                "gateway",
                format!(
                    "{} (topic {}, {} bytes)",
                    self.gateway,
                    self.topic,
                    self.topic.len()
                ),
            ),
            Row::new(
                "payload",
                "Herald frame (server to client) | minimal HTTP/1.1 POST",
            ),
        ];
        for m in &self.sizes {
            let mut value = format!(
                "{:<28} | {}",
                with_overhead(m.herald_bytes, m.payload_bytes),
                with_overhead(m.http_post_bytes, m.payload_bytes)
            );
            if let Some(e) = &m.error {
                value.push_str(&format!("  [{e}]"));
            }
            rows.push(Row::new(size(m.payload_bytes), value));
        }
        rows
    }

    fn failures(&self) -> Vec<String> {
        self.sizes
            .iter()
            .filter_map(|m| {
                m.error
                    .as_ref()
                    .map(|e| format!("{}: {e}", size(m.payload_bytes)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(10), "10 B");
        assert_eq!(size(1024), "1 KiB");
        assert_eq!(size(1_048_576), "1 MiB");
        assert_eq!(with_overhead(Some(60), 10), "60 B (+50 B, 500.0%)");
    }
}
