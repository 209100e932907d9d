//! `flashpool drive remove`: a member is taken out only when the pool can do without it (the
//! live data fits the members left, with the rebuild reserve's room when it is kept, and
//! enough members stay to keep the pool writable through one more loss), so a remove is
//! refused before anything changes instead of failing half way; and one that still fails says
//! that the member is out of service and how to put it back.

use super::refuse;
use anyhow::{bail, Result};
use flashpool_engine::{Pool, RebuildStatus};

const MIB: u64 = 1 << 20;

/// Removes member `index`: checks the pool can do without it, fails it and rebuilds its data
/// onto the others (the member is then retired). `reserve`: the rebuild reserve is kept (a
/// server's default), so after the remove the live data must still fit the pool less one
/// more member.
pub fn remove_drive(pool: &Pool, index: usize, reserve: bool) -> Result<RebuildStatus> {
    let drives = pool.drives();
    let Some(target) = drives.get(index) else {
        bail!("no drive {index} (the pool has {} drives)", drives.len());
    };
    if target.state == "retired" {
        return refuse(format!(
            "member {index} is retired already: its data was rebuilt onto the others"
        ));
    }
    let info = pool.info();
    let m = info.m;
    let in_service = target.state == "active";
    let down = drives
        .iter()
        .filter(|d| d.state == "failed" || d.state == "missing")
        .count();
    if in_service && down + 1 > m {
        return refuse(format!(
            "removing member {index} would leave {} members down, parity covers {m}: data would \
             be unavailable; readmit (`flashpool drive readmit N`) or rebuild (`flashpool drive \
             rebuild`) the members down first",
            down + 1
        ));
    }
    let left = drives.iter().filter(|d| d.state == "active").count() - usize::from(in_service);
    if left < m + 2 {
        return refuse(format!(
            "removing member {index} would leave {left} members in service; with {m} parity \
             chunks per stripe a pool needs {} so that it stays writable with one more member \
             down: add a drive first (`flashpool drive add`) or put another in its place \
             (`flashpool drive replace {index} PATH`)",
            m + 2
        ));
    }
    let live = info.live_bytes;
    let fits = pool.room_with_members(left);
    if live > fits {
        return refuse(format!(
            "member {index} cannot be removed: the pool holds {} MiB of live data, and the {left} \
             members left have room for {} MiB; delete or trim data, or add a drive first",
            live.div_ceil(MIB),
            fits / MIB
        ));
    }
    if reserve {
        let limit = pool.room_with_members(left - 1);
        if live > limit {
            return refuse(format!(
                "member {index} cannot be removed: the pool holds {} MiB of live data, and on \
                 the {left} members left the rebuild reserve allows {} MiB (the most that can \
                 be rebuilt after losing one more member); delete or trim data, or add a drive \
                 first (a server run with --rebuild-reserve off keeps no such reserve)",
                live.div_ceil(MIB),
                limit / MIB
            ));
        }
    }
    pool.fail_drive(index)?;
    pool.rebuild().map_err(|e| {
        let now = pool.info();
        anyhow::Error::new(e).context(format!(
            "member {index} was not removed, and it is out of service now ({}) until it is \
             readmitted or its rebuild succeeds: `flashpool drive readmit {index}` puts it back \
             in service. Its rebuild onto the other members failed",
            crate::admin::protection(
                info.k,
                m,
                now.members_down,
                now.members_short,
                now.members_unlinked,
                now.healthy_drives,
            )
        ))
    })
}
