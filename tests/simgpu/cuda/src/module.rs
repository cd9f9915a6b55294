//! Modules and kernels. A module image in simgpu's text format (`kernel NAME NS_PER_BLOCK` lines,
//! each with `wait` after it for a kernel that waits for the clock rather than works) defines
//! kernels whose blocks run one after another at that cost each. A PTX image defines the
//! kernels it declares with `.entry`, with their parameter layouts and the cost its
//! `simgpu-kernel` annotations give (`ptx.rs`); their blocks run side by side, one per SM. Any
//! other image (an ELF cubin, a fatbin, or the `__fatBinC_Wrapper_t` NVIDIA's runtime registers)
//! loads too, and then every kernel name resolves, costing `SIMGPU_NS_PER_BLOCK` (default 1 us)
//! per block, one block after another: such code is timed, never run. With
//! `CUDA_DISABLE_PTX_JIT=1`, as with the real driver, a PTX image is refused
//! (CUDA_ERROR_JIT_COMPILATION_DISABLED). Loaded code takes device memory no allocation call
//! reveals: the image size rounded up to whole granules, for as long as the module is loaded.
//! A CUlibrary is a module, and a CUkernel a CUfunction, so either goes wherever the other does.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use cuda_abi::{CUfunction, CUkernel, CUlibrary, CUmodule, CUresult};
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::memory::{give, take};
use crate::ptx::{BlockNs, Entry, Param, Timing};

pub const DEFAULT_NS_PER_BLOCK: u64 = 1_000;

/// What a block of a kernel from a binary image costs: `SIMGPU_NS_PER_BLOCK`, else 1 us.
pub fn binary_ns_per_block() -> u64 {
    std::env::var("SIMGPU_NS_PER_BLOCK")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_NS_PER_BLOCK)
}

/// `__fatBinC_Wrapper_t` and fatbin header magics.
const FATBINC_MAGIC: u32 = 0x4662_43B1;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// The size of the fatbin at `p` (header and members), or None if it is not one.
///
/// # Safety
/// `p` must be NULL or point to at least 16 readable bytes.
unsafe fn fatbin_len(p: *const u8) -> Option<usize> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract; a fatbin header is 16 bytes.
    unsafe {
        if (p as *const u32).read_unaligned() != FATBIN_MAGIC {
            return None;
        }
        let header = (p.add(6) as *const u16).read_unaligned() as u64;
        let body = (p.add(8) as *const u64).read_unaligned();
        Some((header + body) as usize)
    }
}

/// The fatbins a `__fatBinC_Wrapper_t` holds, with their sizes: version 1 points to one,
/// version 2 to a NULL-terminated array. Err for a wrapper of another version or a bad fatbin.
///
/// # Safety
/// `w` must point to a wrapper (magic checked by the caller).
unsafe fn wrapped_fatbins(w: *const u8) -> Res<Vec<(*const u8, usize)>> {
    // SAFETY: a wrapper is {u32 magic, u32 version, fatbin pointer, pointer}; the pointers it
    // holds point to fatbins (version 1) or a NULL-terminated array of them (version 2).
    unsafe {
        let version = (w.add(4) as *const u32).read_unaligned();
        let data = (w.add(8) as *const *const u8).read_unaligned();
        let list = (w.add(16) as *const *const *const u8).read_unaligned();
        let heads: Vec<*const u8> = match version {
            1 => vec![data],
            2 if !list.is_null() => (0..)
                .map(|i| list.add(i).read_unaligned())
                .take_while(|p| !p.is_null())
                .take(4096)
                .collect(),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_IMAGE),
        };
        heads
            .into_iter()
            .map(|p| {
                fatbin_len(p)
                    .map(|n| (p, n))
                    .ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)
            })
            .collect()
    }
}

/// A kernel, and so how long a launch keeps the engine busy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Blocks one after another, `ns` each (simgpu's text format, binary images).
    Serial { ns: u64, timing: Timing },
    /// A PTX kernel: its parameters are checked, its blocks run side by side, one per SM.
    Ptx(Entry),
}

/// What one launch asks of the engine: `ns` of work, or a wait of `ns` for the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub ns: u64,
    pub timing: Timing,
}

