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
    /// Whether WebSocket clients may `pub` (backends always may, over HTTP).
    pub client_publish: bool,
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        Self {
            history_size: DEFAULT_HISTORY_SIZE,
            history_ttl: DEFAULT_HISTORY_TTL,
            client_publish: false,
        }
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
