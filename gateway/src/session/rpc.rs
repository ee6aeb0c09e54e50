//! A client's `rpc`: a call of the application's backend through the rpc
//! proxy, with the connection's user, answered on the same connection:
//! `ok` with the backend's `data`, or `err` with its code.
//!
//! Like every command, it waits for its answer before the next is read
//! (bounded by the proxy's timeout), so the client's replies stay in order.
//! An answer of any kind is the client's business, not a bad command: none
//! counts towards `websocket.max_bad_commands`.

use proto::{CommandError, ErrorCode, ServerMessage};
use serde_json::value::RawValue;

use super::Session;
use super::approval::hook_error;
use crate::hooks::RpcRequest;

impl Session {
    /// Calls `method` of the backend with `data`, and answers the client.
    pub(super) async fn rpc(
        &mut self,
        id: u64,
        method: &str,
        data: Option<&RawValue>,
    ) -> Result<(), CommandError> {
        if self.node.config.proxy.rpc.is_none() {
            return Err(CommandError::new(
                Some(id),
                ErrorCode::Disabled,
                "this server has no rpc proxy ([proxy.rpc])",
            ));
        }
        let request = RpcRequest {
            client: self.conn,
            user: self.claims.as_deref().map(|c| &*c.user),
            method,
            data,
        };
        match self.node.hooks.rpc(&request).await {
            Ok(reply) => {
                self.reply(ServerMessage::Ok {
                    id,
                    topic: None,
                    seq: None,
                    epoch: None,
                    recovered: None,
                    expires: None,
                    data: reply.data.as_deref(),
                    delta: None,
                })
                .await;
            }
            Err(e) => {
                let e = hook_error(Some(id), &e);
                tracing::debug!(
                    conn = self.conn,
                    method,
                    code = e.wire_code(),
                    "rpc refused"
                );
                self.tell(e).await;
            }
        }
        Ok(())
    }
}
