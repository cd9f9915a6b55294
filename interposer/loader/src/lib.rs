//! `libcuslice.so`, the object `/etc/ld.so.preload` and `LD_PRELOAD` name: a small loader that
//! every process of a container maps, and that stays all but free until the process reaches CUDA.
//!
//! It exports the same entry points as the interposer (`libcuslice_core.so`, the crate in
//! `interposer/`), plus `dlsym` and `dlmopen`, and does nothing at load: no constructor, no
//! allocation, no dependency beyond libc. Each exported entry point is a one-instruction jump
//! through a slot. A slot starts at a resolver that loads the core from this file's own directory
//! (`dlopen`, local scope), points every slot at the core's wrapper (a driver entry point's
//! behind its gate stub, which holds the calls of a frozen process), and jumps there with the
//! caller's registers untouched; from then on a call costs one indirect jump more than calling
//! the core directly. `dlsym` lookups of a `cu*`/`nvml*` name load the core the same way and hand
//! the lookup to it (the route programs that `dlopen` the driver take, which then never pass
//! through a stub at all); every other lookup goes to glibc through shim-c's trampoline with the
//! caller's return address intact.
//!
//! If the core cannot be loaded, one line says why on stderr and every entry point answers
//! CUDA_ERROR_NOT_INITIALIZED / NVML_ERROR_UNINITIALIZED: a process is never left unlimited
//! because its cap could not be loaded. See docs/interposer.md ("Start-up: the loader").
//!
//! Built `no_std` with `panic = "abort"` (the release profile, which is what is installed and
//! tested); builds that unwind (`cargo check` in the dev profile) link std instead, as no_std
//! cannot unwind.

#![cfg_attr(panic = "abort", no_std)]
#![allow(non_snake_case)]

mod sys;

use core::ffi::{CStr, c_char, c_int, c_long, c_void};

/// The release this library belongs to, as `cuslice doctor` reads it from the installed file:
/// `cuslice_state::release`'s mark, spelled out here because the loader depends on nothing.
#[used]
static RELEASE: [u8; RELEASE_TEXT.len()] = bytes_of(RELEASE_TEXT);
const RELEASE_TEXT: &str = concat!("cuslice-release ", env!("CARGO_PKG_VERSION"), "\0");

const fn bytes_of<const N: usize>(text: &str) -> [u8; N] {
    let (b, mut a, mut i) = (text.as_bytes(), [0u8; N], 0);
    while i < N {
        a[i] = b[i];
        i += 1;
    }
    a
}
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

/// The interface between this loader and the core; the core refuses another number.
const CORE_ABI: u32 = 2;
/// The core's file name, looked for beside this file.
const CORE_FILE: &[u8] = b"libcuslice_core.so";

/// CUDA_ERROR_NOT_INITIALIZED and NVML_ERROR_UNINITIALIZED: what every entry point answers
/// when the core could not be loaded.
const CUDA_NOT_INITIALIZED: c_int = 3;
const NVML_UNINITIALIZED: c_int = 1;

#[cfg(all(panic = "abort", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here indexes or unwraps; should anything panic all the same, abort as the core does.
    // SAFETY: abort(3) takes no arguments and never returns.
    unsafe { sys::abort() }
}

// Rust's precompiled `core` refers to `rust_eh_personality` from its unwind tables even when
// this crate aborts on panic; nothing here ever unwinds, so a hidden definition that traps
// satisfies the link without exporting anything (global_asm symbols are not in the cdylib's
// export list).
#[cfg(all(panic = "abort", target_arch = "x86_64"))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality, @function",
    "rust_eh_personality:",
    "ud2",
);
#[cfg(all(panic = "abort", target_arch = "aarch64"))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality, %function",
    "rust_eh_personality:",
    "brk #1",
);

