//! Protocol tests against the NVMe/TCP target with the tiny Rust initiator in
//! `common`: ICReq, Connect (admin and I/O queues), Property Get/Set (enable
//! and shutdown handshakes), Identify, Get/Set Features, Get Log Page, the
//! discovery log, Read/Write (in-capsule and R2T/H2CData)/Flush/Write
//! Zeroes/DSM round trips, out-of-range LBAs, commands before Connect, bad
//! PDUs and digests, pipelined commands completing out of order, keep-alive
//! expiry and admin queue loss.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use flashpool_nvmet::connection::End;
use flashpool_nvmet::pdu::{self, le16, le32, le64, Command};
use flashpool_nvmet::status::Status;
use flashpool_nvmet::{Target, DISCOVERY_NQN};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

#[test]
fn connect_identify_and_io_round_trip() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    assert!(cntlid >= 1);
    let (s, cap) = a.prop_get(0x00, true);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(cap & 0xFFFF, 127, "MQES");
    assert_ne!(cap & (1 << 37), 0, "CSS: NVM command set");
    assert_eq!(a.prop_get(0x08, false), (Status::SUCCESS, 0x0001_0300));

    let (s, id) = a.identify(1, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(id.len(), 4096);
    assert_eq!(le16(&id, 78), cntlid, "CNTLID matches Connect");
    assert_ne!(le16(&id, 320), 0, "KAS");
    assert!(le32(&id, 1792) >= 4, "IOCCSZ");
    assert_eq!(le32(&id, 1796), 1, "IORCSZ");
    assert_eq!(le16(&id, 1800), 0, "ICDOFF");
    assert_ne!(le32(&id, 536) & 3, 0, "SGLs supported");
    assert_eq!(pdu::get_str(&id, 768, 256), NQN);
    assert_eq!(id[111], 1, "I/O controller");
    assert_eq!(le32(&id, 516), 2, "NN");

    let (s, list) = a.identify(2, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 2, 0));
    let (_, list) = a.identify(2, 1);
    assert_eq!(
        (le32(&list, 0), le32(&list, 4)),
        (2, 0),
        "only NSIDs above the one given"
    );

    let (s, ns) = a.identify(0, 1);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(le64(&ns, 0), NS_BYTES / BS as u64, "NSZE");
    assert_eq!(ns[130], 12, "LBADS: 4096-byte blocks");
    assert_eq!(&ns[104..120], &[0x11; 16], "NGUID");
    let (s, descs) = a.identify(3, 2);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!((descs[0], descs[1]), (2, 16));
    assert_eq!(&descs[4..20], &[0x22; 16]);
    assert_eq!((descs[20], descs[21]), (3, 16));
    assert_eq!(a.identify(0, 3).0, Status::INVALID_NS);
    assert_eq!(a.identify(0x55, 0).0, Status::INVALID_FIELD);

    let (s, r) = a.set_queues(4);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(r, 3 | 3 << 16);
    let (s, _, _) = a.admin_cmd(0x09, 0, 0x0F, 5000, 0); // KATO
    assert_eq!(s, Status::SUCCESS);
    let (s, kato, _) = a.admin_cmd(0x0A, 0, 0x0F, 0, 0);
    assert_eq!((s, kato), (Status::SUCCESS, 5000));
    let (s, _, smart) = a.admin_cmd(0x02, 0xFFFF_FFFF, 0x02 | 127 << 16, 0, 512);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(smart.len(), 512);
    assert_eq!(le16(&smart, 1), 300, "composite temperature");
    let (s, _, _) = a.admin_cmd(0x02, 0, 0x42 | 127 << 16, 0, 512);
    assert_eq!(s, Status::INVALID_LOG_PAGE);
    let (s, _, _) = a.admin_cmd(0x18, 0, 0, 0, 0);
    assert_eq!(s, Status::SUCCESS, "keep alive");
    let (s, _, _) = a.admin_cmd(0xC5, 0, 0, 0, 0);
    assert_eq!(s, Status::INVALID_OPCODE);

    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let small = pattern(1, 2 * BS);
    assert_eq!(
        io.write(1, 10, &small, true),
        Status::SUCCESS,
        "in-capsule write"
    );
    let big = pattern(2, 256 * 1024);
    assert_eq!(io.write(1, 100, &big, false), Status::SUCCESS, "R2T write");
    assert!(
        big.len() > io.maxh2c as usize,
        "the R2T write takes several H2CData PDUs"
    );
    assert_eq!(io.read(1, 10, 2), (Status::SUCCESS, small.clone()));
    assert_eq!(io.read(1, 100, 64), (Status::SUCCESS, big.clone()));
    // Namespaces are independent.
    assert_eq!(io.read(2, 10, 2), (Status::SUCCESS, vec![0; 2 * BS]));
    let c = io.rw_cmd(0x00, 0, 0, 0);
    let mut f = Command::new(0x00, c.cid(), 1);
    f.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(f, &[], None).0, Status::SUCCESS, "flush");

    // Write Zeroes over the second block of the small write.
    let wz = io.rw_cmd(0x08, 1, 11, 1);
    assert_eq!(io.exec(wz, &[], None).0, Status::SUCCESS);
    let mut expect = small.clone();
    expect[BS..].fill(0);
    assert_eq!(io.read(1, 10, 2), (Status::SUCCESS, expect));

    // DSM deallocate of blocks 100..104: one range, in the capsule.
    let mut dsm = Command::new(0x09, io.cid(), 1);
    dsm.set_cdw(10, 0); // one range
    dsm.set_cdw(11, 1 << 2); // AD
    let mut range = vec![0u8; 16];
    pdu::put32(&mut range, 4, 4);
    pdu::put64(&mut range, 8, 100);
    assert_eq!(io.exec(dsm, &range, None).0, Status::SUCCESS);
    let (s, d) = io.read(1, 100, 8);
    assert_eq!(s, Status::SUCCESS);
    assert!(d[..4 * BS].iter().all(|&b| b == 0));
    assert_eq!(&d[4 * BS..], &big[4 * BS..8 * BS]);

    // Shutdown handshake: CC.SHN = normal, CSTS.SHST = complete.
    assert_eq!(
        a.prop_set(0x14, 1 | 6 << 16 | 4 << 20 | 1 << 14),
        Status::SUCCESS
    );
    let (_, csts) = a.prop_get(0x1c, false);
    assert_eq!((csts >> 2) & 3, 2, "shutdown complete");
}

