//! The self-timing meter's arithmetic: what one launch costs, learnt from launches the library
//! timed itself with CUDA events, where the driver gives no per-process utilisation samples (MIG
//! instances, some virtual GPUs) or the slice asked for it (`CUSLICE_CORE_METER=self-timing`).
//!
//! - **Which launches are timed.** A random one in `stride` of the process's metered launches,
//!   the stride chosen each period so that about `TIMED_PER_PERIOD` are timed ([`stride`]): every
//!   launch of long kernels, a sample of short ones.
//! - **What a timed launch measured.** The time from an event recorded on the launching stream
//!   just before the launch to one recorded just after: from when the work before it on the stream
//!   was done to when it was, so work queued ahead of it does not count. What the events cannot
//!   leave out is time the device gave other contexts meanwhile (contexts time-slice): a kernel
//!   that waited out another process's time slice, or was preempted by one, reads longer than it
//!   ran. Never shorter.
//! - **So a kind of launch costs the low end of what it measured.** Launches are told apart by
//!   kind (the function and its grid, or the graph); each kind keeps its last `WINDOW` timings, and
//!   costs the one an eighth of the way up from the shortest ([`LaunchCosts::typical`]). Readings
//!   stretched by other processes' work sit above it; a kind that really got longer moves it up
//!   within `WINDOW` timings.
//! - **What a launch costs on average** weighs each kind by how many of its launches were timed
//!   lately (each period's count decays by 1/8 at the next): the timed launches are a uniform
//!   sample of all of them, so that is each kind's part of the launches ([`LaunchCosts::mean`]).

/// Timings kept per kind of launch.
pub const WINDOW: usize = 32;
/// Kinds of launch remembered; a new one beyond that replaces the least launched.
pub const KINDS: usize = 64;
/// About how many launches the meter times each period.
pub const TIMED_PER_PERIOD: u64 = 10;
/// The longest stride: at least one launch in this many is timed.
pub const MAX_STRIDE: u32 = 1024;
const WEIGHT_DECAY: u64 = 8;
const WEIGHT_SCALE: u64 = 1024;

/// The stride for the next period, from the launches of the last one.
pub fn stride(launches: u64) -> u32 {
    (launches / TIMED_PER_PERIOD).clamp(1, MAX_STRIDE as u64) as u32
}

/// A kind of kernel launch: its function and grid (a graph launch: the executable graph).
pub fn launch_kind(function: usize, grid: [u32; 3], block: [u32; 3]) -> u64 {
    // FxHash's step: no need for more than telling a few dozen kinds apart.
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = function as u64;
    for w in grid.into_iter().chain(block) {
        h = (h.rotate_left(5) ^ w as u64).wrapping_mul(K);
    }
    h
}

#[derive(Debug, Clone)]
struct Kind {
    key: u64,
    recent: [u64; WINDOW],
    len: usize,
    next: usize,
    /// Timed launches lately, in 1/`WEIGHT_SCALE` units.
    weight: u64,
}

impl Kind {
    fn typical(&self) -> u64 {
        let mut v: Vec<u64> = self.recent[..self.len].to_vec();
        v.sort_unstable();
        v[self.len / 8]
    }
}

/// What each kind of launch costs, by this process's own timings.
#[derive(Debug, Clone, Default)]
pub struct LaunchCosts {
    kinds: Vec<Kind>,
}

impl LaunchCosts {
    /// One timed launch of kind `key`: `ns` from its start event to its end event.
    pub fn add(&mut self, key: u64, ns: u64) {
        let i = match self.kinds.iter().position(|k| k.key == key) {
            Some(i) => i,
            None => {
                let k = Kind {
                    key,
                    recent: [0; WINDOW],
                    len: 0,
                    next: 0,
                    weight: 0,
                };
                if self.kinds.len() < KINDS {
                    self.kinds.push(k);
                    self.kinds.len() - 1
                } else {
                    let i = (0..self.kinds.len())
                        .min_by_key(|&i| self.kinds[i].weight)
                        .unwrap_or(0);
                    self.kinds[i] = k;
                    i
                }
            }
        };
        let k = &mut self.kinds[i];
        k.recent[k.next] = ns;
        k.next = (k.next + 1) % WINDOW;
        k.len = (k.len + 1).min(WINDOW);
        k.weight += WEIGHT_SCALE;
    }

