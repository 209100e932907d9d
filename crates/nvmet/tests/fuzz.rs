//! Random PDUs never panic the target: after a valid ICReq (and sometimes a
//! valid Connect and enable), each connection gets a stream of PDUs built from
//! valid headers with random mutations (types, lengths, offsets, flags,
//! command fields, data), then closes. The connection thread must end without
//! panicking. Deterministic: the seed is printed; NVMET_TEST_SEED replays it.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use flashpool_nvmet::connection::End;
use flashpool_nvmet::pdu::{self, Command};
use flashpool_nvmet::Target;

fn random_pdu(rng: &mut Rng) -> Vec<u8> {
    let opcodes = [
        0x00u8, 0x01, 0x02, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x18, 0x7F, 0x02, 0x01,
    ];
    let mut c = Command::new(
        opcodes[rng.below(opcodes.len() as u64) as usize],
        rng.below(8) as u16,
        rng.below(4) as u32,
    );
    for i in 10..16 {
        if rng.below(2) == 0 {
            c.set_cdw(
                i,
                rng.next() as u32 & [0xFF, 0xFFFF, u32::MAX][rng.below(3) as usize],
            );
        }
    }
    c.0[4] = if c.opcode() == 0x7F {
        [0u8, 1, 4, 8, 5][rng.below(5) as usize]
    } else {
        c.0[4]
    };
    let data_len = [0usize, 16, 1024, 4096, 8192][rng.below(5) as usize];
    let mut data = vec![0u8; data_len];
    rng.fill(&mut data);
    let id = if rng.below(2) == 0 {
        pdu::SGL_IN_CAPSULE
    } else {
        pdu::SGL_TRANSPORT
    };
    c.set_sgl(
        rng.below(2),
        if rng.below(4) == 0 {
            rng.next() as u32
        } else {
            data_len as u32
        },
        id,
    );
    let mut b = match rng.below(4) {
        0 => pdu::data_header(
            pdu::H2C_DATA,
            c.cid(),
            rng.below(3) as u16,
            rng.below(3) as u32 * 4096,
            data_len as u32,
            rng.below(2) == 0,
            false,
            false,
        ),
        _ => pdu::capsule_cmd(&c, &data, false, false),
    };
    if b[0] == pdu::H2C_DATA {
        b.extend_from_slice(&data);
    }
    // Mutations: none half the time, so valid commands reach the handlers too.
    let mutations = if rng.below(2) == 0 {
        0
    } else {
        1 + rng.below(3)
    };
    for _ in 0..mutations {
        let n = b.len() as u64;
        match rng.below(6) {
            0 => b[0] = rng.below(16) as u8,
            1 => b[2] = rng.next() as u8,
            2 => b[3] = rng.next() as u8,
            3 => pdu::put32(&mut b, 4, rng.below(2 * n + 16) as u32),
            4 => b[1] = rng.below(16) as u8,
            _ => {
                let i = rng.below(n) as usize;
                b[i] = rng.next() as u8;
            }
        }
    }
    b
}

#[test]
fn random_pdus_never_panic() {
    let seed = seed(0xF022_0017);
    let mut rng = Rng(seed);
    let target = Target::new(config());
    let (mut terminated, mut closed) = (0, 0);
    for round in 0..300 {
        let (addr, t) = serve_one(target.clone());
        let mut h = Host::new(addr, false, false);
        if rng.below(2) == 0 {
            let (s, _) = h.connect(NQN, 0, 0xFFFF, 0);
            assert!(s.is_success());
            h.prop_set(0x14, 1 | 6 << 16 | 4 << 20);
        }
        h.stream
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        // Generated before sending, so the random sequence never depends on
        // when the target closes the connection.
        let pdus: Vec<Vec<u8>> = (0..1 + rng.below(12))
            .map(|_| random_pdu(&mut rng))
            .collect();
        for b in pdus {
            if h.stream.write_all(&b).is_err() {
                break; // the target closed the connection
            }
        }
        drop(h);
        match t.join() {
            Ok(end) => {
                if round < 5 {
                    println!("round {round}: {end:?}");
                }
                match end {
                    End::Terminated(_) => terminated += 1,
                    _ => closed += 1,
                }
            }
            Err(_) => panic!("target panicked in round {round} (seed {seed})"),
        }
    }
    println!("{terminated} connections terminated by the target, {closed} ended otherwise");
    // Both outcomes must occur, or the generator is not exercising the target.
    assert!(
        terminated > 30 && closed > 10,
        "{terminated} terminated, {closed} closed"
    );
    // The target still serves a well-behaved host.
    let (addr, t) = serve_one(target.clone());
    let (mut h, _) = Host::admin(addr, NQN, false, false);
    assert!(h.identify(1, 0).0.is_success());
    drop(h);
    t.join().expect("no panic");
}
