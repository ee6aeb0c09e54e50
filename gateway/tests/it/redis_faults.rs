//! Redis behind a bad network: the real `herald` binary reaches a real
//! `redis-server` over a path whose latency, loss and partitions the test
//! sets ([`FaultyRedis`]: `tc netem` in a network namespace, or a delaying
//! proxy where that cannot be had). The clients' side is never impaired.
//!
//! Whatever the network does, every subscriber's stream tells the truth:
//! per topic, seqs rise one by one from where its `ok` started it, and where
//! the pod could not bridge a gap it says `reset` and goes on from there.
//! Each stream ends at the topic's last published seq. A publish that
//! cannot reach Redis fails with 503 `unavailable` within about
//! `redis.command_timeout`, rather than hanging.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use testkit::{FaultyRedis, Herald, WAIT, eventually};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout, timeout_at};
use tokio_tungstenite::tungstenite::Message;

use crate::pod::HERALD;

/// The pod's `redis.command_timeout`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// How much longer than [`COMMAND_TIMEOUT`] a failing publish may take to
/// be answered: the pod's own work and a busy machine.
const ANSWER_SLACK: Duration = Duration::from_millis(750);

/// The topics every subscriber follows.
const TOPICS: [&str; 3] = ["news", "sport", "weather"];

/// Subscribers, each on its own connection.
const SUBSCRIBERS: usize = 3;

async fn pod(path: &FaultyRedis) -> Herald {
    let timeout = format!("{}ms", COMMAND_TIMEOUT.as_millis());
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", timeout.as_str()),
        ("HERALD_LOG__LEVEL", "info"),
    ];
    Herald::pod(HERALD, &path.url(), &env).await
}

/// One publish over HTTP, and how long its answer took.
struct Published {
    status: u16,
    body: Value,
    took: Duration,
}

async fn publish(addr: SocketAddr, topic: &str, n: u64) -> Published {
    let body = json!({"topic": topic, "data": {"n": n}}).to_string();
    let start = Instant::now();
    let (status, body) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    Published {
        status,
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
        took: start.elapsed(),
    }
}

/// What one subscriber saw of one topic, in order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Msg(u64),
    Reset { epoch: String, seq: u64 },
}

#[derive(Debug, Default)]
struct Stream {
    /// Where the `ok` started the subscription.
    epoch: String,
    start: u64,
    events: Vec<Event>,
}

impl Stream {
    /// The newest seq the subscriber stands at.
    fn at(&self) -> u64 {
        match self.events.last() {
            Some(Event::Msg(seq) | Event::Reset { seq, .. }) => *seq,
            None => self.start,
        }
    }

    /// Checks the stream's story: within an epoch seqs only rise, one by
    /// one; a `reset` may move on (or to another epoch), and the messages
    /// after it continue from its seq; the stream ends at `last`.
    fn check(&self, last: u64) -> Result<(), String> {
        let mut epoch = self.epoch.as_str();
        let mut at = self.start;
        for (i, event) in self.events.iter().enumerate() {
            match event {
                Event::Msg(seq) if *seq == at + 1 => at = *seq,
                Event::Msg(seq) => {
                    return Err(format!("event {i}: seq {seq} after {at}"));
                }
                Event::Reset { epoch: to, seq } => {
                    if to == epoch && *seq < at {
                        return Err(format!("event {i}: a reset back to {seq} from {at}"));
                    }
                    epoch = to;
                    at = *seq;
                }
            }
        }
        if at == last {
            Ok(())
        } else {
            Err(format!("ends at {at}, not at the last seq {last}"))
        }
    }

    fn resets(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Reset { .. }))
            .count()
    }
}

/// What one subscriber saw.
#[derive(Debug, Default)]
struct Seen {
    streams: BTreeMap<String, Stream>,
    /// Anything else: an `err`, a close, a message that is not JSON.
    problems: Vec<String>,
}

