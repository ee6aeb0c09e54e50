//! The page's cells: figures in their units, verdicts, and Markdown tables.
//! Numbers are written as the page always wrote them: fixed decimals
//! rounded half to even, thousands separated by commas.

use crate::cpu::Usage;

/// Microseconds as milliseconds, one decimal: `12.3 ms`.
pub fn ms(us: Option<f64>) -> String {
    us.map_or_else(|| "n/a".to_owned(), |us| format!("{:.1} ms", us / 1000.0))
}

/// Microseconds as milliseconds, two decimals below 10 ms (a publish's
/// round trip is a fraction of one).
pub fn fine_ms(us: f64) -> String {
    if us < 10_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        ms(Some(us))
    }
}

/// Microseconds, one decimal: `4.2 µs`.
pub fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1} µs"))
}

/// A ratio: `1.05×`.
pub fn x(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}×"))
}

/// Whether a target was met.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// A ratio or a time as a target compares it: a missing (or zero) figure
/// misses any target.
pub fn or_miss(v: Option<f64>) -> f64 {
    v.filter(|&v| v != 0.0).unwrap_or(99.0)
}

/// `v` with no decimals and commas between thousands: `12,345`.
pub fn thousands(v: f64) -> String {
    grouped(&format!("{v:.0}"))
}

/// An integer with commas between thousands.
pub fn count(v: impl Into<u64>) -> String {
    grouped(&v.into().to_string())
}

/// Commas between the thousands of a formatted number's integer part.
fn grouped(number: &str) -> String {
    let (sign, digits) = match number.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", number),
    };
    let (int, rest) = digits.split_at(digits.find('.').unwrap_or(digits.len()));
    let mut out = String::with_capacity(number.len() + int.len() / 3);
    out.push_str(sign);
    for (i, digit) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out.push_str(rest);
    out
}

/// A Markdown table.
pub fn table<S: AsRef<str>>(header: &[&str], rows: &[Vec<S>]) -> String {
    let line = |cells: Vec<&str>| format!("| {} |", cells.join(" | "));
    let mut lines = vec![
        line(header.to_vec()),
        format!("|{}", "---|".repeat(header.len())),
    ];
    lines.extend(
        rows.iter()
            .map(|row| line(row.iter().map(AsRef::as_ref).collect())),
    );
    lines.join("\n")
}

/// The run's CPU: how busy the machine was, and what else ran on it.
pub fn cpu_line(cpu: &Usage) -> String {
    format!(
        "Machine busy {:.2} of {} cores; CPU of processes outside the run: {:.1} s \
         (more than a few seconds means the figures are noisy).",
        cpu.machine_busy_cores, cpu.cores, cpu.other_cpu_s
    )
}

/// Sections' paragraphs, one blank line apart.
pub fn paragraphs<S: AsRef<str>>(parts: &[S]) -> String {
    parts
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_the_page_always_wrote_them() {
        assert_eq!(thousands(1234567.5), "1,234,568");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(-12345.0), "-12,345");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(count(1000u64), "1,000");
        assert_eq!(count(100u64), "100");
        // Ties round to even, as Python's format did.
        assert_eq!(format!("{:.0}", 2.5), "2");
        assert_eq!(format!("{:.2}", 0.125), "0.12");
        assert_eq!(ms(Some(36650.0)), "36.6 ms");
        assert_eq!(fine_ms(850.0), "0.85 ms");
        assert_eq!(fine_ms(31000.0), "31.0 ms");
        assert_eq!(x(None), "n/a");
        assert_eq!(or_miss(Some(0.0)), 99.0);
    }

    #[test]
    fn a_table_has_a_header_a_rule_and_its_rows() {
        let rows = vec![vec!["a", "1"], vec!["b", ""]];
        assert_eq!(
            table(&["figure", "Herald"], &rows),
            "| figure | Herald |\n|---|---|\n| a | 1 |\n| b |  |"
        );
    }
}
