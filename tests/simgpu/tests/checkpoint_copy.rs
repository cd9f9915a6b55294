//! A copy is a call under way: the checkpoint API's lock, taken while a thread of the process is
//! in the middle of a long device-to-host copy, waits for the copy or gives up at its timeout
//! (CUDA_ERROR_NOT_READY, the process left RUNNING). It never locks the process, and a checkpoint
//! never takes its memory, under a copy that is still reading it. Every copy reads back the
//! bytes that were written, whatever the lock, checkpoint and restore did around it.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;
/// Large enough that one copy into fresh host pages outlasts the lock's timeout here.
const BYTES: usize = 768 * MIB;

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) % 251) as u8 + 1
}

#[test]
fn a_lock_never_takes_a_process_in_the_middle_of_a_copy() {
    let (_dir, lib) = setup(&["--memory", "2GiB", "--context-overhead", "100MiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            ..
        } = Core::new(&lib);
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> i32 = lib.f("cuMemcpyHtoD_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        let cp = Checkpoint::new(&lib);
        assert_eq!(init(0), 0);
        let mut primary = std::ptr::null_mut();
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(set_current(primary), 0);
        let mut dptr = 0u64;
        assert_eq!(alloc(&mut dptr, BYTES), 0);
        let host: Vec<u8> = (0..BYTES).map(pattern).collect();
        assert_eq!(htod(dptr, host.as_ptr().cast(), BYTES), 0);
        let host = Arc::new(host);

        // The copier: device-to-host copies into fresh host pages, one after another; each
        // publishes when it went into the driver (ns since `t0`, 0 while none is under way).
        let t0 = Instant::now();
        let since = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ctx, copier_since, copier_stop, want) =
            (primary as usize, since.clone(), stop.clone(), host.clone());
        let copier = std::thread::spawn(move || {
            assert_eq!(set_current(ctx as *mut c_void), 0);
            let (mut copies, mut wrong) = (0u32, Vec::new());
            let mut longest = Duration::ZERO;
            while !copier_stop.load(Ordering::SeqCst) {
                let mut back = vec![0u8; BYTES];
                let at = t0.elapsed();
                copier_since.store(at.as_nanos() as u64, Ordering::SeqCst);
                let r = dtoh(back.as_mut_ptr().cast(), dptr, BYTES);
                copier_since.store(0, Ordering::SeqCst);
                longest = longest.max(t0.elapsed() - at);
                assert_eq!(r, 0, "the copy failed");
                copies += 1;
                if back[..] != want[..]
                    && let Some(i) = (0..BYTES).find(|&i| back[i] != want[i])
                {
                    wrong.push((copies, i, back[i], want[i]));
                }
            }
            (copies, wrong, longest)
        });

        let me = std::process::id() as c_int;
        let state = || cp.state(me);
        let args = LockArgs::timeout(100);
        // (copy still under way when the lock answered, the lock's answer)
        let mut tries: Vec<(bool, i32)> = Vec::new();
        let end = Instant::now() + Duration::from_secs(6);
        while Instant::now() < end {
            // A copy that went into the driver at least 20 ms ago is under way in it.
            let s = since.load(Ordering::SeqCst);
            if s == 0 || t0.elapsed().as_nanos() as u64 - s < 20_000_000 {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            let r = (cp.lock)(me, &args);
            let under_way = since.load(Ordering::SeqCst) == s;
            tries.push((under_way, r));
            if r == 0 {
                assert_eq!(state(), 1, "LOCKED");
                assert_eq!((cp.checkpoint)(me, std::ptr::null()), 0);
                assert_eq!(state(), 2, "CHECKPOINTED");
                std::thread::sleep(Duration::from_millis(50));
                assert_eq!((cp.restore)(me, std::ptr::null()), 0);
                assert_eq!((cp.unlock)(me, std::ptr::null()), 0);
            } else {
                assert_eq!(r, cuda_abi::CUresult::CUDA_ERROR_NOT_READY.0);
                assert_eq!(state(), 0, "a lock that gave up leaves the process RUNNING");
            }
            // The next try waits for the next copy.
            while since.load(Ordering::SeqCst) == s {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        stop.store(true, Ordering::SeqCst);
        let (copies, wrong, longest) = copier.join().unwrap();

        let locked_under_a_copy = tries.iter().filter(|(u, r)| *u && *r == 0).count();
        let gave_up = tries.iter().filter(|(u, r)| *u && *r != 0).count();
        eprintln!(
            "{copies} copies of {} MiB (longest {longest:?}); {} locks tried during one: \
             {gave_up} gave up while it went on, {locked_under_a_copy} locked the process under it",
            BYTES / MIB,
            tries.len()
        );
        assert!(
            wrong.is_empty(),
            "copies read back bytes that were never written (copy, offset, got, wanted): {wrong:?}"
        );
        assert_eq!(
            locked_under_a_copy, 0,
            "the lock succeeded while a copy of the process was still under way"
        );
        assert!(
            gave_up >= 3,
            "too few locks were tried while a copy was under way to judge ({gave_up}); each copy took at most {longest:?}"
        );
    }
}
