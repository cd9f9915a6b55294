//! Copies and memsets: where device memory lives in the contents file, which side a pointer
//! is on, and the synchronous and stream-ordered copy (peer copies between devices included),
//! memset and write-value entry points.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUcontext, CUdeviceptr, CUresult, CUstream};
use simgpu::layout::GRANULE;

use crate::driver::*;
use crate::handles::from_ptr;

use super::*;

/// Where `len` bytes of device memory at `va` live in the contents file: (file offset, length).
fn segments(d: &Driver, inner: &Inner, va: u64, len: u64) -> Res<Vec<(u64, u64)>> {
    let (start, m) = inner.find(va).ok_or(E_INVALID_VALUE)?;
    if va + len > start + m.len {
        return Err(E_INVALID_VALUE);
    }
    let id = m.id.ok_or(E_INVALID_VALUE)?;
    let granules = d
        .state
        .lock_device(m.dev)
        .dev()
        .granules_of(id)
        .ok_or(E_INVALID_VALUE)?;
    let data_off = d.state.device_info(m.dev).data_off;
    let mut out = Vec::new();
    let mut pos = m.offset + (va - start);
    let end = pos + len;
    while pos < end {
        let g = *granules
            .get((pos / GRANULE) as usize)
            .ok_or(E_INVALID_VALUE)?;
        let within = pos % GRANULE;
        let n = (GRANULE - within).min(end - pos);
        out.push((data_off + g as u64 * GRANULE + within, n));
        pos += n;
    }
    Ok(out)
}

enum Side {
    Host(*mut u8),
    Device(Vec<(u64, u64)>),
}

fn side(d: &Driver, inner: &Inner, p: u64, len: u64) -> Res<Side> {
    if let Some(host) = host_resident(inner, p, len) {
        Ok(Side::Host(host?))
    } else if inner.va.contains(p) || inner.va32.contains(p) {
        Ok(Side::Device(segments(d, inner, p, len)?))
    } else if p == 0 {
        Err(E_INVALID_VALUE)
    } else {
        Ok(Side::Host(p as *mut u8))
    }
}

/// Copies `len` bytes between any mix of host and device memory.
pub fn copy(dst: u64, src: u64, len: u64) -> Res {
    let d = drv()?;
    if len == 0 {
        return Ok(());
    }
    // The whole copy is a call under way: a checkpoint's lock waits for it to end.
    let _call = d.inner.under_way();
    let (ds, ss) = {
        let inner = d.inner.lock();
        (side(d, &inner, dst, len)?, side(d, &inner, src, len)?)
    };
    let data = d.state.data().map_err(|e| {
        eprintln!("simgpu: {e}");
        CUresult::CUDA_ERROR_UNKNOWN
    })?;
    let flatten = |s: Side| -> Vec<(*mut u8, u64)> {
        match s {
            Side::Host(p) => vec![(p, len)],
            // Segments lie inside the contents file, which is mapped whole.
            Side::Device(segs) => segs
                .into_iter()
                .map(|(off, n)| (data.base.wrapping_add(off as usize), n))
                .collect(),
        }
    };
    let (mut dv, mut sv) = (flatten(ds).into_iter(), flatten(ss).into_iter());
    let (mut dcur, mut scur) = (dv.next(), sv.next());
    while let (Some((dp, dn)), Some((sp, sn))) = (dcur, scur) {
        let n = dn.min(sn);
        // SAFETY: host ranges are the caller's buffers of `len` bytes (the API contract) or
        // host memory mapped in the device address space, bounds-checked against its mapping;
        // device ranges were bounds-checked against their allocation. `copy` tolerates overlap.
        unsafe { std::ptr::copy(sp, dp, n as usize) };
        dcur = if dn > n {
            Some((dp.wrapping_add(n as usize), dn - n))
        } else {
            dv.next()
        };
        scur = if sn > n {
            Some((sp.wrapping_add(n as usize), sn - n))
        } else {
            sv.next()
        };
    }
    Ok(())
}

