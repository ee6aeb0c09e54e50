//! Following a cluster's slot map.
//!
//! Every [`MAP_CHECK`], after a link drops and when a master unsubscribes a
//! topic by itself (its slot migrated away), the task reads the slot map
//! again; a topic whose slot has another master now moves to that master's
//! link: subscribed there, then read (a catch-up from where it stood, so
//! nothing published meanwhile is lost and nothing delivered twice), and
//! unsubscribed at the old one. A reset comes only where the cluster really
//! lost data (a failover to a replica that lagged: the slot's lineage
//! tells).

use std::collections::HashMap;
use std::time::Duration;

use super::Pubsub;
use super::flow::Flow;
use super::report::Done;
use crate::Topic;
use crate::redis::call::failed;

/// How often a cluster's slot map is read again, besides when something
/// says it changed.
pub(super) const MAP_CHECK: Duration = Duration::from_secs(1);

impl Pubsub {
    /// Asks for the cluster's map to be read again (soon, once).
    pub(super) fn want_map(&mut self) {
        if self.shards.is_cluster() {
            self.map_wanted = true;
            self.read_map();
        }
    }

    /// Reads the cluster's map in the background (a [`Done::Mapped`]
    /// follows), unless a read is under way.
    pub(super) fn read_map(&mut self) {
        if self.mapping || !self.shards.is_cluster() {
            return;
        }
        self.mapping = true;
        self.map_wanted = false;
        let shards = self.shards.clone();
        let done = self.done.clone();
        tokio::spawn(async move {
            let result = shards
                .refresh()
                .await
                .map_err(|e| failed("cluster slots", e));
            let _ = done.send(Done::Mapped(result));
        });
    }

    /// The map was read: every topic (and the control channel) whose slot
    /// has another master now moves to that master's link.
    pub(super) fn mapped(&mut self) {
        // A link to every master, before any topic needs it.
        for master in &self.shards.map().masters {
            if !self.links.iter().any(|l| l.address == *master) {
                self.add_link(master.clone());
            }
        }
        let control = self.control_channel.clone();
        if let Some(link) = self.link_for(&control)
            && Some(link) != self.control
        {
            let old = self.control.replace(link);
            tracing::info!(node = %self.links[link].address, "the control channel moves");
            if let Some(old) = old {
                self.unsubscribe_channels(old, vec![control.clone()]);
            }
            if self.is_up(link) {
                self.subscribe(link, Vec::new(), Some(control));
            }
        }
        let topics: Vec<Topic> = self.topics.keys().cloned().collect();
        let mut moved: HashMap<usize, Vec<Topic>> = HashMap::new();
        for topic in topics {
            let Some(link) = self.link_for(&self.keys.channel(&topic)) else {
                continue;
            };
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            if watched.link == link
                || matches!(watched.flow, Flow::Starting { .. } | Flow::Leaving { .. })
            {
                continue;
            }
            let old = std::mem::replace(&mut watched.link, link);
            tracing::info!(%topic, node = %self.links[link].address, "a topic moves to its slot's new master");
            moved.entry(old).or_default().push(topic.clone());
            self.drop_pending(&topic, "its slot moved");
        }
        for (old, topics) in moved {
            let channels = topics.iter().map(|t| self.keys.channel(t)).collect();
            self.unsubscribe_channels(old, channels);
        }
        self.resubscribe_waiting();
    }
}
