//! The closed sets of label values the gateway's metrics take.

/// Every `reason` of `herald_auth_failures_total`: the token refusals of
/// [`crate::auth::Refused::reason`], then `missing` (no token where one is
/// required), `other_user` (a refresh for another `sub`) and `forbidden` (a
/// topic the token does not grant).
pub const AUTH_FAILURE_REASONS: [&str; 14] = [
    "malformed",
    "oversize",
    "signature",
    "algorithm",
    "expired",
    "not_yet_valid",
    "issuer",
    "audience",
    "claims",
    "unknown_key",
    "no_keys",
    "missing",
    "other_user",
    "forbidden",
];

/// Every `protocol` of `herald_connections_protocol_total`: what a `/ws`
/// connection speaks ([`crate::subprotocol::Subprotocol::label`]).
pub const PROTOCOLS: [&str; 2] = ["json", "protobuf"];

/// Every `limit` of `herald_limit_refusals_total`: the budgets of
/// [`crate::budget::Limit`].
pub const LIMIT_REFUSALS: [&str; 4] = [
    "subscriptions_per_user",
    "subscriptions_per_ip",
    "topics_per_minute",
    "anonymous_topics",
];

/// Every `reason` of `herald_grpc_refused_total`: a call without a valid API
/// key, or over `http.max_concurrent_requests`, or whose message declares
/// more than its method takes; a connection over `grpc.max_connections` or
/// `grpc.max_connections_per_ip`.
pub const GRPC_REFUSAL_REASONS: [&str; 5] = [
    "unauthenticated",
    "busy",
    "too_large",
    "at_capacity",
    "per_ip",
];

/// Every `outcome` of `herald_history_reads_total`: a page answered, a
/// `since` out of the window (`history_lost`), a request refused before any
/// read (bad query, unknown namespace, forbidden), the broker unavailable.
pub const HISTORY_OUTCOMES: [&str; 4] = ["read", "lost", "refused", "unavailable"];

/// Every `command` of the server-side subscription metrics.
pub const SERVER_SUBSCRIPTION_COMMANDS: [&str; 2] = ["subscribe", "unsubscribe"];

/// Every `outcome` of `herald_server_subscriptions_total`: a backend's
/// request sent to every pod, refused (bad body, unknown namespace), or the
/// broker unavailable.
pub const SERVER_SUBSCRIPTION_OUTCOMES: [&str; 3] = ["sent", "refused", "unavailable"];

/// Every `outcome` of `herald_server_subscriptions_applied_total`, per
/// connection: done, nothing to do (already subscribed, or not
/// subscribed), refused by a limit, failed (the broker), or dropped (the
/// connection had too many waiting).
pub const SERVER_SUBSCRIPTION_APPLIED: [&str; 5] =
    ["done", "unchanged", "refused", "failed", "dropped"];
