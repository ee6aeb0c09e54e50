//! What the engine reads out of Redis's replies: pure functions over
//! [`redis::Value`], one per reply shape the scripts and commands give.
//! A reply of another shape is `None`, or [`Unavailable::Protocol`] where
//! the caller is told; an error reply is Redis's error
//! ([`Unavailable::Redis`]).
//!
//! [`Unavailable::Protocol`]: crate::Unavailable::Protocol
//! [`Unavailable::Redis`]: crate::Unavailable::Redis

use std::sync::Arc;

use bytes::Bytes;
use redis::{RedisResult, Value};

use super::call::{failed, unreadable};
use super::recover::Recovered;
use crate::{BrokerError, Epoch, Position, Publication, Stored, Topic, Unavailable};

/// [`scripts::RECOVER`]'s reply, `[seq, epoch, now_ms, clock, lineage,
/// entries?, base?]`: where the topic stands, and the lineage it was read
/// in.
///
/// [`scripts::RECOVER`]: super::scripts::RECOVER
pub(super) fn parse_recovered(topic: &Topic, value: Value) -> Option<(Recovered, String)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let seq = as_u64(&items.next()?)?;
    let epoch: Epoch = Arc::from(as_string(&items.next()?)?);
    let now_ms = as_u64(&items.next()?)?;
    let clock = as_u64(&items.next()?)?;
    let line = as_string(&items.next()?)?;
    let entries = match items.next() {
        Some(entries) => Some(parse_entries(topic, &epoch, entries)?),
        None => None,
    };
    let base = match items.next() {
        Some(base) => Some(as_u64(&base)?),
        None => None,
    };
    Some((
        Recovered {
            position: Position { epoch, seq },
            now_ms,
            clock,
            entries,
            base,
        },
        line,
    ))
}

/// Parses an `XRANGE` reply into publications, with each one's publish time.
pub(super) fn parse_entries(
    topic: &Topic,
    epoch: &Epoch,
    value: Value,
) -> Option<Vec<(Publication, u64)>> {
    let Value::Array(entries) = value else {
        return None;
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let mut parts = parts.into_iter();
            let id = as_string(&parts.next()?)?;
            let seq = id.split_once('-')?.0.parse().ok()?;
            let Value::Array(fields) = parts.next()? else {
                return None;
            };
            let mut data = None;
            let mut at = 0;
            for pair in fields.chunks(2) {
                match (pair.first().and_then(as_string).as_deref(), pair.get(1)) {
                    (Some("d"), Some(Value::BulkString(d))) => {
                        data = Some(Bytes::copy_from_slice(d))
                    }
                    (Some("t"), Some(t)) => at = as_u64(t)?,
                    _ => {}
                }
            }
            Some((
                Publication {
                    topic: topic.clone(),
                    epoch: epoch.clone(),
                    seq,
                    data: data?,
                },
                at,
            ))
        })
        .collect()
}

/// A number, as an integer reply or its text.
pub(super) fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// Text, as a string reply or an integer's digits.
pub(super) fn as_string(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// What [`scripts::PAGE`] answered: Redis's time, and the topic's seq and
/// the entries, unless the topic left the epoch.
///
/// [`scripts::PAGE`]: super::scripts::PAGE
pub(super) type PageReply = (u64, Option<(u64, Vec<(Publication, u64)>)>);

/// [`scripts::PAGE`]'s reply: `[now_ms]` when the topic left `epoch`, else
/// `[now_ms, seq, entries]`.
///
/// [`scripts::PAGE`]: super::scripts::PAGE
pub(super) fn parse_page(topic: &Topic, epoch: &Epoch, value: Value) -> Option<PageReply> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let now_ms = as_u64(&items.next()?)?;
    let Some(seq) = items.next() else {
        return Some((now_ms, None));
    };
    let seq = as_u64(&seq)?;
    let entries = parse_entries(topic, epoch, items.next()?)?;
    Some((now_ms, Some((seq, entries))))
}

/// What one publish of [`scripts::PUBLISH`] answered.
///
/// [`scripts::PUBLISH`]: super::scripts::PUBLISH
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Published {
    pub position: Position,
    /// The lineage clock and line it was published in; `None` for the
    /// repeat of an idempotent publish stored by an older version.
    pub lineage: Option<(u64, String)>,
}

