//! The NVMe/TCP TLS secure channel in process: an OpenSSL TLS 1.3 PSK client (the `openssl`
//! crate, through `flashpool_nvmet::tls::client_context`) in front of the test initiator of
//! `common` (a local proxy: plain on one side, TLS to the target on the other), so every
//! queue runs ICReq, Connect, I/O over TLS. Checks: SHA-256 and SHA-384 keys, identity
//! versions 0 and 1, a wrong key and an unknown host refused, a Connect whose host NQN is not
//! the PSK identity's refused, plain connections refused under `require` and served under
//! `on`, TREQ/TSAS and the per-host filter of the discovery log, garbage and truncated TLS
//! records closed cleanly with the target still serving, and TLS with DH-HMAC-CHAP.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use flashpool_nvmet::pdu::{self, le64, IcReq};
use flashpool_nvmet::status::Status;
use flashpool_nvmet::{ConfiguredPsk, HostPsks, NvmeTls, TlsMode, DISCOVERY_NQN};

const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:tls-host-384";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:not-allowed";

fn key(transform: u8, len: usize, fill: u8) -> ConfiguredPsk {
    ConfiguredPsk {
        transform,
        key: (0..len).map(|i| fill ^ i as u8).collect(),
    }
}

fn tls_config(mode: TlsMode) -> flashpool_nvmet::TargetConfig {
    let mut c = config();
    let mut keys = HostPsks::default();
    keys.keys.insert(HOSTNQN.into(), key(1, 32, 0x10));
    keys.keys.insert(HOST384.into(), key(2, 48, 0x20));
    keys.keys.insert(OTHER.into(), key(1, 32, 0x30));
    let access = &mut c.subsystems[0].access;
    access.allowed.insert(HOSTNQN.into());
    access.allowed.insert(HOST384.into());
    c.tls = Some(Arc::new(NvmeTls::new(mode, keys, "test".into()).unwrap()));
    c
}

/// A local proxy: each plain connection to it becomes a TLS connection to `target` offering
/// the identity of `psk` for `host` (version `v`). Returns the proxy's address.
fn tls_proxy(target: SocketAddr, psk: ConfiguredPsk, host: &str, v: u8) -> SocketAddr {
    let (identity, tls_key) = psk.tls_psk(host, NQN, v);
    let ctx = flashpool_nvmet::tls::client_context(&identity, &tls_key, psk.hash()).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut plain) = c else { break };
            let ssl = openssl::ssl::Ssl::new(&ctx).unwrap();
            let tcp = TcpStream::connect(target).unwrap();
            let tls = match ssl.connect(tcp) {
                Ok(s) => s,
                Err(_) => {
                    let _ = plain.shutdown(Shutdown::Both);
                    continue;
                }
            };
            let mut pumped = flashpool_tlspump::start(tls, "test-tls").unwrap();
            let (mut a, mut b) = (plain.try_clone().unwrap(), pumped.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut pumped, &mut plain);
                let _ = plain.shutdown(Shutdown::Both);
            });
        }
    });
    addr
}

/// Whether a connection is closed without any PDU after the ICReq.
fn closed_after_icreq(addr: SocketAddr) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    };
    if s.write_all(&ic.encode()).is_err() {
        return true;
    }
    let mut b = [0u8; 8];
    !matches!(s.read(&mut b), Ok(n) if n > 0)
}

/// Admin queue, an I/O queue, a write and a read back, all through `addr`.
fn io_round_trip(addr: SocketAddr) {
    let (mut a, cntlid) = Host::admin(addr, NQN, false, true);
    assert_eq!(a.set_queues(1).0, Status::SUCCESS);
    let mut q = Host::io(addr, cntlid, 1, true, false);
    let data: Vec<u8> = (0..3 * BS).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(q.write(1, 5, &data, false), Status::SUCCESS);
    let (s, back) = q.read(1, 5, 3);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(back, data);
}

#[test]
fn sha256_and_sha384_keys_both_identity_versions() {
    let srv = TestServer::with(tls_config(TlsMode::Require));
    for v in [0, 1] {
        io_round_trip(tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, v));
    }
    // SHA-384 (TLS_AES_256_GCM_SHA384): the Connect must name that host.
    for v in [0, 1] {
        let p = tls_proxy(srv.addr, key(2, 48, 0x20), HOST384, v);
        let mut h = Host::new(p, false, false);
        let cmd = h.connect_cmd(0, 31, 0);
        let d = Host::connect_data(NQN, HOST384, 0xFFFF);
        assert_eq!(h.exec(cmd, &d, None).0, Status::SUCCESS);
    }
}

#[test]
fn wrong_key_unknown_host_and_plain_are_refused_under_require() {
    let srv = TestServer::with(tls_config(TlsMode::Require));
    // A wrong key: the handshake fails, the proxy closes.
    let p = tls_proxy(srv.addr, key(1, 32, 0x11), HOSTNQN, 0);
    assert!(closed_after_icreq(p), "a wrong key got through");
    // No key for that host.
    let p = tls_proxy(
        srv.addr,
        key(1, 32, 0x10),
        "nqn.2014-08.org.nvmexpress:uuid:nokey",
        1,
    );
    assert!(closed_after_icreq(p), "an unknown host got through");
    // The key of another hash than the identity says.
    let p = tls_proxy(srv.addr, key(2, 48, 0x10), HOSTNQN, 0);
    assert!(closed_after_icreq(p));
    // Plain TCP: closed before ICResp.
    assert!(
        closed_after_icreq(srv.addr),
        "plain connection served under require"
    );
    // Still serving.
    io_round_trip(tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, 1));
}

