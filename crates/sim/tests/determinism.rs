//! Determinism: the same config and seed give byte-identical JSON; another seed differs.

mod common;

use common::small;
use flashpool_sim::config::{Distribution, GcPolicy, Precondition, Rw, Suspension};

fn json(c: &flashpool_sim::SimConfig) -> String {
    serde_json::to_string(&flashpool_sim::run(c).unwrap()).unwrap()
}

#[test]
fn same_seed_same_json() {
    let mut c = small(2, 2, 2);
    c.workload.rw = Rw::Randrw;
    c.workload.iodepth = 8;
    c.workload.numjobs = 2;
    c.workload.ios = 20_000;
    c.workload.precondition = Precondition::Steady;
    c.workload.distribution = Distribution::Zipf;
    c.ftl.gc_policy = GcPolicy::DChoices;
    c.ftl.suspension = Suspension::ProgramErase;
    c.ftl.factory_bad_blocks_per_die = 2;
    let a = json(&c);
    assert_eq!(a, json(&c));
    c.workload.seed = 2;
    assert_ne!(a, json(&c));
}
