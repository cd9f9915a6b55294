//! Pointer attributes (`cuPointerGetAttribute`, `cuPointerGetAttributes`): what a pointer is,
//! from the process's own records of device allocations, pool blocks, VMM and IPC mappings and
//! page-locked host memory. NVIDIA's runtime builds `cudaPointerGetAttributes` on them, which
//! CuPy calls to find the device of memory another library allocated.
//!
//! As the driver answers: `cuPointerGetAttribute` of an address nothing here allocated is
//! `CUDA_ERROR_INVALID_VALUE`; `cuPointerGetAttributes` answers it with `CU_MEMORYTYPE` 0 and
//! every other attribute zeroed (ordinal -2) and succeeds. Device memory has one address for
//! host and device (unified addressing), so a managed allocation's host pointer is its device
//! pointer and plain device memory has none. Host-located VMM memory (`cuMemCreate` for a host
//! location, mapped with `cuMemMap`) is host memory, its host pointer its address.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUdeviceptr, CUresult};

use crate::driver::*;
use crate::handles::to_ptr;

// `CUpointer_attribute` (cuda.h).
const CONTEXT: c_uint = 1;
const MEMORY_TYPE: c_uint = 2;
const DEVICE_POINTER: c_uint = 3;
const HOST_POINTER: c_uint = 4;
const P2P_TOKENS: c_uint = 5;
const SYNC_MEMOPS: c_uint = 6;
const BUFFER_ID: c_uint = 7;
const IS_MANAGED: c_uint = 8;
const DEVICE_ORDINAL: c_uint = 9;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_uint = 10;
const RANGE_START_ADDR: c_uint = 11;
const RANGE_SIZE: c_uint = 12;
const MAPPED: c_uint = 13;
const ALLOWED_HANDLE_TYPES: c_uint = 14;
const IS_GPU_DIRECT_RDMA_CAPABLE: c_uint = 15;
const ACCESS_FLAGS: c_uint = 16;
const MEMPOOL_HANDLE: c_uint = 17;
const MAPPING_SIZE: c_uint = 18;
const MAPPING_BASE_ADDR: c_uint = 19;
const MEMORY_BLOCK_ID: c_uint = 20;
const IS_HW_DECOMPRESS_CAPABLE: c_uint = 21;

// `CUmemorytype`.
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: u32 = 3;

/// What one address is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pointer {
    memory_type: u32,
    ctx: u64,
    ordinal: i32,
    /// The allocation (or pool block) it lies in: start and length.
    start: u64,
    len: u64,
    managed: bool,
    /// Memory from `cuMemAlloc` (what `cuIpcGetMemHandle` accepts).
    legacy_ipc: bool,
    pool: u64,
}

/// An attribute's value, in the width the driver writes it: a boolean as 32 bits (NVIDIA's
/// runtime gives `IS_MANAGED` a 4-byte slot and reads all of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Bool(bool),
    U32(u32),
    I32(i32),
    U64(u64),
}

