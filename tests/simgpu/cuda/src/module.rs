//! Modules and kernels. A module image in simgpu's text format (`kernel NAME NS_PER_BLOCK` lines)
//! defines kernels with a cost; any other image (cubin, fatbin, PTX) loads too, and then every
//! kernel name resolves, costing 1 us per block. Loaded code takes device memory no allocation
//! call reveals: the image size rounded up to whole granules, for as long as the module is loaded.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};

use cuda_abi::{CUfunction, CUkernel, CUlibrary, CUmodule, CUresult};
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::memory::{give, take};

pub const DEFAULT_NS_PER_BLOCK: u64 = 1_000;

pub struct Module {
    pub ctx: u64,
    /// Kernels of a text image; None: any name resolves.
    pub kernels: Option<HashMap<String, u64>>,
    pub code: Option<(u32, AllocId)>,
}

pub struct Func {
    pub module: u64,
    pub ns_per_block: u64,
}

/// Parses simgpu's text kernel format; None if `text` is not in it.
pub fn parse_text_image(text: &str) -> Option<HashMap<String, u64>> {
    let mut kernels = HashMap::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let mut w = line.split_whitespace();
        match (
            w.next(),
            w.next(),
            w.next().and_then(|n| n.parse::<u64>().ok()),
            w.next(),
        ) {
            (Some("kernel"), Some(name), Some(ns), None) => kernels.insert(name.to_string(), ns),
            _ => return None,
        };
    }
    (!kernels.is_empty()).then_some(kernels)
}

/// The size of an image given by pointer only: ELF and fatbin headers say it, text ends at NUL.
///
/// # Safety
/// `image` must point to a valid module image.
unsafe fn image_len(image: *const u8) -> usize {
    // SAFETY: every image starts with at least 16 readable bytes or is a NUL-terminated string;
    // the header fields read below exist in the formats they belong to.
    unsafe {
        let head = std::slice::from_raw_parts(image, 4);
        if head == b"\x7fELF" {
            let shoff = (image.add(0x28) as *const u64).read_unaligned();
            let shentsize = (image.add(0x3a) as *const u16).read_unaligned() as u64;
            let shnum = (image.add(0x3c) as *const u16).read_unaligned() as u64;
            return (shoff + shentsize * shnum) as usize;
        }
        if (image as *const u32).read_unaligned() == 0xBA55_ED50 {
            let header = (image.add(6) as *const u16).read_unaligned() as u64;
            let body = (image.add(8) as *const u64).read_unaligned();
            return (header + body) as usize;
        }
        CStr::from_ptr(image as *const c_char).to_bytes().len()
    }
}

fn load(image: *const c_void) -> Res<u64> {
    if image.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    // SAFETY: the API contract: `image` is a module image.
    let len = unsafe { image_len(image as *const u8) };
    // SAFETY: text images are NUL-terminated; binary ones are not read as text past `len`.
    let text = unsafe { std::slice::from_raw_parts(image as *const u8, len) };
    let kernels = std::str::from_utf8(text).ok().and_then(parse_text_image);
    let code = take(d, dev, AllocKind::Module, len as u64)?;
    Ok(inner.modules.insert(Module {
        ctx,
        kernels,
        code: Some((dev, code)),
    }))
}

fn load_into(out: *mut CUmodule, image: *const c_void) -> Res {
    if out.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let h = load(image)?;
    // SAFETY: checked non-NULL.
    unsafe { out.write(to_ptr(h)) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut CUmodule, image: *const c_void) -> CUresult {
    status(load_into(out, image))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut CUmodule,
    image: *const c_void,
    _n: c_uint,
    _o: *mut c_void,
    _v: *mut *mut c_void,
) -> CUresult {
    status(load_into(out, image))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    out: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    status(load_into(out, image))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(out: *mut CUmodule, path: *const c_char) -> CUresult {
    status((|| {
        if path.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated path.
        let p = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let mut bytes = std::fs::read(&p).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
        bytes.push(0);
        load_into(out, bytes.as_ptr() as *const c_void)
    })())
}

fn unload(h: u64) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let m = inner.modules.remove(h).ok_or(E_INVALID_HANDLE)?;
    if let Some((dev, id)) = m.code {
        give(d, dev, id);
    }
    let funcs: Vec<u64> = inner
        .funcs
        .iter()
        .filter(|(_, f)| f.module == h)
        .map(|(fh, _)| fh)
        .collect();
    for f in funcs {
        inner.funcs.remove(f);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    status(unload(from_ptr(m)))
}

fn get_function(module: u64, name: *const c_char) -> Res<u64> {
    if name.is_null() {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated kernel name.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let d = drv()?;
    let mut inner = d.inner.lock();
    let m = inner.modules.get(module).ok_or(E_INVALID_HANDLE)?;
    let ns = match &m.kernels {
        Some(k) => *k.get(&name).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?,
        None => DEFAULT_NS_PER_BLOCK,
    };
    Ok(inner.funcs.insert(Func {
        module,
        ns_per_block: ns,
    }))
}

/// cuModuleGetFunction / cuLibraryGetKernel: the handle goes to `out`.
fn function_into(out: *mut *mut c_void, module: u64, name: *const c_char) -> CUresult {
    status(get_function(module, name).and_then(|f| {
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, to_ptr(f)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    function_into(out, from_ptr(m), name)
}

// CUDA 12 libraries: context-independent modules. A CUkernel is usable as a CUfunction.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    out: *mut CUlibrary,
    code: *const c_void,
    _jit_opts: *mut c_void,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_void,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    status(load_into(out, code))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    status(unload(from_ptr(lib)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    out: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    function_into(out, from_ptr(lib), name)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(out: *mut CUfunction, kernel: CUkernel) -> CUresult {
    status(drv().and_then(|d| {
        d.inner
            .lock()
            .funcs
            .get(from_ptr(kernel))
            .ok_or(E_INVALID_HANDLE)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, kernel) }
    }))
}

pub fn release_ctx(d: &Driver, inner: &mut Inner, ctx: u64) {
    let mods: Vec<u64> = inner
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(h, _)| h)
        .collect();
    for h in mods {
        if let Some(m) = inner.modules.remove(h)
            && let Some((dev, id)) = m.code
        {
            give(d, dev, id);
        }
        let funcs: Vec<u64> = inner
            .funcs
            .iter()
            .filter(|(_, f)| f.module == h)
            .map(|(fh, _)| fh)
            .collect();
        for f in funcs {
            inner.funcs.remove(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_images_define_kernels_and_others_do_not() {
        let k = parse_text_image("# a comment\nkernel spin 1000\n\nkernel big 250000\n").unwrap();
        assert_eq!(k["spin"], 1000);
        assert_eq!(k["big"], 250000);
        assert!(parse_text_image(".version 8.0\n.target sm_90\n").is_none());
        assert!(parse_text_image("kernel spin\n").is_none());
        assert!(parse_text_image("").is_none());
    }
}