#[test]
fn header_and_data_digests_round_trip() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, true, true);
    assert_eq!(a.set_queues(1).0, Status::SUCCESS);
    let (s, id) = a.identify(1, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(le16(&id, 78), cntlid);
    let mut io = Host::io(srv.addr, cntlid, 1, true, true);
    let small = pattern(3, BS);
    let big = pattern(4, 512 * 1024);
    assert_eq!(io.write(1, 0, &small, true), Status::SUCCESS);
    assert_eq!(io.write(1, 1000, &big, false), Status::SUCCESS);
    assert_eq!(io.read(1, 0, 1), (Status::SUCCESS, small));
    assert_eq!(io.read(1, 1000, 128), (Status::SUCCESS, big));
}

#[test]
fn out_of_range_lba_and_bad_lengths_get_their_status() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let blocks = NS_BYTES / BS as u64;
    assert_eq!(io.read(1, blocks, 1).0, Status::LBA_RANGE);
    assert_eq!(io.read(1, blocks - 1, 2).0, Status::LBA_RANGE);
    assert_eq!(io.read(1, u64::MAX, 1).0, Status::LBA_RANGE);
    assert_eq!(
        io.write(1, blocks - 1, &[7; 2 * BS], true),
        Status::LBA_RANGE
    );
    // A too-large write through R2T is refused before any data moves.
    let c = io.rw_cmd(0x01, 1, blocks, 4);
    let (s, _, _) = io.exec(c, &[], Some(vec![1; 4 * BS]));
    assert_eq!(s, Status::LBA_RANGE);
    // The last block works.
    assert_eq!(io.write(1, blocks - 1, &[9; BS], true), Status::SUCCESS);
    assert_eq!(io.read(1, blocks - 1, 1), (Status::SUCCESS, vec![9; BS]));
    // SGL length not matching NLB.
    let mut c = io.rw_cmd(0x02, 1, 0, 2);
    c.set_sgl(0, BS as u32, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(c, &[], None).0, Status::SGL_INVALID_DATA_LEN);
    // Unknown namespace, unknown opcode, Write Zeroes past the end.
    assert_eq!(io.read(7, 0, 1).0, Status::INVALID_NS);
    let mut c = Command::new(0x7E, io.cid(), 1);
    c.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(c, &[], None).0, Status::INVALID_OPCODE);
    let c = io.rw_cmd(0x08, 1, blocks - 1, 2);
    assert_eq!(io.exec(c, &[], None).0, Status::LBA_RANGE);
    // Still serving.
    assert_eq!(io.read(1, 0, 1).0, Status::SUCCESS);
}

#[test]
fn commands_before_connect_get_command_sequence_error() {
    let srv = TestServer::start();
    let mut h = Host::new(srv.addr, false, false);
    assert_eq!(h.identify(1, 0).0, Status::CMD_SEQ_ERROR);
    assert_eq!(h.prop_get(0, true).0, Status::CMD_SEQ_ERROR);
    assert_eq!(h.read(1, 0, 1).0, Status::CMD_SEQ_ERROR);
    // A write before Connect is refused without an R2T.
    let c = h.rw_cmd(0x01, 1, 0, 1);
    assert_eq!(h.exec(c, &[], Some(vec![0; BS])).0, Status::CMD_SEQ_ERROR);
    // Connected but not enabled: admin commands wait for CC.EN.
    assert_eq!(h.connect(NQN, 0, 0xFFFF, 0).0, Status::SUCCESS);
    assert_eq!(h.identify(1, 0).0, Status::CMD_SEQ_ERROR);
    assert_eq!(
        h.connect(NQN, 0, 0xFFFF, 0).0,
        Status::CMD_SEQ_ERROR,
        "second Connect"
    );
    // I/O queue Connect to a controller that is not enabled.
    let mut h2 = Host::new(srv.addr, false, false);
    let cntlid = srv.target.controller_count() as u16;
    assert_eq!(h2.connect(NQN, 1, cntlid, 0).0, Status::CMD_SEQ_ERROR);
}

#[test]
fn connect_parameters_are_checked() {
    let srv = TestServer::start();
    let mut h = Host::new(srv.addr, false, false);
    let (s, r) = h.connect("nqn.2024-01.io.flashpool:nope", 0, 0xFFFF, 0);
    assert_eq!(s, Status::CONNECT_INVALID_PARAM);
    assert_eq!(r, 1 << 16 | 256, "IATTR data, IPO subnqn");
    let c = h.connect_cmd(0, 0, 0); // SQSIZE 0
    let (s, _, _) = h.exec(c, &Host::connect_data(NQN, HOSTNQN, 0xFFFF), None);
    assert_eq!(s, Status::CONNECT_INVALID_PARAM);
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(2);
    let mut q = Host::new(srv.addr, false, false);
    assert_eq!(
        q.connect(NQN, 1, cntlid + 100, 0).0,
        Status::CONNECT_INVALID_PARAM,
        "unknown controller"
    );
    assert_eq!(
        q.connect(NQN, 3, cntlid, 0).0,
        Status::CONNECT_INVALID_PARAM,
        "qid above the granted queues"
    );
    let c = q.connect_cmd(1, 31, 0);
    let (s, _, _) = q.exec(c, &Host::connect_data(NQN, "nqn.other-host", cntlid), None);
    assert_eq!(
        s,
        Status::CONNECT_INVALID_PARAM,
        "another host's controller"
    );
    assert_eq!(q.connect(NQN, 2, cntlid, 0).0, Status::SUCCESS);
    // Connect data through R2T works too.
    let mut q2 = Host::new(srv.addr, false, false);
    let c = q2.connect_cmd(1, 31, 0);
    let (s, r, _) = q2.exec(c, &[], Some(Host::connect_data(NQN, HOSTNQN, cntlid)));
    assert_eq!((s, r as u16), (Status::SUCCESS, cntlid));
}