/// Fills `count` elements of `width` bytes with `value` at device address `dst`.
pub fn fill(dst: u64, value: u32, width: u64, count: u64) -> Res {
    let d = drv()?;
    let len = width * count;
    if len == 0 {
        return Ok(());
    }
    let _call = d.inner.under_way();
    let segs = {
        let inner = d.inner.lock();
        if let Some(host) = host_resident(&inner, dst, len) {
            let host = host?;
            let pattern = value.to_le_bytes();
            for i in 0..len as usize {
                // SAFETY: inside the host-resident allocation, bounds-checked above.
                unsafe { host.add(i).write(pattern[i % width as usize]) };
            }
            return Ok(());
        }
        segments(d, &inner, dst, len)?
    };
    let data = d.state.data().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    if value.to_le_bytes()[..width as usize]
        .iter()
        .all(|&b| b == 0)
    {
        for (off, n) in segs {
            // SAFETY: the segment lies inside the mapped contents file.
            unsafe { zero(data.base.add(off as usize), n as usize) };
        }
        return Ok(());
    }
    let pattern: Vec<u8> = (0..len)
        .map(|i| value.to_le_bytes()[(i % width) as usize])
        .collect();
    let mut pos = 0usize;
    for (off, n) in segs {
        // SAFETY: the segment lies inside the mapped contents file; pattern has len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                pattern.as_ptr().add(pos),
                data.base.add(off as usize),
                n as usize,
            )
        };
        pos += n as usize;
    }
    Ok(())
}

/// Sets `n` bytes at `p` (inside the contents file's shared mapping) to zero: the whole pages
/// among them by punching them out of the file (they read as zeros, and a large memset costs
/// neither time nor disk), the rest, or all where the file system cannot punch, by writing.
///
/// # Safety
/// `p..p + n` must lie inside the contents file's mapping.
unsafe fn zero(p: *mut u8, n: usize) {
    let page = 4096;
    let start = (p as usize).next_multiple_of(page);
    let end = (p as usize + n) / page * page;
    let punched = end > start && {
        // SAFETY: [start, end) lies inside the caller's range, page-aligned, in a shared file
        // mapping, whose pages read as zeros once removed.
        unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_REMOVE) == 0 }
    };
    if punched {
        // SAFETY: both edges lie inside the caller's range.
        unsafe {
            std::ptr::write_bytes(p, 0, start - p as usize);
            std::ptr::write_bytes(end as *mut u8, 0, p as usize + n - end);
        }
    } else {
        // SAFETY: the caller's range.
        unsafe { std::ptr::write_bytes(p, 0, n) };
    }
}

macro_rules! copies {
    ($($name:ident ($($arg:ident : $ty:ty),*) => $body:expr;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                status($body)
            }
        )*
    };
}

fn async_ok(stream: CUstream, ptsz: bool) -> Res {
    crate::stream::check_stream(stream, ptsz)
}

copies! {
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) => copy(dst, src as u64, n as u64);
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) => copy(dst, src as u64, n as u64);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) => copy(dst as u64, src, n as u64);
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) => copy(dst as u64, src, n as u64);
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src as u64, n as u64));
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src as u64, n as u64));
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst as u64, src, n as u64));
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst as u64, src, n as u64));
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src, n as u64));
    cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) => fill(dst, v as u32, 1, n as u64);
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize) => fill(dst, v as u32, 1, n as u64);
    cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) => fill(dst, v, 4, n as u64);
    cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize) => fill(dst, v, 4, n as u64);
    cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| fill(dst, v as u32, 1, n as u64));
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| fill(dst, v as u32, 1, n as u64));
    cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| fill(dst, v, 4, n as u64));
    cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| fill(dst, v, 4, n as u64));
    cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) => copy_peer(dst, dst_ctx, src, src_ctx, n as u64);
    cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) => copy_peer(dst, dst_ctx, src, src_ctx, n as u64);
    cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, s: CUstream) => peer_async_ok(dst_ctx, src_ctx, s, false).and_then(|_| copy_peer(dst, dst_ctx, src, src_ctx, n as u64));
    cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, s: CUstream) => peer_async_ok(dst_ctx, src_ctx, s, true).and_then(|_| copy_peer(dst, dst_ctx, src, src_ctx, n as u64));
    cuStreamWriteValue32(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, false, dst, v, flags);
    cuStreamWriteValue32_ptsz(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, true, dst, v, flags);
    cuStreamWriteValue32_v2(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, false, dst, v, flags);
    cuStreamWriteValue32_v2_ptsz(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, true, dst, v, flags);
}