/// A launch's kernel arguments, as the caller passed them: `kernelParams` (one pointer per
/// parameter) or `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER` / `_SIZE` pairs ending in `END`).
#[derive(Clone, Copy)]
pub struct Args {
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

impl Kernel {
    /// What a launch of `blocks` blocks asks of a device of `sms` SMs (a kernel that waits does
    /// so for all its blocks at once). Arguments that do not fit the declared parameters are
    /// refused as the driver refuses them.
    pub fn launch_cost(&self, blocks: u64, sms: u64, args: Args) -> Res<Cost> {
        let e = match self {
            Kernel::Serial { ns, timing } => {
                return Ok(Cost {
                    ns: ns.saturating_mul(blocks),
                    timing: *timing,
                });
            }
            Kernel::Ptx(e) => e,
        };
        let per_block = match e.block_ns {
            BlockNs::Fixed(ns) => {
                argument(&e.params, args, None)?;
                ns
            }
            BlockNs::Param(i) => argument(&e.params, args, Some(i))?,
        };
        Ok(Cost {
            ns: per_block.saturating_mul(blocks.div_ceil(sms.max(1))),
            timing: e.timing,
        })
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
    /// A CUlibrary: it outlives the context it was loaded in.
    pub library: bool,
}

pub struct Func {
    pub module: u64,
    pub kernel: Kernel,
}

/// Parses simgpu's text kernel format (`kernel NAME NS_PER_BLOCK [wait]` lines); None if `text`
/// is not in it.
pub fn parse_text_image(text: &str) -> Option<HashMap<String, Kernel>> {
    let mut kernels = HashMap::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let mut w = line.split_whitespace();
        let (Some("kernel"), Some(name), Some(ns), how, None) = (
            w.next(),
            w.next(),
            w.next().and_then(|n| n.parse::<u64>().ok()),
            w.next(),
            w.next(),
        ) else {
            return None;
        };
        let timing = match how {
            None => Timing::Work,
            Some("wait") => Timing::Wait,
            Some(_) => return None,
        };
        kernels.insert(name.to_string(), Kernel::Serial { ns, timing });
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
        if let Some(n) = fatbin_len(image) {
            return n;
        }
        CStr::from_ptr(image as *const c_char).to_bytes().len()
    }
}

/// The kernels a text image defines: simgpu's format or PTX; None for anything else.
fn kernels_of(text: &str) -> Res<Option<HashMap<String, Kernel>>> {
    if let Some(k) = parse_text_image(text) {
        return Ok(Some(k));
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

fn load(image: *const c_void, library: bool) -> Res<u64> {
    if image.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    // SAFETY: the API contract: `image` is a module image; every image has 4 bytes.
    let wrapper = unsafe { (image as *const u32).read_unaligned() } == FATBINC_MAGIC;
    let (len, kernels) = if wrapper {
        // SAFETY: the magic says `image` is a wrapper.
        let fatbins = unsafe { wrapped_fatbins(image as *const u8) }?;
        (fatbins.iter().map(|f| f.1).sum::<usize>(), None)
    } else {
        // SAFETY: the API contract: `image` is a module image.
        let len = unsafe { image_len(image as *const u8) };
        // SAFETY: text images are NUL-terminated; binary ones are not read as text past `len`.
        let text = unsafe { std::slice::from_raw_parts(image as *const u8, len) };
        let kernels = match std::str::from_utf8(text) {
            Ok(t) => kernels_of(t)?,
            Err(_) => None,
        };
        (len, kernels)
    };
    let code = take(d, dev, AllocKind::Module, len as u64)?;
    Ok(inner.modules.insert(Module {
        ctx,
        kernels,
        code: Some((dev, code)),
        library,
    }))
}

fn load_into(out: *mut CUmodule, image: *const c_void) -> Res {
    load_as(out, image, false)
}

fn load_as(out: *mut CUmodule, image: *const c_void, library: bool) -> Res {
    if out.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let h = load(image, library)?;
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
        None => Kernel::Serial {
            ns: binary_ns_per_block(),
            timing: Timing::Work,
        },
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
    status(load_as(out, code, true))
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

/// A library's module: the library itself (a CUlibrary is a module here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(out: *mut CUmodule, lib: CUlibrary) -> CUresult {
    status(drv().and_then(|d| {
        d.inner
            .lock()
            .modules
            .get(from_ptr(lib))
            .ok_or(E_INVALID_HANDLE)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, lib) }
    }))
}

/// `CU_MODULE_LAZY_LOADING` (2), as the real driver's default since CUDA 12.2, unless
/// `CUDA_MODULE_LOADING=EAGER` asks for `CU_MODULE_EAGER_LOADING` (1). simgpu charges a
/// module's memory when it loads either way.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(unsafe { put(mode, if eager { 1 } else { 2 }) })
}

