//! Who may do what with a topic: the namespace's rule, applied to the
//! client's claims.

use router::{NamespaceSettings, Publish, Subscribe, Topic};

use crate::auth::Claims;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Subscribe,
    Publish,
}

impl Access {
    pub fn verb(self) -> &'static str {
        match self {
            Access::Subscribe => "subscribe to",
            Access::Publish => "publish to",
        }
    }

    /// Whether a client with `claims` (`None`: anonymous) may do this to
    /// `topic`. In `open` mode (no key configured) every client counts as
    /// authenticated: there is nothing to authenticate against, and config
    /// validation refuses namespaces that need grants.
    pub fn allows(
        self,
        ns: &NamespaceSettings,
        topic: &Topic,
        claims: Option<&Claims>,
        open: bool,
    ) -> bool {
        let authenticated = open || claims.is_some();
        match self {
            // A personal topic is its user's alone, whatever the grants.
            Access::Subscribe if ns.personal => claims.is_some_and(|c| *c.user == *name(topic)),
            Access::Subscribe => match ns.subscribe {
                Subscribe::Anyone => true,
                Subscribe::Authenticated => authenticated,
                Subscribe::Granted => claims.is_some_and(|c| c.subscribe.allows(topic.as_str())),
            },
            // And only its user may publish to it, where the namespace lets
            // clients publish at all.
            Access::Publish if ns.personal && claims.is_none_or(|c| *c.user != *name(topic)) => {
                false
            }
            Access::Publish => match ns.publish {
                Publish::Nobody => false,
                Publish::Authenticated => authenticated,
                Publish::Granted => claims.is_some_and(|c| c.publish.allows(topic.as_str())),
            },
        }
    }
}

impl Access {
    /// What is left of the rule where the application's backend decides (a
    /// subscribe or publish proxy): a personal topic is its user's alone.
    pub fn personal_allows(ns: &NamespaceSettings, topic: &Topic, claims: Option<&Claims>) -> bool {
        !ns.personal || claims.is_some_and(|c| *c.user == *name(topic))
    }
}

/// The topic's name within its namespace: `user:alice` -> `alice`.
fn name(topic: &Topic) -> &str {
    let full = topic.as_str();
    full.split_once(':').map_or(full, |(_, name)| name)
}
