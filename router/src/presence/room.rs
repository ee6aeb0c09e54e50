//! A topic's presence as one pod sees it: every pod instance's part, merged.
//!
//! Pure data, no I/O: the memory engine keeps one per topic, the Redis
//! engine one per watched topic (its replica of the Redis hash). Applying a
//! pod's new part yields the room's joins and leaves; counts are O(1); pages
//! are ordered by user id.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use super::{Member, PresenceUpdate};

/// One pod instance's part of a topic's presence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMembers {
    /// User -> (connections on this pod, > 0; info).
    members: HashMap<Arc<str>, (u32, Option<Bytes>)>,
    anonymous: u32,
}

impl PodMembers {
    /// Sets a user's connection count and info; 0 connections removes them.
    pub fn insert(&mut self, user: Arc<str>, connections: u32, info: Option<Bytes>) {
        if connections == 0 {
            self.members.remove(&user);
        } else {
            self.members.insert(user, (connections, info));
        }
    }

    pub fn remove(&mut self, user: &str) {
        self.members.remove(user);
    }

    pub fn set_anonymous(&mut self, anonymous: u32) {
        self.anonymous = anonymous;
    }

    /// Applies a pod's [`PresenceUpdate`] (removals first, then the sets).
    pub fn apply(&mut self, update: &PresenceUpdate) {
        for user in &update.removed {
            self.members.remove(user);
        }
        for (member, connections) in &update.set {
            self.insert(member.user.clone(), *connections, member.info.clone());
        }
        self.anonymous = update.anonymous;
    }

    pub fn anonymous(&self) -> u32 {
        self.anonymous
    }

    /// The users with their connection count and info, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, u32, Option<&Bytes>)> {
        self.members
            .iter()
            .map(|(user, (connections, info))| (user, *connections, info.as_ref()))
    }

    pub fn contains(&self, user: &str) -> bool {
        self.members.contains_key(user)
    }

    /// How many users this part holds.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// No user and no anonymous connection: the pod is not in the room.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.anonymous == 0
    }

    /// This part's connections, anonymous ones included.
    pub fn connections(&self) -> u64 {
        self.members
            .values()
            .map(|(c, _)| u64::from(*c))
            .sum::<u64>()
            + u64::from(self.anonymous)
    }
}

/// Who came and went in one step, each sorted by user id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub joins: Vec<Member>,
    pub leaves: Vec<Arc<str>>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.joins.is_empty() && self.leaves.is_empty()
    }
}

/// Every pod instance's part of one topic's presence, merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Room {
    /// Instance id -> its part; only non-empty parts are kept.
    pods: BTreeMap<Arc<str>, PodMembers>,
    /// Member -> how many instances hold them (> 0), by user id.
    users: BTreeMap<Arc<str>, u32>,
    /// Every part's connections, summed.
    connections: u64,
}

impl Room {
    pub fn new() -> Self {
        Self::default()
    }

    /// Members: users counted once however many connections and pods.
    pub fn users(&self) -> u64 {
        self.users.len() as u64
    }

    /// Connections of every pod, anonymous ones included.
    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// No pod has anything in the room.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// One instance's part, if it has one.
    pub fn pod(&self, instance: &str) -> Option<&PodMembers> {
        self.pods.get(instance)
    }

    /// The instances with a part, by id.
    pub fn instances(&self) -> impl Iterator<Item = &Arc<str>> {
        self.pods.keys()
    }

    /// Whether `user` is a member.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// A member's info: that of the first instance (by id) holding them, so
    /// that every replica of the same parts agrees.
    pub fn info(&self, user: &str) -> Option<Bytes> {
        self.pods
            .values()
            .find_map(|part| part.members.get(user))
            .and_then(|(_, info)| info.clone())
    }

    /// Up to `limit` members after `after` (bytewise by user id), and
    /// whether more follow.
    pub fn page(&self, after: Option<&str>, limit: usize) -> (Vec<Member>, bool) {
        let from = match after {
            Some(after) => Bound::Excluded(after),
            None => Bound::Unbounded,
        };
        let mut range = self.users.range::<str, _>((from, Bound::Unbounded));
        let members = range
            .by_ref()
            .take(limit)
            .map(|(user, _)| self.member(user))
            .collect();
        (members, range.next().is_some())
    }

