//! In-band authentication (DH-HMAC-CHAP) and host allow-lists over a real
//! TCP connection to the target, with the test initiator in `common` and the
//! host-side message builders of `flashpool_nvmet::auth::host`: Connect sets
//! AUTHREQ.ATR, commands before authentication are refused with
//! Authentication Required, a full transaction on the admin queue and an I/O
//! queue unlocks them, a wrong secret fails, a host not on the allow-list is
//! refused with Connect Invalid Host pointing at the host NQN, and random
//! Authentication Send data never kills the target.

mod common;

use std::sync::Arc;

use common::*;
use flashpool_nvmet::auth::{self, host, CONNECT_AUTHREQ_ATR};
use flashpool_nvmet::pdu::{self, Command};
use flashpool_nvmet::secret::{HashId, HostSecrets, Secret};
use flashpool_nvmet::status::Status;
use flashpool_nvmet::TargetConfig;

const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:not-allowed";

fn secret(fill: u8, hash: Option<HashId>) -> Secret {
    Secret::parse(&Secret::encode(&[fill; 32], hash)).unwrap()
}

/// The test config with `HOSTNQN` needing `host` (and `ctrl`) secrets, plus
/// an allow-listed host without one.
fn auth_config(host: Secret, ctrl: Option<Secret>) -> TargetConfig {
    let mut c = config();
    let s = &mut c.subsystems[0];
    s.access
        .secrets
        .insert(HOSTNQN.into(), Arc::new(HostSecrets { host, ctrl }));
    s.access
        .allowed
        .insert("nqn.2014-08.org.nvmexpress:uuid:plain".into());
    c
}

fn auth_cmd(h: &mut Host, fctype: u8, len: u32) -> Command {
    let mut c = Command::new(0x7F, h.cid(), 0);
    c.0[4] = fctype;
    c.0[41] = 1;
    c.0[42] = 1;
    c.0[43] = auth::SECP_DHCHAP;
    pdu::put32(&mut c.0, 44, len);
    c
}

fn send(h: &mut Host, msg: &[u8]) -> Status {
    let c = auth_cmd(h, 0x05, msg.len() as u32);
    h.exec(c, msg, None).0
}

fn receive(h: &mut Host, al: u32) -> (Status, Vec<u8>) {
    let mut c = auth_cmd(h, 0x06, al);
    c.set_sgl(0, al, pdu::SGL_TRANSPORT);
    let (s, _, d) = h.exec(c, &[], None);
    (s, d)
}

/// The host's side of a whole transaction on queue `h`; Ok when Success1 came.
fn authenticate(h: &mut Host, key: &Secret, hostnqn: &str) -> Result<(), Vec<u8>> {
    let tid = 0x42;
    assert_eq!(
        send(h, &host::negotiate(tid, &[1, 2, 3], &[0, 1])),
        Status::SUCCESS
    );
    let (s, ch) = receive(h, 4096);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(ch.len(), 4096);
    let c = host::parse_challenge(&ch).ok_or(ch[..8].to_vec())?;
    assert_eq!(
        (c.hash, c.dhgroup),
        (HashId::Sha256, 0),
        "key length picks SHA-256, NULL DH preferred"
    );
    let r = auth::host_response(
        c.hash,
        &key.transformed(hostnqn),
        &c.c1,
        c.s1,
        tid,
        hostnqn,
        NQN,
    );
    assert_eq!(send(h, &host::reply(tid, &r, None, &[])), Status::SUCCESS);
    let (s, m) = receive(h, 4096);
    assert_eq!(s, Status::SUCCESS);
    if m[..2] == [auth::TYPE_DHCHAP, auth::MSG_SUCCESS1] {
        Ok(())
    } else {
        Err(m[..8].to_vec())
    }
}

