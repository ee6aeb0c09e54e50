//! The sessions this pod serves, by id: what a resume takes over, what the
//! flusher saves, whom a rebalance moves and whom a backend disconnects.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use proto::ServerMessage;
use rand::Rng;
use router::{
    Causes, Claim, ServerSubscription, SessionSave, SessionSnapshot, SessionStore, Whose,
};
use tokio::time::Instant;

use super::Subscriptions;
use crate::admission::ConnId;
use crate::disconnect::CloseReason;
use crate::frame;
use crate::outbound::Outbound;

/// How long a resume waits for the connection it takes over to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(2);

/// How long a disconnect of a user is remembered, for the connections of
/// that user that were between their `hello` and their registration then;
/// a `hello` that takes longer than this to register is refused (4003,
/// come back), so that none can outlast what is remembered.
const DISCONNECT_MEMORY: Duration = Duration::from_secs(60);

/// A live session's stored copy is extended once it is older than the
/// resume window divided by this: it must not expire while its connection
/// lives, and half the window is left for flushes that fail meanwhile.
const REFRESH_PARTS: u32 = 2;

/// A session a connection on this pod serves.
#[derive(Clone)]
pub struct LiveSession {
    pub conn: ConnId,
    /// The connection's token as the session's owner in the store.
    pub owner: Arc<str>,
    pub out: Outbound,
    /// Its subscriptions and acks, and whose session it is; through it, a
    /// resume tells the connection to stop and waits for it to end.
    pub subscriptions: Subscriptions,
}

/// What [`Registry::take_over`] found.
pub enum TakeOver {
    /// No connection on this pod serves the session.
    None,
    /// One does, for another user: left alone.
    OtherUser,
    /// Its connection was ended: its owner token and the session as it
    /// left it.
    Taken(Arc<str>, SessionSnapshot),
}

#[derive(Default)]
pub struct Registry {
    live: Mutex<Live>,
}

#[derive(Default)]
struct Live {
    sessions: HashMap<Arc<str>, LiveSession>,
    /// Counts disconnects: what an [`Arrival`] is ordered against.
    disconnects: u64,
    /// Users disconnected within [`DISCONNECT_MEMORY`]: the count of that
    /// disconnect, and when.
    disconnected: HashMap<Arc<str>, (u64, Instant)>,
    /// Server-side subscription commands waiting for a session's
    /// connection, in the order they came, at most [`MAX_SERVER_COMMANDS`]
    /// each: here rather than in every session, which an idle connection
    /// would pay for (issue #16).
    commands: HashMap<Arc<str>, VecDeque<ServerSubscription>>,
    /// Commands posted for a session (`POST /stream/<session>`, here or on
    /// another pod), waiting for its connection: like `commands`, only for
    /// sessions that have some.
    posted: HashMap<Arc<str>, Posted>,
    /// The sessions by key ([`session_key`]): what a forward from another
    /// pod names, the id being a credential that never leaves the pod.
    keys: HashMap<u128, Arc<str>>,
    /// Set when the pod drains: the window its `reconnect` advice spreads
    /// clients over. A session registered after that is advised at once.
    draining: Option<Duration>,
}

/// Server-side subscription commands a connection may have waiting: it
/// runs them between its own commands, one at a time, and a replay may hold
/// one up for as long as `replay.wait` plus the replay. Above it, a new one
/// is refused and counted
/// (`herald_server_subscriptions_applied_total{outcome="dropped"}`).
pub const MAX_SERVER_COMMANDS: usize = 64;

/// Posted commands a session may have waiting, at most: four POSTs of the
/// most a POST carries (64). Past it (or past [`Registry::post`]'s byte
/// bound), a POST is refused whole: `429`, or, forwarded from another pod,
/// dropped and told to the client.
pub const MAX_POSTED_COMMANDS: usize = 256;

/// The bytes of posted commands a session may have waiting, at most: four
/// POSTs' worth (a POST's body is at most `websocket.max_message_bytes`).
pub fn max_posted_bytes(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_mul(4)
}

