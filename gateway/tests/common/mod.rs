//! Shared test helpers: a gateway on port 0 in this process (HTTP and gRPC),
//! an independent WebSocket client (tokio-tungstenite), and a small HTTP
//! client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway::{Config, Node};
use proto::v1::publisher_client::PublisherClient;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tonic::transport::{Channel, Endpoint};

/// Longest any single expected event may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// A gateway serving on a loopback port in this process.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The gRPC publish API.
    pub grpc_addr: SocketAddr,
    pub node: Arc<Node>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Gateway {
    /// Defaults, plus a `chat` namespace where clients may publish.
    pub fn config() -> Config {
        let mut config = Config::default();
        // Test clients answer a close only when they next read.
        config.websocket.close_timeout = Duration::from_millis(200);
        config.namespaces.insert(
            "chat".to_owned(),
            router::NamespaceSettings {
                publish: router::Publish::Authenticated,
                ..Default::default()
            },
        );
        config
    }

    pub async fn start() -> Self {
        Self::with(Self::config()).await
    }

    pub async fn with(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind gRPC");
        let grpc_addr = grpc.local_addr().expect("gRPC addr");
        let listeners = gateway::Listeners {
            http: listener,
            api: None,
            grpc: Some(grpc),
        };
        let node = Node::start(config).await.expect("node");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(gateway::serve(node.clone(), listeners, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            grpc_addr,
            node,
            stop: Some(stop),
            task,
        }
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// Starts the drain and waits until the gateway has stopped.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("gateway stops")
            .expect("gateway task");
    }

    /// Publishes over HTTP; returns the seq.
    pub async fn publish(&self, topic: &str, data: Value) -> u64 {
        let (status, body) = http(
            self.addr,
            "POST",
            "/v1/publish",
            &[],
            json!({"topic": topic, "data": data}).to_string().as_bytes(),
        )
        .await;
        assert_eq!(status, 200, "publish: {body}");
        let answer: Value = serde_json::from_str(&body).expect("json answer");
        answer["seq"].as_u64().expect("seq")
    }

    /// A metric's value from /metrics (first sample whose line starts with `name`).
    pub async fn metric(&self, name: &str) -> f64 {
        metric(self.addr, name).await
    }
}

/// A metric's value from the `/metrics` of the gateway at `addr` (its first
/// sample whose line starts with `name`).
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics", &[], b"").await;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} in:\n{body}"))
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let (status, _, body) = http_with_headers(addr, method, path, headers, body).await;
    (status, body)
}

/// One HTTP/1.1 request over a fresh connection: (status, headers, body).
pub async fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::{BodyExt, Full};
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::copy_from_slice(body)))
        .expect("request");
    let response = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(WAIT, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// A client of the gRPC publish API at `addr`; every call is bounded by
/// [`WAIT`].
pub async fn grpc_client(addr: SocketAddr) -> PublisherClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect_timeout(WAIT)
        .timeout(WAIT)
        .connect()
        .await
        .expect("connect over gRPC");
    PublisherClient::new(channel)
}

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
