//! The Slurm release the plugin is built for: slurmd loads a SPANK plugin only when its
//! `plugin_version` is its own release (major and minor), so it comes from the headers of the
//! Slurm the plugin will be loaded by: `$SLURM_VERSION_H`, else
//! `/usr/include/slurm/slurm_version.h` (Debian's `libslurm-dev`). Without headers it is 0,
//! which `cuslice install --engine slurm` refuses to install.
//!
//! Cargo reruns a build script when a file it named changed since the last run, by modification
//! time; a package manager installs headers with their release's old times. So while no header is
//! found, the script also names a file that never exists, and runs again at every build until
//! one is: headers installed after a build are read by the next one.

use std::path::PathBuf;

fn main() {
    let header = std::env::var_os("SLURM_VERSION_H")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include/slurm/slurm_version.h"));
    println!("cargo:rerun-if-env-changed=SLURM_VERSION_H");
    println!("cargo:rerun-if-changed={}", header.display());
    let version = std::fs::read_to_string(&header)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let rest = l.trim().strip_prefix("#define")?.trim();
                let value = rest.strip_prefix("SLURM_VERSION_NUMBER")?.trim();
                let hex = value
                    .strip_prefix("0x")
                    .or_else(|| value.strip_prefix("0X"))?;
                u32::from_str_radix(hex, 16).ok()
            })
        })
        .unwrap_or(0);
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if version == 0 {
        println!(
            "cargo:rerun-if-changed={}",
            out.join("rerun-until-slurm-headers-are-found").display()
        );
        println!(
            "cargo:warning=no SLURM_VERSION_NUMBER in {}: the SPANK plugin is built for no Slurm \
             release, and `cuslice install --engine slurm` refuses it; install Slurm's headers \
             (libslurm-dev) or set SLURM_VERSION_H, and build again",
            header.display()
        );
    }
    std::fs::write(out.join("slurm_version.rs"), format!("{version:#x}\n"))
        .expect("OUT_DIR is writable");
}
