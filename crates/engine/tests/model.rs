//! Model-based property test (a proptest state machine): random sequences of write (aligned,
//! unaligned, FUA), read, trim, write-zeroes, flush and crash-and-reopen, on memory drives
//! with a volatile write cache and on file drives, for m = 0, 1 and 2, against a reference
//! model that knows which block contents a crash may leave.
//!
//! The seed is fixed (FLASHPOOL_SEED overrides it) and printed, so a failure reproduces.

mod common;

use common::*;
use flashpool_engine::drive::{CrashFate, DriveRef, MemDrive};
use flashpool_engine::Pool;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

const BLOCKS: u64 = 192;
const VOL: u64 = BLOCKS * 4096;

#[derive(Clone, Debug)]
enum Backend {
    Mem,
    File,
}

#[derive(Clone, Debug)]
struct Setup {
    k: usize,
    m: usize,
    backend: Backend,
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        offset: u64,
        len: u64,
        fua: bool,
        stamp: u64,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    Flush,
    Crash {
        seed: u64,
    },
}

struct RefMachine;

impl ReferenceStateMachine for RefMachine {
    type State = Setup;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Setup> {
        prop_oneof![
            Just(Setup {
                k: 4,
                m: 0,
                backend: Backend::Mem
            }),
            Just(Setup {
                k: 4,
                m: 1,
                backend: Backend::Mem
            }),
            Just(Setup {
                k: 3,
                m: 2,
                backend: Backend::Mem
            }),
            Just(Setup {
                k: 4,
                m: 1,
                backend: Backend::File
            }),
            Just(Setup {
                k: 2,
                m: 2,
                backend: Backend::File
            }),
        ]
        .boxed()
    }

    fn transitions(_: &Setup) -> BoxedStrategy<Op> {
        let range = (0..VOL).prop_flat_map(|o| (Just(o), 1..=(VOL - o).min(40_000)));
        let aligned = (0..BLOCKS).prop_flat_map(|b| {
            (
                Just(b * 4096),
                (1..=(BLOCKS - b).min(24)).prop_map(|n| n * 4096),
            )
        });
        prop_oneof![
            6 => (aligned, any::<bool>(), any::<u64>()).prop_map(|((offset, len), fua, stamp)| Op::Write { offset, len, fua: fua && stamp % 8 == 0, stamp }),
            3 => (range.clone(), any::<u64>()).prop_map(|((offset, len), stamp)| Op::Write { offset, len, fua: false, stamp }),
            3 => range.clone().prop_map(|(offset, len)| Op::Read { offset, len }),
            1 => range.clone().prop_map(|(offset, len)| Op::Trim { offset, len }),
            1 => range.prop_map(|(offset, len)| Op::WriteZeroes { offset, len }),
            1 => Just(Op::Flush),
            1 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
        ]
        .boxed()
    }

    fn apply(state: Setup, _: &Op) -> Setup {
        state
    }
}

/// The reference: each block's current contents, and every content it may hold after a
/// crash (its durable contents and everything written since the last flush).
struct Model {
    current: Vec<Vec<u8>>,
    candidates: Vec<Vec<Vec<u8>>>,
}

impl Model {
    fn new() -> Self {
        Model {
            current: vec![vec![0; 4096]; BLOCKS as usize],
            candidates: vec![vec![vec![0; 4096]]; BLOCKS as usize],
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let mut pos = offset;
        let mut done = 0;
        while done < data.len() {
            let b = (pos / 4096) as usize;
            let at = (pos % 4096) as usize;
            let n = (4096 - at).min(data.len() - done);
            self.current[b][at..at + n].copy_from_slice(&data[done..done + n]);
            let c = self.current[b].clone();
            self.candidates[b].push(c);
            done += n;
            pos += n as u64;
        }
    }

    fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(len as usize);
        for p in offset..offset + len {
            out.push(self.current[(p / 4096) as usize][(p % 4096) as usize]);
        }
        out
    }

    fn flush(&mut self) {
        for (c, cur) in self.candidates.iter_mut().zip(&self.current) {
            *c = vec![cur.clone()];
        }
    }
}

struct Sut {
    setup: Setup,
    pool: Option<Pool>,
    mem: Vec<Arc<MemDrive>>,
    dir: tempfile::TempDir,
    model: Model,
}

