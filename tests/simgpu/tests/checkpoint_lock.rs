//! Locking a process with the checkpoint API while one of its calls is under way: a lock with a
//! timeout shorter than the call gives up (CUDA_ERROR_NOT_READY) and leaves the process running;
//! one without a timeout waits for the call, and the process's next call waits for the unlock.
//! The process locks itself here (the API takes any pid, its own included).

use std::ffi::{CString, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cuslice_test_harness::direct::*;

/// Items a context queues before a launch waits (simgpu's `RING`).
const RING: u32 = 256;

#[test]
fn a_lock_waits_for_a_call_under_way_or_gives_up_at_its_timeout() {
    let (_dir, lib) = setup(&["--memory", "1GiB", "--context-overhead", "100MiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            load,
            get_fn,
            launch,
            ..
        } = Core::new(&lib);
        let cp = Checkpoint::new(&lib);
        assert_eq!(init(0), 0);
        let mut primary = std::ptr::null_mut();
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(set_current(primary), 0);
        // Kernels of 400 ms: with the queue full, a launch waits, inside the call, until the
        // first one ends.
        let image = CString::new("kernel k 400000000\n").unwrap();
        let (mut module, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(load(&mut module, image.as_ptr() as *const c_void), 0);
        assert_eq!(get_fn(&mut f, module, c"k".as_ptr()), 0);
        let (ctx, f) = (primary as usize, f as usize);
        let launched = Arc::new(AtomicU32::new(0));
        let count = launched.clone();
        // Taken before the first launch: the first kernel ends 400 ms after it at the earliest.
        let started = std::time::Instant::now();
        let launcher = std::thread::spawn(move || {
            assert_eq!(set_current(ctx as *mut c_void), 0);
            for _ in 0..RING + 3 {
                let null = std::ptr::null_mut();
                let (no_params, no_extra) = (std::ptr::null_mut(), std::ptr::null_mut());
                let r = launch(
                    f as *mut c_void,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    null,
                    no_params,
                    no_extra,
                );
                assert_eq!(r, 0);
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        while launched.load(Ordering::SeqCst) < RING {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        // The launch after the queue's last is under way (waiting for room).
        assert_eq!(launched.load(Ordering::SeqCst), RING);

        let me = std::process::id() as c_int;
        let state = || cp.state(me);
        assert_eq!(
            (cp.lock)(me, &LockArgs::timeout(100)),
            cuda_abi::CUresult::CUDA_ERROR_NOT_READY.0,
            "the call under way outlasts the lock's timeout"
        );
        assert_eq!(state(), 0, "left RUNNING");

        assert_eq!(
            (cp.lock)(me, &LockArgs::timeout(0)),
            0,
            "without a timeout the lock waits for it"
        );
        let locked_at = started.elapsed();
        assert_eq!(state(), 1, "LOCKED");
        // The call under way could end only once the first kernel had: the lock waited for it.
        assert!(
            locked_at >= Duration::from_millis(400),
            "locked {locked_at:?} after the first launch, before the call under way could end"
        );
        // The launching thread counts the call once it has returned (it may not have run yet).
        let counted = std::time::Instant::now();
        while launched.load(Ordering::SeqCst) < RING + 1
            && counted.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let held_at = launched.load(Ordering::SeqCst);
        assert_eq!(held_at, RING + 1, "the call under way finished");
        std::thread::sleep(Duration::from_millis(900));
        assert_eq!(
            launched.load(Ordering::SeqCst),
            held_at,
            "no launch went through while locked, though the queue had room again"
        );
        assert_eq!((cp.unlock)(me, std::ptr::null()), 0);
        assert_eq!(state(), 0);
        launcher.join().unwrap();
        assert_eq!(launched.load(Ordering::SeqCst), RING + 3);
    }
}
