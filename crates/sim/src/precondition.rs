//! Preconditioning without timing: "fill" writes every logical page once in order; "steady"
//! then overwrites with the workload's address pattern until write amplification is steady
//! by the SNIA PTS rule (five rounds whose values stay within 20 % of their average and whose
//! least-squares line moves by at most 10 % of the average across the window).

use crate::config::{Precondition, Rw, SimConfig};
use crate::ftl::Ftl;
use crate::rng::SimRng;
use crate::stats::{waf, PreconditionInfo};
use crate::workload::AddressGen;

/// Rounds in the SNIA steady-state window.
pub const WINDOW: usize = 5;
/// Most rounds before giving up on steady state (then `steady` is false).
pub const MAX_ROUNDS: u32 = 60;

/// Whether the last [`WINDOW`] values meet the SNIA steady-state rule.
pub fn is_steady(values: &[f64]) -> bool {
    if values.len() < WINDOW {
        return false;
    }
    let w = &values[values.len() - WINDOW..];
    let avg = w.iter().sum::<f64>() / WINDOW as f64;
    let (min, max) = w
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    if max - min > 0.2 * avg {
        return false;
    }
    let xm = (WINDOW as f64 - 1.0) / 2.0;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, &y) in w.iter().enumerate() {
        sxy += (i as f64 - xm) * (y - avg);
        sxx += (i as f64 - xm) * (i as f64 - xm);
    }
    let slope = sxy / sxx;
    (slope * (WINDOW as f64 - 1.0)).abs() <= 0.1 * avg
}

/// Runs the configured preconditioning on `ftl`.
pub fn precondition(cfg: &SimConfig, ftl: &mut Ftl) -> PreconditionInfo {
    let mode = cfg.workload.precondition;
    let start = ftl.ctr;
    let mut info = PreconditionInfo {
        mode: format!("{mode:?}").to_lowercase(),
        host_pages_written: 0,
        rounds: 0,
        steady: false,
        waf_last_round: 0.0,
    };
    if mode == Precondition::None {
        return info;
    }
    let logical = ftl.logical_pages;
    for lpa in 0..logical {
        if !ftl.write_untimed(lpa) {
            break;
        }
    }
    if mode == Precondition::Steady {
        let addr = AddressGen::new(cfg);
        let mut rng = SimRng::new(cfg.workload.seed, 0x57EAD);
        let sequential = matches!(cfg.workload.rw, Rw::Write | Rw::Rw | Rw::Read);
        let ppi = addr.pages_per_io();
        let ios_per_round = (logical as u64 / 4 / ppi as u64).max(1);
        // At least 1.5 logical capacities of overwrites before the window may close.
        let min_rounds = 6;
        let mut history = Vec::new();
        let mut cursor = 0u64;
        while ftl.failed.is_none() {
            let before = ftl.ctr;
            for _ in 0..ios_per_round {
                let slot = if sequential {
                    let s = cursor;
                    cursor = (cursor + 1) % addr.slots();
                    s
                } else {
                    addr.random_slot(&mut rng)
                };
                let lpa = addr.slot_lpa(slot);
                for k in 0..ppi {
                    ftl.write_untimed(lpa + k);
                }
            }
            info.rounds += 1;
            let w = waf(&ftl.ctr.since(&before));
            history.push(w);
            info.waf_last_round = w;
            if info.rounds >= min_rounds && is_steady(&history) {
                info.steady = true;
                break;
            }
            if info.rounds >= MAX_ROUNDS {
                break;
            }
        }
    }
    info.host_pages_written = ftl.ctr.host_pages_written - start.host_pages_written;
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snia_rule() {
        assert!(is_steady(&[2.0, 2.0, 2.0, 2.0, 2.0]));
        assert!(!is_steady(&[1.0, 1.5, 2.0, 2.5, 3.0]));
        assert!(!is_steady(&[2.0, 2.0, 2.0, 2.0]));
        assert!(is_steady(&[9.0, 2.0, 2.05, 1.95, 2.0, 2.02]));
    }
}
