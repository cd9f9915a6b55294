//! Assembles shim-c's dlsym trampoline for the target architecture into the library.

fn main() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let src = match arch.as_str() {
        "x86_64" => "../shim-c/dlsym_x86_64.S",
        "aarch64" => "../shim-c/dlsym_aarch64.S",
        other => panic!("cuslice: no dlsym trampoline for {other}; add one to shim-c/"),
    };
    println!("cargo:rerun-if-changed={src}");
    cc::Build::new().file(src).compile("cuslice_shim");
}
