//! Helpers shared by the integration tests: small device configs.

#![allow(dead_code)]

use flashpool_sim::config::{GeometryConfig, Precondition, Rw, SimConfig, Size};

/// A small device: `channels` x `dies` x `planes`, 32 blocks of 16 pages of 4 KiB.
pub fn small(channels: u32, dies: u32, planes: u32) -> SimConfig {
    let mut c = SimConfig {
        geometry: GeometryConfig {
            channels,
            dies_per_channel: dies,
            planes_per_die: planes,
            blocks_per_plane: 32,
            pages_per_block: 16,
            page_size: 4096,
        },
        ..SimConfig::default()
    };
    c.ftl.op_ratio = 0.2;
    c.workload.bs = Size::Bytes(4096);
    c.workload.rw = Rw::Randwrite;
    c.workload.precondition = Precondition::None;
    c.workload.iodepth = 1;
    c.workload.ios = 1000;
    c
}
