//! Per-namespace settings.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

use crate::BrokerError;
use crate::topic::{Topic, is_namespace};

/// How many messages a topic keeps for replay, unless its namespace says otherwise.
pub const DEFAULT_HISTORY_SIZE: usize = 100;
/// How long a topic keeps a message for replay, unless its namespace says otherwise.
pub const DEFAULT_HISTORY_TTL: Duration = Duration::from_secs(300);
/// The key under `[namespaces]` that configures topics without a `:`.
pub const DEFAULT_NAMESPACE_KEY: &str = "default";

/// One namespace's settings, as configured under `[namespaces.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceSettings {
    /// Messages kept per topic for replay; 0 keeps none.
    pub history_size: usize,
    /// Age after which a message is no longer replayed.
    #[serde(with = "humantime_serde")]
    pub history_ttl: Duration,
    /// Which WebSocket clients may subscribe.
    pub subscribe: Subscribe,
    /// Which WebSocket clients may `pub` (backends always may, over the API).
    pub publish: Publish,
    /// Topic `<namespace>:<id>` belongs to the user whose token says
    /// `sub: <id>`: nobody else may subscribe to it, whatever their grants.
    pub personal: bool,
    /// The topics keep presence: who is subscribed, queryable.
    pub presence: bool,
    /// Subscribers are sent `presence_diff`s (joins and leaves, coalesced);
    /// only with `presence`.
    pub join_leave: bool,
    /// Above this many members, diffs carry counts only; 0: never.
    pub presence_counts_only_above: u64,
    /// Each client `sub` is approved by the backend's subscribe proxy
    /// (`[proxy.subscribe]`), instead of the `subscribe` rule.
    pub subscribe_proxy: bool,
    /// Each client `pub` goes through the backend's publish proxy
    /// (`[proxy.publish]`), instead of the `publish` rule.
    pub publish_proxy: bool,
    /// What a subscriber whose outgoing queue has no room for one of the
    /// topics' messages gets: `None` for the default, [`Self::on_lag`].
    pub on_lag: Option<OnLag>,
    /// State topics: a client's `sub` may ask for deltas (`"delta": true`),
    /// and is then sent each publication as a Fossil delta against the one
    /// before where that is shorter (docs/protocol.md#deltas).
    pub delta: bool,
}

/// What happens to a subscriber too slow for a namespace's topics: its
/// outgoing queue has no room for the next message (issue #25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLag {
    /// The topic's messages stop going to it; it is caught up from history
    /// at its own pace, then put back on the live stream (or sent `reset`
    /// where history no longer reaches back far enough). Needs history.
    CatchUp,
    /// Closed with 4000 (slow consumer); it resumes from its acks.
    Disconnect,
    /// The message is dropped for it, and counted.
    DropNewest,
}

impl OnLag {
    /// As metrics and logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CatchUp => "catch_up",
            Self::Disconnect => "disconnect",
            Self::DropNewest => "drop_newest",
        }
    }
}

/// Who may subscribe to a namespace's topics from a WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subscribe {
    /// Any client, anonymous ones included.
    Anyone,
    /// Any client with a valid token (with no keys configured: any client).
    Authenticated,
    /// A client whose token's `subscribe` list matches the topic.
    Granted,
}

/// Who may publish to a namespace's topics from a WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Publish {
    /// Only backends, over the publish API.
    Nobody,
    /// Any client with a valid token (with no keys configured: any client).
    Authenticated,
    /// A client whose token's `publish` list matches the topic.
    Granted,
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        Self {
            history_size: DEFAULT_HISTORY_SIZE,
            history_ttl: DEFAULT_HISTORY_TTL,
            subscribe: Subscribe::Authenticated,
            publish: Publish::Nobody,
            personal: false,
            presence: false,
            join_leave: false,
            presence_counts_only_above: 0,
            subscribe_proxy: false,
            publish_proxy: false,
            on_lag: None,
            delta: false,
        }
    }
}

impl NamespaceSettings {
    /// The lag policy configured, else `catch_up` where the namespace keeps
    /// history; `None`: neither, the connection's `queue.overflow` decides,
    /// as it did before namespaces had a say.
    pub fn on_lag(&self) -> Option<OnLag> {
        self.on_lag
            .or((self.history_size > 0).then_some(OnLag::CatchUp))
    }
}

/// The configured namespaces. A topic whose namespace is not configured is
/// refused, so that a typo does not silently create a new namespace.
#[derive(Debug, Clone)]
pub struct Namespaces {
    by_name: HashMap<String, NamespaceSettings>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("namespace `{0}` is not a valid namespace name (1 to 32 of a-z 0-9 _ -)")]
pub struct BadNamespaceName(pub String);

impl Namespaces {
    /// Builds the table from `[namespaces]`; `default` configures topics
    /// without a `:`, and is added with default settings when absent.
    pub fn new(configured: &BTreeMap<String, NamespaceSettings>) -> Result<Self, BadNamespaceName> {
        let mut by_name = HashMap::new();
        by_name.insert(String::new(), NamespaceSettings::default());
        for (name, settings) in configured {
            if !is_namespace(name) {
                return Err(BadNamespaceName(name.clone()));
            }
            let key = if name == DEFAULT_NAMESPACE_KEY {
                ""
            } else {
                name
            };
            by_name.insert(key.to_owned(), settings.clone());
        }
        Ok(Self { by_name })
    }

    /// The settings for `topic`, or `None` when its namespace is not configured.
    pub fn get(&self, topic: &Topic) -> Option<&NamespaceSettings> {
        self.by_name.get(topic.namespace())
    }

    /// Every configured namespace by name (`""` for the default one).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &NamespaceSettings)> {
        self.by_name.iter().map(|(name, ns)| (name.as_str(), ns))
    }

    /// The settings for `topic`, or the engines' error for a topic outside
    /// every configured namespace.
    pub fn require(&self, topic: &Topic) -> Result<&NamespaceSettings, BrokerError> {
        self.get(topic)
            .ok_or_else(|| BrokerError::UnknownNamespace(topic.to_string()))
    }
}

impl Default for Namespaces {
    fn default() -> Self {
        Self {
            by_name: HashMap::from([(String::new(), NamespaceSettings::default())]),
        }
    }
}
