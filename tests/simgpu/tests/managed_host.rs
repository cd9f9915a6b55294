//! Managed memory attached to the host, as the simulated driver models it: resident in host
//! memory, so it counts as none of the device's, while copies and memsets work on it as on any
//! device pointer; `cuMemAdvise[_v2]` checks its arguments and moves nothing; CUDA IPC refuses it.

use std::ffi::{c_int, c_uint, c_void};

use cuda_abi::CUmemLocation;
use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

#[test]
fn managed_memory_attached_to_the_host_is_not_device_memory() {
    let (_dir, lib) = setup(&["--memory", "1GiB", "--context-overhead", "100MiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            ..
        } = Core::new(&lib);
        let mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            lib.f("cuMemGetInfo_v2");
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> i32 =
            lib.f("cuMemAllocManaged");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let memset: unsafe extern "C" fn(u64, u8, usize) -> i32 = lib.f("cuMemsetD8_v2");
        let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> i32 = lib.f("cuMemcpyHtoD_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        let advise: unsafe extern "C" fn(u64, usize, c_int, c_int) -> i32 = lib.f("cuMemAdvise");
        let advise_v2: unsafe extern "C" fn(u64, usize, c_int, CUmemLocation) -> i32 =
            lib.f("cuMemAdvise_v2");
        let ipc_get: unsafe extern "C" fn(*mut [u8; 64], u64) -> i32 = lib.f("cuIpcGetMemHandle");

        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let free_now = || {
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(mem_info(&mut f, &mut t), 0);
            f
        };
        let before = free_now();
        assert_eq!(before, GIB - 100 * MIB);

        // More than the device holds, and none of it counts there.
        let mut p = 0u64;
        assert_eq!(managed(&mut p, 2 * GIB, cuda_abi::CU_MEM_ATTACH_HOST), 0);
        assert_eq!(free_now(), before, "host-attached managed memory counted");
        // Copies and memsets work on it, and the host reads it at the same address.
        assert_eq!(memset(p, 0xab, 4096), 0);
        assert_eq!(*(p as *const u8).add(4095), 0xab);
        let pattern = [7u8, 1, 2, 3, 4, 5, 6, 9];
        assert_eq!(htod(p + GIB as u64, pattern.as_ptr().cast(), 8), 0);
        let mut back = [0u8; 8];
        assert_eq!(dtoh(back.as_mut_ptr().cast(), p + GIB as u64, 8), 0);
        assert_eq!(back, pattern);
        // Advice is checked and changes nothing.
        let cpu = cuda_abi::CU_DEVICE_CPU;
        let prefer = cuda_abi::CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
        let accessed = cuda_abi::CU_MEM_ADVISE_SET_ACCESSED_BY;
        assert_eq!(advise(p, 2 * GIB, prefer, cpu), 0);
        assert_eq!(advise(p, 2 * GIB, accessed, 0), 0);
        let device0 = CUmemLocation {
            type_: cuda_abi::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        assert_eq!(advise_v2(p, 2 * GIB, prefer, device0), 0);
        assert_eq!(free_now(), before, "advice moved memory");
        assert_eq!(advise(p, 2 * GIB, 99, cpu), 1, "an unknown advice");
        assert_eq!(
            advise(p, 2 * GIB, prefer, 7),
            101,
            "a device that is not there"
        );
        assert_eq!(advise(p, 3 * GIB, prefer, cpu), 1, "past the allocation");
        let mut d = 0u64;
        assert_eq!(alloc(&mut d, 64 * MIB), 0);
        assert_eq!(
            advise(d, 64 * MIB, prefer, cpu),
            1,
            "device memory is not managed"
        );
        // CUDA IPC shares no managed memory; device memory it shares.
        let mut h = [0u8; 64];
        assert_eq!(ipc_get(&mut h, p), 1);
        assert_eq!(ipc_get(&mut h, d), 0);
        assert_eq!(free(d), 0);
        assert_eq!(free(p), 0);
        assert_eq!(free_now(), before);
        // Attached globally, managed memory is the device's from allocation.
        assert_eq!(managed(&mut p, 64 * MIB, cuda_abi::CU_MEM_ATTACH_GLOBAL), 0);
        assert!(free_now() <= before - 64 * MIB);
        assert_eq!(free(p), 0);
    }
}
