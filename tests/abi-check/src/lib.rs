//! Conformance checks of cuslice's hand-written CUDA/NVML ABI against NVIDIA's headers.
//!
//! The checks live in `tests/`; this library only finds the headers and tools. They are not
//! vendored: `tests/abi-check/fetch-headers.sh DEST` downloads them from NVIDIA's PyPI wheels
//! into `DEST/cuda-12.9/include`, `DEST/cuda-13.0/include`, `DEST/nvml/include` and
//! `DEST/cuda-13.0/bin/ptxas` (NVIDIA's PTX assembler, which checks the workload's PTX), and the
//! tests read them from `$CUSLICE_CUDA_HEADERS` (default `<workspace>/target/cuda-headers`).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The CUDA versions whose headers the checks compare against, with their directory names.
pub const CUDA_VERSIONS: [&str; 2] = ["12.9", "13.0"];

/// Where the headers are expected: `$CUSLICE_CUDA_HEADERS`, else `<workspace>/target/cuda-headers`.
pub fn headers_root() -> PathBuf {
    match std::env::var_os("CUSLICE_CUDA_HEADERS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/cuda-headers"),
    }
}

/// The fetched header tree.
#[derive(Debug, Clone)]
pub struct Headers {
    /// The directory holding `cuda-12.9/`, `cuda-13.0/` and `nvml/`.
    pub root: PathBuf,
}

impl Headers {
    /// `include` directory of one CUDA version ("12.9" or "13.0").
    pub fn cuda_include(&self, version: &str) -> PathBuf {
        self.root.join(format!("cuda-{version}")).join("include")
    }

    /// `include` directory holding `nvml.h`.
    pub fn nvml_include(&self) -> PathBuf {
        self.root.join("nvml").join("include")
    }

    /// Reads one CUDA header ("cuda.h", "cudaTypedefs.h") of one version.
    pub fn read_cuda(&self, version: &str, name: &str) -> String {
        let path = self.cuda_include(version).join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    fn complete(&self) -> bool {
        CUDA_VERSIONS.iter().all(|v| {
            let inc = self.cuda_include(v);
            inc.join("cuda.h").is_file() && inc.join("cudaTypedefs.h").is_file()
        }) && self.nvml_include().join("nvml.h").is_file()
    }

    /// NVIDIA's PTX assembler of CUDA 13.0.
    pub fn ptxas(&self) -> PathBuf {
        self.root.join("cuda-13.0").join("bin").join("ptxas")
    }
}

/// Finds the headers. When they are absent: under CI (`$CI` set) this panics, telling how to
/// fetch them; otherwise it prints a `SKIPPED:` line to stderr and returns `None`, so that a
/// skipped check is visible rather than silently passing.
pub fn headers_or_skip(check: &str) -> Option<Headers> {
    let headers = Headers {
        root: headers_root(),
    };
    let complete = headers.complete();
    found_or_skip(check, "NVIDIA headers", headers, complete)
}

/// Finds NVIDIA's ptxas, as `headers_or_skip` finds the headers; returns the header tree it is in.
pub fn ptxas_or_skip(check: &str) -> Option<Headers> {
    let headers = Headers {
        root: headers_root(),
    };
    let found = headers.ptxas().is_file();
    found_or_skip(check, "NVIDIA's ptxas", headers, found)
}

fn found_or_skip(check: &str, what: &str, headers: Headers, found: bool) -> Option<Headers> {
    if found {
        return Some(headers);
    }
    let shown = headers.root.display();
    if std::env::var_os("CI").is_some() {
        panic!(
            "{check}: {what} not found at {shown} (CI is set, so this fails); \
             run tests/abi-check/fetch-headers.sh target/cuda-headers \
             or point CUSLICE_CUDA_HEADERS at a fetched tree"
        );
    }
    // Written to the stderr stream itself, not through `eprintln!`, which the test harness
    // captures: the skip must show in a plain `cargo test` run.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} not found at {shown}; \
         run tests/abi-check/fetch-headers.sh target/cuda-headers ({check})"
    );
    None
}
