//! cuslice's own NVML queries, no wrappers: the device's and the processes' memory as the
//! driver reports it, whether a pid is still listed, utilisation samples and how the compute
//! meter reads them (`SampleCursor`), and the CUDA ordinal of an NVML device. It uses the real
//! entry points only (`real`), so that the membership's sweep, the context measurement and the
//! meter can ask NVML without depending on the NVML wrappers (`nvml`).

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_abi::*;
use cuslice_state::uuid_string;

use crate::real::{self, Lib};

pub type Nvdev = *mut c_void;

fn init() -> bool {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.load(Ordering::Acquire) {
        return true;
    }
    if !real::ensure(Lib::Nvml) {
        return false;
    }
    let Some(f) = real::nvmlInit_v2() else {
        return false;
    };
    // SAFETY: nvmlInit_v2 takes no arguments; NVML counts initialisations.
    let ok = unsafe { f() } == nvmlReturn_t::NVML_SUCCESS;
    DONE.store(ok, Ordering::Release);
    ok
}

thread_local! {
    /// Set while cuslice itself queries NVML: should the driver's NVML call one of its own
    /// exported functions (which the preload interposes), the wrapper answers untouched instead of
    /// re-entering the slice (whose table lock the query may hold).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside one of cuslice's own NVML queries (the NVML wrappers then
/// answer untouched).
pub(crate) fn in_own_query() -> bool {
    INTERNAL.with(|c| c.get())
}

/// Runs cuslice's own NVML query `f`.
fn internal<R>(f: impl FnOnce() -> R) -> R {
    let was = INTERNAL.with(|c| c.replace(true));
    let r = f();
    INTERNAL.with(|c| c.set(was));
    r
}

fn handle_by_uuid(uuid: &[u8; 16]) -> Option<Nvdev> {
    let f = real::nvmlDeviceGetHandleByUUID()?;
    let s = std::ffi::CString::new(uuid_string(uuid)).ok()?;
    let mut h: Nvdev = std::ptr::null_mut();
    // SAFETY: NUL-terminated UUID string and a valid out-pointer.
    (unsafe { f(s.as_ptr(), &mut h) } == nvmlReturn_t::NVML_SUCCESS).then_some(h)
}

/// The device's used memory as NVML reports it (all processes), for measuring hidden memory.
pub fn device_used(uuid: &[u8; 16]) -> Option<u64> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let f = real::nvmlDeviceGetMemoryInfo()?;
    let mut m = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: a device handle from NVML and a writable struct of the v1 layout.
    (internal(|| unsafe { f(h, &mut m) }) == nvmlReturn_t::NVML_SUCCESS).then_some(m.used)
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s
        .strip_prefix("GPU-")?
        .bytes()
        .filter(|b| *b != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(hex.get(2 * i..2 * i + 2)?).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// The UUID of an NVML device.
pub(crate) fn uuid_of(dev: Nvdev) -> Option<[u8; 16]> {
    let f = real::nvmlDeviceGetUUID()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: a writable buffer of the stated length.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) } != nvmlReturn_t::NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the buffer on success.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?;
    parse_uuid(s)
}

/// UUIDs of the devices in NVML's order.
fn nvml_uuids() -> Vec<[u8; 16]> {
    let (Some(count), Some(by_index)) = (
        real::nvmlDeviceGetCount_v2(),
        real::nvmlDeviceGetHandleByIndex_v2(),
    ) else {
        return Vec::new();
    };
    let mut n: c_uint = 0;
    // SAFETY: valid out-pointer.
    if unsafe { count(&mut n) } != nvmlReturn_t::NVML_SUCCESS {
        return Vec::new();
    }
    (0..n)
        .filter_map(|i| {
            let mut h: Nvdev = std::ptr::null_mut();
            // SAFETY: valid out-pointer; i below the count.
            (unsafe { by_index(i, &mut h) } == nvmlReturn_t::NVML_SUCCESS).then_some(h)
        })
        .filter_map(uuid_of)
        .collect()
}

