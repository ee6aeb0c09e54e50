//! The gRPC publish API: `herald.v1.Publisher` (`proto/herald/v1/herald.proto`)
//! on a listener of its own (`grpc.listen`).
//!
//! It is the HTTP backend API by another protocol: the same API keys, the
//! same checks ([`publish::publish_data`], [`publish::subscription`],
//! [`history::read`]) and the same errors, answered with the gRPC code of
//! the HTTP status (see [`status`]; a lost history `since`, HTTP 410, is
//! `OUT_OF_RANGE`). It stops with the drain: the
//! listener closes, calls in flight finish, and the server ends with them.
//!
//! What it spends is bounded before a caller is known: [`connections`] caps
//! the connections (in total and per address) and closes silent ones; HTTP/2
//! caps the streams of each (`grpc.max_concurrent_streams`); and [`gate`]
//! checks each call's API key on its headers, then takes an API request slot
//! and bounds its message by method, before the body is read.

use std::sync::Arc;

use bytes::Bytes;
use proto::json::HistoryResponse as HistoryPage;
use proto::v1::publisher_server::{self, PublisherServer};
use proto::v1::{
    DisconnectRequest, DisconnectResponse, HistoryRequest, HistoryResponse, PresenceRequest,
    PresenceResponse, PresenceStatsRequest, PresenceStatsResponse, PublishBatchRequest,
    PublishBatchResponse, PublishError, PublishRequest, PublishResponse, PublishResult,
    SubscribeRequest, SubscribeResponse, TopicInfoRequest, TopicInfoResponse, UnsubscribeRequest,
    UnsubscribeResponse, publish_result,
};
use router::Position;
use tokio::net::TcpListener;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::history;
use crate::node::Node;
use crate::publish::{self, ApiError, Data, JsonData, MAX_BATCH_ITEMS, Refusal};
use crate::telemetry::{self, Api, Headers};

pub mod connections;
pub mod gate;

/// The metadata key that carries a refusal's code from the error table.
pub const ERROR_CODE_METADATA: &str = "herald-error-code";
/// The largest header block (metadata) a call may send, in bytes (hyper's
/// default, named here so that it cannot grow unnoticed).
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// Serves the `Publisher` service on `listener` until the node drains, then
/// closes the listener and returns once the calls in flight have finished.
pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    let config = &node.config.grpc;
    let limits = gate::Limits::new(node.config.http.max_body_bytes);
    // The gate bounds each method's messages; tonic's own bound is the
    // largest of them, and is never the one that refuses.
    let service = PublisherServer::new(Publisher::new(node.clone()))
        .max_decoding_message_size(limits.batch.max(gate::MAX_SMALL_REQUEST_BYTES));
    let service = gate::Gate::new(service, node.clone(), limits);
    let slots = connections::Slots::new(config, &node.config.websocket, node.metrics.clone());
    let incoming = connections::Incoming::new(listener, slots, config);
    let result = Server::builder()
        // The HTTP API's deadline: a call that takes longer is cancelled.
        .timeout(node.config.http.request_timeout)
        .max_concurrent_streams(config.max_concurrent_streams)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_timeout))
        .serve_with_incoming_shutdown(service, incoming, node.drain.clone().cancelled_owned())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "the gRPC server failed");
    }
}

/// The `Publisher` service over the pod's node. It is served behind
/// [`gate::Gate`], which has checked the caller's API key and taken the
/// call's request slot before a method runs.
pub struct Publisher {
    node: Arc<Node>,
}

impl Publisher {
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    async fn single(&self, request: Request<PublishRequest>) -> Result<PublishResponse, ApiError> {
        self.publish_one(request.into_inner()).await
    }

    /// One item, checked and published as `POST /v1/publish` would.
    async fn publish_one(&self, request: PublishRequest) -> Result<PublishResponse, ApiError> {
        let limit = self.node.config.http.max_body_bytes;
        let data = data(request.data, request.binary, limit)?;
        let position = publish::publish_data(
            &*self.node.broker,
            &self.node.metrics,
            &request.topic,
            data,
            request.idempotency_key.as_deref(),
        )
        .await?;
        Ok(published(position))
    }