#[test]
fn discovery_controller_lists_the_subsystem() {
    let srv = TestServer::start();
    let (mut d, _) = Host::admin(srv.addr, DISCOVERY_NQN, false, false);
    let (s, id) = d.identify(1, 0);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(id[111], 2, "discovery controller");
    assert_eq!(pdu::get_str(&id, 768, 256), DISCOVERY_NQN);
    // Header first (as nvme-cli does), then the whole page, then from an offset.
    let (s, _, hdr) = d.admin_cmd(0x02, 0, 0x70 | (1024 / 4 - 1) << 16, 0, 1024);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(le64(&hdr, 8), 1, "NUMREC");
    let (s, _, page) = d.admin_cmd(0x02, 0, 0x70 | (2048 / 4 - 1) << 16, 0, 2048);
    assert_eq!(s, Status::SUCCESS);
    let e = &page[1024..];
    assert_eq!((e[0], e[1], e[2]), (3, 1, 2), "TCP, IPv4, NVM subsystem");
    assert_eq!(pdu::get_str(e, 256, 256), NQN);
    assert_eq!(pdu::get_str(e, 32, 32).trim(), srv.addr.port().to_string());
    assert_eq!(pdu::get_str(e, 512, 256).trim(), "127.0.0.1");
    let mut c = Command::new(0x02, d.cid(), 0);
    c.set_cdw(10, 0x70 | (1024 / 4 - 1) << 16);
    c.set_cdw(12, 1024);
    c.set_sgl(0, 1024, pdu::SGL_TRANSPORT);
    let (s, _, tail) = d.exec(c, &[], None);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(tail, e);
    // No I/O queues, no namespaces on a discovery controller.
    assert_eq!(d.set_queues(1).0, Status::INVALID_FIELD);
    assert_eq!(d.identify(0, 1).0, Status::INVALID_NS);
}

#[test]
fn pipelined_commands_complete_out_of_order() {
    let seed = seed(0x5EED_0001);
    let mut rng = Rng(seed);
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    // Distinct block ranges, so the expected contents do not depend on order.
    let mut expect = Vec::new();
    let mut cids = Vec::new();
    for i in 0..48u64 {
        let blocks = 1 + rng.below(16) as u32;
        let lba = i * 32;
        let data = pattern(rng.next(), blocks as usize * BS);
        let c = io.rw_cmd(0x01, 1, lba, blocks);
        cids.push(c.cid());
        if data.len() <= 8192 && rng.below(2) == 0 {
            io.submit(c, &data, None);
        } else {
            io.submit(c, &[], Some(data.clone()));
        }
        expect.push((lba, data));
    }
    // Reads of blocks never written, queued behind the writes.
    for _ in 0..16 {
        let mut c = io.rw_cmd(0x02, 1, 4096 + rng.below(1000), 2);
        c.set_sgl(0, 2 * BS as u32, pdu::SGL_TRANSPORT);
        cids.push(c.cid());
        io.submit(c, &[], None);
    }
    let mut order = Vec::new();
    for _ in 0..cids.len() {
        let c = io.completion();
        assert_eq!(
            Status::from_field(c.status),
            Status::SUCCESS,
            "cid {}",
            c.cid
        );
        order.push(c.cid);
    }
    let mut sorted = order.clone();
    sorted.sort_unstable();
    let mut want = cids.clone();
    want.sort_unstable();
    assert_eq!(sorted, want, "one completion per command");
    assert_ne!(
        order, cids,
        "R2T writes complete after commands that arrived later"
    );
    for (lba, data) in expect {
        let (s, got) = io.read(1, lba, (data.len() / BS) as u32);
        assert_eq!(s, Status::SUCCESS);
        assert!(got == data, "lba {lba}");
    }
}

fn expect_termination(h: &mut Host, fes: u16) {
    match h.next_event() {
        Ok(Event::Term(f)) => assert_eq!(f, fes),
        Ok(Event::Completion(c)) => panic!("completion {c:?} instead of a termination"),
        Err(e) => panic!("connection error {e} instead of a termination"),
    }
    let mut b = [0u8; 1];
    assert_eq!(
        h.stream.read(&mut b).unwrap_or(0),
        0,
        "connection closed after C2HTermReq"
    );
}