/// Defines, for entry `i` named `name`: the exported stub (a jump through `SLOTS[i]`) and the
/// resolver `SLOTS[i]` starts at (loads the core, then jumps where the slot now points).
macro_rules! exports {
    ($($i:literal $name:ident $resolve:ident;)*) => {
        $(
            /// Exported entry point: jumps to the core's wrapper (or the resolver, the first time).
            ///
            /// # Safety
            /// The CUDA/NVML function of this name's contract; the arguments pass through untouched.
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "jmp qword ptr [rip + {slots} + {off}]",
                    slots = sym SLOTS,
                    off = const $i * 8,
                )
            }

            /// As on x86_64.
            ///
            /// # Safety
            /// As on x86_64.
            #[cfg(target_arch = "aarch64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "adrp x16, {slots}",
                    "add x16, x16, :lo12:{slots}",
                    "ldr x16, [x16, #{off}]",
                    "br x16",
                    slots = sym SLOTS,
                    off = const $i * 8,
                )
            }

            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            unsafe extern "C" fn $resolve() {
                core::arch::naked_asm!("mov r11d, {i}", "jmp {common}", i = const $i, common = sym resolve_common)
            }

            #[cfg(target_arch = "aarch64")]
            #[unsafe(naked)]
            unsafe extern "C" fn $resolve() {
                core::arch::naked_asm!("mov x17, #{i}", "b {common}", i = const $i, common = sym resolve_common)
            }
        )*

        /// Where each exported entry point jumps: its resolver until the core is loaded, then the
        /// core's wrapper (or a stub answering "not initialised" if the core could not be loaded).
        static SLOTS: [AtomicPtr<()>; COUNT] = [$(AtomicPtr::new($resolve as *mut ())),*];
    };
}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));
include!("../../../shim-c/call_keeping_args.rs");

/// Saves every argument register, asks `resolve(i)` (entry index in r11) where entry `i` now
/// goes, restores the registers and jumps there: the caller's frame and return address are as
/// the caller left them, whatever the entry point's prototype (variadic ones included: %al).
#[unsafe(naked)]
unsafe extern "C" fn resolve_common() {
    call_keeping_args!(resolve)
}

/// Where entry `i` goes now that the core is loaded (or failed to load).
extern "C" fn resolve(i: u32) -> *mut () {
    load_core();
    match SLOTS.get(i as usize) {
        Some(slot) => slot.load(Ordering::Acquire),
        // Only the stubs call this, with their own index.
        None => cuda_not_initialized as *mut (),
    }
}

extern "C" fn cuda_not_initialized() -> c_int {
    CUDA_NOT_INITIALIZED
}

extern "C" fn nvml_uninitialized() -> c_int {
    NVML_UNINITIALIZED
}

const IDLE: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// The core's `cuslice_dlsym_route` and `cuslice_dlmopen`, once loaded.
static CORE_ROUTE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static CORE_DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlmopenFn = unsafe extern "C" fn(c_long, *const c_char, c_int) -> *mut c_void;
type AttachFn = unsafe extern "C" fn(u32, *mut c_void, *mut c_void) -> u32;
type GateFn = unsafe extern "C" fn(*mut c_void) -> *mut c_void;

