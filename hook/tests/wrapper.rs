//! `cuslice-runtime` on its own, with a stand-in runtime that prints the arguments it was given:
//! what it says of itself, and what it passes on untouched.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// A runtime that prints `runtime got: ARGS` and exits 0.
fn echo_runtime(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("runtime");
    std::fs::write(&path, "#!/bin/sh\necho \"runtime got: $*\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn wrapper(runtime: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cuslice-runtime"))
        .arg(format!("--cuslice-runtime={}", runtime.display()))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `--help` (and `-h`, `help`) names the wrapper's own options, then the runtime's help follows.
#[test]
fn help_names_its_own_options_then_the_runtimes() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = echo_runtime(dir.path());
    for ask in ["--help", "-h", "help"] {
        let out = wrapper(&runtime, &[ask]);
        assert!(out.starts_with("usage: cuslice-runtime"), "{out}");
        for option in [
            "--cuslice-runtime=PATH",
            "--cuslice-hook=PATH",
            "--cuslice-hook-arg=ARG",
            "--cuslice-cdi-spec-dir=DIR",
            "--cuslice-container-index=DIR",
        ] {
            assert!(out.contains(option), "{option} missing from {out}");
        }
        assert!(
            out.ends_with(&format!("runtime got: {ask}\n")),
            "the runtime's help does not follow: {out}"
        );
    }
}

/// Every other command reaches the runtime as it was given, with nothing of the wrapper's own:
/// engines read `--version` and `features` from it.
#[test]
fn other_commands_reach_the_runtime_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = echo_runtime(dir.path());
    assert_eq!(
        wrapper(&runtime, &["--version"]),
        "runtime got: --version\n"
    );
    assert_eq!(
        wrapper(&runtime, &["--root", "/run/x", "--help-me", "features"]),
        "runtime got: --root /run/x --help-me features\n"
    );
    assert_eq!(
        wrapper(&runtime, &["state", "--help"]),
        "runtime got: state --help\n"
    );
}
