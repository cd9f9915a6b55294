//! The driver's entry points as one struct of typed function pointers, and the routes that fill
//! it: `dlsym` of versioned names, `cuGetProcAddress` (v1/v2) by base name, a replay of what
//! libcudart asks for, or (in `cuda-workload-linked`) the symbols the binary is linked against.

use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::ptr::null_mut;

use cuda_abi::*;

use crate::requests::{self, Runtime};

/// A failed driver call: which one, and the code it returned (`-1` with `missing` when the route
/// found no entry point to call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError {
    pub call: &'static str,
    pub code: CUresult,
    pub missing: bool,
}

impl CuError {
    pub fn missing(call: &'static str) -> CuError {
        CuError {
            call,
            code: CUresult(-1),
            missing: true,
        }
    }

    /// The code's name as `cuda.h` spells it, when known.
    pub fn name(&self) -> Option<&'static str> {
        if self.missing { None } else { self.code.name() }
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.missing {
            write!(f, "{}: no entry point", self.call)
        } else {
            write!(f, "{} returned {:?}", self.call, self.code)
        }
    }
}

impl std::error::Error for CuError {}

fn check(call: &'static str, rc: CUresult) -> Result<(), CuError> {
    if rc.is_ok() {
        Ok(())
    } else {
        Err(CuError {
            call,
            code: rc,
            missing: false,
        })
    }
}

/// One entry of the function table (see `functions.rs`).
#[derive(Clone, Copy, Debug)]
pub struct FnSpec {
    /// The versioned symbol, e.g. `cuMemAlloc_v2`.
    pub name: &'static str,
    /// The name `cuGetProcAddress` is asked for, e.g. `cuMemAlloc`.
    pub base: &'static str,
    /// Lowest cudaVersion at which `base` resolves to an entry point with this signature.
    pub abi_since: i32,
    /// Per-thread-default-stream exports (`_ptsz`/`_ptds`), first one preferred.
    pub ptds: &'static [&'static str],
}

macro_rules! define_driver {
    ($( { $name:ident, $base:literal, $since:literal, [$($ptds:literal),*], ($($arg:ident : $t:ty),* $(,)?) } )*) => {
        /// Typed driver entry points; `None` where the route found none.
        #[allow(non_snake_case)]
        #[derive(Clone, Copy, Default)]
        pub struct Driver {
            $( pub $name: Option<unsafe extern "C" fn($($t),*) -> CUresult>, )*
        }

        /// The table the routes walk, in `Driver` field order.
        pub const FUNCTIONS: &[FnSpec] = &[
            $( FnSpec { name: stringify!($name), base: $base, abi_since: $since, ptds: &[$($ptds),*] }, )*
        ];

        #[allow(non_snake_case, clippy::too_many_arguments)]
        impl Driver {
            /// Builds the struct from raw addresses given in `FUNCTIONS` order (null: absent).
            ///
            /// # Safety
            /// Every non-null address must be an entry point with the C signature its
            /// `FUNCTIONS` entry declares, valid for the life of the process.
            pub unsafe fn from_addresses(addresses: &[*mut c_void]) -> Driver {
                let mut it = addresses.iter().copied();
                Driver {
                    $( $name: {
                        let p = it.next().unwrap_or(null_mut());
                        // SAFETY: `Option<unsafe extern "C" fn>` has the layout of a nullable
                        // pointer; the caller guarantees the address has this signature.
                        unsafe {
                            std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($t),*) -> CUresult>>(p)
                        }
                    }, )*
                }
            }

            /// Names (versioned) of the entry points this driver lacks.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $( if self.$name.is_none() { out.push(stringify!($name)); } )*
                out
            }

            $(
                #[doc = concat!("Calls `", stringify!($name), "`; a status other than CUDA_SUCCESS becomes an error.")]
                ///
                /// # Safety
                /// The arguments must satisfy the function's contract in `cuda.h` (valid pointers,
                /// live handles).
                pub unsafe fn $name(&self, $($arg: $t),*) -> Result<(), CuError> {
                    let Some(f) = self.$name else { return Err(CuError::missing(stringify!($name))) };
                    // SAFETY: `f` was resolved for exactly this signature; the caller vouches for
                    // the arguments.
                    check(stringify!($name), unsafe { f($($arg),*) })
                }
            )*
        }
    };
}

