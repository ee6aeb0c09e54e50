//! The gateway of the presence and server-side subscription stories
//! (apart from `common`, which every test binary builds: these settings
//! are issue #23's).

use std::time::Duration;

use testkit::Gateway;

use crate::common::SECRET;

/// A gateway that takes HS256 tokens over [`SECRET`] (so that connections
/// have users), with a `room` namespace that keeps presence and sends
/// joins and leaves every 50 ms, and `quiet`, with presence but no diffs.
pub async fn with_users() -> Gateway {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.presence.diff_interval = Duration::from_millis(50);
    config.namespaces.insert(
        "room".to_owned(),
        router::NamespaceSettings {
            subscribe: router::Subscribe::Anyone,
            presence: true,
            join_leave: true,
            ..Default::default()
        },
    );
    config.namespaces.insert(
        "quiet".to_owned(),
        router::NamespaceSettings {
            subscribe: router::Subscribe::Anyone,
            presence: true,
            ..Default::default()
        },
    );
    Gateway::with(config).await
}
