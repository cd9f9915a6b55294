//! Memory shared between processes, and the peer queries, the ways multi-process jobs (NCCL,
//! vLLM, torchrun) make them:
//! - `export --via ipc`: cuMemAlloc, filled with a pattern, and its cuIpcGetMemHandle (the 64
//!   bytes printed in hex);
//! - `export --via fd`: cuMemCreate (exportable as a POSIX file descriptor), mapped here,
//!   filled, and cuMemExportToShareableHandle; the pid and descriptor are printed. Located on
//!   the device, or with `--location host` in host memory as NCCL's shared-memory buffers are
//!   (mapped for the device and the CPU, and filled by the CPU through the mapped pointer);
//! - `import`: opens what an `exported` line names (cuIpcOpenMemHandle, or the exporter's
//!   descriptor taken with pidfd_getfd as NCCL's cuMem transport does, then
//!   cuMemImportFromShareableHandle and a mapping of its own), reads the pattern back (host
//!   memory also through its own mapped pointer) and writes another over the first bytes
//!   (host memory with the CPU), which the exporter reads once stdin closes (`written_back` in
//!   its `released` line);
//! - `peers`: every pair of devices: cuDeviceCanAccessPeer, the P2P attributes and
//!   cuCtxEnablePeerAccess between their primary contexts, then a pattern copied from each device
//!   to each other (cuMemcpyPeer, then cuMemcpyPeerAsync and a stream synchronisation) and read
//!   back, as frameworks move tensors between ranks' devices.
//!
//! Export and import hold until stdin reaches EOF, then undo what they did.

use std::ptr::null_mut;

use clap::{Args, ValueEnum};
use cuda_abi::*;
use serde_json::{Value, json};

use crate::driver::{CuError, Driver};
use crate::out::emit;
use crate::scenarios::{Failure, Session};

/// What every exported byte is set to.
const PATTERN: u8 = 0x5a;
/// What an importer writes over the first `PROBE` bytes, for the exporter to read.
const WRITE_BACK: u8 = 0xa5;
/// What an importer reads back: the first and last this many bytes.
const PROBE: usize = 4096;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, what frameworks open IPC handles with.
const LAZY_ENABLE_PEER_ACCESS: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShareVia {
    /// cuIpcGetMemHandle / cuIpcOpenMemHandle of a cuMemAlloc allocation
    Ipc,
    /// cuMemExportToShareableHandle / cuMemImportFromShareableHandle of a cuMemCreate handle
    /// (POSIX file descriptor)
    Fd,
}

/// Where `export --via fd` makes its memory (`CUmemAllocationProp::location`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShareLocation {
    /// On --device (counted there)
    Device,
    /// In host memory (a host NUMA node), mapped for --device and for the CPU, as NCCL's
    /// shared-memory transport makes its buffers
    Host,
}

#[derive(Clone, Debug, Args)]
pub struct ExportArgs {
    /// How the memory is shared
    #[arg(long, value_enum)]
    pub via: ShareVia,
    /// Where the memory is (--via fd only)
    #[arg(long, value_enum, default_value = "device")]
    pub location: ShareLocation,
    /// Bytes to export (rounded up to the allocation granularity with --via fd)
    #[arg(long, value_parser = crate::scenarios::parse_size, default_value = "64MiB")]
    pub bytes: u64,
}

#[derive(Clone, Debug, Args)]
pub struct PeersArgs {
    /// Bytes of each peer copy, one from every device to every other (0: no copies)
    #[arg(long, value_parser = crate::scenarios::parse_size, default_value = "8MiB")]
    pub copy_bytes: u64,
    /// Stop twice on stdin, so that what each device holds can be read before and after the
    /// copies: once their buffers are made and the patterns written (a `peer_buffers` line; a
    /// line on stdin goes on), and after the `peers` line (EOF frees and ends)
    #[arg(long)]
    pub hold: bool,
}

#[derive(Clone, Debug, Args)]
pub struct ImportArgs {
    /// The exporter's `exported` line (JSON), as it printed it
    #[arg(long)]
    pub from: String,
}

/// A VMM mapping of this process.
struct Mapping {
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
}

fn location(dev: CUdevice) -> CUmemLocation {
    CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    }
}

/// Host NUMA node 0, where NCCL makes its host buffers on a one-node machine.
const HOST_NODE: CUmemLocation = CUmemLocation {
    type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
    id: 0,
};

