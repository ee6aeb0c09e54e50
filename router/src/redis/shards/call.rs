//! One call where its key lives: a command or a script call alone (after an
//! `ASK`, behind `ASKING`), or many script calls in one pipeline.

use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ScriptInvocation, ServerErrorKind, Value,
};

use crate::redis::connection::Commands;

/// Runs a script call; after an `ASK`, as `ASKING` and the call in one go.
pub(super) async fn run_script<T: FromRedisValue>(
    conn: &mut Commands,
    script: &Script,
    invocation: &ScriptInvocation<'_>,
    asking: bool,
) -> RedisResult<T> {
    if !asking {
        return invocation.invoke_async(conn).await;
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().invoke_script(invocation);
    let (reply,): (T,) = match pipe.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            pipe.query_async(conn).await?
        }
        other => other?,
    };
    Ok(reply)
}

/// Runs a command; after an `ASK`, as `ASKING` and the command in one go.
pub(super) async fn run_command<T: FromRedisValue>(
    conn: &mut Commands,
    cmd: &Cmd,
    asking: bool,
) -> RedisResult<T> {
    if !asking {
        return cmd.query_async(conn).await;
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(cmd.clone());
    let (reply,): (T,) = pipe.query_async(conn).await?;
    Ok(reply)
}

/// One script call of [`Shards::scripts`](super::Shards::scripts), with the
/// slot of its keys.
pub struct Call<'a> {
    pub slot: u16,
    pub script: &'a Script,
    pub invocation: ScriptInvocation<'a>,
}

/// The calls at `indices` of `calls` in one pipeline on `conn`, each
/// call's error its own reply.
pub(super) async fn pipelined(
    conn: &mut Commands,
    indices: &[usize],
    calls: &[Call<'_>],
) -> RedisResult<Vec<Value>> {
    let calls: Vec<&Call<'_>> = indices.iter().filter_map(|&i| calls.get(i)).collect();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for call in &calls {
        pipe.invoke_script(&call.invocation);
    }
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    // Redis forgot its scripts (it restarted): a pipeline does not load
    // them, so load the ones that were missed and send the calls that missed
    // them again (only those: the others ran).
    let missed: Vec<usize> = (0..replies.len())
        .filter(|&i| no_script(&replies[i]))
        .collect();
    if missed.is_empty() {
        return Ok(replies);
    }
    let mut loaded: Vec<&str> = Vec::new();
    let mut again = redis::pipe();
    again.ignore_errors();
    for &i in &missed {
        let call = calls[i];
        if !loaded.contains(&call.script.get_hash()) {
            call.script.load_async(conn).await?;
            loaded.push(call.script.get_hash());
        }
        again.invoke_script(&call.invocation);
    }
    let retried: Vec<Value> = again.query_async(conn).await?;
    for (i, reply) in missed.into_iter().zip(retried) {
        replies[i] = reply;
    }
    Ok(replies)
}

fn no_script(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}
