//! Status codes of the simulated driver, called directly through dlopen/dlsym.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use cuslice_test_harness::direct::*;

#[test]
fn the_driver_answers_with_the_real_status_codes() {
    let (_dir, lib) = setup(&["--memory", "1GiB"]);

    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            load,
            get_fn,
            launch,
            sync,
        } = Core::new(&lib);
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let alloc_v1: unsafe extern "C" fn(*mut u32, c_uint) -> i32 = lib.f("cuMemAlloc");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let free_v1: unsafe extern "C" fn(u32) -> i32 = lib.f("cuMemFree");
        let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> i32 = lib.f("cuDeviceGet");
        let gpa: unsafe extern "C" fn(
            *const c_char,
            *mut *mut c_void,
            c_int,
            u64,
            *mut c_int,
        ) -> i32 = lib.f("cuGetProcAddress_v2");
        let export_table: unsafe extern "C" fn(*mut *const c_void, *const c_void) -> i32 =
            lib.f("cuGetExportTable");
        let event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 =
            lib.f("cuEventCreate");
        let elapsed: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> i32 =
            lib.f("cuEventElapsedTime");
        let query: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuStreamQuery");

        let mut p = 0u64;
        assert_eq!(
            alloc(&mut p, 8),
            3,
            "CUDA_ERROR_NOT_INITIALIZED before cuInit"
        );
        assert_eq!(init(1), 1, "cuInit takes flags 0 only");
        assert_eq!(init(0), 0);
        assert_eq!(
            alloc(&mut p, 8),
            201,
            "CUDA_ERROR_INVALID_CONTEXT without a context"
        );
        let mut dev = 0;
        assert_eq!(device_get(&mut dev, 1), 101, "CUDA_ERROR_INVALID_DEVICE");
        assert_eq!(device_get(&mut dev, 0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        assert_eq!(alloc(&mut p, 0), 1, "CUDA_ERROR_INVALID_VALUE for 0 bytes");
        assert_eq!(
            alloc(std::ptr::null_mut(), 8),
            1,
            "CUDA_ERROR_INVALID_VALUE for a NULL out-pointer"
        );
        assert_eq!(alloc(&mut p, 2 << 30), 2, "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(free(0xdead_0000), 1, "freeing what was never allocated");
        assert_eq!(alloc(&mut p, 8), 0);
        assert_eq!(free(p), 0);
        assert_eq!(free(p), 1, "double free");

        // The CUDA 2.x ABI really is 32-bit.
        let mut p32 = 0u32;
        assert_eq!(alloc_v1(&mut p32, 4096), 0);
        assert!(p32 != 0);
        assert_eq!(free_v1(p32), 0);

        // cuGetProcAddress: by version and flags, exactly the exported variant.
        let ask = |name: &str, version: c_int, flags: u64| {
            let n = CString::new(name).unwrap();
            let (mut pfn, mut st) = (std::ptr::null_mut(), -1);
            let r = gpa(n.as_ptr(), &mut pfn, version, flags, &mut st);
            (r, pfn, st)
        };
        assert_eq!(ask("cuMemAlloc", 3020, 0), (0, lib.sym("cuMemAlloc_v2"), 0));
        assert_eq!(ask("cuMemAlloc", 2000, 0), (0, lib.sym("cuMemAlloc"), 0));
        assert_eq!(
            ask("cuLaunchKernel", 12000, 2),
            (0, lib.sym("cuLaunchKernel_ptsz"), 0)
        );
        assert_eq!(
            ask("cuLaunchKernel", 12000, 0),
            (0, lib.sym("cuLaunchKernel"), 0)
        );
        assert_eq!(
            ask("cuCtxCreate", 12050, 0),
            (0, lib.sym("cuCtxCreate_v4"), 0)
        );
        assert_eq!(
            ask("cuGetProcAddress", 12000, 0),
            (0, lib.sym("cuGetProcAddress_v2"), 0)
        );
        assert_eq!(
            ask("cuMemAllocAsync", 11010, 0),
            (500, std::ptr::null_mut(), 2),
            "version not sufficient"
        );
        assert_eq!(
            ask("cuNoSuchFunction", 13000, 0),
            (500, std::ptr::null_mut(), 1),
            "symbol not found"
        );
        // The runtime's private tables: a known UUID gives one, an unknown one NOT_FOUND, a
        // NULL UUID INVALID_VALUE.
        let mut table = std::ptr::null();
        let integrity: [u8; 16] = 0xd4082055_bde6704b_8d34ba12_3c66e1f2u128.to_be_bytes();
        assert_eq!(export_table(&mut table, integrity.as_ptr().cast()), 0);
        assert!(!table.is_null());
        assert_eq!(export_table(&mut table, [7u8; 16].as_ptr().cast()), 500);
        assert!(table.is_null());
        assert_eq!(export_table(&mut table, std::ptr::null()), 1);

        // Events and streams.
        let (mut e1, mut e2) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(event_create(&mut e1, 0), 0);
        assert_eq!(event_create(&mut e2, 0), 0);
        let mut ms = 0f32;
        assert_eq!(
            elapsed(&mut ms, e1, e2),
            400,
            "never-recorded events: CUDA_ERROR_INVALID_HANDLE"
        );
        let image = CString::new("kernel slow 50000000\n").unwrap();
        let mut module = std::ptr::null_mut();
        assert_eq!(load(&mut module, image.as_ptr() as *const c_void), 0);
        let mut f = std::ptr::null_mut();
        let name = CString::new("nope").unwrap();
        assert_eq!(
            get_fn(&mut f, module, name.as_ptr()),
            500,
            "CUDA_ERROR_NOT_FOUND for an unknown kernel"
        );
        let name = CString::new("slow").unwrap();
        assert_eq!(get_fn(&mut f, module, name.as_ptr()), 0);
        assert_eq!(
            launch(
                f,
                0,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            1,
            "empty grid"
        );
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            1,
            "too many threads"
        );
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(
            query(std::ptr::null_mut()),
            600,
            "CUDA_ERROR_NOT_READY while a 50 ms kernel runs"
        );
        assert_eq!(sync(), 0);
        assert_eq!(query(std::ptr::null_mut()), 0);
    }
}