    /// Replaces an instance's whole part (an empty one removes it).
    pub fn replace(&mut self, instance: &str, part: PodMembers) -> Delta {
        let old = self.pods.remove(instance).unwrap_or_default();
        let mut touched: HashMap<Arc<str>, bool> = HashMap::new();
        for user in old.members.keys() {
            touched.insert(user.clone(), true);
        }
        for user in part.members.keys() {
            touched.entry(user.clone()).or_insert(false);
        }
        self.settle(instance, old.connections(), part, touched)
    }

    /// Applies an instance's changes ([`PresenceUpdate`]): O(changes).
    pub fn update(&mut self, instance: &str, update: &PresenceUpdate) -> Delta {
        let mut part = self.pods.remove(instance).unwrap_or_default();
        let before = part.connections();
        let mut touched: HashMap<Arc<str>, bool> = HashMap::new();
        let users = update
            .removed
            .iter()
            .chain(update.set.iter().map(|(m, _)| &m.user));
        for user in users {
            if !touched.contains_key(user) {
                touched.insert(user.clone(), part.contains(user));
            }
        }
        part.apply(update);
        self.settle(instance, before, part, touched)
    }

    /// Removes an instance's part (a dead pod's, or one Redis lost).
    pub fn remove(&mut self, instance: &str) -> Delta {
        self.replace(instance, PodMembers::default())
    }

    /// Who came and went from `self` to `newer`: what a replica that
    /// skipped changes hands on as one.
    pub fn diff(&self, newer: &Room) -> Delta {
        let leaves = self
            .users
            .keys()
            .filter(|user| !newer.users.contains_key(*user))
            .cloned()
            .collect();
        let joins = newer
            .users
            .keys()
            .filter(|user| !self.users.contains_key(*user))
            .map(|user| newer.member(user))
            .collect();
        Delta { joins, leaves }
    }

    fn member(&self, user: &Arc<str>) -> Member {
        Member {
            user: user.clone(),
            info: self.info(user),
        }
    }

