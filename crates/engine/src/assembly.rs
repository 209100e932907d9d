//! Assembly: which of the drives presented to `Pool::open` are the pool's members.
//!
//! Membership comes from the drives themselves, never from names or order: every superblock
//! carries the pool's UUID, the member's index and the UUIDs of all members. Given any set of
//! candidate drives (the members, in any order, under any names, mixed with drives of other
//! pools, stale copies and devices that hold no pool at all), assembly picks the pool, puts each
//! member in its slot and sets every other drive aside with the reason, so the caller can say
//! exactly which device is what. Nothing is written here.
//!
//! Rules, in order:
//! 1. A drive with no readable, valid superblock is not a member ("no flashpool superblock").
//! 2. The pool is the one asked for, or else the pool most of the drives name (ties: the
//!    newest superblock generation). Drives of any other pool are set aside.
//! 3. The newest superblock of the pool (highest generation) is the pool's word on its
//!    geometry, its members and their states.
//! 4. A drive is member `i` only if its own member UUID is the one the newest superblock
//!    records for slot `i`, and it is fresh: at most one generation behind the newest (a crash
//!    while superblocks were being rewritten leaves exactly that), with the same geometry and
//!    member list, or the one-behind superblock of an interrupted drive add. A member that
//!    missed more superblock updates was out of the pool while it moved on (missing at an
//!    open, or an old copy): its data may be out of date, so it is set aside as stale, as md
//!    sets aside a non-fresh member. The same holds for a member the pool records as failed:
//!    its slot stays failed (down) until it is rebuilt or replaced.
//!    Builds before the one-round drive add went from the new drive's superblock (`g + 1`)
//!    straight to a checkpoint (`g + 2`), so a crash part-way left members at `g`, two
//!    behind. Such a member is fresh too, but only with proof that nothing but that add
//!    happened since its superblock: the new drive's own first superblock, present at
//!    `g + 1`, naming the newest member list, in which the member is active, the same
//!    checkpoint as the member's superblock (no checkpoint, so no open with the member
//!    missing, came between), and the member's member list plus the new drive alone.
//! 5. Two fresh drives for one slot: the newer generation wins, the other is a stale copy; the
//!    same generation is ambiguous and refused (remove the copy).
//! 6. A member smaller than the pool's drive size (truncated) is set aside as damaged.

use crate::drive::DriveRef;
use crate::error::{Error, Result};
use crate::format::superblock::{Superblock, MEMBER_ACTIVE, MEMBER_FAILED, MEMBER_RETIRED};
use crate::recovery::read_superblock;
use std::collections::BTreeMap;

/// A drive that was presented but is not taken as a member, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredDrive {
    /// The drive's identity (its path for file and block-device drives).
    pub identity: String,
    /// Why it is not a member, in words an operator can act on.
    pub reason: String,
    /// What it is, in one word: `foreign`, `stale`, `damaged`, `unknown` (no superblock),
    /// `duplicate`, `failed` (a failed member that missed updates) or `retired`.
    pub kind: &'static str,
    /// The member slot it claims, when it carries this pool's superblock.
    pub claims_member: Option<usize>,
}

/// One member slot of an assembled pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub index: usize,
    /// The member's UUID, as the newest superblock records it.
    pub uuid: [u8; 16],
    /// `MEMBER_ACTIVE`, `MEMBER_FAILED` or `MEMBER_RETIRED` by the newest superblock.
    pub state: u8,
    /// The drive found for it, if any.
    pub identity: Option<String>,
}

impl MemberView {
    /// True when the pool depends on this member and cannot use it (absent or failed).
    pub fn is_down(&self) -> bool {
        self.state != MEMBER_RETIRED && (self.identity.is_none() || self.state == MEMBER_FAILED)
    }

    /// The member's state in words: `active`, `failed`, `retired` or `missing`.
    pub fn state_name(&self) -> &'static str {
        match (self.state, self.identity.is_some()) {
            (MEMBER_RETIRED, _) => "retired",
            (MEMBER_FAILED, _) => "failed",
            (_, false) => "missing",
            _ => "active",
        }
    }
}

/// The members of one pool found among a set of drives, before anything is opened.
pub struct Assembly {
    /// The newest superblock of the pool.
    pub newest: Superblock,
    /// The drive found for each member slot, by index.
    pub slots: Vec<Option<DriveRef>>,
    /// Drives presented that are not members, with the reason.
    pub ignored: Vec<IgnoredDrive>,
    /// Members taken whose superblock was one generation behind the newest. A crash while
    /// the superblocks were written leaves such a member with all its data, but so does a
    /// copy of the drive taken during the last checkpoint interval and put back, which lacks
    /// the chunks written since: nothing at open tells the two apart, so a scrub checks them.
    pub behind: Vec<usize>,
}

/// A UUID in its usual text form.
pub fn uuid_text(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).to_string()
}

