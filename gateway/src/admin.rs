//! `GET /v1/admin/status`: what a pod holds and how its broker stands, read
//! only, on the API listener with the API keys; and its plain-text form,
//! which `herald status` prints.

use serde::{Deserialize, Serialize};

use crate::node::Node;

/// The status of one pod, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The binary's version.
    pub version: String,
    /// The pod's name (`HERALD_POD_NAME`, `POD_NAME`, or host and suffix).
    pub pod: String,
    /// Whether `/readyz` answers 200.
    pub ready: bool,
    /// Why not, when it is not (draining, or Redis not reached yet).
    pub not_ready: Option<String>,
    pub draining: bool,
    /// Open WebSocket connections.
    pub connections: i64,
    /// Sessions served by those connections.
    pub sessions: usize,
    /// Topics with a subscriber on this pod.
    pub topics: i64,
    /// Subscriptions of this pod's connections.
    pub subscriptions: i64,
    pub broker: BrokerState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerState {
    /// `memory` or `redis`.
    pub kind: String,
    /// Whether the pub/sub connection is up now (always, in memory).
    pub connected: bool,
    /// Announcements held aside while topics' history is read.
    pub pubsub_backlog: i64,
    /// The highest lineage clock this pod has seen (Redis).
    pub lineage_clock: Option<u64>,
}

impl Status {
    pub fn of(node: &Node) -> Self {
        let broker = node.broker.status();
        let draining = node.is_draining();
        let not_ready = if draining {
            Some("draining".to_owned())
        } else {
            broker.not_ready
        };
        let metrics = &node.metrics;
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pod: node.pod_name.to_string(),
            ready: not_ready.is_none(),
            not_ready,
            draining,
            connections: metrics.connections.get(),
            sessions: node.live.len(),
            topics: metrics.topics.get(),
            subscriptions: metrics.subscriptions.get(),
            broker: BrokerState {
                kind: broker.kind.to_owned(),
                connected: broker.connected,
                pubsub_backlog: metrics.pubsub_backlog(),
                lineage_clock: broker.lineage_clock,
            },
        }
    }

    /// For a person: a few aligned lines.
    pub fn render(&self) -> String {
        let state = match &self.not_ready {
            None => "ready".to_owned(),
            Some(why) => format!("not ready: {why}"),
        };
        let broker = &self.broker;
        let mut link = if broker.connected {
            "connected".to_owned()
        } else {
            "disconnected".to_owned()
        };
        if broker.kind == "redis" {
            link.push_str(&format!(", pub/sub backlog {}", broker.pubsub_backlog));
        }
        if let Some(clock) = broker.lineage_clock {
            link.push_str(&format!(", lineage clock {clock}"));
        }
        format!(
            "pod            {pod} (herald {version})\n\
             state          {state}\n\
             connections    {connections}\n\
             sessions       {sessions}\n\
             topics         {topics}\n\
             subscriptions  {subscriptions}\n\
             broker         {kind}: {link}\n",
            pod = self.pod,
            version = self.version,
            connections = self.connections,
            sessions = self.sessions,
            topics = self.topics,
            subscriptions = self.subscriptions,
            kind = broker.kind,
        )
    }
}