crate::cuda_functions!(define_driver);

/// How entry points are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Dlsym,
    ProcV1,
    ProcV2,
    Cudart(Runtime),
    Direct,
    /// `dlsym` on a renamed copy of the driver library (see `Library::open_copy`).
    Bypass,
}

impl Route {
    pub fn name(&self) -> &'static str {
        match self {
            Route::Dlsym => "dlsym",
            Route::ProcV1 => "proc-v1",
            Route::ProcV2 => "proc-v2",
            Route::Cudart(rt) => rt.name,
            Route::Direct => "direct",
            Route::Bypass => "bypass",
        }
    }
}

/// What a route did to fill the `Driver`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Lookups made: `dlsym` calls, `cuGetProcAddress` calls (replayed plus extra).
    pub requests: usize,
    /// Lookups that yielded an entry point.
    pub found: usize,
    /// Names whose lookup failed (symbol not found, or an error), in order, without repeats.
    pub not_found: Vec<String>,
    /// Names the driver answered CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT for.
    pub version_not_sufficient: Vec<String>,
    /// Base names a cudart replay never asked for and that took one more request.
    pub extra: Vec<String>,
    /// Base names resolved at a cudaVersion below the ABI the workload calls (pointer dropped).
    pub older_abi: Vec<String>,
    /// cudart routes: whether later requests went through the pointer returned for
    /// `cuGetProcAddress` at 12000, and whether one was returned at 11030 (kept, unused).
    pub switched_gpa: Option<bool>,
    pub kept_gpa_v1: Option<bool>,
}

impl Resolution {
    fn note(&mut self, symbol: &str, outcome: Outcome) {
        self.requests += 1;
        let list = match outcome {
            Outcome::Found => {
                self.found += 1;
                return;
            }
            Outcome::NotFound => &mut self.not_found,
            Outcome::VersionNotSufficient => &mut self.version_not_sufficient,
        };
        if !list.iter().any(|s| s == symbol) {
            list.push(symbol.to_string());
        }
    }
}

