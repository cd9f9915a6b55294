//! CUDA arrays and mipmapped arrays: creation (including the CUDA 2.x/3.x descriptors),
//! destruction and memory requirements.

use std::ffi::c_uint;

use cuda_abi::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY3D_DESCRIPTOR, CUarray,
    CUdevice, CUmipmappedArray, CUresult, array_format,
};
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};

use super::*;

pub struct ArrayObj {
    pub dev: u32,
    pub ctx: u64,
    pub id: AllocId,
    /// Bytes the array needs (cuArrayGetMemoryRequirements).
    pub size: u64,
}

/// Bytes of a (layered) array: rows padded to 512 bytes, like a pitched allocation.
fn array_bytes(w: u64, h: u64, depth: u64, format: u32, channels: u32) -> Res<u64> {
    let per = array_format::bytes_per_channel(format).ok_or(E_INVALID_VALUE)?;
    if w == 0 || ![1, 2, 4].contains(&channels) {
        return Err(E_INVALID_VALUE);
    }
    let row = (w * per * channels as u64).next_multiple_of(512);
    Ok(row * h.max(1) * depth.max(1))
}

fn make_array(size: u64, mip: bool) -> Res<u64> {
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.refuse_if_capturing()?;
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    let id = take(d, dev, AllocKind::Array, size)?;
    let obj = ArrayObj { dev, ctx, id, size };
    Ok(if mip {
        inner.mipmaps.insert(obj)
    } else {
        inner.arrays.insert(obj)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let dsc = unsafe { *desc };
        let size = array_bytes(
            dsc.Width as u64,
            dsc.Height as u64,
            1,
            dsc.Format,
            dsc.NumChannels,
        )?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

/// CUDA 2.x descriptor: 32-bit width and height.
#[repr(C)]
pub struct ArrayDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(
    out: *mut CUarray,
    desc: *const ArrayDescriptorV1,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a v1 descriptor.
        let dsc = unsafe { &*desc };
        let size = array_bytes(
            dsc.width as u64,
            dsc.height as u64,
            1,
            dsc.format,
            dsc.channels,
        )?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

fn array3d_bytes(dsc: &CUDA_ARRAY3D_DESCRIPTOR) -> Res<u64> {
    let cubemap = dsc.Flags & 0x04 != 0; // CUDA_ARRAY3D_CUBEMAP: six faces per layer
    let depth = if cubemap { dsc.Depth.max(6) } else { dsc.Depth } as u64;
    array_bytes(
        dsc.Width as u64,
        dsc.Height as u64,
        depth,
        dsc.Format,
        dsc.NumChannels,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let size = array3d_bytes(unsafe { &*desc })?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

#[repr(C)]
pub struct Array3DDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(
    out: *mut CUarray,
    desc: *const Array3DDescriptorV1,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a v1 descriptor.
        let v = unsafe { &*desc };
        let dsc = CUDA_ARRAY3D_DESCRIPTOR {
            Width: v.width as usize,
            Height: v.height as usize,
            Depth: v.depth as usize,
            Format: v.format,
            NumChannels: v.channels,
            Flags: v.flags,
        };
        let h = make_array(array3d_bytes(&dsc)?, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() || levels == 0 {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let mut dsc = unsafe { *desc };
        let mut size = 0;
        for _ in 0..levels {
            size += array3d_bytes(&dsc)?;
            dsc.Width = (dsc.Width / 2).max(1);
            dsc.Height /= 2;
            dsc.Depth /= 2;
        }
        let h = make_array(size, true)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

fn destroy_array(h: u64, mip: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let obj = if mip {
        inner.mipmaps.remove(h)
    } else {
        inner.arrays.remove(h)
    }
    .ok_or(E_INVALID_HANDLE)?;
    give(d, obj.dev, obj.id);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(a: CUarray) -> CUresult {
    status(destroy_array(from_ptr(a), false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(a: CUmipmappedArray) -> CUresult {
    status(destroy_array(from_ptr(a), true))
}

fn requirements(out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, h: u64, mip: bool, dev: CUdevice) -> Res {
    let d = drv()?;
    let inner = d.inner.lock();
    let obj = if mip {
        inner.mipmaps.get(h)
    } else {
        inner.arrays.get(h)
    }
    .ok_or(E_INVALID_HANDLE)?;
    if d.physical(dev)? != obj.dev {
        return Err(E_INVALID_DEVICE);
    }
    // SAFETY: out-pointer from the caller.
    unsafe {
        put(
            out,
            CUDA_ARRAY_MEMORY_REQUIREMENTS {
                size: obj.size as usize,
                alignment: 512,
                reserved: [0; 4],
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    a: CUarray,
    dev: CUdevice,
) -> CUresult {
    status(requirements(out, from_ptr(a), false, dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    a: CUmipmappedArray,
    dev: CUdevice,
) -> CUresult {
    status(requirements(out, from_ptr(a), true, dev))
}
