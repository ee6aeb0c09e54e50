//! The gateways a scenario talks to, and the rule that keeps this tool on
//! this machine: every target's host must be a loopback address
//! (`127.0.0.0/8`, `::1`) or `localhost`. A load generator pointed at someone
//! else's server is an attack; this one refuses before it opens a socket.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use hyper::Uri;

use crate::Error;

/// The WebSocket path used when a `ws://` URL gives none.
pub const DEFAULT_WS_PATH: &str = "/ws";

/// One gateway endpoint on loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Where to connect (`localhost` is taken as 127.0.0.1, without DNS).
    pub addr: SocketAddr,
    /// The WebSocket path (`/ws` unless the URL names another).
    pub ws_path: String,
}

impl Target {
    /// A gateway's WebSocket URL, `ws://127.0.0.1:8080/ws`. The HTTP API is
    /// taken to be on the same host and port.
    pub fn websocket(url: &str) -> Result<Self, Error> {
        let (addr, path) = parse(url, "ws")?;
        let ws_path = match path.as_str() {
            "" | "/" => DEFAULT_WS_PATH.to_owned(),
            _ => path,
        };
        Ok(Self { addr, ws_path })
    }

    /// A gateway's HTTP base, `http://127.0.0.1:8080` (a path, if any, must be `/`).
    pub fn http(url: &str) -> Result<Self, Error> {
        let (addr, path) = parse(url, "http")?;
        if !matches!(path.as_str(), "" | "/") {
            return Err(bad(
                url,
                "give the HTTP base only (http://host:port), no path",
            ));
        }
        Ok(Self {
            addr,
            ws_path: DEFAULT_WS_PATH.to_owned(),
        })
    }

    /// A gateway listening on `addr` (tests, which bind port 0 themselves).
    pub fn at(addr: SocketAddr) -> Result<Self, Error> {
        Self::websocket(&format!("ws://{addr}{DEFAULT_WS_PATH}"))
    }

    /// `ws://host:port/path`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}{}", self.addr, self.ws_path)
    }

    /// `http://host:port`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A Redis server on this machine, `redis://127.0.0.1:6379`: its address
/// (the port defaults to 6379).
pub fn redis(url: &str) -> Result<SocketAddr, Error> {
    let (addr, path) = parse_with(url, "redis", 6379)?;
    if !matches!(path.as_str(), "" | "/") {
        return Err(bad(url, "give redis://host:port only, no database"));
    }
    Ok(addr)
}

/// `host:port` on this machine (a port of `herald-loadtest proxy`).
pub fn loopback(addr: &str) -> Result<SocketAddr, Error> {
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|_| bad(addr, "not an address (ip:port)"))?;
    if !parsed.ip().to_canonical().is_loopback() {
        return Err(not_loopback(addr, &parsed.ip().to_string()));
    }
    Ok(parsed)
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.ws_url())
    }
}

fn bad(url: &str, reason: &str) -> Error {
    Error::Target {
        url: url.to_owned(),
        reason: reason.to_owned(),
    }
}

/// (address, path) of `url`, whose scheme must be `scheme` and whose host
/// must be loopback.
fn parse(url: &str, scheme: &str) -> Result<(SocketAddr, String), Error> {
    parse_with(url, scheme, 80)
}

/// [`parse`], with the port taken to be `default_port` when the URL has none.
fn parse_with(url: &str, scheme: &str, default_port: u16) -> Result<(SocketAddr, String), Error> {
    let uri: Uri = url
        .parse()
        .map_err(|e| bad(url, &format!("not a URL ({e})")))?;
    if uri.scheme_str() != Some(scheme) {
        return Err(bad(url, &format!("the scheme must be {scheme}://")));
    }
    let authority = uri.authority().ok_or_else(|| bad(url, "no host:port"))?;
    if authority.as_str().contains('@') {
        return Err(bad(url, "no user info, please"));
    }
    let host = authority.host();
    let ip = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| not_loopback(url, host))?
            .to_canonical()
    };
    if !ip.is_loopback() {
        return Err(not_loopback(url, host));
    }
    let port = authority.port_u16().unwrap_or(default_port);
    Ok((SocketAddr::new(ip, port), uri.path().to_owned()))
}

fn not_loopback(url: &str, host: &str) -> Error {
    bad(
        url,
        &format!(
            "host `{host}` is not loopback; herald-loadtest only targets this machine \
             (127.0.0.0/8, ::1 or localhost)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_targets_are_taken() {
        let t = Target::websocket("ws://127.0.0.1:8080").expect("ok");
        assert_eq!(t.addr, "127.0.0.1:8080".parse().expect("addr"));
        assert_eq!(t.ws_url(), "ws://127.0.0.1:8080/ws");
        assert_eq!(t.http_url(), "http://127.0.0.1:8080");
        let t = Target::websocket("ws://127.9.8.7:1/socket").expect("ok");
        assert_eq!(t.ws_url(), "ws://127.9.8.7:1/socket");
        let t = Target::websocket("ws://localhost:9000/").expect("ok");
        assert_eq!(t.addr, "127.0.0.1:9000".parse().expect("addr"));
        let t = Target::http("http://[::1]:8080").expect("ok");
        assert_eq!(t.addr, "[::1]:8080".parse().expect("addr"));
    }

    #[test]
    fn anything_off_this_machine_is_refused() {
        for url in [
            "ws://10.0.0.1:8080/ws",
            "ws://example.com/ws",
            "ws://0.0.0.0:8080/ws",
            "ws://127.0.0.1@example.com:8080/ws",
            "ws://[2001:db8::1]:80/ws",
        ] {
            let e = Target::websocket(url).expect_err(url).to_string();
            assert!(e.contains(url), "{e}");
        }
        let e = Target::websocket("ws://192.168.1.1:80").expect_err("refused");
        assert!(e.to_string().contains("not loopback"), "{e}");
    }

    #[test]
    fn redis_and_proxy_addresses_stay_on_this_machine() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert_eq!(
            redis("redis://127.0.0.1:7000").ok(),
            Some(at("127.0.0.1:7000"))
        );
        assert_eq!(redis("redis://localhost").ok(), Some(at("127.0.0.1:6379")));
        assert!(redis("redis://10.0.0.1:6379").is_err());
        assert!(redis("redis://127.0.0.1:6379/2").is_err());
        assert_eq!(loopback("127.0.0.1:9").ok(), Some(at("127.0.0.1:9")));
        assert!(loopback("192.168.0.1:9").is_err());
    }

    #[test]
    fn the_scheme_says_what_the_url_is_for() {
        assert!(Target::websocket("http://127.0.0.1:8080").is_err());
        assert!(Target::http("ws://127.0.0.1:8080").is_err());
        assert!(Target::http("http://127.0.0.1:8080/v1/publish").is_err());
    }
}