/// Why no driver could be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed.
    Library {
        library: &'static str,
        message: String,
    },
    /// The route's one required entry symbol (e.g. `cuGetProcAddress_v2`) is not exported.
    Entry {
        library: &'static str,
        symbol: &'static str,
    },
    /// Anything else (an unparsable embedded list).
    Other(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Library { library, message } => {
                write!(f, "cannot load {library}: {message}")
            }
            LoadError::Entry { library, symbol } => write!(f, "{library} does not export {symbol}"),
            LoadError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for LoadError {}

/// A `dlopen` handle, never closed (entry points stay valid for the life of the process).
pub struct Library {
    handle: *mut c_void,
    pub name: &'static str,
}

impl Library {
    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`.
    pub fn open(name: &'static CStr) -> Result<Library, LoadError> {
        let library = name.to_str().unwrap_or("?");
        // SAFETY: `name` is NUL-terminated; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::Library {
                library,
                message: dlerror(),
            });
        }
        Ok(Library {
            handle,
            name: library,
        })
    }

    /// `dlmopen(LM_ID_NEWLM, name, RTLD_NOW | RTLD_LOCAL)`: a new link-map namespace, which
    /// starts with no preloaded library.
    pub fn open_new_namespace(name: &'static CStr) -> Result<Library, LoadError> {
        const LM_ID_NEWLM: libc::c_long = -1;
        unsafe extern "C" {
            fn dlmopen(lmid: libc::c_long, file: *const c_char, mode: libc::c_int) -> *mut c_void;
        }
        let library = name.to_str().unwrap_or("?");
        // SAFETY: glibc's dlmopen with a NUL-terminated name and a valid namespace id.
        let handle = unsafe {
            dlmopen(
                LM_ID_NEWLM,
                name.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if handle.is_null() {
            return Err(LoadError::Library {
                library,
                message: dlerror(),
            });
        }
        Ok(Library {
            handle,
            name: library,
        })
    }

    /// Loads `name` as the program would, then a copy of that file under another name, and
    /// returns the copy. A tenant's way around an interposer: the copy's definitions are not the
    /// driver library's, so an interposer that answers `dlsym` only for the real library's own
    /// definitions (as cuslice does) passes every lookup on the copy through, and calls through
    /// them never reach it. The real library stays loaded first, so lookups of its soname still
    /// find it. The copy is unlinked once mapped.
    pub fn open_copy(name: &'static CStr) -> Result<Library, LoadError> {
        let real = Library::open(name)?;
        let library = real.name;
        let fail = |message: String| LoadError::Library { library, message };
        let mut map: *mut LinkMap = null_mut();
        // SAFETY: a live dlopen handle and an out-pointer of the type RTLD_DI_LINKMAP writes.
        let r = unsafe {
            libc::dlinfo(
                real.handle,
                libc::RTLD_DI_LINKMAP,
                (&mut map as *mut *mut LinkMap).cast(),
            )
        };
        if r != 0 || map.is_null() {
            return Err(fail(format!("dlinfo(RTLD_DI_LINKMAP): {}", dlerror())));
        }
        // SAFETY: glibc's link_map for the handle, whose l_name is a NUL-terminated path that
        // lives as long as the object stays loaded (it does: `real` is never closed).
        let path = unsafe { CStr::from_ptr((*map).l_name) }
            .to_string_lossy()
            .into_owned();
        let dir = std::env::temp_dir().join(format!("cuda-workload-bypass-{}", std::process::id()));
        let copy = dir.join("libdriver-copy.so");
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::copy(&path, &copy))
            .map_err(|e| fail(format!("cannot copy {path} to {}: {e}", copy.display())))?;
        let c_copy = CString::new(copy.as_os_str().as_encoded_bytes())
            .map_err(|_| fail(format!("{} holds a NUL byte", copy.display())))?;
        // SAFETY: `c_copy` is NUL-terminated; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(c_copy.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        let err = handle.is_null().then(dlerror);
        let _ = std::fs::remove_file(&copy);
        let _ = std::fs::remove_dir(&dir);
        if let Some(e) = err {
            return Err(fail(format!("a copy of {path}: {e}")));
        }
        crate::out::emit(
            "bypass",
            serde_json::json!({"library": path, "copy": copy.display().to_string()}),
        );
        Ok(Library {
            handle,
            name: library,
        })
    }

    /// `dlsym(handle, name)`; null when absent (or when the name has an interior NUL).
    pub fn sym(&self, name: &str) -> *mut c_void {
        let Ok(name) = CString::new(name) else {
            return null_mut();
        };
        // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
        unsafe { libc::dlsym(self.handle, name.as_ptr()) }
    }
}

/// The head of glibc's `struct link_map` (<link.h>), as `dlinfo(RTLD_DI_LINKMAP)` gives it.
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
}

fn dlerror() -> String {
    // SAFETY: dlerror takes no arguments; it returns null or a NUL-terminated thread-local string.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown dlopen error".to_string();
    }
    // SAFETY: non-null result of dlerror, read before any other dl* call on this thread.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

pub const LIBCUDA: &CStr = c"libcuda.so.1";

type GetProcAddressV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;
type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;

#[derive(Clone, Copy)]
enum Gpa {
    V1(GetProcAddressV1),
    V2(GetProcAddressV2),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Found,
    NotFound,
    VersionNotSufficient,
}

#[derive(Clone, Copy, Debug)]
struct Reply {
    pfn: *mut c_void,
    outcome: Outcome,
}

impl Gpa {
    /// # Safety
    /// The wrapped pointer must be the driver's `cuGetProcAddress` of that version.
    unsafe fn call(self, symbol: &str, cuda_version: i32, flags: u64) -> Reply {
        let Ok(c_symbol) = CString::new(symbol) else {
            return Reply {
                pfn: null_mut(),
                outcome: Outcome::NotFound,
            };
        };
        let mut pfn: *mut c_void = null_mut();
        let mut status: i32 = CU_GET_PROC_ADDRESS_SUCCESS;
        let rc = match self {
            // SAFETY: valid C string and out-pointer; the caller vouches for the entry point.
            Gpa::V1(f) => unsafe { f(c_symbol.as_ptr(), &mut pfn, cuda_version, flags) },
            // SAFETY: as above, plus a valid status out-pointer.
            Gpa::V2(f) => unsafe {
                f(
                    c_symbol.as_ptr(),
                    &mut pfn,
                    cuda_version,
                    flags,
                    &mut status,
                )
            },
        };
        let outcome = if status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT {
            Outcome::VersionNotSufficient
        } else if rc.is_ok() && status == CU_GET_PROC_ADDRESS_SUCCESS && !pfn.is_null() {
            Outcome::Found
        } else {
            Outcome::NotFound
        };
        if outcome != Outcome::Found {
            pfn = null_mut();
        }
        Reply { pfn, outcome }
    }
}

/// What the routes need to know besides the route itself.
#[derive(Clone, Copy, Debug)]
pub struct ResolveOptions {
    pub route: Route,
    pub cuda_version: i32,
    pub ptds: bool,
    /// Open the driver in a new link-map namespace (`Library::open_new_namespace`).
    pub dlmopen: bool,
}

/// Loads `libcuda.so.1` and fills a `Driver` the way `opts.route` says. `direct` supplies the
/// linked symbols for `Route::Direct` (only `cuda-workload-linked` has them).
pub fn resolve(
    opts: ResolveOptions,
    direct: Option<fn() -> Driver>,
) -> Result<(Driver, Resolution), LoadError> {
    if opts.route == Route::Direct {
        let linked = direct.ok_or_else(|| {
            LoadError::Other("route direct needs the cuda-workload-linked binary".into())
        })?;
        let driver = linked();
        let missing = driver.missing();
        let res = Resolution {
            requests: FUNCTIONS.len(),
            found: FUNCTIONS.len() - missing.len(),
            not_found: missing.iter().map(|s| s.to_string()).collect(),
            ..Resolution::default()
        };
        return Ok((driver, res));
    }
    let lib = if opts.dlmopen {
        Library::open_new_namespace(LIBCUDA)?
    } else if opts.route == Route::Bypass {
        Library::open_copy(LIBCUDA)?
    } else {
        Library::open(LIBCUDA)?
    };
    let (addresses, res) = match opts.route {
        Route::Dlsym | Route::Bypass => by_dlsym(&lib, opts.ptds),
        Route::ProcV1 | Route::ProcV2 => by_proc_address(&lib, opts)?,
        Route::Cudart(rt) => by_cudart_replay(&lib, rt, opts.ptds)?,
        Route::Direct => unreachable!("handled above"),
    };
    // SAFETY: every address came from the driver for the symbol (or base name at a version
    // >= abi_since) whose signature the table declares.
    let driver = unsafe { Driver::from_addresses(&addresses) };
    Ok((driver, res))
}

fn by_dlsym(lib: &Library, ptds: bool) -> (Vec<*mut c_void>, Resolution) {
    let mut res = Resolution::default();
    let addresses = FUNCTIONS
        .iter()
        .map(|spec| {
            let name = match spec.ptds.first() {
                Some(alt) if ptds => alt,
                _ => spec.name,
            };
            let p = lib.sym(name);
            res.note(
                name,
                if p.is_null() {
                    Outcome::NotFound
                } else {
                    Outcome::Found
                },
            );
            p
        })
        .collect();
    (addresses, res)
}

fn entry<F: Copy>(lib: &Library, symbol: &'static str) -> Result<F, LoadError> {
    let p = lib.sym(symbol);
    if p.is_null() {
        return Err(LoadError::Entry {
            library: lib.name,
            symbol,
        });
    }
    debug_assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: `F` is the function pointer type of `symbol` as `cuda.h` declares it (callers pass
    // GetProcAddressV1/V2 only), and `p` is non-null.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn flags_for(ptds: bool) -> u64 {
    if ptds {
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    } else {
        CU_GET_PROC_ADDRESS_DEFAULT
    }
}

fn by_proc_address(
    lib: &Library,
    opts: ResolveOptions,
) -> Result<(Vec<*mut c_void>, Resolution), LoadError> {
    let gpa = if opts.route == Route::ProcV1 {
        Gpa::V1(entry(lib, "cuGetProcAddress")?)
    } else {
        Gpa::V2(entry(lib, "cuGetProcAddress_v2")?)
    };
    let mut res = Resolution::default();
    let flags = flags_for(opts.ptds);
    let addresses = FUNCTIONS
        .iter()
        .map(|spec| {
            // SAFETY: `gpa` is the exported cuGetProcAddress of the matching version.
            let reply = unsafe { gpa.call(spec.base, opts.cuda_version, flags) };
            res.note(spec.base, reply.outcome);
            abi_checked(spec, opts.cuda_version, reply.pfn, &mut res)
        })
        .collect();
    Ok((addresses, res))
}

/// Drops a pointer obtained at a cudaVersion whose variant has an older signature.
fn abi_checked(
    spec: &FnSpec,
    cuda_version: i32,
    pfn: *mut c_void,
    res: &mut Resolution,
) -> *mut c_void {
    if !pfn.is_null() && cuda_version < spec.abi_since {
        res.older_abi.push(spec.base.to_string());
        return null_mut();
    }
    pfn
}

/// Replays libcudart's request list, then takes the scenario's functions from the replies.
fn by_cudart_replay(
    lib: &Library,
    rt: Runtime,
    ptds: bool,
) -> Result<(Vec<*mut c_void>, Resolution), LoadError> {
    let list =
        requests::parse(rt.list).map_err(|e| LoadError::Other(format!("{}: {e}", rt.name)))?;
    let mut gpa = Gpa::V2(entry(lib, "cuGetProcAddress_v2")?);
    let mut res = Resolution {
        switched_gpa: Some(false),
        kept_gpa_v1: Some(false),
        ..Resolution::default()
    };
    // Every returned pointer is kept, as libcudart keeps them in its tables.
    let mut replies = Vec::with_capacity(list.len());
    let mut gpa_v1: Option<GetProcAddressV1> = None;
    for r in &list {
        // SAFETY: `gpa` is the driver's cuGetProcAddress_v2, or the pointer the driver returned
        // for "cuGetProcAddress" at >= 12000, which is the v2 entry point.
        let reply = unsafe { gpa.call(r.symbol, r.cuda_version, r.flags) };
        res.note(r.symbol, reply.outcome);
        if r.symbol == "cuGetProcAddress" && reply.outcome == Outcome::Found {
            if r.cuda_version >= 12000 {
                // SAFETY: at >= 12000 the driver hands back cuGetProcAddress_v2 (non-null here).
                gpa = Gpa::V2(unsafe {
                    std::mem::transmute::<*mut c_void, GetProcAddressV2>(reply.pfn)
                });
                res.switched_gpa = Some(true);
            } else {
                // SAFETY: below 12000 it hands back the v1 entry point (non-null here).
                gpa_v1 = Some(unsafe {
                    std::mem::transmute::<*mut c_void, GetProcAddressV1>(reply.pfn)
                });
            }
        }
        replies.push(reply);
    }
    res.kept_gpa_v1 = Some(gpa_v1.is_some());
    let want = flags_for(ptds);
    let addresses = FUNCTIONS
        .iter()
        .map(|spec| {
            let last = |flags: u64| {
                list.iter()
                    .zip(&replies)
                    .rev()
                    .find(|(r, _)| r.symbol == spec.base && r.flags == flags)
            };
            // Under --ptds, names libcudart only ever asks for with flags 0 (no _ptsz variant)
            // come from those requests, as in libcudart.
            let picked = last(want).or_else(|| if want != 0 { last(0) } else { None });
            match picked {
                Some((r, reply)) => abi_checked(spec, r.cuda_version, reply.pfn, &mut res),
                None => {
                    // SAFETY: as for the replay above.
                    let reply = unsafe { gpa.call(spec.base, rt.cuda_version, want) };
                    res.note(spec.base, reply.outcome);
                    res.extra.push(spec.base.to_string());
                    abi_checked(spec, rt.cuda_version, reply.pfn, &mut res)
                }
            }
        })
        .collect();
    Ok((addresses, res))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn table_is_consistent() {
        let mut names = HashSet::new();
        for spec in FUNCTIONS {
            assert!(names.insert(spec.name), "duplicate {}", spec.name);
            assert!(
                spec.name.starts_with(spec.base),
                "{} vs {}",
                spec.name,
                spec.base
            );
            assert!(spec.abi_since >= 2000);
            for alt in spec.ptds {
                assert!(
                    alt.starts_with(spec.name)
                        && (alt.ends_with("_ptsz") || alt.ends_with("_ptds"))
                );
            }
        }
        assert_eq!(Driver::default().missing().len(), FUNCTIONS.len());
    }

    #[test]
    fn missing_entry_point_is_reported_not_called() {
        let d = Driver::default();
        let mut free = 0usize;
        let mut total = 0usize;
        // SAFETY: valid out-pointers; the entry point is absent so nothing is called.
        let err = unsafe { d.cuMemGetInfo_v2(&mut free, &mut total) }.unwrap_err();
        assert_eq!(err, CuError::missing("cuMemGetInfo_v2"));
        assert_eq!(err.name(), None);
    }

    #[test]
    fn cudart_lists_ask_for_most_needed_functions() {
        // The VMM and multicast calls come through cudaGetDriverEntryPoint later, so they are
        // "extra".
        for rt in [requests::RUNTIME_12_9, requests::RUNTIME_13_0] {
            let list = requests::parse(rt.list).unwrap();
            let asked: HashSet<&str> = list.iter().map(|r| r.symbol).collect();
            let extra: Vec<&str> = FUNCTIONS
                .iter()
                .map(|s| s.base)
                .filter(|b| !asked.contains(b))
                .collect();
            assert!(
                extra
                    .iter()
                    .all(|b| b.starts_with("cuMem") || b.starts_with("cuMulticast")),
                "{extra:?}"
            );
            assert!(extra.contains(&"cuMemCreate"));
            // Every pick from the list satisfies the ABI the workload calls.
            for spec in FUNCTIONS {
                if let Some(r) = list
                    .iter()
                    .rev()
                    .find(|r| r.symbol == spec.base && r.flags == 0)
                {
                    assert!(
                        r.cuda_version >= spec.abi_since,
                        "{} at {}",
                        spec.base,
                        r.cuda_version
                    );
                }
            }
        }
    }

    #[test]
    fn dlopen_failure_names_the_library() {
        let err = Library::open(c"libcuslice-does-not-exist.so.1")
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .starts_with("cannot load libcuslice-does-not-exist.so.1: "),
            "{err}"
        );
    }
}