/// The posted commands waiting for one session's connection.
#[derive(Default)]
struct Posted {
    commands: VecDeque<Bytes>,
    bytes: usize,
    /// Commands forwarded from another pod and dropped at the bound since
    /// the connection last ran its posted commands: it tells its client.
    dropped: usize,
}

/// What [`Registry::post`] and [`Registry::forwarded`] did with commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// Queued for the session's connection, which was woken.
    Queued,
    /// Not queued: the session has too many waiting.
    Full,
    /// No connection on this pod serves the session.
    NotHere,
    /// One does, for another user: left alone.
    OtherUser,
}

/// A session's key: the first 128 bits of the SHA-256 of its id, as
/// presence names it too. What the control channel carries instead of the
/// id, which is a credential.
pub fn session_key(id: &str) -> u128 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

/// When a connection's `hello` began, as the registry orders it against
/// disconnects: taken before the token is checked and the session claimed.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    disconnects: u64,
    at: Instant,
}

/// Why a connection could not register its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unregistered {
    /// Its user was disconnected after its `hello` began: it passed the
    /// store's revocation check before the revocation was there, and the
    /// disconnect's sweep before it was registered. It ends as if swept.
    Disconnected,
    /// Its `hello` began longer ago than disconnects are remembered.
    Late,
}

impl Registry {
    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions served by this pod's connections now.
    pub fn len(&self) -> usize {
        self.live().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live().sessions.is_empty()
    }

    /// A `hello` begins: see [`Registry::register`].
    pub fn arrival(&self) -> Arrival {
        Arrival {
            disconnects: self.live().disconnects,
            at: Instant::now(),
        }
    }

    /// Records that a connection now serves session `id`, unless its user
    /// was disconnected since its `hello` began (`arrived`). Registration is
    /// where two resumes of one session meet however they raced: the later
    /// one serves it, and one registered before it for the same session (it
    /// took over the same connection, or none) is taken over in turn, so
    /// that one connection per session is ever listed, and reached by a
    /// disconnect.
    pub fn register(
        &self,
        id: Arc<str>,
        session: LiveSession,
        arrived: Arrival,
    ) -> Result<(), Unregistered> {
        let now = Instant::now();
        let mut live = self.live();
        if !live.disconnected.is_empty() {
            live.disconnected
                .retain(|_, (_, at)| now.duration_since(*at) < DISCONNECT_MEMORY);
        }
        if now.duration_since(arrived.at) >= DISCONNECT_MEMORY {
            return Err(Unregistered::Late);
        }
        if let Some(user) = session.subscriptions.user()
            && live
                .disconnected
                .get(&*user.id)
                .is_some_and(|&(count, _)| count > arrived.disconnects)
        {
            return Err(Unregistered::Disconnected);
        }
        let conn = session.conn;
        if let Some(spread) = live.draining {
            // Under the lock the drain advised the others under: no
            // connection registers between the two unadvised.
            advise(&session.out, spread, "draining", CloseReason::Shutdown);
        }
        live.keys.insert(session_key(&id), id.clone());
        if let Some(before) = live.sessions.insert(id, session)
            && before.conn != conn
        {
            before.subscriptions.take_over();
            before.subscriptions.supersede();
        }
        Ok(())
    }

    pub fn deregister(&self, id: &str, conn: ConnId) {
        let mut live = self.live();
        if live.sessions.get(id).is_some_and(|l| l.conn == conn) {
            live.sessions.remove(id);
            live.commands.remove(id);
            live.posted.remove(id);
            live.keys.remove(&session_key(id));
        }
    }

