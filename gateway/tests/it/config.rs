//! Configuration as an operator writes it: the sample file loads with the
//! values it documents; `HERALD_*` variables set any key and win over the
//! file, while the variables Kubernetes injects are ignored; a bad value is
//! refused with an error that names its key, and the binary then exits 64
//! before binding anything.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gateway::Config;
use gateway::config::{ConfigError, EXIT_BAD_CONFIG, LogFormat};

use crate::pod::run as herald;

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/herald.sample.toml")
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A TOML file under the temp dir, removed on drop.
struct TempToml(PathBuf);

impl TempToml {
    fn new(text: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "herald-config-test-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).expect("write the temp config");
        Self(path)
    }
}

impl Drop for TempToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load_file(text: &str) -> Result<Config, ConfigError> {
    let file = TempToml::new(text);
    Config::load(Some(&file.0), std::iter::empty())
}

fn load_env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(None, env(vars))
}

/// The error's text, which must name `key`.
#[track_caller]
fn assert_names(result: Result<Config, ConfigError>, key: &str) {
    match result {
        Ok(config) => panic!("expected an error naming `{key}`, got {config:?}"),
        Err(e) => assert!(e.to_string().contains(key), "the error names `{key}`: {e}"),
    }
}

#[test]
fn the_sample_file_loads_with_the_documented_values() {
    let config = Config::load(Some(&sample()), std::iter::empty()).expect("the sample loads");
    assert_eq!(config.listen.to_string(), "0.0.0.0:8080");
    let ws = &config.websocket;
    assert_eq!(ws.max_message_bytes, 65536);
    assert_eq!(ws.ping_interval, Duration::from_secs(25));
    assert_eq!(ws.pong_timeout, Duration::from_secs(10));
    assert_eq!(ws.write_timeout, Duration::from_secs(30));
    assert_eq!(ws.handshake_timeout, Duration::from_secs(10));
    assert_eq!(ws.close_timeout, Duration::from_secs(2));
    assert_eq!(ws.message_timeout, Duration::from_secs(10));
    assert_eq!(ws.max_connections, 10000);
    assert_eq!(ws.max_bad_commands, 10);
    assert!(ws.allowed_origins.is_empty());
    assert_eq!((config.queue.frames, config.queue.bytes), (1024, 1_048_576));
    let replay = &config.replay;
    assert_eq!(
        (replay.max_concurrent, replay.wait),
        (64, Duration::from_secs(2))
    );
    assert_eq!((replay.page_messages, replay.page_bytes), (64, 262_144));
    assert_eq!(replay.catch_up_reads_per_second, 1000);
    assert_eq!(config.session.resume_window, Duration::from_secs(120));
    assert_eq!(config.session.max_subscriptions, 1000);
    assert!(config.http.api_keys.is_empty());
    assert_eq!(config.http.api_keys_file, "");
    assert_eq!(config.redis.prefix, "herald");
    assert_eq!(config.http.max_body_bytes, 65536);
    assert_eq!(config.shutdown.drain_timeout, Duration::from_secs(10));
    assert_eq!(config.log.level, "info");
    assert_eq!(config.log.format, LogFormat::Text);

    let chat = &config.namespaces["chat"];
    assert_eq!(chat.publish, router::Publish::Authenticated);
    assert_eq!(chat.history_size, 500);
    assert_eq!(chat.history_ttl, Duration::from_secs(600));
    let default = &config.namespaces["default"];
    assert_eq!(default.publish, router::Publish::Nobody);
    assert_eq!(default.subscribe, router::Subscribe::Authenticated);
    assert!(!default.personal);
    assert_eq!(
        (default.history_size, default.history_ttl),
        (100, Duration::from_secs(300))
    );
}

