//! The protocol's JSON text: the server frames the client reads (only the
//! keys it uses; unknown keys are ignored) and the commands it writes.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::Error;
use crate::presence::{Member, PresenceDiff, PresencePage};

/// Any server message: `op` says which keys matter.
#[derive(Deserialize)]
pub(crate) struct Frame<'a> {
    #[serde(borrow)]
    pub op: Cow<'a, str>,
    pub id: Option<u64>,
    #[serde(borrow)]
    pub topic: Option<Cow<'a, str>>,
    pub seq: Option<u64>,
    #[serde(borrow)]
    pub epoch: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub data: Option<&'a RawValue>,
    #[serde(borrow)]
    pub session: Option<Cow<'a, str>>,
    pub ping_ms: Option<u64>,
    pub resumed: Option<bool>,
    pub expires: Option<u64>,
    pub recovered: Option<bool>,
    #[serde(borrow)]
    pub reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub code: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub message: Option<Cow<'a, str>>,
    pub after_ms: Option<u64>,
    /// `presence` answers and `presence_diff`.
    pub position: Option<u64>,
    pub users: Option<u64>,
    pub connections: Option<u64>,
    #[serde(borrow)]
    pub members: Option<Vec<WireMember<'a>>>,
    #[serde(borrow)]
    pub cursor: Option<Cow<'a, str>>,
    pub from: Option<u64>,
    pub to: Option<u64>,
    #[serde(borrow)]
    pub joins: Option<Vec<WireMember<'a>>>,
    #[serde(borrow)]
    pub leaves: Option<Vec<Cow<'a, str>>>,
    /// `history` answers.
    #[serde(borrow)]
    pub publications: Option<Vec<WirePublication<'a>>>,
}

/// A presence member as the server writes it.
#[derive(Deserialize)]
pub(crate) struct WireMember<'a> {
    #[serde(borrow)]
    pub user: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub info: Option<&'a RawValue>,
}

/// A kept message in a `history` answer.
#[derive(Deserialize)]
pub(crate) struct WirePublication<'a> {
    pub seq: u64,
    #[serde(borrow, default, deserialize_with = "present")]
    pub data: Option<&'a RawValue>,
}

impl<'a> Frame<'a> {
    pub fn parse(text: &'a str) -> Result<Self, Error> {
        serde_json::from_str(text).map_err(|e| Error::Protocol {
            reason: e.to_string(),
            frame: text.chars().take(200).collect(),
        })
    }
}

impl Frame<'_> {
    /// A `presence` answer as a page.
    pub fn presence_page(&self) -> PresencePage {
        PresencePage {
            topic: self.topic.as_deref().unwrap_or_default().to_owned(),
            position: self.position.unwrap_or(0),
            users: self.users.unwrap_or(0),
            connections: self.connections.unwrap_or(0),
            members: members(self.members.as_deref()),
            cursor: self.cursor.as_deref().map(str::to_owned),
        }
    }

    /// A `presence_diff`, if it has its topic and positions; without
    /// `joins` and `leaves` it is counts only.
    pub fn presence_diff(&self) -> Option<PresenceDiff> {
        let (Some(topic), Some(from), Some(to)) = (self.topic.as_deref(), self.from, self.to)
        else {
            return None;
        };
        Some(PresenceDiff {
            topic: Arc::from(topic),
            from,
            to,
            joins: members(self.joins.as_deref()),
            leaves: self
                .leaves
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|u| Arc::from(&**u))
                .collect(),
            counts_only: self.joins.is_none() && self.leaves.is_none(),
            users: self.users.unwrap_or(0),
            connections: self.connections.unwrap_or(0),
        })
    }
}

