//! Entry points frameworks (PyTorch) need beyond memory and launches, called directly: stream
//! priorities and flags, capture information and the thread's capture mode, graph nodes and
//! graph memory, VMM handle queries, `cuStreamWriteValue32`, log callbacks, and the features
//! answered NOT_SUPPORTED.

use std::ffi::{c_int, c_uint, c_void};

use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;

/// `CUmemAllocationProp` (cuda.h): 32 bytes, the location at 8.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Prop {
    kind: u32,
    handle_types: u32,
    loc_type: u32,
    loc_id: c_int,
    win32: usize,
    compression: u8,
    rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

#[repr(C)]
struct Access {
    loc_type: u32,
    loc_id: c_int,
    flags: u32,
}

#[test]
fn framework_queries_answer_as_the_driver_documents() {
    let (_dir, lib) = setup(&["--memory", "1GiB"]);
    type P = *mut c_void;
    // SAFETY: every signature below is the one cuda.h declares for that entry point.
    unsafe {
        let core = Core::new(&lib);
        let range: unsafe extern "C" fn(*mut c_int, *mut c_int) -> i32 =
            lib.f("cuCtxGetStreamPriorityRange");
        let create_prio: unsafe extern "C" fn(*mut P, c_uint, c_int) -> i32 =
            lib.f("cuStreamCreateWithPriority");
        let get_prio: unsafe extern "C" fn(P, *mut c_int) -> i32 = lib.f("cuStreamGetPriority");
        let get_flags: unsafe extern "C" fn(P, *mut c_uint) -> i32 = lib.f("cuStreamGetFlags");
        let begin: unsafe extern "C" fn(P, c_uint) -> i32 = lib.f("cuStreamBeginCapture_v2");
        let end: unsafe extern "C" fn(P, *mut P) -> i32 = lib.f("cuStreamEndCapture");
        let info: unsafe extern "C" fn(
            P,
            *mut u32,
            *mut u64,
            *mut P,
            *mut P,
            *mut P,
            *mut usize,
        ) -> i32 = lib.f("cuStreamGetCaptureInfo_v3");
        let exchange: unsafe extern "C" fn(*mut u32) -> i32 =
            lib.f("cuThreadExchangeStreamCaptureMode");
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = lib.f("cuMemAlloc_v2");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let nodes: unsafe extern "C" fn(P, *mut P, *mut usize) -> i32 = lib.f("cuGraphGetNodes");
        let graph_mem: unsafe extern "C" fn(c_int, c_int, *mut u64) -> i32 =
            lib.f("cuDeviceGetGraphMemAttribute");
        let create: unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> i32 =
            lib.f("cuMemCreate");
        let release: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemRelease");
        let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32 =
            lib.f("cuMemAddressReserve");
        let map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32 = lib.f("cuMemMap");
        let unmap: unsafe extern "C" fn(u64, usize) -> i32 = lib.f("cuMemUnmap");
        let set_access: unsafe extern "C" fn(u64, usize, *const Access, usize) -> i32 =
            lib.f("cuMemSetAccess");
        let retain_handle: unsafe extern "C" fn(*mut u64, P) -> i32 =
            lib.f("cuMemRetainAllocationHandle");
        let props: unsafe extern "C" fn(*mut Prop, u64) -> i32 =
            lib.f("cuMemGetAllocationPropertiesFromHandle");
        let mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            lib.f("cuMemGetInfo_v2");
        let write32: unsafe extern "C" fn(P, u64, u32, c_uint) -> i32 =
            lib.f("cuStreamWriteValue32_v2");
        let dtoh: unsafe extern "C" fn(P, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");
        type LogCb = unsafe extern "C" fn(P, c_uint, *mut i8, usize);
        let logs_register: unsafe extern "C" fn(Option<LogCb>, P, *mut P) -> i32 =
            lib.f("cuLogsRegisterCallback");
        let logs_unregister: unsafe extern "C" fn(P) -> i32 = lib.f("cuLogsUnregisterCallback");
        let multicast: unsafe extern "C" fn(*mut u64, P) -> i32 = lib.f("cuMulticastCreate");
        let green: unsafe extern "C" fn(c_int, P, c_uint) -> i32 = lib.f("cuDeviceGetDevResource");

        assert_eq!((core.init)(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!((core.retain)(&mut ctx, 0), 0);
        assert_eq!((core.set_current)(ctx), 0);

        // Stream priorities: an H100's range; out of range is clamped; flags kept.
        let (mut least, mut greatest) = (9, 9);
        assert_eq!(range(&mut least, &mut greatest), 0);
        assert_eq!((least, greatest), (0, -5));
        assert_eq!(
            range(std::ptr::null_mut(), &mut greatest),
            0,
            "NULL is allowed"
        );
        let mut s = std::ptr::null_mut();
        assert_eq!(create_prio(&mut s, 1, -100), 0);
        let (mut prio, mut flags) = (0, 0);
        assert_eq!(get_prio(s, &mut prio), 0);
        assert_eq!(prio, -5, "clamped to the greatest priority");
        assert_eq!(get_flags(s, &mut flags), 0);
        assert_eq!(flags, 1, "CU_STREAM_NON_BLOCKING");
        assert_eq!(get_prio(std::ptr::null_mut(), &mut prio), 0);
        assert_eq!(prio, 0, "the default stream");

        // Capture information; during a global-mode capture cuMemAlloc is refused (and the
        // capture invalidated) unless this thread is in relaxed mode.
        let (mut st, mut id) = (9u32, 0u64);
        let n: *mut P = std::ptr::null_mut();
        let z: P = std::ptr::null_mut();
        assert_eq!(info(s, &mut st, &mut id, n, n, n, n as _), 0);
        assert_eq!(st, 0, "not capturing");
        assert_eq!(begin(s, 0), 0);
        let mut count = 7usize;
        assert_eq!(info(s, &mut st, &mut id, n, n, n, &mut count), 0);
        assert_eq!((st, count), (1, 0), "capturing, no dependencies exposed");
        assert!(id != 0);
        let first = id;
        let mut mode = 2u32; // relaxed
        assert_eq!(exchange(&mut mode), 0);
        assert_eq!(mode, 0, "the thread was in global mode");
        let mut p = 0u64;
        assert_eq!(alloc(&mut p, MIB), 0, "allowed in relaxed mode");
        assert_eq!(free(p), 0);
        mode = 0;
        assert_eq!(exchange(&mut mode), 0);
        assert_eq!(mode, 2);
        let mut g = std::ptr::null_mut();
        assert_eq!(end(s, &mut g), 0, "the capture is still valid");
        let mut total = 5usize;
        assert_eq!(nodes(g, std::ptr::null_mut(), &mut total), 0);
        assert_eq!(total, 0, "nothing was captured");
        assert_eq!(begin(s, 0), 0);
        assert_eq!(info(s, &mut st, &mut id, n, n, n, n as _), 0);
        assert!(id != first, "each capture has its own id");
        assert_eq!(
            alloc(&mut p, MIB),
            900,
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in global mode"
        );
        assert_eq!(end(s, &mut g), 901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");

        let mut v = 9u64;
        assert_eq!(graph_mem(0, 2, &mut v), 0);
        assert_eq!(v, 0, "no graph holds memory");
        assert_eq!(graph_mem(0, 7, &mut v), 1, "an unknown attribute");

        // VMM: a retained handle keeps its memory past the mapping's release; properties as made.
        let prop = Prop {
            kind: 1,
            handle_types: 1,
            loc_type: 1,
            ..Prop::default()
        };
        let size = 2 * MIB;
        let (mut free0, mut total0) = (0, 0);
        assert_eq!(mem_info(&mut free0, &mut total0), 0);
        let (mut h, mut va) = (0u64, 0u64);
        assert_eq!(create(&mut h, size, &prop, 0), 0);
        assert_eq!(reserve(&mut va, size, 0, 0, 0), 0);
        assert_eq!(map(va, size, 0, h, 0), 0);
        let access = Access {
            loc_type: 1,
            loc_id: 0,
            flags: 3,
        };
        assert_eq!(set_access(va, size, &access, 1), 0);
        assert_eq!(release(h), 0, "the mapping keeps it");
        let mut r = 0u64;
        assert_eq!(
            retain_handle(&mut r, (va + 4096) as P),
            0,
            "any address inside"
        );
        assert_eq!(r, h);
        assert_eq!(
            retain_handle(&mut r, (va + size as u64) as P),
            1,
            "past the mapping"
        );
        let mut got = Prop::default();
        assert_eq!(props(&mut got, h), 0);
        assert_eq!(
            (got.kind, got.handle_types, got.loc_type, got.loc_id),
            (1, 1, 1, 0)
        );

        // cuStreamWriteValue32: the word is written; 4-byte alignment and known flags only.
        assert_eq!(write32(s, va + 8, 0xabcd_1234, 0), 0);
        let mut word = 0u32;
        assert_eq!(dtoh(&mut word as *mut u32 as P, va + 8, 4), 0);
        assert_eq!(word, 0xabcd_1234);
        assert_eq!(write32(s, va + 2, 1, 0), 1, "misaligned");
        assert_eq!(write32(s, va, 1, 4), 1, "unknown flags");

        assert_eq!(unmap(va, size), 0);
        let (mut free1, mut t) = (0, 0);
        assert_eq!(mem_info(&mut free1, &mut t), 0);
        assert_eq!(
            free0 - free1,
            size,
            "the retained handle still holds its memory"
        );
        assert_eq!(release(h), 0, "giving back the retained reference");
        assert_eq!(mem_info(&mut free1, &mut t), 0);
        assert_eq!(free1, free0, "released and unmapped: gone");
        assert_eq!(release(h), 1, "nothing left to release");

        // Log callbacks are accepted and given back once; features not modelled say so.
        unsafe extern "C" fn cb(_: P, _: c_uint, _: *mut i8, _: usize) {}
        let mut lh = std::ptr::null_mut();
        assert_eq!(logs_register(None, z, &mut lh), 1);
        assert_eq!(logs_register(Some(cb), z, &mut lh), 0);
        assert!(!lh.is_null());
        assert_eq!(logs_unregister(lh), 0);
        assert_eq!(logs_unregister(lh), 1);
        let mut mc = 0u64;
        assert_eq!(multicast(&mut mc, z), 801, "CUDA_ERROR_NOT_SUPPORTED");
        assert_eq!(green(0, z, 1), 801);
    }
}