#[test]
fn a_namespaces_lag_policy_is_read_and_catch_up_needs_history() {
    let config = load_file(
        "[namespaces.live]\nhistory_size = 0\non_lag = \"drop_newest\"\n\
         [namespaces.feed]\nhistory_size = 50\n",
    )
    .expect("valid");
    let (live, feed) = (&config.namespaces["live"], &config.namespaces["feed"]);
    assert_eq!(live.on_lag(), Some(router::OnLag::DropNewest));
    assert_eq!(
        feed.on_lag(),
        Some(router::OnLag::CatchUp),
        "history: catch_up"
    );
    let bare = router::NamespaceSettings {
        history_size: 0,
        ..Default::default()
    };
    assert_eq!(bare.on_lag(), None, "no history: queue.overflow decides");
    assert_names(
        load_file("[namespaces.live]\nhistory_size = 0\non_lag = \"catch_up\"\n"),
        "namespaces",
    );
    assert_names(
        load_file("[namespaces.live]\non_lag = \"later\"\n"),
        "on_lag",
    );
}

#[test]
fn the_sample_file_documents_the_defaults() {
    let sample = Config::load(Some(&sample()), std::iter::empty()).expect("the sample loads");
    let defaults = Config::load(None, std::iter::empty()).expect("the defaults load");
    // Everything but the namespaces (the sample adds `chat`) is the default.
    let strip = |c: &Config| {
        let mut c = c.clone();
        c.namespaces.clear();
        format!("{c:?}")
    };
    assert_eq!(strip(&sample), strip(&defaults));
}