fn members(wire: Option<&[WireMember<'_>]>) -> Vec<Member> {
    wire.unwrap_or_default()
        .iter()
        .map(|m| Member::new(&m.user, m.info))
        .collect()
}

/// `Some` for a value that is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A command, as the client writes it.
#[derive(Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum Command<'a> {
    Hello {
        #[serde(skip_serializing_if = "Option::is_none")]
        token: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        resume: Option<&'a str>,
        /// For the connect proxy (a `hello` without a token).
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
    },
    Sub {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
    },
    Unsub {
        id: u64,
        topic: &'a str,
    },
    Pub {
        id: u64,
        topic: &'a str,
        data: &'a RawValue,
    },
    Ack {
        topic: &'a str,
        seq: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
    },
    Refresh {
        id: u64,
        token: &'a str,
    },
    Presence {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        cursor: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    History {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        reverse: bool,
    },
    /// A call to the backend's rpc proxy.
    Rpc {
        id: u64,
        method: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
    },
}

impl Command<'_> {
    pub fn to_json(&self) -> String {
        // Every key is a string and `data` is JSON already: cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The `host:port` of a `ws://` URL (port 80 when absent).
pub(crate) fn host_port(url: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| bad("only ws:// URLs are supported"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("no host (or user info, which is not supported)"));
    }
    // `[::1]:8080`, `host:8080`, `host`.
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    Ok(if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_what_the_server_sends() {
        let f = Frame::parse(r#"{"op":"msg","topic":"news","seq":42,"data":{"a":[1, 2]}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.op.as_ref(), f.seq), ("msg", Some(42)));
        assert_eq!(f.data.map(RawValue::get), Some(r#"{"a":[1, 2]}"#));
        let f = Frame::parse(r#"{"op":"msg","topic":"news","seq":1,"data":null,"new":1}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.data.map(RawValue::get), Some("null"));
        let f = Frame::parse(
            r#"{"op":"presence_diff","topic":"room:1","from":17,"to":19,"joins":[{"user":"carol","info":{"name":"C"}}],"leaves":["bob"],"users":2,"connections":2}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.from, f.to, f.users), (Some(17), Some(19), Some(2)));
        let joins = f.joins.unwrap_or_default();
        assert_eq!(joins[0].user, "carol");
        assert_eq!(joins[0].info.map(RawValue::get), Some(r#"{"name":"C"}"#));
        assert_eq!(f.leaves.unwrap_or_default(), vec!["bob"]);
        let f = Frame::parse(
            r#"{"op":"ok","id":3,"topic":"news","epoch":"e","seq":42,"publications":[{"seq":41,"data":[1]},{"seq":42,"data":null}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let publications = f.publications.unwrap_or_default();
        assert_eq!(publications[0].data.map(RawValue::get), Some("[1]"));
        assert_eq!(publications[1].data.map(RawValue::get), Some("null"));
        let f = Frame::parse(r#"{"op":"ok","topic":"news","seq":4,"epoch":"e","reason":"server"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.id, f.reason.as_deref()), (None, Some("server")));
        assert!(Frame::parse("[1]").is_err());
        assert!(Frame::parse(r#"{"seq":1}"#).is_err());
    }

    #[test]
    fn commands_are_written_as_the_protocol_spells_them() {
        let sub = Command::Sub {
            id: 1,
            topic: "news",
            since: Some(41),
            epoch: Some("e"),
        };
        assert_eq!(
            sub.to_json(),
            r#"{"op":"sub","id":1,"topic":"news","since":41,"epoch":"e"}"#
        );
        let hello = Command::Hello {
            token: None,
            resume: None,
            data: None,
        };
        assert_eq!(hello.to_json(), r#"{"op":"hello"}"#);
        let data =
            RawValue::from_string(r#"{"csrf":"x"}"#.to_owned()).unwrap_or_else(|e| panic!("{e}"));
        let hello = Command::Hello {
            token: None,
            resume: Some("s1"),
            data: Some(&data),
        };
        assert_eq!(
            hello.to_json(),
            r#"{"op":"hello","resume":"s1","data":{"csrf":"x"}}"#
        );
        let rpc = Command::Rpc {
            id: 4,
            method: "cart.add",
            data: Some(&data),
        };
        assert_eq!(
            rpc.to_json(),
            r#"{"op":"rpc","id":4,"method":"cart.add","data":{"csrf":"x"}}"#
        );
        let rpc = Command::Rpc {
            id: 5,
            method: "ping",
            data: None,
        };
        assert_eq!(rpc.to_json(), r#"{"op":"rpc","id":5,"method":"ping"}"#);
        let history = Command::History {
            id: 2,
            topic: "news",
            since: Some(40),
            epoch: None,
            limit: Some(50),
            reverse: false,
        };
        assert_eq!(
            history.to_json(),
            r#"{"op":"history","id":2,"topic":"news","since":40,"limit":50}"#
        );
        let presence = Command::Presence {
            id: 3,
            topic: "room:1",
            cursor: Some("c"),
            limit: None,
        };
        assert_eq!(
            presence.to_json(),
            r#"{"op":"presence","id":3,"topic":"room:1","cursor":"c"}"#
        );
    }

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(
            host_port("ws://127.0.0.1:8080/ws").ok().as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            host_port("ws://example.com/ws").ok().as_deref(),
            Some("example.com:80")
        );
        assert_eq!(
            host_port("ws://[::1]:9/ws").ok().as_deref(),
            Some("[::1]:9")
        );
        assert_eq!(host_port("ws://[::1]/ws").ok().as_deref(), Some("[::1]:80"));
        assert!(host_port("wss://example.com/ws").is_err());
        assert!(host_port("ws:///ws").is_err());
    }
}
