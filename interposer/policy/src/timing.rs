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
//! - **Kernels longer than a time slice beside busy neighbours.** Such a kernel is preempted
//!   whenever another context has work, so a slice whose kernels always run beside a busy one has
//!   no reading that is not stretched, and the low end of them is too. What the device's busy time
//!   says bounds it ([`Overlap`]): the slices' readings as read (each its time in flight) add up to
//!   more than the device was busy by the time two or more of them were in flight together, and the
//!   driver shares that time between the contexts in flight in turn. So a slice's device time is its
//!   time in flight less its part of that excess, and never less than its time in flight over the
//!   number of slices sharing the device. A long kind costs at most its mean reading by that
//!   ([`LaunchCosts::mean_within`]).

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
/// A kind of launch whose low-end timing is at least this long is a long one: preempted (so
/// stretched) whenever a neighbour has work, not only queued behind one. Time slices are 2 ms on
/// the simulator; readings below 3 ms are mostly whole.
pub const LONG_NS: u64 = 3_000_000;
/// The whole device (parts per million), as the figures here are in.
const FULL: u64 = crate::share::FULL as u64;
/// The window over which readings are set beside the device's busy time: what NVML's device
/// utilisation covers (the last second on the simulator; one sample period, 1/6 s to 1 s, on real
/// drivers).
pub const OVERLAP_WINDOW_NS: u64 = 1_000_000_000;

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

    /// The mean of its timings as read.
    fn read(&self) -> u64 {
        self.recent[..self.len].iter().sum::<u64>() / self.len.max(1) as u64
    }

    /// What it costs when a part `within` (ppm) of its time in flight is its own: its low-end
    /// timing, and for a long kind at most that part of its mean reading.
    fn cost_within(&self, within: u64) -> u64 {
        let typical = self.typical();
        if typical < LONG_NS || within >= FULL {
            return typical;
        }
        typical.min((self.read() as u128 * within as u128 / FULL as u128) as u64)
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
        self.weighted(|k| k.typical())
    }

    /// What one launch costs on average when a part `within` (ppm, from [`Overlap::within`]) of
    /// the time in flight is the slice's own: long kinds cost at most that part of their mean
    /// reading.
    pub fn mean_within(&self, within: u32) -> Option<u64> {
        self.weighted(|k| k.cost_within(within as u64))
    }

    /// What one launch was in flight on average, by the timings as read (stretched ones
    /// included).
    pub fn mean_read(&self) -> Option<u64> {
        self.weighted(Kind::read)
    }

    fn weighted(&self, each: impl Fn(&Kind) -> u64) -> Option<u64> {
        let (mut ns, mut w) = (0u128, 0u128);
        for k in self.kinds.iter().filter(|k| k.weight > 0) {
            ns += each(k) as u128 * k.weight as u128;
            w += k.weight as u128;
        }
        ns.checked_div(w).map(|c| c.min(u64::MAX as u128) as u64)
    }
}

/// How much of its time in flight a slice had the device to itself, from the last
/// `OVERLAP_WINDOW_NS` of its own and the other slices' time in flight beside the device's busy
/// time.
///
/// While n slices have work in flight the driver runs them in turn, each for a time slice: a
/// slice's timings each count all of that time, the device's busy time once. So the readings'
/// sum less the busy time is the time counted again, and with the slices in flight together for
/// equal parts of it, each slice's device time is its time in flight less that excess over the
/// number of slices. Exact for two slices; for more, exact while all are in flight together, and
/// never below a slice's time in flight over the number of slices (its turn while all are).
#[derive(Debug, Clone, Default)]
pub struct Overlap {
    /// (when, this slice's time in flight, the others', each ppm of the device over a period).
    recent: std::collections::VecDeque<(u64, u32, u32)>,
}