impl Assembly {
    /// Every member slot with the drive found for it.
    pub fn members(&self) -> Vec<MemberView> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, d)| MemberView {
                index: i,
                uuid: self.newest.members[i],
                state: self
                    .newest
                    .member_state
                    .get(i)
                    .copied()
                    .unwrap_or(MEMBER_ACTIVE),
                identity: d.as_ref().map(|d| d.info().identity),
            })
            .collect()
    }

    /// Members the pool depends on that it cannot use (absent or failed).
    pub fn down(&self) -> Vec<MemberView> {
        self.members().into_iter().filter(|m| m.is_down()).collect()
    }

    /// Parity chunks per stripe: how many members may be down.
    pub fn parity(&self) -> usize {
        self.newest.geometry.m as usize
    }

    /// Fails, listing what is present and what is missing, when more members are down than
    /// parity covers.
    pub fn check(&self) -> Result<()> {
        let down = self.down();
        if down.len() <= self.parity() {
            return Ok(());
        }
        Err(Error::Unavailable(self.refusal(&down)))
    }

    /// The refusal message: counts, then every member's state, then what was set aside.
    fn refusal(&self, down: &[MemberView]) -> String {
        let mut s = format!(
            "{} of {} members missing or failed, parity covers {}: nothing was written",
            down.len(),
            self.slots.len(),
            self.parity()
        );
        for m in self.members() {
            s.push_str(&format!(
                "; member {} ({}) {}{}",
                m.index,
                uuid_text(&m.uuid),
                m.state_name(),
                m.identity
                    .as_ref()
                    .map_or(String::new(), |p| format!(" at {p}"))
            ));
        }
        for i in &self.ignored {
            s.push_str(&format!("; not a member: {}: {}", i.identity, i.reason));
        }
        s
    }
}

/// The first superblock of the drive an interrupted drive add of an older build (new drive
/// at `g + 1`, then straight to a checkpoint at `g + 2`) was adding: the proof that members
/// left at `g` missed nothing but that add.
struct LegacyAdd {
    first: Superblock,
}

impl LegacyAdd {
    /// True when `sb`, member `i`'s superblock, is one the interrupted add left behind: one
    /// generation before the new drive's first superblock, the same checkpoint and geometry
    /// (but for the width and the drive count the add changed), its members those of the new
    /// superblock without the new drive, and member `i` active in the new superblock.
    fn names_as_left_behind(&self, i: usize, sb: &Superblock) -> bool {
        let p = &self.first;
        let mut before = p.geometry.clone();
        before.drive_count = sb.geometry.drive_count;
        before.k = sb.geometry.k;
        sb.generation + 1 == p.generation
            && sb.checkpoint == p.checkpoint
            && sb.geometry == before
            && sb.geometry.drive_count + 1 == p.geometry.drive_count
            && sb.members.len() + 1 == p.members.len()
            && p.members.starts_with(&sb.members)
            && i < sb.members.len()
            && p.member_state.get(i) == Some(&MEMBER_ACTIVE)
    }
}

/// Finds the proof of an older build's interrupted drive add (see [`LegacyAdd`]): a drive
/// whose superblock, one generation behind the newest, is the added member's own (the last
/// slot) and names the newest member list and geometry.
fn interrupted_legacy_add(ours: &[Found], newest: &Superblock) -> Option<LegacyAdd> {
    let last = newest.members.len().checked_sub(1)?;
    ours.iter()
        .map(|f| &f.sb)
        .find(|sb| {
            sb.generation + 1 == newest.generation
                && sb.drive_index as usize == last
                && sb.members == newest.members
                && sb.geometry == newest.geometry
                && newest.member_state.get(last) == Some(&MEMBER_ACTIVE)
        })
        .map(|first| LegacyAdd {
            first: first.clone(),
        })
}

/// A drive with the superblock read from it.
struct Found {
    sb: Superblock,
    drive: DriveRef,
}