    /// Ends the connection that serves session `id` on this pod, if any and
    /// if the session is `user`'s, and returns what it left: a resume must
    /// see its latest acks, and must not depend on the store having them
    /// yet (with the memory broker a session is stored only when its
    /// connection ends, which a half-open connection may take long to do).
    pub async fn take_over(&self, id: &str, user: Option<&str>) -> TakeOver {
        let Some(current) = self.live().sessions.get(id).cloned() else {
            return TakeOver::None;
        };
        if !Claim::belongs(current.subscriptions.user().as_ref(), user) {
            return TakeOver::OtherUser;
        }
        current.subscriptions.take_over();
        // Its reader stops between commands: wait for that, briefly.
        let _ = tokio::time::timeout(TAKEOVER_WAIT, current.subscriptions.ended()).await;
        let taken = current.subscriptions.snapshot();
        // Whatever it would save from now on is older than what the new
        // connection holds, even where the store cannot tell (its copy was
        // lost, so the new owner ranks no higher).
        current.subscriptions.supersede();
        TakeOver::Taken(current.owner, taken)
    }

    /// Asks up to `count` sessions to reconnect elsewhere, each after a random
    /// delay within `spread`; returns how many were asked.
    pub fn ask_to_move(&self, count: usize, spread: Duration) -> usize {
        let mut asked = 0;
        for live in self.live().sessions.values() {
            if asked == count {
                break;
            }
            if live.out.is_closing() {
                continue;
            }
            advise(&live.out, spread, "rebalance", CloseReason::Rebalance);
            asked += 1;
        }
        asked
    }

    /// The pod drains: every session's connection is sent `reconnect`
    /// advice, each with a random delay within `spread` (so that they do
    /// not all come back at once), and then the 1012 close; so is every
    /// session registered from now on. Returns how many were advised.
    ///
    /// Here rather than in each connection's writer: a drain token watched
    /// per connection cost every idle connection an allocation and a
    /// waiter. A connection that has not said `hello` yet is advised when
    /// it registers, or closed at its `hello` deadline.
    pub fn drain(&self, spread: Duration) -> usize {
        let mut live = self.live();
        live.draining = Some(spread);
        let mut advised = 0;
        for session in live.sessions.values() {
            if !session.out.is_closing() {
                advise(&session.out, spread, "draining", CloseReason::Shutdown);
                advised += 1;
            }
        }
        advised
    }

