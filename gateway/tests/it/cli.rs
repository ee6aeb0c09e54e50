//! The `herald` command line, run as the real binary: its help and version,
//! exit 64 for a bad argument or configuration, `--check`, and `herald
//! status` against a running pod and against servers that answer what a pod
//! never would (non-JSON, an error status, a huge or chunked body, nothing).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::time::Instant;

use gateway::admin::{BrokerState, FETCH_MAX_BYTES, FETCH_TIMEOUT, Status};
use gateway::config::EXIT_BAD_CONFIG;
use testkit::Herald;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::pod::{self, HERALD};

/// [`pod::run`], off the runtime's threads (a test's own server answers
/// `herald status` on them).
async fn herald(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        pod::run(&args, &vars)
    })
    .await
    .expect("herald ran")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A TOML file under the temp dir, removed on drop.
struct TempToml(PathBuf);

impl TempToml {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "herald-cli-test-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).expect("write the file");
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for TempToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn the_help_names_every_flag_variable_and_the_status_command() {
    for flag in ["--help", "-h"] {
        let output = herald(&[flag], &[]).await;
        let help = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        for text in [
            "herald: a realtime WebSocket gateway",
            "Usage: herald [--config <file.toml>] [--check]",
            "herald status [--url <url>] [--key <api key>]",
            "-c, --config <file>",
            "HERALD_CONFIG",
            "--check",
            "-V, --version",
            "--url <url>",
            "http://127.0.0.1:8080",
            "--key <key>",
            "HERALD_API_KEY",
            "SIGHUP",
            "HERALD_WEBSOCKET__PING_INTERVAL=10s",
            "0.0.0.0:9090 (gRPC)",
        ] {
            assert!(help.contains(text), "`{text}` in {flag}:\n{help}");
        }
    }
    let output = herald(&["status", "--help"], &[]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("--key <key>"),
        "{}",
        stdout(&output)
    );
    let output = herald(&["-V"], &[]).await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout(&output).trim(),
        format!("herald {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn a_bad_command_line_exits_64_naming_what_is_wrong() {
    assert_eq!(EXIT_BAD_CONFIG, 64);
    for (args, named) in [
        (&["--confg", "x.toml"][..], "--confg"),
        (&["--config"], "--config"),
        (&["serve"], "serve"),
        (&["status", "--nope"], "--nope"),
        (&["status", "--url"], "--url"),
        // Options of the server are not those of `status`.
        (&["--check", "status"], "status"),
        (&["status", "--check"], "--check"),
    ] {
        let output = herald(args, &[]).await;
        assert_eq!(
            output.status.code(),
            Some(EXIT_BAD_CONFIG),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(named),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[tokio::test]
async fn check_validates_the_file_from_the_flag_or_the_variable() {
    let bad = TempToml::new("bad", "[websocket]\nping_intervall = \"10s\"\n");
    let output = herald(&["--config", bad.path(), "--check"], &[]).await;
    assert_eq!(output.status.code(), Some(EXIT_BAD_CONFIG));
    assert!(
        stderr(&output).contains("ping_intervall"),
        "{}",
        stderr(&output)
    );
    let good = TempToml::new("good", "listen = \"127.0.0.1:0\"\n");
    let output = herald(&["-c", good.path(), "--check"], &[]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "configuration ok");
    // HERALD_CONFIG names the file when --config does not.
    let output = herald(&["--check"], &[("HERALD_CONFIG", bad.path())]).await;
    assert_eq!(output.status.code(), Some(EXIT_BAD_CONFIG));
    let output = herald(
        &["--check", "--config", good.path()],
        &[("HERALD_CONFIG", bad.path())],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_what_a_running_pod_holds() {
    let pod = Herald::start(HERALD, &[("HERALD_HTTP__API_KEYS", "k1")], &[]).await;
    let url = pod.http_url();
    let output = herald(&["status", "--url", &url], &[("HERALD_API_KEY", "k1")]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for line in [
        "state          ready",
        "connections    0",
        "broker         memory: connected",
    ] {
        assert!(
            stdout(&output).contains(line),
            "`{line}` in:\n{}",
            stdout(&output)
        );
    }
    let output = herald(&["status", "--url", &url, "--key", "k2"], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("HTTP 401"), "{}", stderr(&output));
}

/// What a fake pod answers.
enum Answer {
    /// These bytes, then the connection closes.
    Raw(Vec<u8>),
    /// A 200 whose chunked body never ends: `chunk` again and again.
    Endless { chunk: Vec<u8> },
    /// Nothing, the connection held open.
    Silence,
}

/// A server on a loopback port that answers every request with `answer`,
/// sending each request's head on the returned channel.
async fn fake_pod(answer: Answer) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("its address");
    let (heads, received) = mpsc::unbounded_channel();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer_one(stream, answer.clone(), heads.clone()));
        }
    });
    (addr, received)
}

async fn answer_one(
    mut stream: TcpStream,
    answer: std::sync::Arc<Answer>,
    heads: mpsc::UnboundedSender<String>,
) {
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let _ = heads.send(String::from_utf8_lossy(&head).into_owned());
    // Write errors are the client hanging up: what a capped client does.
    match &*answer {
        Answer::Raw(bytes) => {
            let _ = stream.write_all(bytes).await;
        }
        Answer::Endless { chunk } => {
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
            framed.extend_from_slice(chunk);
            framed.extend_from_slice(b"\r\n");
            if stream.write_all(head).await.is_ok() {
                while stream.write_all(&framed).await.is_ok() {}
            }
        }
        Answer::Silence => {
            let _ = stream.read(&mut byte).await;
        }
    }
}

fn response(status: &str, body: &str) -> Answer {
    Answer::Raw(
        format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

fn a_status() -> Status {
    Status {
        version: "9.9.9".into(),
        pod: "fake-pod".into(),
        ready: false,
        not_ready: Some("draining".into()),
        draining: true,
        connections: 3,
        sessions: 2,
        topics: 1,
        subscriptions: 4,
        broker: BrokerState {
            kind: "redis".into(),
            connected: false,
            pubsub_backlog: 5,
            lineage_clock: Some(77),
        },
    }
}

#[tokio::test]
async fn status_reads_a_chunked_answer_and_sends_the_key_from_the_environment() {
    let json = serde_json::to_string(&a_status()).expect("JSON");
    let mut raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for piece in json.as_bytes().chunks(7) {
        raw.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        raw.extend_from_slice(piece);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let (addr, mut heads) = fake_pod(Answer::Raw(raw)).await;
    let url = format!("http://{addr}/ignored/path");
    let output = herald(&["status", "--url", &url], &[("HERALD_API_KEY", "s3cret")]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), a_status().render());
    let head = heads.recv().await.expect("a request");
    assert!(
        head.starts_with("GET /v1/admin/status HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer s3cret\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("host: {addr}\r\n")),
        "{head}"
    );
}

#[tokio::test]
async fn status_names_an_error_status_and_quotes_its_body() {
    let (addr, _heads) = fake_pod(response(
        "503 Service Unavailable",
        "draining, come back\nlater",
    ))
    .await;
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("HTTP 503 Service Unavailable: draining, come back later"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn status_refuses_an_answer_that_is_not_a_status() {
    let (addr, _heads) = fake_pod(response("200 OK", "<html>a proxy's page</html>")).await;
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("not a status: <html>a proxy's page</html>"),
        "{err}"
    );
    // JSON, but not a status.
    let (addr, _heads) = fake_pod(response("200 OK", r#"{"ok":true}"#)).await;
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("missing field"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn status_stops_reading_a_body_past_its_cap() {
    let (addr, _heads) = fake_pod(Answer::Endless {
        chunk: vec![b' '; 64 * 1024],
    })
    .await;
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains(&format!("over {FETCH_MAX_BYTES} bytes")),
        "{}",
        stderr(&output)
    );
    // An error status is named whatever its body.
    let big = "x".repeat(FETCH_MAX_BYTES + 1);
    let (addr, _heads) = fake_pod(response("500 Internal Server Error", &big)).await;
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("HTTP 500 Internal Server Error: (the answer is over"),
        "{err}"
    );
}

#[tokio::test]
async fn status_gives_up_on_a_pod_that_does_not_answer() {
    let (addr, _heads) = fake_pod(Answer::Silence).await;
    let started = Instant::now();
    let output = herald(&["status", "--url", &format!("http://{addr}")], &[]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no answer within 5s"),
        "{}",
        stderr(&output)
    );
    assert!(
        started.elapsed() >= FETCH_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn status_says_why_it_cannot_ask() {
    // A port nobody listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("its address")
        .port();
    for (url, says) in [
        (format!("http://127.0.0.1:{port}"), "asking the pod"),
        ("https://127.0.0.1:8080".to_owned(), "only http:// URLs"),
        ("127.0.0.1:8080".to_owned(), "only http:// URLs"),
        ("http://exa mple".to_owned(), "not a URL"),
    ] {
        let output = herald(&["status", "--url", &url], &[]).await;
        assert_eq!(output.status.code(), Some(1), "{url}");
        let err = stderr(&output);
        assert!(
            err.starts_with(&format!("herald status: {url}: {says}")),
            "{url}: {err}"
        );
    }
}
