//! A WebSocket client the project did not write (tokio-tungstenite), with
//! Herald's JSON protocol on top; every wait bounded by [`WAIT`].

use std::net::{IpAddr, SocketAddr};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{Gateway, WAIT};

/// A WebSocket client the project did not write.
pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    pub async fn connect(gateway: &Gateway) -> Self {
        Self::connect_url(&gateway.ws_url()).await
    }

    pub async fn connect_url(url: &str) -> Self {
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
            .await
            .expect("connect in time")
            .expect("connect");
        Self { ws }
    }

    /// A client at `url` (`ws://<ip:port>/…`) whose socket buffers only
    /// `bytes` of what the server sends: once it stops reading, the
    /// server's writes to it soon block.
    pub async fn with_receive_buffer(url: &str, bytes: u32) -> Self {
        let addr = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .and_then(|addr| addr.parse().ok())
            .expect("a ws://<ip:port>/ URL");
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let stream = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream)),
        )
        .await
        .expect("handshake in time")
        .expect("handshake");
        Self { ws }
    }

    /// A client at `url` (`ws://<ip:port>/…`) from the local address `from`
    /// (every address of 127.0.0.0/8 is this host's: a test can be many
    /// clients' addresses), with the extra request `headers`. A refusal
    /// before the upgrade is its HTTP status.
    pub async fn connect_from(
        url: &str,
        from: IpAddr,
        headers: &[(&str, &str)],
    ) -> Result<Self, u16> {
        let addr: SocketAddr = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .and_then(|addr| addr.parse().ok())
            .expect("a ws://<ip:port>/ URL");
        let socket = match from {
            IpAddr::V4(_) => TcpSocket::new_v4(),
            IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .expect("socket");
        socket
            .bind(SocketAddr::new(from, 0))
            .unwrap_or_else(|e| panic!("bind {from}: {e}"));
        let stream = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let mut request = url.into_client_request().expect("a request");
        for (name, value) in headers {
            request.headers_mut().insert(
                tungstenite::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                value.parse().expect("header value"),
            );
        }
        let handshake = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream)),
        )
        .await
        .expect("an answer in time");
        match handshake {
            Ok((ws, _)) => Ok(Self { ws }),
            Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
            Err(e) => panic!("connect failed without an HTTP answer: {e}"),
        }
    }

    /// A client at `url` with a session, subscribed to `topic`.
    pub async fn subscriber(url: &str, topic: &str) -> Self {
        let mut client = Self::connect_url(url).await;
        client.hello(None).await;
        client.sub(1, topic).await;
        client
    }

    pub async fn send(&mut self, value: Value) {
        self.ws
            .send(Message::text(value.to_string()))
            .await
            .expect("send");
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    /// The next JSON message (pings are answered by the library).
    pub async fn recv(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a message in time")
                .expect("connection open")
                .expect("a frame");
            match message {
                Message::Text(text) => return serde_json::from_str(&text).expect("JSON"),
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The next message, which must have `op`.
    pub async fn expect(&mut self, op: &str) -> Value {
        let message = self.recv().await;
        assert_eq!(message["op"], op, "expected `{op}`, got {message}");
        message
    }

    /// `hello` and its `welcome`.
    pub async fn hello(&mut self, resume: Option<&str>) -> Value {
        match resume {
            Some(session) => self.send(json!({"op": "hello", "resume": session})).await,
            None => self.send(json!({"op": "hello"})).await,
        }
        self.expect("welcome").await
    }

    /// `sub` and its `ok`.
    pub async fn sub(&mut self, id: u64, topic: &str) -> Value {
        self.send(json!({"op": "sub", "id": id, "topic": topic}))
            .await;
        let ok = self.expect("ok").await;
        assert_eq!(ok["id"], id);
        ok
    }

    /// The next `msg`: (topic, seq, data).
    pub async fn msg(&mut self) -> (String, u64, Value) {
        let m = self.expect("msg").await;
        (
            m["topic"].as_str().expect("topic").to_owned(),
            m["seq"].as_u64().expect("seq"),
            m["data"].clone(),
        )
    }

    /// Reads until the server closes; returns its close code.
    pub async fn closed(&mut self) -> Option<u16> {
        loop {
            let next = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("close in time");
            match next {
                Some(Ok(Message::Close(frame))) => {
                    return frame.map(|f: CloseFrame| u16::from(f.code));
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    }
}