/// The CUDA ordinal `uuid` has in this process, without asking CUDA: its place in
/// CUDA_VISIBLE_DEVICES (UUIDs, UUID prefixes or NVML indices), or its NVML index.
pub(crate) fn ordinal_of(uuid: &[u8; 16]) -> Option<u32> {
    let all = nvml_uuids();
    let visible: Vec<[u8; 16]> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v
            .split(',')
            .map(str::trim)
            .map_while(|e| {
                if let Ok(i) = e.parse::<usize>() {
                    all.get(i).copied()
                } else {
                    all.iter()
                        .copied()
                        .find(|u| uuid_string(u).starts_with(e) && e.starts_with("GPU-"))
                }
            })
            .collect(),
        Err(_) => all,
    };
    visible.iter().position(|u| u == uuid).map(|i| i as u32)
}

/// The whole per-process list, in a buffer grown until NVML has room for every entry.
pub(crate) fn fetch_all<T>(
    list: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut all: Vec<T> = Vec::new();
    loop {
        let mut n = all.capacity().max(16) as c_uint;
        all.reserve(n as usize);
        let r = list(&mut n, all.as_mut_ptr());
        if r == nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            all.reserve(n as usize + 16);
            continue;
        }
        if r != nvmlReturn_t::NVML_SUCCESS {
            return Err(r);
        }
        // SAFETY: NVML initialised `n` entries, within the capacity it was given.
        unsafe { all.set_len((n as usize).min(all.capacity())) };
        return Ok(all);
    }
}

/// Whether the device still lists `pid` among its compute processes: a process that has exited
/// keeps its memory until the driver has torn its contexts down, and NVML lists it until then.
/// None when NVML cannot say (no NVML, or the query failed).
pub fn lists_pid(uuid: &[u8; 16], pid: i32) -> Option<bool> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let listed =
        |pids: Result<Vec<u32>, nvmlReturn_t>| pids.ok().map(|p| p.contains(&(pid as u32)));
    internal(|| {
        if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() {
            // SAFETY: a device handle from NVML; `fetch_all` passes buffers of the room it names.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v2_t| unsafe { f(h, c, i) });
            listed(all.map(|v| v.iter().map(|p| p.pid).collect()))
        } else {
            let f = real::nvmlDeviceGetComputeRunningProcesses()?;
            // SAFETY: as above, with the v1 entry layout.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v1_t| unsafe { f(h, c, i) });
            listed(all.map(|v| v.iter().map(|p| p.pid).collect()))
        }
    })
}

/// The device's compute processes with the memory NVML says each holds: (pid, bytes). None when
/// NVML cannot say.
pub fn process_memory(uuid: &[u8; 16]) -> Option<Vec<(u32, u64)>> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    internal(|| {
        if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() {
            // SAFETY: a device handle from NVML; `fetch_all` passes buffers of the room it names.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v2_t| unsafe { f(h, c, i) });
            all.ok()
                .map(|v| v.iter().map(|p| (p.pid, p.usedGpuMemory)).collect())
        } else {
            let f = real::nvmlDeviceGetComputeRunningProcesses()?;
            // SAFETY: as above, with the v1 entry layout.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v1_t| unsafe { f(h, c, i) });
            all.ok()
                .map(|v| v.iter().map(|p| (p.pid, p.usedGpuMemory)).collect())
        }
    })
}

/// What a process's utilisation samples since the last reading say. A sample stamp covers one
/// of the driver's sample periods. Where the driver gave this process a sample of its own (one
/// of several at the stamp), or named this process while no other process is known to be
/// active, the sample is this process's device time (`ns`). Where it named one process alone
/// while others were active (what real drivers do: one process a period, with the device's
/// utilisation), the period is shared: what the device was busy (`shared_busy_ns`) is
/// apportioned by the meter (`compute.rs`), not taken for anyone's own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    /// Device time (ns) this process's own samples account for.
    pub ns: u64,
    /// Wall-clock time span (ns) the new samples cover, own and shared; 0 when there was none.
    pub span_ns: u64,
    /// Time stamp (wall-clock µs) of the newest of them; 0 when there was none.
    pub newest_us: u64,
    /// Of `span_ns`, the part in shared periods.
    pub shared_span_ns: u64,
    /// Device time (ns, any process's) in the shared periods.
    pub shared_busy_ns: u64,
}

