//! A client in another language against the real binary: Python's
//! `websockets` (tests/python/smoke.py) subscribes, publishes with `pub`, and
//! sees a backend's HTTP publish arrive, all through a `chat` namespace that
//! only the environment configures. And (tests/python/auth.py) a token
//! minted by PyJWT admits such a client, one signed with another secret does
//! not.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use testkit::{Herald, process};

use crate::pod::HERALD;

/// Longest the script may run (its own waits are 10 s each).
const SCRIPT_WAIT: Duration = Duration::from_secs(60);

/// Runs `python3 args` to completion, killing it after `timeout`.
fn python(args: &[&str], timeout: Duration) -> Output {
    process::run(
        "python3",
        args,
        timeout,
        "the Python client test needs python3 with the `websockets` package; run the project's test script (.ci/run), which installs them",
    )
}

#[tokio::test]
async fn a_python_websockets_client_publishes_and_receives() {
    // Not a skip: a machine without the package must not pass silently.
    let probe = tokio::task::spawn_blocking(|| {
        python(&["-c", "import websockets"], Duration::from_secs(30))
    })
    .await
    .expect("probe");
    assert!(
        probe.status.success(),
        "the Python package `websockets` is missing: run the project's test script (.ci/run), \
         which installs it in target/venv and puts its bin/ first on PATH\n{}",
        process::show(&probe)
    );

    let herald = Herald::start(
        HERALD,
        &[("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated")],
        &[],
    )
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/smoke.py");
    let script = script.to_str().expect("a UTF-8 path").to_owned();
    let (ws_url, http_url) = (herald.ws_url(), herald.http_url());
    let output =
        tokio::task::spawn_blocking(move || python(&[&script, &ws_url, &http_url], SCRIPT_WAIT))
            .await
            .expect("script");
    assert!(
        output.status.success(),
        "smoke.py failed\n{}",
        process::show(&output)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("smoke: ok"),
        "{}",
        process::show(&output)
    );
    drop(herald);
}

/// Fails, rather than skips, when `import` does not work in python3.
async fn require_python(import: &'static str, package: &str) {
    let probe = tokio::task::spawn_blocking(move || {
        python(
            &["-c", &format!("import {import}")],
            Duration::from_secs(30),
        )
    })
    .await
    .expect("probe");
    assert!(
        probe.status.success(),
        "the Python package {package} is missing: run the project's test script \
         (scripts/test.sh), which installs it in target/venv and puts its bin/ first on PATH\n{}",
        process::show(&probe)
    );
}

#[tokio::test]
async fn a_python_client_with_a_pyjwt_token_is_welcomed_and_a_forged_one_closed_with_4502() {
    require_python("websockets", "`websockets`").await;
    require_python("jwt, cryptography", "`pyjwt[crypto]`").await;
    const SECRET: &str = "python-client-test-secret-0123456789abcdef";
    let herald = Herald::start(
        HERALD,
        &[
            ("HERALD_AUTH__HMAC_SECRET", SECRET),
            ("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "authenticated"),
        ],
        &[],
    )
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/auth.py");
    let script = script.to_str().expect("a UTF-8 path").to_owned();
    let (ws_url, http_url) = (herald.ws_url(), herald.http_url());
    let output = tokio::task::spawn_blocking(move || {
        python(&[&script, &ws_url, &http_url, SECRET], SCRIPT_WAIT)
    })
    .await
    .expect("script");
    assert!(
        output.status.success(),
        "auth.py failed\n{}",
        process::show(&output)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("auth: ok"),
        "{}",
        process::show(&output)
    );
    drop(herald);
}