    async fn batch(
        &self,
        request: Request<PublishBatchRequest>,
    ) -> Result<PublishBatchResponse, ApiError> {
        let items = request.into_inner().items;
        if items.len() > MAX_BATCH_ITEMS {
            return Err(ApiError::new(
                Refusal::TooLarge,
                proto::ErrorCode::Malformed,
                format!("a batch is limited to {MAX_BATCH_ITEMS} items"),
            ));
        }
        let limit = self.node.config.http.max_body_bytes;
        let items = items
            .into_iter()
            .map(|item| {
                Ok(publish::BatchItem {
                    data: data(item.data, item.binary, limit)?,
                    topic: item.topic,
                    idempotency_key: item.idempotency_key,
                })
            })
            .collect();
        let answers = publish::publish_batch(&*self.node.broker, &self.node.metrics, items).await;
        let results = answers
            .into_iter()
            .map(|answer| {
                let result = match answer {
                    Ok(position) => publish_result::Result::Published(published(position)),
                    Err(e) => publish_result::Result::Error(PublishError {
                        code: e.code.as_str().to_owned(),
                        message: e.message,
                    }),
                };
                PublishResult {
                    result: Some(result),
                }
            })
            .collect();
        Ok(PublishBatchResponse { results })
    }

    async fn info(
        &self,
        request: Request<TopicInfoRequest>,
    ) -> Result<TopicInfoResponse, ApiError> {
        let topic = publish::topic(&request.get_ref().topic)?;
        let position = self
            .node
            .broker
            .recover(&topic, None, router::PageSize::UNBOUNDED)
            .await?
            .position;
        Ok(TopicInfoResponse {
            seq: position.seq,
            epoch: position.epoch.to_string(),
            subscribers: self.node.hub.subscribers(&topic) as u64,
        })
    }

    /// A page of a topic's history, as `GET /v1/history` reads it; a lost
    /// `since` is `OUT_OF_RANGE`, its message naming the topic's position.
    async fn history(&self, request: HistoryRequest) -> Result<HistoryResponse, ApiError> {
        let node = &self.node;
        let topic =
            publish::topic(&request.topic).inspect_err(|_| history::refused(&node.metrics))?;
        let query = history::Query {
            since: request.since,
            epoch: request.epoch,
            limit: request.limit,
            reverse: request.reverse,
        };
        let page = history::read(&*node.broker, &node.config, &node.metrics, &topic, query)
            .await
            .map_err(|e| e.to_api())?;
        let items = page.items().map_err(|e| e.to_api())?;
        let answer = HistoryPage {
            topic: topic.as_str(),
            epoch: &page.position.epoch,
            seq: page.position.seq,
            publications: &items,
        };
        Ok(answer.to_proto())
    }

    /// Counts the call and turns its error into a status.
    fn answer<T>(&self, method: &str, result: Result<T, ApiError>) -> Result<Response<T>, Status> {
        let result = result.map(Response::new).map_err(status);
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        self.node
            .metrics
            .grpc_requests
            .with_label_values(&[method, code_name(code)])
            .inc();
        result
    }
}

#[tonic::async_trait]
impl publisher_server::Publisher for Publisher {
    async fn publish(
        &self,
        request: Request<PublishRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let span = telemetry::publish_span(Api::GrpcPublish, Headers(request.metadata().as_ref()));
        let result = self.single(request).instrument(span.clone()).await;
        if let Err(e) = &result {
            telemetry::failed(&span, e);
        }
        self.answer("Publish", result)
    }

    async fn publish_batch(
        &self,
        request: Request<PublishBatchRequest>,
    ) -> Result<Response<PublishBatchResponse>, Status> {
        let span =
            telemetry::publish_span(Api::GrpcPublishBatch, Headers(request.metadata().as_ref()));
        let result = self.batch(request).instrument(span.clone()).await;
        if let Err(e) = &result {
            telemetry::failed(&span, e);
        }
        self.answer("PublishBatch", result)
    }

    async fn topic_info(
        &self,
        request: Request<TopicInfoRequest>,
    ) -> Result<Response<TopicInfoResponse>, Status> {
        self.answer("TopicInfo", self.info(request).await)
    }