/// Reserves an address range for `handle` and maps it read-write for `dev`, and with `cpu` for
/// the CPU too (host memory, as NCCL maps it: the CPU may not touch it at the mapped address
/// otherwise).
fn map(
    d: &Driver,
    handle: CUmemGenericAllocationHandle,
    size: usize,
    dev: CUdevice,
    cpu: bool,
) -> Result<Mapping, CuError> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: out-pointer to a local; no fixed address, default alignment.
    unsafe { d.cuMemAddressReserve(&mut ptr, size, 0, 0, 0) }?;
    // SAFETY: maps the whole handle at offset 0 onto the whole reserved range.
    unsafe { d.cuMemMap(ptr, size, 0, handle, 0) }?;
    let mut access = vec![CUmemAccessDesc {
        location: location(dev),
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }];
    if cpu {
        access.push(CUmemAccessDesc {
            location: HOST_NODE,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        });
    }
    // SAFETY: `access.len()` access descriptors for the mapped range.
    unsafe { d.cuMemSetAccess(ptr, size, access.as_ptr(), access.len()) }?;
    Ok(Mapping { ptr, size, handle })
}

/// Whether `len` bytes at `ptr` all hold `want`, read with cuMemcpyDtoH and, for host memory
/// the CPU may touch (`cpu`), also through the pointer.
fn reads(d: &Driver, ptr: CUdeviceptr, len: usize, want: u8, cpu: bool) -> Result<bool, CuError> {
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` holds `len` bytes; the range lies in one mapping or allocation.
    unsafe { d.cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), ptr, len) }?;
    let mut ok = buf.iter().all(|&b| b == want);
    if cpu {
        // SAFETY: host memory mapped read-write for the CPU at `ptr` (`map` with `cpu`), `len`
        // bytes of it.
        let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        ok &= mapped.iter().all(|&b| b == want);
    }
    Ok(ok)
}

/// Writes `len` bytes of `value` at `ptr`: by the CPU through the pointer for host memory it may
/// touch (`cpu`), else with cuMemcpyHtoD.
fn write(d: &Driver, ptr: CUdeviceptr, len: usize, value: u8, cpu: bool) -> Result<(), CuError> {
    if cpu {
        // SAFETY: host memory mapped read-write for the CPU at `ptr` (`map` with `cpu`), `len`
        // bytes of it.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, len) };
        return Ok(());
    }
    let buf = vec![value; len];
    // SAFETY: `buf` holds `len` bytes; the range lies in one mapping or allocation.
    unsafe { d.cuMemcpyHtoD_v2(ptr, buf.as_ptr().cast(), len) }
}

fn unmap(d: &Driver, m: Mapping) -> Result<(), CuError> {
    // SAFETY: the range and handle were mapped by `map` and are released once.
    unsafe { d.cuMemUnmap(m.ptr, m.size) }?;
    // SAFETY: as above.
    unsafe { d.cuMemRelease(m.handle) }?;
    // SAFETY: as above.
    unsafe { d.cuMemAddressFree(m.ptr, m.size) }
}

fn hold_until_eof() {
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    s.len()
        .is_multiple_of(2)
        .then(|| {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

fn uuid_of(d: &Driver, dev: CUdevice) -> Result<String, CuError> {
    let mut uuid = CUuuid { bytes: [0; 16] };
    // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
    unsafe { d.cuDeviceGetUuid_v2(&mut uuid, dev) }?;
    Ok(hex(&uuid.bytes))
}

pub fn export(s: &Session, a: &ExportArgs) -> Result<(), Failure> {
    let d = s.d;
    let mut line = serde_json::Map::new();
    line.insert("via".into(), json!(format!("{:?}", a.via).to_lowercase()));
    line.insert("pid".into(), json!(std::process::id()));
    line.insert("device".into(), json!(s.ordinal));
    line.insert("uuid".into(), json!(uuid_of(d, s.dev)?));
    if a.via == ShareVia::Ipc && a.location != ShareLocation::Device {
        emit(
            "error",
            json!({"call": "export", "message": "--location host needs --via fd"}),
        );
        return Err(Failure::Check);
    }
    let written_back;
    match a.via {
        ShareVia::Ipc => {
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local.
            unsafe { d.cuMemAlloc_v2(&mut ptr, a.bytes as usize) }?;
            // SAFETY: `ptr` holds `bytes` bytes.
            unsafe { d.cuMemsetD8_v2(ptr, PATTERN, a.bytes as usize) }?;
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: out-pointer to a local; `ptr` came from cuMemAlloc.
            unsafe { d.cuIpcGetMemHandle(&mut h, ptr) }?;
            line.insert("bytes".into(), json!(a.bytes));
            line.insert("handle".into(), json!(hex(&h.reserved)));
            emit("exported", Value::Object(line));
            hold_until_eof();
            written_back = reads(d, ptr, PROBE.min(a.bytes as usize), WRITE_BACK, false)?;
            // SAFETY: allocated above and freed once.
            unsafe { d.cuMemFree_v2(ptr) }?;
        }
        ShareVia::Fd => {
            let host = a.location == ShareLocation::Host;
            let prop = CUmemAllocationProp {
                type_: CU_MEM_ALLOCATION_TYPE_PINNED,
                requestedHandleTypes: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                location: if host { HOST_NODE } else { location(s.dev) },
                win32HandleMetaData: null_mut(),
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            };
            let mut gran = 0usize;
            // SAFETY: out-pointer to a local; `prop` fully initialised.
            unsafe {
                d.cuMemGetAllocationGranularity(&mut gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            }?;
            let size = (a.bytes as usize).div_ceil(gran.max(1)) * gran.max(1);
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer to a local; `prop` fully initialised.
            unsafe { d.cuMemCreate(&mut handle, size, &prop, 0) }?;
            let m = map(d, handle, size, s.dev, host)?;
            if host {
                // SAFETY: host memory mapped read-write for the CPU, `size` bytes.
                unsafe { std::ptr::write_bytes(m.ptr as *mut u8, PATTERN, size) };
            } else {
                // SAFETY: the mapping holds `size` bytes.
                unsafe { d.cuMemsetD8_v2(m.ptr, PATTERN, size) }?;
            }
            let mut fd: i32 = -1;
            // SAFETY: for POSIX descriptors the shareable handle is an int.
            unsafe {
                d.cuMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast(),
                    handle,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            }?;
            line.insert("bytes".into(), json!(size));
            line.insert("fd".into(), json!(fd));
            line.insert(
                "location".into(),
                json!(if host { "host" } else { "device" }),
            );
            emit("exported", Value::Object(line));
            hold_until_eof();
            written_back = reads(d, m.ptr, PROBE.min(size), WRITE_BACK, host)?;
            unmap(d, m)?;
            // SAFETY: the descriptor the driver gave us, closed once.
            unsafe { libc::close(fd) };
        }
    }
    emit("released", json!({"written_back": written_back}));
    Ok(())
}

/// The exporter's descriptor `fd`, duplicated into this process (pidfd_getfd: the caller may
/// trace the exporter, as a process of the same user may).
fn take_fd(pid: i32, fd: i32) -> std::io::Result<i32> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd takes the pidfd just opened, the target's descriptor and flags 0.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd as i32, fd, 0) };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the pidfd opened above.
    unsafe { libc::close(pidfd as i32) };
    if got < 0 { Err(err) } else { Ok(got as i32) }
}

fn bad_from(why: String) -> Failure {
    emit("error", json!({"call": "import", "message": why}));
    Failure::Check
}

pub fn import(s: &Session, a: &ImportArgs) -> Result<(), Failure> {
    let d = s.d;
    let from: Value = serde_json::from_str(&a.from)
        .map_err(|e| bad_from(format!("--from is not an exported line: {e}")))?;
    let field = |k: &str| {
        from[k]
            .as_u64()
            .ok_or_else(|| bad_from(format!("--from has no {k:?}")))
    };
    let bytes = field("bytes")? as usize;
    let host = match from["location"].as_str() {
        None | Some("device") => false,
        Some("host") => true,
        Some(other) => {
            return Err(bad_from(format!(
                "--from names no known \"location\": {other:?}"
            )));
        }
    };
    let (ptr, undo): (CUdeviceptr, Box<dyn FnOnce() -> Result<(), CuError> + '_>) =
        match from["via"].as_str() {
            Some("ipc") => {
                let raw = from["handle"]
                    .as_str()
                    .and_then(unhex)
                    .filter(|b| b.len() == 64)
                    .ok_or_else(|| bad_from("--from has no 64-byte \"handle\"".into()))?;
                let mut h = CUipcMemHandle { reserved: [0; 64] };
                h.reserved.copy_from_slice(&raw);
                let mut ptr: CUdeviceptr = 0;
                // SAFETY: out-pointer to a local; the handle is passed by value.
                unsafe { d.cuIpcOpenMemHandle_v2(&mut ptr, h, LAZY_ENABLE_PEER_ACCESS) }?;
                // SAFETY: opened above and closed once.
                (ptr, Box::new(move || unsafe { d.cuIpcCloseMemHandle(ptr) }))
            }
            Some("fd") => {
                let (pid, fd) = (field("pid")? as i32, field("fd")? as i32);
                let mine = take_fd(pid, fd)
                    .map_err(|e| bad_from(format!("pidfd_getfd of pid {pid}'s fd {fd}: {e}")))?;
                let mut handle: CUmemGenericAllocationHandle = 0;
                // SAFETY: out-pointer to a local; for POSIX descriptors the shareable handle is
                // the descriptor's value.
                unsafe {
                    d.cuMemImportFromShareableHandle(
                        &mut handle,
                        mine as usize as *mut std::ffi::c_void,
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    )
                }?;
                // SAFETY: our duplicate; the imported handle does not need it any more.
                unsafe { libc::close(mine) };
                let m = map(d, handle, bytes, s.dev, host)?;
                (m.ptr, Box::new(move || unmap(d, m)))
            }
            other => {
                return Err(bad_from(format!(
                    "--from names no known \"via\": {other:?}"
                )));
            }
        };
    let probe = PROBE.min(bytes);
    let mut ok = true;
    for at in [0, bytes - probe] {
        ok &= reads(d, ptr + at as u64, probe, PATTERN, host)?;
    }
    write(d, ptr, probe, WRITE_BACK, host)?;
    emit(
        "imported",
        json!({"pid": std::process::id(), "device": s.ordinal, "uuid": uuid_of(d, s.dev)?,
               "bytes": bytes, "location": if host { "host" } else { "device" },
               "pattern_ok": ok}),
    );
    hold_until_eof();
    undo()?;
    emit("released", json!({}));
    if ok { Ok(()) } else { Err(Failure::Check) }
}

/// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
const ATTRIBUTE_MULTICAST_SUPPORTED: i32 = 132;

/// `CUmulticastObjectProp`.
#[repr(C)]
struct MulticastProp {
    num_devices: u32,
    size: usize,
    handle_types: u64,
    flags: u64,
}

/// What a call answered, by its code's name in `cuda.h`.
fn answer(r: Result<(), CuError>) -> &'static str {
    match r {
        Ok(()) => "CUDA_SUCCESS",
        Err(e) if e.missing => "no entry point",
        Err(e) => e.name().unwrap_or("?"),
    }
}

/// One peer copy's buffers: `src` on device `from`, holding the pair's pattern, and `dst` on
/// device `to`, each allocated in its device's primary context.
struct PeerCopy {
    from: usize,
    to: usize,
    src: CUdeviceptr,
    dst: CUdeviceptr,
}

/// The pattern copied from device `from` to device `to`: each 32-bit word its own index, the pair
/// in the top byte, so that a byte from another place, another pair or another granule shows.
fn peer_pattern(from: usize, to: usize, bytes: usize) -> Vec<u8> {
    let tag = (((from * 16 + to) & 0xff) as u32) << 24;
    (0..bytes.div_ceil(4))
        .flat_map(|w| (w as u32 ^ tag).to_le_bytes())
        .take(bytes)
        .collect()
}

/// Whether `dst` (device memory of the current context) holds `want`.
fn holds(d: &Driver, dst: CUdeviceptr, want: &[u8]) -> Result<bool, CuError> {
    let mut back = vec![0u8; want.len()];
    // SAFETY: `back` holds `want.len()` bytes; `dst` is an allocation of at least as many.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dst, back.len()) }?;
    Ok(back == want)
}

/// Makes the buffers of a copy from every device to every other, `bytes` each: the source
/// filled with its pair's pattern, the destination set to zero.
fn peer_buffers(d: &Driver, ctxs: &[CUcontext], bytes: usize) -> Result<Vec<PeerCopy>, CuError> {
    let mut copies = Vec::new();
    for from in 0..ctxs.len() {
        for to in (0..ctxs.len()).filter(|&to| to != from) {
            let (mut src, mut dst): (CUdeviceptr, CUdeviceptr) = (0, 0);
            let pattern = peer_pattern(from, to, bytes);
            // SAFETY: a retained primary context; then an out-pointer to a local, and a copy of
            // `bytes` bytes from `pattern` into the allocation of as many.
            unsafe {
                d.cuCtxSetCurrent(ctxs[from])?;
                d.cuMemAlloc_v2(&mut src, bytes)?;
                d.cuMemcpyHtoD_v2(src, pattern.as_ptr().cast(), bytes)?;
            }
            // SAFETY: as above, on the destination's device.
            unsafe {
                d.cuCtxSetCurrent(ctxs[to])?;
                d.cuMemAlloc_v2(&mut dst, bytes)?;
                d.cuMemsetD8_v2(dst, 0, bytes)?;
            }
            copies.push(PeerCopy { from, to, src, dst });
        }
    }
    Ok(copies)
}

/// Copies each pattern to the other device, with cuMemcpyPeer and then (the destination set to
/// zero again) with cuMemcpyPeerAsync on a stream of the destination's context and
/// cuStreamSynchronize, reading the destination back after each. No peer access is needed: the
/// driver stages a copy between devices that cannot reach each other.
fn peer_copies(
    d: &Driver,
    ctxs: &[CUcontext],
    streams: &[CUstream],
    copies: &[PeerCopy],
    bytes: usize,
) -> Result<Vec<Value>, CuError> {
    let mut out = Vec::new();
    for c in copies {
        let (to_ctx, from_ctx) = (ctxs[c.to], ctxs[c.from]);
        let want = peer_pattern(c.from, c.to, bytes);
        // SAFETY: the source device's retained primary context made current, as a framework
        // copying from its own device has it; both buffers hold `bytes` bytes.
        let sync = unsafe {
            d.cuCtxSetCurrent(from_ctx)?;
            d.cuMemcpyPeer(c.dst, to_ctx, c.src, from_ctx, bytes)
        };
        // SAFETY: a retained primary context.
        unsafe { d.cuCtxSetCurrent(to_ctx) }?;
        let sync_ok = sync.is_ok() && holds(d, c.dst, &want)?;
        // SAFETY: `dst` holds `bytes` bytes.
        unsafe { d.cuMemsetD8_v2(c.dst, 0, bytes) }?;
        // SAFETY: as for the synchronous copy; `streams[to]` is a stream of the destination's
        // context, synchronised before the destination is read.
        let queued = unsafe {
            d.cuCtxSetCurrent(from_ctx)?;
            d.cuMemcpyPeerAsync(c.dst, to_ctx, c.src, from_ctx, bytes, streams[c.to])
                .and_then(|()| d.cuStreamSynchronize(streams[c.to]))
        };
        // SAFETY: a retained primary context.
        unsafe { d.cuCtxSetCurrent(to_ctx) }?;
        let async_ok = queued.is_ok() && holds(d, c.dst, &want)?;
        out.push(
            json!({"from": c.from, "to": c.to, "bytes": bytes, "sync": answer(sync),
                        "sync_ok": sync_ok, "async": answer(queued), "async_ok": async_ok}),
        );
    }
    Ok(out)
}

/// What the driver says of every ordered pair of devices (the P2P attributes 1 to 4: performance
/// rank, access supported, native atomics, CUDA arrays), what enabling peer access between their
/// primary contexts returns, whether a pattern copied from each device to each other arrives
/// whole (`copies`: the calls' answers, `sync_ok` and `async_ok`), and what the driver says of
/// multicast objects. A copy that arrives wrong fails the run after the line.
pub fn peers(d: &Driver, args: &PeersArgs) -> Result<(), Failure> {
    let mut n = 0i32;
    // SAFETY: plain flags argument.
    unsafe { d.cuInit(0) }?;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuDeviceGetCount(&mut n) }?;
    let mut devs = Vec::new();
    let mut ctxs = Vec::new();
    for i in 0..n {
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a local.
        unsafe { d.cuDeviceGet(&mut dev, i) }?;
        let mut ctx: CUcontext = null_mut();
        // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
        unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, dev) }?;
        devs.push(dev);
        ctxs.push(ctx);
    }
    let mut pairs = Vec::new();
    for (i, &a) in devs.iter().enumerate() {
        for (j, &b) in devs.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut can = -1;
            // SAFETY: out-pointer to a local; both devices came from cuDeviceGet.
            unsafe { d.cuDeviceCanAccessPeer(&mut can, a, b) }?;
            let mut attrs = Vec::new();
            for attrib in 1..=4 {
                let mut v = -1;
                // SAFETY: as above.
                let r = unsafe { d.cuDeviceGetP2PAttribute(&mut v, attrib, a, b) };
                attrs.push(match r {
                    Ok(()) => json!(v),
                    Err(e) => json!(e.name().unwrap_or("?")),
                });
            }
            // SAFETY: the primary context of device i made current, then peer access to j's.
            unsafe { d.cuCtxSetCurrent(ctxs[i]) }?;
            // SAFETY: `ctxs[j]` is a retained primary context.
            let enable = answer(unsafe { d.cuCtxEnablePeerAccess(ctxs[j], 0) });
            pairs.push(
                json!({"from": i, "to": j, "can_access": can, "attributes": attrs,
                              "enable": enable}),
            );
        }
    }
    // Multicast objects (NVLink SHARP, NCCL's NVLS): what the driver says of each device, and
    // what it answers to making one across all of them.
    let mut multicast = Vec::new();
    for &dev in &devs {
        let mut supported = -1;
        // SAFETY: out-pointer to a local; the device came from cuDeviceGet.
        unsafe { d.cuDeviceGetAttribute(&mut supported, ATTRIBUTE_MULTICAST_SUPPORTED, dev) }?;
        multicast.push(json!(supported));
    }
    let prop = MulticastProp {
        num_devices: n as u32,
        size: 2 << 20,
        handle_types: 1, // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        flags: 0,
    };
    let mut handle = 0u64;
    // SAFETY: out-pointer to a local and a property struct laid out as cuda.h's.
    let create = answer(unsafe { d.cuMulticastCreate(&mut handle, (&raw const prop).cast()) });
    // A copy from each device to each other, its buffers made (and with --hold, what each
    // device holds read from outside) before the copies.
    let bytes = args.copy_bytes as usize;
    let mut streams = Vec::new();
    let mut buffers = Vec::new();
    if bytes > 0 && n > 1 {
        for &ctx in &ctxs {
            let mut stream: CUstream = null_mut();
            // SAFETY: a retained primary context, then an out-pointer to a local.
            unsafe {
                d.cuCtxSetCurrent(ctx)?;
                d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT)?;
            }
            streams.push(stream);
        }
        buffers = peer_buffers(d, &ctxs, bytes)?;
    }
    if args.hold {
        emit(
            "peer_buffers",
            json!({"devices": n, "copies": buffers.len(), "bytes": bytes}),
        );
        let _ = std::io::stdin().read_line(&mut String::new());
    }
    let copies = peer_copies(d, &ctxs, &streams, &buffers, bytes)?;
    let copied = copies
        .iter()
        .all(|c| c["sync_ok"] == true && c["async_ok"] == true);
    emit(
        "peers",
        json!({"devices": n, "pairs": pairs, "copies": copies, "multicast_supported": multicast,
               "multicast_create": create}),
    );
    if args.hold {
        hold_until_eof();
    }
    for c in &buffers {
        // SAFETY: each buffer allocated once in `peer_buffers`, freed once here in its own
        // device's context.
        unsafe {
            d.cuCtxSetCurrent(ctxs[c.from])?;
            d.cuMemFree_v2(c.src)?;
            d.cuCtxSetCurrent(ctxs[c.to])?;
            d.cuMemFree_v2(c.dst)?;
        }
    }
    for (&ctx, &stream) in ctxs.iter().zip(&streams) {
        // SAFETY: each stream created once above in this context, destroyed once.
        unsafe {
            d.cuCtxSetCurrent(ctx)?;
            d.cuStreamDestroy_v2(stream)?;
        }
    }
    for dev in devs {
        // SAFETY: retained once above.
        unsafe { d.cuDevicePrimaryCtxRelease_v2(dev) }?;
    }
    if copied { Ok(()) } else { Err(Failure::Check) }
}
