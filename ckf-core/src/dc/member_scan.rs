//! One member's blocks read in slices between other work (`GetMemberBlocks` on a large
//! state): the block map has no per-member block list (see `ownership`'s docs), so the
//! answer is a scan of the whole map, which a caller holding the state for other work cuts
//! into [`DcCkfConfig::slice_lines`] steps.
//!
//! Each block is read at some moment of the scan: a block the member held throughout is in the
//! answer, one it stored or dropped meanwhile may or may not be. A cuckoo walk between steps
//! may move a block the scan has not read behind its cursor, and a rebuild moves them all, so
//! either (or the member's tag changing: cleared, then storing again) starts the scan over;
//! after [`MAX_RESTARTS`] the rest is read in one step, so a busy map cannot keep it from
//! ending.
//!
//! [`DcCkfConfig::slice_lines`]: super::DcCkfConfig::slice_lines

use super::events::MemberId;
use super::ownership::Tag;
use super::state::DcCkfState;

/// Scans started over (see the module docs) before the rest is read in one step.
pub const MAX_RESTARTS: u32 = 2;

/// A member's blocks being read ([`DcCkfState::begin_member_scan`]).
#[derive(Debug)]
pub struct MemberScan {
    member: MemberId,
    /// The member's tag when the pass started.
    tag: Option<Tag>,
    /// Next block-map line to read.
    cursor: usize,
    /// The block map's walk moves and rebuilds when the pass started.
    moves: u64,
    rebuilds: u64,
    blocks: Vec<u64>,
    restarts: u32,
}

impl MemberScan {
    /// The member scanned.
    pub fn member(&self) -> MemberId {
        self.member
    }

    /// Passes started over so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }
}

impl DcCkfState {
    /// Starts reading `member`'s blocks in steps ([`member_scan_step`](Self::member_scan_step)).
    pub fn begin_member_scan(&self, member: MemberId) -> MemberScan {
        MemberScan {
            member,
            tag: self.members.tag(member),
            cursor: 0,
            moves: self.blocks.blocks.moves(),
            rebuilds: self.blocks.blocks.rebuild_stats().count,
            blocks: Vec::new(),
            restarts: 0,
        }
    }

    /// Reads the next [`slice_lines`](super::DcCkfConfig::slice_lines) block-map lines (all of
    /// them when that is 0, or after two restarts); the answer, in table order (sort it
    /// where that costs the state nothing), once the whole map is read (call it until then, not
    /// after). See the module docs.
    pub fn member_scan_step(&self, scan: &mut MemberScan) -> Option<Vec<u64>> {
        let blocks = &self.blocks.blocks;
        let tag = self.members.tag(scan.member);
        let (moves, rebuilds) = (blocks.moves(), blocks.rebuild_stats().count);
        if (tag, moves, rebuilds) != (scan.tag, scan.moves, scan.rebuilds) {
            scan.tag = tag;
            scan.moves = moves;
            scan.rebuilds = rebuilds;
            scan.cursor = 0;
            scan.blocks.clear();
            scan.restarts += 1;
        }
        let Some(tag) = tag else {
            return Some(Vec::new());
        };
        let lines = blocks.line_count();
        let slice = self.config.slice_lines as usize;
        let end = if slice == 0 || scan.restarts > MAX_RESTARTS {
            lines
        } else {
            scan.cursor.saturating_add(slice).min(lines)
        };
        let last = end >= lines;
        let found = &mut scan.blocks;
        blocks.for_each_edge_in(scan.cursor..end, last, |key, t| {
            if t == tag {
                found.push(key);
            }
        });
        scan.cursor = end;
        if !last {
            return None;
        }
        Some(std::mem::take(&mut scan.blocks))
    }
}

#[cfg(test)]
mod tests {
    use crate::addressing::TableFormat;
    use crate::dc::config::DcCkfConfig;
    use crate::dc::events::MemberId;
    use crate::dc::member_scan::MemberScan;
    use crate::dc::state::DcCkfState;

    fn hash(i: u64) -> u64 {
        (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// A reserved map (never rebuilt below 4,400 blocks), one-line slices.
    fn state() -> DcCkfState {
        DcCkfState::new(DcCkfConfig {
            reserve_blocks: 4_400,
            slice_lines: 1,
            ..DcCkfConfig::new(TableFormat::new(1 << 12, 7).unwrap())
        })
        .unwrap()
    }

    fn finish(s: &DcCkfState, scan: &mut MemberScan) -> Vec<u64> {
        loop {
            if let Some(answer) = s.member_scan_step(scan) {
                return answer;
            }
        }
    }

    #[test]
    fn a_quiet_scan_is_the_members_blocks() {
        let mut s = state();
        let a = MemberId::new(1, 0);
        s.store(a, &(0..300).map(hash).collect::<Vec<_>>());
        s.store(
            MemberId::new(2, 0),
            &(200..900).map(hash).collect::<Vec<_>>(),
        );
        let mut scan = s.begin_member_scan(a);
        assert_eq!(s.member_scan_step(&mut scan), None, "one line per step");
        let mut answer = finish(&s, &mut scan);
        answer.sort_unstable();
        assert_eq!(answer, s.member_blocks(a));
        assert_eq!(scan.restarts(), 0);
        let mut nobody = s.begin_member_scan(MemberId::new(9, 0));
        assert_eq!(s.member_scan_step(&mut nobody), Some(Vec::new()));
    }

    #[test]
    fn blocks_held_throughout_are_in_the_answer_whatever_moves_meanwhile() {
        let mut s = state();
        let a = MemberId::new(1, 0);
        let held: Vec<u64> = (0..1_000).map(hash).collect();
        s.store(a, &held);
        s.store(
            MemberId::new(2, 0),
            &(1_000..3_900).map(hash).collect::<Vec<_>>(),
        );
        let mut scan = s.begin_member_scan(a);
        for _ in 0..600 {
            assert_eq!(s.member_scan_step(&mut scan), None);
        }
        // Filling the map to ~90% between steps: walks move blocks across the cursor.
        let moves = s.blocks.blocks.moves();
        let mut answer = None;
        for i in 3_900..4_300 {
            s.store(MemberId::new(3, 0), &[hash(i)]);
            if answer.is_none() {
                answer = s.member_scan_step(&mut scan);
            }
        }
        assert!(s.blocks.blocks.moves() > moves, "the stores walked");
        let mut answer = answer.unwrap_or_else(|| finish(&s, &mut scan));
        answer.sort_unstable();
        assert!(scan.restarts() > 0);
        let mut expected = held;
        expected.sort_unstable();
        assert_eq!(answer, expected);
    }
}
