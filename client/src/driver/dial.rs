//! Dialing: TCP (from the local address asked for), the WebSocket upgrade
//! (offering `herald.v1.protobuf` in protobuf mode), `hello` (resuming when
//! it may) and the wait for `welcome`. Its own module: all that comes before
//! a connection is live, fails its own way (retry, or stop for good) and
//! touches none of a live connection's state.

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{CLOSE_DRAIN, Driver, Failed, Welcome, Ws};
use crate::wire::{self, Incoming};
use crate::{Error, ErrorCode, Protocol, reconnects_after};

impl Driver {
    /// TCP, the upgrade, `hello` (resuming when it may) and `welcome`.
    pub(super) async fn connect(&mut self, url: &str) -> Result<(Ws, Welcome), Failed> {
        let retry = |reason: String, refused: bool| {
            Failed::Retry(Error::Connect {
                url: url.to_owned(),
                reason,
                refused,
            })
        };
        let token = match &self.s.token {
            Some(provider) => match timeout(self.s.connect_timeout, provider()).await {
                Ok(Ok(token)) => Some(token),
                Ok(Err(e)) => return Err(Failed::Retry(Error::Token(e))),
                Err(_) => return Err(Failed::Retry(Error::Token("timed out".to_owned()))),
            },
            None => None,
        };
        let host = wire::host_port(url).map_err(Failed::Terminal)?;
        let connecting = timeout(self.s.connect_timeout, self.tcp(&host)).await;
        let stream = match connecting {
            Err(_) => return Err(retry("TCP connect timed out".to_owned(), false)),
            Ok(Err(e)) => {
                let refused = e.kind() == std::io::ErrorKind::ConnectionRefused;
                if refused {
                    self.s.endpoints.refused(url);
                }
                return Err(retry(e.to_string(), refused));
            }
            Ok(Ok(stream)) => stream,
        };
        let config = WebSocketConfig::default().read_buffer_size(self.s.read_buffer);
        let request = self.upgrade_request(url).map_err(Failed::Terminal)?;
        let upgrade = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
        let mut ws = match timeout(self.s.connect_timeout, upgrade).await {
            Err(_) => return Err(retry("WebSocket upgrade timed out".to_owned(), false)),
            Ok(Err(WsError::Protocol(ProtocolError::SecWebSocketSubProtocolError(e)))) => {
                return Err(retry(
                    format!(
                        "WebSocket upgrade: the server did not select {} ({e})",
                        wire::PROTOBUF
                    ),
                    false,
                ));
            }
            Ok(Err(e)) => return Err(retry(format!("WebSocket upgrade: {e}"), false)),
            Ok(Ok((ws, _))) => ws,
        };
        // A session whose subscription was sent but never confirmed may or
        // may not hold it, from an unknown position: start afresh.
        let unsure = self
            .subs
            .values()
            .any(|s| !s.confirmed && s.pending.is_some());
        let resume = match &self.session {
            Some(session) if self.s.resume && !unsure => Some(session.as_str()),
            _ => None,
        };
        let hello = wire::Command::Hello {
            token: token.as_deref(),
            resume,
            data: self.s.hello_data.as_deref(),
        };
        let asked = resume.is_some();
        if let Err(e) = ws.send(hello.encode(self.s.protocol)).await {
            return Err(retry(format!("sending hello: {e}"), false));
        }
        match timeout(self.s.connect_timeout, welcome(&mut ws, self.s.protocol)).await {
            Err(_) => Err(retry("no welcome in time".to_owned(), false)),
            Ok(Err(failed)) => Err(match failed {
                Failed::Retry(Error::Connect { reason, .. }) => retry(reason, false),
                other => other,
            }),
            Ok(Ok(mut welcome)) => {
                welcome.resumed &= asked;
                if asked && !welcome.resumed && welcome.reason.is_none() {
                    welcome.reason = Some("resumed: false".to_owned());
                }
                if !asked {
                    welcome.reason = None;
                }
                Ok((ws, welcome))
            }
        }
    }

    /// The upgrade request for `url`: offering `herald.v1.protobuf` in
    /// protobuf mode (JSON offers nothing, as before the subprotocols).
    fn upgrade_request(&self, url: &str) -> Result<Request, Error> {
        let bad = |reason: String| Error::Url {
            url: url.to_owned(),
            reason,
        };
        let mut request = url.into_client_request().map_err(|e| bad(e.to_string()))?;
        if self.s.protocol == Protocol::Protobuf {
            request.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_static(wire::PROTOBUF),
            );
        }
        Ok(request)
    }

    async fn tcp(&self, host: &str) -> std::io::Result<TcpStream> {
        let mut last = None;
        for addr in tokio::net::lookup_host(host).await? {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if let Some(ip) = self.s.local_ip
                && ip.is_ipv4() == addr.is_ipv4()
            {
                socket.bind((ip, 0).into())?;
            }
            match socket.connect(addr).await {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("the host has no address")))
    }
}

/// Reads until `welcome`: an `err` and the close that follow a refused
/// `hello` say whether to come back.
async fn welcome(ws: &mut Ws, protocol: Protocol) -> Result<Welcome, Failed> {
    let retry = |reason: String| {
        Failed::Retry(Error::Connect {
            url: String::new(),
            reason,
            refused: false,
        })
    };
    let mut err: Option<(ErrorCode, String)> = None;
    loop {
        let message = match ws.next().await {
            Some(Ok(message @ (WsMessage::Text(_) | WsMessage::Binary(_)))) => message,
            Some(Ok(WsMessage::Close(close))) => {
                let code = close.as_ref().map(|c| u16::from(c.code));
                let why = err
                    .as_ref()
                    .map(|(c, m)| format!("{c}: {m}"))
                    .unwrap_or_default();
                let _ = timeout(CLOSE_DRAIN, async { while ws.next().await.is_some() {} }).await;
                return Err(match code {
                    Some(4502) => Failed::Terminal(Error::Unauthorized(why)),
                    Some(code) if !reconnects_after(code) => {
                        Failed::Terminal(Error::Closed { code, reason: why })
                    }
                    _ => retry(format!("closed with {code:?} before welcome {why}")),
                });
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(retry(e.to_string())),
            None => return Err(retry("connection ended before welcome".to_owned())),
        };
        let incoming = Incoming::decode(protocol, message).map_err(|e| retry(e.to_string()))?;
        let frame = incoming.frame().map_err(|e| retry(e.to_string()))?;
        match frame.op.as_ref() {
            "welcome" => {
                let Some(session) = frame.session else {
                    return Err(retry("welcome without a session".to_owned()));
                };
                return Ok(Welcome {
                    session: session.into_owned(),
                    resumed: frame.resumed == Some(true),
                    ping_ms: frame.ping_ms.unwrap_or(25_000),
                    expires: frame.expires,
                    reason: frame.reason.as_deref().map(str::to_owned),
                });
            }
            "err" => {
                err = Some((
                    ErrorCode::parse(frame.code.as_deref().unwrap_or_default()),
                    frame.message.as_deref().unwrap_or_default().to_owned(),
                ));
            }
            // `reconnect` before `welcome`: a draining pod; its close follows.
            _ => {}
        }
    }
}
