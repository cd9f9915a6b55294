//! Calling the simulated libcuda.so.1 directly (dlopen + dlsym), for tests of single entry points.
#![allow(dead_code)]

use std::ffi::{CString, c_void};

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

/// A fresh state with `args`, named by SIMGPU_STATE for this (single-test) process, and the
/// library loaded.
pub fn setup(args: &[&str]) -> (tempfile::TempDir, Lib) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let simgpu = env!("CARGO_BIN_EXE_simgpu");
    let ok = std::process::Command::new(simgpu)
        .arg("init")
        .args(args)
        .arg("--state")
        .arg(&state)
        .status()
        .unwrap();
    assert!(ok.success());
    // SAFETY: each test binary using this has one test, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("SIMGPU_STATE", &state) };
    let lib = Lib::open(
        &std::path::Path::new(simgpu)
            .parent()
            .unwrap()
            .join("libsimgpu_cuda.so"),
    );
    (dir, lib)
}
