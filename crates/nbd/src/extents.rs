//! Turning what an export reports about allocation into what the wire may
//! carry: clip to the requested length, merge neighbours with equal status,
//! drop empty extents, cap the descriptor count, and honour `REQ_ONE`.

use crate::export::Extent;

/// Most descriptors one `BLOCK_STATUS` reply carries (the spec lets a server
/// return fewer than needed to cover the request).
pub const MAX_DESCRIPTORS: usize = 1 << 16;

/// Clip `extents` (consecutive from the request offset) to `len` bytes and
/// merge equal neighbours. The result is never empty when `len > 0`: if the
/// export reported nothing usable, one descriptor of status 0 (allocated,
/// contents unknown: always a safe answer) covers the request.
pub fn clip(extents: &[Extent], len: u64, max_descriptors: usize) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut covered = 0u64;
    for e in extents {
        if covered >= len {
            break;
        }
        if e.len == 0 {
            continue;
        }
        let take = e.len.min(len - covered);
        covered += take;
        match out.last_mut() {
            Some(last) if last.hole == e.hole && last.zero == e.zero => last.len += take,
            _ => {
                if out.len() == max_descriptors {
                    break;
                }
                out.push(Extent { len: take, ..*e });
            }
        }
    }
    if out.is_empty() && len > 0 {
        out.push(Extent::data(len));
    }
    out
}

/// Descriptors for a block status reply: `(length, flags)` pairs, each no
/// longer than `len` (so they fit the 32-bit lengths of `BLOCK_STATUS` when
/// the request was compact), at most one when `req_one`.
pub fn descriptors(extents: &[Extent], len: u64, req_one: bool) -> Vec<(u64, u32)> {
    let max = if req_one { 1 } else { MAX_DESCRIPTORS };
    clip(extents, len, max)
        .iter()
        .map(|e| (e.len, e.flags()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_and_merges() {
        let ex = [
            Extent::data(100),
            Extent::data(50),
            Extent::hole(0),
            Extent::hole(200),
            Extent::data(1000),
        ];
        let c = clip(&ex, 400, 100);
        assert_eq!(
            c,
            vec![Extent::data(150), Extent::hole(200), Extent::data(50)]
        );
        assert_eq!(c.iter().map(|e| e.len).sum::<u64>(), 400);
    }

    #[test]
    fn empty_report_is_safe() {
        assert_eq!(clip(&[], 512, 10), vec![Extent::data(512)]);
        assert_eq!(clip(&[Extent::hole(0)], 512, 10), vec![Extent::data(512)]);
    }

    #[test]
    fn short_report_is_allowed() {
        assert_eq!(clip(&[Extent::hole(10)], 512, 10), vec![Extent::hole(10)]);
    }

    #[test]
    fn req_one_and_cap() {
        let ex = [Extent::data(1), Extent::hole(1), Extent::data(1)];
        assert_eq!(descriptors(&ex, 3, true), vec![(1, 0)]);
        assert_eq!(descriptors(&ex, 3, false).len(), 3);
        assert_eq!(clip(&ex, 3, 2).len(), 2);
    }
}
