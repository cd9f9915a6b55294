//! CUDA IPC: a process exports a cuMemAlloc allocation as a 64-byte handle; another process on
//! the same simulated machine opens it at an address of its own. The memory stays the
//! exporter's (it is counted once, for the exporter) and goes when the exporter frees it.

use cuda_abi::{CUdeviceptr, CUipcMemHandle, CUresult};
use simgpu::AllocId;

use crate::driver::*;

const MAGIC: u32 = 0x5347_5055; // "SGPU"

fn encode(machine: u64, dev: u32, id: AllocId, len: u64) -> CUipcMemHandle {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&dev.to_le_bytes());
    b[8..12].copy_from_slice(&id.head.to_le_bytes());
    b[12..16].copy_from_slice(&id.generation.to_le_bytes());
    b[16..24].copy_from_slice(&machine.to_le_bytes());
    b[24..32].copy_from_slice(&len.to_le_bytes());
    CUipcMemHandle { reserved: b }
}

fn decode(h: &CUipcMemHandle) -> Option<(u64, u32, AllocId, u64)> {
    let b = &h.reserved;
    let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    (u32at(0) == MAGIC).then(|| {
        (
            u64at(16),
            u32at(4),
            AllocId {
                head: u32at(8),
                generation: u32at(12),
            },
            u64at(24),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    out: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let m = inner
            .maps
            .get(&dptr)
            // Managed memory cannot be shared this way (the driver answers INVALID_VALUE).
            .filter(|m| m.kind == MapKind::Owned && !m.host_mapped)
            .ok_or(E_INVALID_VALUE)?;
        let id = m.id.ok_or(E_INVALID_VALUE)?;
        crate::checkpoint::EXPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, encode(d.state.header().machine_id, m.dev, id, m.len)) }
    }))
}

fn open(dptr: *mut CUdeviceptr, handle: CUipcMemHandle) -> Res {
    let d = drv()?;
    if dptr.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let (machine, dev, id, len) = decode(&handle).ok_or(E_INVALID_VALUE)?;
    if machine != d.state.header().machine_id || dev >= d.state.ndev() {
        return Err(E_INVALID_VALUE);
    }
    let mut inner = d.inner.lock();
    let (ctx, _) = inner.cur()?;
    let rec = d
        .state
        .lock_device(dev)
        .dev()
        .record(id)
        .ok_or(E_INVALID_VALUE)?;
    if Some(rec.owner) == d.state.my_slot() {
        return Err(E_INVALID_CONTEXT); // opening one's own allocation is refused, as on real GPUs
    }
    let va = inner.va.take(len, 0)?;
    inner.maps.insert(
        va,
        Mapping {
            len,
            dev,
            ctx,
            id: Some(id),
            offset: 0,
            kind: MapKind::Ipc,
            size: len,
            host_mapped: false,
            handle: 0,
        },
    );
    // SAFETY: checked non-NULL.
    unsafe { dptr.write(va) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    _flags: u32,
) -> CUresult {
    status(open(dptr, handle))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    _flags: u32,
) -> CUresult {
    status(open(dptr, handle))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        match inner.maps.get(&dptr) {
            Some(m) if m.kind == MapKind::Ipc => {
                crate::memory::drop_mapping(d, &mut inner, dptr);
                Ok(())
            }
            _ => Err(E_INVALID_VALUE),
        }
    }))
}