/// A subscriber to every topic in [`TOPICS`] on one connection, reading
/// until its streams reach the last seqs (once the test knows them) or
/// `deadline`.
async fn subscriber(
    url: String,
    mut last: watch::Receiver<Option<BTreeMap<String, u64>>>,
    deadline: Instant,
) -> (mpsc::Receiver<()>, JoinHandle<Seen>) {
    let (subscribed, ready) = mpsc::channel(1);
    let task = tokio::spawn(async move {
        let mut seen = Seen::default();
        let connected = timeout_at(deadline, tokio_tungstenite::connect_async(url)).await;
        let Ok(Ok((mut ws, _))) = connected else {
            seen.problems.push("no connection".into());
            return seen;
        };
        let mut commands = vec![json!({"op": "hello"})];
        for (id, topic) in TOPICS.iter().enumerate() {
            commands.push(json!({"op": "sub", "id": id, "topic": topic}));
        }
        for command in commands {
            if ws.send(Message::text(command.to_string())).await.is_err() {
                seen.problems.push("send failed".into());
                return seen;
            }
        }
        let mut subscribed = Some(subscribed);
        loop {
            let done = last.borrow().as_ref().is_some_and(|last| {
                last.iter()
                    .all(|(topic, seq)| seen.streams.get(topic).is_some_and(|s| s.at() >= *seq))
            });
            if done {
                let _ = timeout(Duration::from_secs(1), ws.close(None)).await;
                return seen;
            }
            let next = tokio::select! {
                // The last seqs became known: look again.
                changed = last.changed(), if last.borrow().is_none() => {
                    if changed.is_err() {
                        return seen;
                    }
                    continue;
                }
                next = timeout_at(deadline, ws.next()) => next,
            };
            let text = match next {
                Err(_) => return seen,
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Close(frame)))) => {
                    seen.problems.push(format!("closed: {frame:?}"));
                    return seen;
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(e))) => {
                    seen.problems.push(format!("connection: {e}"));
                    return seen;
                }
                Ok(None) => {
                    seen.problems.push("connection ended".into());
                    return seen;
                }
            };
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                seen.problems.push(format!("not JSON: {text}"));
                continue;
            };
            let topic = message["topic"].as_str().unwrap_or_default().to_owned();
            let seq = message["seq"].as_u64();
            let epoch = message["epoch"].as_str().map(str::to_owned);
            match (message["op"].as_str(), seq, epoch) {
                (Some("welcome"), _, _) => {}
                (Some("ok"), Some(start), Some(epoch)) => {
                    seen.streams.insert(
                        topic,
                        Stream {
                            epoch,
                            start,
                            events: Vec::new(),
                        },
                    );
                    if seen.streams.len() == TOPICS.len()
                        && let Some(subscribed) = subscribed.take()
                    {
                        let _ = subscribed.send(()).await;
                    }
                }
                (Some("msg"), Some(seq), _) => match seen.streams.get_mut(&topic) {
                    Some(stream) => stream.events.push(Event::Msg(seq)),
                    None => seen.problems.push(format!("a msg before its ok: {text}")),
                },
                (Some("reset"), Some(seq), Some(epoch)) => match seen.streams.get_mut(&topic) {
                    Some(stream) => stream.events.push(Event::Reset { epoch, seq }),
                    None => seen.problems.push(format!("a reset before its ok: {text}")),
                },
                _ => seen.problems.push(format!("unexpected: {text}")),
            }
        }
    });
    (ready, task)
}

/// [`SUBSCRIBERS`] subscribers at `herald`, each subscribed to every topic.
struct Audience {
    last: watch::Sender<Option<BTreeMap<String, u64>>>,
    tasks: Vec<JoinHandle<Seen>>,
    deadline: Instant,
}

impl Audience {
    /// Subscribers that give up at `deadline`; returns once all have their `ok`s.
    async fn subscribed(herald: &Herald, deadline: Instant) -> Self {
        let (last, watched) = watch::channel(None);
        let mut tasks = Vec::new();
        for _ in 0..SUBSCRIBERS {
            let (mut ready, task) = subscriber(herald.ws_url(), watched.clone(), deadline).await;
            let ok = timeout_at(deadline, ready.recv()).await;
            assert!(matches!(ok, Ok(Some(()))), "a subscriber got its `ok`s");
            tasks.push(task);
        }
        Self {
            last,
            tasks,
            deadline,
        }
    }