#[test]
fn environment_variables_set_keys() {
    let config = load_env(&[
        ("HERALD_LISTEN", "127.0.0.1:9000"),
        ("HERALD_WEBSOCKET__PING_INTERVAL", "3s"),
        ("HERALD_HTTP__API_KEYS", "k1,k2"),
        ("HERALD_SHUTDOWN__DRAIN_TIMEOUT", "1500ms"),
        ("HERALD_QUEUE__OVERFLOW", "drop_newest"),
        ("HERALD_LOG__FORMAT", "json"),
        ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
    ])
    .expect("loads");
    assert_eq!(config.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(config.websocket.ping_interval, Duration::from_secs(3));
    assert_eq!(config.http.api_keys, ["k1", "k2"]);
    assert_eq!(config.shutdown.drain_timeout, Duration::from_millis(1500));
    assert_eq!(format!("{:?}", config.queue.overflow), "DropNewest");
    assert_eq!(config.log.format, LogFormat::Json);
    // A namespace made from the environment alone: its other settings are defaulted.
    let chat = &config.namespaces["chat"];
    assert_eq!(chat.publish, router::Publish::Authenticated);
    assert_eq!(
        chat.history_size,
        router::NamespaceSettings::default().history_size
    );
}

#[test]
fn one_api_key_from_the_environment_is_a_list_of_one() {
    let config = load_env(&[("HERALD_HTTP__API_KEYS", "only")]).expect("loads");
    assert_eq!(config.http.api_keys, ["only"]);
}

#[test]
fn api_keys_that_look_like_numbers_stay_keys() {
    // A key is text, whatever it looks like: digits, an exponent, `true`.
    for key in ["123456", "1e10", "true", "nan"] {
        let config = load_env(&[("HERALD_HTTP__API_KEYS", key)])
            .unwrap_or_else(|e| panic!("HERALD_HTTP__API_KEYS={key}: {e}"));
        assert_eq!(config.http.api_keys, [key]);
    }
    let config = load_env(&[("HERALD_WEBSOCKET__ALLOWED_ORIGINS", "1234")])
        .unwrap_or_else(|e| panic!("HERALD_WEBSOCKET__ALLOWED_ORIGINS=1234: {e}"));
    assert_eq!(config.websocket.allowed_origins, ["1234"]);
}

#[test]
fn the_environment_wins_over_the_file() {
    let file = TempToml::new(
        "listen = \"127.0.0.1:7000\"\n\
         [websocket]\nping_interval = \"7s\"\nmax_connections = 7\n\
         [namespaces.chat]\npublish = \"nobody\"\nhistory_size = 7\n",
    );
    let config = Config::load(
        Some(&file.0),
        env(&[
            ("HERALD_LISTEN", "127.0.0.1:9000"),
            ("HERALD_WEBSOCKET__PING_INTERVAL", "3s"),
            ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
        ]),
    )
    .expect("loads");
    assert_eq!(config.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(config.websocket.ping_interval, Duration::from_secs(3));
    // What the environment does not set stays as the file says.
    assert_eq!(config.websocket.max_connections, 7);
    assert_eq!(
        config.namespaces["chat"].publish,
        router::Publish::Authenticated
    );
    assert_eq!(config.namespaces["chat"].history_size, 7);
}

#[test]
fn variables_that_are_not_herald_keys_are_ignored() {
    // What Kubernetes injects for a Service named `herald`, plus unrelated
    // variables; none is a configuration key.
    let config = load_env(&[
        ("HERALD_PORT", "tcp://10.0.0.1:80"),
        ("HERALD_PORT_80_TCP", "tcp://10.0.0.1:80"),
        ("HERALD_PORT_80_TCP_ADDR", "10.0.0.1"),
        ("HERALD_PORT_80_TCP_PORT", "80"),
        ("HERALD_PORT_80_TCP_PROTO", "tcp"),
        ("HERALD_SERVICE_HOST", "10.0.0.1"),
        ("HERALD_SERVICE_PORT", "80"),
        ("PATH", "/usr/bin"),
        ("LISTEN", "1.2.3.4:5"),
    ])
    .expect("loads");
    assert_eq!(config.listen.to_string(), "0.0.0.0:8080");
}

#[test]
fn bad_values_from_the_environment_name_their_key() {
    assert_names(
        load_env(&[("HERALD_WEBSOCKET__PING_INTERVAL", "abc")]),
        "websocket.ping_interval",
    );
    assert_names(
        load_env(&[("HERALD_WEBSOCKET__PING_INTERVAL", "0s")]),
        "websocket.ping_interval",
    );
    assert_names(
        load_env(&[("HERALD_WEBSOCKET__MESSAGE_TIMEOUT", "0s")]),
        "websocket.message_timeout",
    );
    assert_names(
        load_env(&[("HERALD_SHUTDOWN__DRAIN_TIMEOUT", "soon")]),
        "shutdown.drain_timeout",
    );
    assert_names(
        load_env(&[("HERALD_WEBSOCKET__MAX_CONNECTIONS", "many")]),
        "websocket.max_connections",
    );
    assert_names(
        load_env(&[("HERALD_WEBSOCKET__MAX_CONNECTIONS", "0")]),
        "websocket.max_connections",
    );
    assert_names(load_env(&[("HERALD_LISTEN", "not an address")]), "listen");
    assert_names(load_env(&[("HERALD_QUEUE__BYTES", "1000")]), "queue.bytes");
    assert_names(
        load_env(&[("HERALD_QUEUE__OVERFLOW", "explode")]),
        "queue.overflow",
    );
    assert_names(
        load_env(&[("HERALD_HTTP__API_KEYS", "k1,,k2")]),
        "http.api_keys",
    );
}

#[test]
fn bad_values_in_a_file_name_their_key() {
    assert_names(
        load_file("[websocket]\nping_interval = \"abc\"\n"),
        "websocket.ping_interval",
    );
    assert_names(
        load_file("[websocket]\nmax_connections = \"many\"\n"),
        "websocket.max_connections",
    );
    assert_names(load_file("[queue]\nbytes = 10\n"), "queue.bytes");
    assert_names(
        load_file("[namespaces.\"Bad Name\"]\nhistory_size = 1\n"),
        "namespaces",
    );
}

#[test]
fn unknown_keys_in_a_file_are_refused_by_name() {
    assert_names(load_file("lisen = \"127.0.0.1:9000\"\n"), "lisen");
    assert_names(
        load_file("[websocket]\nping_intervall = \"3s\"\n"),
        "ping_intervall",
    );
    assert_names(
        load_file("[namespaces.chat]\nclient_publsh = true\n"),
        "client_publsh",
    );
}

#[test]
fn replay_bounds_must_let_a_replay_run_and_move_on() {
    for (var, key) in [
        ("HERALD_REPLAY__MAX_CONCURRENT", "replay.max_concurrent"),
        ("HERALD_REPLAY__PAGE_MESSAGES", "replay.page_messages"),
        ("HERALD_REPLAY__PAGE_BYTES", "replay.page_bytes"),
    ] {
        assert_names(load_env(&[(var, "0")]), key);
    }
    assert_names(load_env(&[("HERALD_REPLAY__WAIT", "0s")]), "replay.wait");
    assert_names(
        load_env(&[("HERALD_REPLAY__CATCH_UP_READS_PER_SECOND", "0")]),
        "replay.catch_up_reads_per_second",
    );
    assert_names(load_file("[replay]\npage = 1\n"), "page");
    let config = load_env(&[
        ("HERALD_REPLAY__MAX_CONCURRENT", "8"),
        ("HERALD_REPLAY__WAIT", "250ms"),
    ])
    .expect("valid");
    assert_eq!(
        (config.replay.max_concurrent, config.replay.wait),
        (8, Duration::from_millis(250))
    );
}

#[test]
fn a_file_that_is_not_toml_or_not_there_is_an_error() {
    assert!(load_file("this is [not toml").is_err());
    let missing = std::env::temp_dir().join(format!(
        "herald-config-test-{}-missing.toml",
        std::process::id()
    ));
    assert!(Config::load(Some(&missing), std::iter::empty()).is_err());
}

#[test]
fn the_binary_refuses_a_bad_value_with_exit_64_naming_the_key() {
    // Were the value taken, herald would serve on a loopback port until
    // killed by the timeout, not on 0.0.0.0.
    let output = herald(
        &[],
        &[
            ("HERALD_WEBSOCKET__PING_INTERVAL", "abc"),
            ("HERALD_LISTEN", "127.0.0.1:0"),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(EXIT_BAD_CONFIG),
        "stderr: {stderr}"
    );
    assert_eq!(EXIT_BAD_CONFIG, 64);
    assert!(
        stderr.contains("websocket.ping_interval"),
        "stderr: {stderr}"
    );
    assert!(
        !stderr.contains("listening"),
        "nothing was started: {stderr}"
    );
}

#[test]
fn a_duration_too_long_for_the_clock_is_refused_naming_its_key() {
    // Issue #21's class of defect: a deadline added to the clock panics in
    // a connection's task when the setting is beyond what it can hold.
    for (var, key) in [
        ("HERALD_WEBSOCKET__PING_INTERVAL", "websocket.ping_interval"),
        ("HERALD_WEBSOCKET__HELLO_TIMEOUT", "websocket.hello_timeout"),
        ("HERALD_SESSION__RESUME_WINDOW", "session.resume_window"),
    ] {
        match load_env(&[(var, "1000000000years")]) {
            Err(e) => assert!(e.to_string().contains(key), "{var}: {e}"),
            Ok(_) => panic!("{var}=1000000000years was taken"),
        }
        assert!(load_env(&[(var, "300days")]).is_ok(), "{var}=300days");
    }
}

#[test]
fn the_binary_refuses_an_unknown_argument_with_exit_64() {
    let output = herald(&["--confg", "x.toml"], &[]);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--confg"));
}

#[test]
fn the_binary_prints_its_usage() {
    let output = herald(&["--help"], &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("Usage"), "{stdout}");
    assert!(stdout.contains("--config"), "{stdout}");
}

#[test]
fn the_binary_checks_the_sample_file() {
    let sample = sample();
    let output = herald(
        &[
            "--config",
            sample.to_str().expect("a UTF-8 path"),
            "--check",
        ],
        &[],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // --check with a bad variable fails as a start would.
    let output = herald(
        &[
            "--config",
            sample.to_str().expect("a UTF-8 path"),
            "--check",
        ],
        &[("HERALD_QUEUE__BYTES", "10")],
    );
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("queue.bytes"));
}

#[test]
fn the_grpc_listener_is_configured_like_the_others() {
    let defaults = load_env(&[]).expect("the defaults load");
    assert_eq!(
        defaults.grpc.listen.to_string(),
        gateway::config::DEFAULT_GRPC_LISTEN
    );
    let config = load_env(&[("HERALD_GRPC__LISTEN", "127.0.0.1:9999")]).expect("loads");
    assert_eq!(config.grpc.listen.to_string(), "127.0.0.1:9999");
    let config = load_file("[grpc]\nlisten = \"127.0.0.1:9998\"\n").expect("loads");
    assert_eq!(config.grpc.listen.to_string(), "127.0.0.1:9998");

    assert_names(
        load_env(&[("HERALD_GRPC__LISTEN", "nowhere")]),
        "grpc.listen",
    );
    assert_names(
        load_env(&[
            ("HERALD_LISTEN", "127.0.0.1:9000"),
            ("HERALD_GRPC__LISTEN", "127.0.0.1:9000"),
        ]),
        "grpc.listen",
    );
    assert_names(load_file("[grpc]\nlisen = \"127.0.0.1:1\"\n"), "lisen");
}

#[test]
fn the_grpc_limits_are_read_and_checked() {
    let defaults = load_env(&[]).expect("the defaults load");
    assert_eq!(defaults.grpc.max_concurrent_streams, 64);
    assert_eq!(defaults.grpc.max_connections_per_ip, 128);
    let config = load_file(
        "[grpc]\nmax_concurrent_streams = 8\nmax_connections = 10\n\
         max_connections_per_ip = 0\nkeepalive_interval = \"1m\"\nkeepalive_timeout = \"5s\"\n",
    )
    .expect("loads");
    assert_eq!(config.grpc.max_concurrent_streams, 8);
    assert_eq!(config.grpc.max_connections, 10);
    assert_eq!(config.grpc.max_connections_per_ip, 0);
    assert_eq!(config.grpc.keepalive_interval, Duration::from_secs(60));
    assert_eq!(config.grpc.keepalive_timeout, Duration::from_secs(5));
    for (var, value, key) in [
        (
            "HERALD_GRPC__MAX_CONCURRENT_STREAMS",
            "0",
            "grpc.max_concurrent_streams",
        ),
        ("HERALD_GRPC__MAX_CONNECTIONS", "0", "grpc.max_connections"),
        (
            "HERALD_GRPC__KEEPALIVE_INTERVAL",
            "0s",
            "grpc.keepalive_interval",
        ),
        (
            "HERALD_GRPC__KEEPALIVE_TIMEOUT",
            "0s",
            "grpc.keepalive_timeout",
        ),
    ] {
        assert_names(load_env(&[(var, value)]), key);
    }
}

#[test]
fn rebalancing_needs_a_shared_broker_and_sane_bounds() {
    assert_names(
        load_env(&[("HERALD_REBALANCE__ENABLED", "true")]),
        "rebalance.enabled",
    );
    let redis = [
        ("HERALD_BROKER", "redis"),
        ("HERALD_REBALANCE__ENABLED", "true"),
    ];
    let config = load_env(&redis).expect("rebalancing with Redis");
    assert!(config.rebalance.enabled);
    assert_eq!(config.rebalance.tolerance, 0.2);
    let mut bad = redis.to_vec();
    bad.push(("HERALD_REBALANCE__MAX_MOVE_FRACTION", "1.5"));
    assert_names(load_env(&bad), "rebalance.max_move_fraction");
}

#[test]
fn redis_passwords_certificates_and_sentinels_are_read_checked_and_never_shown() {
    let config = load_env(&[
        ("HERALD_BROKER", "redis"),
        ("HERALD_REDIS__URL", "redis://herald:hunter2@redis:6379/0"),
        ("HERALD_REDIS__PASSWORD", "12345"),
        ("HERALD_REDIS__SENTINEL__MASTER_NAME", "mymaster"),
        ("HERALD_REDIS__SENTINEL__ADDRESSES", "s0:26379, [::1]:26379"),
        ("HERALD_REDIS__SENTINEL__PASSWORD", "sentinel-secret"),
    ])
    .expect("loads");
    // A password of digits stays text; the list is split at commas.
    assert_eq!(config.redis.password, "12345");
    assert_eq!(config.redis.sentinel.addresses, ["s0:26379", "[::1]:26379"]);
    let settings = config.redis.settings();
    assert_eq!(settings.password.as_deref(), Some("12345"));
    let sentinel = settings.sentinel.as_ref().expect("sentinel on");
    assert_eq!(sentinel.master_name, "mymaster");
    for shown in [format!("{config:?}"), format!("{settings:?}")] {
        for secret in ["hunter2", "12345", "sentinel-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("redis://herald:<redacted>@redis:6379/0"),
            "{shown}"
        );
    }
    // Off by default.
    assert!(
        load_env(&[("HERALD_BROKER", "redis")])
            .expect("loads")
            .redis
            .settings()
            .sentinel
            .is_none()
    );

    fn redis(extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut vars = vec![("HERALD_BROKER", "redis")];
        vars.extend_from_slice(extra);
        load_env(&vars)
    }
    assert_names(
        redis(&[("HERALD_REDIS__SENTINEL__ADDRESSES", "s0:26379")]),
        "redis.sentinel.master_name",
    );
    assert_names(
        redis(&[("HERALD_REDIS__SENTINEL__MASTER_NAME", "m")]),
        "redis.sentinel.addresses",
    );
    assert_names(
        redis(&[
            ("HERALD_REDIS__SENTINEL__MASTER_NAME", "m"),
            ("HERALD_REDIS__SENTINEL__ADDRESSES", "s0"),
        ]),
        "redis.sentinel.addresses",
    );
    assert_names(
        redis(&[
            ("HERALD_REDIS__URL", "rediss://redis:6379"),
            ("HERALD_REDIS__TLS_CA", "/nonexistent/ca.pem"),
        ]),
        "redis.tls_ca",
    );
    let pki = testkit::pki::Pki::new();
    let ca = pki.ca();
    let ca = ca.to_str().expect("a UTF-8 path");
    assert_names(redis(&[("HERALD_REDIS__TLS_CA", ca)]), "redis.tls_ca");
    assert_names(
        redis(&[
            ("HERALD_REDIS__URL", "rediss://redis:6379"),
            ("HERALD_REDIS__TLS_CERT", ca),
        ]),
        "redis.tls_key",
    );
    redis(&[
        ("HERALD_REDIS__URL", "rediss://redis:6379"),
        ("HERALD_REDIS__TLS_CA", ca),
    ])
    .expect("a CA file for a rediss:// URL");
}

#[test]
fn redis_cluster_nodes_are_read_from_a_file() {
    let config = load_file(
        r#"
broker = "redis"

[redis]
cluster = [
  "redis://redis-cluster-0.redis-cluster-headless:6379",
  "rediss://10.0.0.2:6380",
]
"#,
    )
    .expect("a cluster in a file loads");
    let nodes = [
        "redis://redis-cluster-0.redis-cluster-headless:6379",
        "rediss://10.0.0.2:6380",
    ];
    assert_eq!(config.redis.cluster, nodes);
    let settings = config.redis.settings();
    assert_eq!(settings.cluster, nodes);
    assert!(settings.sentinel.is_none());
    // Off by default.
    assert!(
        load_env(&[("HERALD_BROKER", "redis")])
            .expect("loads")
            .redis
            .settings()
            .cluster
            .is_empty()
    );
}

#[test]
fn redis_cluster_nodes_are_read_from_the_environment_comma_separated() {
    let config = load_env(&[
        ("HERALD_BROKER", "redis"),
        ("HERALD_REDIS__CLUSTER", "redis://a:1,redis://b:2"),
    ])
    .expect("a cluster from the environment loads");
    assert_eq!(config.redis.cluster, ["redis://a:1", "redis://b:2"]);
    assert_eq!(config.redis.settings().cluster.len(), 2);
    // The variable wins over the file's list.
    let file = TempToml::new("broker = \"redis\"\n[redis]\ncluster = [\"redis://file:6379\"]\n");
    let config = Config::load(
        Some(&file.0),
        env(&[("HERALD_REDIS__CLUSTER", "redis://env:6379")]),
    )
    .expect("loads");
    assert_eq!(config.redis.cluster, ["redis://env:6379"]);
}

#[test]
fn redis_cluster_with_sentinel_is_refused_naming_redis_cluster() {
    let result = load_env(&[
        ("HERALD_BROKER", "redis"),
        ("HERALD_REDIS__CLUSTER", "redis://a:1,redis://b:2"),
        ("HERALD_REDIS__SENTINEL__MASTER_NAME", "mymaster"),
        ("HERALD_REDIS__SENTINEL__ADDRESSES", "s0:26379"),
    ]);
    assert_names(result, "redis.cluster");
    let file = TempToml::new(
        r#"
broker = "redis"

[redis]
cluster = ["redis://a:1"]

[redis.sentinel]
master_name = "mymaster"
addresses = ["s0:26379"]
"#,
    );
    let result = Config::load(Some(&file.0), std::iter::empty());
    match result {
        Ok(config) => panic!("a cluster under Sentinel loaded: {config:?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("redis.cluster") && text.contains("sentinel"),
                "{text}"
            );
        }
    }
}

#[test]
fn a_redis_cluster_node_that_is_not_a_redis_url_is_refused_naming_redis_cluster() {
    for bad in [
        "http://x",
        "redis://a:1,http://x",
        "a:6379",
        "redis://a:1,",
        "redis+unix:///run/redis.sock",
    ] {
        let result = load_env(&[("HERALD_BROKER", "redis"), ("HERALD_REDIS__CLUSTER", bad)]);
        match result {
            Ok(config) => panic!("`{bad}` loaded: {config:?}"),
            Err(e) => assert!(e.to_string().contains("redis.cluster"), "`{bad}`: {e}"),
        }
    }
    assert_names(
        load_file("broker = \"redis\"\n[redis]\ncluster = [\"http://x\"]\n"),
        "redis.cluster",
    );
}

#[test]
fn a_redis_cluster_nodes_password_is_shown_nowhere() {
    let config = load_env(&[
        ("HERALD_BROKER", "redis"),
        (
            "HERALD_REDIS__CLUSTER",
            "redis://herald:c1uster@a:6379,redis://b:6379",
        ),
    ])
    .expect("loads");
    let settings = config.redis.settings();
    for shown in [format!("{config:?}"), format!("{settings:?}")] {
        assert!(!shown.contains("c1uster"), "{shown}");
        assert!(
            shown.contains("redis://herald:<redacted>@a:6379"),
            "{shown}"
        );
    }
    // Nor in the refusal of a node that cannot be used.
    let refused = load_env(&[
        ("HERALD_BROKER", "redis"),
        (
            "HERALD_REDIS__CLUSTER",
            "redis+unix://herald:c1uster@/run/redis.sock",
        ),
    ]);
    match refused {
        Ok(config) => panic!("loaded: {config:?}"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("redis.cluster") && !e.contains("c1uster"), "{e}");
        }
    }
}

#[test]
fn log_levels_are_levels_or_target_directives_and_a_typo_is_refused() {
    for good in [
        "info",
        "WARN",
        "gateway=debug,info",
        "gateway=debug,hyper=warn",
        "off",
    ] {
        let config = load_env(&[("HERALD_LOG__LEVEL", good)]).expect(good);
        assert_eq!(config.log.level, good);
    }
    // EnvFilter would take `debgu` for a target, and log next to nothing.
    for bad in ["debgu", "verbose", "info,loud", "gateway=loud"] {
        assert_names(load_env(&[("HERALD_LOG__LEVEL", bad)]), "log.level");
    }
    let output = herald(&["--check"], &[("HERALD_LOG__LEVEL", "debgu")]);
    assert_eq!(output.status.code(), Some(EXIT_BAD_CONFIG));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`log.level`") && stderr.contains("`debgu`"),
        "{stderr}"
    );
}

