//! Operating a running server: Prometheus metrics (`metrics.rs`), the admin JSON API over HTTP
//! (`http_api.rs`, the same operations as the admin socket: `admin.rs`) and the config file of
//! `flashpool serve --config` (`config.rs`).

pub mod config;
pub mod http_api;
pub mod metrics;

use anyhow::{bail, Result};

/// `[HOST:]PORT` as a listen address: a bare port (or `:PORT`) listens on 127.0.0.1 only.
pub fn listen_address(s: &str) -> Result<String> {
    let s = s.trim();
    let port_ok = |p: &str| !p.is_empty() && p.parse::<u16>().is_ok();
    if port_ok(s) {
        return Ok(format!("127.0.0.1:{s}"));
    }
    if let Some(p) = s.strip_prefix(':') {
        if port_ok(p) {
            return Ok(format!("127.0.0.1:{p}"));
        }
    }
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port_ok(port) => {
            if host.starts_with('[') != host.ends_with(']') {
                bail!("{s:?}: an IPv6 host goes in brackets: [::1]:PORT");
            }
            Ok(s.to_string())
        }
        _ => bail!("{s:?}: expected PORT or HOST:PORT (e.g. 10810 or 127.0.0.1:10810)"),
    }
}

/// True when every address `addr` resolves to is a loopback address.
pub fn is_loopback(addr: &std::net::SocketAddr) -> bool {
    match addr.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_address("9100").unwrap(), "127.0.0.1:9100");
        assert_eq!(listen_address(":9100").unwrap(), "127.0.0.1:9100");
        assert_eq!(listen_address("0.0.0.0:9100").unwrap(), "0.0.0.0:9100");
        assert_eq!(listen_address("[::1]:9100").unwrap(), "[::1]:9100");
        assert_eq!(listen_address("localhost:1").unwrap(), "localhost:1");
        for bad in ["", "x", "host:", "host:99999", ":", "::1:9100x", "[::1:9"] {
            assert!(listen_address(bad).is_err(), "{bad:?}");
        }
    }
}