    /// Saves every live session that changed since its last save, and
    /// extends those whose stored copy is getting old, in one batch. What
    /// the store did not keep is tried again at the next flush, and so is a
    /// session its connection saves meanwhile (each is saved by one at a
    /// time: [`Subscriptions::save`]).
    pub async fn flush(&self, store: &dyn SessionStore, window: Duration) {
        let now = Instant::now();
        let refresh = window / REFRESH_PARTS;
        let live: Vec<(Arc<str>, Arc<str>, Subscriptions)> = self
            .live()
            .sessions
            .iter()
            .filter(|(_, live)| live.subscriptions.is_due(now, refresh))
            .map(|(id, live)| (id.clone(), live.owner.clone(), live.subscriptions.clone()))
            .collect();
        // Each held until the store answered: a save the connection makes
        // meanwhile goes after this one, with a newer snapshot.
        let mut turns = Vec::new();
        let mut saves = Vec::new();
        for (id, owner, subscriptions) in &live {
            let Some(turn) = subscriptions.try_saving() else {
                continue;
            };
            let Some(due) = subscriptions.due(now, refresh) else {
                continue;
            };
            saves.push(SessionSave {
                id: id.clone(),
                owner: owner.clone(),
                snapshot: due.snapshot,
            });
            turns.push((turn, due.changes, subscriptions));
        }
        if saves.is_empty() {
            return;
        }
        let answers = store.save_many(saves, window).await;
        let mut failed = None;
        for ((_turn, changes, subscriptions), answer) in turns.into_iter().zip(answers) {
            match answer {
                Ok(stored) => subscriptions.stored(changes, stored, now),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            tracing::warn!(error = %Causes(&e), "sessions not saved; tried again at the next flush");
        }
    }

    /// Hands a backend's server-side subscription `command` to every
    /// connection of `user` on this pod, which runs it between its own
    /// commands ([`Self::next_command`]); returns how many took it, and how
    /// many had [`MAX_SERVER_COMMANDS`] waiting already. A connection
    /// between its `hello` and its registration does not get it.
    pub fn subscription(&self, user: &str, command: &ServerSubscription) -> (usize, usize) {
        let (mut queued, mut refused) = (0, 0);
        let mut live = self.live();
        let Live {
            sessions, commands, ..
        } = &mut *live;
        for (id, session) in sessions.iter() {
            if !Claim::belongs(session.subscriptions.user().as_ref(), Some(user)) {
                continue;
            }
            let waiting = commands.entry(id.clone()).or_default();
            if waiting.len() >= MAX_SERVER_COMMANDS {
                refused += 1;
                continue;
            }
            waiting.push_back(command.clone());
            session.out.poke();
            queued += 1;
        }
        (queued, refused)
    }

    /// The oldest server-side command waiting for session `id`.
    pub fn next_command(&self, id: &str) -> Option<ServerSubscription> {
        let mut live = self.live();
        let waiting = live.commands.get_mut(id)?;
        let next = waiting.pop_front();
        if waiting.is_empty() {
            live.commands.remove(id);
        }
        next
    }

    /// Whose the session `id` is, if a connection on this pod serves it.
    pub fn whose(&self, id: &str) -> Option<Whose> {
        let live = self.live();
        let session = live.sessions.get(id)?;
        if session.out.format() == frame::Format::Sse {
            // Takes no commands ([`Self::post`]).
            return Some(Whose::Nobody);
        }
        Some(Whose::of(session.subscriptions.user().as_ref()))
    }

    /// Queues commands posted for session `id` by `user` (`None`:
    /// anonymous) for its connection, which runs them between its own
    /// ([`Self::next_posted`]), all of them or none: at most
    /// [`MAX_POSTED_COMMANDS`] and `max_bytes` wait per session.
    pub fn post(&self, id: &str, user: Option<&str>, commands: &[Bytes], max_bytes: usize) -> Post {
        let mut live = self.live();
        let Some((id, session)) = live.sessions.get_key_value(id) else {
            return Post::NotHere;
        };
        // An SSE stream takes no commands (its client is never told its
        // session's id): as good as another user's.
        let read_only = session.out.format() == frame::Format::Sse;
        if read_only || !Claim::belongs(session.subscriptions.user().as_ref(), user) {
            return Post::OtherUser;
        }
        let (id, out) = (id.clone(), session.out.clone());
        let waiting = live.posted.entry(id).or_default();
        let bytes: usize = commands.iter().map(Bytes::len).sum();
        if waiting.commands.len() + commands.len() > MAX_POSTED_COMMANDS
            || waiting.bytes + bytes > max_bytes
        {
            return Post::Full;
        }
        waiting.commands.extend(commands.iter().cloned());
        waiting.bytes += bytes;
        out.poke();
        Post::Queued
    }

    /// [`Self::post`] for commands forwarded from another pod, naming the
    /// session by its key ([`session_key`], hex): those it cannot queue
    /// are counted for the connection to tell its client.
    pub fn forwarded(
        &self,
        key: &str,
        user: Option<&str>,
        commands: &[Bytes],
        max_bytes: usize,
    ) -> Post {
        let Ok(key) = u128::from_str_radix(key, 16) else {
            return Post::NotHere;
        };
        let Some(id) = self.live().keys.get(&key).cloned() else {
            return Post::NotHere;
        };
        let posted = self.post(&id, user, commands, max_bytes);
        if posted == Post::Full {
            let mut live = self.live();
            if let Some(session) = live.sessions.get(&id) {
                let out = session.out.clone();
                live.posted.entry(id).or_default().dropped += commands.len();
                out.poke();
            }
        }
        posted
    }

    /// The oldest posted command waiting for session `id`.
    pub fn next_posted(&self, id: &str) -> Option<Bytes> {
        let mut live = self.live();
        let waiting = live.posted.get_mut(id)?;
        let next = waiting.commands.pop_front();
        if let Some(command) = &next {
            waiting.bytes -= command.len();
        }
        if waiting.commands.is_empty() && waiting.dropped == 0 {
            live.posted.remove(id);
        }
        next
    }

    /// How many commands forwarded for session `id` were dropped since
    /// this was last asked (none wait any more, then).
    pub fn dropped_posted(&self, id: &str) -> usize {
        let mut live = self.live();
        let Some(waiting) = live.posted.get_mut(id) else {
            return 0;
        };
        let dropped = std::mem::take(&mut waiting.dropped);
        if waiting.commands.is_empty() {
            live.posted.remove(id);
        }
        dropped
    }

    /// Closes every connection of `user` on this pod and forgets their
    /// sessions at once; returns how many. A connection of the user's that
    /// is between its `hello` and its registration is refused when it
    /// registers ([`Unregistered::Disconnected`]).
    ///
    /// Forgotten now, not when each connection has finished closing (which
    /// waits up to `websocket.close_timeout` for the client's close): until
    /// then a resume would take the session over from the closing connection
    /// without asking the store, which knows it is revoked.
    pub fn disconnect(&self, user: &str) -> usize {
        let mut closed = 0;
        let mut live = self.live();
        live.disconnects += 1;
        let count = live.disconnects;
        live.disconnected
            .insert(Arc::from(user), (count, Instant::now()));
        let Live {
            sessions,
            commands,
            posted,
            keys,
            ..
        } = &mut *live;
        sessions.retain(|id, live| {
            let theirs = Claim::belongs(live.subscriptions.user().as_ref(), Some(user));
            if theirs {
                live.out.close(CloseReason::Disconnected, true);
                commands.remove(id);
                posted.remove(id);
                keys.remove(&session_key(id));
                closed += 1;
            }
            !theirs
        });
        closed
    }
}

/// Queues `reconnect` advice (come back after a random delay within
/// `spread`, for `reason`) and then the close.
fn advise(out: &Outbound, spread: Duration, reason: &'static str, close: CloseReason) {
    let spread_ms = spread.as_millis().max(1) as u64;
    let after_ms = rand::thread_rng().gen_range(0..spread_ms);
    let advice = frame::message(out.format(), &ServerMessage::Reconnect { after_ms, reason });
    out.close_after(advice, close);
}

#[cfg(test)]
mod tests {
    use router::{SessionUser, Topic};

