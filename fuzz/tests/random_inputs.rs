//! The fuzz targets over seeded random inputs, on stable `cargo test` (no cargo-fuzz needed):
//! random bytes, the corpus files, and the corpus files with random mutations.
//! FUZZ_CASES=N sets the number of random inputs per target (default 2000).

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;

fn cases() -> usize {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(std::fs::read(e.path()).unwrap());
        }
    }
    out
}

fn drive(target: &str, f: fn(&[u8]), max_len: usize, n: usize) {
    let seeds = corpus(target);
    let mut rng = Rng::seed_from_u64(0xF022 ^ target.len() as u64);
    for s in &seeds {
        f(s);
    }
    for i in 0..n {
        let mut input = if !seeds.is_empty() && i % 2 == 0 {
            seeds[i % seeds.len()].clone()
        } else {
            let len = rng.random_range(0..=max_len);
            (0..len).map(|_| rng.random::<u8>()).collect()
        };
        for _ in 0..rng.random_range(0..8) {
            if input.is_empty() {
                break;
            }
            let at = rng.random_range(0..input.len());
            input[at] ^= 1 << rng.random_range(0..8);
        }
        if rng.random_range(0..4) == 0 {
            let cut = rng.random_range(0..=input.len());
            input.truncate(cut);
        }
        f(&input);
    }
}

#[test]
fn nbd_handshake() {
    drive("nbd_handshake", flashpool_fuzz::nbd_handshake, 512, cases());
}

#[test]
fn nbd_session() {
    drive(
        "nbd_session",
        flashpool_fuzz::nbd_session,
        1024,
        cases() / 4,
    );
}

/// The same inputs with the connection on a reactor (non-blocking, partial reads and writes
/// of a socket instead of a stream read whole): never a panic, never a connection left
/// open once the client is done.
#[test]
fn nbd_session_on_reactors() {
    drive(
        "nbd_session",
        |d| {
            flashpool_fuzz::nbd_session_on_reactors(d);
        },
        1024,
        cases() / 8,
    );
}

/// On a reactor, the seeds' sessions read back what they wrote, as on a connection thread.
#[test]
fn nbd_session_seeds_on_reactors_read_back_their_writes() {
    for (name, seed) in flashpool_fuzz::nbd_session_seeds() {
        let out = flashpool_fuzz::nbd_session_on_reactors(&seed);
        assert!(
            out.windows(9).any(|w| w == b"flashpool"),
            "seed {name}: the write was not read back on a reactor"
        );
    }
}

/// The nbd_session seeds reach transmission and read back what they wrote, so the fuzzer
/// starts past the handshake; the committed corpus holds them.
#[test]
fn nbd_session_seeds_reach_transmission() {
    let committed = corpus("nbd_session");
    for (name, seed) in flashpool_fuzz::nbd_session_seeds() {
        let out = flashpool_fuzz::nbd_session_output(&seed);
        assert!(
            out.windows(9).any(|w| w == b"flashpool"),
            "seed {name}: the write was not read back"
        );
        assert!(
            committed.contains(&seed),
            "seed {name} missing from corpus/nbd_session"
        );
    }
}

#[test]
fn nvme_session() {
    drive(
        "nvme_session",
        flashpool_fuzz::nvme_session,
        2048,
        cases() / 4,
    );
}

/// The nvme_session seeds get past ICReq and Connect and use the commands: the I/O queues read
/// back what they wrote, the admin queue gets the controller's Identify data, the discovery
/// queue the discovery log; the committed corpus holds them.
#[test]
fn nvme_session_seeds_reach_the_commands() {
    use flashpool_nvmet::pdu::{CommonHeader, Completion};
    let committed = corpus("nvme_session");
    for (name, seed) in flashpool_fuzz::nvme_session_seeds() {
        let out = flashpool_fuzz::nvme_session_output(&seed, 1 << 20);
        let want: &[u8] = match name {
            "admin" => flashpool_fuzz::NVME_NQN.as_bytes(),
            "discovery" => flashpool_fuzz::NVME_NQN.as_bytes(),
            _ => b"flashpool",
        };
        assert!(
            out.windows(want.len()).any(|w| w == want),
            "seed {name}: {:?} not in the output",
            String::from_utf8_lossy(want)
        );
        // Walk the PDUs: the last is the Disconnect's successful completion, and the I/O
        // seeds see exactly one failure (the read past the end).
        let (mut at, mut last, mut failures) = (128, None, 0);
        while at + 8 <= out.len() {
            let h = CommonHeader::parse(out[at..at + 8].try_into().unwrap());
            if h.pdu_type == 0x05 {
                let c = Completion::parse(&out[at + 8..at + 24]);
                if c.status >> 1 != 0 {
                    failures += 1;
                }
                last = Some(c);
            }
            assert_ne!(h.pdu_type, 0x03, "seed {name}: C2HTermReq");
            at += h.plen as usize;
        }
        assert_eq!(at, out.len(), "seed {name}: whole PDUs");
        let last = last.expect("completions");
        assert_eq!(last.status, 0, "seed {name}: Disconnect completes");
        if name.starts_with("io") {
            assert_eq!(failures, 1, "seed {name}: only the read past the end fails");
        }
        assert!(
            committed.contains(&seed),
            "seed {name} missing from corpus/nvme_session"
        );
    }
}

#[test]
fn nbd_request() {
    drive("nbd_request", flashpool_fuzz::nbd_request, 256, cases());
}

#[test]
fn decode_formats() {
    drive(
        "decode_formats",
        flashpool_fuzz::decode_formats,
        8192,
        cases(),
    );
}

#[test]
fn open_corrupt_pool() {
    drive(
        "open_corrupt_pool",
        flashpool_fuzz::open_corrupt_pool,
        200,
        cases() / 10,
    );
}

/// libFuzzer refuses a missing corpus directory and a fresh clone has only what git tracks,
/// so every target needs a committed, non-empty seed corpus.
#[test]
fn every_target_has_a_seed_corpus() {
    for t in [
        "nbd_handshake",
        "nbd_session",
        "nbd_request",
        "decode_formats",
        "open_corrupt_pool",
        "nvme_session",
    ] {
        assert!(!corpus(t).is_empty(), "fuzz/corpus/{t} is missing or empty");
    }
}

/// The decode_formats seeds are valid encodings (so the fuzzer starts past every magic and
/// CRC check), and so is every file of the committed corpus (a pool's UUID is random, so the
/// files are checked by decoding, not by comparing bytes).
#[test]
fn decode_formats_seeds_are_valid() {
    use flashpool_engine::format::{
        checkpoint::CheckpointImage, header::ChunkHeader, superblock::Superblock,
    };
    let decodes = |b: &[u8]| {
        Superblock::decode(b).is_ok()
            || ChunkHeader::decode(b).is_ok()
            || CheckpointImage::decode(b).is_ok()
    };
    let seeds = flashpool_fuzz::decode_formats_seeds();
    Superblock::decode(&seeds[0].1).expect("superblock seed");
    ChunkHeader::decode(&seeds[1].1).expect("chunk header seed");
    CheckpointImage::decode(&seeds[2].1).expect("checkpoint seed");
    let committed = corpus("decode_formats");
    assert!(committed.len() >= seeds.len());
    for c in &committed {
        assert!(
            decodes(c),
            "a file of corpus/decode_formats does not decode"
        );
    }
}
