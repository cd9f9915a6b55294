//! Contexts: primary contexts, cuCtxCreate (all four ABIs), the current-context stack,
//! synchronisation, and what destroying a context releases (the runtime's context-local storage
//! destructors first, `export.rs`).

use std::ffi::{c_int, c_uint, c_void};

use cuda_abi::{CUcontext, CUdevice, CUresult};
use simgpu::dev::CtxError;
use simgpu::layout::CTX_PRIMARY;

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};

/// Makes a context (hidden overhead charged to this process) on CUDA device `ordinal`.
pub fn create(d: &Driver, inner: &mut Inner, ordinal: i32, flags: u32, primary: bool) -> Res<u64> {
    let dev = d.physical(ordinal)?;
    let slot = d
        .state
        .my_slot()
        .ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
    let (shared, shared_gen) = {
        let mut g = d.state.lock_device(dev);
        g.advance_now();
        let fl = if primary { CTX_PRIMARY } else { 0 };
        match g.dev().create_ctx(slot, fl, d.overhead()) {
            Err(CtxError::OutOfMemory) => {
                g.reclaim_dead();
                g.dev().create_ctx(slot, fl, d.overhead())
            }
            r => r,
        }
        .map_err(|_| E_OOM)?
    };
    Ok(inner.ctxs.insert(CtxLocal {
        dev,
        ordinal,
        shared,
        shared_gen,
        primary,
        flags,
        last_blocking: 0,
        legacy_last: 0,
    }))
}

/// Waits for all work of context `h`.
pub fn sync_ctx(d: &Driver, c: &CtxLocal) {
    let target = d.state.lock_device(c.dev).dev().submitted(c.shared);
    wait_seq(d, c.dev, c.shared, c.shared_gen, target);
}

/// Destroys context `h` and everything made in it.
pub fn destroy(d: &Driver, inner: &mut Inner, h: u64) -> Res {
    let c = inner.ctxs.get(h).ok_or(E_INVALID_CONTEXT)?;
    sync_ctx(d, c);
    let (dev, shared) = (c.dev, c.shared);
    crate::memory::release_ctx_resources(d, inner, h);
    d.state.lock_device(dev).dev().drop_ctx(shared);
    inner.ctxs.remove(h);
    forget_current(h);
    PER_THREAD.with(|m| m.borrow_mut().remove(&h));
    Ok(())
}

fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    if pctx.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let h = create(d, &mut inner, dev, flags, false)?;
    push_current(h);
    // SAFETY: checked non-NULL above; the caller provides space for a CUcontext.
    unsafe { pctx.write(to_ptr(h)) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(ctx_create(pctx, flags, dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(ctx_create(pctx, flags, dev))
}

/// CUDA 11.4: with execution-affinity parameters (accepted, not modelled).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if num_params < 0 {
        return E_INVALID_VALUE;
    }
    status(ctx_create(pctx, flags, dev))
}

/// CUDA 12.5: with a CUctxCreateParams pointer (may be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(ctx_create(pctx, flags, dev))
}