#[test]
fn bad_pdu_length_terminates_the_connection() {
    let target = Target::new(config());
    let (addr, t) = serve_one(target.clone());
    let mut h = Host::new(addr, false, false);
    let c = Command::new(0x06, 1, 0);
    let mut b = pdu::capsule_cmd(&c, &[], false, false);
    pdu::put32(&mut b, 4, 40); // PLEN below HLEN
    h.send_raw(&b);
    expect_termination(&mut h, pdu::FES_INVALID_PDU_HDR);
    assert!(matches!(t.join().unwrap(), End::Terminated(1)));

    // Wrong HLEN for a capsule.
    let (addr, t) = serve_one(target.clone());
    let mut h = Host::new(addr, false, false);
    let mut b = pdu::capsule_cmd(&c, &[], false, false);
    b[2] = 64;
    h.send_raw(&b);
    expect_termination(&mut h, pdu::FES_INVALID_PDU_HDR);
    t.join().unwrap();

    // In-capsule data beyond what the target takes.
    let (addr, t) = serve_one(target.clone());
    let mut h = Host::new(addr, false, false);
    let b = pdu::capsule_cmd(&c, &vec![0; 64 * 1024], false, false);
    h.send_raw(&b[..72]);
    expect_termination(&mut h, pdu::FES_DATA_LIMIT_EXCEEDED);
    t.join().unwrap();

    // A PDU type a host never sends, and a capsule before ICReq.
    let (addr, t) = serve_one(target.clone());
    let mut h = Host::new(addr, false, false);
    h.send_raw(&pdu::r2t(1, 0, 0, 4096, false));
    expect_termination(&mut h, pdu::FES_INVALID_PDU_HDR);
    t.join().unwrap();
    let (addr, t) = serve_one(target.clone());
    let mut h = Host::raw(addr);
    h.send_raw(&pdu::capsule_cmd(&c, &[], false, false));
    expect_termination(&mut h, pdu::FES_PDU_SEQ_ERR);
    t.join().unwrap();
}

#[test]
fn header_digest_mismatch_terminates_data_digest_mismatch_fails_the_command() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, true, true);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, true, true);
    // Data digest wrong in a capsule: Transient Transport Error, queue lives on.
    let data = pattern(9, BS);
    let mut c = io.rw_cmd(0x01, 1, 5, 1);
    c.set_sgl(0, BS as u32, pdu::SGL_IN_CAPSULE);
    let mut b = pdu::capsule_cmd(&c, &data, true, true);
    let n = b.len();
    b[n - 1] ^= 0xFF;
    io.send_raw(&b);
    let comp = io.completion();
    assert_eq!(Status::from_field(comp.status), Status::TRANSIENT_TRANSPORT);
    assert_eq!(
        io.read(1, 5, 1),
        (Status::SUCCESS, vec![0; BS]),
        "nothing written"
    );
    // Header digest wrong: C2HTermReq and close.
    let c = io.rw_cmd(0x02, 1, 0, 1);
    let mut b = pdu::capsule_cmd(&c, &[], true, true);
    b[72] ^= 1;
    io.send_raw(&b);
    expect_termination(&mut io, pdu::FES_HDR_DIGEST_ERR);
    // Digest flags must match what ICReq negotiated.
    let mut h = Host::new(srv.addr, true, false);
    h.send_raw(&pdu::capsule_cmd(&c, &[], false, false));
    expect_termination(&mut h, pdu::FES_INVALID_PDU_HDR);
}

#[test]
fn bad_h2c_data_terminates() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let mut c = io.rw_cmd(0x01, 1, 0, 2);
    c.set_sgl(0, 2 * BS as u32, pdu::SGL_TRANSPORT);
    io.send_raw(&pdu::capsule_cmd(&c, &[], false, false));
    let (ch, hdr, _) = io.recv_pdu().unwrap();
    assert_eq!(ch.pdu_type, pdu::R2T);
    let ttag = le16(&hdr, 10);
    assert_eq!(le32(&hdr, 16), 2 * BS as u32);
    // Data at an offset the R2T did not ask for.
    let mut b = pdu::data_header(
        pdu::H2C_DATA,
        c.cid(),
        ttag,
        4096,
        4096,
        false,
        false,
        false,
    );
    b.extend_from_slice(&[0; 4096]);
    io.send_raw(&b);
    expect_termination(&mut io, pdu::FES_DATA_OUT_OF_RANGE);
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let srv = TestServer::start();
    let mut a = Host::new(srv.addr, false, false);
    let (s, cntlid) = a.connect(NQN, 0, 0xFFFF, 600);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(a.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid as u16, 1, false, false);
    // Traffic keeps it alive...
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(a.admin_cmd(0x18, 0, 0, 0, 0).0, Status::SUCCESS);
    }
    assert_eq!(srv.target.controller_count(), 1);
    // ...silence does not: both queues close, the controller is gone.
    let t0 = Instant::now();
    let mut b = [0u8; 1];
    assert_eq!(a.stream.read(&mut b).unwrap_or(0), 0, "admin queue closed");
    assert_eq!(io.stream.read(&mut b).unwrap_or(0), 0, "I/O queue closed");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(srv.target.controller_count(), 0);
}

#[test]
fn losing_the_admin_queue_closes_the_io_queues() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(2);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    // The host vanishes mid-transfer: half of an R2T write's data, then gone.
    let mut c = io.rw_cmd(0x01, 1, 0, 4);
    c.set_sgl(0, 4 * BS as u32, pdu::SGL_TRANSPORT);
    io.send_raw(&pdu::capsule_cmd(&c, &[], false, false));
    let (ch, hdr, _) = io.recv_pdu().unwrap();
    assert_eq!(ch.pdu_type, pdu::R2T);
    let mut b = pdu::data_header(
        pdu::H2C_DATA,
        c.cid(),
        le16(&hdr, 10),
        0,
        4096,
        false,
        false,
        false,
    );
    b.extend_from_slice(&[5; 4096]);
    io.send_raw(&b);
    let mut io2 = Host::io(srv.addr, cntlid, 2, false, false);
    drop(io);
    drop(a);
    let mut buf = [0u8; 1];
    assert_eq!(
        io2.stream.read(&mut buf).unwrap_or(0),
        0,
        "I/O queue closed with its controller"
    );
    assert_eq!(srv.target.controller_count(), 0);
    // A new controller sees nothing of the unfinished write.
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    assert_eq!(io.read(1, 0, 4), (Status::SUCCESS, vec![0; 4 * BS]));
}

