//! The library must load into containers with old glibc (Ubuntu 20.04: 2.31, UBI8: 2.28, and
//! back to 2.17): the portable build (`cargo zigbuild --target x86_64-unknown-linux-gnu.2.17`,
//! which tests/run does) may import no symbol version newer than GLIBC_2.17.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

/// The portable loader; its core (libcuslice_core.so) sits beside it.
fn portable() -> Option<PathBuf> {
    let dir = bin_dir().join("../x86_64-unknown-linux-gnu/release");
    let lib = dir.join("libcuslice.so");
    if lib.exists() && dir.join("libcuslice_core.so").exists() {
        return Some(lib);
    }
    let why = "the portable build target/x86_64-unknown-linux-gnu/release/libcuslice.so and libcuslice_core.so are missing (tests/run builds them with cargo-zigbuild)";
    assert!(std::env::var_os("CI").is_none(), "{why}");
    println!("SKIPPED: {why}");
    None
}

/// (symbol, version) for every versioned GLIBC import, from `objdump -T`.
fn glibc_imports(lib: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils) is needed");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("*UND*"))
        .filter_map(|l| {
            let v = l.split_whitespace().find(|w| {
                w.trim_matches(|c| c == '(' || c == ')')
                    .starts_with("GLIBC_")
            })?;
            let name = l.split_whitespace().last()?;
            Some((
                name.to_string(),
                v.trim_matches(|c| c == '(' || c == ')').to_string(),
            ))
        })
        .collect()
}

fn version_key(v: &str) -> Vec<u32> {
    v.trim_start_matches("GLIBC_")
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn the_portable_build_imports_nothing_newer_than_glibc_2_17() {
    let Some(lib) = portable() else { return };
    for file in [lib.clone(), lib.with_file_name("libcuslice_core.so")] {
        let imports = glibc_imports(&file);
        assert!(
            imports.iter().any(|(n, _)| n == "dlvsym"),
            "{}: no imports read: {imports:?}",
            file.display()
        );
        let too_new: Vec<_> = imports
            .iter()
            .filter(|(_, v)| version_key(v) > version_key("GLIBC_2.17"))
            .collect();
        assert!(
            too_new.is_empty(),
            "{}: imports newer than GLIBC_2.17: {too_new:?}",
            file.display()
        );
    }
    // The host build, by contrast, needs this machine's glibc (the check can tell them apart).
    let host = glibc_imports(&libcuslice());
    assert!(
        host.iter()
            .any(|(_, v)| version_key(v) > version_key("GLIBC_2.17")),
        "{host:?}"
    );
}

#[test]
fn the_portable_build_caps_like_the_host_build() {
    let Some(lib) = portable() else { return };
    let sim = Sim::new(&["--memory", "8GiB"]);
    let dir = tempfile::tempdir().unwrap();
    let out = sim
        .command(
            &workload(),
            &[
                "--route",
                "cudart-13.0",
                "fill",
                "--family",
                "mem",
                "--chunk",
                "64MiB",
            ],
        )
        .env("LD_PRELOAD", &lib)
        .env("CUSLICE_MEMORY_LIMIT", "1GiB")
        .env("CUSLICE_STATE_DIR", dir.path())
        .output()
        .unwrap();
    let (lines, code, stderr) = split(out);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(u(&event(&lines, "start")["total"]), GIB);
    assert_eq!(event(&lines, "refused")["code"], 2);
    assert!(peak_used(&sim, 0) <= GIB);
}
