//! Changes without a rollout: the API keys rotate (a keys file that changes,
//! or SIGHUP) and the log level rises (SIGHUP) while every client stays
//! connected. Before, both were read once at start, and the config checksum
//! rolled the whole fleet for either.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::json;
use testkit::{Client, Herald, WAIT, eventually};

use crate::pod::{HERALD, path};

/// A directory of its own under the temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("herald-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Replaces `name` at once, as a Secret's volume or an editor does.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        let next = self.0.join(format!(".{name}.next"));
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &path).unwrap();
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Publishes with `key`; the HTTP status.
async fn publish(addr: SocketAddr, topic: &str, key: &str, n: u64) -> u16 {
    let body = json!({"topic": topic, "data": n}).to_string();
    let auth = format!("Bearer {key}");
    let headers = [("authorization", auth.as_str())];
    testkit::http(addr, "POST", "/v1/publish", &headers, body.as_bytes())
        .await
        .0
}

/// Waits until `old` is refused and `new` accepted (probing a topic nobody
/// subscribes to).
async fn rotated(herald: &Herald, old: &str, new: &str) {
    eventually(WAIT, || async {
        let statuses = (
            publish(herald.addr, "probe", old, 0).await,
            publish(herald.addr, "probe", new, 0).await,
        );
        (statuses == (401, 200))
            .then_some(())
            .ok_or(format!("{old}, {new}: {statuses:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_keys_file_applies_without_a_restart_and_clients_stay() {
    let dir = Dir::new("keys-file");
    let keys = dir.write("keys", "# the backend's key\nk1\n");
    let herald = Herald::start(HERALD, &[("HERALD_HTTP__API_KEYS_FILE", path(&keys))], &[]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    assert_eq!(publish(herald.addr, "news", "k1", 1).await, 200);
    assert_eq!(client.msg().await.1, 1);
    assert_eq!(publish(herald.addr, "news", "k2", 0).await, 401);

    dir.write("keys", "k2\n");
    rotated(&herald, "k1", "k2").await;
    assert_eq!(publish(herald.addr, "news", "k2", 2).await, 200);
    // The same connection: nobody reconnected.
    assert_eq!(client.msg().await.1, 2);
    assert_eq!(
        testkit::metric(herald.addr, "herald_connections_opened_total").await,
        1.0
    );

    // An emptied file does not open the API: the keys in use stay.
    dir.write("keys", "\n");
    eventually(WAIT, || async {
        herald.log().contains("API keys not reloaded")
    })
    .await;
    assert_eq!(publish(herald.addr, "probe", "k2", 0).await, 200);
    assert_eq!(publish(herald.addr, "probe", "anything", 0).await, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_the_log_level_and_keys_and_names_what_needs_a_restart() {
    let dir = Dir::new("sighup");
    let config = dir.write(
        "herald.toml",
        "[http]\napi_keys = [\"k1\"]\n[log]\nlevel = \"info\"\n",
    );
    let herald = Herald::start(HERALD, &[], &["--config", path(&config)]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    assert_eq!(publish(herald.addr, "news", "k1", 1).await, 200);
    assert_eq!(client.msg().await.1, 1);
    // A rejected command is logged at debug only: not yet.
    let bad = json!({"op": "sub", "id": 9, "topic": "not a topic!"});
    client.send(bad.clone()).await;
    client.expect("err").await;

    dir.write(
        "herald.toml",
        "[http]\napi_keys = [\"k2\"]\n[log]\nlevel = \"debug\"\n[websocket]\nmax_connections = 5\n",
    );
    herald.sighup();
    // (The file's watcher may see the change first: the SIGHUP still says
    // what needs a restart, as its own reload.)
    eventually(WAIT, || async {
        herald
            .log()
            .lines()
            .any(|l| l.contains("need a restart") && l.contains("SIGHUP"))
    })
    .await;
    let log = herald.log();
    assert!(log.contains("log level changed"), "{log}");
    assert!(log.contains("sections=websocket"), "{log}");
    assert!(!log.contains("command rejected"), "at info:\n{log}");
    rotated(&herald, "k1", "k2").await;
    assert_eq!(publish(herald.addr, "news", "k2", 2).await, 200);
    assert_eq!(client.msg().await.1, 2);

    // At debug now, on the connection that was open all along.
    client.send(bad).await;
    client.expect("err").await;
    eventually(WAIT, || async { herald.log().contains("command rejected") }).await;
    assert_eq!(
        testkit::metric(herald.addr, "herald_connections_opened_total").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_config_file_applies_its_log_level_without_a_signal() {
    let dir = Dir::new("watched");
    let config = dir.write("herald.toml", "[log]\nlevel = \"info\"\n");
    let herald = Herald::start(HERALD, &[], &["--config", path(&config)]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    // As a ConfigMap's volume is updated: the file changes, no signal comes.
    dir.write("herald.toml", "[log]\nlevel = \"debug\"\n");
    eventually(WAIT, || async {
        herald
            .log()
            .lines()
            .any(|l| l.contains("log level changed") && l.contains("configuration file changed"))
    })
    .await;
    client
        .send(json!({"op": "sub", "id": 9, "topic": "not a topic!"}))
        .await;
    client.expect("err").await;
    eventually(WAIT, || async { herald.log().contains("command rejected") }).await;
}

/// Waits for the `n`th refused reload whose reason reads `why`, and checks
/// it was counted under `result`.
async fn refused(herald: &Herald, why: &str, result: &str, n: usize) {
    eventually(WAIT, || async {
        let log = herald.log();
        let seen = log
            .lines()
            .filter(|l| l.contains("configuration not reloaded") && l.contains(why))
            .count();
        (seen >= n).then_some(()).ok_or(format!("{seen} of {n}"))
    })
    .await;
    let metric = format!("herald_config_reloads_total{{result=\"{result}\"}}");
    assert!(
        testkit::metric(herald.addr, &metric).await >= 1.0,
        "{metric}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_or_half_written_config_file_never_opens_the_api() {
    let dir = Dir::new("truncated");
    let text = "[log]\nlevel = \"info\"\n[http]\napi_keys = [\"k1\"]\n";
    let config = dir.write("herald.toml", text);
    let herald = Herald::start(HERALD, &[], &["--config", path(&config)]).await;
    assert_eq!(publish(herald.addr, "probe", "k1", 0).await, 200);
    assert_eq!(publish(herald.addr, "probe", "", 0).await, 401);

    // Truncated in place, as a writer does before it writes: an empty file
    // is all defaults (no key) at start, and refused on a reload.
    std::fs::write(&config, "").unwrap();
    refused(&herald, "the configuration file is empty", "empty", 1).await;
    assert_eq!(publish(herald.addr, "probe", "", 0).await, 401);
    assert_eq!(publish(herald.addr, "probe", "k1", 0).await, 200);

    // Cut mid-write: it does not parse.
    std::fs::write(&config, "[log]\nlevel = \"info\"\n[http]\napi_keys = [\"k").unwrap();
    refused(&herald, "it does not load", "unreadable", 1).await;
    assert_eq!(publish(herald.addr, "probe", "", 0).await, 401);

    // Cut at a line's end: it parses, with no key left.
    std::fs::write(&config, "[log]\nlevel = \"info\"\n").unwrap();
    refused(&herald, "would remove every API key", "opens_api", 1).await;
    assert_eq!(publish(herald.addr, "probe", "", 0).await, 401);
    assert_eq!(publish(herald.addr, "probe", "k1", 0).await, 200);

    // Meant: said so.
    std::fs::write(
        &config,
        "[log]\nlevel = \"info\"\n[http]\nopen_api = true\n",
    )
    .unwrap();
    eventually(WAIT, || async {
        (publish(herald.addr, "probe", "", 0).await == 200)
            .then_some(())
            .ok_or("still keyed")
    })
    .await;
    let applied = "herald_config_reloads_total{result=\"applied\"}";
    assert!(testkit::metric(herald.addr, applied).await >= 1.0);
}
