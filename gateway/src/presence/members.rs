//! This pod's members of each presence topic: per topic, each user's
//! connections here (and their `info`), and the anonymous connections;
//! what changed since the broker last heard, to hand it one
//! [`PresenceUpdate`] per topic and interval.
//!
//! Memberships are per connection. A connection that ended abnormally
//! *lingers*: its memberships stay (the user stays a member) until its
//! session's resume window ends or the session is resumed, so that a client
//! that comes back in time is never seen to leave and join again. A resume
//! on this pod enters the new connection first, then lets the lingering one
//! go: the user's count never reaches 0 between them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use router::Topic;
use tokio::time::Instant;

use crate::admission::ConnId;
use router::{Member, PresenceUpdate};

/// Who a connection is, for presence: a user (with its token's `info`), or
/// anonymous (counted in `connections` only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub user: Option<Arc<str>>,
    pub info: Option<Bytes>,
}

#[derive(Default)]
pub struct Members {
    rooms: HashMap<Topic, Room>,
    /// The presence topics of each connection.
    by_conn: HashMap<ConnId, HashSet<Topic>>,
    /// Connections that ended abnormally, kept until their deadline or
    /// their session's resume.
    lingering: HashMap<ConnId, Lingering>,
    /// The lingering connections of each session: every pod is told of
    /// every resume, thousands at once in a rolling restart, and each must
    /// find its own without a scan.
    by_session: HashMap<Arc<str>, Vec<ConnId>>,
}

struct Lingering {
    session: Arc<str>,
    until: Instant,
}

#[derive(Default)]
struct Room {
    users: HashMap<Arc<str>, Local>,
    anonymous: u32,
    /// Each connection's user (`None`: anonymous).
    conns: HashMap<ConnId, Option<Arc<str>>>,
    /// Users whose count changed since the last update was taken.
    changed: HashSet<Arc<str>>,
    anonymous_changed: bool,
}

struct Local {
    connections: u32,
    info: Option<Bytes>,
}

impl Room {
    fn is_idle(&self) -> bool {
        self.conns.is_empty() && self.changed.is_empty() && !self.anonymous_changed
    }
}

impl Members {
    /// `conn` subscribed to `topic`. Returns whether that made `who` a new
    /// member here (its first connection on this pod).
    pub fn enter(&mut self, topic: &Topic, conn: ConnId, who: &Who) -> bool {
        let room = self.rooms.entry(topic.clone()).or_default();
        if room.conns.contains_key(&conn) {
            return false;
        }
        room.conns.insert(conn, who.user.clone());
        self.by_conn.entry(conn).or_default().insert(topic.clone());
        let Some(user) = &who.user else {
            room.anonymous += 1;
            room.anonymous_changed = true;
            return false;
        };
        room.changed.insert(user.clone());
        let local = room.users.entry(user.clone()).or_insert(Local {
            connections: 0,
            info: None,
        });
        local.connections += 1;
        // The newest token's says who the user is now.
        local.info = who.info.clone();
        local.connections == 1
    }

    /// `conn`'s token was refreshed: its user's `info` in each of its
    /// topics is the new token's (and goes to the broker with the next
    /// update where it changed).
    pub fn refresh(&mut self, conn: ConnId, info: Option<&Bytes>) {
        let Some(topics) = self.by_conn.get(&conn) else {
            return;
        };
        for topic in topics {
            let Some(room) = self.rooms.get_mut(topic) else {
                continue;
            };
            let Some(Some(user)) = room.conns.get(&conn) else {
                continue;
            };
            if let Some(local) = room.users.get_mut(user)
                && local.info.as_ref() != info
            {
                local.info = info.cloned();
                room.changed.insert(user.clone());
            }
        }
    }