#[test]
fn the_redis_prefix_keeps_to_the_characters_of_a_key_without_braces() {
    let config = load_env(&[("HERALD_REDIS__PREFIX", "team-a.prod")]).expect("loads");
    assert_eq!(config.redis.settings().prefix, "team-a.prod");
    for bad in ["", "a{b}", "with space", "tag}"] {
        assert_names(
            load_env(&[("HERALD_BROKER", "redis"), ("HERALD_REDIS__PREFIX", bad)]),
            "redis.prefix",
        );
    }
}

#[test]
fn an_api_keys_file_adds_its_keys_and_must_hold_one() {
    let file = TempToml::new("# rotated by the Secret\nk-file-1\n\n  k-file-2  \n");
    let path = file.0.to_str().expect("a UTF-8 path");
    let config = load_env(&[
        ("HERALD_HTTP__API_KEYS", "k-inline"),
        ("HERALD_HTTP__API_KEYS_FILE", path),
    ])
    .expect("loads");
    assert_eq!(
        config.http.keys().expect("keys"),
        ["k-inline", "k-file-1", "k-file-2"]
    );
    // An emptied file must not open the API.
    let empty = TempToml::new("# nothing yet\n\n");
    let empty_path = empty.0.to_str().expect("a UTF-8 path");
    assert_names(
        load_env(&[("HERALD_HTTP__API_KEYS_FILE", empty_path)]),
        "http.api_keys_file",
    );
    assert_names(
        load_env(&[("HERALD_HTTP__API_KEYS_FILE", "/nonexistent/keys")]),
        "http.api_keys_file",
    );
}

