//! Nothing to build: the tests (`tests/clients.rs`) run `cuda_client.py`, a program that uses
//! NVIDIA's Python bindings as users do, on simgpu with and without cuslice.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `tests/frameworks/install` put the framework environments: `$CUSLICE_FRAMEWORKS`, else
/// `target/frameworks` of this workspace.
pub fn frameworks_dir() -> PathBuf {
    match std::env::var_os("CUSLICE_FRAMEWORKS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/frameworks"),
    }
}

/// The python of framework environment `venv` (`cu12`, `cu13`) if it can import `module`;
/// otherwise why not, in one line that names the installer.
pub fn framework_python(venv: &str, module: &str) -> Result<PathBuf, String> {
    let python = frameworks_dir().join(venv).join("bin/python");
    if !python.exists() {
        return Err(format!(
            "no {} (run tests/frameworks/install)",
            python.display()
        ));
    }
    let out = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .map_err(|e| format!("{}: {e} (run tests/frameworks/install)", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} cannot import {module}: {} (run tests/frameworks/install)",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(python)
}

/// [`framework_python`], or None after one skip line; under `CI` a missing environment fails.
pub fn framework_python_or_skip(venv: &str, module: &str) -> Option<PathBuf> {
    match framework_python(venv, module) {
        Ok(p) => Some(p),
        Err(why) => {
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}
