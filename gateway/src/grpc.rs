//! The gRPC publish API: `herald.v1.Publisher` (`proto/herald/v1/herald.proto`)
//! on a listener of its own (`grpc.listen`).
//!
//! It is the HTTP publish API by another protocol: the same API keys, the same
//! checks ([`publish::publish_data`]) and the same errors, answered with the gRPC
//! code of the HTTP status (see [`status`]). It stops with the drain: the
//! listener closes, calls in flight finish, and the server ends with them.

use std::sync::Arc;

use bytes::Bytes;
use proto::v1::publisher_server::{self, PublisherServer};
use proto::v1::{
    DisconnectRequest, DisconnectResponse, PublishBatchRequest, PublishBatchResponse, PublishError,
    PublishRequest, PublishResponse, PublishResult, TopicInfoRequest, TopicInfoResponse,
    publish_result,
};
use router::Position;
use tokio::net::TcpListener;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::listener;
use crate::node::Node;
use crate::publish::{self, ApiError, JsonData, MAX_BATCH_ITEMS, Refusal};
use crate::telemetry::{self, Api, Headers};

/// Largest request the server decodes, in bytes (tonic's default): bounds a
/// batch. It grows to hold one `data` of `http.max_body_bytes` where that
/// is larger. A request over it is refused by tonic with `OUT_OF_RANGE`.
pub const MAX_REQUEST_BYTES: usize = publish::MAX_BATCH_BYTES;
/// Room in a `Publish` request for its topic, key and framing, besides `data`.
const REQUEST_OVERHEAD_BYTES: usize = 1024;
/// The metadata key that carries a refusal's code from the error table.
pub const ERROR_CODE_METADATA: &str = "herald-error-code";
/// The metadata key of the API key (metadata keys are HTTP/2 header names,
/// in lower case).
const AUTHORIZATION: &str = "authorization";

/// Serves the `Publisher` service on `listener` until the node drains, then
/// closes the listener and returns once the calls in flight have finished.
pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    let max_request =
        MAX_REQUEST_BYTES.max(node.config.http.max_body_bytes + REQUEST_OVERHEAD_BYTES);
    let service =
        PublisherServer::new(Publisher::new(node.clone())).max_decoding_message_size(max_request);
    // The HTTP API's deadline: a call that takes longer is cancelled.
    let result = Server::builder()
        .timeout(node.config.http.request_timeout)
        .serve_with_incoming_shutdown(
            service,
            listener::Accepted::new(listener),
            node.drain.clone().cancelled_owned(),
        )
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "the gRPC server failed");
    }
}

/// The `Publisher` service over the pod's node.
pub struct Publisher {
    node: Arc<Node>,
}

impl Publisher {
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    fn authorize(&self, metadata: &MetadataMap) -> Result<(), ApiError> {
        let authorization = metadata.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
        publish::authorize(&self.node.api_keys.current(), authorization)
    }

    async fn single(&self, request: Request<PublishRequest>) -> Result<PublishResponse, ApiError> {
        self.authorize(request.metadata())?;
        self.publish_one(request.into_inner()).await
    }

    /// One item, checked and published as `POST /v1/publish` would.
    async fn publish_one(&self, request: PublishRequest) -> Result<PublishResponse, ApiError> {
        let data = JsonData::parse(
            Bytes::from(request.data),
            self.node.config.http.max_body_bytes,
        )?;
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
        self.authorize(request.metadata())?;
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
                    data: JsonData::parse(Bytes::from(item.data), limit)?,
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
        self.authorize(request.metadata())?;
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

    /// One of the pod's API request slots (shared with HTTP), held for the
    /// call; none left is `RESOURCE_EXHAUSTED`.
    fn slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Status> {
        self.node
            .api_slot()
            .ok_or_else(|| Status::resource_exhausted("busy: too many API requests in flight"))
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
        let _slot = self.slot()?;
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
        let _slot = self.slot()?;
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
        let _slot = self.slot()?;
        self.answer("TopicInfo", self.info(request).await)
    }

    async fn disconnect(
        &self,
        request: Request<DisconnectRequest>,
    ) -> Result<Response<DisconnectResponse>, Status> {
        let _slot = self.slot()?;
        let result = async {
            self.authorize(request.metadata())?;
            let node = &self.node;
            let window = node.config.session.resume_window;
            publish::disconnect_user(&*node.sessions, window, &request.get_ref().user).await?;
            Ok(DisconnectResponse {})
        };
        self.answer("Disconnect", result.await)
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
        Refusal::Unavailable => Code::Unavailable,
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
