//! Memory read-back as the driver does it: cuMemGetInfo with either out-pointer NULL, and a
//! default pool (release threshold 0) giving its memory back at a synchronisation.

use std::ffi::{c_uint, c_void};
use std::ptr::null_mut;

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
/// CU_MEMPOOL_ATTR_RELEASE_THRESHOLD and CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT.
const RELEASE_THRESHOLD: c_uint = 4;
const RESERVED_MEM_CURRENT: c_uint = 5;

#[test]
fn mem_get_info_takes_either_pointer_null_and_the_default_pool_releases_at_sync() {
    let (_dir, lib) = setup(&["--memory", "1GiB", "--context-overhead", "100MiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let core = Core::new(&lib);
        let info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 = lib.f("cuMemGetInfo_v2");
        let info_v1: unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> i32 = lib.f("cuMemGetInfo");
        let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 =
            lib.f("cuStreamCreate");
        let stream_sync: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuStreamSynchronize");
        let alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> i32 =
            lib.f("cuMemAllocAsync");
        let free_async: unsafe extern "C" fn(u64, *mut c_void) -> i32 = lib.f("cuMemFreeAsync");
        let default_pool: unsafe extern "C" fn(*mut *mut c_void, i32) -> i32 =
            lib.f("cuDeviceGetDefaultMemPool");
        let pool_get: unsafe extern "C" fn(*mut c_void, c_uint, *mut c_void) -> i32 =
            lib.f("cuMemPoolGetAttribute");

        assert_eq!((core.init)(0), 0);
        let mut ctx = null_mut();
        assert_eq!((core.retain)(&mut ctx, 0), 0);
        assert_eq!((core.set_current)(ctx), 0);

        let (mut free, mut total) = (0usize, 0usize);
        assert_eq!(info(&mut free, &mut total), 0);
        assert_eq!((free, total), (GIB - 100 * MIB, GIB));
        let (mut only_free, mut only_total) = (0usize, 0usize);
        assert_eq!(info(&mut only_free, null_mut()), 0, "(&free, NULL)");
        assert_eq!(info(null_mut(), &mut only_total), 0, "(NULL, &total)");
        assert_eq!((only_free, only_total), (free, total));
        assert_eq!(info(null_mut(), null_mut()), 0, "(NULL, NULL)");
        let mut v1_total: c_uint = 0;
        assert_eq!(info_v1(null_mut(), &mut v1_total), 0, "v1 (NULL, &total)");
        assert_eq!(v1_total as usize, GIB);

        // The default pool: threshold 0, so a free and a synchronisation give it all back.
        let mut pool = null_mut();
        assert_eq!(default_pool(&mut pool, 0), 0);
        let attr = |a: c_uint| {
            let mut v = u64::MAX;
            assert_eq!(pool_get(pool, a, (&raw mut v).cast()), 0);
            v
        };
        assert_eq!(attr(RELEASE_THRESHOLD), 0);
        let mut stream = null_mut();
        assert_eq!(stream_create(&mut stream, 0), 0);
        let mut p = 0u64;
        assert_eq!(alloc_async(&mut p, 256 * MIB, stream), 0);
        assert_eq!(stream_sync(stream), 0);
        assert_eq!(attr(RESERVED_MEM_CURRENT), 256 * MIB as u64);
        assert_eq!(free_async(p, stream), 0);
        assert_eq!(stream_sync(stream), 0);
        assert_eq!(attr(RESERVED_MEM_CURRENT), 0);
        assert_eq!(info(&mut only_free, null_mut()), 0);
        assert_eq!(only_free, free, "free after the pool released its memory");
    }
}