fn ctx_destroy(ctx: CUcontext) -> Res {
    let d = drv()?;
    let h = from_ptr(ctx);
    if d.inner.lock().ctx(h)?.primary {
        return Err(E_INVALID_CONTEXT);
    }
    crate::export::context_ending(h);
    destroy(d, &mut d.inner.lock(), h)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    status(ctx_destroy(ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    status(ctx_destroy(ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let cur = current_ctx()
            .filter(|h| inner.ctxs.get(*h).is_some())
            .unwrap_or(0);
        // SAFETY: out-pointer from the caller.
        unsafe { put(pctx, to_ptr(cur)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    status(drv().and_then(|d| {
        let h = from_ptr(ctx);
        if h == 0 {
            set_current(None);
            return Ok(());
        }
        revive(d, &mut d.inner.lock(), h)?;
        set_current(Some(h));
        Ok(())
    }))
}

fn ctx_push(ctx: CUcontext) -> Res {
    let d = drv()?;
    let h = from_ptr(ctx);
    revive(d, &mut d.inner.lock(), h)?;
    push_current(h);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    status(ctx_push(ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    status(ctx_push(ctx))
}

fn ctx_pop(pctx: *mut CUcontext) -> Res {
    drv()?;
    let h = pop_current().ok_or(E_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-NULL out-pointer from the caller.
        unsafe { pctx.write(to_ptr(h)) };
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    status(ctx_pop(pctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    status(ctx_pop(pctx))
}

fn ctx_device(ctx: Option<u64>, out: *mut CUdevice) -> Res {
    let d = drv()?;
    let inner = d.inner.lock();
    let c = match ctx {
        Some(h) if h != 0 => inner.ctx(h)?,
        _ => inner.cur()?.1,
    };
    // SAFETY: out-pointer from the caller.
    unsafe { put(out, c.ordinal) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    status(ctx_device(None, device))
}

/// CUDA 13.0: the device of a given context (NULL: the current one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    status(ctx_device(Some(from_ptr(ctx)), device))
}

fn ctx_sync(ctx: Option<u64>) -> Res {
    let d = drv()?;
    let (dev, c) = {
        let inner = d.inner.lock();
        let h = match ctx {
            Some(h) if h != 0 => h,
            _ => inner.cur()?.0,
        };
        let c = inner.ctx(h)?;
        (c.dev, (c.dev, c.shared, c.shared_gen))
    };
    let target = d.state.lock_device(dev).dev().submitted(c.1);
    wait_seq(d, c.0, c.1, c.2, target);
    crate::pool::release_to_thresholds(d, dev);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    status(ctx_sync(None))
}

/// CUDA 13.0: synchronise a given context (NULL: the current one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    status(ctx_sync(Some(from_ptr(ctx))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        if from_ptr(ctx) != 0 {
            inner.ctx(from_ptr(ctx))?;
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(version, 12010) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let f = inner.cur()?.1.flags;
        // SAFETY: out-pointer from the caller.
        unsafe { put(flags, f) }
    }))
}

// ---- primary contexts -------------------------------------------------------------------
//
// A device's primary context keeps one handle for the life of the process, as with the real
// driver: NVIDIA's runtime keeps it across cudaDeviceReset (cuDevicePrimaryCtxReset) and makes it
// current again, which makes it active again, as if retained once.

/// Makes the primary context of `dev` active (it is not) under its handle of before, if it had
/// one; returns the handle. The caller sets the reference count.
fn activate_primary(d: &Driver, inner: &mut Inner, dev: CUdevice) -> Res<u64> {
    let (old, _, flags) = inner.primary[dev as usize];
    let h = create(d, inner, dev, flags, true)?;
    if old == 0 || old == h {
        return Ok(h);
    }
    let Some(c) = inner.ctxs.remove(h) else {
        return Ok(h);
    };
    Ok(match inner.ctxs.reinsert(old, c) {
        Ok(()) => old,
        Err(c) => inner.ctxs.insert(c),
    })
}

/// Context `h` if it exists; a primary context made inactive is activated again (held once).
pub fn revive(d: &Driver, inner: &mut Inner, h: u64) -> Res {
    if inner.ctxs.get(h).is_some() {
        return Ok(());
    }
    let dev = inner
        .primary
        .iter()
        .position(|&(p, refs, _)| p == h && refs == 0)
        .ok_or(E_INVALID_CONTEXT)?;
    let flags = inner.primary[dev].2;
    let now = activate_primary(d, inner, dev as CUdevice)?;
    inner.primary[dev] = (now, 1, flags);
    if now == h {
        Ok(())
    } else {
        Err(E_INVALID_CONTEXT)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    status(drv().and_then(|d| {
        if pctx.is_null() {
            return Err(E_INVALID_VALUE);
        }
        d.physical(dev)?;
        let mut inner = d.inner.lock();
        let (h, refs, flags) = inner.primary[dev as usize];
        let (h, refs) = if refs == 0 || inner.ctxs.get(h).is_none() {
            (activate_primary(d, &mut inner, dev)?, 0)
        } else {
            (h, refs)
        };
        inner.primary[dev as usize] = (h, refs + 1, flags);
        // SAFETY: checked non-NULL.
        unsafe { pctx.write(to_ptr(h)) };
        Ok(())
    }))
}

fn primary_release(dev: CUdevice) -> Res {
    let d = drv()?;
    d.physical(dev)?;
    let (h, refs, _) = d.inner.lock().primary[dev as usize];
    if refs == 1 {
        crate::export::context_ending(h);
    }
    let mut inner = d.inner.lock();
    let (h, refs, flags) = inner.primary[dev as usize];
    if refs == 0 {
        return Err(E_INVALID_CONTEXT);
    }
    inner.primary[dev as usize] = (h, refs - 1, flags);
    if refs == 1 {
        destroy(d, &mut inner, h)?;
        inner.primary[dev as usize] = (h, 0, flags);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    status(primary_release(dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    status(primary_release(dev))
}

fn primary_reset(dev: CUdevice) -> Res {
    let d = drv()?;
    d.physical(dev)?;
    let (h, refs, _) = d.inner.lock().primary[dev as usize];
    if refs > 0 {
        crate::export::context_ending(h);
    }
    let mut inner = d.inner.lock();
    let (h, refs, flags) = inner.primary[dev as usize];
    if refs > 0 && inner.ctxs.get(h).is_some() {
        destroy(d, &mut inner, h)?;
    }
    inner.primary[dev as usize] = (h, 0, flags);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    status(primary_reset(dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    status(primary_reset(dev))
}

fn primary_set_flags(dev: CUdevice, flags: c_uint) -> Res {
    let d = drv()?;
    d.physical(dev)?;
    d.inner.lock().primary[dev as usize].2 = flags;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    status(primary_set_flags(dev, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    status(primary_set_flags(dev, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    status(drv().and_then(|d| {
        d.physical(dev)?;
        let inner = d.inner.lock();
        let (h, refs, f) = inner.primary[dev as usize];
        let is_active = refs > 0 && inner.ctxs.get(h).is_some();
        // SAFETY: out-pointers from the caller.
        unsafe {
            put(flags, f)?;
            put(active, is_active as c_int)
        }
    }))
}
