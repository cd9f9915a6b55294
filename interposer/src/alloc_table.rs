//! One shard of the allocation table (`membership`): pointer -> charge, with its first entries
//! kept inline and the rest in a hash map. Pure: no locks, no FFI (the shard's lock is
//! `membership`'s).
//!
//! Why inline: every allocation and free of the process goes through one shard, chosen by the
//! pointer. A driver that hands out a fresh address for every allocation sends consecutive
//! allocations to shards picked at random, so each pair finds its shard's memory cold, and a hash
//! map reaches it through three cache lines in two places (its header, its control bytes, its
//! bucket). Here the keys share the shard lock's cache line, and an allocation and its free touch
//! that line and the one holding the value: no hashing, no pointer to follow, nothing that
//! tombstones or grows while at most `INLINE` allocations of the shard are live (64 shards: up
//! to 448 live allocations spread evenly). Past that, the hash map takes the rest.

use rustc_hash::FxHashMap;

/// Entries kept inline: with the shard's lock word in front, the keys fill one cache line.
pub const INLINE: usize = 7;

/// The key of an empty inline slot. A device pointer of 0 is never handed out; should one come,
/// it is kept in the map.
const EMPTY: u64 = 0;

/// A map from pointer to `V`: the first entries inline, the rest in `more`. A key is in one place
/// at most.
#[repr(C)]
pub struct Table<V> {
    keys: [u64; INLINE],
    vals: [V; INLINE],
    more: FxHashMap<u64, V>,
}

impl<V: Copy> Table<V> {
    /// An empty table; `blank` fills the unused value slots (never handed out).
    pub const fn new(blank: V) -> Table<V> {
        Table {
            keys: [EMPTY; INLINE],
            vals: [blank; INLINE],
            more: FxHashMap::with_hasher(rustc_hash::FxBuildHasher),
        }
    }

    #[inline]
    fn slot(&self, key: u64) -> Option<usize> {
        self.keys.iter().position(|&k| k == key)
    }

    /// Records `v` at `key`; returns the value it replaced.
    #[inline]
    pub fn insert(&mut self, key: u64, v: V) -> Option<V> {
        if key != EMPTY {
            if let Some(i) = self.slot(key) {
                return Some(std::mem::replace(&mut self.vals[i], v));
            }
            if (self.more.is_empty() || !self.more.contains_key(&key))
                && let Some(i) = self.slot(EMPTY)
            {
                self.keys[i] = key;
                self.vals[i] = v;
                return None;
            }
        }
        self.more.insert(key, v)
    }

    /// Forgets `key`, returning its value.
    #[inline]
    pub fn remove(&mut self, key: &u64) -> Option<V> {
        if *key != EMPTY
            && let Some(i) = self.slot(*key)
        {
            self.keys[i] = EMPTY;
            return Some(self.vals[i]);
        }
        if self.more.is_empty() {
            return None;
        }
        self.more.remove(key)
    }

    /// Keeps the entries for which `keep` says so.
    pub fn retain(&mut self, mut keep: impl FnMut(&u64, &mut V) -> bool) {
        for i in 0..INLINE {
            if self.keys[i] != EMPTY && !keep(&self.keys[i], &mut self.vals[i]) {
                self.keys[i] = EMPTY;
            }
        }
        self.more.retain(|k, v| keep(k, v));
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.keys = [EMPTY; INLINE];
        self.more.clear();
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.keys.iter().filter(|&&k| k != EMPTY).count() + self.more.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random operations on a table and on a std HashMap agree, through growth past the inline
    /// slots, fresh and reused keys, pointer 0, replacement, `retain` and `clear`.
    #[test]
    fn it_behaves_as_a_map() {
        let mut t = Table::new(0u64);
        let mut m: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200_000u64 {
            let r = rand();
            // Keys from a small set (reused) or fresh ones, and now and then 0.
            let key = match r % 8 {
                0 => 0,
                1 | 2 => 0x7f00_0000_0000 + (step << 21),
                _ => 0x7f00_0000_0000 + (((r >> 8) % 24) << 21),
            };
            match (r >> 40) % 10 {
                0..=4 => assert_eq!(t.insert(key, step), m.insert(key, step), "step {step}"),
                5..=8 => assert_eq!(t.remove(&key), m.remove(&key), "step {step}"),
                _ if step % 1000 == 9 => {
                    t.retain(|k, v| (k ^ *v) % 3 != 0);
                    m.retain(|k, v| (k ^ *v) % 3 != 0);
                }
                _ if step % 5000 == 19 => {
                    t.clear();
                    m.clear();
                }
                _ => {}
            }
            assert_eq!(t.len(), m.len(), "step {step}");
        }
        // Everything can be taken out again, once.
        let keys: Vec<u64> = m.keys().copied().collect();
        for k in keys {
            assert_eq!(t.remove(&k), m.remove(&k));
            assert_eq!(t.remove(&k), None);
        }
        assert!(t.is_empty());
    }

    #[test]
    fn a_key_in_the_map_is_replaced_there_not_doubled_inline() {
        let mut t = Table::new(0u32);
        for k in 1..=(INLINE as u64 + 3) {
            assert_eq!(t.insert(k, k as u32), None);
        }
        // Free inline slots, then insert again a key the map holds.
        assert_eq!(t.remove(&1), Some(1));
        assert_eq!(t.remove(&2), Some(2));
        let in_map = INLINE as u64 + 2;
        assert_eq!(t.insert(in_map, 99), Some(in_map as u32));
        assert_eq!(t.remove(&in_map), Some(99));
        assert_eq!(t.remove(&in_map), None);
        assert_eq!(t.len(), INLINE + 3 - 3);
    }
}
