//! How a connection ends: closed by the server (come back, or stop for
//! good by its close code), lost, or gone quiet; what is owed then (the
//! replies in flight fail, the application is told). Its own module: every
//! way out of the read loop ends here, with the wait before the next
//! connection.

use super::{Connection, Driver, End, Pending, Stop, Ws};
use crate::{Cause, Error, Event, State, reconnects_after};

impl Driver {
    /// The server closed with `code`: come back, or stop for good.
    pub(super) async fn closed(
        &mut self,
        conn: &mut Connection,
        code: Option<u16>,
        reason: String,
    ) -> Result<End, Stop> {
        match code {
            Some(4502) => {
                let why = conn.last_err.take().unwrap_or(reason);
                self.gone_quietly(conn, code, Cause::Closed).await?;
                Ok(End::Stop(Some(Error::Unauthorized(why))))
            }
            Some(code) if !reconnects_after(code) => {
                self.gone_quietly(conn, Some(code), Cause::Closed).await?;
                let reason = conn.last_err.take().unwrap_or(reason);
                Ok(End::Stop(Some(Error::Closed { code, reason })))
            }
            _ => self.gone(conn, code, Cause::Closed).await,
        }
    }

    pub(super) async fn lost(
        &mut self,
        ws: Ws,
        conn: &mut Connection,
        cause: Cause,
    ) -> Result<End, Stop> {
        drop(ws);
        self.gone(conn, None, cause).await
    }

    /// Says the connection ended; the wait before the next one.
    pub(super) async fn gone(
        &mut self,
        conn: &mut Connection,
        close: Option<u16>,
        cause: Cause,
    ) -> Result<End, Stop> {
        let advice = conn.advice.clone();
        self.gone_quietly(conn, close, cause).await?;
        Ok(End::Again(match advice {
            Some(advice) => advice.after,
            None => self.s.backoff.delay(0),
        }))
    }

    pub(super) async fn gone_quietly(
        &mut self,
        conn: &mut Connection,
        close: Option<u16>,
        cause: Cause,
    ) -> Result<(), Stop> {
        for (_, pending) in self.pending.drain() {
            match pending {
                Pending::Pub(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::Presence(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::History(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::Rpc(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                _ => {}
            }
        }
        self.outgoing.clear();
        let state = State::Disconnected {
            url: conn.url.clone(),
            close,
            advice: conn.advice.take(),
            cause,
        };
        self.emit(Event::State(state)).await
    }
}
