//! `--kill-pid`: the gateway a process is ([`gateway_of`], found by its
//! listening socket, so that nothing but a gateway of this run is killed)
//! and the SIGKILL itself ([`kill`]). Its own module: `/proc` reading and a
//! signal, shared with `sse_failover`, nothing of the storm itself.

use crate::{Error, Target};

/// The index of the gateway whose listening socket process `pid` holds: the
/// check that keeps `--kill-pid` from killing anything but a gateway of
/// this run. Linux only (`/proc`).
pub(crate) fn gateway_of(pid: u32, gateways: &[Target]) -> Result<usize, Error> {
    let refuse = |why: String| Err(Error::Options(format!("--kill-pid {pid}: {why}")));
    if pid == std::process::id() {
        return refuse("that is this process".to_owned());
    }
    // Socket inodes the process holds.
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds,
        Err(e) => return refuse(format!("cannot read its open files ({e})")),
    };
    let held: Vec<u64> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    // Listening sockets, (port, inode), from the process's network namespace.
    let mut listening = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        listening.extend(text.lines().skip(1).filter_map(listen_entry));
    }
    for (g, gateway) in gateways.iter().enumerate() {
        let port = gateway.addr.port();
        if listening
            .iter()
            .any(|&(p, inode)| p == port && held.contains(&inode))
        {
            return Ok(g);
        }
    }
    refuse("it does not listen on the port of any --gateway; not killing it".to_owned())
}

/// (local port, inode) of a LISTEN line of `/proc/net/tcp{,6}`.
fn listen_entry(line: &str) -> Option<(u16, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
    Some((port, fields.get(9)?.parse().ok()?))
}

/// SIGKILL, with the system's `kill` (this crate has no unsafe code).
pub(crate) fn kill(pid: u32) -> Result<(), Error> {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| Error::Options(format!("running kill: {e}")))?;
    if !status.success() {
        return Err(Error::Options(format!("kill -KILL {pid}: {status}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_read_from_proc_net_tcp() {
        let listen = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 100 0 0 10 0";
        assert_eq!(listen_entry(listen), Some((8080, 123456)));
        let established = "   1: 0100007F:1F90 0200007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 654321 1";
        assert_eq!(listen_entry(established), None);
    }

    #[test]
    fn kill_pid_refuses_a_process_that_is_no_gateway() {
        let gateways = vec![
            Target::websocket("ws://127.0.0.1:1").expect("target"),
            Target::websocket("ws://127.0.0.1:2").expect("target"),
        ];
        let e = gateway_of(std::process::id(), &gateways).expect_err("refused");
        assert!(e.to_string().contains("this process"), "{e}");
        // pid 1 listens on neither port (or cannot be read): refused either way.
        assert!(gateway_of(1, &gateways).is_err());
    }
}
