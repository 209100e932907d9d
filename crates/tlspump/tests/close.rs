//! The pump ends when the server closes its plain end, even while the TLS peer has stopped
//! reading (its socket full, the session's writes waiting): its threads go and the peer sees
//! the socket closed, within [`CLOSE_LINGER`] and some slack. And what the server wrote before
//! it closed still reaches a peer that reads it within [`CLOSE_LINGER`].
//!
//! The peer is an OpenSSL TLS client over loopback (a self-signed certificate, not verified);
//! the pump's threads are found by name in `/proc/self/task`.

use std::io::{ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use flashpool_tlspump::CLOSE_LINGER;
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::ssl::{Ssl, SslAcceptor, SslContext, SslMethod, SslStream, SslVerifyMode};
use openssl::x509::{X509NameBuilder, X509};

/// Limits on top of the pump's own before a test gives up.
const SLACK: Duration = Duration::from_secs(5);

/// A TLS server context with a fresh self-signed P-256 certificate.
fn server_context() -> SslContext {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "tlspump-test").unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    let serial = BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap();
    cert.set_serial_number(&serial).unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    cert.sign(&key, MessageDigest::sha256()).unwrap();
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
    b.set_private_key(&key).unwrap();
    b.set_certificate(&cert.build()).unwrap();
    b.build().into_context()
}

/// A TLS connection over loopback: the peer's end (a client), and the plain end of a pump
/// (threads `NAME-in`, `NAME-out`) serving the other.
fn connected(name: &'static str) -> (SslStream<TcpStream>, UnixStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        let tls = Ssl::new(&server_context()).unwrap().accept(tcp).unwrap();
        flashpool_tlspump::start(tls, name).unwrap()
    });
    let mut ctx = SslContext::builder(SslMethod::tls_client()).unwrap();
    ctx.set_verify(SslVerifyMode::NONE);
    let ctx = ctx.build();
    let peer = Ssl::new(&ctx)
        .unwrap()
        .connect(TcpStream::connect(addr).unwrap())
        .unwrap();
    (peer, server.join().unwrap())
}

/// How many threads of this process have a name starting with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with(prefix))
        })
        .count()
}

/// Waits until no thread's name starts with `prefix`; how long that took.
fn threads_end(prefix: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while threads_named(prefix) > 0 {
        assert!(
            t0.elapsed() < limit,
            "the pump's threads ({prefix}*) still run {:?} after the plain end closed",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// The byte at offset `i` of what the server writes.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Writes to the plain end until a write makes no progress for 300 ms (the peer is not
/// reading: the socket, the pump and the socket pair are full); returns the bytes written.
fn fill(plain: &mut UnixStream) -> usize {
    plain
        .set_write_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    const CHUNK: usize = 64 * 1024;
    let t0 = Instant::now();
    let mut sent = 0usize;
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{sent} bytes taken by a peer that does not read"
        );
        let data: Vec<u8> = (sent..sent + CHUNK).map(pattern).collect();
        match plain.write(&data) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return sent
            }
            Err(e) => panic!("plain write failed: {e}"),
        }
    }
}

#[test]
fn the_pump_ends_when_the_plain_end_closes_while_the_peer_is_not_reading() {
    let (mut peer, mut plain) = connected("tpstall");
    // Each thread names itself once it runs.
    let t0 = Instant::now();
    while threads_named("tpstall") < 2 {
        assert!(t0.elapsed() < SLACK, "the pump's two threads never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = fill(&mut plain);
    println!("{sent} bytes written before the pump stopped taking them");
    // The server closes its end; the peer still does not read.
    drop(plain);
    let took = threads_end("tpstall", CLOSE_LINGER + SLACK);
    println!("the pump ended {took:?} after the plain end closed");
    // The peer sees its socket closed: what it sends now is refused (reset).
    let tcp = peer.get_mut();
    tcp.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t0 = Instant::now();
    loop {
        match tcp.write(b"anyone there?") {
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            _ => assert!(t0.elapsed() < SLACK, "the peer's socket still open"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn what_the_server_wrote_before_closing_reaches_a_peer_that_reads() {
    let (mut peer, mut plain) = connected("tplinger");
    let sent = fill(&mut plain);
    drop(plain);
    // The pump now waits for the peer with the rest; the peer reads well within the linger.
    std::thread::sleep(CLOSE_LINGER / 4);
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match peer.ssl_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                for (i, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(b, pattern(got + i), "byte {}", got + i);
                }
                got += n;
            }
            // close_notify, or the socket's end if there was no room for it.
            Err(_) => break,
        }
    }
    assert_eq!(got, sent, "every byte written before the close arrived");
    threads_end("tplinger", SLACK);
}
