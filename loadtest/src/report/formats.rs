//! The `formats` section (issue #26): bytes on the wire and gateway CPU per
//! delivery in each wire format, for the chat and the state payloads, each
//! against plain JSON of the same payload in the same run.

use super::markdown::{count, cpu_line, paragraphs, table, thousands, verdict};
use super::results::Results;
use crate::codec::{Format, Protocol};
use crate::scenarios::formats::{Formats, Kind, Phase};

/// State payload, delta+deflate: at most this share of JSON's bytes.
pub const DELTA_DEFLATE_TARGET: f64 = 0.15;
/// State payload, JSON+deflate: at most this share of JSON's bytes.
pub const JSON_DEFLATE_TARGET: f64 = 0.4;

/// How the table names a format.
fn label(format: Format) -> String {
    let protocol = match format.protocol {
        Protocol::Json => "JSON",
        Protocol::Protobuf => "protobuf",
    };
    let mut label = if format.delta {
        format!("delta ({protocol})")
    } else {
        protocol.to_owned()
    };
    if format.deflate {
        label.push_str(" + deflate");
    }
    label
}

/// `figure` of `phase` over plain JSON's of the same payload.
fn ratio(run: &Formats, phase: &Phase, figure: fn(&Phase) -> Option<f64>) -> Option<f64> {
    let json = run.phase(phase.payload, Format::ALL[0]).and_then(figure)?;
    figure(phase).filter(|_| json > 0.0).map(|f| f / json)
}

fn bytes(p: &Phase) -> Option<f64> {
    (p.deliveries > 0).then_some(p.wire_bytes_per_delivery)
}

fn cpu(p: &Phase) -> Option<f64> {
    p.gateway_ns_per_delivery
}

/// `1,234 B (0.32×)`, or why not.
fn bytes_cell(run: &Formats, phase: Option<&Phase>) -> String {
    let Some(p) = phase else {
        return "not run".to_owned();
    };
    if !p.failures().is_empty() {
        return format!("**failed**: {}", p.failures().join("; "));
    }
    let deltas = if p.format.delta {
        format!(
            "; {:.1}% deltas",
            p.delta_deliveries as f64 * 100.0 / p.deliveries.max(1) as f64
        )
    } else {
        String::new()
    };
    format!(
        "{} B ({:.2}×{deltas})",
        thousands(p.wire_bytes_per_delivery),
        ratio(run, p, bytes).unwrap_or(0.0)
    )
}

/// `1.23 µs (0.95×; kernel 40%)`.
fn cpu_cell(run: &Formats, phase: Option<&Phase>) -> String {
    let Some(p) = phase.filter(|p| p.failures().is_empty()) else {
        return String::new();
    };
    let Some(ns) = p.gateway_ns_per_delivery else {
        return "n/a (no --gateway-pid)".to_owned();
    };
    let kernel = match (p.gateway_system_s, p.gateway_cpu_s) {
        (Some(system), Some(all)) if all > 0.0 => format!("; kernel {:.0}%", system * 100.0 / all),
        _ => String::new(),
    };
    format!(
        "{:.2} µs ({:.2}×{kernel})",
        ns / 1000.0,
        ratio(run, p, cpu).unwrap_or(0.0)
    )
}

/// The state payload's target for `format`, and whether it was met.
fn target(run: &Formats, format: Format) -> String {
    let limit = match (format.protocol, format.deflate, format.delta) {
        (Protocol::Json, false, false) => return "the yardstick".to_owned(),
        (_, true, true) => DELTA_DEFLATE_TARGET,
        (Protocol::Json, true, false) => JSON_DEFLATE_TARGET,
        _ => return String::new(),
    };
    let phase = run.phase(Kind::State, format);
    let share = phase
        .filter(|p| p.failures().is_empty())
        .and_then(|p| ratio(run, p, bytes));
    match share {
        Some(share) => format!("state ≤ {limit}× JSON: {}", verdict(share <= limit)),
        None => format!("state ≤ {limit}× JSON: **missed** (no figure)"),
    }
}

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## formats: bytes and gateway CPU per delivery in each wire format (issue #26)".to_owned(),
    ];
    let Some(run) = results.formats("formats") else {
        out.push(if results.has("formats.log") {
            "**failed**: no result (`formats.log` in the results)".to_owned()
        } else {
            "Not run.".to_owned()
        });
        return paragraphs(&out);
    };
    let size = |kind| {
        run.phases.iter().find(|p| p.payload == kind).map_or_else(
            || "not run".to_owned(),
            |p| format!("{} B", thousands(p.payload_bytes)),
        )
    };
    out.push(format!(
        "`scripts/bench.sh formats`: one phase per payload and format against the same pod, one \
         after the other: {} subscribers of the load tool's own client connect and subscribe to a \
         fresh topic ({} characters), then {} updates go out {:.0} ms apart; the gateway's CPU is \
         read from the first publish to the last delivery. Payloads: chat messages ({} of JSON on \
         average, each new) and a football scoreboard ({} of JSON; each update changes the clock, \
         the version and two or three players' figures). Bytes: each `msg` frame as read off the \
         socket (header, envelope, payload; compressed where deflate was negotiated). Every \
         payload was put back together (deltas applied to the payload before) and checked byte \
         for byte against the one published; the first message of each subscription is full. \
         The payloads are JSON text in every format, as published: protobuf takes bytes off the \
         envelope only (a publisher's binary data would go as it is, unencoded).",
        count(run.clients as u64),
        run.phases.first().map_or(0, |p| p.topic.len()),
        count(run.updates as u64),
        run.interval_s * 1000.0,
        size(Kind::Chat),
        size(Kind::State),
    ));
    let mut formats: Vec<Format> = Vec::new();
    for p in &run.phases {
        if !formats.contains(&p.format) {
            formats.push(p.format);
        }
    }
    let rows: Vec<Vec<String>> = formats
        .iter()
        .map(|&format| {
            let chat = run.phase(Kind::Chat, format);
            let state = run.phase(Kind::State, format);
            vec![
                label(format),
                bytes_cell(run, chat),
                cpu_cell(run, chat),
                bytes_cell(run, state),
                cpu_cell(run, state),
                target(run, format),
            ]
        })
        .collect();
    out.push(table(
        &[
            "format",
            "chat: bytes per delivery",
            "chat: gateway CPU per delivery",
            "state: bytes per delivery",
            "state: gateway CPU per delivery",
            "target",
        ],
        &rows,
    ));
    let busiest = run.phases.iter().map(|p| &p.cpu).max_by(|a, b| {
        a.other_cpu_s
            .partial_cmp(&b.other_cpu_s)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if let Some(cpu) = busiest {
        out.push(format!("The noisiest phase: {}", cpu_line(cpu)));
    }
    paragraphs(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_named_as_the_issue_names_them() {
        let labels: Vec<String> = Format::ALL.into_iter().map(label).collect();
        assert_eq!(
            labels,
            [
                "JSON",
                "JSON + deflate",
                "protobuf",
                "protobuf + deflate",
                "delta (JSON)",
                "delta (JSON) + deflate",
                "delta (protobuf)",
                "delta (protobuf) + deflate",
            ]
        );
    }
}
