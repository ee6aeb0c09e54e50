//! The identity section: what checking tokens costs, per `hello` (criterion)
//! and in the storm, and what a token adds to an idle connection.

use super::markdown::{paragraphs, table, verdict};
use super::results::Results;
use super::storm;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## Identity: the cost of checking tokens".to_owned()];
    let mut rows = Vec::new();
    for (bench, label) in [
        ("HS256", "HS256"),
        ("RS256_2048", "RS256 (2048-bit key)"),
        ("ES256", "ES256 (P-256)"),
        ("EdDSA", "EdDSA (Ed25519)"),
    ] {
        let ns = results.criterion("verify", bench);
        rows.push(vec![
            format!("verify one token per `hello`, {label}"),
            ns.map_or_else(|| "n/a".to_owned(), |ns| format!("{:.1} µs", ns / 1000.0)),
            String::new(),
        ]);
    }
    match results.storm("storm-auth") {
        Some(res) => rows.push(vec![
            "storm with RS256 tokens: all resumed after the cut".to_owned(),
            format!(
                "{}, {} lost, {} duplicated",
                storm::resumed(res),
                res.lost,
                res.app_duplicates
            ),
            format!("≤ 5 s, 0 lost: {}", verdict(storm::met(res))),
        ]),
        None => rows.push(vec![
            "storm with RS256 tokens".to_owned(),
            "not run".to_owned(),
            "≤ 5 s, 0 lost".to_owned(),
        ]),
    }
    for (name, label) in [
        ("idle-auth-off", "idle subscribed connection, open mode"),
        (
            "idle-auth-on",
            "idle subscribed connection, with a token (HS256)",
        ),
    ] {
        let text = results.text(&format!("{name}.txt")).unwrap_or_default();
        // `gateway/examples/idle_memory` ends its line with `N bytes per connection`.
        let per = text
            .rsplit(", ")
            .next()
            .filter(|last| last.contains("bytes per connection"))
            .and_then(|last| last.split(" bytes").next());
        rows.push(vec![
            label.to_owned(),
            per.map_or_else(
                || "not run".to_owned(),
                |per| format!("{per} B of herald RSS"),
            ),
            "(5,000 connections, `gateway/examples/idle_memory`)".to_owned(),
        ]);
    }
    out.push(table(&["figure", "Herald", "target / note"], &rows));
    out.push(
        "Verification is criterion's `cargo bench -p gateway --bench auth` (one `verify` per \
         iteration: header, signature, claims, grants). The storm is the one above with every \
         `hello` carrying an RS256 token, minted by PyJWT, that the pod verifies."
            .to_owned(),
    );
    paragraphs(&out)
}