#[test]
fn disconnect_closes_the_queue() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let mut c = Command::new(0x7F, io.cid(), 0);
    c.0[4] = 0x08;
    assert_eq!(io.exec(c, &[], None).0, Status::SUCCESS);
    let mut b = [0u8; 1];
    assert_eq!(io.stream.read(&mut b).unwrap_or(0), 0);
    assert_eq!(
        a.identify(1, 0).0,
        Status::SUCCESS,
        "the admin queue lives on"
    );
}

#[test]
fn duplicate_qid_and_outstanding_cid_are_refused() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(2);
    let io = Host::io(srv.addr, cntlid, 1, false, false);
    let mut dup = Host::new(srv.addr, false, false);
    assert_eq!(
        dup.connect(NQN, 1, cntlid, 0).0,
        Status::CONNECT_INVALID_PARAM,
        "QID 1 already connected"
    );
    // Once QID 1's connection closes, the QID can be connected again.
    drop(io);
    let t0 = Instant::now();
    loop {
        let mut h = Host::new(srv.addr, false, false);
        if h.connect(NQN, 1, cntlid, 0).0.is_success() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "QID 1 never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // An AER is held; a new command reusing its CID is a conflict.
    let mut aer = Command::new(0x0C, 500, 0);
    aer.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    a.submit(aer, &[], None);
    let mut c = Command::new(0x06, 500, 0);
    c.set_cdw(10, 1);
    c.set_sgl(0, 4096, pdu::SGL_TRANSPORT);
    let (s, _, _) = a.exec(c, &[], None);
    assert_eq!(s, Status::CID_CONFLICT);
    assert_eq!(a.identify(1, 0).0, Status::SUCCESS);
}

#[test]
fn namespace_with_512_byte_blocks() {
    use flashpool_nvmet::{MemNamespace, Server, Subsystem, TargetConfig};
    use std::sync::Arc;
    let s = Subsystem::new(NQN, "s512");
    s.add_namespace(1, Arc::new(MemNamespace::new(1 << 20, 512, [5; 16])));
    let server = Server::bind(
        "127.0.0.1:0",
        TargetConfig {
            subsystems: vec![s],
            ..Default::default()
        },
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let stop = server.shutdown_handle();
    let t = std::thread::spawn(move || server.run().unwrap());
    let (mut a, cntlid) = Host::admin(addr, NQN, false, false);
    let (_, ns) = a.identify(0, 1);
    assert_eq!((le64(&ns, 0), ns[130]), (2048, 9));
    a.set_queues(1);
    let mut io = Host::io(addr, cntlid, 1, false, false);
    let data = pattern(12, 3 * 512);
    let mut c = io.rw_cmd(0x01, 1, 7, 3);
    c.set_sgl(0, data.len() as u32, pdu::SGL_IN_CAPSULE);
    assert_eq!(io.exec(c, &data, None).0, Status::SUCCESS);
    let mut c = io.rw_cmd(0x02, 1, 7, 3);
    c.set_sgl(0, 3 * 512, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(c, &[], None), (Status::SUCCESS, 0, data));
    let mut c = io.rw_cmd(0x02, 1, 2047, 2);
    c.set_sgl(0, 1024, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(c, &[], None).0, Status::LBA_RANGE);
    drop((a, io));
    stop.shutdown();
    t.join().unwrap();
}

#[test]
fn r2t_buffers_are_bounded_and_waiting_writes_complete() {
    let seed = seed(0x5EED_0002);
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let mib = 1 << 20;
    let writes: Vec<(u64, Vec<u8>)> = (0..24u64)
        .map(|i| (i * 256, pattern(seed ^ i, mib)))
        .collect();
    io.events.clear(); // the Connect's completion
    for (lba, data) in &writes {
        let c = io.rw_cmd(0x01, 1, *lba, (mib / BS) as u32);
        io.submit(c, &[], Some(data.clone()));
    }
    for _ in 0..writes.len() {
        let c = io.completion();
        assert_eq!(Status::from_field(c.status), Status::SUCCESS);
    }
    let first_c = io.events.iter().position(|&e| e == b'C').unwrap();
    let bound = flashpool_nvmet::connection::MAX_R2T_BYTES / mib;
    assert!(
        first_c <= bound,
        "{first_c} R2Ts before the first completion, bound {bound}"
    );
    assert_eq!(
        io.events.iter().filter(|&&e| e == b'R').count(),
        writes.len()
    );
    for (lba, data) in &writes {
        let (s, got) = io.read(1, *lba, (mib / BS) as u32);
        assert_eq!(s, Status::SUCCESS);
        assert!(&got == data, "lba {lba}");
    }
}

#[test]
fn shutdown_closes_live_connections() {
    use flashpool_nvmet::Server;
    let running = Server::bind("127.0.0.1:0", config())
        .unwrap()
        .spawn()
        .unwrap();
    let (mut a, cntlid) = Host::admin(running.local_addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(running.local_addr, cntlid, 1, false, false);
    let t0 = Instant::now();
    running.shutdown_and_join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    let mut b = [0u8; 1];
    assert_eq!(a.stream.read(&mut b).unwrap_or(0), 0);
    assert_eq!(io.stream.read(&mut b).unwrap_or(0), 0);
}

#[test]
fn namespace_added_and_removed_while_serving() {
    use flashpool_nvmet::MemNamespace;
    use std::sync::Arc;
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    let (_, id) = a.identify(1, 0);
    assert_ne!(
        le32(&id, 92) & (1 << 8),
        0,
        "OAES: namespace attribute notices"
    );
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    // Enable the notice and hold an AER, as the kernel does.
    let (s, _, _) = a.admin_cmd(0x09, 0, 0x0B, 1 << 8, 0);
    assert_eq!(s, Status::SUCCESS);
    let mut aer = Command::new(0x0C, 900, 0);
    aer.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    a.submit(aer, &[], None);
    assert_eq!(io.read(3, 0, 1).0, Status::INVALID_NS);

    assert!(srv.target.add_namespace(
        NQN,
        3,
        Arc::new(MemNamespace::new(1 << 20, 4096, [0x33; 16]))
    ));
    let c = a.completion();
    assert_eq!(
        (c.cid, c.result, Status::from_field(c.status)),
        (900, 0x0004_0002, Status::SUCCESS)
    );
    let (s, _, log) = a.admin_cmd(0x02, 0xFFFF_FFFF, 0x04 | (1024 - 1) << 16, 0, 4096);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(
        (le32(&log, 0), le32(&log, 4)),
        (3, 0),
        "changed namespace list"
    );
    let (_, list) = a.identify(2, 0);
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 2, 3));
    assert_eq!(io.write(3, 0, &[0x5A; BS], true), Status::SUCCESS);
    assert_eq!(io.read(3, 0, 1), (Status::SUCCESS, vec![0x5A; BS]));

    // Removal: no AER outstanding now, so the event waits for the next one.
    assert!(srv.target.remove_namespace(NQN, 2));
    assert!(!srv.target.remove_namespace(NQN, 2));
    assert_eq!(io.read(2, 0, 1).0, Status::INVALID_NS);
    let mut aer = Command::new(0x0C, 901, 0);
    aer.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    a.submit(aer, &[], None);
    let c = a.completion();
    assert_eq!((c.cid, c.result), (901, 0x0004_0002));
    let (_, _, log) = a.admin_cmd(0x02, 0xFFFF_FFFF, 0x04 | (1024 - 1) << 16, 0, 4096);
    assert_eq!((le32(&log, 0), le32(&log, 4)), (2, 0));
    // Read without RAE cleared it.
    let (_, _, log) = a.admin_cmd(0x02, 0xFFFF_FFFF, 0x04 | (1024 - 1) << 16, 0, 4096);
    assert_eq!(le32(&log, 0), 0);
    let (_, list) = a.identify(2, 0);
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 3, 0));
}