fn lookup(p: u64) -> Res<Option<Pointer>> {
    let d = drv()?;
    let inner = d.inner.lock();
    if let Some((start, m)) = inner.find(p) {
        let ordinal = |ctx: u64| inner.ctx(ctx).map(|c| c.ordinal).ok();
        let mut ptr = Pointer {
            memory_type: MEMORYTYPE_DEVICE,
            ctx: m.ctx,
            ordinal: ordinal(m.ctx)
                .or_else(|| d.visible.iter().position(|&v| v == m.dev).map(|o| o as i32))
                .unwrap_or(-1),
            start,
            len: if m.kind == MapKind::Owned {
                m.size
            } else {
                m.len
            },
            managed: m.host_mapped,
            legacy_ipc: m.kind == MapKind::Owned && !m.host_mapped,
            pool: 0,
        };
        if m.kind == MapKind::Vmm && m.on_host() {
            // Host-located VMM memory is host memory to the pointer query, as on the driver
            // (Ref: open-mpi/ompi#12751), reached by the CPU at the same address once
            // cuMemSetAccess allows it; its device is the current context's, as for
            // page-locked memory.
            ptr.memory_type = MEMORYTYPE_HOST;
            ptr.ordinal = inner.cur().map(|(_, c)| c.ordinal).unwrap_or(-1);
        }
        if m.kind == MapKind::PoolChunk {
            // A pool's block: only while it is allocated.
            let found = inner
                .pools
                .iter()
                .filter(|(_, pool)| pool.chunks.iter().any(|c| c.va == start))
                .find_map(|(h, pool)| {
                    let (&block, &len) = pool.blocks.range(..=p).next_back()?;
                    (p < block + len).then_some((h, block, len))
                });
            let Some((pool, block, len)) = found else {
                return Ok(None);
            };
            (ptr.pool, ptr.start, ptr.len) = (pool, block, len);
            ptr.ordinal = inner.pools.get(pool).map_or(ptr.ordinal, |p| p.ordinal);
        }
        return Ok(Some(ptr));
    }
    let host = inner
        .host
        .iter()
        .find(|(start, (len, _))| (**start..**start + *len as u64).contains(&p));
    Ok(host.map(|(&start, &(len, _))| Pointer {
        memory_type: MEMORYTYPE_HOST,
        ctx: crate::driver::current_ctx().unwrap_or(0),
        ordinal: inner.cur().map(|(_, c)| c.ordinal).unwrap_or(-1),
        start,
        len: len as u64,
        ..Pointer::default()
    }))
}

/// The value of `attr` for `at`, an address inside `p`. Pure.
fn value(p: &Pointer, at: u64, attr: c_uint) -> Res<Value> {
    let host = p.memory_type == MEMORYTYPE_HOST;
    Ok(match attr {
        CONTEXT => Value::U64(p.ctx),
        MEMORY_TYPE => Value::U32(p.memory_type),
        DEVICE_POINTER => Value::U64(at),
        HOST_POINTER if host || p.managed => Value::U64(at),
        HOST_POINTER => return Err(E_INVALID_VALUE),
        P2P_TOKENS => return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        SYNC_MEMOPS => Value::Bool(false),
        BUFFER_ID => Value::U64(p.start),
        IS_MANAGED => Value::Bool(p.managed),
        DEVICE_ORDINAL => Value::I32(p.ordinal),
        IS_LEGACY_CUDA_IPC_CAPABLE => Value::Bool(p.legacy_ipc),
        RANGE_START_ADDR | MAPPING_BASE_ADDR => Value::U64(p.start),
        RANGE_SIZE | MAPPING_SIZE => Value::U64(p.len),
        MAPPED => Value::Bool(true),
        ALLOWED_HANDLE_TYPES => Value::U64(0),
        IS_GPU_DIRECT_RDMA_CAPABLE | IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        ACCESS_FLAGS => Value::U32(ACCESS_READWRITE),
        MEMPOOL_HANDLE => Value::U64(p.pool),
        MEMORY_BLOCK_ID => Value::U64(0),
        _ => return Err(E_INVALID_VALUE),
    })
}

/// What `cuPointerGetAttributes` writes for an address that is not CUDA's.
fn unknown(attr: c_uint) -> Res<Value> {
    Ok(match attr {
        DEVICE_ORDINAL => Value::I32(-2),
        MEMORY_TYPE | ACCESS_FLAGS => Value::U32(0),
        SYNC_MEMOPS
        | IS_MANAGED
        | IS_LEGACY_CUDA_IPC_CAPABLE
        | MAPPED
        | IS_GPU_DIRECT_RDMA_CAPABLE
        | IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        P2P_TOKENS => return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        CONTEXT..=MEMPOOL_HANDLE | MAPPING_SIZE..=MEMORY_BLOCK_ID => Value::U64(0),
        _ => return Err(E_INVALID_VALUE),
    })
}

/// # Safety
/// `data` must be NULL or have room for the attribute's value.
unsafe fn write(data: *mut c_void, v: Value) -> Res {
    // SAFETY: per the contract (NULL refused by `put`).
    unsafe {
        match v {
            Value::Bool(b) => put(data as *mut u32, b as u32),
            Value::U32(x) => put(data as *mut u32, x),
            Value::I32(x) => put(data as *mut i32, x),
            Value::U64(x) => put(data as *mut u64, x),
        }
    }
}

