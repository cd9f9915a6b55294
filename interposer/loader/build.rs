//! Generates the loader's export stubs from the interposer's table of entry points
//! (`interposer/src/hooks.rs`: every entry with a wrapper is exported by the core, so the loader
//! exports the same names), and assembles shim-c's dlsym trampoline.

use std::fmt::Write as _;

fn main() {
    let table = "../src/hooks.rs";
    println!("cargo:rerun-if-changed={table}");
    let text = std::fs::read_to_string(table).expect("reading interposer/src/hooks.rs");
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((lib, rest)) = line.split_once(' ') else {
            continue;
        };
        if !(lib == "Cuda" || lib == "Nvml") || !line.contains(") -> ") || !line.contains(" = ") {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            !name.is_empty(),
            "hooks.rs: cannot read the name in {line:?}"
        );
        names.push((name, lib == "Nvml"));
    }
    assert!(
        names.len() > 50,
        "hooks.rs: found only {} wrapped entries",
        names.len()
    );
    let mut out = String::new();
    let n = names.len();
    writeln!(out, "/// How many entry points the loader exports.").unwrap();
    writeln!(out, "pub const COUNT: usize = {n};").unwrap();
    writeln!(out, "/// Their names, in slot order.").unwrap();
    write!(out, "pub static NAMES: [&core::ffi::CStr; COUNT] = [").unwrap();
    for (name, _) in &names {
        write!(out, "c\"{name}\", ").unwrap();
    }
    writeln!(
        out,
        "];\n/// Whether each is an NVML entry point (else a driver one)."
    )
    .unwrap();
    write!(out, "pub static IS_NVML: [bool; COUNT] = [").unwrap();
    for (_, nvml) in &names {
        write!(out, "{nvml}, ").unwrap();
    }
    writeln!(out, "];").unwrap();
    writeln!(out, "exports! {{").unwrap();
    for (i, (name, _)) in names.iter().enumerate() {
        writeln!(out, "    {i} {name} resolve_{i};").unwrap();
    }
    writeln!(out, "}}").unwrap();
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs");
    std::fs::write(dest, out).unwrap();

    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let src = match arch.as_str() {
        "x86_64" => "../../shim-c/dlsym_x86_64.S",
        "aarch64" => "../../shim-c/dlsym_aarch64.S",
        other => panic!("cuslice: no dlsym trampoline for {other}; add one to shim-c/"),
    };
    println!("cargo:rerun-if-changed={src}");
    cc::Build::new().file(src).compile("cuslice_shim");
}