/// A namespace whose volume is deleted while commands are in flight on it: every operation
/// fails [`flashpool_nvmet::NsError::Removed`].
struct RemovedNs(flashpool_nvmet::MemNamespace);

impl flashpool_nvmet::Namespace for RemovedNs {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn blocks(&self) -> u64 {
        self.0.blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.0.uuid()
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), flashpool_nvmet::NsError> {
        Err(flashpool_nvmet::NsError::Removed)
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), flashpool_nvmet::NsError> {
        Err(flashpool_nvmet::NsError::Removed)
    }
    fn flush(&self) -> Result<(), flashpool_nvmet::NsError> {
        Err(flashpool_nvmet::NsError::Removed)
    }
    fn deallocate(&self, _: u64, _: u64) -> Result<(), flashpool_nvmet::NsError> {
        Err(flashpool_nvmet::NsError::Removed)
    }
    fn write_zeroes(&self, _: u64, _: u64) -> Result<(), flashpool_nvmet::NsError> {
        Err(flashpool_nvmet::NsError::Removed)
    }
}

/// Commands in flight when their namespace goes away complete as those sent after it: Invalid
/// Namespace or Format (with DNR), not Internal Error.
#[test]
fn commands_on_a_namespace_removed_under_them_get_invalid_namespace() {
    use flashpool_nvmet::{Subsystem, TargetConfig};
    let s = Subsystem::new(NQN, "removed");
    s.add_namespace(
        1,
        std::sync::Arc::new(RemovedNs(flashpool_nvmet::MemNamespace::new(
            NS_BYTES, BS as u32, [0x77; 16],
        ))),
    );
    let (_srv, _a, mut io) = one_io_queue(
        TargetConfig {
            subsystems: vec![s],
            ..Default::default()
        },
        false,
    );
    // Status equality covers DNR (INVALID_NS has it set).
    assert_eq!(io.read(1, 0, 1).0, Status::INVALID_NS, "read");
    assert_eq!(io.write(1, 0, &[1; BS], true), Status::INVALID_NS, "write");
    assert_eq!(
        io.write(1, 0, &[1; 2 * BS], false),
        Status::INVALID_NS,
        "R2T write"
    );
    assert_eq!(
        write_zeroes(&mut io, 0, 1, false),
        Status::INVALID_NS,
        "zeroes"
    );
    let flush = io.rw_cmd(0x00, 1, 0, 1);
    assert_eq!(io.exec(flush, &[], None).0, Status::INVALID_NS, "flush");
}

/// A RAM namespace that records how it was asked to make data durable: writes with and
/// without FUA, Write Zeroes and flushes, in order.
struct DurabilityNs {
    inner: flashpool_nvmet::MemNamespace,
    log: std::sync::Mutex<Vec<&'static str>>,
}

impl DurabilityNs {
    fn new() -> DurabilityNs {
        DurabilityNs {
            inner: flashpool_nvmet::MemNamespace::new(NS_BYTES, BS as u32, [0x33; 16]),
            log: std::sync::Mutex::new(Vec::new()),
        }
    }
    /// What happened since the last call.
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
    fn note(&self, what: &'static str) {
        self.log.lock().unwrap().push(what);
    }
}

impl flashpool_nvmet::Namespace for DurabilityNs {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.inner.uuid()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), flashpool_nvmet::NsError> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), flashpool_nvmet::NsError> {
        self.note(if fua { "write+fua" } else { "write" });
        self.inner.write(lba, data, fua)
    }
    fn flush(&self) -> Result<(), flashpool_nvmet::NsError> {
        self.note("flush");
        self.inner.flush()
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), flashpool_nvmet::NsError> {
        self.inner.deallocate(lba, count)
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), flashpool_nvmet::NsError> {
        self.note("zeroes");
        self.inner.write_zeroes(lba, count)
    }
}

