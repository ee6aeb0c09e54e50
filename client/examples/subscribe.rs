#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Follows a topic and prints its messages: `cargo run -p herald-client
//! --example subscribe -- ws://127.0.0.1:8080/ws news` (docs/clients.md).

use herald_client::{Client, Event};

#[tokio::main]
async fn main() -> Result<(), herald_client::Error> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "ws://127.0.0.1:8080/ws".into());
    let topic = args.next().unwrap_or_else(|| "news".into());
    let (client, mut events) = Client::builder([url]).build()?;
    client.subscribe(topic, None)?;
    while let Some(event) = events.next().await {
        match event {
            // Each seq once, in order; acked once this loop asks for the next.
            Event::Message(m) => println!("{} #{} {}", m.topic, m.seq, m.data),
            // Continuity lost: reload the topic's state from its source.
            Event::Reset { topic, .. } => println!("resync {topic}"),
            Event::Error(e) if e.is_terminal() => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