/// Half the writes are random (incompressible), half text-like (compressible), so the
/// model covers packed and raw blocks side by side.
fn payload(stamp: u64, len: u64) -> Vec<u8> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(stamp);
    if stamp.is_multiple_of(2) {
        let words = [&b"lba="[..], b" seg=", b" INFO ", b"flashpool "];
        (0..len)
            .map(|i| {
                words[(i / 7 % 4) as usize][(i % 4) as usize % words[(i / 7 % 4) as usize].len()]
                    ^ (stamp as u8 & 1)
            })
            .collect()
    } else {
        (0..len).map(|_| rng.random::<u8>()).collect()
    }
}

impl Sut {
    fn drives(&self) -> Vec<DriveRef> {
        match self.setup.backend {
            Backend::Mem => as_refs(&self.mem),
            Backend::File => reopen_files(self.dir.path(), 5),
        }
    }

    fn vol(&self) -> flashpool_engine::Volume {
        self.pool.as_ref().unwrap().volume("v").unwrap()
    }
}

struct PoolMachine;

impl StateMachineTest for PoolMachine {
    type SystemUnderTest = Sut;
    type Reference = RefMachine;

    fn init_test(setup: &Setup) -> Sut {
        let dir = tempfile::tempdir().unwrap();
        let mem = mem_drives(5, true);
        let drives = match setup.backend {
            Backend::Mem => as_refs(&mem),
            Backend::File => file_drives(dir.path(), 5),
        };
        let pool = Pool::create(drives, &small_config(setup.k, setup.m)).unwrap();
        pool.create_volume("v", VOL).unwrap();
        Sut {
            setup: setup.clone(),
            pool: Some(pool),
            mem,
            dir,
            model: Model::new(),
        }
    }

    fn apply(mut s: Sut, _: &Setup, op: Op) -> Sut {
        match op {
            Op::Write {
                offset,
                len,
                fua,
                stamp,
            } => {
                let data = payload(stamp, len);
                if fua {
                    s.vol().write_fua(offset, &data).unwrap();
                } else {
                    s.vol().write(offset, &data).unwrap();
                }
                s.model.write(offset, &data);
                if fua {
                    s.model.flush();
                }
            }
            Op::Read { offset, len } => {
                let mut b = vec![0u8; len as usize];
                s.vol().read(offset, &mut b).unwrap();
                assert!(
                    b == s.model.read(offset, len),
                    "read [{offset}, +{len}) differs from the model"
                );
            }
            Op::Trim { offset, len } | Op::WriteZeroes { offset, len } => {
                if matches!(op, Op::Trim { .. }) {
                    s.vol().trim(offset, len).unwrap();
                } else {
                    s.vol().write_zeroes(offset, len).unwrap();
                }
                s.model.write(offset, &vec![0u8; len as usize]);
            }
            Op::Flush => {
                s.pool.as_ref().unwrap().flush().unwrap();
                s.model.flush();
            }
            Op::Crash { seed } => {
                drop(s.pool.take());
                if let Backend::Mem = s.setup.backend {
                    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
                    s.mem = s
                        .mem
                        .iter()
                        .map(|d| {
                            Arc::new(d.crash(|_, sectors| match rng.random_range(0..4) {
                                0 => CrashFate::Lost,
                                1 => CrashFate::Torn(rng.random_range(0..sectors.max(1))),
                                _ => CrashFate::Persisted,
                            }))
                        })
                        .collect();
                }
                s.pool = Some(Pool::open(s.drives()).unwrap());
                let vol = s.vol();
                let mut b = vec![0u8; 4096];
                for lba in 0..BLOCKS as usize {
                    vol.read(lba as u64 * 4096, &mut b).unwrap();
                    assert!(
                        s.model.candidates[lba].contains(&b),
                        "after crash, block {lba} holds neither its flushed nor any later contents"
                    );
                    s.model.current[lba] = b.clone();
                }
                // Recovery checkpoints what it found: that is now durable.
                s.model.flush();
            }
        }
        s
    }
}

fn seed() -> u64 {
    test_seed("model test", 20261121)
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: std::env::var("FLASHPOOL_MODEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(48),
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: None,
        .. Config::default()
    })]
    #[test]
    fn pool_matches_reference_model(sequential 1..60 => PoolMachine);
}
