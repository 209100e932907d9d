//! Socket-level handshake tests: hand-made option sequences over a real
//! TCP socket, well-formed and malformed. After every bad input the server
//! must answer with the spec's error or hang up, and keep serving others.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::wire;

/// A fresh connection still completes a handshake and an I/O round trip.
fn still_serving(srv: &TestServer) {
    let mut c = Raw::connect(srv, false, false);
    let data = pattern(4096, 7);
    assert_eq!(c.write(1, 8192, &data), 0);
    assert_eq!(c.read_simple(2, 8192, 4096).unwrap(), data);
    c.disc();
    assert!(c.closed_by_server());
}

#[test]
fn go_info_list_and_block_size() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    // LIST: both exports, then ACK.
    let r = c.option_replies(OPT_LIST, &[]);
    let names: Vec<String> = r
        .iter()
        .filter(|o| o.kind == REP_SERVER)
        .map(|o| {
            let n = wire::be32(&o.data) as usize;
            String::from_utf8(o.data[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, vec!["default", "ro"]);
    assert_eq!(r.last().unwrap().kind, REP_ACK);

    // INFO with NAME and DESCRIPTION on the empty (default) name.
    let r = c.option_replies(
        OPT_INFO,
        &go_payload("", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    let info = |t: u16| {
        r.iter()
            .find(|o| o.kind == REP_INFO && wire::be16(&o.data) == t)
            .unwrap()
    };
    assert_eq!(wire::be64(&info(INFO_EXPORT).data[2..]), SIZE);
    let flags = wire::be16(&info(INFO_EXPORT).data[10..]);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_SEND_CACHE,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x} missing");
    }
    assert_eq!(flags & FLAG_SEND_DF, 0, "DF only with structured replies");
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    let bs = &info(INFO_BLOCK_SIZE).data;
    assert_eq!(
        (
            wire::be32(&bs[2..]),
            wire::be32(&bs[6..]),
            wire::be32(&bs[10..])
        ),
        (1, 4096, 32 << 20)
    );
    assert_eq!(&info(INFO_NAME).data[2..], b"default");
    assert_eq!(&info(INFO_DESCRIPTION).data[2..], b"test disk");
    assert_eq!(r.last().unwrap().kind, REP_ACK);

    // After STRUCTURED_REPLY, DF appears; read-only export says so.
    c.structured();
    let r = c.option_replies(OPT_INFO, &go_payload("ro", &[]));
    let flags = wire::be16(&r[0].data[10..]);
    assert_ne!(flags & FLAG_SEND_DF, 0);
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    let (size, _) = c.go("default");
    assert_eq!(size, SIZE);
    c.disc();
    assert!(c.closed_by_server());
}

#[test]
fn export_name_with_and_without_zeroes() {
    let srv = TestServer::start();
    for no_zeroes in [true, false] {
        let mut c = srv.raw();
        c.greeting();
        c.client_flags(FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 });
        c.option(OPT_EXPORT_NAME, b"default");
        let r = c.recv(10);
        assert_eq!(wire::be64(&r), SIZE);
        if !no_zeroes {
            assert_eq!(c.recv(124), vec![0u8; 124]);
        }
        assert_eq!(c.write(9, 0, b"hello"), 0);
        c.disc();
        assert!(c.closed_by_server());
    }
}

#[test]
fn meta_context_negotiation() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    // Before structured replies: invalid.
    let r = c.set_meta("", &[META_BASE_ALLOCATION]);
    assert_eq!(r[0].kind, REP_ERR_INVALID);
    c.structured();
    // LIST with no query lists base:allocation; "base:" too.
    for q in [&[][..], &["base:"][..]] {
        let r = c.option_replies(OPT_LIST_META_CONTEXT, &meta_payload("", q));
        assert_eq!(r[0].kind, REP_META_CONTEXT);
        assert_eq!(&r[0].data[4..], META_BASE_ALLOCATION.as_bytes());
        assert_eq!(r[1].kind, REP_ACK);
    }
    // Unknown context: just ACK; unknown export: ERR_UNKNOWN.
    let r = c.set_meta("", &["qemu:dirty-bitmap:x"]);
    assert_eq!(r[0].kind, REP_ACK);
    let r = c.set_meta("nope", &[META_BASE_ALLOCATION]);
    assert_eq!(r[0].kind, REP_ERR_UNKNOWN);
    // Query count larger than the payload can hold: invalid, no huge allocation.
    let mut p = meta_payload("", &[]);
    let n = p.len();
    p[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
    let r = c.option_replies(OPT_SET_META_CONTEXT, &p);
    assert_eq!(r[0].kind, REP_ERR_INVALID);
    let r = c.set_meta("default", &[META_BASE_ALLOCATION]);
    assert_eq!(r[0].kind, REP_META_CONTEXT);
    assert_eq!(wire::be32(&r[0].data), META_BASE_ALLOCATION_ID);
    c.go("");
    c.request(0, CMD_BLOCK_STATUS, 5, 0, 1 << 20, &[]);
    let ch = c.chunk();
    assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(ch.handle, 5);
    assert_eq!(ch.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
    assert_eq!(wire::be32(&ch.data), META_BASE_ALLOCATION_ID);
    assert_eq!(wire::be32(&ch.data[4..]), 1 << 20);
    assert_eq!(wire::be32(&ch.data[8..]), STATE_HOLE | STATE_ZERO);
}

#[test]
fn unknown_options_get_unsup_and_haggling_goes_on() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    for opt in [0u32, 4, OPT_STARTTLS, 12, 999, u32::MAX] {
        let r = c.option_replies(opt, b"some payload");
        assert_eq!(r[0].kind, REP_ERR_UNSUP, "option {opt}");
    }
    c.go("");
    c.disc();
}

#[test]
fn malformed_option_payloads_get_errors() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    let cases: Vec<(u32, Vec<u8>, u32)> = vec![
        (OPT_LIST, b"x".to_vec(), REP_ERR_INVALID),
        (OPT_STRUCTURED_REPLY, b"x".to_vec(), REP_ERR_INVALID),
        // name length beyond the payload
        (OPT_GO, vec![0, 0, 0, 200, b'a'], REP_ERR_INVALID),
        // missing info count
        (OPT_GO, vec![0, 0, 0, 0], REP_ERR_INVALID),
        // info count larger than the data
        (OPT_INFO, vec![0, 0, 0, 0, 0, 5, 0, 1], REP_ERR_INVALID),
        // trailing garbage
        (OPT_GO, vec![0, 0, 0, 0, 0, 0, 9], REP_ERR_INVALID),
        // invalid UTF-8 name
        (OPT_GO, vec![0, 0, 0, 1, 0xff, 0, 0], REP_ERR_INVALID),
        // unknown export
        (OPT_GO, go_payload("missing", &[]), REP_ERR_UNKNOWN),
        (OPT_INFO, go_payload("missing", &[]), REP_ERR_UNKNOWN),
        // empty payload for GO
        (OPT_GO, vec![], REP_ERR_INVALID),
    ];
    for (opt, data, want) in cases {
        let r = c.option_replies(opt, &data);
        assert_eq!(
            r.last().unwrap().kind,
            want,
            "option {opt} payload {data:?}"
        );
    }
    // Too-big payload is skipped and refused, haggling continues.
    let big = vec![0u8; 1 << 20];
    let r = c.option_replies(OPT_GO, &big);
    assert_eq!(r[0].kind, REP_ERR_TOO_BIG);
    c.go("");
    c.disc();
    still_serving(&srv);
}