/// Sorts `drives` into the members of one pool and the rest (see the module doc). Fails only
/// when no drive carries a superblock of the pool asked for (or of any pool), or when two
/// drives claim the same member at the same generation.
pub fn assemble(drives: Vec<DriveRef>, expect: Option<[u8; 16]>) -> Result<Assembly> {
    let mut ignored = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    for d in drives {
        match read_superblock(&d) {
            Ok(sb) => found.push(Found { sb, drive: d }),
            Err(e) => {
                let s = e.to_string();
                let reason = s.rsplit(": ").next().unwrap_or(&s).to_string();
                if !reasons.contains(&reason) {
                    reasons.push(reason.clone());
                }
                ignored.push(IgnoredDrive {
                    identity: d.info().identity,
                    reason: format!("no valid flashpool superblock ({reason})"),
                    kind: "unknown",
                    claims_member: None,
                });
            }
        }
    }
    let pool = match expect {
        Some(u) => u,
        None => {
            // The pool most drives name; ties go to the newest generation.
            let mut by_pool: BTreeMap<[u8; 16], (usize, u64)> = BTreeMap::new();
            for f in &found {
                let e = by_pool.entry(f.sb.pool_uuid).or_default();
                e.0 += 1;
                e.1 = e.1.max(f.sb.generation);
            }
            match by_pool.into_iter().max_by_key(|(_, v)| *v) {
                Some((u, _)) => u,
                None => {
                    return Err(Error::corrupt(format!(
                        "no valid flashpool superblock on any of {} drives: {}",
                        ignored.len(),
                        reasons.join("; ")
                    )))
                }
            }
        }
    };
    let (ours, theirs): (Vec<Found>, Vec<Found>) =
        found.into_iter().partition(|f| f.sb.pool_uuid == pool);
    for f in theirs {
        ignored.push(IgnoredDrive {
            identity: f.drive.info().identity,
            reason: format!(
                "belongs to another pool ({}, member {})",
                uuid_text(&f.sb.pool_uuid),
                f.sb.drive_index
            ),
            kind: "foreign",
            claims_member: None,
        });
    }
    let Some(newest) = ours
        .iter()
        .map(|f| &f.sb)
        .max_by_key(|s| s.generation)
        .cloned()
    else {
        let mut msg = format!("no drive of pool {} found", uuid_text(&pool));
        for i in &ignored {
            msg.push_str(&format!("; {}: {}", i.identity, i.reason));
        }
        return Err(Error::Unavailable(msg));
    };
    let geo = newest.geometry.clone();
    let legacy_add = interrupted_legacy_add(&ours, &newest);
    let mut slots: Vec<Option<(Superblock, DriveRef)>> = vec![None; geo.drive_count as usize];
    for f in ours {
        let who = f.drive.info().identity;
        let i = f.sb.drive_index as usize;
        let mut set_aside = |reason: String, kind: &'static str| {
            ignored.push(IgnoredDrive {
                identity: who.clone(),
                reason,
                kind,
                claims_member: Some(i),
            })
        };
        let own_uuid = f.sb.members.get(i).copied();
        if i >= slots.len() || own_uuid != Some(newest.members[i]) {
            set_aside(
                format!(
                    "a former member {i} of this pool that is no longer in it (generation {}, pool at {})",
                    f.sb.generation, newest.generation
                ),
                "stale",
            );
            continue;
        }
        // A superblock one generation behind that names a prefix of the members is stale from
        // an interrupted drive add: accepted, and rewritten by the checkpoint at the end.
        let stale_add = f.sb.generation + 1 == newest.generation
            && newest.members.starts_with(&f.sb.members)
            && f.sb.geometry.drive_count < geo.drive_count;
        let same = f.sb.geometry == geo && f.sb.members == newest.members;
        let fresh = (f.sb.generation + 1 >= newest.generation && (same || stale_add))
            || legacy_add.as_ref().is_some_and(|p| {
                newest.member_state.get(i) == Some(&MEMBER_ACTIVE)
                    && p.names_as_left_behind(i, &f.sb)
            });
        if newest.member_state.get(i) == Some(&MEMBER_RETIRED) {
            set_aside(
                format!("member {i} was retired (its data was rebuilt elsewhere); left alone"),
                "retired",
            );
            continue;
        }
        if !fresh && newest.member_state.get(i) == Some(&MEMBER_FAILED) {
            set_aside(
                format!(
                    "member {i}, failed (superblock generation {}, the pool is at {}): out of \
                     service until its data is rebuilt or it is replaced (`flashpool drive replace {i} PATH`)",
                    f.sb.generation, newest.generation
                ),
                "failed",
            );
            continue;
        }
        if !fresh {
            set_aside(
                format!(
                    "a stale copy of member {i}: superblock generation {}, the pool is at {}; \
                     its data may be out of date, so it is left alone (`flashpool drive replace {i} PATH` \
                     puts a drive back in its place)",
                    f.sb.generation, newest.generation
                ),
                "stale",
            );
            continue;
        }
        let size = f.drive.info().size;
        if size < geo.drive_size {
            set_aside(
                format!(
                    "member {i} is damaged: {size} bytes, the pool's drives have {} (truncated?)",
                    geo.drive_size
                ),
                "damaged",
            );
            continue;
        }
        match &slots[i] {
            Some((other, d)) if other.generation == f.sb.generation => {
                return Err(Error::corrupt(format!(
                    "{who} and {} both claim member {i} at generation {}: one is a copy; remove it",
                    d.info().identity,
                    other.generation
                )));
            }
            Some((other, d)) if other.generation > f.sb.generation => {
                set_aside(
                    format!(
                        "a stale copy of member {i} (generation {}; {} has {})",
                        f.sb.generation,
                        d.info().identity,
                        other.generation
                    ),
                    "duplicate",
                );
            }
            _ => {
                if let Some((old, d)) = slots[i].take() {
                    ignored.push(IgnoredDrive {
                        identity: d.info().identity,
                        reason: format!(
                            "a stale copy of member {i} (generation {}; {who} has {})",
                            old.generation, f.sb.generation
                        ),
                        kind: "duplicate",
                        claims_member: Some(i),
                    });
                }
                slots[i] = Some((f.sb, f.drive));
            }
        }
    }
    let behind = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.as_ref()
                .is_some_and(|(sb, _)| sb.generation < newest.generation)
        })
        .map(|(i, _)| i)
        .collect();
    Ok(Assembly {
        newest,
        slots: slots.into_iter().map(|s| s.map(|(_, d)| d)).collect(),
        ignored,
        behind,
    })
}
