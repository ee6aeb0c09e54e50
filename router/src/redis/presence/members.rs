//! Members across pods, for join/leave events told once
//! ([`crate::Deliver::members`]): each write of a pod's part (and each
//! cleanup of a dead pod's) sets the users its instance holds in the topic
//! ([`MEMBERS`]), which counts per user the instances holding them and
//! returns the users whose count went 0 -> 1 (joins) and 1 -> 0 (leaves).
//! The script is atomic, so each transition goes to one caller: the pod
//! whose write caused it, or the cleaner. Kept only when asked for
//! ([`crate::PresenceSettings::members`]): otherwise nothing is written.
//!
//! The count is bookkeeping beside the presence hash, not in the same
//! script: a write whose count failed leaves its part dirty, and the next
//! write of it counts again (the same users change nothing).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use redis::Value;

use super::Context;
use super::scripts::MEMBERS;
use crate::presence::PodMembers;
use crate::redis::call::{timed, unreadable};
use crate::{BrokerError, Member, Topic};

/// Sets `instance`'s users of `topic` to `part`'s (none: a cleared part)
/// and tells the sink of the joins and leaves that made. Nothing unless
/// join/leave events are asked for.
pub(super) async fn count(
    context: &Context,
    topic: &Topic,
    instance: &str,
    part: Option<&PodMembers>,
) -> Result<(), BrokerError> {
    if !context.settings.members {
        return Ok(());
    }
    let users = context.keys.users(topic);
    let mut invocation = MEMBERS.prepare_invoke();
    invocation
        .key(&users)
        .key(context.keys.users_of(topic, instance));
    if let Some(part) = part {
        for (user, _, _) in part.iter() {
            invocation.arg(&**user);
        }
    }
    let counting = context
        .shards
        .script::<Value>(&users, &MEMBERS, &invocation);
    let reply = timed(&*context.observer, "presence_members", counting).await?;
    let (joins, leaves) = parse(reply).ok_or_else(|| unreadable("presence members"))?;
    if joins.is_empty() && leaves.is_empty() {
        return Ok(());
    }
    let infos: HashMap<&str, &Bytes> = match (part, joins.is_empty()) {
        (Some(part), false) => part
            .iter()
            .filter_map(|(user, _, info)| Some((&**user, info?)))
            .collect(),
        _ => HashMap::new(),
    };
    let joins: Vec<Member> = joins
        .into_iter()
        .map(|user| {
            let info = infos.get(&*user).map(|info| (*info).clone());
            Member { user, info }
        })
        .collect();
    context.sink.members(topic, &joins, &leaves);
    Ok(())
}

type Users = Vec<Arc<str>>;

/// [`MEMBERS`]'s reply: `[joins, leaves]`.
fn parse(value: Value) -> Option<(Users, Users)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let list = |v: Value| -> Option<Users> {
        let Value::Array(users) = v else {
            return None;
        };
        Some(
            users
                .into_iter()
                .filter_map(|u| match u {
                    Value::BulkString(b) => String::from_utf8(b).ok().map(Arc::from),
                    _ => None,
                })
                .collect(),
        )
    };
    let joins = list(items.next()?)?;
    let leaves = list(items.next()?)?;
    Some((joins, leaves))
}
