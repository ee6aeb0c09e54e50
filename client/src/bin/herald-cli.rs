//! `herald-cli`: Herald from a terminal or a script.
//!
//! - `herald-cli sub TOPIC [--since N] [--delta]`: prints each message as a
//!   JSON line (`{"topic","epoch","seq","data"}`; binary data as a base64
//!   string with `"binary":true`) on stdout, resuming across reconnects;
//!   what else happens (connects, resets) goes to stderr. `--delta` asks
//!   for deltas (state topics): the lines are the same, whole.
//! - `herald-cli pub TOPIC DATA`: publishes over the HTTP API and prints
//!   the answer (`{"seq","epoch"}`).
//! - `herald-cli presence TOPIC`: every page of the topic's presence over
//!   the WebSocket, merged, as one JSON object
//!   (`{"topic","position","users","connections","members"}`).
//! - `herald-cli history TOPIC [--since N] [--limit N] [--reverse]`: a page
//!   of the topic's kept messages over the WebSocket, as the server answers
//!   it (`{"topic","epoch","seq","publications"}`).
//! - `herald-cli rpc METHOD [DATA] [--hello-data JSON]`: calls the
//!   application's backend through Herald's rpc proxy and prints its reply
//!   `data` (JSON); a refusal is the backend's code and message on stderr
//!   and exit status 1. `--hello-data` (every command that connects has
//!   it) is `hello.data`, for a connect proxy (docs/hooks.md).
//!
//! Every command that connects takes `--protobuf`: speak the
//! `herald.v1.protobuf` subprotocol instead of JSON (the output is the same).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use herald_client::{
    Builder, Client, Data, Event, HistoryQuery, Protocol, Since, State, SubscribeOptions,
};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// Where `sub` connects unless told.
const DEFAULT_URL: &str = "ws://127.0.0.1:8080/ws";
/// Where `pub` posts unless told.
const DEFAULT_API: &str = "http://127.0.0.1:8080";
/// Longest a publish may take, connection included.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `presence`, `history` or `rpc` may take, connection included.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "herald-cli",
    version,
    about = "Subscribe to and publish on a Herald cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a topic's messages as JSON lines, resuming across reconnects.
    Sub {
        topic: String,
        /// Start after this seq (replayed from the history if it still
        /// holds it).
        #[arg(long)]
        since: Option<u64>,
        /// The epoch `--since` is of (default: the topic's current one).
        #[arg(long, requires = "since")]
        epoch: Option<String>,
        /// A gateway's WebSocket URL; give several to spread reconnects.
        #[arg(long = "url", default_value = DEFAULT_URL)]
        urls: Vec<String>,
        /// A token for `hello` (a JWT), where the gateway checks them.
        #[arg(long)]
        token: Option<String>,
        /// Exit after this many messages.
        #[arg(long)]
        count: Option<u64>,
        /// Ask for deltas (a namespace with `delta = true`): fewer bytes on
        /// the wire, the same lines printed.
        #[arg(long)]
        delta: bool,
        /// Speak the `herald.v1.protobuf` subprotocol instead of JSON.
        #[arg(long)]
        protobuf: bool,
    },
    /// Publish DATA (JSON; anything else is sent as a JSON string) over the HTTP API.
    Pub {
        topic: String,
        data: String,
        /// The HTTP API's base URL.
        #[arg(long, default_value = DEFAULT_API)]
        api: String,
        /// An API key (`Authorization: Bearer`), where the API wants one.
        #[arg(long)]
        key: Option<String>,
        /// Publishes with the same key within 5 minutes happen once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Print a topic's presence (every page, merged) as one JSON object.
    Presence {
        topic: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a page of a topic's kept messages as one JSON object.
    History {
        topic: String,
        /// Forward: the messages after this seq; with --reverse, those below it.
        #[arg(long)]
        since: Option<u64>,
        /// The epoch `--since` is of (default: the topic's current one).
        #[arg(long, requires = "since")]
        epoch: Option<String>,
        /// At most this many (default 100); 0: the topic's position only.
        #[arg(long)]
        limit: Option<u32>,
        /// Newest first.
        #[arg(long)]
        reverse: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Call METHOD on the application's backend (Herald's rpc proxy) with
    /// DATA (JSON; anything else is sent as a JSON string) and print its
    /// reply's data.
    Rpc {
        method: String,
        data: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Where a one-shot command connects, and as whom.
#[derive(clap::Args)]
struct Conn {
    /// A gateway's WebSocket URL.
    #[arg(long, default_value = DEFAULT_URL)]
    url: String,
    /// A token for `hello` (a JWT), where the gateway checks them.
    #[arg(long)]
    token: Option<String>,
    /// `hello.data` (JSON; anything else is sent as a JSON string): what a
    /// connect proxy reads when there is no token.
    #[arg(long)]
    hello_data: Option<String>,
    /// Speak the `herald.v1.protobuf` subprotocol instead of JSON.
    #[arg(long)]
    protobuf: bool,
}

fn protocol(protobuf: bool) -> Protocol {
    if protobuf {
        Protocol::Protobuf
    } else {
        Protocol::Json
    }
}

/// `{"data": ...}` as the JSON protocol writes it: JSON as it is, binary
/// data as base64 with `"binary": true`.
fn data_fields(data: &Data) -> serde_json::Map<String, Value> {
    let mut fields = serde_json::Map::new();
    match data {
        Data::Json(raw) => {
            let value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
            fields.insert("data".to_owned(), value);
        }
        Data::Binary(_) => {
            fields.insert(
                "data".to_owned(),
                Value::String(data.to_string().trim_matches('"').to_owned()),
            );
            fields.insert("binary".to_owned(), Value::Bool(true));
        }
    }
    fields
}

/// `builder` with `token` given on every connect.
fn with_token(builder: Builder, token: Option<String>) -> Builder {
    match token {
        Some(token) => builder.token(move || {
            let token = token.clone();
            async move { Ok::<_, String>(token) }
        }),
        None => builder,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Sub {
            topic,
            since,
            epoch,
            urls,
            token,
            count,
            delta,
            protobuf,
        } => {
            let since = since.map(|seq| Since { seq, epoch });
            let builder = with_token(Client::builder(urls), token).protocol(protocol(protobuf));
            sub(topic, SubscribeOptions { since, delta }, builder, count).await
        }
        Command::Pub {
            topic,
            data,
            api,
            key,
            idempotency_key,
        } => {
            publish(
                &api,
                &topic,
                &data,
                key.as_deref(),
                idempotency_key.as_deref(),
            )
            .await
        }
        Command::Presence { topic, conn } => presence(topic, conn).await,
        Command::History {
            topic,
            since,
            epoch,
            limit,
            reverse,
            conn,
        } => {
            let query = HistoryQuery {
                since,
                epoch,
                limit,
                reverse,
            };
            history(topic, conn, query).await
        }
        Command::Rpc { method, data, conn } => rpc(method, data, conn).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald-cli: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn sub(
    topic: String,
    options: SubscribeOptions,
    builder: Builder,
    count: Option<u64>,
) -> Result<(), String> {
    let asked_delta = options.delta;
    let (client, mut events) = builder.build().map_err(|e| e.to_string())?;
    client
        .subscribe_with(topic, options)
        .map_err(|e| e.to_string())?;
    let mut stdout = tokio::io::stdout();
    let mut printed = 0u64;
    if count == Some(0) {
        return Ok(());
    }
    while let Some(event) = events.next().await {
        match event {
            Event::Message(m) => {
                let mut line = serde_json::Map::new();
                line.insert("topic".to_owned(), json!(&*m.topic));
                line.insert("epoch".to_owned(), json!(&*m.epoch));
                line.insert("seq".to_owned(), json!(m.seq));
                line.extend(data_fields(&m.data));
                let line = format!("{}\n", Value::Object(line));
                stdout
                    .write_all(line.as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                stdout.flush().await.map_err(|e| e.to_string())?;
                printed += 1;
                if count.is_some_and(|c| printed >= c) {
                    client.close();
                    return Ok(());
                }
            }
            Event::Subscribed {
                topic,
                epoch,
                seq,
                recovered,
                delta,
            } => {
                let recovered = match recovered {
                    Some(true) => ", recovered",
                    Some(false) => ", NOT recovered: resync",
                    None => "",
                };
                let delta = match (asked_delta, delta) {
                    (true, true) => ", deltas",
                    (true, false) => ", no deltas (the namespace has none)",
                    _ => "",
                };
                eprintln!(
                    "subscribed to {topic} after seq {seq} of epoch {epoch}{recovered}{delta}"
                );
            }
            Event::Reset { topic, epoch, seq } => {
                eprintln!(
                    "reset: {topic} continues after seq {seq} of a new epoch {epoch}: resync"
                );
            }
            Event::State(State::Disconnected {
                url, close, cause, ..
            }) => eprintln!("disconnected from {url} ({cause:?}, close {close:?})"),
            Event::State(State::Connected { url, .. }) => eprintln!("connected to {url}"),
            Event::State(State::Resumed { url, .. }) => eprintln!("resumed at {url}"),
            Event::Error(e) if e.is_terminal() => return Err(e.to_string()),
            Event::Error(e) => eprintln!("{e}"),
            _ => {}
        }
    }
    Ok(())
}

/// A client of `url` whose events are drained (a query's answer comes
/// while someone reads them); a terminal error ends the query.
fn query_client(conn: Conn) -> Result<(Client, tokio::sync::oneshot::Receiver<String>), String> {
    let mut builder =
        with_token(Client::builder([conn.url]), conn.token).protocol(protocol(conn.protobuf));
    if let Some(data) = conn.hello_data {
        builder = builder.hello_data(&json_or_string(&data));
    }
    let (client, mut events) = builder.build().map_err(|e| e.to_string())?;
    let (fatal, fatal_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Event::Error(e) = event
                && e.is_terminal()
            {
                let _ = fatal.send(e.to_string());
                return;
            }
        }
    });
    Ok((client, fatal_rx))
}

/// Every page of `topic`'s presence, printed as one JSON object.
async fn presence(topic: String, conn: Conn) -> Result<(), String> {
    let (client, fatal) = query_client(conn)?;
    let asked = tokio::time::timeout(QUERY_TIMEOUT, async {
        tokio::select! {
            room = client.presence_all(topic.clone()) => room.map_err(|e| e.to_string()),
            Ok(e) = fatal => Err(e),
        }
    });
    let room = asked
        .await
        .map_err(|_| format!("no answer within {QUERY_TIMEOUT:?}"))??;
    client.close();
    let members: Vec<Value> = room
        .members()
        .map(
            |m| match m.info.as_deref().map(serde_json::from_str::<Value>) {
                Some(Ok(info)) => json!({"user": &*m.user, "info": info}),
                _ => json!({"user": &*m.user}),
            },
        )
        .collect();
    let out = json!({
        "topic": topic,
        "position": room.position(),
        "users": room.users(),
        "connections": room.connections(),
        "members": members,
    });
    println!("{out}");
    Ok(())
}

/// A page of `topic`'s history, printed as one JSON object.
async fn history(topic: String, conn: Conn, query: HistoryQuery) -> Result<(), String> {
    let (client, fatal) = query_client(conn)?;
    let asked = tokio::time::timeout(QUERY_TIMEOUT, async {
        tokio::select! {
            page = client.history(topic, query) => page.map_err(|e| e.to_string()),
            Ok(e) = fatal => Err(e),
        }
    });
    let page = asked
        .await
        .map_err(|_| format!("no answer within {QUERY_TIMEOUT:?}"))??;
    client.close();
    let publications: Vec<Value> = page
        .publications
        .iter()
        .map(|p| {
            let mut item = serde_json::Map::new();
            item.insert("seq".to_owned(), json!(p.seq));
            item.extend(data_fields(&p.data));
            Value::Object(item)
        })
        .collect();
    let out = json!({
        "topic": page.topic,
        "epoch": page.epoch,
        "seq": page.seq,
        "publications": publications,
    });
    println!("{out}");
    Ok(())
}

/// `method` on the backend through the rpc proxy; prints the reply's data.
async fn rpc(method: String, data: Option<String>, conn: Conn) -> Result<(), String> {
    let data = data.as_deref().map(json_or_string);
    let (client, fatal) = query_client(conn)?;
    let asked = tokio::time::timeout(QUERY_TIMEOUT, async {
        tokio::select! {
            reply = client.rpc(method, data.as_ref()) => reply.map_err(|e| e.to_string()),
            Ok(e) = fatal => Err(e),
        }
    });
    let reply = asked
        .await
        .map_err(|_| format!("no answer within {QUERY_TIMEOUT:?}"))??;
    client.close();
    println!("{}", reply.get());
    Ok(())
}

/// `text` as JSON, or as a JSON string if it is not JSON.
fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// `POST {api}/v1/publish`; prints the answer.
async fn publish(
    api: &str,
    topic: &str,
    data: &str,
    key: Option<&str>,
    idempotency_key: Option<&str>,
) -> Result<(), String> {
    let data = json_or_string(data);
    let body = json!({"topic": topic, "data": data}).to_string();
    let (host, prefix) = split_api(api)?;
    let path = format!("{prefix}/v1/publish");
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(&host)
            .await
            .map_err(|e| format!("connecting to {host}: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut request = hyper::Request::post(&path)
            .header("host", &host)
            .header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        if let Some(k) = idempotency_key {
            request = request.header("idempotency-key", k);
        }
        let request = request
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    let (status, body) = tokio::time::timeout(PUBLISH_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {PUBLISH_TIMEOUT:?}"))??;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    println!("{body}");
    Ok(())
}

/// `http://host:port/prefix` → (`host:port`, `/prefix`).
fn split_api(api: &str) -> Result<(String, String), String> {
    let rest = api
        .strip_prefix("http://")
        .ok_or_else(|| format!("--api {api}: only http:// is supported"))?;
    let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(format!("--api {api}: no host"));
    }
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:80")
    };
    let prefix = prefix.trim_end_matches('/');
    Ok((
        host,
        if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        },
    ))
}
