//! A zero memset, which simgpu serves by punching whole pages out of the contents file and writing
//! the edges: every byte it covers reads back zero, and no byte beside it changes, seen through a
//! copy to the host and through a managed pointer.

use std::ffi::{c_uint, c_void};

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;

#[test]
fn a_zero_memset_clears_exactly_its_range() {
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
        let managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> i32 =
            lib.f("cuMemAllocManaged");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        let memset8: unsafe extern "C" fn(u64, u8, usize) -> i32 = lib.f("cuMemsetD8_v2");
        let memset32: unsafe extern "C" fn(u64, c_uint, usize) -> i32 = lib.f("cuMemsetD32_v2");
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);

        // 9 MiB: more than four 2 MiB granules, so the range crosses granule and page bounds.
        let len = 9 * MIB;
        let (start, end) = (4096 * 3 + 100, 7 * MIB + 12345);
        for kind in ["device", "managed"] {
            let mut p = 0;
            let r = if kind == "device" {
                alloc(&mut p, len)
            } else {
                managed(&mut p, len, cuda_abi::CU_MEM_ATTACH_GLOBAL)
            };
            assert_eq!(r, 0, "{kind}");
            assert_eq!(memset8(p, 0xab, len), 0);
            assert_eq!(memset8(p + start as u64, 0, end - start), 0);
            let mut back = vec![1u8; len];
            assert_eq!(dtoh(back.as_mut_ptr().cast(), p, len), 0);
            let wrong = |bytes: &[u8]| {
                bytes
                    .iter()
                    .enumerate()
                    .find(|&(i, &b)| b != if (start..end).contains(&i) { 0 } else { 0xab })
                    .map(|(i, &b)| (i, b))
            };
            assert_eq!(
                wrong(&back),
                None,
                "{kind}: (offset, byte) read back wrongly"
            );
            if kind == "managed" {
                let host = std::slice::from_raw_parts(p as *const u8, len);
                assert_eq!(wrong(host), None, "managed: through the host pointer");
            }
            // A zero written as 32-bit words clears whole pages the same way.
            assert_eq!(memset32(p, 0, len / 4), 0);
            assert_eq!(dtoh(back.as_mut_ptr().cast(), p, len), 0);
            assert!(
                back.iter().all(|&b| b == 0),
                "{kind}: cuMemsetD32_v2 with 0"
            );
            assert_eq!(free(p), 0);
        }
    }
}