#[test]
fn abort_is_acked_then_closed() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    let r = c.option_replies(OPT_ABORT, &[]);
    assert_eq!(r[0].kind, REP_ACK);
    assert!(c.closed_by_server());
    still_serving(&srv);
}

#[test]
fn fatal_handshake_errors_disconnect() {
    let srv = TestServer::start();
    // Unknown client flags.
    let mut c = srv.raw();
    c.greeting();
    c.client_flags(1 << 5);
    assert!(c.closed_by_server());
    // Bad option magic.
    let mut c = srv.raw();
    c.hello();
    c.send(b"IHAVEOPX\0\0\0\x07\0\0\0\0");
    assert!(c.closed_by_server());
    // Huge option length.
    let mut c = srv.raw();
    c.hello();
    c.send(b"IHAVEOPT\0\0\0\x07\xff\xff\xff\xff");
    assert!(c.closed_by_server());
    // EXPORT_NAME of a missing export cannot be answered: hang up.
    let mut c = srv.raw();
    c.hello();
    c.option(OPT_EXPORT_NAME, b"missing");
    assert!(c.closed_by_server());
    // Non-fixed newstyle client sending anything but EXPORT_NAME.
    let mut c = srv.raw();
    c.greeting();
    c.client_flags(0);
    c.option(OPT_LIST, &[]);
    assert!(c.closed_by_server());
    still_serving(&srv);
}

#[test]
fn truncated_handshakes_are_dropped_quietly() {
    let srv = TestServer::start();
    let cuts: Vec<Vec<u8>> = vec![
        vec![],
        vec![0, 0],
        vec![0, 0, 0, 3, b'I', b'H', b'A'],
        [&[0u8, 0, 0, 3][..], b"IHAVEOPT\0\0\0\x07\0\0\0\x20\0\0"].concat(),
    ];
    for cut in cuts {
        let mut c = srv.raw();
        c.greeting();
        c.send(&cut);
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(c.closed_by_server());
    }
    // A client that connects and vanishes before reading the greeting.
    drop(std::net::TcpStream::connect(srv.addr).unwrap());
    still_serving(&srv);
}

#[test]
fn unix_socket_serves_too() {
    let srv = TestServer::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.sock).unwrap();
    use std::io::{Read, Write};
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut o = b"IHAVEOPT".to_vec();
    o.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    o.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&o).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(wire::be64(&r), SIZE);
}
