//! cuMemcpyPeer and cuMemcpyPeerAsync (and their `_ptds`/`_ptsz` variants), called directly: a
//! copy between two devices' memory arrives byte for byte, at any offset and across granules,
//! with no peer access enabled (the devices here cannot reach each other, and the real driver
//! stages such a copy through the host); it takes and gives back nothing on either device; and
//! the driver's refusals are the real ones: a context that is not a live context of the process
//! is CUDA_ERROR_INVALID_CONTEXT, a range that is not device memory of its context's device is
//! CUDA_ERROR_INVALID_VALUE, and a refused copy writes nothing.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;
const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
const NOT_INITIALIZED: i32 = 3;
const INVALID_CONTEXT: i32 = 201;
const INVALID_HANDLE: i32 = 400;
const PEER_ACCESS_UNSUPPORTED: i32 = 217;

type Ctx = *mut c_void;
type Peer = unsafe extern "C" fn(u64, Ctx, u64, Ctx, usize) -> i32;
type PeerAsync = unsafe extern "C" fn(u64, Ctx, u64, Ctx, usize, *mut c_void) -> i32;

/// A byte pattern with no period a misplaced granule or page could hide behind.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn peer_copies_move_bytes_between_devices_and_refuse_as_the_driver_does() {
    let (_dir, lib) = setup(&["--devices", "2", "--memory", "1GiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            ..
        } = Core::new(&lib);
        let peer: Peer = lib.f("cuMemcpyPeer");
        let peer_ptds: Peer = lib.f("cuMemcpyPeer_ptds");
        let peer_async: PeerAsync = lib.f("cuMemcpyPeerAsync");
        let peer_async_ptsz: PeerAsync = lib.f("cuMemcpyPeerAsync_ptsz");
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> i32 = lib.f("cuMemcpyHtoD_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        let memset8: unsafe extern "C" fn(u64, u8, usize) -> i32 = lib.f("cuMemsetD8_v2");
        let mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            lib.f("cuMemGetInfo_v2");
        let ctx_create: unsafe extern "C" fn(*mut Ctx, c_uint, c_int) -> i32 =
            lib.f("cuCtxCreate_v2");
        let ctx_destroy: unsafe extern "C" fn(Ctx) -> i32 = lib.f("cuCtxDestroy_v2");
        let enable_peer: unsafe extern "C" fn(Ctx, c_uint) -> i32 = lib.f("cuCtxEnablePeerAccess");
        let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 =
            lib.f("cuStreamCreate");
        let stream_sync: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuStreamSynchronize");
        let stream_destroy: unsafe extern "C" fn(*mut c_void) -> i32 = lib.f("cuStreamDestroy_v2");
        let gpa: unsafe extern "C" fn(
            *const c_char,
            *mut *mut c_void,
            c_int,
            u64,
            *mut c_int,
        ) -> i32 = lib.f("cuGetProcAddress_v2");

        assert_eq!(
            peer(0, std::ptr::null_mut(), 0, std::ptr::null_mut(), 8),
            NOT_INITIALIZED,
            "before cuInit"
        );
        assert_eq!(init(0), SUCCESS);

        // cuGetProcAddress hands out the same entry points dlsym finds.
        let resolve = |name: &str, version: c_int, flags: u64| {
            let c = CString::new(name).unwrap();
            let mut p = std::ptr::null_mut();
            let mut found = -1;
            assert_eq!(
                gpa(c.as_ptr(), &mut p, version, flags, &mut found),
                0,
                "{name}"
            );
            assert_eq!(found, 0, "{name} at {version}, flags {flags}");
            p
        };
        for (name, version, flags, export) in [
            ("cuMemcpyPeer", 4000, 0, "cuMemcpyPeer"),
            ("cuMemcpyPeer", 13000, 2, "cuMemcpyPeer_ptds"),
            ("cuMemcpyPeerAsync", 12090, 0, "cuMemcpyPeerAsync"),
            ("cuMemcpyPeerAsync", 7000, 2, "cuMemcpyPeerAsync_ptsz"),
        ] {
            assert_eq!(
                resolve(name, version, flags),
                lib.sym(export),
                "{name} at {version}, flags {flags}"
            );
        }

        let (mut c0, mut c1) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(retain(&mut c0, 0), SUCCESS);
        assert_eq!(retain(&mut c1, 1), SUCCESS);
        // PCIe cards without peer access: nothing enables it, and no copy below needs it.
        assert_eq!(set_current(c0), SUCCESS);
        assert_eq!(enable_peer(c1, 0), PEER_ACCESS_UNSUPPORTED);

        // 6 MiB on each device: three 2 MiB granules, so copies cross granule bounds.
        let len = 6 * MIB;
        let (mut a, mut a2, mut b) = (0u64, 0u64, 0u64);
        assert_eq!(alloc(&mut a, len), SUCCESS);
        assert_eq!(alloc(&mut a2, len), SUCCESS);
        assert_eq!(set_current(c1), SUCCESS);
        assert_eq!(alloc(&mut b, len), SUCCESS);
        let src = pattern(len, 7);
        assert_eq!(htod(a, src.as_ptr().cast(), len), SUCCESS);
        assert_eq!(memset8(b, 0, len), SUCCESS);
        let read = |p: u64| {
            let mut back = vec![0xeeu8; len];
            assert_eq!(dtoh(back.as_mut_ptr().cast(), p, len), SUCCESS);
            back
        };
        let free_on = |ctx: Ctx| {
            assert_eq!(set_current(ctx), SUCCESS);
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(mem_info(&mut f, &mut t), SUCCESS);
            f
        };
        // A second context on device 0 and a stream, made before what is free is read.
        let mut other = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut other, 0, 0), SUCCESS);
        assert_eq!(set_current(c0), SUCCESS);
        let mut s0 = std::ptr::null_mut();
        assert_eq!(stream_create(&mut s0, 0), SUCCESS);
        let free_before = (free_on(c0), free_on(c1));

        // Device 0 to device 1 at odd offsets, with device 1's context current.
        let (from, to, n) = (1001usize, 4099usize, len - 5000);
        assert_eq!(
            peer(b + to as u64, c1, a + from as u64, c0, n),
            SUCCESS,
            "cuMemcpyPeer"
        );
        let got = read(b);
        assert!(got[..to].iter().all(|&x| x == 0), "bytes before the copy");
        assert!(got[to..to + n] == src[from..from + n], "the copied bytes");
        assert!(
            got[to + n..].iter().all(|&x| x == 0),
            "bytes after the copy"
        );

        // Back again, whole, with each variant: device 1 to device 0 (no context current, as
        // the call needs none), and device 0 to device 0 between two contexts' views of it.
        assert_eq!(peer(b, c1, a, c0, len), SUCCESS);
        for (variant, f) in [("cuMemcpyPeer", peer), ("cuMemcpyPeer_ptds", peer_ptds)] {
            assert_eq!(set_current(c0), SUCCESS);
            assert_eq!(memset8(a2, 0, len), SUCCESS);
            assert_eq!(set_current(std::ptr::null_mut()), SUCCESS);
            assert_eq!(f(a2, c0, b, c1, len), SUCCESS, "{variant}");
            assert_eq!(set_current(c0), SUCCESS);
            assert!(read(a2) == src, "{variant}: device 1 to device 0");
        }
        assert_eq!(set_current(other), SUCCESS);
        assert_eq!(memset8(a2, 0, len), SUCCESS);
        assert_eq!(
            peer(a2, other, a, c0, len),
            SUCCESS,
            "memory of another context on the context's device"
        );
        assert!(read(a2) == src, "device 0 to device 0");

        // The stream-ordered variants: a stream, and the default streams.
        assert_eq!(set_current(c0), SUCCESS);
        for (variant, f, stream) in [
            ("cuMemcpyPeerAsync on a stream", peer_async, s0),
            (
                "cuMemcpyPeerAsync, NULL stream",
                peer_async,
                std::ptr::null_mut(),
            ),
            (
                "cuMemcpyPeerAsync_ptsz, per-thread stream",
                peer_async_ptsz,
                std::ptr::null_mut(),
            ),
        ] {
            assert_eq!(memset8(a2, 0, len), SUCCESS);
            assert_eq!(f(a2, c0, b, c1, len, stream), SUCCESS, "{variant}");
            assert_eq!(stream_sync(stream), SUCCESS, "{variant}");
            assert!(read(a2) == src, "{variant}");
        }

        // Nothing was taken or given back on either device.
        assert_eq!(
            (free_on(c0), free_on(c1)),
            free_before,
            "free memory of devices 0 and 1 after the copies"
        );

        // Refusals, each leaving the destination as it was.
        assert_eq!(set_current(c0), SUCCESS);
        assert_eq!(memset8(a2, 0x33, len), SUCCESS);
        let mut host = vec![0u8; len];
        let host_p = host.as_mut_ptr() as u64;
        let mut dead = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut dead, 0, 1), SUCCESS);
        assert_eq!(ctx_destroy(dead), SUCCESS);
        assert_eq!(set_current(c0), SUCCESS);
        let null = std::ptr::null_mut();
        let bogus = 0xdead_beef_usize as Ctx;
        let mut freed = 0u64;
        assert_eq!(alloc(&mut freed, MIB), SUCCESS);
        assert_eq!(free(freed), SUCCESS);
        let cases: [(&str, u64, Ctx, u64, Ctx, usize, i32); 13] = [
            (
                "a NULL destination context",
                a2,
                null,
                b,
                c1,
                len,
                INVALID_CONTEXT,
            ),
            (
                "a NULL source context",
                a2,
                c0,
                b,
                null,
                len,
                INVALID_CONTEXT,
            ),
            (
                "a handle that is no context",
                a2,
                bogus,
                b,
                c1,
                len,
                INVALID_CONTEXT,
            ),
            ("a destroyed context", a2, c0, b, dead, len, INVALID_CONTEXT),
            (
                "no bytes, a NULL context",
                a2,
                c0,
                b,
                null,
                0,
                INVALID_CONTEXT,
            ),
            (
                "the destination on the other device",
                a2,
                c1,
                b,
                c1,
                len,
                INVALID_VALUE,
            ),
            (
                "the source on the other device",
                a2,
                c0,
                b,
                c0,
                len,
                INVALID_VALUE,
            ),
            ("a host destination", host_p, c0, b, c1, len, INVALID_VALUE),
            ("a host source", a2, c0, host_p, c1, len, INVALID_VALUE),
            ("a NULL source", a2, c0, 0, c1, len, INVALID_VALUE),
            (
                "a source past its allocation",
                a2,
                c0,
                b + 1,
                c1,
                len,
                INVALID_VALUE,
            ),
            ("a freed destination", freed, c0, b, c1, MIB, INVALID_VALUE),
            (
                "a range that wraps around",
                a2,
                c0,
                b,
                c1,
                usize::MAX,
                INVALID_VALUE,
            ),
        ];
        for (what, dst, dctx, src_p, sctx, n, want) in cases {
            assert_eq!(
                peer(dst, dctx, src_p, sctx, n),
                want,
                "cuMemcpyPeer: {what}"
            );
            assert_eq!(
                peer_async(dst, dctx, src_p, sctx, n, s0),
                want,
                "cuMemcpyPeerAsync: {what}"
            );
        }
        assert_eq!(peer(a2, c0, b, c1, 0), SUCCESS, "no bytes");
        assert_eq!(
            peer_async(a2, c0, b, c1, len, 0x1234 as *mut c_void),
            INVALID_HANDLE,
            "a handle that is no stream"
        );
        assert_eq!(set_current(std::ptr::null_mut()), SUCCESS);
        assert_eq!(
            peer_async(a2, c0, b, c1, len, std::ptr::null_mut()),
            INVALID_CONTEXT,
            "the NULL stream with no context current"
        );
        assert_eq!(set_current(c0), SUCCESS);
        assert!(
            read(a2).iter().all(|&x| x == 0x33),
            "a refused copy wrote to its destination"
        );
        assert!(
            host.iter().all(|&x| x == 0),
            "a refused copy wrote to the host"
        );

        assert_eq!(stream_destroy(s0), SUCCESS);
        assert_eq!(ctx_destroy(other), SUCCESS);
        assert_eq!(set_current(c0), SUCCESS);
        assert_eq!(free(a), SUCCESS);
        assert_eq!(free(a2), SUCCESS);
        assert_eq!(set_current(c1), SUCCESS);
        assert_eq!(free(b), SUCCESS);
    }
}
