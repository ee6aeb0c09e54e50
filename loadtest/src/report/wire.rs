//! The wire section: the bytes a subscriber reads per payload size, against
//! an HTTP/1.1 POST of the same payload.

use super::markdown::{count, paragraphs, table};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## Wire overhead: server to client, against an HTTP/1.1 POST of the same payload"
            .to_owned(),
    ];
    let Some(res) = results.wire("wire") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let rows: Vec<Vec<String>> = res
        .sizes
        .iter()
        .map(|s| {
            if let Some(error) = &s.error {
                let mut row = vec![s.payload_bytes.to_string(), format!("error: {error}")];
                row.resize(5, String::new());
                return row;
            }
            let p = s.payload_bytes as u64;
            let herald = s.herald_bytes.unwrap_or(0) as u64;
            let post = s.http_post_bytes.unwrap_or(0) as u64;
            let or_none = |v: Option<usize>| v.map_or_else(|| "None".to_owned(), |v| v.to_string());
            vec![
                format!("{} B", count(p)),
                count(herald),
                format!(
                    "{} ({} header + {} envelope)",
                    count(herald.saturating_sub(p)),
                    or_none(s.header_bytes),
                    or_none(s.envelope_bytes)
                ),
                count(post),
                count(post.saturating_sub(p)),
            ]
        })
        .collect();
    out.push(
        "Payload: a JSON string of that many bytes. Herald's bytes: the WebSocket frame a \
         subscriber reads (header, the `msg` envelope with topic and seq, the payload), measured \
         off a raw socket. HTTP: a minimal POST (Host, Content-Type, Content-Length) of the same \
         body."
            .to_owned(),
    );
    out.push(table(
        &[
            "payload",
            "Herald frame",
            "Herald overhead",
            "HTTP POST",
            "HTTP overhead",
        ],
        &rows,
    ));
    paragraphs(&out)
}
