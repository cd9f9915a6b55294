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
