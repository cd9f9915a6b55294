//! Calling the simulated libcuda.so.1 and libnvidia-ml.so.1 directly (dlopen + dlsym), in the
//! test process, for simgpu's tests of single entry points.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

pub type Fn0 = unsafe extern "C" fn() -> i32;

pub struct Lib(*mut c_void);

impl Lib {
    pub fn open(path: &std::path::Path) -> Lib {
        let p = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: loading the simulated driver built by this workspace.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "cannot load {}", path.display());
        Lib(h)
    }

    pub fn sym(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).unwrap();
        // SAFETY: looking up a symbol in a library we loaded.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "{name} is not exported");
        p
    }

    /// # Safety
    /// `F` must be the C signature of `name`.
    pub unsafe fn f<F: Copy>(&self, name: &str) -> F {
        let p = self.sym(name);
        // SAFETY: per the contract, F is a function pointer type matching the symbol.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

/// The simulated libnvidia-ml.so.1 of this build.
pub fn nvml_lib() -> Lib {
    Lib::open(&crate::bin_dir().join("libsimgpu_nvml.so"))
}

/// A fresh state with `args`, named by SIMGPU_STATE for this (single-test) process, and the
/// library loaded.
pub fn setup(args: &[&str]) -> (tempfile::TempDir, Lib) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let out = std::process::Command::new(crate::simgpu())
        .arg("init")
        .args(args)
        .arg("--state")
        .arg(&state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "simgpu init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: each test binary using this has one test, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("SIMGPU_STATE", &state) };
    let lib = Lib::open(&crate::bin_dir().join("libsimgpu_cuda.so"));
    (dir, lib)
}

pub type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;

/// The entry points most direct tests use, typed as cuda.h declares them.
pub struct Core {
    pub init: unsafe extern "C" fn(c_uint) -> i32,
    pub retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> i32,
    pub set_current: unsafe extern "C" fn(*mut c_void) -> i32,
    pub load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32,
    pub get_fn: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> i32,
    pub launch: Launch,
    pub sync: Fn0,
}

impl Core {
    pub fn new(lib: &Lib) -> Core {
        // SAFETY: each type is the signature cuda.h declares for the symbol.
        unsafe {
            Core {
                init: lib.f("cuInit"),
                retain: lib.f("cuDevicePrimaryCtxRetain"),
                set_current: lib.f("cuCtxSetCurrent"),
                load: lib.f("cuModuleLoadData"),
                get_fn: lib.f("cuModuleGetFunction"),
                launch: lib.f("cuLaunchKernel"),
                sync: lib.f("cuCtxSynchronize"),
            }
        }
    }
}

/// `CUcheckpointLockArgs`: how long `cuCheckpointProcessLock` may wait for calls under way.
#[repr(C)]
pub struct LockArgs {
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub reserved1: [u64; 7],
}

impl LockArgs {
    pub fn timeout(ms: u32) -> LockArgs {
        LockArgs {
            timeout_ms: ms,
            reserved0: 0,
            reserved1: [0; 7],
        }
    }
}

/// The checkpoint API (`cuCheckpointProcess*`), typed as cuda.h declares it.
pub struct Checkpoint {
    pub lock: unsafe extern "C" fn(c_int, *const LockArgs) -> i32,
    pub checkpoint: unsafe extern "C" fn(c_int, *const c_void) -> i32,
    pub restore: unsafe extern "C" fn(c_int, *const c_void) -> i32,
    pub unlock: unsafe extern "C" fn(c_int, *const c_void) -> i32,
    pub get_state: unsafe extern "C" fn(c_int, *mut c_int) -> i32,
}

impl Checkpoint {
    pub fn new(lib: &Lib) -> Checkpoint {
        // SAFETY: each type is the signature cuda.h declares for the symbol.
        unsafe {
            Checkpoint {
                lock: lib.f("cuCheckpointProcessLock"),
                checkpoint: lib.f("cuCheckpointProcessCheckpoint"),
                restore: lib.f("cuCheckpointProcessRestore"),
                unlock: lib.f("cuCheckpointProcessUnlock"),
                get_state: lib.f("cuCheckpointProcessGetState"),
            }
        }
    }

    /// Process `pid`'s `CUprocessState` (0 RUNNING, 1 LOCKED, 2 CHECKPOINTED, 3 FAILED).
    pub fn state(&self, pid: c_int) -> c_int {
        let mut s = -1;
        // SAFETY: a writable int; the call takes any pid.
        assert_eq!(unsafe { (self.get_state)(pid, &mut s) }, 0);
        s
    }
}

/// Runs `f` with this process's stderr (fd 2) sent to a temporary file and returns what was
/// written there. The simulated driver is loaded into the test process, so what it prints on
/// purpose (a refusal the test provokes) would otherwise reach the test log whatever the
/// outcome; this way the test reads it, and shows it if it fails. For single-test binaries only:
/// fd 2 belongs to the whole process.
pub fn stderr_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;

    struct Restore(c_int);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: self.0 is the dup of fd 2 made below; putting it back and closing it.
            unsafe {
                libc::dup2(self.0, 2);
                libc::close(self.0);
            }
        }
    }

    let mut file = tempfile::tempfile().unwrap();
    // SAFETY: dup of the process's fd 2, which stays open for the whole test.
    let saved = unsafe { libc::dup(2) };
    assert!(saved >= 0, "dup(2): {}", std::io::Error::last_os_error());
    let restore = Restore(saved);
    // SAFETY: file's descriptor is open for writing; fd 2 now writes to it until restored.
    let r = unsafe { libc::dup2(file.as_raw_fd(), 2) };
    assert!(r == 2, "dup2: {}", std::io::Error::last_os_error());
    let out = f();
    drop(restore);
    let mut text = String::new();
    file.rewind().unwrap();
    file.read_to_string(&mut text).unwrap();
    eprint!("{text}");
    (out, text)
}