/// Reads the device's per-process utilisation samples newer than `cursor.seen_us` as process
/// `pid` sees them (`crowded`: other processes are known to be active on the device), and moves
/// the cursor on. None when NVML cannot say.
pub fn own_utilisation(
    uuid: &[u8; 16],
    pid: u32,
    cursor: &mut SampleCursor,
    crowded: bool,
) -> Option<Used> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let f = real::nvmlDeviceGetProcessUtilization()?;
    let since = cursor.seen_us;
    let mut samples: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
    internal(|| {
        loop {
            let mut n = samples.capacity().max(32) as c_uint;
            samples.reserve(n as usize);
            // SAFETY: a device handle from NVML and a buffer with room for `n` samples.
            let r = unsafe { f(h, samples.as_mut_ptr(), &mut n, since) };
            match r {
                nvmlReturn_t::NVML_SUCCESS => {
                    // SAFETY: NVML wrote `n` samples, within the room it was given.
                    unsafe { samples.set_len((n as usize).min(samples.capacity())) };
                    return Some(());
                }
                nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE if n as usize > samples.capacity() => {
                    samples.reserve(n as usize + 32);
                }
                // NOT_FOUND: no samples since `since` (nothing ran).
                nvmlReturn_t::NVML_ERROR_NOT_FOUND => return Some(()),
                _ => return None,
            }
        }
    })?;
    let found: Vec<Sample> = samples
        .iter()
        .filter(|s| s.timeStamp > since)
        .map(|s| Sample {
            at_us: s.timeStamp,
            own: s.pid == pid,
            util: s.smUtil,
        })
        .collect();
    Some(cursor.take(&found, crowded))
}

/// The device's own utilisation (percent of the driver's last sample period with a kernel
/// running, any process). None when NVML cannot say.
pub fn device_utilisation(uuid: &[u8; 16]) -> Option<u32> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let f = real::nvmlDeviceGetUtilizationRates()?;
    let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
    // SAFETY: a device handle from NVML and a struct to write.
    let r = internal(|| unsafe { f(h, &mut u) });
    (r == nvmlReturn_t::NVML_SUCCESS).then_some(u.gpu.min(100))
}

/// One utilisation sample as the meter reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Time stamp (wall-clock µs).
    pub at_us: u64,
    /// Whether it names this process.
    pub own: bool,
    /// smUtil: whole percent of the period, rounded down.
    pub util: u32,
}

/// Where a process is in NVML's stream of utilisation samples, and how often the driver
/// samples. The driver stamps a sample every sample period; the period is the smallest gap seen
/// between two stamps of any process (at least the meter's own polling period).
///
/// Drivers differ in what a stamp holds:
/// - One sample per process that ran in the period, each with that process's own share (what
///   NVML documents). A stamp with several samples is read that way: this process's own sample
///   is its device time; a stamp without one, of others alone, says nothing of this process.
/// - One sample in all, naming one process (the one with the most busy time, as far as one
///   card's log shows) and giving the device's utilisation over the period, not that process's
///   own share (measured on an NVIDIA H200, driver 580). A stamp with one sample is read that
///   way: it is this process's own only while no other process is known to be active on the
///   device (then the device's busy time is its own); otherwise the period is shared.
///
/// A reading stands for the time back to this process's previous reading, but never more than
/// one sample period, and never time already settled by launch estimates.
#[derive(Debug, Clone, Copy)]
pub struct SampleCursor {
    /// Newest stamp (µs) of any process seen: the next query asks for newer ones.
    pub seen_us: u64,
    /// Newest stamp this process had a reading at.
    own_us: u64,
    /// Whether `own_us` is a stamp (not the time the cursor was made).
    own_seen: bool,
    /// Newest stamp of any process seen (0: none yet).
    stamp_us: u64,
    /// Smallest gap (µs) between two stamps; u64::MAX before two were seen.
    period_us: u64,
    /// The least time (µs) one sample is taken to cover.
    floor_us: u64,
    /// Device time up to this stamp (µs) was settled without samples (launch estimates): a
    /// sample covers no time before it, so nothing is charged twice.
    settled_us: u64,
}

