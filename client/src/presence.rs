//! A topic's presence: the members of a page, the changes of a
//! `presence_diff`, and [`PresenceRoom`], which merges both by the
//! protocol's rule without I/O (the driver keeps one per topic the
//! application tracks with [`crate::Client::track_presence`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::value::RawValue;

/// One member of a topic: a user (the token's `sub`), with their token's
/// `info` claim (a JSON object), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub user: Arc<str>,
    /// JSON text of an object, as the server sent it.
    pub info: Option<Arc<str>>,
}

impl Member {
    pub(crate) fn new(user: &str, info: Option<&RawValue>) -> Self {
        Self {
            user: Arc::from(user),
            info: info.map(|i| Arc::from(i.get())),
        }
    }
}

/// One page of a topic's presence ([`crate::Client::presence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresencePage {
    pub topic: String,
    /// The topic's presence position this page answers at (for the members
    /// of its key range).
    pub position: u64,
    /// Users (each once, however many connections) and connections
    /// (anonymous ones too) of the whole topic.
    pub users: u64,
    pub connections: u64,
    /// Ordered by user id (bytewise).
    pub members: Vec<Member>,
    /// Asks for the next page; `None` on the last one.
    pub cursor: Option<String>,
}

/// What changed in a topic's presence from `from` to `to`, as the server
/// says it: each user at most once, with their state at `to`; `counts_only`
/// above the namespace's `presence_counts_only_above` (no users named).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceDiff {
    pub topic: Arc<str>,
    pub from: u64,
    pub to: u64,
    pub joins: Vec<Member>,
    pub leaves: Vec<Arc<str>>,
    pub counts_only: bool,
    pub users: u64,
    pub connections: u64,
}

/// What a page or diff changed in a [`PresenceRoom`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Users that were not members and are now (with their info).
    pub joins: Vec<Member>,
    /// Users that were members and are no more.
    pub leaves: Vec<Arc<str>>,
}

/// A loaded key range: the users up to `up_to` (to the end when `None`),
/// as of `position`.
#[derive(Debug, Clone)]
struct Range {
    up_to: Option<Arc<str>>,
    position: u64,
}

/// The merge of presence pages and diffs into one room (docs/protocol.md,
/// "Presence"): a page answers at its position for the users of its key
/// range (after the previous page's last user, up to its own last one; the
/// last page to the end); a diff applies to a user whose range was loaded
/// at a position below its `to` (a page at `to` or later holds it already);
/// a diff that comes before the page of a user's range waits for it. So no
/// member is missed or counted twice, however pages and diffs interleave.
/// Give pages in order (each after the previous one's cursor), diffs as
/// they came. User ids compare bytewise, as the server orders them (Rust's
/// `str` order).
#[derive(Debug, Clone, Default)]
pub struct PresenceRoom {
    members: BTreeMap<Arc<str>, Member>,
    ranges: Vec<Range>,
    early: Vec<PresenceDiff>,
    complete: bool,
    exact: bool,
    position: u64,
    users: u64,
    connections: u64,
}

impl PresenceRoom {
    pub fn new() -> Self {
        Self {
            exact: true,
            ..Self::default()
        }
    }

    /// Every page is in.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The members follow every change: `false` once a counts-only diff
    /// changed the count (the members are then those before it).
    pub fn exact(&self) -> bool {
        self.exact
    }

