//! The `profile` section: where the gateway's CPU went during the fan-out,
//! from the `perf report --sort dso,sym` text `bench.sh` leaves.

use super::markdown::{paragraphs, table};
use super::results::Results;

/// One line of a perf report: the share of samples, the shared object, the
/// symbol.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub percent: f64,
    pub object: String,
    pub symbol: String,
}

/// A `perf report --sort dso,sym` text's sample lines.
pub(super) fn parse(text: &str) -> Vec<Sample> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let Some([share, object, _, rest]) = split4(line) else {
            continue;
        };
        if !share.ends_with('%') || line.starts_with('#') {
            continue;
        }
        let Ok(percent) = share.trim_end_matches('%').parse::<f64>() else {
            continue;
        };
        let mut symbol = rest.split_once("] ").map_or(rest, |(_, s)| s);
        // Rust's legacy mangling leaves a hash: `::h0123456789abcdef`.
        if let Some((name, hash)) = symbol.rsplit_once("::h")
            && hash.chars().count() == 16
        {
            symbol = name;
        }
        rows.push(Sample {
            percent,
            object: object.to_owned(),
            symbol: symbol.to_owned(),
        });
    }
    rows
}

/// The line's first three words and the rest (its trailing blanks kept),
/// if it has four.
fn split4(line: &str) -> Option<[&str; 4]> {
    let mut rest = line.trim_start();
    let mut words = [""; 3];
    for word in &mut words {
        let end = rest.find(char::is_whitespace)?;
        *word = &rest[..end];
        rest = rest[end..].trim_start();
    }
    (!rest.is_empty()).then_some([words[0], words[1], words[2], rest])
}

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## profile: where the gateway's CPU goes during the fan-out".to_owned(),
        "`perf record -e cpu-clock` on the gateway during the `fanout` scenario above (no floor \
         run), `perf report --sort dso,sym`: shares of the gateway's samples."
            .to_owned(),
    ];
    let runs: Vec<(String, Vec<Sample>)> = [
        ("profile", "this build".to_owned()),
        ("profile-before", results.before_label("profile")),
    ]
    .into_iter()
    .filter_map(|(name, label)| {
        let profile = parse(&results.text(&format!("{name}.txt"))?);
        (!profile.is_empty()).then_some((label, profile))
    })
    .collect();
    if runs.is_empty() {
        out.push("Not run (perf unavailable, or the part was not asked for).".to_owned());
        return paragraphs(&out);
    }
    let mut rows = Vec::new();
    for (label, profile) in runs {
        let share = |of: &dyn Fn(&str) -> bool| -> f64 {
            profile
                .iter()
                .filter(|s| of(&s.object))
                .map(|s| s.percent)
                .sum()
        };
        let kernel = share(&|o| o.starts_with("[kernel"));
        let herald = share(&|o| o == "herald");
        let libc = share(&|o| o.starts_with("libc"));
        let mut sorted = profile.clone();
        // Largest first, as a descending sort of (share, object, symbol).
        sorted.sort_by(|a, b| {
            b.percent
                .total_cmp(&a.percent)
                .then_with(|| b.object.cmp(&a.object))
                .then_with(|| b.symbol.cmp(&a.symbol))
        });
        let top: Vec<String> = sorted
            .iter()
            .filter(|s| s.object == "herald")
            .take(8)
            .map(|s| format!("`{} {:.1}%`", s.symbol, s.percent))
            .collect();
        rows.push(vec![
            label,
            format!("{kernel:.0}%"),
            format!("{herald:.0}%"),
            format!("{libc:.0}%"),
            top.join("; "),
        ]);
    }
    out.push(table(
        &[
            "build",
            "kernel",
            "herald",
            "libc",
            "top symbols in herald (share of all samples)",
        ],
        &rows,
    ));
    paragraphs(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_perf_report_reads_as_its_samples_without_rusts_hashes() {
        let text = "# Overhead  Shared Object  Symbol\n\
                    #\n\
                    \x20   41.25%  [kernel.kallsyms]  [k] tcp_sendmsg_locked\n\
                    \x20    6.50%  herald             [.] gateway::hub::Topic::write_now::h0123456789abcdef\n\
                    \x20    0.85%  herald             [.] gateway::x::h01234567\n\
                    \x20      bad  herald             [.] not::a::row\n";
        let rows = parse(text);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].object, "[kernel.kallsyms]");
        assert_eq!(rows[0].symbol, "tcp_sendmsg_locked");
        assert_eq!(rows[1].symbol, "gateway::hub::Topic::write_now");
        assert_eq!(rows[1].percent, 6.5);
        assert_eq!(rows[2].symbol, "gateway::x::h01234567");
    }
}