/// Loads the core and points every slot at it; on failure, says why once and points every slot at
/// "not initialised". Idempotent: threads that race here load the same object (dlopen counts
/// references) and store the same values. True when the core is loaded.
fn load_core() -> bool {
    match STATE.load(Ordering::Acquire) {
        READY => return true,
        FAILED => return false,
        _ => {}
    }
    let (Some(real_dlsym), Some(real_dlmopen)) = (sys::real_dlsym(), sys::real_dlmopen()) else {
        return fail(
            b"glibc's dlsym or dlmopen cannot be found (is this a glibc system?)",
            None,
        );
    };
    // Beside this file as it was named when loaded; failing that, beside the file a symbolic
    // link of that name points to.
    let mut path = sys::PathBuf::new();
    if !sys::own_dir(&mut path, false) || !path.push(CORE_FILE) {
        return fail(
            b"cannot tell which directory libcuslice.so was loaded from",
            None,
        );
    }
    // SAFETY: a NUL-terminated path; RTLD_LOCAL keeps the core's exports out of the global scope,
    // where this loader's stand in for them.
    let mut h = unsafe { sys::dlopen(path.as_ptr(), sys::RTLD_NOW | sys::RTLD_LOCAL) };
    if h.is_null() {
        let mut why = sys::Line::new();
        why.push(sys::dlerror_text().to_bytes());
        let mut real = sys::PathBuf::new();
        if sys::own_dir(&mut real, true) && real.push(CORE_FILE) && real.as_cstr() != path.as_cstr()
        {
            // SAFETY: as above.
            h = unsafe { sys::dlopen(real.as_ptr(), sys::RTLD_NOW | sys::RTLD_LOCAL) };
        }
        if h.is_null() {
            return fail(b"cannot load the interposer", Some(why.as_cstr()));
        }
    }
    // SAFETY: glibc's dlsym on a live handle with NUL-terminated names.
    let (attach, route, dlm) = unsafe {
        (
            real_dlsym(h, c"cuslice_core_attach".as_ptr()),
            real_dlsym(h, c"cuslice_dlsym_route".as_ptr()),
            real_dlsym(h, c"cuslice_dlmopen".as_ptr()),
        )
    };
    if attach.is_null() || route.is_null() || dlm.is_null() {
        return fail(
            b"libcuslice_core.so lacks the loader's interface",
            Some(path.as_cstr()),
        );
    }
    // SAFETY: the core defines cuslice_core_attach with exactly this prototype (interposer/src/dlsym.rs).
    let attach = unsafe { core::mem::transmute::<*mut c_void, AttachFn>(attach) };
    // SAFETY: the attach call hands the core glibc's own dlsym and dlmopen.
    let abi = unsafe {
        attach(
            CORE_ABI,
            real_dlsym as *mut c_void,
            real_dlmopen as *mut c_void,
        )
    };
    if abi != CORE_ABI {
        return fail(
            b"libcuslice_core.so is from another cuslice build than libcuslice.so; install both from one build",
            Some(path.as_cstr()),
        );
    }
    // SAFETY: as above.
    let gate = unsafe { real_dlsym(h, c"cuslice_gate_stub".as_ptr()) };
    if gate.is_null() {
        return fail(
            b"libcuslice_core.so lacks the loader's interface",
            Some(path.as_cstr()),
        );
    }
    // SAFETY: the core defines cuslice_gate_stub with exactly this prototype (interposer/src/gate.rs).
    let gate = unsafe { core::mem::transmute::<*mut c_void, GateFn>(gate) };
    for (i, slot) in SLOTS.iter().enumerate() {
        let (Some(name), Some(nvml)) = (NAMES.get(i), IS_NVML.get(i)) else {
            continue;
        };
        // SAFETY: as above.
        let p = unsafe { real_dlsym(h, name.as_ptr()) };
        slot.store(
            if !p.is_null() && !*nvml {
                // SAFETY: any address; a driver entry point goes through its gate stub.
                unsafe { gate(p) }.cast()
            } else if !p.is_null() {
                p.cast()
            } else if *nvml {
                nvml_uninitialized as *mut ()
            } else {
                cuda_not_initialized as *mut ()
            },
            Ordering::Release,
        );
    }
    CORE_ROUTE.store(route, Ordering::Release);
    CORE_DLMOPEN.store(dlm, Ordering::Release);
    STATE.store(READY, Ordering::Release);
    true
}

/// Says once why the core is not loaded and makes every entry point answer "not initialised".
fn fail(why: &[u8], detail: Option<&CStr>) -> bool {
    if STATE.swap(FAILED, Ordering::AcqRel) != FAILED {
        for (i, slot) in SLOTS.iter().enumerate() {
            let nvml = IS_NVML.get(i).copied().unwrap_or(false);
            let f = if nvml {
                nvml_uninitialized as *mut ()
            } else {
                cuda_not_initialized as *mut ()
            };
            slot.store(f, Ordering::Release);
        }
        let mut line = sys::Line::new();
        line.push(b"cuslice: ");
        line.push(why);
        if let Some(d) = detail {
            line.push(b" (");
            line.push(d.to_bytes());
            line.push(b")");
        }
        line.push(
            b"; CUDA and NVML calls in this process fail until libcuslice_core.so from the same build \
              sits beside libcuslice.so (cuslice install puts both there).",
        );
        line.write_stderr();
    }
    false
}

/// The index of the exported entry point named exactly `name`.
fn index_of(name: &[u8]) -> Option<usize> {
    NAMES.iter().position(|n| n.to_bytes() == name)
}

unsafe extern "C" {
    /// shim-c/dlsym_*.S
    fn cuslice_dlsym_trampoline();
    /// Where the trampoline jumps to forward a lookup; set before `cuslice_dlsym_route` returns.
    static cuslice_real_dlsym: AtomicPtr<c_void>;
}

/// The exported `dlsym`: a jump into the trampoline, so the caller's frame is untouched.
///
/// # Safety
/// glibc's dlsym contract: a valid handle and a NUL-terminated name.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("jmp {t}", t = sym cuslice_dlsym_trampoline)
}

