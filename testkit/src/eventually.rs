//! A bounded poll for state that has no event to await (a metric, a gauge,
//! a key in Redis, a process that has not bound its port yet).

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Between two looks.
const POLL: Duration = Duration::from_millis(20);

/// What a check says: done (with a value), or not yet (and why, for the
/// failure message).
pub trait Check {
    type Value;
    fn done(self) -> Result<Self::Value, String>;
}

impl Check for bool {
    type Value = ();
    fn done(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the condition never held".to_owned())
        }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    fn done(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing came".to_owned())
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;
    fn done(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs `check` until it is done (`true`, `Some`, `Ok`), every 20 ms for at
/// most `within`; its value. Panics with the last "not yet" (an `Err`'s
/// text) if `within` passes first.
///
/// ```no_run
/// # async fn f(gw: testkit::Gateway) {
/// use testkit::{WAIT, eventually};
/// eventually(WAIT, || async {
///     let open = gw.metric("herald_connections").await;
///     if open == 0.0 { Ok(()) } else { Err(format!("{open} connections")) }
/// })
/// .await;
/// # }
/// ```
pub async fn eventually<F, Fut>(within: Duration, check: F) -> <Fut::Output as Check>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Check,
{
    eventually_every(POLL, within, check).await
}

/// [`eventually`], looking every `poll` (for a check that costs the system
/// under test something, such as a Prometheus query).
pub async fn eventually_every<F, Fut>(
    poll: Duration,
    within: Duration,
    mut check: F,
) -> <Fut::Output as Check>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Check,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await.done() {
            Ok(value) => return value,
            Err(why) => assert!(Instant::now() < deadline, "not within {within:?}: {why}"),
        }
        tokio::time::sleep(poll).await;
    }
}
