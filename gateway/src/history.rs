//! The history API's core, whoever asks (a client's `history` in
//! [`crate::session`], `GET /v1/history` in [`crate::http`], `History` in
//! [`crate::grpc`]): the query's bounds, the broker's read
//! ([`router::Broker::read_history`]), and its outcome counted
//! (`herald_history_reads_total`).
//!
//! A page is whole or refused: a `since` out of the window is
//! [`HistoryError::Lost`] (`history_lost`), never part of what was asked.

use proto::ErrorCode;
use proto::json::{HistoryItem, ItemData};
use router::{
    Broker, BrokerError, Causes, HistoryPage, HistoryQuery, PageSize, Position, Publication, Topic,
};
use serde_json::value::RawValue;

use crate::config::{Config, DEFAULT_HISTORY_LIMIT};
use crate::metrics::Metrics;
use crate::payload::Payload;
use crate::publish::{ApiError, Refusal};

/// A history read as a client or a backend asks for it.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Forward: the messages after it; reverse: those below it.
    pub since: Option<u64>,
    /// The epoch `since` is of (the topic's current one when `None`).
    pub epoch: Option<String>,
    /// At most this many ([`DEFAULT_HISTORY_LIMIT`] when `None`, at most
    /// `history.max_limit`); 0: the position only.
    pub limit: Option<u64>,
    /// Newest first.
    pub reverse: bool,
}

/// A page: the topic's position when it was read, and its messages in the
/// order asked for.
#[derive(Debug, Clone)]
pub struct Page {
    pub position: Position,
    pub publications: Vec<Publication>,
}

impl Page {
    /// The messages as the answers carry them: their data is the
    /// publisher's JSON text (checked when it was published), verbatim, or
    /// the bytes of a binary publish ([`Payload`]).
    pub fn items(&self) -> Result<Vec<HistoryItem<'_>>, HistoryError> {
        self.publications
            .iter()
            .map(|p| {
                let data = match Payload::of(&p.data) {
                    Payload::Json(text) => ItemData::Json(
                        serde_json::from_slice::<&RawValue>(text)
                            .map_err(|_| HistoryError::NotJson(p.seq))?,
                    ),
                    Payload::Binary(bytes) => ItemData::Binary(bytes),
                };
                Ok(HistoryItem { seq: p.seq, data })
            })
            .collect()
    }
}

/// Why a history read was not answered.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// `limit` above `history.max_limit`.
    #[error("`limit` is at most {0}")]
    Limit(usize),
    /// `since` is out of the window: the topic's position says where it is.
    #[error(
        "`since` is out of the history of `{topic}` (epoch {}, seq {}): trimmed away, of another epoch or beyond its seq",
        .position.epoch, .position.seq
    )]
    Lost { topic: Topic, position: Position },
    /// The broker could not read (or the namespace is gone).
    #[error("{}", Causes(.0))]
    Broker(#[from] BrokerError),
    /// A kept message is not JSON text (it was when published).
    #[error("the kept message {0} is not JSON text")]
    NotJson(u64),
}

impl HistoryError {
    /// Its code in the protocol's error table.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Limit(_) => ErrorCode::Malformed,
            Self::Lost { .. } => ErrorCode::HistoryLost,
            Self::Broker(BrokerError::UnknownNamespace(_)) => ErrorCode::UnknownNamespace,
            Self::Broker(BrokerError::Unavailable(_)) => ErrorCode::Unavailable,
            Self::NotJson(_) => ErrorCode::Internal,
        }
    }

    /// How the backend API answers it (HTTP, gRPC). A lost `since` is
    /// [`Refusal::Gone`]: the HTTP edge adds the topic's position to its
    /// body.
    pub fn to_api(&self) -> ApiError {
        let message = self.to_string();
        match self {
            Self::Limit(_) => ApiError::invalid(self.code(), message),
            Self::Lost { .. } => ApiError::new(Refusal::Gone, self.code(), message),
            Self::Broker(BrokerError::UnknownNamespace(_)) => {
                ApiError::invalid(self.code(), message)
            }
            Self::Broker(BrokerError::Unavailable(_)) | Self::NotJson(_) => {
                ApiError::new(Refusal::Unavailable, self.code(), message)
            }
        }
    }

    /// Its `outcome` on `herald_history_reads_total`.
    fn outcome(&self) -> &'static str {
        match self {
            Self::Limit(_) | Self::Broker(BrokerError::UnknownNamespace(_)) => "refused",
            Self::Lost { .. } => "lost",
            Self::Broker(BrokerError::Unavailable(_)) | Self::NotJson(_) => "unavailable",
        }
    }
}

/// Counts a history read refused before it reached [`read`] (a bad topic,
/// a namespace that does not let the client subscribe).
pub fn refused(metrics: &Metrics) {
    metrics.history_reads.with_label_values(&["refused"]).inc();
}

/// Reads a page of `topic`'s history, bounded by `history.max_limit` and,
/// in bytes, by `replay.page_bytes` (at least one message).
pub async fn read(
    broker: &dyn Broker,
    config: &Config,
    metrics: &Metrics,
    topic: &Topic,
    query: Query,
) -> Result<Page, HistoryError> {
    let read = read_inner(broker, config, topic, query).await;
    let outcome = match &read {
        Ok(_) => "read",
        Err(e) => {
            match e {
                HistoryError::Broker(BrokerError::Unavailable(_)) | HistoryError::NotJson(_) => {
                    tracing::warn!(error = %e, "a history read failed");
                }
                _ => tracing::debug!(error = %e, "a history read refused"),
            }
            e.outcome()
        }
    };
    metrics.history_reads.with_label_values(&[outcome]).inc();
    read
}

async fn read_inner(
    broker: &dyn Broker,
    config: &Config,
    topic: &Topic,
    query: Query,
) -> Result<Page, HistoryError> {
    let max = config.history.max_limit;
    let limit = match query.limit {
        None => DEFAULT_HISTORY_LIMIT.min(max),
        Some(limit) => match usize::try_from(limit) {
            Ok(limit) if limit <= max => limit,
            _ => return Err(HistoryError::Limit(max)),
        },
    };
    let asked = HistoryQuery {
        since: query.since,
        epoch: query.epoch,
        reverse: query.reverse,
        size: PageSize {
            messages: limit,
            bytes: config.replay.page_bytes,
        },
    };
    match broker.read_history(topic, &asked).await? {
        HistoryPage::Read {
            position,
            publications,
        } => Ok(Page {
            position,
            publications,
        }),
        HistoryPage::Lost { position } => Err(HistoryError::Lost {
            topic: topic.clone(),
            position,
        }),
    }
}
