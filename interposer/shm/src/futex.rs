//! Futex words in shared mappings: a word several processes map (no `FUTEX_PRIVATE_FLAG`), on
//! which threads of any of them sleep until another changes it and wakes them.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Wakes every thread sleeping on `w`, in any process that maps it.
pub fn wake_all(w: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on the address of a live atomic; it reads nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Sleeps while `w` still holds `value`, for at most `timeout` (a signal, a spurious wake-up or a
/// changed word end it early: the caller looks again).
pub fn wait(w: &AtomicU32, value: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on the address of a live atomic, with a relative timeout that lives
    // across the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            value,
            &ts as *const libc::timespec,
        )
    };
}
