//! The proxies' transport in the real binary (issue #24): a pod starts with
//! proxies whose backends are down (gRPC channels connect when first used),
//! and exports the proxies' metrics; a proxy URL it could not call is
//! refused at start, exit 64 naming its key.

use gateway::config::EXIT_BAD_CONFIG;
use testkit::Herald;
use testkit::herald::free_port;

use crate::pod::{HERALD, run as herald};

#[tokio::test]
async fn a_pod_starts_with_proxy_backends_down_and_exports_their_metrics() {
    let down = format!("127.0.0.1:{}", free_port());
    let http = format!("http://{down}/herald/connect");
    let grpc = format!("grpc://{down}");
    let env = [
        ("HERALD_PROXY__CONNECT__URL", http.as_str()),
        ("HERALD_PROXY__CONNECT__HEADERS", "Cookie,Origin"),
        ("HERALD_PROXY__RPC__URL", grpc.as_str()),
        ("HERALD_PROXY__MAX_IN_FLIGHT", "16"),
    ];
    let pod = Herald::start(HERALD, &env, &[]).await;
    let (_, exposition) = testkit::http(pod.addr, "GET", "/metrics", &[], b"").await;
    for series in [
        r#"herald_proxy_calls_total{proxy="rpc",result="unavailable"} 0"#,
        r#"herald_proxy_failures_total{proxy="connect",reason="timeout"} 0"#,
        r#"herald_proxy_in_flight{proxy="connect"} 0"#,
        r#"herald_proxy_duration_seconds_count{proxy="rpc"} 0"#,
    ] {
        assert!(exposition.contains(series), "{series} in:\n{exposition}");
    }
}

#[test]
fn a_proxy_url_that_cannot_be_called_exits_64_naming_its_key() {
    for (var, url, key) in [
        (
            "HERALD_PROXY__CONNECT__URL",
            "ftp://auth/connect",
            "proxy.connect.url",
        ),
        (
            "HERALD_PROXY__RPC__URL",
            "grpc://backend:1/herald",
            "proxy.rpc.url",
        ),
    ] {
        let output = herald(&[], &[(var, url), ("HERALD_LISTEN", "127.0.0.1:0")]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(EXIT_BAD_CONFIG),
            "stderr: {stderr}"
        );
        assert!(stderr.contains(key), "{key}: {stderr}");
    }
}