#[test]
fn presence_settings_are_checked_by_name() {
    let config = load_env(&[
        ("HERALD_PRESENCE__DIFF_INTERVAL", "100ms"),
        ("HERALD_PRESENCE__PAGE_SIZE", "50"),
        ("HERALD_PRESENCE__MAX_INFO_BYTES", "64"),
        ("HERALD_PRESENCE__POD_TTL", "3s"),
    ])
    .expect("valid");
    let presence = &config.presence;
    assert_eq!(presence.diff_interval, Duration::from_millis(100));
    assert_eq!((presence.page_size, presence.max_info_bytes), (50, 64));
    assert_eq!(presence.pod_ttl, Duration::from_secs(3));
    for (var, value, key) in [
        (
            "HERALD_PRESENCE__DIFF_INTERVAL",
            "0s",
            "presence.diff_interval",
        ),
        (
            "HERALD_PRESENCE__DIFF_INTERVAL",
            "20s",
            "presence.diff_interval",
        ),
        ("HERALD_PRESENCE__PAGE_SIZE", "0", "presence.page_size"),
        (
            "HERALD_PRESENCE__MAX_INFO_BYTES",
            "1",
            "presence.max_info_bytes",
        ),
        ("HERALD_PRESENCE__POD_TTL", "500ms", "presence.pod_ttl"),
        ("HERALD_PRESENCE__POD_TTL", "400days", "presence.pod_ttl"),
    ] {
        assert_names(load_env(&[(var, value)]), key);
    }
    assert_names(load_file("[presence]\npage = 1\n"), "page");
}

#[test]
fn the_backend_hooks_sections_load_from_a_file() {
    // `[proxy]` and `[webhooks]` are top-level keys like the others (a file
    // with them was once refused as a typo, while their variables worked).
    let config = load_file(
        "[proxy.connect]\nurl = \"http://127.0.0.1:8000/herald/connect\"\nheaders = [\"Cookie\"]\n\n[webhooks]\nurl = \"\"\n",
    )
    .expect("[proxy] and [webhooks] load");
    let connect = config.proxy.connect.expect("[proxy.connect]");
    assert_eq!(connect.url, "http://127.0.0.1:8000/herald/connect");
    assert_eq!(connect.headers, ["Cookie"]);
}
