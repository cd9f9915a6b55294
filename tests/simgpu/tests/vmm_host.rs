//! Host-located VMM memory (`cuMemCreate` for a host location, as NCCL's shared-memory transport
//! makes its buffers), through the entry points directly: it takes no device memory; cuMemMap
//! maps it into the device address space, where the CPU may touch it once cuMemSetAccess gives a
//! host location access; copies, memsets and pointer queries work on it; an exported descriptor
//! imports as the same bytes; cuMemUnmap puts the PROT_NONE reservation back, and a new
//! cuMemMap there works. The protections are read from /proc/self/maps, never by faulting.

use std::ffi::{c_uint, c_void};

use cuda_abi::{
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEM_LOCATION_TYPE_HOST_NUMA, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation,
};
use cuslice_test_harness::direct::*;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const FD: c_uint = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// The permissions (`rw-s`, `---p`, ...) of the mapping of this process that holds `addr`.
fn perms(addr: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).unwrap(),
            u64::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            return perms.to_string();
        }
    }
    panic!("{addr:#x} is not mapped at all");
}

/// How many of this process's mappings and descriptors are simgpu's host memory files.
fn host_files() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps.matches("simgpu-host-memory").count();
    let open = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("simgpu-host-memory"))
        .count();
    mapped + open
}

fn access(type_: u32, id: i32, flags: u32) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation { type_, id },
        flags,
    }
}

