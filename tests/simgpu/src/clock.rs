//! Time as the simulated engine sees it: CLOCK_MONOTONIC nanoseconds, the same in every process
//! and container of the machine.

pub const MS: u64 = 1_000_000;
pub const US: u64 = 1_000;

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall-clock microseconds since the epoch (NVML's "CPU timestamp").
pub fn wall_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Converts a monotonic timestamp to NVML's wall-clock microseconds.
pub fn mono_to_wall_us(mono_ns: u64) -> u64 {
    let (mono_now, wall_now) = (now_ns(), wall_us());
    (wall_now as i128 - (mono_now as i128 - mono_ns as i128) / 1_000).max(0) as u64
}

pub fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}

/// How late a wait for the device may wake. A real driver's synchronising call (a stream's or a
/// context's, or an event's without `CU_EVENT_BLOCKING_SYNC`) spins or yields by default and
/// returns within microseconds of the work's end, and one that blocks in the kernel (a
/// blocking-sync event's) is woken by the device's interrupt; the simulator sleeps, but wakes as
/// close to on time. With Linux's default timer slack (50 us) a sleep ends up to 50 us late
/// unless another timer fires meanwhile: a loop that synchronised its stream every 2 ms ran 1.5
/// points of the device slower alone than beside another process whose threads poll, and a loop
/// of 10 us kernels waiting on blocking-sync events 6 to 30% faster in its turns beside one (the
/// slower the host, the more), and that difference, not the device, decided a slice's
/// throughput against its rate alone.
const WAKE_SLACK_NS: libc::c_ulong = 1_000;

/// Sleeps `ns` for a wait on the device: the calling thread's timer slack is `WAKE_SLACK_NS` for
/// the sleep, and the application's own setting is put back after.
pub fn sleep_ns_on_time(ns: u64) {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the calling thread's slack.
    let was = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    let tighter = was > WAKE_SLACK_NS as libc::c_int
        // SAFETY: PR_SET_TIMERSLACK sets a value of the calling thread only.
        && unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, WAKE_SLACK_NS, 0, 0, 0) } == 0;
    sleep_ns(ns);
    if tighter {
        // SAFETY: as above; puts back the value read before.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, was as libc::c_ulong, 0, 0, 0) };
    }
}