/// # Safety
/// `data` must be NULL or have room for the attribute's value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    status((|| {
        let p = lookup(ptr)?.ok_or(E_INVALID_VALUE)?;
        let v = value(&p, ptr, attr)?;
        let v = match (attr, v) {
            (CONTEXT, Value::U64(h)) => Value::U64(to_ptr(h) as u64),
            (_, v) => v,
        };
        // SAFETY: per the contract.
        unsafe { write(data, v) }
    })())
}

/// # Safety
/// `attrs` and `data` must hold `n` entries, each `data[i]` with room for `attrs[i]`'s value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    status((|| {
        if n > 0 && (attrs.is_null() || data.is_null()) {
            return Err(E_INVALID_VALUE);
        }
        let p = lookup(ptr)?;
        for i in 0..n as usize {
            // SAFETY: per the contract, both arrays have `n` entries.
            let (attr, out) = unsafe { (attrs.add(i).read(), data.add(i).read()) };
            let v = match &p {
                Some(p) => match value(p, ptr, attr) {
                    // A device pointer has no host pointer: NULL here, not an error.
                    Err(e) if e == E_INVALID_VALUE && attr == HOST_POINTER => Value::U64(0),
                    v => v?,
                },
                None => unknown(attr)?,
            };
            let v = match (attr, v) {
                (CONTEXT, Value::U64(h)) if h != 0 => Value::U64(to_ptr(h) as u64),
                (_, v) => v,
            };
            // SAFETY: per the contract.
            unsafe { write(out, v) }?;
        }
        Ok(())
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_managed_and_host_memory_answer_as_the_driver_does() {
        let dev = Pointer {
            memory_type: MEMORYTYPE_DEVICE,
            ctx: 7,
            ordinal: 0,
            start: 0x1000,
            len: 0x200,
            legacy_ipc: true,
            ..Pointer::default()
        };
        assert_eq!(value(&dev, 0x1010, MEMORY_TYPE), Ok(Value::U32(2)));
        assert_eq!(value(&dev, 0x1010, DEVICE_POINTER), Ok(Value::U64(0x1010)));
        assert_eq!(value(&dev, 0x1010, HOST_POINTER), Err(E_INVALID_VALUE));
        assert_eq!(
            value(&dev, 0x1010, RANGE_START_ADDR),
            Ok(Value::U64(0x1000))
        );
        assert_eq!(value(&dev, 0x1010, RANGE_SIZE), Ok(Value::U64(0x200)));
        assert_eq!(value(&dev, 0x1010, IS_MANAGED), Ok(Value::Bool(false)));
        assert_eq!(
            value(&dev, 0x1010, IS_LEGACY_CUDA_IPC_CAPABLE),
            Ok(Value::Bool(true))
        );
        assert_eq!(value(&dev, 0x1010, 99), Err(E_INVALID_VALUE));
        let managed = Pointer {
            managed: true,
            legacy_ipc: false,
            ..dev
        };
        assert_eq!(
            value(&managed, 0x1010, HOST_POINTER),
            Ok(Value::U64(0x1010))
        );
        assert_eq!(value(&managed, 0x1010, IS_MANAGED), Ok(Value::Bool(true)));
        let host = Pointer {
            memory_type: MEMORYTYPE_HOST,
            ..Pointer::default()
        };
        assert_eq!(value(&host, 0x10, MEMORY_TYPE), Ok(Value::U32(1)));
        assert_eq!(value(&host, 0x10, HOST_POINTER), Ok(Value::U64(0x10)));
        assert_eq!(unknown(MEMORY_TYPE), Ok(Value::U32(0)));
        assert_eq!(unknown(DEVICE_ORDINAL), Ok(Value::I32(-2)));
        assert_eq!(unknown(RANGE_SIZE), Ok(Value::U64(0)));
        assert_eq!(unknown(P2P_TOKENS), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED));
    }
}
