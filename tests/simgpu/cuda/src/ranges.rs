//! Free ranges of an address space (start -> length), handed out first-fit and merged back.

use std::collections::BTreeMap;

#[derive(Default)]
pub struct FreeRanges(BTreeMap<u64, u64>);

impl FreeRanges {
    pub fn new(start: u64, len: u64) -> FreeRanges {
        FreeRanges(BTreeMap::from([(start, len)]))
    }

    /// Removes `[at, at+len)` from the free range `(s, l)` that contains it.
    fn split(&mut self, s: u64, l: u64, at: u64, len: u64) {
        self.0.remove(&s);
        if at > s {
            self.0.insert(s, at - s);
        }
        if at + len < s + l {
            self.0.insert(at + len, s + l - at - len);
        }
    }

    /// The first free `len` bytes aligned to `align` (a power of two).
    pub fn take(&mut self, len: u64, align: u64) -> Option<u64> {
        let (s, l, at) = self.0.iter().find_map(|(&s, &l)| {
            let at = s.next_multiple_of(align);
            (at + len <= s + l).then_some((s, l, at))
        })?;
        self.split(s, l, at, len);
        Some(at)
    }

    /// The first free `len` bytes aligned to `align` (a power of two) at or after `from`, else
    /// the first from the start: next fit, as an allocator that moves on through its address
    /// space rather than handing back what was just freed.
    pub fn take_from(&mut self, from: u64, len: u64, align: u64) -> Option<u64> {
        use std::ops::Bound::{Excluded, Unbounded};
        let fits = |s: u64, l: u64, lo: u64| {
            let at = s.max(lo).checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= s + l).then_some((s, l, at))
        };
        let (s, l, at) = self
            .0
            .range(..=from)
            .next_back()
            .into_iter()
            .chain(self.0.range((Excluded(from), Unbounded)))
            .find_map(|(&s, &l)| fits(s, l, from))
            .or_else(|| self.0.iter().find_map(|(&s, &l)| fits(s, l, 0)))?;
        self.split(s, l, at, len);
        Some(at)
    }

    /// Takes exactly `[at, at+len)` if all of it is free.
    pub fn take_at(&mut self, at: u64, len: u64) -> bool {
        match self.0.range(..=at).next_back().map(|(&s, &l)| (s, l)) {
            Some((s, l)) if at + len <= s + l => {
                self.split(s, l, at, len);
                true
            }
            _ => false,
        }
    }

    /// Returns `[at, at+len)`, merging it with free neighbours.
    pub fn give(&mut self, at: u64, len: u64) {
        let (mut start, mut len) = (at, len);
        if let Some((&s, &l)) = self.0.range(..at).next_back()
            && s + l == at
        {
            self.0.remove(&s);
            start = s;
            len += l;
        }
        if let Some(l) = self.0.remove(&(start + len)) {
            len += l;
        }
        self.0.insert(start, len);
    }

    /// Whether everything from `start` for `len` bytes is free (one merged range).
    pub fn is_whole(&self, start: u64, len: u64) -> bool {
        self.0.len() == 1 && self.0.get(&start) == Some(&len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_give_and_merge() {
        let mut r = FreeRanges::new(0, 100);
        assert_eq!(r.take(10, 1), Some(0));
        assert_eq!(r.take(10, 16), Some(16));
        assert_eq!(r.take(90, 1), None);
        assert!(r.take_at(50, 10));
        assert!(!r.take_at(55, 10));
        r.give(0, 10);
        r.give(50, 10);
        r.give(16, 10);
        assert!(r.is_whole(0, 100));
    }

    #[test]
    fn next_fit_moves_on_and_wraps_around() {
        let mut r = FreeRanges::new(0, 100);
        assert_eq!(r.take_from(0, 10, 1), Some(0));
        r.give(0, 10);
        // What was just given back is not handed out again while there is room further on.
        assert_eq!(r.take_from(10, 10, 1), Some(10));
        r.give(10, 10);
        assert_eq!(r.take_from(20, 10, 16), Some(32));
        assert_eq!(r.take_from(42, 50, 1), Some(42));
        // Nothing fits past 92: back to the start.
        assert_eq!(r.take_from(92, 20, 1), Some(0));
        assert_eq!(r.take_from(20, 40, 1), None);
        r.give(0, 20);
        r.give(32, 10);
        r.give(42, 50);
        assert!(r.is_whole(0, 100));
    }
}