    /// Puts `part` in as `instance`'s, given each touched user's presence in
    /// the instance's part before (`true`: was in it), and the part's
    /// connections before.
    fn settle(
        &mut self,
        instance: &str,
        before: u64,
        part: PodMembers,
        touched: HashMap<Arc<str>, bool>,
    ) -> Delta {
        self.connections = self.connections.saturating_sub(before) + part.connections();
        let mut delta = Delta::default();
        let mut joined = Vec::new();
        for (user, was) in touched {
            match (was, part.contains(&user)) {
                (true, false) => {
                    let left = match self.users.get_mut(&user) {
                        Some(holders) if *holders > 1 => {
                            *holders -= 1;
                            false
                        }
                        _ => true,
                    };
                    if left {
                        self.users.remove(&user);
                        delta.leaves.push(user);
                    }
                }
                (false, true) => {
                    let holders = self.users.entry(user.clone()).or_insert(0);
                    *holders += 1;
                    if *holders == 1 {
                        joined.push(user);
                    }
                }
                _ => {}
            }
        }
        if !part.is_empty() {
            self.pods.insert(Arc::from(instance), part);
        }
        joined.sort_unstable();
        delta.leaves.sort_unstable();
        delta.joins = joined.iter().map(|user| self.member(user)).collect();
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(user: &str, info: Option<&'static str>) -> Member {
        Member {
            user: Arc::from(user),
            info: info.map(|i| Bytes::from_static(i.as_bytes())),
        }
    }

    fn set(users: &[(&str, u32)], anonymous: u32) -> PresenceUpdate {
        PresenceUpdate {
            set: users.iter().map(|(u, c)| (member(u, None), *c)).collect(),
            removed: Vec::new(),
            anonymous,
        }
    }

    fn removed(users: &[&str], anonymous: u32) -> PresenceUpdate {
        PresenceUpdate {
            set: Vec::new(),
            removed: users.iter().map(|u| Arc::from(*u)).collect(),
            anonymous,
        }
    }

    fn names(delta: &Delta) -> (Vec<&str>, Vec<&str>) {
        (
            delta.joins.iter().map(|m| &*m.user).collect(),
            delta.leaves.iter().map(|u| &**u).collect(),
        )
    }

    #[test]
    fn a_user_on_two_pods_joins_once_and_leaves_once() {
        let mut room = Room::new();
        let d = room.update("a", &set(&[("alice", 2), ("bob", 1)], 1));
        assert_eq!(names(&d), (vec!["alice", "bob"], vec![]));
        let d = room.update("b", &set(&[("alice", 1)], 0));
        assert!(d.is_empty());
        assert_eq!((room.users(), room.connections()), (2, 5));
        let d = room.update("a", &removed(&["alice"], 1));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!((room.users(), room.connections()), (2, 3));
        let d = room.update("b", &removed(&["alice"], 0));
        assert_eq!(names(&d), (vec![], vec!["alice"]));
        assert_eq!((room.users(), room.connections()), (1, 2));
        let d = room.remove("a");
        assert_eq!(names(&d), (vec![], vec!["bob"]));
        assert!(room.is_empty());
        assert_eq!((room.users(), room.connections()), (0, 0));
    }

    #[test]
    fn a_user_removed_and_set_in_one_update_neither_joins_nor_leaves() {
        let mut room = Room::new();
        room.update("a", &set(&[("alice", 1)], 0));
        let mut update = removed(&["alice"], 0);
        update.set.push((member("alice", None), 3));
        let d = room.update("a", &update);
        assert!(d.is_empty());
        assert_eq!(room.connections(), 3);
        // A zero count is a removal.
        let d = room.update("a", &set(&[("alice", 0)], 0));
        assert_eq!(names(&d), (vec![], vec!["alice"]));
        assert!(room.is_empty());
    }

    #[test]
    fn replacing_a_part_yields_the_difference() {
        let mut room = Room::new();
        room.update("a", &set(&[("alice", 1), ("bob", 1)], 0));
        room.update("b", &set(&[("bob", 1)], 2));
        let mut part = PodMembers::default();
        part.insert(Arc::from("carol"), 1, Some(Bytes::from_static(b"{}")));
        part.insert(Arc::from("bob"), 4, None);
        let d = room.replace("a", part);
        assert_eq!(names(&d), (vec!["carol"], vec!["alice"]));
        assert_eq!(d.joins[0].info.as_deref(), Some(&b"{}"[..]));
        assert_eq!((room.users(), room.connections()), (2, 8));
        // The dead pod's part goes: bob stays through pod a.
        let d = room.remove("b");
        assert!(d.is_empty());
        assert_eq!((room.users(), room.connections()), (2, 5));
    }

    #[test]
    fn info_is_the_first_instances_whatever_the_order_of_updates() {
        let mut one = Room::new();
        let mut two = Room::new();
        let a = PresenceUpdate {
            set: vec![(member("alice", Some("{\"n\":1}")), 1)],
            ..PresenceUpdate::default()
        };
        let b = PresenceUpdate {
            set: vec![(member("alice", Some("{\"n\":2}")), 1)],
            ..PresenceUpdate::default()
        };
        one.update("a", &a);
        one.update("b", &b);
        two.update("b", &b);
        two.update("a", &a);
        assert_eq!(one, two);
        assert_eq!(one.info("alice").as_deref(), Some(&b"{\"n\":1}"[..]));
        one.remove("a");
        assert_eq!(one.info("alice").as_deref(), Some(&b"{\"n\":2}"[..]));
    }

    #[test]
    fn pages_run_by_user_id_after_the_cursor() {
        let mut room = Room::new();
        let users: Vec<String> = (0..25).map(|i| format!("u{i:02}")).collect();
        let pairs: Vec<(&str, u32)> = users.iter().map(|u| (u.as_str(), 1)).collect();
        room.update("a", &set(&pairs, 0));
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (members, more) = room.page(after.as_deref(), 10);
            seen.extend(members.iter().map(|m| m.user.to_string()));
            after = members.last().map(|m| m.user.to_string());
            if !more {
                break;
            }
        }
        assert_eq!(seen, users);
        // A cursor between ids, or past the end.
        let (members, more) = room.page(Some("u05x"), 2);
        let got: Vec<&str> = members.iter().map(|m| &*m.user).collect();
        assert_eq!((got, more), (vec!["u06", "u07"], true));
        assert_eq!(room.page(Some("v"), 10), (vec![], false));
        assert!(room.page(None, 0).1);
    }

    #[test]
    fn the_difference_of_two_rooms() {
        let mut old = Room::new();
        old.update("a", &set(&[("alice", 1), ("bob", 1)], 0));
        let mut new = Room::new();
        new.update("a", &set(&[("bob", 1), ("carol", 2)], 0));
        assert_eq!(names(&old.diff(&new)), (vec!["carol"], vec!["alice"]));
        assert!(new.diff(&new).is_empty());
    }
}