impl Overlap {
    /// One period's time in flight (ppm of the period): this slice's and the other slices'.
    pub fn note(&mut self, now: u64, own: u32, others: u32) {
        self.recent.push_back((now, own, others));
        while self
            .recent
            .front()
            .is_some_and(|&(at, _, _)| at.saturating_add(OVERLAP_WINDOW_NS) < now)
        {
            self.recent.pop_front();
        }
    }

    /// The part of this slice's time in flight (ppm) that was its own device time, the device
    /// busy `busy` ppm of the window and `slices` slices (this one included) active on it.
    pub fn within(&self, busy: u32, slices: usize) -> u32 {
        let n = self.recent.len() as u64;
        if n == 0 || slices < 2 {
            return FULL as u32;
        }
        let own = self.recent.iter().map(|r| r.1 as u64).sum::<u64>() / n;
        let others = self.recent.iter().map(|r| r.2 as u64).sum::<u64>() / n;
        if own == 0 {
            return FULL as u32;
        }
        let excess = (own + others).saturating_sub(busy as u64);
        let k = slices as u64;
        let mine = own.saturating_sub(excess / k).max(own.div_ceil(k));
        (mine * FULL / own).min(FULL) as u32
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

    #[test]
    fn a_long_kind_never_alone_costs_its_part_of_the_time_in_flight() {
        // Limits 30/70, 10 ms kernels: every kernel of the 30 ran beside the 70's work, so read
        // 20 ms; the 70's were in flight 100% of the time, the 30's 60%, the device busy 100%.
        let mut thirty = LaunchCosts::default();
        for i in 0..WINDOW as u64 {
            thirty.add(1, if i % 2 == 0 { 18_000_000 } else { 22_000_000 });
        }
        let mut o = Overlap::default();
        for p in 0..40 {
            o.note(p * 50_000_000, 600_000, 1_000_000);
        }
        let within = o.within(FULL as u32, 2);
        assert_eq!(within, 500_000);
        assert_eq!(thirty.mean(), Some(18_000_000));
        assert_eq!(thirty.mean_within(within), Some(10_000_000));
        // The 70's own view of the same second: a kind that ran alone often is its low end.
        let mut seventy = LaunchCosts::default();
        for i in 0..WINDOW as u64 {
            seventy.add(1, if i % 2 == 0 { 20_000_000 } else { 10_000_000 });
        }
        let mut o = Overlap::default();
        o.note(0, 1_000_000, 600_000);
        let within = o.within(FULL as u32, 2);
        assert_eq!(within, 700_000);
        assert_eq!(seventy.mean_within(within), Some(10_000_000));
    }

    #[test]
    fn without_overlap_or_with_short_kinds_nothing_changes() {
        let mut c = LaunchCosts::default();
        for i in 0..WINDOW as u64 {
            c.add(1, if i % 2 == 0 { 100_000 } else { 2_100_000 });
            c.add(2, 12_000_000);
        }
        // Alone, or the readings no more than the device's busy time: all its own.
        let mut o = Overlap::default();
        o.note(0, 500_000, 0);
        assert_eq!(o.within(500_000, 1), FULL as u32);
        o.note(1, 500_000, 400_000);
        assert_eq!(o.within(900_000, 2), FULL as u32);
        assert_eq!(c.mean_within(FULL as u32), c.mean());
        // Short kinds keep their low end whatever the overlap; long ones are cut.
        assert_eq!(c.mean_within(500_000), Some((100_000 + 6_000_000) / 2));
    }

    #[test]
    fn a_slice_keeps_at_least_its_turn_and_old_periods_leave_the_window() {
        let mut o = Overlap::default();
        // Others claiming far more than the device did cannot take this slice's time in flight
        // below its turn among three.
        o.note(0, 900_000, 2_000_000);
        assert_eq!(o.within(900_000, 3), 333_333);
        // A second later only the new period counts.
        o.note(OVERLAP_WINDOW_NS + 1, 400_000, 0);
        assert_eq!(o.within(400_000, 3), FULL as u32);
    }
}
