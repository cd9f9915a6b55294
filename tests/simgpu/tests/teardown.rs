//! Driver calls made while a thread is being torn down: from a `thread_local` destructor that runs
//! after the driver's own per-thread state may already be gone. `cuda.core` releases its contexts
//! this way at exit; the real driver permits it. Checked on simgpu alone and with libcuslice.so
//! preloaded under a cap (the interposer's own thread-locals must survive it too).
//!
//! The test re-runs its own binary (the `child` test, which does nothing unless
//! `TEARDOWN_CHILD` is set) under `simgpu run`: a failure there is an abort, which must not take
//! the test runner down.

use cuslice_test_harness::*;

use std::ffi::{c_char, c_int, c_void};
use std::process::Command;

type Fn0 = unsafe extern "C" fn() -> c_int;
type FnU = unsafe extern "C" fn(u32) -> c_int;
type FnP = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnPP = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type FnPI = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type FnPU64 = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type FnU64 = unsafe extern "C" fn(u64) -> c_int;
type FnI = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;

/// The driver's entry points the child uses, found with dlsym in libcuda.so.1.
#[derive(Clone, Copy)]
struct Cuda {
    init: FnU,
    device_get: FnI,
    retain: FnPI,
    release: unsafe extern "C" fn(c_int) -> c_int,
    set_current: FnP,
    get_current: FnPP,
    create: unsafe extern "C" fn(*mut *mut c_void, u32, c_int) -> c_int,
    destroy: FnP,
    pop: FnPP,
    alloc: FnPU64,
    free: FnU64,
    sync: Fn0,
}

fn sym<T: Copy>(lib: *mut c_void, name: &std::ffi::CStr) -> T {
    // SAFETY: dlsym on a handle from dlopen with a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr() as *const c_char) };
    assert!(!p.is_null(), "libcuda.so.1 has no {name:?}");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function-pointer type of that entry point (the CUDA ABI).
    unsafe { std::mem::transmute_copy(&p) }
}

fn load() -> Cuda {
    // SAFETY: loading the (simulated) driver by its soname.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!lib.is_null(), "libcuda.so.1 not found");
    Cuda {
        init: sym(lib, c"cuInit"),
        device_get: sym(lib, c"cuDeviceGet"),
        retain: sym(lib, c"cuDevicePrimaryCtxRetain"),
        release: sym(lib, c"cuDevicePrimaryCtxRelease_v2"),
        set_current: sym(lib, c"cuCtxSetCurrent"),
        get_current: sym(lib, c"cuCtxGetCurrent"),
        create: sym(lib, c"cuCtxCreate_v2"),
        destroy: sym(lib, c"cuCtxDestroy_v2"),
        pop: sym(lib, c"cuCtxPopCurrent_v2"),
        alloc: sym(lib, c"cuMemAlloc_v2"),
        free: sym(lib, c"cuMemFree_v2"),
        sync: sym(lib, c"cuCtxSynchronize"),
    }
}

/// One line on stdout with a single write(2): std's stdout may be unusable during teardown. It
/// starts on a new line (libtest's "test child ... " has none).
fn say(line: &str) {
    let s = format!("\n{line}\n");
    // SAFETY: writing our own buffer to fd 1.
    unsafe { libc::write(1, s.as_ptr() as *const c_void, s.len()) };
}

/// Releases, from its destructor, what the thread set up: a created context (made current,
/// holding memory) is destroyed, the primary context made current and released.
struct Releaser {
    cuda: std::cell::Cell<Option<(Cuda, usize, usize, u64)>>,
}

impl Drop for Releaser {
    fn drop(&mut self) {
        let Some((c, primary, created, ptr)) = self.cuda.get() else {
            return;
        };
        // SAFETY: calls into the driver with handles it gave this thread.
        unsafe {
            let mut cur: *mut c_void = std::ptr::null_mut();
            let get = (c.get_current)(&mut cur);
            let free = (c.free)(ptr);
            let sync = (c.sync)();
            let mut popped: *mut c_void = std::ptr::null_mut();
            let pop = (c.pop)(&mut popped);
            let destroy = (c.destroy)(created as *mut c_void);
            let set = (c.set_current)(primary as *mut c_void);
            let set_null = (c.set_current)(std::ptr::null_mut());
            let release = (c.release)(0);
            say(&format!(
                "{{\"event\":\"teardown\",\"get\":{get},\"current_was_created\":{},\"free\":{free},\
                 \"sync\":{sync},\"pop\":{pop},\"popped_created\":{},\"destroy\":{destroy},\
                 \"set\":{set},\"set_null\":{set_null},\"release\":{release}}}",
                cur as usize == created,
                popped as usize == created
            ));
        }
    }
}

