//! NVML entry points called directly: the list protocol, struct versions, process utilisation.

use std::ffi::{CString, c_char, c_uint, c_void};

use cuslice_test_harness::direct::*;

use cuda_abi::{
    NVML_MEMORY_V2, nvmlMemory_v2_t, nvmlProcessInfo_v2_t, nvmlProcessUtilizationSample_t,
};

#[test]
fn nvml_lists_versions_and_process_utilisation() {
    let (_dir, cuda) = setup(&["--memory", "2GiB"]);
    let nvml = nvml_lib();
    // SAFETY: every signature below is the one cuda.h / nvml.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            load,
            get_fn,
            launch,
            sync,
        } = Core::new(&cuda);

        let nvml_init: Fn0 = nvml.f("nvmlInit_v2");
        let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32 =
            nvml.f("nvmlDeviceGetHandleByIndex_v2");
        let by_uuid: unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> u32 =
            nvml.f("nvmlDeviceGetHandleByUUID");
        let uuid: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> u32 =
            nvml.f("nvmlDeviceGetUUID");
        let mem_v2: unsafe extern "C" fn(*mut c_void, *mut nvmlMemory_v2_t) -> u32 =
            nvml.f("nvmlDeviceGetMemoryInfo_v2");
        let procs: unsafe extern "C" fn(
            *mut c_void,
            *mut c_uint,
            *mut nvmlProcessInfo_v2_t,
        ) -> u32 = nvml.f("nvmlDeviceGetComputeRunningProcesses_v3");
        let util: unsafe extern "C" fn(
            *mut c_void,
            *mut nvmlProcessUtilizationSample_t,
            *mut c_uint,
            u64,
        ) -> u32 = nvml.f("nvmlDeviceGetProcessUtilization");
        let shutdown: unsafe extern "C" fn() -> u32 = nvml.f("nvmlShutdown");

        let mut dev = std::ptr::null_mut();
        assert_eq!(
            by_index(0, &mut dev),
            1,
            "NVML_ERROR_UNINITIALIZED before nvmlInit"
        );
        assert_eq!(nvml_init(), 0);
        assert_eq!(
            by_index(1, &mut dev),
            2,
            "NVML_ERROR_INVALID_ARGUMENT past the last device"
        );
        assert_eq!(by_index(0, &mut dev), 0);
        let mut buf = [0 as c_char; 96];
        assert_eq!(
            uuid(dev, buf.as_mut_ptr(), 10),
            7,
            "NVML_ERROR_INSUFFICIENT_SIZE for a short buffer"
        );
        assert_eq!(uuid(dev, buf.as_mut_ptr(), 96), 0);
        let mut again = std::ptr::null_mut();
        assert_eq!(by_uuid(buf.as_ptr(), &mut again), 0);
        assert_eq!(again, dev);

        let mut m: nvmlMemory_v2_t = std::mem::zeroed();
        assert_eq!(
            mem_v2(dev, &mut m),
            25,
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH without the version"
        );
        m.version = NVML_MEMORY_V2;
        assert_eq!(mem_v2(dev, &mut m), 0);
        assert_eq!((m.total, m.used), (2 << 30, 0));

        // A process with a context: listed, with its context overhead.
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let mut count: c_uint = 0;
        assert_eq!(
            procs(dev, &mut count, std::ptr::null_mut()),
            7,
            "a count of 0 is too small for one process"
        );
        assert_eq!(count, 1);
        let mut infos = [nvmlProcessInfo_v2_t::default(); 4];
        count = 4;
        assert_eq!(procs(dev, &mut count, infos.as_mut_ptr()), 0);
        assert_eq!(
            (count, infos[0].pid, infos[0].usedGpuMemory),
            (1, std::process::id(), 300 << 20)
        );

        // Busy for 800 ms: the process's SM utilisation over the last sample period (200 ms)
        // is high once a whole period has passed since the launch.
        let image = CString::new("kernel k 800000000\n").unwrap();
        let (mut module, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(load(&mut module, image.as_ptr() as *const c_void), 0);
        assert_eq!(get_fn(&mut f, module, c"k".as_ptr()), 0);
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
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
        let mut samples = [nvmlProcessUtilizationSample_t::default(); 4];
        let mut n: c_uint = 0;
        assert_eq!(util(dev, std::ptr::null_mut(), &mut n, 0), 7);
        assert_eq!(n, 1);
        n = 4;
        let since = simgpu::clock::wall_us() - 250_000;
        assert_eq!(util(dev, samples.as_mut_ptr(), &mut n, since), 0);
        assert_eq!(n, 1);
        assert_eq!(samples[0].pid, std::process::id());
        assert!(
            samples[0].smUtil >= 90,
            "busy the whole window: {}%",
            samples[0].smUtil
        );
        assert_eq!(sync(), 0);
        assert_eq!(shutdown(), 0);
        assert_eq!(shutdown(), 1, "more shutdowns than inits");
    }
}
