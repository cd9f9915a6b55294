//! NVML's NVLink answers on a machine made with `simgpu init --nvlink`, called directly (in a
//! process of their own: the simulated NVML binds one machine per process).

use std::ffi::{c_uint, c_void};

use cuslice_test_harness::direct::*;

/// A machine made with `--nvlink` (an SXM board): NVML says every pair of devices is linked, as
/// `cuDeviceCanAccessPeer` does. Device 1 of three has two active GPU links, to devices 0 and 2
/// in that order (their PCI bus ids), and no third; every peer status between two devices is OK.
#[test]
fn nvml_reports_the_links_of_a_machine_made_with_nvlink() {
    let (_dir, _cuda) = setup(&["--memory", "2GiB", "--devices", "3", "--nvlink"]);
    let nvml = nvml_lib();
    // SAFETY: every signature below is the one nvml.h declares for that entry point; the PCI
    // info is read into a buffer larger than nvmlPciInfo_t.
    unsafe {
        let nvml_init: Fn0 = nvml.f("nvmlInit_v2");
        assert_eq!(nvml_init(), 0);
        let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32 =
            nvml.f("nvmlDeviceGetHandleByIndex_v2");
        let mut h = [std::ptr::null_mut(); 3];
        for (i, h) in h.iter_mut().enumerate() {
            assert_eq!(by_index(i as c_uint, h), 0);
        }
        let p2p: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint, *mut c_uint) -> u32 =
            nvml.f("nvmlDeviceGetP2PStatus");
        for index in 0..5 {
            let mut status = 99;
            assert_eq!(p2p(h[0], h[2], index, &mut status), 0);
            assert_eq!(status, 0, "peer status {index} between devices 0 and 2");
        }
        let state: unsafe extern "C" fn(*mut c_void, c_uint, *mut c_uint) -> u32 =
            nvml.f("nvmlDeviceGetNvLinkState");
        let pci: unsafe extern "C" fn(*mut c_void, *mut u8) -> u32 =
            nvml.f("nvmlDeviceGetPciInfo_v3");
        let remote: unsafe extern "C" fn(*mut c_void, c_uint, *mut u8) -> u32 =
            nvml.f("nvmlDeviceGetNvLinkRemotePciInfo_v2");
        let bus_id = |buf: &[u8; 128]| {
            // busId: after busIdLegacy[16], domain, bus, device, two ids (4 bytes each).
            let id = &buf[36..68];
            String::from_utf8_lossy(&id[..id.iter().position(|&b| b == 0).unwrap()]).into_owned()
        };
        for (link, other) in [(0, 0), (1, 2)] {
            let mut active = 0;
            assert_eq!(state(h[1], link, &mut active), 0, "link {link}");
            assert_eq!(active, 1, "link {link} is active");
            let (mut there, mut want) = ([0u8; 128], [0u8; 128]);
            assert_eq!(remote(h[1], link, there.as_mut_ptr()), 0);
            assert_eq!(pci(h[other], want.as_mut_ptr()), 0);
            assert_eq!(
                bus_id(&there),
                bus_id(&want),
                "link {link} reaches device {other}"
            );
        }
        let mut active = 0;
        assert_eq!(
            state(h[1], 2, &mut active),
            2,
            "INVALID_ARGUMENT: no third link"
        );
    }
}