    /// `conn` left `topic` (unsubscribed, or closed for good). A lingering
    /// connection stays until [`Self::expire`] or [`Self::resumed`].
    /// Returns whether its user left this pod's members of the topic.
    pub fn exit(&mut self, topic: &Topic, conn: ConnId) -> bool {
        if self.lingering.contains_key(&conn) {
            return false;
        }
        self.remove(topic, conn)
    }

    fn remove(&mut self, topic: &Topic, conn: ConnId) -> bool {
        let Some(room) = self.rooms.get_mut(topic) else {
            return false;
        };
        let Some(user) = room.conns.remove(&conn) else {
            return false;
        };
        if let Some(topics) = self.by_conn.get_mut(&conn) {
            topics.remove(topic);
            if topics.is_empty() {
                self.by_conn.remove(&conn);
                unlinger(&mut self.lingering, &mut self.by_session, conn);
            }
        }
        let Some(user) = user else {
            room.anonymous = room.anonymous.saturating_sub(1);
            room.anonymous_changed = true;
            return false;
        };
        room.changed.insert(user.clone());
        match room.users.get_mut(&user) {
            Some(local) if local.connections > 1 => {
                local.connections -= 1;
                false
            }
            Some(_) => {
                room.users.remove(&user);
                true
            }
            None => false,
        }
    }

    /// `conn` ended without a close from the client: its memberships stay
    /// until `until` (the end of `session`'s resume window) or the session
    /// is resumed. False when it held none.
    pub fn linger(&mut self, conn: ConnId, session: Arc<str>, until: Instant) -> bool {
        if !self.by_conn.contains_key(&conn) {
            return false;
        }
        let conns = self.by_session.entry(session.clone()).or_default();
        if !conns.contains(&conn) {
            conns.push(conn);
        }
        self.lingering.insert(conn, Lingering { session, until });
        true
    }

    /// `session` was resumed (by a connection that has entered its topics
    /// already): its lingering connections go, without their users leaving
    /// where the new connection holds them.
    pub fn resumed(&mut self, session: &str) {
        for conn in self.by_session.remove(session).unwrap_or_default() {
            self.drop_conn(conn);
        }
    }

    /// `session` was resumed on another pod: its lingering connections go
    /// by `until` (once that pod has written the new connection's
    /// memberships: then its users never leave).
    pub fn resumed_elsewhere(&mut self, session: &str, until: Instant) {
        for conn in self.by_session.get(session).into_iter().flatten() {
            if let Some(lingering) = self.lingering.get_mut(conn) {
                lingering.until = lingering.until.min(until);
            }
        }
    }

    /// A backend ended `user`'s access: its lingering connections go at
    /// once (its live ones are closed, and exit as they end).
    pub fn revoke(&mut self, user: &str) {
        let conns: Vec<ConnId> = self
            .lingering
            .keys()
            .copied()
            .filter(|conn| {
                self.by_conn.get(conn).is_some_and(|topics| {
                    topics.iter().any(|topic| {
                        self.rooms
                            .get(topic)
                            .and_then(|room| room.conns.get(conn))
                            .is_some_and(|who| who.as_deref() == Some(user))
                    })
                })
            })
            .collect();
        for conn in conns {
            self.drop_conn(conn);
        }
    }

    /// Lets go of the connections that lingered past their deadline.
    pub fn expire(&mut self, now: Instant) -> usize {
        let conns: Vec<ConnId> = self
            .lingering
            .iter()
            .filter(|(_, l)| l.until <= now)
            .map(|(conn, _)| *conn)
            .collect();
        for &conn in &conns {
            self.drop_conn(conn);
        }
        conns.len()
    }

    fn drop_conn(&mut self, conn: ConnId) {
        unlinger(&mut self.lingering, &mut self.by_session, conn);
        let topics: Vec<Topic> = self
            .by_conn
            .get(&conn)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        for topic in topics {
            self.remove(&topic, conn);
        }
        self.by_conn.remove(&conn);
    }

