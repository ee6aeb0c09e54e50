//! What the control channel carries (`<prefix>:control`, which every pod
//! listens on): one line of words, user ids and epochs in hex
//! ([`super::sessions::hex`]) so that any text stays one word.
//!
//! - `disconnect <user>`: a backend ended the user's access.
//! - `subscribe <user> <topic> [<since> [<epoch>]]` and
//!   `unsubscribe <user> <topic>`: a server-side subscription.
//! - `resumed <session key>`: a session was resumed on some pod (its
//!   presence key: the id itself is a credential, never sent).
//! - `forward <session key> <user>` (`-` for an anonymous session), then
//!   one command per line: commands posted for a session
//!   ([`crate::Forward`]).
//!
//! A pod of an older release ignores a message it does not read (and logs
//! it).

use bytes::Bytes;

use super::sessions::{hex, unhex};
use crate::{Forward, ServerSubscription, Since, Topic};

/// A message of the control channel, read.
#[derive(Debug)]
pub(super) enum Control {
    Disconnect(String),
    Subscription(String, ServerSubscription),
    Resumed(String),
    Forward(Forward),
}

/// `forward <session key> <user>` and the commands, a line each.
pub(super) fn forward(forward: &Forward) -> Vec<u8> {
    let user = forward.user.as_deref().map_or_else(|| "-".to_owned(), hex);
    let mut out = format!("forward {} {user}", forward.session).into_bytes();
    for command in &forward.commands {
        debug_assert!(!command.contains(&b'\n'), "a command is one line");
        out.push(b'\n');
        out.extend_from_slice(command);
    }
    out
}

/// Reads a `forward` message, its head's words already split off.
fn read_forward(session: &str, user: &str, body: &[u8]) -> Option<Control> {
    let user = match user {
        "-" => None,
        user => Some(unhex(user)?),
    };
    let commands = body
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(Bytes::copy_from_slice)
        .collect();
    Some(Control::Forward(Forward {
        session: session.to_owned(),
        user,
        commands,
    }))
}

/// `resumed <session key>`.
pub(super) fn resumed(session: &str) -> String {
    format!("resumed {}", hex(session))
}

/// `disconnect <user>`.
pub(super) fn disconnect(user: &str) -> String {
    format!("disconnect {}", hex(user))
}

/// `subscribe ...` or `unsubscribe ...`.
pub(super) fn subscription(user: &str, command: &ServerSubscription) -> String {
    match command {
        ServerSubscription::Subscribe { topic, since } => {
            let mut line = format!("subscribe {} {topic}", hex(user));
            if let Some(since) = since {
                line.push_str(&format!(" {}", since.seq));
                if let Some(epoch) = &since.epoch {
                    line.push_str(&format!(" {}", hex(epoch)));
                }
            }
            line
        }
        ServerSubscription::Unsubscribe { topic } => {
            format!("unsubscribe {} {topic}", hex(user))
        }
    }
}

/// Reads a control message; `None` when it is none of the above.
pub(super) fn read(payload: &[u8]) -> Option<Control> {
    if let Some(rest) = payload.strip_prefix(b"forward ") {
        // Its commands follow its head, a line each: any text but a
        // newline, so not split into words.
        let (head, body) = match rest.iter().position(|&b| b == b'\n') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &[][..]),
        };
        let head = std::str::from_utf8(head).ok()?;
        let mut words = head.split(' ');
        let (session, user) = (words.next()?, words.next()?);
        if session.is_empty() || words.next().is_some() {
            return None;
        }
        return read_forward(session, user, body);
    }
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    let kind = words.next()?;
    let user = unhex(words.next()?)?;
    let control = match kind {
        "disconnect" => Control::Disconnect(user),
        "resumed" => Control::Resumed(user),
        "subscribe" => {
            let topic = Topic::parse(words.next()?).ok()?;
            let since = match words.next() {
                None => None,
                Some(seq) => {
                    let seq = seq.parse().ok()?;
                    let epoch = match words.next() {
                        None => None,
                        Some(epoch) => Some(unhex(epoch)?),
                    };
                    Some(Since::claimed(seq, epoch))
                }
            };
            Control::Subscription(user, ServerSubscription::Subscribe { topic, since })
        }
        "unsubscribe" => {
            let topic = Topic::parse(words.next()?).ok()?;
            Control::Subscription(user, ServerSubscription::Unsubscribe { topic })
        }
        _ => return None,
    };
    words.next().is_none().then_some(control)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn control_messages_round_trip() {
        let line = disconnect("alice smith");
        assert!(
            matches!(read(line.as_bytes()), Some(Control::Disconnect(u)) if u == "alice smith")
        );
        let subscribe = ServerSubscription::Subscribe {
            topic: topic("chat:a/b"),
            since: Some(Since::claimed(40, Some("9f 3c".to_owned()))),
        };
        let line = subscription("bob", &subscribe);
        let Some(Control::Subscription(user, ServerSubscription::Subscribe { topic: t, since })) =
            read(line.as_bytes())
        else {
            panic!("{line}")
        };
        assert_eq!((user.as_str(), t.as_str()), ("bob", "chat:a/b"));
        let since = since.unwrap_or_else(|| panic!("since"));
        assert_eq!((since.seq, since.epoch.as_deref()), (40, Some("9f 3c")));
        let line = subscription(
            "bob",
            &ServerSubscription::Unsubscribe { topic: topic("n") },
        );
        assert!(matches!(
            read(line.as_bytes()),
            Some(Control::Subscription(
                _,
                ServerSubscription::Unsubscribe { .. }
            ))
        ));
        assert!(matches!(read(resumed("k1").as_bytes()), Some(Control::Resumed(k)) if k == "k1"));
        let posted = Forward {
            session: "9f3c".to_owned(),
            user: Some("bob smith".to_owned()),
            commands: vec![
                Bytes::from_static(br#"{"op":"sub","id":1,"topic":"a b"}"#),
                Bytes::from_static(br#"{"op":"ack","topic":"n","seq":4}"#),
            ],
        };
        let line = forward(&posted);
        assert!(matches!(read(&line), Some(Control::Forward(f)) if f == posted));
        let anonymous = Forward {
            user: None,
            ..posted
        };
        let line = forward(&anonymous);
        assert!(matches!(read(&line), Some(Control::Forward(f)) if f == anonymous));
        assert!(read(b"forward 9f3c").is_none());
        assert!(read(b"forward 9f3c zz").is_none(), "a user is hex");
        assert!(read(b"subscribe 626f62").is_none());
        assert!(read(b"later 626f62 x").is_none());
    }
}