    use super::*;
    use crate::config::{Limits, Overflow};

    fn connection(registry: &Registry, id: &str, conn: ConnId, user: &str) -> Outbound {
        let out = Outbound::new(Limits {
            frames: 4,
            bytes: 1024,
            overflow: Overflow::Disconnect,
        });
        let subscriptions = Subscriptions::default();
        subscriptions.set_user(Some(SessionUser {
            id: Arc::from(user),
            since_ms: 0,
        }));
        let live = LiveSession {
            conn,
            owner: Arc::from(id),
            out: out.clone(),
            subscriptions,
        };
        let registered = registry.register(Arc::from(id), live, registry.arrival());
        assert!(registered.is_ok());
        out
    }

    fn unsubscribe(name: &str) -> ServerSubscription {
        ServerSubscription::Unsubscribe {
            topic: Topic::parse(name).expect("a topic"),
        }
    }

    #[tokio::test]
    async fn server_commands_wake_the_users_connections_and_wait_in_order_up_to_a_bound() {
        let registry = Registry::default();
        let alice = connection(&registry, "s1", 1, "alice");
        let bob = connection(&registry, "s2", 2, "bob");
        assert_eq!(registry.subscription("alice", &unsubscribe("a")), (1, 0));
        assert_eq!(registry.subscription("alice", &unsubscribe("b")), (1, 0));
        // A poke, not the end of the connection; bob's is not woken.
        assert_eq!(
            futures_util::FutureExt::now_or_never(alice.stopped_or_poked()),
            Some(false)
        );
        assert_eq!(
            futures_util::FutureExt::now_or_never(bob.stopped_or_poked()),
            None
        );
        assert!(matches!(registry.next_command("s1"),
            Some(ServerSubscription::Unsubscribe { topic }) if topic.as_str() == "a"));
        assert!(matches!(registry.next_command("s1"),
            Some(ServerSubscription::Unsubscribe { topic }) if topic.as_str() == "b"));
        assert!(registry.next_command("s1").is_none());
        for _ in 0..MAX_SERVER_COMMANDS {
            assert_eq!(registry.subscription("alice", &unsubscribe("a")), (1, 0));
        }
        assert_eq!(
            registry.subscription("alice", &unsubscribe("a")),
            (0, 1),
            "the bound"
        );
        // Gone with the connection: nothing waits for a session nobody serves.
        registry.deregister("s1", 1);
        assert!(registry.next_command("s1").is_none());
        assert!(registry.live().commands.is_empty());
    }

