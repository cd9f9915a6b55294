//! Semantics the workload does not exercise, checked through the entry points directly:
//! context destruction, host functions, managed memory, graph allocations, memset, VMM sharing.

use std::ffi::{CString, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;

static HOST_FN_AT: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn host_fn(_: *mut c_void) {
    HOST_FN_AT.store(simgpu::clock::now_ns(), Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(30));
}

#[test]
fn contexts_host_functions_managed_memory_graphs_and_vmm_behave_like_the_driver() {
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
        let ctx_create: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint, c_int) -> i32 =
            lib.f("cuCtxCreate_v4");
        let ctx_destroy: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuCtxDestroy_v2");
        let mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            lib.f("cuMemGetInfo_v2");
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> i32 =
            lib.f("cuMemAllocManaged");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        let memset32: unsafe extern "C" fn(u64, c_uint, usize) -> i32 = lib.f("cuMemsetD32_v2");
        let host: unsafe extern "C" fn(
            *mut c_void,
            unsafe extern "C" fn(*mut c_void),
            *mut c_void,
        ) -> i32 = lib.f("cuLaunchHostFunc");
        let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 =
            lib.f("cuStreamCreate");
        let stream_sync: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuStreamSynchronize");
        let begin: unsafe extern "C" fn(*mut c_void, c_uint) -> i32 =
            lib.f("cuStreamBeginCapture_v2");
        let end: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> i32 =
            lib.f("cuStreamEndCapture");
        let alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> i32 =
            lib.f("cuMemAllocAsync");
        let instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> i32 =
            lib.f("cuGraphInstantiateWithFlags");
        let graph_launch: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32 =
            lib.f("cuGraphLaunch");
        let exec_destroy: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuGraphExecDestroy");
        let create: unsafe extern "C" fn(
            *mut u64,
            usize,
            *const cuda_abi::CUmemAllocationProp,
            u64,
        ) -> i32 = lib.f("cuMemCreate");
        let release: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemRelease");
        let export: unsafe extern "C" fn(*mut c_void, u64, c_uint, u64) -> i32 =
            lib.f("cuMemExportToShareableHandle");
        let import: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> i32 =
            lib.f("cuMemImportFromShareableHandle");

        let free_now = || {
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(mem_info(&mut f, &mut t), 0);
            f
        };
        assert_eq!(init(0), 0);
        let mut primary = std::ptr::null_mut();
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(set_current(primary), 0);
        let base = free_now();
        assert_eq!(base, 1024 * MIB - 100 * MIB);

        // A second context takes its own overhead; destroying it releases that and its memory.
        let mut ctx = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut ctx, std::ptr::null_mut(), 0, 0), 0);
        let mut p = 0;
        assert_eq!(alloc(&mut p, 50 * MIB), 0);
        assert_eq!(free_now(), base - 150 * MIB);
        assert_eq!(ctx_destroy(ctx), 0);
        assert_eq!(set_current(primary), 0);
        assert_eq!(
            free_now(),
            base,
            "cuCtxDestroy released the context and what was made in it"
        );

        // Managed memory is usable from the host at the same address.
        let mut m = 0;
        assert_eq!(managed(&mut m, 4 * MIB, cuda_abi::CU_MEM_ATTACH_GLOBAL), 0);
        let host_view = std::slice::from_raw_parts_mut(m as *mut u32, MIB);
        host_view[12345] = 0xfeed;
        let mut back = vec![0u32; MIB];
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, m, 4 * MIB), 0);
        assert_eq!(back[12345], 0xfeed);
        assert_eq!(memset32(m, 7, MIB), 0);
        assert_eq!(
            host_view[999_999], 7,
            "a device memset is visible through the managed pointer"
        );
        assert_eq!(free(m), 0);

        // A host function runs when the queue reaches it, and holds back later work.
        let image = CString::new("kernel k 20000000\n").unwrap();
        let (mut module, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(load(&mut module, image.as_ptr() as *const c_void), 0);
        assert_eq!(get_fn(&mut f, module, c"k".as_ptr()), 0);
        let mut s = std::ptr::null_mut();
        assert_eq!(stream_create(&mut s, 0), 0);
        let t0 = simgpu::clock::now_ns();
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(host(s, host_fn, std::ptr::null_mut()), 0);
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(stream_sync(s), 0);
        let t_end = simgpu::clock::now_ns();
        let ran_at = HOST_FN_AT.load(Ordering::SeqCst);
        assert!(
            ran_at >= t0 + 20_000_000,
            "the host function waited for the 20 ms kernel before it"
        );
        assert!(
            t_end >= ran_at + 30_000_000 + 20_000_000,
            "the kernel after it waited for it to return"
        );

        // Memory allocated during capture is taken at the graph's first launch, kept until the
        // instantiated graph is destroyed.
        assert_eq!(begin(s, cuda_abi::CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
        let mut g_mem = 0;
        assert_eq!(alloc_async(&mut g_mem, 64 * MIB, s), 0);
        assert_eq!(
            alloc(&mut p, MIB),
            900,
            "cuMemAlloc during a global capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        );
        let mut graph = std::ptr::null_mut();
        assert_eq!(end(s, &mut graph), 901, "the capture was invalidated");
        assert_eq!(begin(s, cuda_abi::CU_STREAM_CAPTURE_MODE_RELAXED), 0);
        assert_eq!(alloc_async(&mut g_mem, 64 * MIB, s), 0);
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(end(s, &mut graph), 0);
        let with_module = free_now();
        let mut exec = std::ptr::null_mut();
        assert_eq!(instantiate(&mut exec, graph, 0), 0);
        assert_eq!(free_now(), with_module, "nothing is taken at instantiation");
        assert_eq!(graph_launch(exec, s), 0);
        assert_eq!(free_now(), with_module - 64 * MIB);
        assert_eq!(graph_launch(exec, s), 0);
        assert_eq!(stream_sync(s), 0);
        assert_eq!(
            free_now(),
            with_module - 64 * MIB,
            "later launches reuse it"
        );
        assert_eq!(exec_destroy(exec), 0);
        assert_eq!(free_now(), with_module);

        // VMM: only device-located handles take device memory; an imported handle adds none.
        let mut prop: cuda_abi::CUmemAllocationProp = std::mem::zeroed();
        prop.type_ = cuda_abi::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = cuda_abi::CUmemLocation {
            type_: cuda_abi::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let mut h = 0;
        assert_eq!(create(&mut h, 20 * MIB, &prop, 0), 0);
        assert_eq!(
            free_now(),
            with_module,
            "host-located handles take no device memory"
        );
        assert_eq!(release(h), 0);
        prop.location = cuda_abi::CUmemLocation {
            type_: cuda_abi::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        assert_eq!(create(&mut h, 20 * MIB, &prop, 0), 0);
        assert_eq!(
            create(&mut h, 3 * MIB, &prop, 0),
            1,
            "sizes must be multiples of the granularity"
        );
        assert_eq!(free_now(), with_module - 20 * MIB);
        let mut fd: c_int = -1;
        assert_eq!(
            export(
                &mut fd as *mut c_int as *mut c_void,
                h,
                cuda_abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0
            ),
            0
        );
        let mut imported = 0;
        assert_eq!(
            import(
                &mut imported,
                fd as usize as *mut c_void,
                cuda_abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            ),
            0
        );
        assert_eq!(
            free_now(),
            with_module - 20 * MIB,
            "importing counts nothing twice"
        );
        assert_eq!(release(h), 0);
        assert_eq!(free_now(), with_module);
    }
}