    /// The newest position seen, and the counts there.
    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn users(&self) -> u64 {
        self.users
    }

    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// The members, ordered by user id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    pub fn contains(&self, user: &str) -> bool {
        self.members.contains_key(user)
    }

    /// Adds the next page; what it added (and what diffs that came before
    /// it changed in its range).
    pub fn page(&mut self, page: &PresencePage) -> Applied {
        let mut applied = Applied::default();
        let more = page.cursor.is_some();
        self.counts(page.position, Some(page.users), Some(page.connections));
        // An empty page with a cursor covers nothing new.
        if more && page.members.is_empty() {
            return applied;
        }
        let from = self.ranges.last().and_then(|r| r.up_to.clone());
        let up_to = if more {
            page.members.last().map(|m| m.user.clone())
        } else {
            None
        };
        for m in &page.members {
            self.set(m.clone(), &mut applied);
        }
        let in_range = |user: &str| {
            from.as_deref().is_none_or(|f| user > f) && up_to.as_deref().is_none_or(|u| user <= u)
        };
        let early = std::mem::take(&mut self.early);
        for d in early.iter().filter(|d| d.to > page.position) {
            for m in d.joins.iter().filter(|m| in_range(&m.user)) {
                self.set(m.clone(), &mut applied);
            }
            for user in d.leaves.iter().filter(|u| in_range(u)) {
                if self.members.remove(user).is_some() {
                    applied.leaves.push(user.clone());
                }
            }
        }
        self.early = early;
        self.ranges.push(Range {
            up_to,
            position: page.position,
        });
        if !more {
            self.complete = true;
            self.early.clear();
        }
        applied
    }

    /// Applies a diff where the rule says; what it changed.
    pub fn diff(&mut self, d: &PresenceDiff) -> Applied {
        let mut applied = Applied::default();
        for m in &d.joins {
            if self.loaded_at(&m.user).is_some_and(|p| d.to > p) {
                self.set(m.clone(), &mut applied);
            }
        }
        for user in &d.leaves {
            if self.loaded_at(user).is_some_and(|p| d.to > p) && self.members.remove(user).is_some()
            {
                applied.leaves.push(user.clone());
            }
        }
        if d.counts_only && self.complete && d.users != self.members.len() as u64 {
            self.exact = false;
        }
        if !self.complete {
            self.early.push(d.clone());
        }
        self.counts(d.to, Some(d.users), Some(d.connections));
        applied
    }

    fn counts(&mut self, position: u64, users: Option<u64>, connections: Option<u64>) {
        if position < self.position {
            return;
        }
        self.position = position;
        if let Some(users) = users {
            self.users = users;
        }
        if let Some(connections) = connections {
            self.connections = connections;
        }
    }

    fn loaded_at(&self, user: &str) -> Option<u64> {
        self.ranges
            .iter()
            .find(|r| r.up_to.as_deref().is_none_or(|u| user <= u))
            .map(|r| r.position)
    }

    fn set(&mut self, m: Member, applied: &mut Applied) {
        if self.members.insert(m.user.clone(), m.clone()).is_none() {
            applied.joins.push(m);
        }
    }

    /// What differs from `before` (the room the application was shown) to
    /// this one, as joins and leaves.
    pub fn since(&self, before: Option<&PresenceRoom>) -> Applied {
        let mut applied = Applied::default();
        for m in self.members.values() {
            if !before.is_some_and(|b| b.contains(&m.user)) {
                applied.joins.push(m.clone());
            }
        }
        if let Some(before) = before {
            for user in before.members.keys() {
                if !self.members.contains_key(user) {
                    applied.leaves.push(user.clone());
                }
            }
        }
        applied
    }
}

/// A topic whose members the driver keeps for the application
/// ([`crate::Client::track_presence`]): a room loaded anew on each
/// subscribe, and what the application was told.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// The room being loaded, or (once `shown`) the one told.
    room: PresenceRoom,
    /// What the application was last told, while a reload is under way.
    previous: Option<PresenceRoom>,
    shown: bool,
    /// Bumped by each load: the pages of an older one are dropped.
    load: u64,
}

/// What a page did to a [`Tracker`].
pub(crate) enum Loaded {
    /// Of an older load: dropped.
    Stale,
    /// Ask for the page after this cursor.
    Next(String),
    /// The last page: this changed since what the application was told.
    Done(Applied),
}

/// What a diff did to a [`Tracker`].
pub(crate) enum Told {
    /// Nothing to tell (a load is under way).
    Quiet,
    /// Members named again after counts-only diffs: load them anew.
    Reload,
    Changed(Applied),
}

impl Tracker {
    /// Starts a load; its id, for its pages.
    pub fn restart(&mut self) -> u64 {
        self.load += 1;
        let room = std::mem::replace(&mut self.room, PresenceRoom::new());
        if self.shown {
            self.previous = Some(room);
        }
        self.shown = false;
        self.load
    }

    pub fn page(&mut self, load: u64, page: &PresencePage) -> Loaded {
        if load != self.load {
            return Loaded::Stale;
        }
        self.room.page(page);
        if let Some(cursor) = &page.cursor {
            return Loaded::Next(cursor.clone());
        }
        self.shown = true;
        Loaded::Done(self.room.since(self.previous.take().as_ref()))
    }

    pub fn diff(&mut self, diff: &PresenceDiff) -> Told {
        if self.shown && !self.room.exact() && !diff.counts_only {
            // Back under the counts-only line: the members are not known
            // (the pages of a new load hold this diff).
            return Told::Reload;
        }
        let change = self.room.diff(diff);
        if self.shown {
            Told::Changed(change)
        } else {
            Told::Quiet
        }
    }