    async fn disconnect(
        &self,
        request: Request<DisconnectRequest>,
    ) -> Result<Response<DisconnectResponse>, Status> {
        let result = async {
            let node = &self.node;
            let window = node.config.session.resume_window;
            publish::disconnect_user(&*node.sessions, window, &request.get_ref().user).await?;
            Ok(DisconnectResponse {})
        };
        self.answer("Disconnect", result.await)
    }

    async fn history(
        &self,
        request: Request<HistoryRequest>,
    ) -> Result<Response<HistoryResponse>, Status> {
        self.answer(
            "History",
            Publisher::history(self, request.into_inner()).await,
        )
    }

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<SubscribeResponse>, Status> {
        let request = request.into_inner();
        let asked = publish::Subscription {
            user: request.user,
            topic: request.topic,
            subscribe: true,
            since: request.since,
            epoch: request.epoch,
        };
        let result = publish::subscription(&*self.node.broker, &self.node.metrics, asked).await;
        self.answer("Subscribe", result.map(|()| SubscribeResponse {}))
    }

    async fn unsubscribe(
        &self,
        request: Request<UnsubscribeRequest>,
    ) -> Result<Response<UnsubscribeResponse>, Status> {
        let request = request.into_inner();
        let asked = publish::Subscription {
            user: request.user,
            topic: request.topic,
            subscribe: false,
            since: None,
            epoch: None,
        };
        let result = publish::subscription(&*self.node.broker, &self.node.metrics, asked).await;
        self.answer("Unsubscribe", result.map(|()| UnsubscribeResponse {}))
    }

    async fn presence(
        &self,
        request: Request<PresenceRequest>,
    ) -> Result<Response<PresenceResponse>, Status> {
        let result = async {
            let node = &self.node;
            let request = request.into_inner();
            let (topic, page) = publish::presence_page(
                &node.presence,
                &node.pod.namespaces,
                &request.topic,
                request.cursor.as_deref(),
                request.limit.map(u64::from),
            )
            .await?;
            let members = page.json_members();
            let page = proto::json::PresencePage {
                topic: topic.as_str(),
                position: page.counts.position,
                users: page.counts.users,
                connections: page.counts.connections,
                members: &members,
                cursor: page.cursor.as_deref(),
            };
            Ok(page.to_proto())
        };
        self.answer("Presence", result.await)
    }

    async fn presence_stats(
        &self,
        request: Request<PresenceStatsRequest>,
    ) -> Result<Response<PresenceStatsResponse>, Status> {
        let result = async {
            let node = &self.node;
            let stats = publish::presence_stats(
                &node.presence,
                &node.pod.namespaces,
                &request.get_ref().topic,
            )
            .await?;
            Ok(stats.to_proto())
        };
        self.answer("PresenceStats", result.await)
    }
}

/// A request's `data`: bytes where it says `binary`, JSON text (checked)
/// otherwise; at most `limit` bytes either way.
fn data(data: Vec<u8>, binary: bool, limit: usize) -> Result<Data, ApiError> {
    if binary {
        Data::binary(&data, limit)
    } else {
        JsonData::parse(Bytes::from(data), limit).map(Data::from)
    }
}

fn published(position: Position) -> PublishResponse {
    PublishResponse {
        seq: position.seq,
        epoch: position.epoch.to_string(),
    }
}

/// The gRPC status of a refusal: the code of its HTTP status, the message
/// prefixed with the error table's code, which the `herald-error-code`
/// metadata also carries.
pub fn status(e: ApiError) -> Status {
    let code = match e.refusal {
        Refusal::Invalid => Code::InvalidArgument,
        Refusal::Unauthenticated => Code::Unauthenticated,
        Refusal::TooLarge => Code::ResourceExhausted,
        Refusal::UnsupportedType => Code::InvalidArgument,
        Refusal::Unavailable => Code::Unavailable,
        Refusal::Gone => Code::OutOfRange,
        Refusal::Precondition => Code::FailedPrecondition,
    };
    let mut metadata = MetadataMap::new();
    metadata.insert(
        ERROR_CODE_METADATA,
        MetadataValue::from_static(e.code.as_str()),
    );
    Status::with_metadata(code, e.to_string(), metadata)
}

/// The canonical name of a gRPC status code (the `code` metric label).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