/// A publish's reply, `"<seq>:<epoch>:<clock>:<lineage>"`.
pub(super) fn parse_published(reply: Value) -> Result<Published, BrokerError> {
    let reply = match reply {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        Value::ServerError(e) => return Err(failed("publish", e.into())),
        _ => None,
    }
    .ok_or_else(|| unreadable("publish"))?;
    let mut parts = reply.split(':');
    let (seq, epoch) = parts
        .next()
        .and_then(|seq| seq.parse().ok())
        .zip(parts.next())
        .ok_or_else(|| unreadable("publish"))?;
    // The repeat of an idempotent publish stored by an older version
    // has no lineage.
    let lineage = match (parts.next().and_then(|c| c.parse().ok()), parts.next()) {
        (Some(clock), Some(line)) => Some((clock, line.to_owned())),
        _ => None,
    };
    Ok(Published {
        position: Position {
            epoch: Arc::from(epoch),
            seq,
        },
        lineage,
    })
}

/// The reply of one [`scripts::PUBLISH`] call of `items` publishes, one
/// reply each: an error for the whole call (it did not run) is each one's.
///
/// [`scripts::PUBLISH`]: super::scripts::PUBLISH
pub(super) fn publish_call(
    reply: RedisResult<Value>,
    items: usize,
) -> Vec<Result<Value, BrokerError>> {
    match reply {
        Ok(Value::Array(replies)) if replies.len() == items => {
            replies.into_iter().map(Ok).collect()
        }
        Ok(Value::ServerError(e)) => vec![Ok(Value::ServerError(e)); items],
        Ok(_) => vec![Err(unreadable("publish")); items],
        Err(e) => vec![Err(failed("publish", e)); items],
    }
}

/// What [`scripts::CLAIM_SESSION`] answered.
///
/// [`scripts::CLAIM_SESSION`]: super::scripts::CLAIM_SESSION
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ClaimReply {
    /// `nil`: no such session.
    NotFound,
    /// `0`: the session is another user's.
    OtherUser,
    /// It ran: with what it took, if it ran in time.
    Ran(Ran),
}

/// A claim that ran: `[now_ms]` if too late, else `[from, body, owner,
/// now_ms]`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Ran {
    /// `None`: the claim ran after its deadline and took nothing.
    pub taken: Option<Taken>,
    /// Redis's clock when the claim ran.
    pub redis_ms: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Taken {
    /// The previous owner ("" for none).
    pub from: String,
    /// The snapshot, without the owner line.
    pub body: Vec<u8>,
    /// The new owner, with its rank: what the connection saves with.
    pub owner: String,
}

pub(super) fn parse_claim(value: Value) -> Result<ClaimReply, BrokerError> {
    match value {
        Value::Nil => Ok(ClaimReply::NotFound),
        Value::Int(0) => Ok(ClaimReply::OtherUser),
        Value::ServerError(e) => Err(failed("session_load", e.into())),
        value => parse_ran(value)
            .map(ClaimReply::Ran)
            .ok_or_else(|| unreadable("claim")),
    }
}

fn parse_ran(value: Value) -> Option<Ran> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let first = items.next()?;
    let Some(body) = items.next() else {
        // `{now}`: too late.
        return Some(Ran {
            taken: None,
            redis_ms: as_u64(&first)?,
        });
    };
    let bytes = |value: Value| match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    };
    let text = |value: Value| String::from_utf8(bytes(value)?).ok();
    let taken = Taken {
        from: text(first)?,
        body: bytes(body)?,
        owner: text(items.next()?)?,
    };
    Some(Ran {
        taken: Some(taken),
        redis_ms: as_u64(&items.next()?)?,
    })
}