#[test]
fn commands_wait_for_authentication() {
    let key = secret(0x31, Some(HashId::Sha256));
    let srv = TestServer::with(auth_config(key.clone(), None));
    let mut a = Host::new(srv.addr, false, false);
    let (s, r) = a.connect(NQN, 0, 0xFFFF, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_ne!(r & CONNECT_AUTHREQ_ATR, 0, "AUTHREQ.ATR set");
    let cntlid = r as u16;

    // Before authentication: Property Get runs, Property Set and admin commands do not.
    assert_eq!(a.prop_get(0x08, false), (Status::SUCCESS, 0x0001_0300));
    assert_eq!(
        a.prop_set(0x14, 1 | 6 << 16 | 4 << 20),
        Status::AUTH_REQUIRED
    );
    assert_eq!(a.identify(1, 0).0, Status::AUTH_REQUIRED);
    // Receive before any negotiate: an AUTH_Failure1, not a crash.
    let (s, m) = receive(&mut a, 64);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(m[1], auth::MSG_FAILURE1);
    // Bad SECP / SPSP / lengths: Invalid Field.
    let mut c = auth_cmd(&mut a, 0x05, 8);
    c.0[43] = 0x00;
    assert_eq!(a.exec(c, &[0; 8], None).0, Status::INVALID_FIELD);
    let c = auth_cmd(&mut a, 0x05, 0);
    assert_eq!(a.exec(c, &[], None).0, Status::INVALID_FIELD);
    let c = auth_cmd(&mut a, 0x05, 9);
    assert_eq!(a.exec(c, &[0; 8], None).0, Status::SGL_INVALID_DATA_LEN);

    authenticate(&mut a, &key, HOSTNQN).unwrap();
    assert_eq!(a.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
    assert_eq!(a.prop_get(0x1c, false), (Status::SUCCESS, 1));
    assert_eq!(a.identify(1, 0).0, Status::SUCCESS);
    assert_eq!(a.set_queues(2).0, Status::SUCCESS);

    // An I/O queue authenticates too.
    let mut io = Host::new(srv.addr, false, false);
    let (s, r) = io.connect(NQN, 1, cntlid, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_ne!(r & CONNECT_AUTHREQ_ATR, 0);
    let data = vec![0x5Au8; BS];
    assert_eq!(io.write(1, 0, &data, true), Status::AUTH_REQUIRED);
    assert_eq!(
        io.write(1, 0, &data, false),
        Status::AUTH_REQUIRED,
        "refused before R2T"
    );
    assert_eq!(io.read(1, 0, 1).0, Status::AUTH_REQUIRED);
    authenticate(&mut io, &key, HOSTNQN).unwrap();
    assert_eq!(io.write(1, 0, &data, false), Status::SUCCESS);
    assert_eq!(io.read(1, 0, 1), (Status::SUCCESS, data));
}

#[test]
fn wrong_secret_is_refused() {
    let key = secret(0x31, Some(HashId::Sha256));
    let srv = TestServer::with(auth_config(key, None));
    let mut a = Host::new(srv.addr, false, false);
    let (s, r) = a.connect(NQN, 0, 0xFFFF, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_ne!(r & CONNECT_AUTHREQ_ATR, 0);
    let wrong = secret(0x32, Some(HashId::Sha256));
    let f = authenticate(&mut a, &wrong, HOSTNQN).unwrap_err();
    assert_eq!(
        f,
        [
            0,
            auth::MSG_FAILURE1,
            0,
            0,
            0x42,
            0,
            auth::REASON_FAILED,
            auth::FAIL_FAILED
        ]
    );
    assert_eq!(
        a.prop_set(0x14, 1 | 6 << 16 | 4 << 20),
        Status::AUTH_REQUIRED
    );
    assert_eq!(a.identify(1, 0).0, Status::AUTH_REQUIRED);
}

#[test]
fn allow_list() {
    let key = secret(0x31, None);
    let srv = TestServer::with(auth_config(key, None));
    // Not on the list: Connect Invalid Host, IATTR 1, offset 512 (the host NQN).
    let mut h = Host::new(srv.addr, false, false);
    let cmd = h.connect_cmd(0, 31, 0);
    let d = Host::connect_data(NQN, OTHER_HOST, 0xFFFF);
    let (s, r, _) = h.exec(cmd, &d, None);
    assert_eq!(s, Status::CONNECT_INVALID_HOST);
    assert_eq!(r, 1 << 16 | 512);
    assert_eq!(srv.target.controller_count(), 0);
    // On the list without a secret: connects without authentication.
    let mut h = Host::new(srv.addr, false, false);
    let cmd = h.connect_cmd(0, 31, 0);
    let d = Host::connect_data(NQN, "nqn.2014-08.org.nvmexpress:uuid:plain", 0xFFFF);
    let (s, r, _) = h.exec(cmd, &d, None);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(r & CONNECT_AUTHREQ_ATR, 0);
    assert_eq!(h.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
    // Auth Send on a queue that needs no authentication: Invalid Field.
    assert_eq!(
        send(&mut h, &host::negotiate(1, &[1], &[0])),
        Status::INVALID_FIELD
    );
    // The discovery controller stays open to any host.
    let mut h = Host::new(srv.addr, false, false);
    let cmd = h.connect_cmd(0, 31, 0);
    let d = Host::connect_data(flashpool_nvmet::DISCOVERY_NQN, OTHER_HOST, 0xFFFF);
    assert_eq!(h.exec(cmd, &d, None).0, Status::SUCCESS);
}

#[test]
fn random_auth_messages_never_kill_the_target() {
    let key = secret(0x31, None);
    let srv = TestServer::with(auth_config(key.clone(), Some(key.clone())));
    let mut rng = Rng(seed(0xA17E));
    for _ in 0..20 {
        let mut a = Host::new(srv.addr, false, false);
        assert_eq!(a.connect(NQN, 0, 0xFFFF, 0).0, Status::SUCCESS);
        for _ in 0..30 {
            let len = 1 + rng.below(300) as usize;
            let mut m = vec![0u8; len];
            rng.fill(&mut m);
            if rng.below(2) == 0 {
                m[0] = rng.below(2) as u8;
                if len > 1 {
                    m[1] = [0u8, 2, 4, 0xF0][rng.below(4) as usize];
                }
            }
            assert_eq!(send(&mut a, &m), Status::SUCCESS);
            let al = 1 + rng.below(200) as u32;
            let (s, _) = receive(&mut a, al);
            assert!(s == Status::SUCCESS || s == Status::INTERNAL_ERROR, "{s:?}");
        }
        // The queue still works: a proper transaction succeeds.
        authenticate(&mut a, &key, HOSTNQN).unwrap();
        assert_eq!(a.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
    }
}

#[test]
fn a_queue_that_never_authenticates_is_closed_at_the_deadline_even_while_busy() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let key = secret(0x35, Some(HashId::Sha256));
    // A short deadline (the default, 30 s, is checked by a unit test, not waited out).
    let deadline = Duration::from_secs(2);
    let mut config = auth_config(key, None);
    config.deadlines.auth_deadline = deadline;
    let srv = TestServer::with(config);
    // Before Connect, so before the target starts the deadline.
    let started = Instant::now();
    let mut a = Host::new(srv.addr, false, false);
    assert_eq!(a.connect(NQN, 0, 0xFFFF, 0).0, Status::SUCCESS);
    // Property Get (allowed before authentication) every 100 ms: the queue's read never
    // waits long enough to time out, so only a check on every PDU finds the deadline.
    let t0 = Instant::now();
    let mut answered = 0;
    loop {
        assert!(
            t0.elapsed() < deadline + Duration::from_secs(10),
            "an unauthenticated queue stayed open past the deadline"
        );
        let mut c = Command::new(0x7F, a.cid(), 0);
        c.0[4] = 0x04;
        pdu::put32(&mut c.0, 44, 0x08);
        if a.stream
            .write_all(&pdu::capsule_cmd(&c, &[], false, false))
            .is_err()
        {
            break;
        }
        match a.next_event() {
            Ok(Event::Completion(c)) => {
                assert_eq!(Status::from_field(c.status), Status::SUCCESS);
                answered += 1;
            }
            _ => break,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(answered >= 10, "the host was busy: {answered} answered");
    assert!(
        started.elapsed() >= deadline,
        "closed at the deadline, not before: after {:?}",
        started.elapsed()
    );
    // Its controller goes too (just after the socket closes).
    let t1 = Instant::now();
    while srv.target.controller_count() > 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "the controller stayed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