#[test]
fn connect_must_name_the_psk_identity_host() {
    let srv = TestServer::with(tls_config(TlsMode::On));
    // TLS as HOST384, Connect as HOSTNQN (which is allowed and has a key of its own).
    let p = tls_proxy(srv.addr, key(2, 48, 0x20), HOST384, 0);
    let mut h = Host::new(p, false, false);
    let (s, r) = h.connect(NQN, 0, 0xFFFF, 0);
    assert_eq!(s, Status::CONNECT_INVALID_HOST);
    assert_eq!(r, 1 << 16 | 512);
}

#[test]
fn plain_and_tls_both_served_under_on() {
    let srv = TestServer::with(tls_config(TlsMode::On));
    io_round_trip(srv.addr);
    io_round_trip(tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, 0));
}

fn discovery_page(addr: SocketAddr, hostnqn: &str) -> Vec<u8> {
    let mut d = Host::new(addr, false, false);
    let cmd = d.connect_cmd(0, 31, 0);
    let data = Host::connect_data(DISCOVERY_NQN, hostnqn, 0xFFFF);
    assert_eq!(d.exec(cmd, &data, None).0, Status::SUCCESS);
    assert_eq!(d.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
    let (s, _, page) = d.admin_cmd(0x02, 0, 0x70 | (2048 / 4 - 1) << 16, 0, 2048);
    assert_eq!(s, Status::SUCCESS);
    page
}

#[test]
fn discovery_log_treq_tsas_and_per_host_entries() {
    for (mode, treq, sectype) in [(TlsMode::On, 0x02, 1), (TlsMode::Require, 0x01, 1)] {
        let srv = TestServer::with(tls_config(mode));
        let addr = if mode == TlsMode::Require {
            tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, 0)
        } else {
            srv.addr
        };
        let page = discovery_page(addr, HOSTNQN);
        assert_eq!(le64(&page, 8), 1, "NUMREC");
        let e = &page[1024..];
        assert_eq!(pdu::get_str(e, 256, 256), NQN);
        assert_eq!(
            (e[3], e[768]),
            (treq, sectype),
            "{mode:?}: TREQ, TSAS.SECTYPE"
        );
    }
    // Without TLS: not required, no security.
    let srv = TestServer::start();
    let page = discovery_page(srv.addr, HOSTNQN);
    assert_eq!((page[1024 + 3], page[1024 + 768]), (0x02, 0));
    // A host the allow-list refuses sees no entries.
    let srv = TestServer::with(tls_config(TlsMode::On));
    let page = discovery_page(srv.addr, OTHER);
    assert_eq!(le64(&page, 8), 0, "NUMREC for a host not allowed");
}

#[test]
fn garbage_and_truncated_records_close_cleanly() {
    let srv = TestServer::with(tls_config(TlsMode::On));
    let mut rng = Rng(seed(0x715));
    for i in 0..40 {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = vec![0u8; 1 + rng.below(600) as usize];
        rng.fill(&mut b);
        b[0] = 0x16;
        if i % 2 == 0 && b.len() > 5 {
            // A plausible record header with a length that is not what follows.
            b[1] = 3;
            b[2] = 1;
        }
        let _ = s.write_all(&b);
        if i % 3 == 0 {
            // Truncated: the host goes away mid-record.
            drop(s);
            continue;
        }
        let _ = s.shutdown(Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    let p = tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, 0);
    io_round_trip(p);
    io_round_trip(srv.addr);
}

#[test]
fn tls_with_dh_hmac_chap_requires_both() {
    use flashpool_nvmet::{HostSecrets, Secret};
    let mut c = tls_config(TlsMode::Require);
    let secret = Secret::parse(&Secret::encode(&[0x42; 32], None)).unwrap();
    c.subsystems[0].access.secrets.insert(
        HOSTNQN.into(),
        Arc::new(HostSecrets {
            host: secret,
            ctrl: None,
        }),
    );
    let srv = TestServer::with(c);
    let p = tls_proxy(srv.addr, key(1, 32, 0x10), HOSTNQN, 1);
    let mut h = Host::new(p, false, false);
    let (s, r) = h.connect(NQN, 0, 0xFFFF, 0);
    assert_eq!(s, Status::SUCCESS);
    // AUTHREQ.ATR: the host must still authenticate in band.
    assert_ne!(
        r & flashpool_nvmet::auth::CONNECT_AUTHREQ_ATR,
        0,
        "AUTHREQ.ATR over TLS"
    );
    let (s, _) = h.identify(1, 0);
    assert_eq!(s, Status::AUTH_REQUIRED);
}

#[test]
fn a_tls_host_that_stops_reading_does_not_block_shutdown() {
    let running = flashpool_nvmet::Server::bind("127.0.0.1:0", tls_config(TlsMode::Require))
        .unwrap()
        .spawn()
        .unwrap();
    let p = tls_proxy(running.local_addr, key(1, 32, 0x10), HOSTNQN, 1);
    // Commands (error responses: no Connect) never read, through the secure channel.
    let mut h = Host::new(p, false, false);
    let n = flood_until_the_target_stops_reading(&mut h.stream, Duration::from_secs(1));
    println!("target stopped reading after about {n} commands");
    within(Duration::from_secs(60), "shutdown_and_join", move || {
        running.shutdown_and_join().unwrap()
    });
}
