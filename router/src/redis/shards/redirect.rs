//! What a failed call asks for: to go where the slot is now, or to wait a
//! moment for the cluster.

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

/// What a failed call asks for.
pub enum Redirect {
    /// The slot is served by `host:port` now: go there, and read the map
    /// again.
    Moved(String),
    /// The slot is being migrated, its key to `host:port` already.
    Ask(String),
    /// Wait a moment and read the map again: a migration between two of the
    /// call's keys, a cluster without a master for the slot yet, a failover.
    Wait,
}

impl Redirect {
    pub fn of(e: &RedisError) -> Option<Self> {
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => {
                let (address, _) = e.redirect_node()?;
                Some(Self::Moved(address.to_owned()))
            }
            ErrorKind::Server(ServerErrorKind::Ask) => {
                let (address, _) = e.redirect_node()?;
                Some(Self::Ask(address.to_owned()))
            }
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => Some(Self::Wait),
            _ if e.is_unrecoverable_error() || e.is_timeout() || e.is_connection_refusal() => {
                Some(Self::Wait)
            }
            _ => None,
        }
    }

    /// [`Redirect::of`] for a reply value of a pipeline.
    pub fn of_reply(reply: &Value) -> Option<Self> {
        match reply {
            Value::ServerError(e) => Self::of(&RedisError::from(e.clone())),
            _ => None,
        }
    }
}
