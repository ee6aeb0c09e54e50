//! A topic's presence as it is read: its members ([`PresenceMember`]), a
//! page of them ([`PresencePage`]) and its counts ([`PresenceStats`]). Its
//! own module because the `presence` reply and `presence_diff`, the HTTP
//! answers and the gRPC ones all carry these shapes.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::v1;

/// One user in a topic's presence: its `sub`, and its token's `info` claim
/// (JSON text, an object) where it has one.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PresenceMember<'a> {
    pub user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<&'a RawValue>,
}

impl PresenceMember<'_> {
    pub fn to_proto(&self) -> v1::PresenceMember {
        v1::PresenceMember {
            user: self.user.to_owned(),
            info: self.info.map(|info| info.get().as_bytes().to_vec()),
        }
    }
}

/// A page of a topic's presence: the client's `ok` (with its `id`), and the
/// answer to HTTP `GET /v1/presence` (as it is).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PresencePage<'a> {
    pub topic: &'a str,
    /// The topic's presence position the page answers at.
    pub position: u64,
    pub users: u64,
    pub connections: u64,
    pub members: &'a [PresenceMember<'a>],
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<&'a str>,
}

impl PresencePage<'_> {
    /// The gRPC `Presence` answer.
    pub fn to_proto(&self) -> v1::PresenceResponse {
        v1::PresenceResponse {
            topic: self.topic.to_owned(),
            position: self.position,
            users: self.users,
            connections: self.connections,
            members: self.members.iter().map(PresenceMember::to_proto).collect(),
            cursor: self.cursor.map(str::to_owned),
        }
    }
}

/// HTTP `GET /v1/presence/stats`: a topic's presence counts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PresenceStats {
    pub topic: String,
    pub position: u64,
    pub users: u64,
    pub connections: u64,
}

impl PresenceStats {
    /// The gRPC `PresenceStats` answer.
    pub fn to_proto(&self) -> v1::PresenceStatsResponse {
        v1::PresenceStatsResponse {
            topic: self.topic.clone(),
            position: self.position,
            users: self.users,
            connections: self.connections,
        }
    }
}