fn durability_server() -> (TestServer, Host, Host, std::sync::Arc<DurabilityNs>) {
    use flashpool_nvmet::{Subsystem, TargetConfig};
    let ns = std::sync::Arc::new(DurabilityNs::new());
    let s = Subsystem::new(NQN, "durability");
    s.add_namespace(1, ns.clone());
    let (srv, a, io) = one_io_queue(
        TargetConfig {
            subsystems: vec![s],
            ..Default::default()
        },
        false,
    );
    (srv, a, io, ns)
}

/// Write Zeroes of `blocks` at `lba`, with FUA when `fua`.
fn write_zeroes(io: &mut Host, lba: u64, blocks: u32, fua: bool) -> Status {
    let mut c = io.rw_cmd(0x08, 1, lba, blocks);
    if fua {
        c.set_cdw(12, c.cdw(12) | 1 << 30);
    }
    io.exec(c, &[], None).0
}

#[test]
fn volatile_write_cache_is_on_by_default_and_off_makes_every_write_durable() {
    let (_srv, mut a, mut io, ns) = durability_server();
    let (_, id) = a.identify(1, 0);
    assert_eq!(
        id[525] & 1,
        1,
        "Identify: a volatile write cache is present"
    );
    assert_eq!(
        a.admin_cmd(0x0A, 0, 0x06, 0, 0).0,
        Status::SUCCESS,
        "Get Features VWC"
    );
    assert_eq!(a.admin_cmd(0x0A, 0, 0x06, 0, 0).1, 1, "WCE on by default");
    // Cache on: writes complete cached; the host flushes.
    let d = pattern(30, 2 * BS);
    assert_eq!(io.write(1, 0, &d, true), Status::SUCCESS);
    assert_eq!(io.write(1, 8, &d, false), Status::SUCCESS);
    assert_eq!(write_zeroes(&mut io, 16, 1, false), Status::SUCCESS);
    assert_eq!(ns.take(), ["write", "write", "zeroes"]);

    // WCE off: no flush will come, so every write is written through.
    assert_eq!(a.admin_cmd(0x09, 0, 0x06, 0, 0).0, Status::SUCCESS);
    assert_eq!(a.admin_cmd(0x0A, 0, 0x06, 0, 0).1, 0, "WCE off");
    assert_eq!(io.write(1, 0, &d, true), Status::SUCCESS, "in-capsule");
    assert_eq!(io.write(1, 8, &d, false), Status::SUCCESS, "R2T");
    assert_eq!(write_zeroes(&mut io, 16, 1, false), Status::SUCCESS);
    assert_eq!(ns.take(), ["write+fua", "write+fua", "zeroes", "flush"]);
    assert_eq!(io.read(1, 8, 2), (Status::SUCCESS, d.clone()));

    // On again.
    assert_eq!(a.admin_cmd(0x09, 0, 0x06, 1, 0).0, Status::SUCCESS);
    assert_eq!(a.admin_cmd(0x0A, 0, 0x06, 0, 0).1, 1);
    assert_eq!(io.write(1, 0, &d, true), Status::SUCCESS);
    assert_eq!(ns.take(), ["write"]);
}

#[test]
fn write_zeroes_with_fua_is_durable_when_it_completes() {
    let (_srv, _a, mut io, ns) = durability_server();
    let d = pattern(31, BS);
    assert_eq!(io.write(1, 5, &d, true), Status::SUCCESS);
    assert_eq!(write_zeroes(&mut io, 5, 1, true), Status::SUCCESS);
    assert_eq!(ns.take(), ["write", "zeroes", "flush"]);
    assert_eq!(io.read(1, 5, 1), (Status::SUCCESS, vec![0; BS]));
    // A FUA write still says so (unchanged).
    let mut c = io.rw_cmd(0x01, 1, 6, 1);
    c.set_cdw(12, c.cdw(12) | 1 << 30);
    assert_eq!(io.exec(c, &d, None).0, Status::SUCCESS);
    assert_eq!(ns.take(), ["write+fua"]);
}

#[test]
fn over_mdts_is_invalid_field_and_past_the_end_is_lba_out_of_range() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let (_, id) = a.identify(1, 0);
    let mdts_bytes = (BS as u32) << id[77];
    let over = mdts_bytes / BS as u32 + 1;
    // A Read and an R2T Write one block over MDTS, SGL matching NLB: Invalid Field, no R2T.
    assert_eq!(io.read(1, 0, over).0, Status::INVALID_FIELD);
    let c = io.rw_cmd(0x01, 1, 0, over);
    let before = io.events.len();
    let (s, _, _) = io.exec(c, &[], Some(vec![3; over as usize * BS]));
    assert_eq!(s, Status::INVALID_FIELD);
    assert_eq!(&io.events[before..], b"C", "no R2T: no data moved");
    // Exactly MDTS is fine.
    assert_eq!(io.read(1, 0, over - 1).0, Status::SUCCESS);
    // Too large and past the end: the LBA range is checked first.
    let blocks = NS_BYTES / BS as u64;
    assert_eq!(io.read(1, blocks - 1, over).0, Status::LBA_RANGE);
    let c = io.rw_cmd(0x01, 1, blocks - 1, over);
    let (s, _, _) = io.exec(c, &[], Some(vec![3; over as usize * BS]));
    assert_eq!(s, Status::LBA_RANGE);
    // DSM and an admin command with more data than MDTS: Invalid Field, no R2T.
    let mut c = Command::new(0x09, io.cid(), 1);
    c.set_cdw(11, 1 << 2);
    c.set_sgl(0, mdts_bytes + 16, pdu::SGL_TRANSPORT);
    let before = io.events.len();
    io.submit(c, &[], None);
    assert_eq!(
        Status::from_field(io.completion().status),
        Status::INVALID_FIELD
    );
    assert_eq!(&io.events[before..], b"C");
    let (s, _, _) = a.admin_cmd(0x09, 0, 0x06, 1, mdts_bytes + 4096);
    assert_eq!(s, Status::INVALID_FIELD);
    assert_eq!(io.read(1, 0, 1).0, Status::SUCCESS, "still serving");
}