/// What a kernel reports for `CUfunction_attribute` `attrib`: H100-like limits, no registers,
/// shared or local memory (the code never runs).
fn func_attribute(f: u64, attrib: c_int) -> Res<c_int> {
    let d = drv()?;
    d.inner.lock().funcs.get(f).ok_or(E_INVALID_HANDLE)?;
    let c = d.state.config();
    let cc = (c.cc_major * 10 + c.cc_minor) as c_int;
    Ok(match attrib {
        0 => 1024,     // MAX_THREADS_PER_BLOCK
        1..=3 => 0,    // SHARED / CONST / LOCAL_SIZE_BYTES
        4 => 32,       // NUM_REGS
        5 | 6 => cc,   // PTX_VERSION, BINARY_VERSION
        7 => 0,        // CACHE_MODE_CA
        8 => 48 << 10, // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,       // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=15 => 0,  // cluster attributes
        _ => return Err(E_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    out: *mut c_int,
    attrib: c_int,
    f: CUfunction,
) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(func_attribute(from_ptr(f), attrib).and_then(|v| unsafe { put(out, v) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    out: *mut c_int,
    attrib: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(func_attribute(from_ptr(k), attrib).and_then(|v| unsafe { put(out, v) }))
}

/// Setting an attribute is accepted for a settable one and changes nothing simgpu models.
fn func_set_attribute(f: u64, attrib: c_int) -> Res {
    let d = drv()?;
    d.inner.lock().funcs.get(f).ok_or(E_INVALID_HANDLE)?;
    match attrib {
        8..=15 => Ok(()),
        _ => Err(E_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(
    f: CUfunction,
    attrib: c_int,
    _value: c_int,
) -> CUresult {
    status(func_set_attribute(from_ptr(f), attrib))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: c_int,
    _value: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    status(func_set_attribute(from_ptr(k), attrib))
}

/// Unloads the modules of context `ctx`, which is being destroyed. Libraries stay, with their
/// code memory, until cuLibraryUnload: they are not tied to a context, and their kernels work in
/// the next one (the real driver loads a library into each context that uses it).
pub fn release_ctx(d: &Driver, inner: &mut Inner, ctx: u64) {
    let mods: Vec<u64> = inner
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(h, _)| h)
        .collect();
    for h in mods {
        if let Some(m) = inner.modules.get_mut(h)
            && m.library
        {
            m.ctx = 0;
            continue;
        }
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

    /// A fatbin of `body` bytes after its 16-byte header, 8-byte aligned.
    fn fatbin(body: u64) -> Vec<u64> {
        let mut f = vec![0u64; 2 + body as usize / 8];
        f[0] = u64::from(FATBIN_MAGIC) | 1 << 32 | 16 << 48;
        f[1] = body;
        f
    }

    fn wrapper(version: u32, data: *const u64, list: *const *const u64) -> [u64; 3] {
        [
            u64::from(FATBINC_MAGIC) | u64::from(version) << 32,
            data as u64,
            list as u64,
        ]
    }

    #[test]
    fn fatbin_wrappers_of_both_versions_give_their_fatbins() {
        let (a, b) = (fatbin(64), fatbin(128));
        let w1 = wrapper(1, a.as_ptr(), std::ptr::null());
        // SAFETY: a wrapper of version 1 pointing to a fatbin.
        let got = unsafe { wrapped_fatbins(w1.as_ptr() as *const u8) }.unwrap();
        assert_eq!(got, vec![(a.as_ptr() as *const u8, 80)]);
        let list = [a.as_ptr(), b.as_ptr(), std::ptr::null()];
        let w2 = wrapper(2, std::ptr::null(), list.as_ptr());
        // SAFETY: a wrapper of version 2 pointing to a NULL-terminated list of fatbins.
        let got = unsafe { wrapped_fatbins(w2.as_ptr() as *const u8) }.unwrap();
        assert_eq!(got.iter().map(|f| f.1).collect::<Vec<_>>(), vec![80, 144]);
        let w3 = wrapper(3, a.as_ptr(), std::ptr::null());
        // SAFETY: a wrapper (of an unknown version).
        let bad = unsafe { wrapped_fatbins(w3.as_ptr() as *const u8) };
        assert_eq!(bad, Err(CUresult::CUDA_ERROR_INVALID_IMAGE));
        let not_fatbin = [0u64; 4];
        let w4 = wrapper(1, not_fatbin.as_ptr(), std::ptr::null());
        // SAFETY: a wrapper pointing to 32 readable bytes.
        let bad = unsafe { wrapped_fatbins(w4.as_ptr() as *const u8) };
        assert_eq!(bad, Err(CUresult::CUDA_ERROR_INVALID_IMAGE));
        // SAFETY: a fatbin header.
        assert_eq!(unsafe { image_len(b.as_ptr() as *const u8) }, 144);
    }

    #[test]
    fn an_elf_image_ends_with_its_section_headers() {
        let mut elf = [0u8; 0x40];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[0x28..0x30].copy_from_slice(&0x200u64.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&5u16.to_le_bytes());
        // SAFETY: an ELF header of 64 bytes.
        assert_eq!(unsafe { image_len(elf.as_ptr()) }, 0x200 + 64 * 5);
    }

    #[test]
    fn text_images_define_kernels_and_others_do_not() {
        let k =
            parse_text_image("# a comment\nkernel spin 1000 wait\n\nkernel big 250000\n").unwrap();
        let serial = |ns, timing| Kernel::Serial { ns, timing };
        assert_eq!(k["spin"], serial(1000, Timing::Wait));
        assert_eq!(k["big"], serial(250000, Timing::Work));
        assert!(parse_text_image(".version 8.0\n.target sm_90\n").is_none());
        assert!(parse_text_image("kernel spin\n").is_none());
        assert!(parse_text_image("kernel spin 1000 later\n").is_none());
        assert!(parse_text_image("kernel spin 1000 wait wait\n").is_none());
        assert!(parse_text_image("").is_none());
    }
}
