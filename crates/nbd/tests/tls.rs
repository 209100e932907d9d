//! TLS (`NBD_OPT_STARTTLS`) at the protocol level, against a real server over TCP: what a
//! server that requires TLS answers before it, STARTTLS then a TLS-PSK session carrying the
//! rest of the handshake and real I/O, a wrong key refused, TLS off answered `ERR_UNSUP`, and
//! `--tls on` still serving plain clients. Interoperability with libnbd's GnuTLS client
//! (nbdinfo, nbdcopy, fio; X.509 and PSK) is checked end to end in tests/e2e/check-tls.sh.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::wire;
use flashpool_nbd::{Config, Tls, TlsCredentials, TlsMode};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};
use std::io::{Read, Write};
use std::net::TcpStream;

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn server(mode: TlsMode) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.psk");
    std::fs::write(&file, format!("alice:{KEY}\n")).unwrap();
    let tls = Tls::new(mode, &TlsCredentials::Psk { file }).unwrap();
    let srv = TestServer::start_with(Config {
        tls: Some(tls),
        ..Config::default()
    });
    (srv, dir)
}

fn tls_client(s: TcpStream, key_hex: &str) -> Result<SslStream<TcpStream>, String> {
    let key: Vec<u8> = (0..key_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&key_hex[i..i + 2], 16).unwrap())
        .collect();
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_cipher_list("PSK").unwrap();
    b.set_psk_client_callback(move |_ssl, _hint, identity, psk| {
        identity[..5].copy_from_slice(b"alice");
        identity[5] = 0;
        psk[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let c = b.build();
    let mut cfg = c.configure().unwrap();
    cfg.set_verify_hostname(false);
    cfg.set_use_server_name_indication(false);
    cfg.connect("localhost", s).map_err(|e| e.to_string())
}

fn option<S: Write>(s: &mut S, opt: u32, data: &[u8]) {
    let mut b = Vec::new();
    b.extend_from_slice(b"IHAVEOPT");
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// (option, reply kind, payload) of one option reply.
fn reply<S: Read>(s: &mut S) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(wire::be64(&h[0..8]), OPT_REPLY_MAGIC);
    let mut data = vec![0u8; wire::be32(&h[16..20]) as usize];
    s.read_exact(&mut data).unwrap();
    (wire::be32(&h[8..12]), wire::be32(&h[12..16]), data)
}

/// NBD_OPT_GO on `s` up to its final reply; the final reply's kind.
fn go<S: Read + Write>(s: &mut S, name: &str) -> u32 {
    option(s, OPT_GO, &go_payload(name, &[]));
    loop {
        let (_, kind, _) = reply(s);
        if kind == REP_ACK || kind & 0x8000_0000 != 0 {
            return kind;
        }
    }
}

#[test]
fn a_server_that_requires_tls_refuses_everything_before_it() {
    let (srv, _d) = server(TlsMode::Require);
    let mut c = srv.raw();
    c.hello();
    for opt in [
        OPT_LIST,
        OPT_INFO,
        OPT_GO,
        OPT_STRUCTURED_REPLY,
        OPT_LIST_META_CONTEXT,
    ] {
        let data = if opt == OPT_INFO || opt == OPT_GO {
            go_payload("", &[])
        } else {
            Vec::new()
        };
        let r = c.option_replies(opt, &data);
        assert_eq!(r.last().unwrap().kind, REP_ERR_TLS_REQD, "option {opt}");
    }
    let r = c.option_replies(OPT_STARTTLS, b"junk");
    assert_eq!(r[0].kind, REP_ERR_INVALID, "STARTTLS takes no data");
    // NBD_OPT_EXPORT_NAME has no error reply: the server hangs up.
    c.option(OPT_EXPORT_NAME, b"");
    assert!(c.closed_by_server());
}

#[test]
fn starttls_with_a_pre_shared_key_carries_the_handshake_and_io() {
    let (srv, _d) = server(TlsMode::Require);
    let mut c = srv.raw();
    c.hello();
    let r = c.option_replies(OPT_STARTTLS, &[]);
    assert_eq!(r[0].kind, REP_ACK);
    let mut t = tls_client(c.s, KEY).expect("TLS handshake");
    // TLS on: a second STARTTLS is invalid, and GO works.
    option(&mut t, OPT_STARTTLS, &[]);
    assert_eq!(reply(&mut t).1, REP_ERR_INVALID);
    assert_eq!(go(&mut t, ""), REP_ACK);
    let data = pattern(8192, 7);
    // A plain WRITE runs inline, so the READ after it sees its data.
    let mut w = wire::encode_request(&wire::Request {
        flags: 0,
        kind: CMD_WRITE,
        handle: 1,
        offset: 65536,
        len: data.len() as u64,
    })
    .to_vec();
    w.extend_from_slice(&data);
    w.extend_from_slice(&wire::encode_request(&wire::Request {
        flags: 0,
        kind: CMD_READ,
        handle: 2,
        offset: 65536,
        len: data.len() as u64,
    }));
    t.write_all(&w).unwrap();
    let mut seen = 0;
    while seen < 2 {
        let mut h = [0u8; 16];
        t.read_exact(&mut h).unwrap();
        assert_eq!(wire::be32(&h[0..4]), SIMPLE_REPLY_MAGIC);
        assert_eq!(wire::be32(&h[4..8]), 0, "no error");
        if wire::be64(&h[8..16]) == 2 {
            let mut back = vec![0u8; data.len()];
            t.read_exact(&mut back).unwrap();
            assert!(back == data, "read back over TLS");
        }
        seen += 1;
    }
    t.write_all(&wire::encode_request(&wire::Request {
        flags: 0,
        kind: CMD_DISC,
        handle: 3,
        offset: 0,
        len: 0,
    }))
    .unwrap();
    srv.stop();
}

#[test]
fn a_wrong_key_is_refused() {
    let (srv, _d) = server(TlsMode::Require);
    let mut c = srv.raw();
    c.hello();
    assert_eq!(c.option_replies(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    let wrong = "ff".repeat(32);
    let res = tls_client(c.s, &wrong).and_then(|mut t| {
        // TLS 1.3 may finish the client side before the server's verdict arrives.
        option(&mut t, OPT_LIST, &[]);
        let mut b = [0u8; 1];
        match t.read(&mut b) {
            Ok(n) if n > 0 => Ok(()),
            _ => Err("closed".to_string()),
        }
    });
    assert!(res.is_err(), "a client with the wrong key got through");
}

#[test]
fn without_tls_starttls_is_unsupported_and_tls_on_serves_plain_clients() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    assert_eq!(c.option_replies(OPT_STARTTLS, &[])[0].kind, REP_ERR_UNSUP);
    c.go("");
    let (srv2, _d) = server(TlsMode::On);
    let mut p = srv2.raw();
    p.hello();
    p.go("");
    assert_eq!(p.read_simple(1, 0, 4096).unwrap().len(), 4096);
}
