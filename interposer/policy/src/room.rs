//! Room on a device between a thaw and what other processes take beside it
//! (`CUSLICE_MEMORY_FREEZE_IDLE`). A frozen process's restore needs the room it had back all at
//! once, and on the driver a restore that meets OUT_OF_MEMORY leaves the process checkpointed
//! for good. So a thaw posts what it restores before it looks for room, an allocation posts
//! what it takes before it looks for thaws, and each counts what the other posted: of the two,
//! at least one sees the other (the node's board, `cuslice_state::board::Board::rooms`).
//!
//! Every figure is another slice's own word, so what it may cost a neighbour is bounded here:
//! - a reader believes one slice's thaw posts for at most `BELIEF_NS` of spent belief in a row
//!   (4 s of time: belief comes back at a quarter of the time passing), then not again until it
//!   is whole: a slice that posts a thaw it never does holds a neighbour's allocations back (and
//!   only while the device is short of both) for 4 s, then 4 s in every 16 at most;
//! - a thaw waits for allocations under way to end for at most `ALLOCATIONS_WAIT_NS`.

/// The longest a reader believes one slice's thaw posts in a row.
pub const BELIEF_NS: u64 = 3_000_000_000;
/// Belief comes back at one part in this many of the time passing.
pub const REFILL: u64 = 4;
/// The longest a thaw waits for allocations under way beside it to end before it looks at the
/// device's room (an honest allocation posts for the length of one driver call).
pub const ALLOCATIONS_WAIT_NS: u64 = 1_000_000_000;
/// One look spends at most this much belief, however long since the last (a reader that looks
/// rarely is not charged for the time between).
const LOOK_NS: u64 = 100_000_000;
/// A slice not seen thawing for this long is forgotten (its belief is whole again by then).
const FORGET_NS: u64 = 60_000_000_000;

/// Whether an allocation of `bytes` may go on a device with `free` bytes free while thaws of
/// `thawing` bytes are under way there: only if it leaves them their room.
pub fn may_allocate(free: u64, thawing: u64, bytes: u64) -> bool {
    free >= thawing.saturating_add(bytes)
}

/// Whether a thaw of `need` bytes may restore on a device with `free` bytes free while other
/// thaws of `thawing` bytes are under way there (as it posted before looking, they see its own).
pub fn may_restore(free: u64, thawing: u64, need: u64) -> bool {
    free >= thawing.saturating_add(need)
}

/// What one process believes of other slices' thaw posts.
#[derive(Debug, Default)]
pub struct Belief {
    slices: Vec<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    slice: u64,
    /// Belief left (ns).
    left: u64,
    /// When it was last looked at, and whether it was believed then.
    at: u64,
    believed: bool,
}

impl Belief {
    pub const fn new() -> Belief {
        Belief { slices: Vec::new() }
    }

    /// The bytes of thaws to count at `now`, of `posts` (each slice's id and the bytes it says it
    /// restores on the device).
    pub fn thawing(&mut self, posts: impl IntoIterator<Item = (u64, u64)>, now: u64) -> u64 {
        self.slices.retain(|b| now.saturating_sub(b.at) < FORGET_NS);
        let mut sum = 0u64;
        for (slice, bytes) in posts {
            if bytes == 0 {
                continue;
            }
            let b = match self.slices.iter().position(|b| b.slice == slice) {
                Some(i) => &mut self.slices[i],
                None => {
                    self.slices.push(Bucket {
                        slice,
                        left: BELIEF_NS,
                        at: now,
                        believed: false,
                    });
                    self.slices.last_mut().expect("just pushed")
                }
            };
            let elapsed = now.saturating_sub(b.at);
            b.left = b.left.saturating_add(elapsed / REFILL).min(BELIEF_NS);
            if b.believed {
                b.left = b.left.saturating_sub(elapsed.min(LOOK_NS));
            }
            b.at = now;
            // Spent, it is believed again only once whole: in bursts of 4 s in every 16 at most.
            b.believed = if b.believed {
                b.left > 0
            } else {
                b.left >= BELIEF_NS
            };
            if b.believed {
                sum = sum.saturating_add(bytes);
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const GIB: u64 = 1 << 30;

    #[test]
    fn an_allocation_leaves_a_thaw_its_room() {
        assert!(may_allocate(10 * GIB, 4 * GIB, 5 * GIB));
        assert!(!may_allocate(8 * GIB, 4 * GIB, 5 * GIB));
        assert!(may_allocate(5 * GIB, 0, 5 * GIB));
        assert!(!may_allocate(u64::MAX - 1, u64::MAX, 1), "no overflow");
        assert!(may_restore(9 * GIB, 4 * GIB, 5 * GIB));
        assert!(!may_restore(8 * GIB, 4 * GIB, 5 * GIB));
    }

    /// Looks every 10 ms from `from` for `for_ns` at one slice's post of `bytes`; how long it was
    /// believed.
    fn believed_for(b: &mut Belief, slice: u64, bytes: u64, from: u64, for_ns: u64) -> u64 {
        let mut t = from;
        let mut believed = 0;
        while t < from + for_ns {
            if b.thawing([(slice, bytes)], t) > 0 {
                believed += 10 * MS;
            }
            t += 10 * MS;
        }
        believed
    }

    #[test]
    fn an_honest_thaw_is_believed_while_it_lasts() {
        let mut b = Belief::default();
        let t = 1_000 * MS;
        assert_eq!(believed_for(&mut b, 7, GIB, t, 500 * MS), 500 * MS);
        // Its next thaw, a second later: believed whole again.
        assert_eq!(
            believed_for(&mut b, 7, GIB, t + 1_500 * MS, 800 * MS),
            800 * MS
        );
        // Nothing posted counts for nothing.
        assert_eq!(b.thawing([(7, 0), (8, 0)], t + 3_000 * MS), 0);
    }

    #[test]
    fn a_post_that_never_ends_is_believed_3_s_then_a_quarter_of_the_time() {
        let mut b = Belief::default();
        let t = 1_000 * MS;
        // A 3 s budget, refilled at a quarter of the time while spent: 4 s in a row.
        let first = believed_for(&mut b, 9, u64::MAX, t, 10_000 * MS);
        assert!((3_900 * MS..=4_100 * MS).contains(&first), "{first}");
        let later = believed_for(&mut b, 9, u64::MAX, t + 10_000 * MS, 60_000 * MS);
        // Then bursts of 4 s in every 16: a quarter of the time, give or take where the 60 s fall.
        let quarter = 60_000 * MS / REFILL;
        assert!(
            later <= quarter + 4_000 * MS && later >= quarter - 4_000 * MS,
            "{later} of 60 s"
        );
        // Each slice's belief is its own: another's honest thaw is believed meanwhile.
        let mut c = Belief::default();
        let _ = believed_for(&mut c, 9, GIB, t, 10_000 * MS);
        assert_eq!(c.thawing([(9, GIB)], t + 10_000 * MS), 0, "spent");
        assert_eq!(
            c.thawing([(9, GIB), (10, 2 * GIB)], t + 10_010 * MS),
            2 * GIB
        );
    }

    #[test]
    fn a_reader_that_looks_rarely_is_not_charged_for_the_time_between() {
        let mut b = Belief::default();
        let t = 1_000 * MS;
        for i in 0..20 {
            assert_eq!(b.thawing([(3, GIB)], t + i * 5_000 * MS), GIB, "look {i}");
        }
    }
}
