//! The few libc/libdl functions the loader calls, declared here rather than through the libc
//! crate (whose `std` feature, enabled by the rest of the workspace, would pull std in), and
//! two fixed buffers: a path and a log line. Nothing here allocates.

use core::ffi::{CStr, c_char, c_int, c_long, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

pub const RTLD_NOW: c_int = 2;
pub const RTLD_LOCAL: c_int = 0;
pub const RTLD_DEFAULT: *mut c_void = core::ptr::null_mut();
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
pub const LM_ID_BASE: c_long = 0;

#[repr(C)]
pub struct DlInfo {
    pub dli_fname: *const c_char,
    pub dli_fbase: *mut c_void,
    pub dli_sname: *const c_char,
    pub dli_saddr: *mut c_void,
}

// glibc before 2.34 keeps the dl* functions in libdl; since 2.34 libdl is an empty stub and
// libc has them (the linker drops libdl then, as nothing comes from it).
#[link(name = "dl")]
unsafe extern "C" {
    pub fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    pub fn dlerror() -> *const c_char;
    pub fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    pub fn dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void;
}

#[link(name = "c")]
unsafe extern "C" {
    pub fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char;
    pub fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    #[cfg_attr(any(test, panic = "unwind"), allow(dead_code))]
    pub fn abort() -> !;
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlmopenFn = unsafe extern "C" fn(c_long, *const c_char, c_int) -> *mut c_void;

#[cfg(target_arch = "x86_64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
#[cfg(target_arch = "x86_64")]
const DLMOPEN_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.3.4"];
#[cfg(target_arch = "aarch64")]
const DLMOPEN_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];

/// glibc's own definition of `name`, newest version first, cached in `slot`. The loader is
/// preloaded, so `RTLD_NEXT` from it is glibc's definition (this loader's own `dlsym` and
/// `dlmopen` come first in the search order).
fn next(slot: &AtomicPtr<c_void>, name: &CStr, versions: &[&CStr]) -> *mut c_void {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    for v in versions {
        // SAFETY: dlvsym (not overridden by cuslice) with NUL-terminated strings.
        let f = unsafe { dlvsym(RTLD_NEXT, name.as_ptr(), v.as_ptr()) };
        if !f.is_null() {
            slot.store(f, Ordering::Release);
            return f;
        }
    }
    core::ptr::null_mut()
}

pub fn real_dlsym() -> Option<DlsymFn> {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    let p = next(&SLOT, c"dlsym", &DLSYM_VERSIONS);
    // SAFETY: null or glibc's dlsym, which has exactly this prototype; Option<fn> has the null niche.
    unsafe { core::mem::transmute::<*mut c_void, Option<DlsymFn>>(p) }
}

pub fn real_dlmopen() -> Option<DlmopenFn> {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    let p = next(&SLOT, c"dlmopen", &DLMOPEN_VERSIONS);
    // SAFETY: null or glibc's dlmopen, which has exactly this prototype.
    unsafe { core::mem::transmute::<*mut c_void, Option<DlmopenFn>>(p) }
}

/// dlerror's text (empty if there is none).
pub fn dlerror_text() -> &'static CStr {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays valid until the next
    // dl* call of this thread; the loader uses it at once, for the one failure line.
    let p = unsafe { dlerror() };
    if p.is_null() {
        c""
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }
    }
}

/// A NUL-terminated path in a fixed buffer.
pub struct PathBuf {
    buf: [u8; 4096],
    len: usize,
}

impl PathBuf {
    pub fn new() -> PathBuf {
        PathBuf {
            buf: [0; 4096],
            len: 0,
        }
    }

    /// Appends `s`; false (and nothing appended) if it would not fit with its NUL.
    pub fn push(&mut self, s: &[u8]) -> bool {
        let end = self.len + s.len();
        if end >= self.buf.len() {
            return false;
        }
        match self.buf.get_mut(self.len..end) {
            Some(dst) => {
                dst.copy_from_slice(s);
                self.len = end;
                if let Some(b) = self.buf.get_mut(end) {
                    *b = 0;
                }
                true
            }
            _ => false,
        }
    }

    pub fn as_ptr(&self) -> *const c_char {
        self.buf.as_ptr().cast()
    }

    pub fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"")
    }
}

/// Puts the directory this object was loaded from, with a trailing '/', in `path` (empty if it
/// was loaded by a bare name, which the dynamic loader then resolved from the search path).
/// With `resolved`, the directory of the file itself after following symbolic links.
pub fn own_dir(path: &mut PathBuf, resolved: bool) -> bool {
    let mut info = DlInfo {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    // SAFETY: any address inside this object, and a DlInfo to fill.
    if unsafe { dladdr(own_dir as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    let mut real = [0u8; 4096];
    let name = if resolved {
        // SAFETY: dli_fname is NUL-terminated; `real` has PATH_MAX (4096) bytes, as realpath needs.
        let p = unsafe { realpath(info.dli_fname, real.as_mut_ptr().cast()) };
        if p.is_null() {
            return false;
        }
        p.cast_const()
    } else {
        info.dli_fname
    };
    // SAFETY: dladdr's dli_fname (valid while this object is loaded) or realpath's result in
    // `real`: NUL-terminated either way.
    let file = unsafe { CStr::from_ptr(name) }.to_bytes();
    match file.iter().rposition(|&b| b == b'/') {
        Some(slash) => path.push(file.get(..=slash).unwrap_or(b"")),
        None => true,
    }
}

/// One log line in a fixed buffer; text past its end is cut.
pub struct Line {
    buf: [u8; 1024],
    len: usize,
}

impl Line {
    pub fn new() -> Line {
        Line {
            buf: [0; 1024],
            len: 0,
        }
    }

    pub fn push(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(dst) = self.buf.get_mut(self.len) {
                *dst = b;
                self.len += 1;
            }
        }
    }

    /// The text so far (up to a NUL in it, if any).
    pub fn as_cstr(&mut self) -> &CStr {
        let end = self.len.min(self.buf.len() - 1);
        if let Some(b) = self.buf.get_mut(end) {
            *b = 0;
        }
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"")
    }

    /// Writes the line, ending it with a newline even if it was cut.
    pub fn write_stderr(&mut self) {
        if self.len == self.buf.len() {
            self.len -= 1;
        }
        self.push(b"\n");
        // SAFETY: `len` initialised bytes of a live buffer, written to fd 2.
        unsafe { write(2, self.buf.as_ptr().cast(), self.len) };
    }
}
