//! A process's resident memory, from `/proc/<pid>/status`: what `idle`
//! divides by the connections a gateway holds.

/// Resident set size of process `pid` in bytes (`VmRSS`), if it exists.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_size() {
        let rss = rss_bytes(std::process::id()).expect("own status");
        assert!(rss > 1024 * 1024, "{rss}");
        assert_eq!(rss_bytes(u32::MAX), None);
    }
}