    /// Tells the subscribers the topics' last seqs; checks what each saw.
    /// Returns the resets seen.
    async fn finish(self, last: BTreeMap<String, u64>) -> usize {
        self.last.send_replace(Some(last.clone()));
        let mut failures = Vec::new();
        let mut resets = 0;
        for (i, task) in self.tasks.into_iter().enumerate() {
            let seen = timeout_at(self.deadline + Duration::from_secs(5), task)
                .await
                .expect("a subscriber gives up by its deadline")
                .expect("a subscriber task");
            for problem in &seen.problems {
                failures.push(format!("subscriber {i}: {problem}"));
            }
            for (topic, seq) in &last {
                match seen.streams.get(topic) {
                    Some(stream) => {
                        resets += stream.resets();
                        if let Err(e) = stream.check(*seq) {
                            failures.push(format!("subscriber {i}, {topic}: {e}: {stream:?}"));
                        }
                    }
                    None => failures.push(format!("subscriber {i}: not subscribed to {topic}")),
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        resets
    }
}

/// Publishes to `topic` every `every` until `stop` is set (each publish
/// waits for the one before); every answer, in order.
fn publisher(
    addr: SocketAddr,
    topic: &'static str,
    every: Duration,
    stop: watch::Receiver<bool>,
) -> JoinHandle<Vec<Published>> {
    tokio::spawn(async move {
        let mut answers = Vec::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0;
        while !*stop.borrow() {
            tick.tick().await;
            n += 1;
            answers.push(publish(addr, topic, n).await);
        }
        answers
    })
}

/// The last seq of each topic: its last successful publish's (a publish
/// that failed may still have reached Redis, but an earlier seq).
fn last_seqs(answers: &BTreeMap<&str, Vec<Published>>) -> BTreeMap<String, u64> {
    answers
        .iter()
        .map(|(topic, answers)| {
            let last = answers
                .iter()
                .filter(|a| a.status == 200)
                .filter_map(|a| a.body["seq"].as_u64())
                .max()
                .unwrap_or_else(|| panic!("no publish to {topic} went through"));
            (topic.to_string(), last)
        })
        .collect()
}

/// Every answer is a success or a 503 `unavailable`, and none took longer
/// than the command timeout allows; the successes' seqs rise.
fn check_answers(topic: &str, answers: &[Published]) {
    let mut seq = 0;
    for (i, a) in answers.iter().enumerate() {
        assert!(
            a.took < COMMAND_TIMEOUT + ANSWER_SLACK,
            "{topic}: publish {i} answered after {:?}: {} {}",
            a.took,
            a.status,
            a.body
        );
        match a.status {
            200 => {
                let next = a.body["seq"].as_u64().expect("a seq");
                assert!(next > seq, "{topic}: seq {next} after {seq}");
                seq = next;
            }
            503 => assert_eq!(a.body["code"], "unavailable", "{topic}: {}", a.body),
            other => panic!("{topic}: publish {i}: {other} {}", a.body),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_200ms_to_redis_every_message_arrives_in_order() {
    let path = FaultyRedis::start().await.expect("redis behind a path");
    path.delay(Duration::from_millis(200));
    let herald = pod(&path).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let audience = Audience::subscribed(&herald, deadline).await;

    // Each topic's publishes one after another, the topics side by side.
    let publishes = TOPICS.map(|topic| {
        let addr = herald.addr;
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            for n in 1..=10 {
                let a = publish(addr, topic, n).await;
                assert_eq!(a.status, 200, "{topic}: {}", a.body);
                seqs.push(a.body["seq"].as_u64().expect("a seq"));
            }
            (topic, seqs)
        })
    });
    let mut last = BTreeMap::new();
    for publishing in publishes {
        let (topic, seqs) = publishing.await.expect("a publisher");
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "{topic}");
        last.insert(topic.to_owned(), 10);
    }
    let resets = audience.finish(last).await;
    assert_eq!(resets, 0, "nothing was lost, so nothing was reset");
    eprintln!("path: {}", path.kind());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_partition_publishes_fail_fast_and_streams_end_complete_or_reset() {
    const PARTITION: Duration = Duration::from_secs(3);
    let path = FaultyRedis::start().await.expect("redis behind a path");
    let herald = pod(&path).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let audience = Audience::subscribed(&herald, deadline).await;

    let (stop, stopped) = watch::channel(false);
    let publishers: Vec<_> = TOPICS
        .iter()
        .map(|topic| {
            let every = Duration::from_millis(50);
            (
                *topic,
                publisher(herald.addr, topic, every, stopped.clone()),
            )
        })
        .collect();
    sleep(Duration::from_secs(1)).await;
    path.partition();
    let cut = Instant::now();
    sleep(PARTITION).await;
    path.heal();
    let healed = Instant::now();
    sleep(Duration::from_secs(1)).await;
    stop.send_replace(true);

    let mut answers = BTreeMap::new();
    for (topic, publishing) in publishers {
        let got = timeout(Duration::from_secs(10), publishing)
            .await
            .expect("the publisher stops")
            .expect("a publisher");
        check_answers(topic, &got);
        let failed = got.iter().filter(|a| a.status == 503).count();
        assert!(
            failed > 0,
            "{topic}: some publishes failed during the partition"
        );
        answers.insert(topic, got);
    }
    // One more each, once the pod reaches Redis again (with netem, TCP may
    // wait out its retransmission backoff): where every stream must end.
    for topic in TOPICS {
        let a = eventually(WAIT, || async {
            let a = publish(herald.addr, topic, 0).await;
            if a.status == 200 {
                Ok(a)
            } else {
                Err(format!("{topic}: {} {}", a.status, a.body))
            }
        })
        .await;
        answers.entry(topic).or_default().push(a);
    }
    let last = last_seqs(&answers);
    let resets = audience.finish(last).await;
    eprintln!(
        "path: {}; partition {:?}, healed {:?} ago; resets: {resets}",
        path.kind(),
        healed - cut,
        healed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_15_percent_loss_to_redis_streams_stay_whole() {
    let path = FaultyRedis::start().await.expect("redis behind a path");
    let herald = pod(&path).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let audience = Audience::subscribed(&herald, deadline).await;

    path.loss(15.0);
    let (stop, stopped) = watch::channel(false);
    let publishers: Vec<_> = TOPICS
        .iter()
        .map(|topic| {
            let every = Duration::from_millis(50);
            (
                *topic,
                publisher(herald.addr, topic, every, stopped.clone()),
            )
        })
        .collect();
    sleep(Duration::from_secs(6)).await;
    path.loss(0.0);
    stop.send_replace(true);

    let mut answers = BTreeMap::new();
    for (topic, publishing) in publishers {
        let got = timeout(Duration::from_secs(10), publishing)
            .await
            .expect("the publisher stops")
            .expect("a publisher");
        check_answers(topic, &got);
        answers.insert(topic, got);
    }
    // One more each, past the loss: where every stream must end.
    for topic in TOPICS {
        let a = publish(herald.addr, topic, 0).await;
        assert_eq!(a.status, 200, "{topic} after the loss: {}", a.body);
        answers.entry(topic).or_default().push(a);
    }
    let last = last_seqs(&answers);
    let published: usize = answers
        .values()
        .flatten()
        .filter(|a| a.status == 200)
        .count();
    let resets = audience.finish(last).await;
    eprintln!(
        "path: {}; {published} publishes went through; resets: {resets}",
        path.kind()
    );
}

/// With Redis 200 ms away, a pod that must read 500 watched topics again
/// after losing its pub/sub connection keeps delivering the one that is
/// published meanwhile: the reads go out in pipelines, beside the channel,
/// not one round trip per topic before anything else moves (that took 500 x
/// 200 ms here, and 20,000 x 200 ms on a real pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_of_many_topics_through_a_slow_redis_does_not_stop_the_others() {
    const WATCHED: u64 = 500;
    let path = FaultyRedis::start().await.expect("a faulty path to Redis");
    let timeout = format!("{}ms", COMMAND_TIMEOUT.as_millis());
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", timeout.as_str()),
        ("HERALD_SESSION__MAX_SUBSCRIPTIONS", "1000"),
        ("HERALD_WEBSOCKET__COMMANDS_PER_SECOND", "100000"),
        ("HERALD_WEBSOCKET__COMMANDS_BURST", "100000"),
    ];
    let herald = Herald::pod(HERALD, &path.url(), &env).await;
    let mut many = testkit::Client::connect_url(&herald.ws_url()).await;
    many.hello(None).await;
    for n in 0..WATCHED {
        many.sub(n + 1, &format!("quiet-{n}")).await;
    }
    let mut canary = testkit::Client::subscriber(&herald.ws_url(), "canary").await;
    path.delay(Duration::from_millis(200));
    path.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    // Published after the kill: arrives once the pod has its channel back,
    // whatever the 500 other topics' reads are doing.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    let delivered = loop {
        n += 1;
        let published = publish(herald.addr, "canary", n).await;
        if published.status == 200 {
            let got = tokio::time::timeout(Duration::from_millis(500), canary.recv()).await;
            if let Ok(message) = got {
                assert_eq!(message["op"], "msg", "{message}");
                break true;
            }
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    assert!(
        delivered,
        "no canary delivered within 15 s of the pub/sub kill"
    );
}
