//! Commands posted for the session over HTTP (`POST /stream/<session>`,
//! [`crate::stream_commands`]), on this pod or forwarded from another one:
//! handed over by the [`Registry`](super::Registry), run by the
//! connection's loop between the client's own frames, each through the
//! same dispatch as a frame's command ([`Session::command_json`]: the rate
//! limit, the grants, bad commands counted), its replies on the
//! connection's queue, in the order posted.

use proto::{ErrorCode, ServerMessage};

use super::Session;

impl Session {
    /// Runs the posted commands waiting for the connection, in order, and
    /// tells the client of those dropped (forwarded when too many waited).
    pub(super) async fn posted_commands(&mut self) {
        let Some(id) = self.id.clone() else { return };
        while let Some(command) = self.node.live.next_posted(&id) {
            if self.out.is_closing() {
                return;
            }
            Box::pin(self.command_json(command)).await;
        }
        let dropped = self.node.live.dropped_posted(&id);
        if dropped > 0 && !self.out.is_closing() {
            tracing::debug!(
                conn = self.conn,
                dropped,
                "posted commands dropped: too many waited"
            );
            let message = format!(
                "{dropped} posted commands were dropped: at most {} wait for the session",
                super::MAX_POSTED_COMMANDS
            );
            self.reply(ServerMessage::Err {
                id: None,
                code: ErrorCode::RateLimited.as_str(),
                message: &message,
                topic: None,
            })
            .await;
        }
    }
}