    /// Topics with changes the broker has not had.
    pub fn changed_topics(&self) -> Vec<Topic> {
        self.rooms
            .iter()
            .filter(|(_, room)| !room.changed.is_empty() || room.anonymous_changed)
            .map(|(topic, _)| topic.clone())
            .collect()
    }

    /// What changed in `topic` since the last update taken, as the broker
    /// takes it; `None` when nothing did. The room is forgotten once it is
    /// empty and the broker was told.
    pub fn take_update(&mut self, topic: &Topic) -> Option<PresenceUpdate> {
        let room = self.rooms.get_mut(topic)?;
        if room.changed.is_empty() && !room.anonymous_changed {
            return None;
        }
        let mut update = PresenceUpdate {
            anonymous: room.anonymous,
            ..PresenceUpdate::default()
        };
        let mut changed: Vec<Arc<str>> = room.changed.drain().collect();
        changed.sort();
        for user in changed {
            match room.users.get(&user) {
                Some(local) => update.set.push((
                    Member {
                        user,
                        info: local.info.clone(),
                    },
                    local.connections,
                )),
                None => update.removed.push(user),
            }
        }
        room.anonymous_changed = false;
        if room.is_idle() {
            self.rooms.remove(topic);
        }
        Some(update)
    }

    /// An update the broker did not take: what it named is written again
    /// with the next one (as it is then).
    pub fn retry(&mut self, topic: &Topic, update: &PresenceUpdate) {
        let room = self.rooms.entry(topic.clone()).or_default();
        let users = update.set.iter().map(|(m, _)| m.user.clone());
        room.changed
            .extend(users.chain(update.removed.iter().cloned()));
        room.anonymous_changed = true;
    }

    /// Distinct users over every topic (a user in two topics counts twice).
    pub fn count(&self) -> usize {
        self.rooms.values().map(|room| room.users.len()).sum()
    }
}

