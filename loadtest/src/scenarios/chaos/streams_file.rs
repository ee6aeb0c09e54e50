//! `streams.txt`: the streams problems were found in, written out readably
//! for whoever looks into a failed run. Its own module: a file for people,
//! apart from the run and from the [`check`](super::check) that found the
//! problems.

use std::collections::BTreeMap;

use super::client::Log;

/// The streams problems were found in, readably (runs of consecutive
/// `msg`s as one line), for whoever looks into a failed run.
pub(super) fn write_streams(
    path: &std::path::Path,
    streams: &[(usize, &Log)],
    wanted: &[(usize, usize)],
    pods: &[std::net::SocketAddr],
    stored: &BTreeMap<usize, String>,
) {
    use super::client::Event;
    use std::fmt::Write as _;
    let s = |at: &u32| f64::from(*at) / 1000.0;
    let mut out = String::new();
    for (client, log) in streams {
        if !wanted.contains(&(*client, log.topic)) {
            continue;
        }
        let _ = writeln!(out, "client {client} topic {}", log.topic);
        if let Some(session) = stored.get(client) {
            let _ = writeln!(
                out,
                "  stored at the end: {}",
                session.trim().replace('\n', " | ")
            );
        }
        let mut run: Option<(u64, u64, u32, u32)> = None;
        let flush = |out: &mut String, run: &mut Option<(u64, u64, u32, u32)>| {
            if let Some((first, last, from, to)) = run.take() {
                let _ = writeln!(
                    out,
                    "  {:>8.3}-{:.3} s  msg {first}..{last}",
                    s(&from),
                    s(&to)
                );
            }
        };
        for event in &log.events {
            if let Event::Msg { seq, at, .. } = event {
                match &mut run {
                    Some((_, last, _, to)) if *seq == *last + 1 => (*last, *to) = (*seq, *at),
                    _ => {
                        flush(&mut out, &mut run);
                        run = Some((*seq, *seq, *at, *at));
                    }
                }
                continue;
            }
            flush(&mut out, &mut run);
            let line = match event {
                Event::Start {
                    epoch,
                    seq,
                    recovered,
                    at,
                } => {
                    format!(
                        "{:>8.3} s  ok epoch {epoch} seq {seq} recovered {recovered}",
                        s(at)
                    )
                }
                Event::Reset { epoch, seq, at } => {
                    format!("{:>8.3} s  reset epoch {epoch} seq {seq}", s(at))
                }
                Event::Gone { cut, at } => format!(
                    "{:>8.3} s  connection lost{}",
                    s(at),
                    if *cut { " (own cut)" } else { "" }
                ),
                Event::Welcome {
                    gateway,
                    resumed,
                    at,
                } => format!(
                    "{:>8.3} s  welcome from pod {gateway} ({}), resumed {resumed}",
                    s(at),
                    pods.get(*gateway)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                ),
                Event::Msg { .. } => continue,
            };
            let _ = writeln!(out, "  {line}");
        }
        flush(&mut out, &mut run);
    }
    let _ = std::fs::write(path, out);
}