    fn posted(n: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| Bytes::from(format!(r#"{{"op":"ping","id":{i}}}"#)))
            .collect()
    }

    #[tokio::test]
    async fn posted_commands_wait_for_their_session_whole_in_order_and_bounded() {
        let registry = Registry::default();
        let alice = connection(&registry, "s1", 1, "alice");
        assert_eq!(registry.whose("s1"), Some(Whose::User(Arc::from("alice"))));
        assert_eq!(registry.whose("s9"), None);
        let max = 1024;
        assert_eq!(
            registry.post("s1", Some("bob"), &posted(1), max),
            Post::OtherUser
        );
        assert_eq!(registry.post("s1", None, &posted(1), max), Post::OtherUser);
        assert_eq!(
            registry.post("s9", Some("alice"), &posted(1), max),
            Post::NotHere
        );
        assert!(
            registry.next_posted("s1").is_none(),
            "nothing of theirs queued"
        );
        assert_eq!(
            registry.post("s1", Some("alice"), &posted(2), max),
            Post::Queued
        );
        assert_eq!(
            futures_util::FutureExt::now_or_never(alice.stopped_or_poked()),
            Some(false),
            "woken"
        );
        // Forwarded from another pod, by the session's key.
        let key = format!("{:032x}", session_key("s1"));
        let third = [Bytes::from_static(br#"{"op":"ping","id":9}"#)];
        assert_eq!(
            registry.forwarded(&key, Some("alice"), &third, max),
            Post::Queued
        );
        assert_eq!(
            registry.forwarded(&key, Some("eve"), &third, max),
            Post::OtherUser
        );
        assert_eq!(
            registry.forwarded("zz", Some("alice"), &third, max),
            Post::NotHere
        );
        let order: Vec<Bytes> = std::iter::from_fn(|| registry.next_posted("s1")).collect();
        assert_eq!(order, [posted(2), third.to_vec()].concat());
        // Bounded in count and in bytes, a POST whole or not at all: a
        // forwarded one dropped is told.
        assert_eq!(
            registry.post(
                "s1",
                Some("alice"),
                &posted(MAX_POSTED_COMMANDS + 1),
                usize::MAX
            ),
            Post::Full
        );
        assert_eq!(
            registry.post("s1", Some("alice"), &posted(10), 100),
            Post::Full
        );
        assert_eq!(
            registry.post("s1", Some("alice"), &posted(3), 100),
            Post::Queued
        );
        assert_eq!(
            registry.forwarded(&key, Some("alice"), &posted(3), 100),
            Post::Full
        );
        assert_eq!(std::iter::from_fn(|| registry.next_posted("s1")).count(), 3);
        assert_eq!(registry.dropped_posted("s1"), 3);
        assert_eq!(registry.dropped_posted("s1"), 0);
        assert!(registry.live().posted.is_empty());
        // Gone with the connection, key and all.
        assert_eq!(
            registry.post("s1", Some("alice"), &posted(1), max),
            Post::Queued
        );
        registry.deregister("s1", 1);
        assert!(registry.next_posted("s1").is_none());
        assert_eq!(
            registry.forwarded(&key, Some("alice"), &third, max),
            Post::NotHere
        );
        let live = registry.live();
        assert!(live.posted.is_empty() && live.keys.is_empty());
    }
}