#[test]
fn host_located_vmm_memory_is_host_memory_the_cpu_and_an_importer_share() {
    let (_dir, lib) = setup(&["--memory", "1GiB", "--context-overhead", "100MiB"]);
    // SAFETY: every signature below is the one cuda.h declares for that entry point; the
    // pointers the CPU touches are host memory mapped read-write for it, as /proc/self/maps
    // confirms first.
    unsafe {
        let Core {
            init,
            retain,
            set_current,
            ..
        } = Core::new(&lib);
        let mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            lib.f("cuMemGetInfo_v2");
        let create: unsafe extern "C" fn(*mut u64, usize, *const CUmemAllocationProp, u64) -> i32 =
            lib.f("cuMemCreate");
        let release: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemRelease");
        let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32 =
            lib.f("cuMemAddressReserve");
        let address_free: unsafe extern "C" fn(u64, usize) -> i32 = lib.f("cuMemAddressFree");
        let map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32 = lib.f("cuMemMap");
        let unmap: unsafe extern "C" fn(u64, usize) -> i32 = lib.f("cuMemUnmap");
        let set_access: unsafe extern "C" fn(u64, usize, *const CUmemAccessDesc, usize) -> i32 =
            lib.f("cuMemSetAccess");
        let export: unsafe extern "C" fn(*mut c_void, u64, c_uint, u64) -> i32 =
            lib.f("cuMemExportToShareableHandle");
        let import: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> i32 =
            lib.f("cuMemImportFromShareableHandle");
        let properties: unsafe extern "C" fn(*mut CUmemAllocationProp, u64) -> i32 =
            lib.f("cuMemGetAllocationPropertiesFromHandle");
        let attribute: unsafe extern "C" fn(*mut c_void, c_uint, u64) -> i32 =
            lib.f("cuPointerGetAttribute");
        let range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> i32 =
            lib.f("cuMemGetAddressRange_v2");
        let memset: unsafe extern "C" fn(u64, u8, usize) -> i32 = lib.f("cuMemsetD8_v2");
        let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> i32 = lib.f("cuMemcpyHtoD_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = lib.f("cuMemcpyDtoH_v2");

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

        // Made, more of it than the device holds: none of it counts there.
        let mut prop: CUmemAllocationProp = std::mem::zeroed();
        prop.type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = FD;
        prop.location = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
            id: 0,
        };
        let mut big = 0;
        assert_eq!(create(&mut big, 2 * GIB, &prop, 0), 0);
        assert_eq!(release(big), 0);
        let size = 4 * MIB;
        let mut h = 0;
        assert_eq!(create(&mut h, size, &prop, 0), 0);
        assert_eq!(
            free_now(),
            before,
            "host-located memory counted on the device"
        );
        let mut got: CUmemAllocationProp = std::mem::zeroed();
        assert_eq!(properties(&mut got, h), 0);
        assert_eq!(
            (got.location.type_, got.location.id),
            (CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)
        );

        // Mapped: the CPU may not touch it until cuMemSetAccess gives a host location access.
        let mut va = 0u64;
        assert_eq!(reserve(&mut va, 2 * size, 0, 0, 0), 0);
        assert_eq!(perms(va), "---p", "a reservation is PROT_NONE");
        assert_eq!(map(va, size, 0, h, 0), 0);
        assert_eq!(perms(va), "---s", "mapped, not yet accessible to the CPU");
        let device = access(
            CU_MEM_LOCATION_TYPE_DEVICE,
            0,
            CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        );
        let cpu = access(
            CU_MEM_LOCATION_TYPE_HOST_NUMA,
            0,
            CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        );
        assert_eq!(set_access(va, size, &device, 1), 0);
        assert_eq!(perms(va), "---s", "device access alone");
        assert_eq!(set_access(va, size, [device, cpu].as_ptr(), 2), 0);
        assert_eq!(perms(va), "rw-s");
        assert_eq!(perms(va + size as u64), "---p", "the rest stays reserved");
        assert_eq!(
            set_access(va, size, &access(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0, 2), 1),
            1,
            "unknown access flags: CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(
            set_access(
                va,
                size,
                &access(
                    CU_MEM_LOCATION_TYPE_DEVICE,
                    7,
                    CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                ),
                1
            ),
            101,
            "no device 7: CUDA_ERROR_INVALID_DEVICE"
        );

        // The CPU and the driver's copies and memsets see the same bytes.
        let p = va as *mut u8;
        std::ptr::write_bytes(p, 0x11, size);
        let mut back = [0u8; 16];
        assert_eq!(dtoh(back.as_mut_ptr().cast(), va + 100, 16), 0);
        assert_eq!(back, [0x11; 16]);
        assert_eq!(memset(va + 4096, 0x22, 4096), 0);
        assert_eq!(
            (*p.add(4095), *p.add(4096), *p.add(8191)),
            (0x11, 0x22, 0x22)
        );
        let pattern = [7u8, 1, 2, 3, 4, 5, 6, 9];
        assert_eq!(htod(va + 2 * MIB as u64, pattern.as_ptr().cast(), 8), 0);
        assert_eq!(std::slice::from_raw_parts(p.add(2 * MIB), 8), pattern);
        assert_eq!(
            dtoh(back.as_mut_ptr().cast(), va + size as u64 - 8, 16),
            1,
            "a copy past the mapping: CUDA_ERROR_INVALID_VALUE"
        );

        // Pointer queries: host memory, the mapping its range.
        let mut memory_type = 0u32;
        assert_eq!(attribute((&raw mut memory_type).cast(), 2, va + 100), 0);
        assert_eq!(memory_type, 1, "CU_MEMORYTYPE_HOST");
        let mut host_pointer = 0u64;
        assert_eq!(attribute((&raw mut host_pointer).cast(), 4, va + 100), 0);
        assert_eq!(host_pointer, va + 100);
        let (mut base, mut len) = (0u64, 0usize);
        assert_eq!(range(&mut base, &mut len, va + 100), 0);
        assert_eq!((base, len), (va, size));

        // Exported and imported (here in the same process): a second handle, mapped elsewhere,
        // on the same bytes, each side seeing what the other writes.
        let mut fd: i32 = -1;
        assert_eq!(export((&raw mut fd).cast(), h, FD, 0), 0);
        let mut h2 = 0;
        assert_eq!(import(&mut h2, fd as usize as *mut c_void, FD), 0);
        assert_ne!(h2, h);
        assert_eq!(properties(&mut got, h2), 0);
        assert_eq!(got.location.type_, CU_MEM_LOCATION_TYPE_HOST_NUMA);
        let mut va2 = 0u64;
        assert_eq!(reserve(&mut va2, size, 0, 0, 0), 0);
        assert_eq!(map(va2, size, 0, h2, 0), 0);
        assert_eq!(set_access(va2, size, [device, cpu].as_ptr(), 2), 0);
        let p2 = va2 as *mut u8;
        assert_eq!((*p2, *p2.add(4096)), (0x11, 0x22));
        assert_eq!(std::slice::from_raw_parts(p2.add(2 * MIB), 8), pattern);
        *p2 = 0x33;
        assert_eq!(*p, 0x33, "the importer's write is the exporter's byte");
        *p.add(size - 1) = 0x44;
        assert_eq!(*p2.add(size - 1), 0x44);
        assert_eq!(free_now(), before, "importing counts nothing");

        // Descriptors that are no export: CUDA_ERROR_INVALID_VALUE.
        let junk = libc::memfd_create(c"junk".as_ptr(), 0);
        assert_eq!(libc::write(junk, [0xabu8; 64].as_ptr().cast(), 64), 64);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        let mut h3 = 0;
        for bad in [junk, null, -1] {
            assert_eq!(import(&mut h3, bad as isize as *mut c_void, FD), 1, "{bad}");
        }
        libc::close(junk);
        libc::close(null);

        // Unmapped: the addresses are PROT_NONE and reserved again, and can be mapped again;
        // the memory lives on while the handle does.
        assert_eq!(unmap(va, size), 0);
        assert_eq!(perms(va), "---p");
        assert_eq!(map(va, size, 0, h, 0), 0);
        assert_eq!(set_access(va, size, &cpu, 1), 0);
        assert_eq!((*p, *p.add(4096), *p.add(size - 1)), (0x33, 0x22, 0x44));
        // At an offset: the second granule at the reservation's second half.
        assert_eq!(map(va + size as u64, 2 * MIB, 2 * MIB, h, 0), 0);
        assert_eq!(set_access(va + size as u64, 2 * MIB, &cpu, 1), 0);
        assert_eq!(
            std::slice::from_raw_parts(p.add(size), 8),
            pattern,
            "offset 2 MiB of the handle"
        );
        assert_eq!(unmap(va + size as u64, 2 * MIB), 0);

        // Released while mapped: it stays until unmapped, in each process's view.
        assert_eq!(release(h), 0);
        assert_eq!(*p2, 0x33);
        assert_eq!(unmap(va, size), 0);
        assert_eq!(unmap(va2, size), 0);
        assert_eq!(release(h2), 0);
        assert_eq!((perms(va), perms(va2)), ("---p".into(), "---p".into()));
        libc::close(fd);
        assert_eq!(host_files(), 0, "a host memory file outlived its handles");
        assert_eq!(address_free(va, 2 * size), 0);
        assert_eq!(address_free(va2, size), 0);
        assert_eq!(free_now(), before);
    }
}
