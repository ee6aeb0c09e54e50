//! A gateway in the test's own process, serving HTTP and gRPC on listeners
//! bound to port 0 (the address is read back, never guessed), through the
//! same `gateway::serve` the binary calls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gateway::{Config, Node};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::http;

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
        let (status, body) = http::http(
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
        http::metric(self.addr, name).await
    }

    /// [`http::await_metric`] of this gateway.
    pub async fn await_metric(&self, name: &str, want: f64) {
        http::await_metric(self.addr, name, want).await
    }
}
