//! Opaque handles (CUstream, CUevent, ...) for process-local objects: a tag, a generation and an
//! index packed into the pointer value, so a stale or foreign handle is recognised instead of
//! dereferenced. Tags keep the values clear of 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2).

use std::ffi::c_void;

pub struct Registry<T> {
    tag: u64,
    items: Vec<Option<(u32, T)>>,
    generations: Vec<u32>,
    free: Vec<u32>,
}

impl<T> Registry<T> {
    pub const fn new(tag: u8) -> Registry<T> {
        Registry {
            tag: tag as u64,
            items: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
        }
    }

    pub fn insert(&mut self, v: T) -> u64 {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.items.push(None);
                self.generations.push(0);
                (self.items.len() - 1) as u32
            }
        };
        let generation = (self.generations[i as usize] + 1) & 0xff_ffff;
        let generation = generation.max(1);
        self.generations[i as usize] = generation;
        self.items[i as usize] = Some((generation, v));
        self.tag << 56 | (generation as u64) << 32 | i as u64
    }

    /// Puts `v` back under handle `h`, which was removed, if its slot is free (handles of the
    /// slot's later generations stay stale); otherwise gives `v` back.
    pub fn reinsert(&mut self, h: u64, v: T) -> Result<(), T> {
        let (i, generation) = ((h & 0xffff_ffff) as usize, ((h >> 32) & 0xff_ffff) as u32);
        let free = matches!(self.items.get(i), Some(None));
        let pos = self.free.iter().position(|&f| f as usize == i);
        match pos {
            Some(p) if h >> 56 == self.tag && free && generation != 0 => {
                self.free.swap_remove(p);
                self.generations[i] = self.generations[i].max(generation);
                self.items[i] = Some((generation, v));
                Ok(())
            }
            _ => Err(v),
        }
    }

    fn index(&self, h: u64) -> Option<usize> {
        if h >> 56 != self.tag {
            return None;
        }
        let (i, generation) = ((h & 0xffff_ffff) as usize, ((h >> 32) & 0xff_ffff) as u32);
        match self.items.get(i) {
            Some(Some((g, _))) if *g == generation => Some(i),
            _ => None,
        }
    }

    pub fn get(&self, h: u64) -> Option<&T> {
        self.index(h)
            .and_then(|i| self.items[i].as_ref().map(|(_, v)| v))
    }

    pub fn get_mut(&mut self, h: u64) -> Option<&mut T> {
        self.index(h)
            .and_then(|i| self.items[i].as_mut().map(|(_, v)| v))
    }

    pub fn remove(&mut self, h: u64) -> Option<T> {
        let i = self.index(h)?;
        self.free.push(i as u32);
        self.items[i].take().map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.items.iter().enumerate().filter_map(move |(i, e)| {
            e.as_ref()
                .map(|(g, v)| (self.tag << 56 | (*g as u64) << 32 | i as u64, v))
        })
    }

    pub fn handles(&self) -> Vec<u64> {
        self.iter().map(|(h, _)| h).collect()
    }
}

pub fn to_ptr(h: u64) -> *mut c_void {
    h as usize as *mut c_void
}

pub fn from_ptr(p: *mut c_void) -> u64 {
    p as usize as u64
}

pub const TAG_CTX: u8 = 0x11;
pub const TAG_STREAM: u8 = 0x12;
pub const TAG_EVENT: u8 = 0x13;
pub const TAG_MODULE: u8 = 0x14;
pub const TAG_FUNC: u8 = 0x15;
pub const TAG_ARRAY: u8 = 0x16;
pub const TAG_MIPMAP: u8 = 0x17;
pub const TAG_POOL: u8 = 0x18;
pub const TAG_VMM: u8 = 0x19;
pub const TAG_GRAPH: u8 = 0x1a;
pub const TAG_EXEC: u8 = 0x1b;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_handle_comes_back_while_later_ones_stay_stale() {
        let mut r: Registry<&str> = Registry::new(TAG_CTX);
        let a = r.insert("first");
        r.remove(a);
        let b = r.insert("second");
        assert_ne!(a, b, "same slot, new generation");
        let v = r.remove(b).unwrap();
        assert_eq!(r.reinsert(a, v), Ok(()));
        assert_eq!(r.get(a), Some(&"second"));
        assert_eq!(r.get(b), None);
        let c = r.insert("third");
        assert_ne!(c, a);
        assert_ne!(c, b);
        assert_eq!(r.reinsert(a, "taken"), Err("taken"), "a's slot is in use");
        assert_eq!(
            r.reinsert((TAG_STREAM as u64) << 56, "x"),
            Err("x"),
            "another registry's"
        );
    }
}
