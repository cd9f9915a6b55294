//! Modules and kernels. A module image in simgpu's text format (`kernel NAME NS_PER_BLOCK` lines)
//! defines kernels whose blocks run one after another at that cost each. A PTX image defines the
//! kernels it declares with `.entry`, with their parameter layouts and the cost its
//! `simgpu-kernel` annotations give (`ptx.rs`); their blocks run side by side, one per SM. Any
//! other image (cubin, fatbin) loads too, and then every kernel name resolves, costing 1 us per
//! block, one block after another. With `CUDA_DISABLE_PTX_JIT=1`, as with the real driver, a PTX
//! image is refused (CUDA_ERROR_JIT_COMPILATION_DISABLED). Loaded code takes device memory no
//! allocation call reveals: the image size rounded up to whole granules, for as long as the
//! module is loaded.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};

use cuda_abi::{CUfunction, CUkernel, CUlibrary, CUmodule, CUresult};
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::memory::{give, take};
use crate::ptx::{BlockNs, Entry, Param};

pub const DEFAULT_NS_PER_BLOCK: u64 = 1_000;

/// A kernel, and so how long a launch keeps the engine busy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Blocks one after another, this many ns each (simgpu's text format, binary images).
    Serial(u64),
    /// A PTX kernel: its parameters are checked, its blocks run side by side, one per SM.
    Ptx(Entry),
}

/// A launch's kernel arguments, as the caller passed them: `kernelParams` (one pointer per
/// parameter) or `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER` / `_SIZE` pairs ending in `END`).
#[derive(Clone, Copy)]
pub struct Args {
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

impl Kernel {
    /// Engine nanoseconds a launch of `blocks` blocks takes on a device of `sms` SMs. Arguments
    /// that do not fit the declared parameters are refused as the driver refuses them.
    pub fn launch_ns(&self, blocks: u64, sms: u64, args: Args) -> Res<u64> {
        let e = match self {
            Kernel::Serial(ns) => return Ok(ns.saturating_mul(blocks)),
            Kernel::Ptx(e) => e,
        };
        let per_block = match e.block_ns {
            BlockNs::Fixed(ns) => {
                argument(&e.params, args, None)?;
                ns
            }
            BlockNs::Param(i) => argument(&e.params, args, Some(i))?,
        };
        Ok(per_block.saturating_mul(blocks.div_ceil(sms.max(1))))
    }
}

/// Checks a launch's arguments against the declared `layout` and reads parameter `want` (an
/// integer of 4 or 8 bytes, as `ptx::parse` made sure).
fn argument(layout: &[Param], args: Args, want: Option<usize>) -> Res<u64> {
    let read = |p: *const u8, size: usize| -> u64 {
        // SAFETY: the launch contract: the caller's argument storage holds the parameter.
        unsafe {
            if size == 8 {
                (p as *const u64).read_unaligned()
            } else {
                u64::from((p as *const u32).read_unaligned())
            }
        }
    };
    match (args.params.is_null(), args.extra.is_null()) {
        (true, true) if layout.is_empty() => Ok(0),
        (false, false) | (true, true) => Err(E_INVALID_VALUE),
        (false, true) => {
            let Some(i) = want else { return Ok(0) };
            // SAFETY: the launch contract: kernelParams holds one pointer per parameter.
            let p = unsafe { *args.params.add(i) };
            if p.is_null() {
                return Err(E_INVALID_VALUE);
            }
            Ok(read(p as *const u8, layout[i].size))
        }
        (true, false) => {
            let (mut buf, mut size) = (std::ptr::null::<u8>(), None);
            for k in (0..).step_by(2) {
                // SAFETY: the launch contract: `extra` is a list of key/value pairs that
                // ends with CU_LAUNCH_PARAM_END; we stop reading there.
                let key = unsafe { *args.extra.add(k) } as usize;
                if key == cuda_abi::CU_LAUNCH_PARAM_END_AS_INT {
                    break;
                }
                // SAFETY: as above: a key other than END is followed by its value.
                let value = unsafe { *args.extra.add(k + 1) };
                match key {
                    cuda_abi::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT => buf = value as *const u8,
                    cuda_abi::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT if !value.is_null() => {
                        // SAFETY: the value of BUFFER_SIZE points to a size_t.
                        size = Some(unsafe { *(value as *const usize) });
                    }
                    _ => return Err(E_INVALID_VALUE),
                }
            }
            let need = layout.last().map_or(0, |p: &Param| p.offset + p.size);
            if buf.is_null() || size.is_none_or(|s| s < need) {
                return Err(E_INVALID_VALUE);
            }
            let Some(i) = want else { return Ok(0) };
            // SAFETY: the buffer holds `size >= need` bytes, and the parameter lies within.
            Ok(read(unsafe { buf.add(layout[i].offset) }, layout[i].size))
        }
    }
}

pub struct Module {
    pub ctx: u64,
    /// Kernels the image defines; None: any name resolves.
    pub kernels: Option<HashMap<String, Kernel>>,
    pub code: Option<(u32, AllocId)>,
}

pub struct Func {
    pub module: u64,
    pub kernel: Kernel,
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

/// The kernels a text image defines: simgpu's format or PTX; None for anything else.
fn kernels_of(text: &str) -> Res<Option<HashMap<String, Kernel>>> {
    if let Some(k) = parse_text_image(text) {
        return Ok(Some(
            k.into_iter()
                .map(|(name, ns)| (name, Kernel::Serial(ns)))
                .collect(),
        ));
    }
    if !crate::ptx::is_ptx(text) {
        return Ok(None);
    }
    // The real driver's switch for a node that must not JIT-compile PTX.
    if std::env::var("CUDA_DISABLE_PTX_JIT").is_ok_and(|v| v == "1") {
        return Err(CUresult::CUDA_ERROR_JIT_COMPILATION_DISABLED);
    }
    match crate::ptx::parse(text) {
        Ok(k) => Ok(Some(
            k.into_iter()
                .map(|(name, e)| (name, Kernel::Ptx(e)))
                .collect(),
        )),
        Err(why) => {
            eprintln!("simgpu: cuModuleLoadData: PTX refused: {why}");
            Err(CUresult::CUDA_ERROR_INVALID_PTX)
        }
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
    let kernels = match std::str::from_utf8(text) {
        Ok(t) => kernels_of(t)?,
        Err(_) => None,
    };
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
    let kernel = match &m.kernels {
        Some(k) => k.get(&name).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?.clone(),
        None => Kernel::Serial(DEFAULT_NS_PER_BLOCK),
    };
    Ok(inner.funcs.insert(Func { module, kernel }))
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
