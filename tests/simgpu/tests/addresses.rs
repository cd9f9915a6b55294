//! `SIMGPU_ADDRESSES=fresh`: every allocation gets an address the process was not given before
//! (next fit), where by default a freed address comes back at once (first fit); the memory the
//! device holds is the same either way. A value that is neither `reuse` nor `fresh` refuses
//! cuInit with one line.

use std::collections::HashSet;
use std::ffi::{c_uint, c_void};
use std::process::Command;

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;

#[test]
fn fresh_addresses_are_not_handed_out_again_and_the_memory_comes_back_all_the_same() {
    // SAFETY: this binary has one test, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("SIMGPU_ADDRESSES", "fresh") };
    let (_dir, lib) = setup(&["--memory", "1GiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            ..
        } = Core::new(&lib);
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let alloc32: unsafe extern "C" fn(*mut u32, c_uint) -> i32 = lib.f("cuMemAlloc");
        let free32: unsafe extern "C" fn(u32) -> i32 = lib.f("cuMemFree");
        let info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 = lib.f("cuMemGetInfo_v2");
        assert_eq!(init(0), 0);
        let mut ctx: *mut c_void = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let free_now = || {
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(info(&mut f, &mut t), 0);
            f
        };
        let before = free_now();

        // One at a time, as an allocator's churn does: never the same address twice.
        let mut seen = HashSet::new();
        for i in 0..2000 {
            let mut p = 0u64;
            assert_eq!(alloc(&mut p, MIB), 0, "allocation {i}");
            assert!(seen.insert(p), "{p:#x} handed out again at allocation {i}");
            assert_eq!(free(p), 0);
        }
        assert_eq!(free_now(), before, "memory not given back");

        // Several live at once, up to the device's memory: it fills as it would with reuse.
        let mut live = Vec::new();
        loop {
            let mut p = 0u64;
            match alloc(&mut p, 64 * MIB) {
                0 => {
                    assert!(seen.insert(p), "{p:#x} handed out again while filling");
                    live.push(p);
                }
                2 => break,
                e => panic!("cuMemAlloc_v2: {e}"),
            }
        }
        // 1 GiB less the context's 300 MiB: 11 of 64 MiB.
        assert_eq!(live.len(), 11, "filled with {} allocations", live.len());
        for p in live {
            assert_eq!(free(p), 0);
        }
        assert_eq!(free_now(), before);

        // The 32-bit window (256 MiB, 2 MiB granules): distinct until it has been gone through,
        // then round again, never refused.
        let mut seen32 = HashSet::new();
        let mut again = None;
        for i in 0..400 {
            let mut p = 0u32;
            assert_eq!(alloc32(&mut p, MIB as c_uint), 0, "32-bit allocation {i}");
            if !seen32.insert(p) && again.is_none() {
                again = Some(i);
            }
            assert_eq!(free32(p), 0);
        }
        let again = again.expect("the 32-bit window never came round again");
        assert!(
            (120..=128).contains(&again),
            "an address came back after {again} allocations in a window of 128 granules"
        );
        assert_eq!(free_now(), before);
    }

    // Neither reuse nor fresh: cuInit refused, one line saying so.
    let out = Command::new(cuslice_test_harness::simgpu())
        .args(["run", "--"])
        .arg(cuslice_test_harness::workload())
        .arg("info")
        .env("SIMGPU_ADDRESSES", "recycled")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("SIMGPU_ADDRESSES"))
        .unwrap_or_else(|| panic!("no line names SIMGPU_ADDRESSES: {err}"));
    assert_eq!(
        line,
        "simgpu: SIMGPU_ADDRESSES=\"recycled\" is neither reuse nor fresh; write e.g. \
         SIMGPU_ADDRESSES=fresh"
    );
    assert_eq!(err.matches("SIMGPU_ADDRESSES").count(), 2, "{err}");
}
