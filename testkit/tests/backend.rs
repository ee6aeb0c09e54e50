//! The proxies' test backend answers what its handler says, over HTTP and
//! gRPC, and records what it was asked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test

use proto::v1::ConnectProxyRequest;
use proto::v1::proxy_backend_client::ProxyBackendClient;
use serde_json::json;
use testkit::backend::Request;
use testkit::{Answer, GrpcBackend, HttpBackend};

fn handler(request: &Request) -> Answer {
    match request.path.as_str() {
        "/connect" => Answer::json(json!({"user": request.body["data"]["name"], "info": {"a": 1}})),
        _ => Answer::status(403),
    }
}

#[tokio::test]
async fn http_backend_answers_and_records() {
    let backend = HttpBackend::start(handler).await;
    let body = json!({"client": "1", "data": {"name": "ann"}}).to_string();
    let (status, reply) = testkit::http(
        backend.addr(),
        "POST",
        "/connect",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&reply).unwrap(),
        json!({"user": "ann", "info": {"a": 1}})
    );
    let (status, _) = testkit::http(backend.addr(), "POST", "/rpc", &[], b"{}").await;
    assert_eq!(status, 403);
    let requests = backend.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].header("Content-Type"), Some("application/json"));
    assert_eq!(requests[0].body["client"], "1");
    assert_eq!(backend.connections(), 2);
}

#[tokio::test]
async fn grpc_backend_answers_and_records() {
    let backend = GrpcBackend::start(handler).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", backend.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ProxyBackendClient::new(channel);
    let reply = client
        .connect(ConnectProxyRequest {
            client: "7".into(),
            data: Some(br#"{"name":"bob"}"#.to_vec()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.user, "bob");
    assert_eq!(reply.info.as_deref(), Some(&br#"{"a":1}"#[..]));
    let refused = client
        .rpc(proto::v1::RpcProxyRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let requests = backend.requests();
    assert_eq!(requests[0].path, "/connect");
    assert_eq!(requests[0].body["client"], "7");
    assert_eq!(requests[1].path, "/rpc");
}