/// `cuStreamWriteValue32`: one 32-bit word, 4-byte aligned, written (like a memset) when called.
/// Flags: `CU_STREAM_WRITE_VALUE_DEFAULT` (0) or `_NO_MEMORY_BARRIER` (1).
fn write_value(s: CUstream, ptsz: bool, dst: CUdeviceptr, v: c_uint, flags: c_uint) -> Res {
    if flags > 1 || !dst.is_multiple_of(4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    async_ok(s, ptsz).and_then(|_| fill(dst, v, 4, 1))
}

/// Whether `len` bytes at `p` lie in one range of this process's device memory on device `dev`
/// (physical index): memory allocated, mapped, opened or carved from a pool in any of the
/// process's contexts on that device. Host memory, another device's memory and a range that runs
/// past its allocation are `CUDA_ERROR_INVALID_VALUE`.
fn on_device(inner: &Inner, p: u64, len: u64, dev: u32) -> Res {
    let (start, m) = inner.find(p).ok_or(E_INVALID_VALUE)?;
    let end = p.checked_add(len).ok_or(E_INVALID_VALUE)?;
    if m.dev != dev || end > start + m.len {
        return Err(E_INVALID_VALUE);
    }
    Ok(())
}

/// The devices (physical indices) of a peer copy's two contexts, each a live context of this
/// process (`CUDA_ERROR_INVALID_CONTEXT` for NULL, a destroyed context or a foreign handle).
fn peer_devices(inner: &Inner, dst_ctx: CUcontext, src_ctx: CUcontext) -> Res<(u32, u32)> {
    let dst = inner.ctx(from_ptr(dst_ctx))?.dev;
    let src = inner.ctx(from_ptr(src_ctx))?.dev;
    Ok((dst, src))
}

/// `cuMemcpyPeerAsync`'s checks before the copy's: both contexts, then the stream (a stream of
/// any context of the process, or a default stream of the current one).
fn peer_async_ok(dst_ctx: CUcontext, src_ctx: CUcontext, stream: CUstream, ptsz: bool) -> Res {
    peer_devices(&drv()?.inner.lock(), dst_ctx, src_ctx)?;
    async_ok(stream, ptsz)
}

/// `cuMemcpyPeer[Async]`: `len` bytes from `src`, device memory of `src_ctx`'s device, to `dst`,
/// device memory of `dst_ctx`'s device, done when called like every copy here. Between devices
/// that cannot reach each other the real driver stages the copy through host memory, so no peer
/// access (`cuCtxEnablePeerAccess`) and no link (`simgpu init --nvlink`) is needed; the two
/// contexts may also be on one device. Nothing is taken or given back on either device.
fn copy_peer(dst: u64, dst_ctx: CUcontext, src: u64, src_ctx: CUcontext, len: u64) -> Res {
    let d = drv()?;
    {
        let inner = d.inner.lock();
        let (dst_dev, src_dev) = peer_devices(&inner, dst_ctx, src_ctx)?;
        if len == 0 {
            return Ok(());
        }
        on_device(&inner, dst, len, dst_dev)?;
        on_device(&inner, src, len, src_dev)?;
    }
    copy(dst, src, len)
}