thread_local! {
    // Its destructor is registered when the thread first touches it, before the driver's
    // per-thread state exists, so it runs after the driver's (destructors run in reverse).
    static RELEASER: Releaser = const { Releaser { cuda: std::cell::Cell::new(None) } };
}

fn check(r: c_int, what: &str) {
    assert_eq!(r, 0, "{what} returned {r}");
}

/// The program `teardown_calls_*` runs: a thread that sets up contexts and memory and releases
/// them from a thread_local destructor as it ends; then this thread does the same and exits the
/// process, whose exit(3) runs its destructors.
#[test]
fn child() {
    if std::env::var_os("TEARDOWN_CHILD").is_none() {
        return;
    }
    let c = load();
    let setup = move || {
        RELEASER.with(|_| ());
        // SAFETY: driver calls with valid out-pointers.
        unsafe {
            check((c.init)(0), "cuInit");
            let mut dev = 0;
            check((c.device_get)(&mut dev, 0), "cuDeviceGet");
            let mut primary = std::ptr::null_mut();
            check((c.retain)(&mut primary, dev), "cuDevicePrimaryCtxRetain");
            check((c.set_current)(primary), "cuCtxSetCurrent");
            let mut created = std::ptr::null_mut();
            check((c.create)(&mut created, 0, dev), "cuCtxCreate");
            let mut ptr = 0u64;
            check((c.alloc)(&mut ptr, 64 << 20), "cuMemAlloc");
            RELEASER.with(|r| {
                r.cuda
                    .set(Some((c, primary as usize, created as usize, ptr)))
            });
        }
    };
    std::thread::spawn(setup).join().unwrap();
    say("{\"event\":\"thread_done\"}");
    // Process exit: exit(3) runs the calling thread's thread_local destructors first.
    setup();
    std::process::exit(0);
}

fn run_child(sim: &Sim, preload: bool) -> (Vec<serde_json::Value>, i32, String) {
    let mut cmd: Command = sim.command(
        &std::env::current_exe().unwrap(),
        &["--exact", "child", "--nocapture", "--test-threads=1"],
    );
    cmd.env("TEARDOWN_CHILD", "1");
    if preload {
        let state = tempfile::tempdir().unwrap();
        cmd.env("LD_PRELOAD", libcuslice())
            .env("CUSLICE_MEMORY_LIMIT", "1GiB")
            .env("CUSLICE_STATE_DIR", state.path());
        let out = cmd.output().unwrap();
        drop(state);
        return split(out);
    }
    split(cmd.output().unwrap())
}

fn split(out: std::process::Output) -> (Vec<serde_json::Value>, i32, String) {
    (
        parse_lines(&String::from_utf8_lossy(&out.stdout)),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn teardown_calls(preload: bool) {
    let sim = Sim::new(&["--memory", "4GiB"]);
    let (lines, code, stderr) = run_child(&sim, preload);
    assert_eq!(code, 0, "the program exited {code}; stderr: {stderr}");
    let done: Vec<_> = lines.iter().filter(|l| l["event"] == "teardown").collect();
    assert_eq!(done.len(), 2, "two threads torn down: {lines:?}");
    for t in done {
        // Every call succeeds, as with the real driver: the created context is still current
        // while the thread's destructors run, and the primary context can be set and released.
        for k in [
            "get", "free", "sync", "pop", "destroy", "set", "set_null", "release",
        ] {
            assert_eq!(t[k], 0, "{k} during teardown: {t}");
        }
        assert_eq!(t["current_was_created"], true, "{t}");
        assert_eq!(t["popped_created"], true, "{t}");
    }
    // Ground truth: nothing left on the device, and the process ended normally.
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 0, "{dev}");
}

#[test]
fn teardown_calls_on_simgpu() {
    teardown_calls(false);
}

#[test]
fn teardown_calls_with_cuslice_preloaded() {
    teardown_calls(true);
}
