//! One HTTP/1.1 exchange written by hand, for a process that may not answer
//! at all yet (a `herald` starting, or on its way out): a probe of
//! `/readyz`, a scrape.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest one hand-written HTTP exchange ([`get`], [`request`]) may take.
pub const HTTP_WAIT: Duration = Duration::from_secs(5);

/// One `GET` over a fresh connection (`Connection: close`): (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::time::timeout(HTTP_WAIT, TcpStream::connect(addr)).await??;
    request(
        &mut stream,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Writes `raw` on `stream` and reads the response until the server closes
/// the connection: (status, body).
pub async fn request(stream: &mut TcpStream, raw: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        stream.write_all(raw.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(HTTP_WAIT, exchange).await??;
    parse_response(&response)
}

/// (status, body) of an HTTP/1.1 response read in full.
pub fn parse_response(response: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(response);
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an HTTP response: {text:?}"),
        )
    };
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .ok_or_else(bad)?;
    Ok((status, body))
}