    /// The end of a period: each kind's count of timed launches decays.
    pub fn decay(&mut self) {
        for k in &mut self.kinds {
            k.weight -= k.weight.div_ceil(WEIGHT_DECAY);
        }
    }

    /// What a launch of kind `key` costs (None: none was timed).
    pub fn typical(&self, key: u64) -> Option<u64> {
        self.kinds.iter().find(|k| k.key == key).map(Kind::typical)
    }

    /// What one launch costs on average, each kind by its part of the launches lately (None:
    /// nothing timed lately).
    pub fn mean(&self) -> Option<u64> {
        let (mut ns, mut w) = (0u128, 0u128);
        for k in self.kinds.iter().filter(|k| k.weight > 0) {
            ns += k.typical() as u128 * k.weight as u128;
            w += k.weight as u128;
        }
        ns.checked_div(w).map(|c| c.min(u64::MAX as u128) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stride_times_about_ten_launches_a_period() {
        assert_eq!(stride(0), 1);
        assert_eq!(stride(15), 1);
        assert_eq!(stride(100), 10);
        assert_eq!(stride(5_000), 500);
        assert_eq!(stride(u64::MAX), MAX_STRIDE);
    }

    #[test]
    fn kinds_differ_by_function_and_grid() {
        let a = launch_kind(0x1000, [1, 1, 1], [128, 1, 1]);
        assert_eq!(a, launch_kind(0x1000, [1, 1, 1], [128, 1, 1]));
        assert_ne!(a, launch_kind(0x1008, [1, 1, 1], [128, 1, 1]));
        assert_ne!(a, launch_kind(0x1000, [2, 1, 1], [128, 1, 1]));
        assert_ne!(a, launch_kind(0x1000, [1, 1, 1], [64, 1, 1]));
    }

    #[test]
    fn timings_stretched_by_other_contexts_do_not_raise_the_cost() {
        let mut c = LaunchCosts::default();
        // A 1 ms kernel that waited out a neighbour's 2 ms time slice every other time.
        for i in 0..100 {
            c.add(7, if i % 2 == 0 { 1_000_000 } else { 3_000_000 });
        }
        assert_eq!(c.typical(7), Some(1_000_000));
        // A 10 ms kernel preempted by a neighbour most of the time, run whole once in a while.
        for i in 0..100 {
            c.add(
                8,
                if i % 6 == 0 {
                    10_000_000
                } else {
                    18_000_000 + i * 1000
                },
            );
        }
        assert_eq!(c.typical(8), Some(10_000_000));
    }

    #[test]
    fn a_kind_that_got_longer_costs_more_within_a_window() {
        let mut c = LaunchCosts::default();
        for _ in 0..WINDOW {
            c.add(1, 100_000);
        }
        for _ in 0..WINDOW {
            c.add(1, 400_000);
        }
        assert_eq!(c.typical(1), Some(400_000));
    }

    #[test]
    fn the_mean_weighs_kinds_by_their_launches_and_forgets_old_ones() {
        let mut c = LaunchCosts::default();
        assert_eq!(c.mean(), None);
        // Three timed launches of 10 us for each of 1 ms.
        for _ in 0..10 {
            c.add(1, 1_000_000);
            for _ in 0..3 {
                c.add(2, 10_000);
            }
        }
        assert_eq!(c.mean(), Some((1_000_000 + 3 * 10_000) / 4));
        // Only the 10 us kernel goes on: after 2 s (40 periods) the mix is its alone, but for
        // what is left of the other's count (0.5%, at 100 times the cost).
        for _ in 0..40 {
            c.decay();
            for _ in 0..3 {
                c.add(2, 10_000);
            }
        }
        let m = c.mean().unwrap();
        assert!((10_000..13_000).contains(&m), "{m}");
        for _ in 0..200 {
            c.decay();
        }
        assert_eq!(c.mean(), None);
    }

    #[test]
    fn a_new_kind_beyond_the_last_replaces_the_least_launched() {
        let mut c = LaunchCosts::default();
        for k in 0..KINDS as u64 {
            for _ in 0..=k {
                c.add(k, 1000 * (k + 1));
            }
        }
        c.add(999, 5);
        assert_eq!(c.typical(0), None);
        assert_eq!(c.typical(999), Some(5));
        assert_eq!(c.typical(1), Some(2000));
    }
}