/// As on x86_64.
///
/// # Safety
/// glibc's dlsym contract: a valid handle and a NUL-terminated name.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("b {t}", t = sym cuslice_dlsym_trampoline)
}

/// Called by the trampoline for every `dlsym` of the process: the wrapper the core answers with,
/// or NULL to forward the lookup to glibc. A name that is not `cu*`/`nvml*` is forwarded after two
/// byte compares, without loading anything; an RTLD_DEFAULT lookup, unless it finds libcuda's.
///
/// # Safety
/// Called only by the trampoline with the caller's `dlsym` arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuslice_dlsym_route(
    handle: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    let Some(real) = sys::real_dlsym() else {
        return core::ptr::null_mut();
    };
    // SAFETY: an extern static of atomic type, defined in shim-c, zero-initialised.
    unsafe { &cuslice_real_dlsym }.store(real as *mut c_void, Ordering::Release);
    if name.is_null() || handle == sys::RTLD_NEXT {
        return core::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is NUL-terminated, so its first two bytes can be read
    // one at a time (the second only if the first is not the terminator).
    let (a, b) = unsafe { (*name as u8, if *name == 0 { 0 } else { *name.add(1) as u8 }) };
    if !((a == b'c' && b == b'u') || (a == b'n' && b == b'v')) {
        return core::ptr::null_mut();
    }
    // RTLD_DEFAULT finds this loader's exports of the wrapped names by itself; the core answers
    // it only for the driver's other functions (behind their gate stubs), so it is asked only
    // when the lookup finds a function of libcuda.
    // SAFETY: the caller's arguments, valid per dlsym's contract.
    if handle == sys::RTLD_DEFAULT && !in_libcuda(unsafe { real(handle, name) }) {
        return core::ptr::null_mut();
    }
    if load_core() {
        let route = CORE_ROUTE.load(Ordering::Acquire);
        // SAFETY: the core's cuslice_dlsym_route has the trampoline's prototype (as here).
        let route = unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(route) };
        // SAFETY: the caller's arguments, valid per dlsym's contract.
        return unsafe { route(handle, name) };
    }
    // No core: a lookup that would find one of the driver's entry points cuslice wraps gets this
    // loader's stub, which answers "not initialised", rather than the uncapped driver.
    // SAFETY: NUL-terminated per dlsym's contract.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    match index_of(bytes) {
        // SAFETY: the caller's arguments, valid per dlsym's contract.
        Some(i) if !unsafe { real(handle, name) }.is_null() => SLOTS
            .get(i)
            .map_or(core::ptr::null_mut(), |s| s.load(Ordering::Acquire).cast()),
        _ => core::ptr::null_mut(),
    }
}

/// Whether `p` is a function of libcuda.so.
fn in_libcuda(p: *mut c_void) -> bool {
    if p.is_null() {
        return false;
    }
    let mut info = sys::DlInfo {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    // SAFETY: dladdr reads any address and fills `info`.
    if unsafe { sys::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's file name is NUL-terminated and lives as long as the object.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let base = file.rsplit(|&c| c == b'/').next().unwrap_or(file);
    base.starts_with(b"libcuda.so")
}

/// The exported `dlmopen`: opening the driver into another link-map namespace (where no preload
/// applies) is the core's business (interposer/src/dlmopen.rs); everything else goes to glibc.
///
/// # Safety
/// glibc's dlmopen contract: a valid namespace id, and NULL or a NUL-terminated file name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void {
    let Some(real) = sys::real_dlmopen() else {
        return core::ptr::null_mut();
    };
    if lmid == sys::LM_ID_BASE || file.is_null() {
        // SAFETY: forwarded unchanged.
        return unsafe { real(lmid, file, mode) };
    }
    if !load_core() {
        // The core decides what is the driver; without it no new namespace is opened, so the
        // driver cannot be reached uncapped that way.
        return core::ptr::null_mut();
    }
    let f = CORE_DLMOPEN.load(Ordering::Acquire);
    // SAFETY: the core's cuslice_dlmopen has dlmopen's prototype.
    let f = unsafe { core::mem::transmute::<*mut c_void, DlmopenFn>(f) };
    // SAFETY: the caller's arguments, valid per dlmopen's contract.
    unsafe { f(lmid, file, mode) }
}
