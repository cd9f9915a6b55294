//! Generates the loader's export stubs from the list of entry points the interposer wraps
//! (`interposer/src/wrapped.txt`, from which the core's wrapper registry is made too: the loader
//! exports exactly the names the core wraps, in the list's order), and assembles shim-c's dlsym
//! trampoline.

use std::fmt::Write as _;

fn main() {
    let list = "../src/wrapped.txt";
    println!("cargo:rerun-if-changed={list}");
    let text = std::fs::read_to_string(list).expect("reading interposer/src/wrapped.txt");
    let mut names = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `NAME MODULE`: the module (where the core defines the wrapper) is the core's business.
        let name = line.split_whitespace().next().unwrap_or_default();
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "wrapped.txt:{}: cannot read the name in {line:?}",
            n + 1
        );
        // NVML's entry points are all `nvml*`, the driver's `cu*`.
        let nvml = name.starts_with("nvml");
        assert!(
            nvml || name.starts_with("cu"),
            "wrapped.txt:{}: {name} is neither a driver (cu*) nor an NVML (nvml*) entry point",
            n + 1
        );
        names.push((name.to_owned(), nvml));
    }
    assert!(
        names.len() > 50,
        "wrapped.txt: found only {} wrapped entries",
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