/// A save's (or an extend's) reply, `None` when the pipeline gave none:
/// `1` kept, `-1` gone, any other number refused.
pub(super) fn parse_saved(reply: Option<RedisResult<Value>>) -> Result<Stored, BrokerError> {
    match reply {
        Some(Ok(Value::Int(1))) => Ok(Stored::Kept),
        Some(Ok(Value::Int(-1))) => Ok(Stored::Gone),
        Some(Ok(Value::Int(_))) => Ok(Stored::Refused),
        Some(Ok(Value::ServerError(e))) => Err(failed("session_save", e.into())),
        Some(Ok(_)) => Err(unreadable("session save")),
        Some(Err(e)) => Err(failed("session_save", e)),
        None => Err(BrokerError::Unavailable(Unavailable::Unanswered(
            "session save",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Causes;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// An error reply as redis-rs hands it back.
    fn error_reply(line: &str) -> Value {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(value @ Value::ServerError(_)) => value,
            other => panic!("not an error reply: {other:?}"),
        }
    }

    fn topic() -> Topic {
        Topic::parse("news").expect("a topic")
    }

    fn epoch() -> Epoch {
        Arc::from("e1")
    }

    /// An `XRANGE` entry: `[id, [field, value, ...]]`.
    fn entry(id: &str, fields: &[Value]) -> Value {
        Value::Array(vec![bulk(id), Value::Array(fields.to_vec())])
    }

    fn seqs(entries: &[(Publication, u64)]) -> Vec<(u64, &[u8], u64)> {
        entries
            .iter()
            .map(|(p, at)| (p.seq, p.data.as_ref(), *at))
            .collect()
    }

    /// The reply an error names, if it is [`Unavailable::Protocol`].
    fn unreadable_reply(e: &BrokerError) -> Option<&'static str> {
        match e {
            BrokerError::Unavailable(Unavailable::Protocol { reply }) => Some(reply),
            _ => None,
        }
    }

    /// The call an error names, if it is [`Unavailable::Redis`].
    fn failed_call(e: &BrokerError) -> Option<&'static str> {
        match e {
            BrokerError::Unavailable(Unavailable::Redis { call, .. }) => Some(call),
            _ => None,
        }
    }

    #[test]
    fn numbers_and_text_are_read_from_either_kind_of_reply() {
        assert_eq!(as_u64(&Value::Int(5)), Some(5));
        assert_eq!(as_u64(&bulk("5")), Some(5));
        assert_eq!(as_u64(&Value::SimpleString("5".into())), Some(5));
        assert_eq!(as_u64(&Value::Int(-1)), None);
        assert_eq!(as_u64(&bulk("five")), None);
        assert_eq!(as_u64(&Value::Nil), None);
        assert_eq!(as_string(&bulk("e1")), Some("e1".into()));
        assert_eq!(
            as_string(&Value::SimpleString("e1".into())),
            Some("e1".into())
        );
        assert_eq!(as_string(&Value::Int(42)), Some("42".into()));
        assert_eq!(as_string(&Value::BulkString(vec![0xff, 0xfe])), None);
        assert_eq!(as_string(&Value::Nil), None);
    }

    #[test]
    fn history_entries_give_seq_data_and_publish_time() {
        let reply = Value::Array(vec![
            entry(
                "3-0",
                &[bulk("d"), bulk("{\"a\":1}"), bulk("t"), Value::Int(900)],
            ),
            // Fields in another order, one unknown, and the time as text.
            entry(
                "4-0",
                &[
                    bulk("t"),
                    bulk("901"),
                    bulk("x"),
                    bulk("?"),
                    bulk("d"),
                    bulk("2"),
                ],
            ),
            // No time: 0.
            entry("5-0", &[bulk("d"), bulk("3")]),
        ]);
        let entries = parse_entries(&topic(), &epoch(), reply).expect("entries");
        assert_eq!(
            seqs(&entries),
            [
                (3, &b"{\"a\":1}"[..], 900),
                (4, &b"2"[..], 901),
                (5, &b"3"[..], 0)
            ]
        );
        assert!(
            entries
                .iter()
                .all(|(p, _)| p.topic == topic() && p.epoch == epoch())
        );
        let none = parse_entries(&topic(), &epoch(), Value::Array(vec![])).expect("entries");
        assert!(none.is_empty());
    }

    #[test]
    fn a_history_entry_of_another_shape_fails_the_whole_reply() {
        let good = entry("1-0", &[bulk("d"), bulk("1")]);
        let bad = [
            // Not an array.
            bulk("1-0"),
            // No data.
            entry("2-0", &[bulk("t"), Value::Int(1)]),
            // Data that is not a bulk string.
            entry("2-0", &[bulk("d"), Value::Int(1)]),
            // An id that is not `<seq>-<n>`.
            entry("2", &[bulk("d"), bulk("1")]),
            entry("x-0", &[bulk("d"), bulk("1")]),
            // Fields that are not an array.
            Value::Array(vec![bulk("2-0"), bulk("d")]),
            // No fields.
            Value::Array(vec![bulk("2-0")]),
            // A time that is no number.
            entry("2-0", &[bulk("d"), bulk("1"), bulk("t"), bulk("soon")]),
        ];
        for bad in bad {
            let reply = Value::Array(vec![good.clone(), bad.clone()]);
            assert!(
                parse_entries(&topic(), &epoch(), reply).is_none(),
                "{bad:?}"
            );
        }
        assert!(parse_entries(&topic(), &epoch(), Value::Nil).is_none());
    }

    #[test]
    fn a_recover_reply_gives_the_position_clock_and_lineage() {
        let reply = Value::Array(vec![
            Value::Int(7),
            bulk("e1"),
            Value::Int(1_000),
            Value::Int(5),
            bulk("line"),
        ]);
        let (recovered, line) = parse_recovered(&topic(), reply).expect("a recover reply");
        assert_eq!(
            recovered.position,
            Position {
                epoch: epoch(),
                seq: 7
            }
        );
        assert_eq!((recovered.now_ms, recovered.clock), (1_000, 5));
        assert_eq!(line, "line");
        assert!(recovered.entries.is_none());
        assert_eq!(recovered.base, None);
    }

    #[test]
    fn a_recover_reply_with_history_and_a_base_gives_both() {
        let reply = Value::Array(vec![
            bulk("7"),
            bulk("e2"),
            bulk("1000"),
            bulk("5"),
            bulk("line"),
            Value::Array(vec![entry(
                "7-0",
                &[bulk("d"), bulk("7"), bulk("t"), Value::Int(999)],
            )]),
            Value::Int(6),
        ]);
        let (recovered, _) = parse_recovered(&topic(), reply).expect("a recover reply");
        assert_eq!(recovered.position.epoch.as_ref(), "e2");
        let entries = recovered.entries.expect("entries");
        assert_eq!(seqs(&entries), [(7, &b"7"[..], 999)]);
        assert_eq!(entries[0].0.epoch.as_ref(), "e2");
        assert_eq!(recovered.base, Some(6));
    }

    #[test]
    fn a_recover_reply_of_another_shape_is_not_read() {
        let good = || {
            vec![
                Value::Int(7),
                bulk("e1"),
                Value::Int(1_000),
                Value::Int(5),
                bulk("line"),
            ]
        };
        assert!(parse_recovered(&topic(), bulk("7:e1")).is_none());
        assert!(parse_recovered(&topic(), Value::Nil).is_none());
        // A field missing.
        for missing in 0..5 {
            let mut items = good();
            items.truncate(missing);
            assert!(
                parse_recovered(&topic(), Value::Array(items)).is_none(),
                "{missing} fields"
            );
        }
        // A field of the wrong type.
        let wrong = [
            (0, bulk("seven")),
            (0, Value::Int(-7)),
            (1, Value::Nil),
            (2, Value::Array(vec![])),
            (3, bulk("")),
            (4, Value::Nil),
        ];
        for (at, value) in wrong {
            let mut items = good();
            items[at] = value.clone();
            assert!(
                parse_recovered(&topic(), Value::Array(items)).is_none(),
                "{at}: {value:?}"
            );
        }
        // History that is not an array, a base that is no number.
        let mut items = good();
        items.push(bulk("entries"));
        assert!(parse_recovered(&topic(), Value::Array(items)).is_none());
        let mut items = good();
        items.extend([Value::Array(vec![]), bulk("base")]);
        assert!(parse_recovered(&topic(), Value::Array(items)).is_none());
    }

    #[test]
    fn a_page_reply_gives_the_entries_or_says_the_epoch_was_left() {
        let left = Value::Array(vec![Value::Int(1_000)]);
        assert_eq!(
            parse_page(&topic(), &epoch(), left).map(|(now, read)| (now, read.is_none())),
            Some((1_000, true))
        );
        let read = Value::Array(vec![
            Value::Int(1_000),
            Value::Int(9),
            Value::Array(vec![entry(
                "9-0",
                &[bulk("d"), bulk("9"), bulk("t"), Value::Int(1)],
            )]),
        ]);
        let (now, read) = parse_page(&topic(), &epoch(), read).expect("a page reply");
        let (seq, entries) = read.expect("entries");
        assert_eq!((now, seq), (1_000, 9));
        assert_eq!(seqs(&entries), [(9, &b"9"[..], 1)]);
    }

    #[test]
    fn a_page_reply_of_another_shape_is_not_read() {
        let bad = [
            Value::Nil,
            Value::Int(1_000),
            Value::Array(vec![]),
            Value::Array(vec![bulk("now")]),
            // A seq without entries.
            Value::Array(vec![Value::Int(1_000), Value::Int(9)]),
            Value::Array(vec![Value::Int(1_000), bulk("nine"), Value::Array(vec![])]),
            Value::Array(vec![Value::Int(1_000), Value::Int(9), bulk("entries")]),
        ];
        for bad in bad {
            assert!(
                parse_page(&topic(), &epoch(), bad.clone()).is_none(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_publish_reply_gives_the_position_and_its_lineage() {
        let published = parse_published(bulk("5:e1:9:line")).expect("a publish reply");
        assert_eq!(
            published.position,
            Position {
                epoch: epoch(),
                seq: 5
            }
        );
        assert_eq!(published.lineage, Some((9, "line".to_owned())));
        // The repeat of an idempotent publish stored by an older version.
        let repeat = parse_published(Value::SimpleString("5:e1".into())).expect("a reply");
        assert_eq!(
            repeat.position,
            Position {
                epoch: epoch(),
                seq: 5
            }
        );
        assert_eq!(repeat.lineage, None);
        // A clock that is no number: no lineage, the position all the same.
        let odd = parse_published(bulk("5:e1:x:line")).expect("a reply");
        assert_eq!((odd.position.seq, odd.lineage), (5, None));
    }

    #[test]
    fn a_publish_reply_of_another_shape_is_unreadable_and_an_error_reply_is_redis_s() {
        for bad in [
            bulk("five:e1"),
            bulk("5"),
            bulk(""),
            Value::BulkString(vec![0xff]),
            Value::Int(5),
            Value::Nil,
            Value::Array(vec![bulk("5:e1")]),
        ] {
            let e = parse_published(bad.clone()).expect_err("unreadable");
            assert_eq!(unreadable_reply(&e), Some("publish"), "{bad:?}");
        }
        let e = parse_published(error_reply(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ))
        .expect_err("an error reply");
        assert_eq!(failed_call(&e), Some("publish"));
        assert!(
            Causes(&e).to_string().contains("WRONGTYPE"),
            "{}",
            Causes(&e)
        );
    }

    #[test]
    fn a_publish_call_s_reply_is_one_per_publish() {
        let two = publish_call(Ok(Value::Array(vec![bulk("1:e1"), bulk("2:e1")])), 2);
        assert!(matches!(&two[..], [Ok(a), Ok(b)] if *a == bulk("1:e1") && *b == bulk("2:e1")));
        // An error for the whole call is each publish's, as Redis said it.
        let refused = publish_call(Ok(error_reply("NOSCRIPT No matching script")), 2);
        assert_eq!(refused.len(), 2);
        assert!(
            refused
                .iter()
                .all(|r| matches!(r, Ok(Value::ServerError(_))))
        );
        // A count that does not match, or no array: unreadable, each.
        for bad in [Value::Array(vec![bulk("1:e1")]), bulk("1:e1"), Value::Nil] {
            let answers = publish_call(Ok(bad.clone()), 2);
            assert_eq!(answers.len(), 2);
            assert!(
                answers.iter().all(|r| r
                    .as_ref()
                    .is_err_and(|e| unreadable_reply(e) == Some("publish"))),
                "{bad:?}"
            );
        }
        let io = redis::RedisError::from(std::io::Error::other("connection reset"));
        let lost = publish_call(Err(io), 3);
        assert_eq!(lost.len(), 3);
        for answer in &lost {
            let e = answer.as_ref().expect_err("failed");
            assert_eq!(failed_call(e), Some("publish"));
            assert_eq!(
                Causes(e).to_string(),
                "broker unavailable: redis: publish failed: connection reset"
            );
        }
    }

    #[test]
    fn a_claim_reply_says_what_the_claim_found() {
        assert_eq!(parse_claim(Value::Nil).ok(), Some(ClaimReply::NotFound));
        assert_eq!(parse_claim(Value::Int(0)).ok(), Some(ClaimReply::OtherUser));
        let late = parse_claim(Value::Array(vec![Value::Int(1_234)])).ok();
        assert_eq!(
            late,
            Some(ClaimReply::Ran(Ran {
                taken: None,
                redis_ms: 1_234
            }))
        );
        let taken = parse_claim(Value::Array(vec![
            bulk("pod-a@3"),
            Value::BulkString(b"{\"subs\":[]}".to_vec()),
            Value::SimpleString("pod-b@4".into()),
            bulk("1235"),
        ]))
        .ok();
        assert_eq!(
            taken,
            Some(ClaimReply::Ran(Ran {
                taken: Some(Taken {
                    from: "pod-a@3".into(),
                    body: b"{\"subs\":[]}".to_vec(),
                    owner: "pod-b@4".into(),
                }),
                redis_ms: 1_235,
            }))
        );
    }

    #[test]
    fn a_claim_reply_of_another_shape_is_unreadable_and_an_error_reply_is_redis_s() {
        let bad = [
            Value::Int(1),
            bulk("taken"),
            Value::Array(vec![]),
            Value::Array(vec![bulk("soon")]),
            // The owner missing, then the time.
            Value::Array(vec![bulk(""), bulk("body")]),
            Value::Array(vec![bulk(""), bulk("body"), bulk("pod-b@4")]),
            // A field of the wrong type.
            Value::Array(vec![
                Value::Int(1),
                bulk("body"),
                bulk("pod-b@4"),
                Value::Int(1),
            ]),
            Value::Array(vec![bulk(""), Value::Nil, bulk("pod-b@4"), Value::Int(1)]),
            Value::Array(vec![
                bulk(""),
                bulk("body"),
                Value::BulkString(vec![0xff]),
                Value::Int(1),
            ]),
            Value::Array(vec![bulk(""), bulk("body"), bulk("pod-b@4"), bulk("then")]),
        ];
        for bad in bad {
            let e = parse_claim(bad.clone()).expect_err("unreadable");
            assert_eq!(unreadable_reply(&e), Some("claim"), "{bad:?}");
        }
        let e = parse_claim(error_reply("BUSY Redis is busy running a script"))
            .expect_err("an error reply");
        assert_eq!(failed_call(&e), Some("session_load"));
        assert!(Causes(&e).to_string().contains("BUSY"), "{}", Causes(&e));
    }

    #[test]
    fn a_save_reply_says_whether_the_session_was_kept() {
        assert!(matches!(
            parse_saved(Some(Ok(Value::Int(1)))),
            Ok(Stored::Kept)
        ));
        assert!(matches!(
            parse_saved(Some(Ok(Value::Int(-1)))),
            Ok(Stored::Gone)
        ));
        assert!(matches!(
            parse_saved(Some(Ok(Value::Int(0)))),
            Ok(Stored::Refused)
        ));
        assert!(matches!(
            parse_saved(Some(Ok(Value::Int(2)))),
            Ok(Stored::Refused)
        ));
        for bad in [bulk("1"), Value::Nil, Value::Array(vec![Value::Int(1)])] {
            let e = parse_saved(Some(Ok(bad.clone()))).expect_err("unreadable");
            assert_eq!(unreadable_reply(&e), Some("session save"), "{bad:?}");
        }
        let e = parse_saved(Some(Ok(error_reply("OOM command not allowed")))).expect_err("refused");
        assert_eq!(failed_call(&e), Some("session_save"));
        assert!(Causes(&e).to_string().contains("OOM"), "{}", Causes(&e));
        let io = redis::RedisError::from(std::io::Error::other("broken pipe"));
        let e = parse_saved(Some(Err(io))).expect_err("failed");
        assert_eq!(failed_call(&e), Some("session_save"));
        let e = parse_saved(None).expect_err("unanswered");
        assert!(matches!(
            e,
            BrokerError::Unavailable(Unavailable::Unanswered("session save"))
        ));
    }
}
