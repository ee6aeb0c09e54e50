//! The micro-benchmarks section: criterion's estimates of unmasking,
//! encoding, decoding and publishing to many queues.

use super::markdown::{paragraphs, table, verdict};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## Micro-benchmarks (criterion, `cargo bench -p gateway --bench wire --bench fanout`)"
            .to_owned(),
    ];
    let mut rows = Vec::new();
    let mib = f64::from(1 << 20);
    for (bench, label) in [
        (
            "reader_unmask",
            "unmask 1 MiB, Herald's reader (fastwebsockets::unmask)",
        ),
        ("byte_loop", "unmask 1 MiB, plain byte loop"),
        ("copy_from_slice", "memcpy 1 MiB (ceiling)"),
    ] {
        let ns = results.criterion("unmask_1MiB", bench);
        let or_na = |f: &dyn Fn(f64) -> String| ns.map_or_else(|| "n/a".to_owned(), f);
        rows.push(vec![
            label.to_owned(),
            or_na(&|ns| format!("{:.1} µs", ns / 1000.0)),
            or_na(&|ns| format!("{:.1} GB/s", mib / ns)),
            if bench == "reader_unmask" {
                format!(
                    "≥ 10 GB/s: {}",
                    verdict(ns.is_some_and(|ns| mib / ns >= 10.0))
                )
            } else {
                String::new()
            },
            if bench == "byte_loop" {
                "naive XOR 0.29 ms (3.5 GB/s)".to_owned()
            } else {
                String::new()
            },
        ]);
    }
    for (group, bench, label) in [
        (
            "encode_frame",
            "msg_1KiB_publication",
            "encode the `msg` frame of a 1 KiB publication",
        ),
        ("encode_frame", "ok_reply", "encode an `ok` reply"),
        ("decode_command", "sub", "JSON decode of a `sub` command"),
        (
            "publish",
            "1KiB_to_10k_local_queues",
            "publish 1 KiB to 10,000 local subscriber queues",
        ),
        (
            "publish",
            "1KiB_direct_writes_to_10k_counting_sinks",
            "publish 1 KiB to 10,000 connections, written directly into counting sinks \
             (Herald's own cost per delivery, without the kernel's)",
        ),
    ] {
        let ns = results.criterion(group, bench);
        let value = match ns {
            None => "n/a".to_owned(),
            Some(ns) if ns > 10_000.0 => format!("{:.0} µs", ns / 1000.0),
            Some(ns) => format!("{ns:.0} ns"),
        };
        let rate = match ns {
            Some(ns) if bench.contains("10k") => {
                format!("{:.0} ns per delivery", ns / 10_000.0)
            }
            _ => String::new(),
        };
        rows.push(vec![
            label.to_owned(),
            value,
            rate,
            String::new(),
            String::new(),
        ]);
    }
    out.push(table(
        &["benchmark", "time", "rate", "target", "reference"],
        &rows,
    ));
    paragraphs(&out)
}