#[test]
fn icreq_asking_for_data_alignment_is_refused() {
    let target = Target::new(config());
    for hpda in [1u8, 31] {
        let (addr, t) = serve_one(target.clone());
        let mut h = Host::raw(addr);
        h.send_raw(
            &pdu::IcReq {
                pfv: 0,
                hpda,
                hdgst: false,
                ddgst: false,
                maxr2t: 0,
            }
            .encode(),
        );
        expect_termination(&mut h, pdu::FES_UNSUPPORTED_PARAM);
        assert!(matches!(
            t.join().unwrap(),
            End::Terminated(pdu::FES_UNSUPPORTED_PARAM)
        ));
    }
}

#[test]
fn a_second_icreq_is_a_pdu_sequence_error() {
    let target = Target::new(config());
    let (addr, t) = serve_one(target);
    let mut h = Host::new(addr, false, false);
    assert_eq!(h.prop_get(0, true).0, Status::CMD_SEQ_ERROR);
    h.send_raw(
        &pdu::IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }
        .encode(),
    );
    expect_termination(&mut h, pdu::FES_PDU_SEQ_ERR);
    assert!(matches!(
        t.join().unwrap(),
        End::Terminated(pdu::FES_PDU_SEQ_ERR)
    ));
}

#[test]
fn fused_commands_and_psdt_other_than_sgl_get_invalid_field() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let d = pattern(40, BS);
    // FUSE first / second, PSDT 00b (PRPs), 10b and 11b: refused, nothing written.
    for flags in [0x41u8, 0x42, 0x00, 0x80, 0xC0] {
        let mut c = io.rw_cmd(0x01, 1, 3, 1);
        c.0[1] = flags;
        assert_eq!(io.exec(c, &d, None).0, Status::INVALID_FIELD, "{flags:#x}");
        let mut c = io.rw_cmd(0x01, 1, 3, 1);
        c.0[1] = flags;
        let before = io.events.len();
        assert_eq!(
            io.exec(c, &[], Some(d.clone())).0,
            Status::INVALID_FIELD,
            "R2T {flags:#x}"
        );
        assert_eq!(&io.events[before..], b"C", "no R2T");
        let mut c = Command::new(0x06, a.cid(), 0);
        c.set_cdw(10, 1);
        c.set_sgl(0, 4096, pdu::SGL_TRANSPORT);
        c.0[1] = flags;
        assert_eq!(a.exec(c, &[], None).0, Status::INVALID_FIELD, "admin");
    }
    assert_eq!(io.read(1, 3, 1), (Status::SUCCESS, vec![0; BS]));
    // A Connect with PRPs is refused too (Linux's target checks every command).
    let mut h = Host::new(srv.addr, false, false);
    let mut c = h.connect_cmd(0, 31, 0);
    c.0[1] = 0;
    let d = Host::connect_data(NQN, HOSTNQN, 0xFFFF);
    assert_eq!(h.exec(c, &d, None).0, Status::INVALID_FIELD);
    assert_eq!(h.connect(NQN, 0, 0xFFFF, 0).0, Status::SUCCESS);
}

#[test]
fn in_capsule_data_at_an_offset() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    let (_, id) = a.identify(1, 0);
    assert_ne!(
        le32(&id, 536) & 1 << 20,
        0,
        "SGLS: offsets in in-capsule data"
    );
    let d = pattern(50, BS);
    let send = |io: &mut Host, offset: u64, len: u32, capsule: &[u8]| {
        let mut c = io.rw_cmd(0x01, 1, 9, 1);
        c.set_sgl(offset, len, pdu::SGL_IN_CAPSULE);
        let cid = c.cid();
        io.send_raw(&pdu::capsule_cmd(&c, capsule, false, false));
        let done = io.completion();
        assert_eq!(done.cid, cid);
        Status::from_field(done.status)
    };
    // The data 64 bytes into the capsule's data.
    let mut capsule = vec![0xEE; 64];
    capsule.extend_from_slice(&d);
    assert_eq!(send(&mut io, 64, BS as u32, &capsule), Status::SUCCESS);
    assert_eq!(io.read(1, 9, 1), (Status::SUCCESS, d.clone()));
    // An offset past the capsule's data: SGL Offset Invalid; a length that does not end
    // at the data's end: Data SGL Length Invalid. Neither writes.
    let other = pattern(51, BS);
    let mut capsule = vec![0; 16];
    capsule.extend_from_slice(&other);
    assert_eq!(
        send(&mut io, capsule.len() as u64 + 1, BS as u32, &capsule),
        Status::SGL_OFFSET_INVALID
    );
    assert_eq!(
        send(&mut io, u64::MAX, BS as u32, &capsule),
        Status::SGL_OFFSET_INVALID
    );
    assert_eq!(
        send(&mut io, 8, BS as u32, &capsule),
        Status::SGL_INVALID_DATA_LEN
    );
    assert_eq!(io.read(1, 9, 1), (Status::SUCCESS, d));
    // In-capsule data on a read (data goes to the host): Invalid Field, as Linux answers.
    let mut c = io.rw_cmd(0x02, 1, 9, 1);
    c.set_sgl(0, BS as u32, pdu::SGL_IN_CAPSULE);
    let cid = c.cid();
    io.send_raw(&pdu::capsule_cmd(&c, &other, false, false));
    let done = io.completion();
    assert_eq!(done.cid, cid);
    assert_eq!(Status::from_field(done.status), Status::INVALID_FIELD);
}