impl SampleCursor {
    pub fn new(now_us: u64, floor_us: u64) -> SampleCursor {
        SampleCursor {
            seen_us: now_us,
            own_us: now_us,
            own_seen: false,
            stamp_us: 0,
            period_us: u64::MAX,
            floor_us,
            settled_us: now_us,
        }
    }

    /// Device time up to `until_us` (wall-clock) was settled by launch estimates: samples
    /// taken later cover only the time after it.
    pub fn settled(&mut self, until_us: u64) {
        self.settled_us = self.settled_us.max(until_us);
    }

    /// Whether the newest samples (of other processes) are more than one sample period newer
    /// than this process's last reading, or this process has had none for a second before
    /// `now_us` (wall-clock): it was idle since.
    pub fn idle(&self, now_us: u64) -> bool {
        let period = self.period_us.max(self.floor_us);
        self.seen_us.saturating_sub(self.own_us) > period
            || now_us.saturating_sub(self.own_us) > 1_000_000
    }

    /// Whether any reading of this process has been had.
    pub fn seen_own(&self) -> bool {
        self.own_seen
    }

    /// Takes the new samples (`crowded`: other processes are known to be active on the device;
    /// see `SampleCursor`).
    pub fn take(&mut self, samples: &[Sample], crowded: bool) -> Used {
        let mut used = Used::default();
        let mut stamps: Vec<u64> = samples.iter().map(|s| s.at_us).collect();
        stamps.sort_unstable();
        stamps.dedup();
        for &t in &stamps {
            if self.stamp_us != 0 && t > self.stamp_us {
                self.period_us = self.period_us.min(t - self.stamp_us);
            }
            self.stamp_us = self.stamp_us.max(t);
            if t <= self.own_us {
                continue;
            }
            let at: Vec<&Sample> = samples.iter().filter(|s| s.at_us == t).collect();
            let own = at.iter().find(|s| s.own).map(|s| s.util);
            // (own device time, shared device time)
            let (own_util, shared) = match (at.len(), own) {
                // Each process its own sample: this one's is its share; none, it did not run.
                (n, Some(util)) if n > 1 => (Some(util), None),
                (n, None) if n > 1 => continue,
                // One sample: the device's, this process's own while nobody else is active.
                (_, Some(util)) if !crowded => (Some(util), None),
                _ => (None, Some(at[0].util)),
            };
            let gap = t - self.own_us;
            // Back to this process's previous reading, but never before what was already
            // settled (a process that has just become visible to NVML, or visible again), and
            // never more than one sample period.
            let cover_ns = t
                .saturating_sub(self.settled_us)
                .min(gap)
                .min(self.period_us.max(self.floor_us))
                * 1000;
            let busy = cover_ns * half_pcts(own_util.or(shared).unwrap_or(0)) / 200;
            if shared.is_some() {
                used.shared_span_ns += cover_ns;
                used.shared_busy_ns += busy;
            } else {
                used.ns += busy;
            }
            used.span_ns += cover_ns;
            used.newest_us = t;
            self.own_us = t;
            self.own_seen = true;
        }
        if let Some(&newest) = stamps.last() {
            self.seen_us = self.seen_us.max(newest);
        }
        used
    }
}

