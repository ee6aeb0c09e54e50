//! The values flags take besides times (humantime's): counts, bytes,
//! rates.

/// A count; `_` may group digits (`10_000`).
pub(super) fn number(s: &str) -> Result<usize, String> {
    s.replace('_', "")
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))
}

/// Bytes: `1024`, `1KiB`, `64KiB`, `1MiB`.
pub(super) fn bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '_'))
            .unwrap_or(s.len()),
    );
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(format!("`{s}`: bytes take B, KiB or MiB")),
    };
    number(digits)?
        .checked_mul(scale)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// [`bytes()`], for a socket option.
pub(super) fn bytes_u32(s: &str) -> Result<u32, String> {
    u32::try_from(bytes(s)?).map_err(|_| format!("`{s}` is too large"))
}

/// A finite rate.
pub(super) fn rate(s: &str) -> Result<f64, String> {
    s.parse()
        .ok()
        .filter(|r: &f64| r.is_finite())
        .ok_or_else(|| format!("`{s}` is not a rate"))
}