/// `conn` lingers no more. (Of the two maps, not of [`Members`]: its caller
/// may hold one of its rooms.)
fn unlinger(
    lingering: &mut HashMap<ConnId, Lingering>,
    by_session: &mut HashMap<Arc<str>, Vec<ConnId>>,
    conn: ConnId,
) {
    let Some(gone) = lingering.remove(&conn) else {
        return;
    };
    if let Some(conns) = by_session.get_mut(&gone.session) {
        conns.retain(|&c| c != conn);
        if conns.is_empty() {
            by_session.remove(&gone.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn user(name: &str) -> Who {
        Who {
            user: Some(Arc::from(name)),
            info: Some(Bytes::from(format!(r#"{{"name":"{name}"}}"#))),
        }
    }

    const ANONYMOUS: Who = Who {
        user: None,
        info: None,
    };

    fn counts(update: &PresenceUpdate) -> Vec<(&str, u32)> {
        update.set.iter().map(|(m, n)| (&*m.user, *n)).collect()
    }

    #[test]
    fn a_user_counts_once_per_topic_whatever_its_connections() {
        let mut members = Members::default();
        let room = topic("room:1");
        assert!(members.enter(&room, 1, &user("alice")));
        assert!(!members.enter(&room, 2, &user("alice")));
        assert!(!members.enter(&room, 2, &user("alice")), "twice is once");
        members.enter(&room, 3, &ANONYMOUS);
        let update = members.take_update(&room).expect("changed");
        assert_eq!(counts(&update), [("alice", 2)]);
        assert_eq!(update.anonymous, 1);
        assert_eq!(members.take_update(&room), None, "nothing new");
        assert!(!members.exit(&room, 1));
        assert!(members.exit(&room, 2));
        let update = members.take_update(&room).expect("changed");
        assert_eq!(update.removed, [Arc::from("alice")]);
        members.exit(&room, 3);
        assert_eq!(members.take_update(&room).map(|u| u.anonymous), Some(0));
        assert!(members.rooms.is_empty(), "an empty room told is forgotten");
        assert_eq!(members.count(), 0);
    }

    #[test]
    fn a_connection_lingers_until_its_window_ends_or_its_session_resumes() {
        let mut members = Members::default();
        let (a, b) = (topic("room:a"), topic("room:b"));
        let now = Instant::now();
        members.enter(&a, 1, &user("alice"));
        members.enter(&b, 1, &user("alice"));
        members.take_update(&a);
        members.take_update(&b);
        assert!(members.linger(1, Arc::from("s1"), now + Duration::from_secs(5)));
        // The connection's end leaves its topics: not while it lingers.
        assert!(!members.exit(&a, 1));
        assert_eq!(members.take_update(&a), None);
        // Resumed here: the new connection enters, the old one goes, and
        // the user never left.
        members.enter(&a, 2, &user("alice"));
        members.resumed("s1");
        assert_eq!(counts(&members.take_update(&a).expect("a")), [("alice", 1)]);
        // It held `b` too, which the new connection did not take up.
        assert_eq!(members.take_update(&b).expect("b").removed.len(), 1);
        // Another drop, never resumed: gone when the window ends.
        members.linger(2, Arc::from("s1"), now + Duration::from_secs(5));
        assert_eq!(members.expire(now), 0);
        assert_eq!(members.expire(now + Duration::from_secs(5)), 1);
        assert_eq!(members.take_update(&a).expect("a").removed.len(), 1);
    }

    #[test]
    fn a_resume_lets_go_of_its_own_session_only() {
        let mut members = Members::default();
        let a = topic("room:a");
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        for (conn, name) in [(1, "alice"), (2, "bob"), (3, "carol")] {
            members.enter(&a, conn, &user(name));
            members.linger(conn, Arc::from(format!("s{conn}")), later);
        }
        members.take_update(&a);
        // Bob moved to another pod: his connection here goes at `soon`.
        let soon = now + Duration::from_secs(5);
        members.resumed_elsewhere("s2", soon);
        members.resumed("s1");
        assert_eq!(
            members.take_update(&a).expect("a").removed,
            [Arc::from("alice")]
        );
        assert_eq!(members.expire(soon), 1);
        assert_eq!(
            members.take_update(&a).expect("a").removed,
            [Arc::from("bob")]
        );
        assert_eq!(
            members.expire(later),
            1,
            "carol lingers to her window's end"
        );
        assert!(members.lingering.is_empty() && members.by_session.is_empty());
    }

    #[test]
    fn a_revoked_user_lingers_no_more() {
        let mut members = Members::default();
        let room = topic("room:1");
        let until = Instant::now() + Duration::from_secs(60);
        members.enter(&room, 1, &user("alice"));
        members.enter(&room, 2, &user("bob"));
        members.take_update(&room);
        members.linger(1, Arc::from("s1"), until);
        members.linger(2, Arc::from("s2"), until);
        members.revoke("alice");
        let update = members.take_update(&room).expect("alice left");
        assert_eq!(update.removed, [Arc::from("alice")]);
        assert_eq!(members.count(), 1, "bob lingers on");
    }

    #[test]
    fn a_refreshed_token_brings_its_info() {
        let mut members = Members::default();
        let room = topic("room:1");
        members.enter(&room, 1, &user("alice"));
        members.take_update(&room);
        members.refresh(1, user("alice").info.as_ref());
        assert_eq!(members.take_update(&room), None, "the same info");
        let info = Bytes::from_static(br#"{"name":"Al"}"#);
        members.refresh(1, Some(&info));
        let update = members.take_update(&room).expect("changed");
        assert_eq!(update.set[0].0.info, Some(info));
    }

    #[test]
    fn an_update_the_broker_refused_is_written_again() {
        let mut members = Members::default();
        let room = topic("room:1");
        members.enter(&room, 1, &user("alice"));
        let update = members.take_update(&room).expect("changed");
        members.retry(&room, &update);
        assert_eq!(members.changed_topics(), std::slice::from_ref(&room));
        assert_eq!(members.take_update(&room), Some(update));
    }
}