    /// The event that tells `change`.
    pub fn event(&self, topic: Arc<str>, change: Applied, loaded: bool) -> crate::Event {
        crate::Event::Presence {
            topic,
            change,
            loaded,
            position: self.room.position(),
            users: self.room.users(),
            connections: self.room.connections(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A small deterministic PRNG (xorshift), so that a failing seed replays.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    const USERS: [&str; 8] = [
        "alice", "bob", "carol", "dave", "erin", "zoë", "😀", "\u{FF21}",
    ];

    /// One pod's view of a topic, sending what the protocol lets it send.
    #[derive(Default)]
    struct Model {
        members: BTreeMap<Arc<str>, Member>,
        position: u64,
        sent: u64,
        pending: BTreeSet<Arc<str>>,
    }

    impl Model {
        fn change(&mut self, rng: &mut Rng) {
            let user: Arc<str> = Arc::from(USERS[rng.below(USERS.len())]);
            if self.members.remove(&user).is_none() {
                let info = format!(r#"{{"n":{}}}"#, self.position);
                self.members.insert(
                    user.clone(),
                    Member {
                        user: user.clone(),
                        info: Some(Arc::from(info)),
                    },
                );
            }
            self.position += 1;
            self.pending.insert(user);
        }

        fn flush(&mut self) -> Option<PresenceDiff> {
            if self.pending.is_empty() {
                return None;
            }
            let mut d = PresenceDiff {
                topic: Arc::from("t"),
                from: self.sent,
                to: self.position,
                joins: Vec::new(),
                leaves: Vec::new(),
                counts_only: false,
                users: self.members.len() as u64,
                connections: self.members.len() as u64,
            };
            for user in std::mem::take(&mut self.pending) {
                match self.members.get(&user) {
                    Some(m) => d.joins.push(m.clone()),
                    None => d.leaves.push(user),
                }
            }
            self.sent = self.position;
            Some(d)
        }

        /// The page after `cursor`, the pending diff sent first.
        fn page(
            &mut self,
            cursor: Option<&str>,
            limit: usize,
        ) -> (Option<PresenceDiff>, PresencePage) {
            let diff = self.flush();
            let after: Vec<Member> = self
                .members
                .values()
                .filter(|m| cursor.is_none_or(|c| &*m.user > c))
                .cloned()
                .collect();
            let members: Vec<Member> = after.iter().take(limit).cloned().collect();
            let cursor = (after.len() > limit).then(|| {
                members
                    .last()
                    .map(|m| m.user.to_string())
                    .unwrap_or_default()
            });
            let page = PresencePage {
                topic: "t".to_owned(),
                position: self.position,
                users: self.members.len() as u64,
                connections: self.members.len() as u64,
                members,
                cursor,
            };
            (diff, page)
        }
    }

    #[test]
    fn pages_and_diffs_in_any_order_the_protocol_allows_merge_to_the_room() {
        for seed in 1..=2000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut model = Model::default();
            for _ in 0..rng.below(10) {
                model.change(&mut rng);
            }
            model.flush();
            let mut room = PresenceRoom::new();
            let limit = 1 + rng.below(3);
            let mut cursor: Option<String> = None;
            let mut shown: Option<BTreeSet<Arc<str>>> = None;
            let mut step = 0;
            let tell = |applied: Applied, shown: &mut Option<BTreeSet<Arc<str>>>| {
                if let Some(shown) = shown {
                    for m in applied.joins {
                        assert!(
                            shown.insert(m.user.clone()),
                            "seed {seed}: join of a member"
                        );
                    }
                    for u in applied.leaves {
                        assert!(shown.remove(&u), "seed {seed}: leave of a non-member");
                    }
                }
            };
            while step < 50 || !room.complete() {
                step += 1;
                match rng.below(4) {
                    0 | 1 => model.change(&mut rng),
                    2 => {
                        if let Some(d) = model.flush() {
                            tell(room.diff(&d), &mut shown);
                        }
                    }
                    _ if !room.complete() => {
                        let (d, page) = model.page(cursor.as_deref(), limit);
                        if let Some(d) = d {
                            tell(room.diff(&d), &mut shown);
                        }
                        room.page(&page);
                        cursor = page.cursor;
                        if room.complete() {
                            shown = Some(room.members().map(|m| m.user.clone()).collect());
                        }
                    }
                    _ => {}
                }
            }
            if let Some(d) = model.flush() {
                tell(room.diff(&d), &mut shown);
            }
            let want: Vec<&Member> = model.members.values().collect();
            let have: Vec<&Member> = room.members().collect();
            assert_eq!(have, want, "seed {seed}");
            assert_eq!(room.position(), model.position, "seed {seed}");
            assert_eq!(room.users(), model.members.len() as u64, "seed {seed}");
            let shown: Vec<Arc<str>> = shown.unwrap_or_default().into_iter().collect();
            let want: Vec<Arc<str>> = model.members.keys().cloned().collect();
            assert_eq!(shown, want, "seed {seed}: the events give the room");
        }
    }

    #[test]
    fn a_diff_before_any_page_waits_for_the_page_of_its_users() {
        let member = |u: &str| Member::new(u, None);
        let diff = |from, to, joins: Vec<Member>, leaves: Vec<&str>| PresenceDiff {
            topic: Arc::from("t"),
            from,
            to,
            joins,
            leaves: leaves.into_iter().map(Arc::from).collect(),
            counts_only: false,
            users: 1,
            connections: 1,
        };
        let mut room = PresenceRoom::new();
        room.diff(&diff(2, 3, vec![member("bob")], vec![]));
        room.diff(&diff(3, 4, vec![], vec!["alice"]));
        assert_eq!(room.members().count(), 0);
        let page = |members: Vec<Member>, cursor: Option<&str>| PresencePage {
            topic: "t".to_owned(),
            position: 3,
            users: 2,
            connections: 2,
            members,
            cursor: cursor.map(str::to_owned),
        };
        let applied = room.page(&page(vec![member("alice")], Some("alice")));
        assert_eq!(applied.leaves, vec![Arc::<str>::from("alice")]);
        room.page(&page(vec![member("bob")], None));
        assert_eq!(room.members().collect::<Vec<_>>(), vec![&member("bob")]);
        assert_eq!((room.position(), room.users()), (4, 1));
    }
}
