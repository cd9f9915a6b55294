//! PTX images: only declared kernels resolve, arguments are checked against the declared
//! parameters (through kernelParams or the `extra` buffer), and a launch takes the device time
//! the image's annotation gives, its blocks running side by side one per SM.

use std::ffi::{CString, c_void};
use std::ptr::null_mut;

use cuslice_test_harness::direct::*;

const PTX: &str = "\
// simgpu-kernel spin block-ns=param1
// simgpu-kernel fixed block-ns=250000
.version 7.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u32 flags, .param .u64 ns)
{
    ret;
}
.visible .entry fixed()
{
    ret;
}
";

#[test]
fn ptx_kernels_take_the_time_their_annotation_gives_and_check_their_arguments() {
    let (_dir, lib) = setup(&["--sm-count", "132"]);
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
        let event_create: unsafe extern "C" fn(*mut *mut c_void, u32) -> i32 =
            lib.f("cuEventCreate");
        let record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32 = lib.f("cuEventRecord");
        let event_sync: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuEventSynchronize");
        let elapsed: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> i32 =
            lib.f("cuEventElapsedTime");

        assert_eq!(init(0), 0);
        let mut ctx = null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let image = CString::new(PTX).unwrap();
        let mut module = null_mut();
        assert_eq!(load(&mut module, image.as_ptr() as *const c_void), 0);
        let (mut spin, mut fixed, mut none) = (null_mut(), null_mut(), null_mut());
        assert_eq!(get_fn(&mut spin, module, c"spin".as_ptr()), 0);
        assert_eq!(get_fn(&mut fixed, module, c"fixed".as_ptr()), 0);
        assert_eq!(
            get_fn(&mut none, module, c"other".as_ptr()),
            500,
            "a name the PTX does not declare: CUDA_ERROR_NOT_FOUND"
        );

        let (mut start, mut end) = (null_mut(), null_mut());
        assert_eq!(event_create(&mut start, 0), 0);
        assert_eq!(event_create(&mut end, 0), 0);
        // Device microseconds one launch takes: the shortest of five. The start event is stamped
        // when it is recorded, the kernel queued a moment later: a launch call slowed by a
        // loaded CPU adds that moment (3.4 us once in CI, 57 us beside a build), never less.
        let timed =
            |f, grid, params: *mut *mut c_void, extra: *mut *mut c_void| -> Result<f64, i32> {
                let mut shortest = f64::MAX;
                for _ in 0..5 {
                    assert_eq!(record(start, null_mut()), 0);
                    let r = launch(f, grid, 1, 1, 128, 1, 1, 0, null_mut(), params, extra);
                    if r != 0 {
                        return Err(r);
                    }
                    assert_eq!(record(end, null_mut()), 0);
                    assert_eq!(event_sync(end), 0);
                    let mut ms = 0f32;
                    assert_eq!(elapsed(&mut ms, start, end), 0);
                    shortest = shortest.min(f64::from(ms) * 1000.0);
                }
                Ok(shortest)
            };
        let near = |us: f64, want: f64| us > want - 2.0 && us < want + 20.0;

        // kernelParams: 265 blocks on 132 SMs run in 3 waves of 100 us.
        let mut flags: u32 = 7;
        let mut ns: u64 = 100_000;
        let mut params = [
            &mut flags as *mut u32 as *mut c_void,
            &mut ns as *mut u64 as *mut c_void,
        ];
        let us = timed(spin, 265, params.as_mut_ptr(), null_mut()).unwrap();
        assert!(near(us, 300.0), "3 waves of 100 us took {us} us");
        let us = timed(spin, 132, params.as_mut_ptr(), null_mut()).unwrap();
        assert!(near(us, 100.0), "one wave took {us} us");

        // The `extra` buffer: the u64 sits at offset 8, after the u32 and its padding.
        let mut buffer = [0u8; 16];
        buffer[8..].copy_from_slice(&200_000u64.to_le_bytes());
        let (mut size, mut too_small): (usize, usize) = (buffer.len(), 12);
        let mut extra_of = |size: &mut usize| {
            [
                cuda_abi::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as *mut c_void,
                buffer.as_mut_ptr() as *mut c_void,
                cuda_abi::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as *mut c_void,
                size as *mut usize as *mut c_void,
                cuda_abi::CU_LAUNCH_PARAM_END_AS_INT as *mut c_void,
            ]
        };
        let mut extra = extra_of(&mut size);
        let mut short = extra_of(&mut too_small);
        let us = timed(spin, 1, null_mut(), extra.as_mut_ptr()).unwrap();
        assert!(
            near(us, 200.0),
            "200 us through the extra buffer took {us} us"
        );

        // Arguments the driver refuses: none, both, a buffer too small for the parameters.
        assert_eq!(timed(spin, 1, null_mut(), null_mut()), Err(1));
        assert_eq!(
            timed(spin, 1, params.as_mut_ptr(), extra.as_mut_ptr()),
            Err(1)
        );
        assert_eq!(timed(spin, 1, null_mut(), short.as_mut_ptr()), Err(1));

        // A fixed cost and no parameters: nothing to pass.
        let us = timed(fixed, 132, null_mut(), null_mut()).unwrap();
        assert!(near(us, 250.0), "took {us} us");

        // A malformed annotation is refused as the driver refuses bad PTX.
        let bad = CString::new(format!("// simgpu-kernel spin block-ns=param5\n{PTX}")).unwrap();
        let mut m2 = null_mut();
        let (code, said) = stderr_of(|| load(&mut m2, bad.as_ptr() as *const c_void));
        assert_eq!(code, 218, "CUDA_ERROR_INVALID_PTX");
        assert!(
            said.contains("PTX refused") && said.contains("block-ns=param5"),
            "the simulator says why: {said:?}"
        );
    }
}
