//! NVML's topology answers called directly, as NCCL calls them (in a process of their own: the
//! simulated NVML binds one machine per process).

use std::ffi::{CString, c_char, c_uint, c_void};

use cuslice_test_harness::direct::*;

/// What NCCL asks NVML while it builds its topology: a device by its PCI bus id in NVML's form
/// and in CUDA's, peer status (a device reaches itself; devices without peer access do not
/// reach each other) and the PCIe link.
#[test]
fn nvml_answers_the_topology_queries_nccl_makes() {
    let (_dir, _cuda) = setup(&["--memory", "2GiB", "--devices", "2"]);
    let nvml = nvml_lib();
    // SAFETY: every signature below is the one nvml.h declares for that entry point.
    unsafe {
        let nvml_init: Fn0 = nvml.f("nvmlInit_v2");
        assert_eq!(nvml_init(), 0);
        let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32 =
            nvml.f("nvmlDeviceGetHandleByIndex_v2");
        let mut h = [std::ptr::null_mut(); 2];
        for (i, h) in h.iter_mut().enumerate() {
            assert_eq!(by_index(i as c_uint, h), 0);
        }
        for name in [
            "nvmlDeviceGetHandleByPciBusId",
            "nvmlDeviceGetHandleByPciBusId_v2",
        ] {
            let by_bus: unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> u32 = nvml.f(name);
            for (form, want) in [
                ("00000000:26:00.0", h[1]),
                ("0000:26:00.0", h[1]),
                ("26:00.0", h[1]),
                ("0000:18:00.0", h[0]),
            ] {
                let mut got = std::ptr::null_mut();
                let c = CString::new(form).unwrap();
                assert_eq!(by_bus(c.as_ptr(), &mut got), 0, "{name}({form})");
                assert_eq!(got, want, "{name}({form})");
            }
            let mut got = std::ptr::null_mut();
            let c = CString::new("0000:99:00.0").unwrap();
            assert_eq!(by_bus(c.as_ptr(), &mut got), 6, "{name}: NOT_FOUND");
        }
        let p2p: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint, *mut c_uint) -> u32 =
            nvml.f("nvmlDeviceGetP2PStatus");
        let mut status = 99;
        assert_eq!(p2p(h[0], h[0], 0, &mut status), 0);
        assert_eq!(status, 0, "a device reaches itself");
        assert_eq!(p2p(h[0], h[1], 0, &mut status), 0);
        assert_eq!(
            status, 5,
            "NVML_P2P_STATUS_NOT_SUPPORTED, as cuDeviceCanAccessPeer says 0"
        );
        for (name, want) in [
            ("nvmlDeviceGetCurrPcieLinkGeneration", 5),
            ("nvmlDeviceGetCurrPcieLinkWidth", 16),
            ("nvmlDeviceGetPcieLinkMaxSpeed", 32000),
        ] {
            let f: unsafe extern "C" fn(*mut c_void, *mut c_uint) -> u32 = nvml.f(name);
            let mut v = 0;
            assert_eq!(f(h[1], &mut v), 0, "{name}");
            assert_eq!(v, want, "{name}");
        }
    }
}