/// smUtil is a whole percent, rounded down: a reading of k stands for [k, k+1), so k + 1/2 is
/// the unbiased figure (a slice would otherwise overrun by half a point). 100 is exact (work the
/// whole period). In half percents.
fn half_pcts(util: u32) -> u64 {
    match util {
        k if k >= 100 => 200,
        k => 2 * k as u64 + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(at_us: u64, util: u32) -> Sample {
        Sample {
            at_us,
            own: true,
            util,
        }
    }

    fn other(at_us: u64, util: u32) -> Sample {
        Sample {
            at_us,
            own: false,
            util,
        }
    }

    #[test]
    fn each_sample_covers_one_period_back_to_the_previous_one() {
        let mut c = SampleCursor::new(1_000_000, 50_000);
        // First sample: 100 ms after the cursor was made, at 40%, beside another process's.
        let u = c.take(&[own(1_100_000, 40), other(1_100_000, 20)], true);
        assert_eq!(u.span_ns, 100_000_000);
        assert_eq!(u.ns, 40_500_000);
        assert_eq!((u.newest_us, c.seen_us), (1_100_000, 1_100_000));
        // Next period, fully busy, alone: exact.
        let u = c.take(&[own(1_200_000, 100)], false);
        assert_eq!((u.ns, u.span_ns), (100_000_000, 100_000_000));
        // Idle for two periods (each process its own sample, none of ours), then 10%: the
        // sample covers one period.
        let idle = c.take(&[other(1_300_000, 5), other(1_300_000, 7)], true);
        assert_eq!(idle, Used::default());
        assert_eq!(c.seen_us, 1_300_000);
        let u = c.take(&[own(1_500_000, 10), other(1_500_000, 1)], true);
        assert_eq!((u.ns, u.span_ns), (10_500_000, 100_000_000));
    }

    #[test]
    fn one_sample_a_period_is_shared_while_others_are_active() {
        // A driver that names one process a period, with the device's utilisation.
        let mut c = SampleCursor::new(0, 50_000);
        // Alone: the device's figure is this process's own.
        let u = c.take(&[own(200_000, 30)], false);
        assert_eq!(
            (u.ns, u.span_ns, u.shared_span_ns),
            (61_000_000, 200_000_000, 0)
        );
        // Beside others: named or not, the period is shared, not this process's own; the
        // period is learnt from every process's stamps, not this process's alone.
        let u = c.take(&[other(400_000, 99), own(600_000, 100)], true);
        assert_eq!(u.ns, 0);
        assert_eq!((u.span_ns, u.shared_span_ns), (400_000_000, 400_000_000));
        assert_eq!(u.shared_busy_ns, 199_000_000 + 200_000_000);
        // A long quiet spell: the next stamp covers one period, not the whole gap.
        let u = c.take(&[other(5_000_000, 50)], true);
        assert_eq!(
            (u.shared_span_ns, u.shared_busy_ns),
            (200_000_000, 101_000_000)
        );
    }

    #[test]
    fn a_first_sample_covers_no_time_settled_by_estimates() {
        // Made at 1 s; NVML did not list the process for 6 s, and its launches up to 5 s were
        // settled by estimate. Its first sample, at 7 s, covers 5 s..7 s, not 1 s..7 s.
        let mut c = SampleCursor::new(1_000_000, 50_000);
        let u = c.take(&[other(4_000_000, 1), other(4_000_000, 2)], true);
        assert_eq!(u, Used::default());
        c.settled(5_000_000);
        let u = c.take(&[own(7_000_000, 50)], false);
        assert_eq!(u.span_ns, 2_000_000_000);
        assert_eq!(u.ns, 1_010_000_000);
        // An older settlement changes nothing.
        c.settled(3_000_000);
        let u = c.take(&[own(7_100_000, 100)], false);
        assert_eq!((u.ns, u.span_ns), (100_000_000, 100_000_000));
    }

    #[test]
    fn a_driver_sampling_faster_than_the_meter_polls_is_extrapolated() {
        // The driver samples every 10 ms, the meter reads every 50 ms and sees one in five.
        let mut c = SampleCursor::new(0, 50_000);
        let mut total = 0;
        for k in 1..=20u64 {
            let u = c.take(&[own(k * 50_000, 30)], false);
            total += u.ns;
        }
        assert_eq!(total, 1_000_000_000 * 305 / 1000);
        // Samples already seen are not counted twice.
        assert_eq!(c.take(&[own(1_000_000, 30)], false), Used::default());
    }
}
