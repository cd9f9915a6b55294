//! Stripping on install: a release build keeps its debug info (`debug = "line-tables-only"` in
//! the workspace's `[profile.release]`), which is most of each file's size (libcuslice.so 6.1 MB,
//! 0.6 MB without). `cuslice install` installs each ELF file stripped (`objcopy
//! --strip-unneeded`) and its debug info beside it as `.debug/NAME.debug` (`objcopy
//! --only-keep-debug`), linked from the stripped file by `--add-gnu-debuglink`, the way
//! distributions split `-dbgsym` packages: gdb, `objdump --dwarf=follow-links`, perf and
//! addr2line find the `.debug` file through the link (they look in the file's directory and its
//! `.debug/` subdirectory). See docs/install.md ("Debug info").
//!
//! A source without debug sections (already stripped, as in an image built that way) is copied
//! as it is, with its `.debug/NAME.debug` if one lies beside it. Without `objcopy` (binutils) the
//! files are installed as built, with one warning.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory beside an installed file that holds its debug info.
pub const DEBUG_DIR: &str = ".debug";

/// What to install for one source file.
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    /// The file to install (stripped, or the source as it is).
    pub file: Vec<u8>,
    /// Its debug info, for `DEBUG_DIR/NAME.debug`, where there is one.
    pub debug: Option<Vec<u8>>,
}

/// Why a file with debug info was installed as built.
#[derive(Debug, PartialEq, Eq)]
pub enum Kept {
    /// No `objcopy` on PATH.
    NoObjcopy,
    /// objcopy failed on it (an ELF file it cannot rewrite): what it said.
    Failed(String),
}

/// `dir/.debug/NAME.debug` for the file `dir/NAME` (a path on the target system or here).
pub fn debug_path(file: &str) -> String {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    format!("{dir}/{DEBUG_DIR}/{name}.debug")
}

/// Splits the source `src` (named `name` once installed) into the file to install and its debug
/// info. Err: a one-line reason objcopy failed.
pub fn split(src: &Path, name: &str) -> Result<(Split, Option<Kept>), String> {
    let bytes =
        std::fs::read(src).map_err(|e| format!("{}: cannot read it: {e}", src.display()))?;
    if !has_debug_sections(&bytes) {
        let beside = src
            .parent()
            .unwrap_or(Path::new("."))
            .join(DEBUG_DIR)
            .join(format!("{name}.debug"));
        let debug = if is_elf(&bytes) {
            std::fs::read(&beside).ok()
        } else {
            None
        };
        return Ok((Split { file: bytes, debug }, None));
    }
    let tmp = tempdir()?;
    let result = objcopy_split(src, name, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(match result {
        Ok(s) => (s, None),
        Err(why) => (
            Split {
                file: bytes,
                debug: None,
            },
            Some(why),
        ),
    })
}

fn objcopy_split(src: &Path, name: &str, tmp: &Path) -> Result<Split, Kept> {
    // The link names the debug file by its file name (and CRC): write it under the final name.
    let debug = tmp.join(format!("{name}.debug"));
    let stripped = tmp.join(name);
    let run = |args: &[&OsStr]| -> Result<(), Kept> {
        match Command::new("objcopy").args(args).output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(Kept::Failed(format!(
                "objcopy {}: {}",
                args.first().map_or("".into(), |a| a.to_string_lossy()),
                String::from_utf8_lossy(&o.stderr).trim()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Kept::NoObjcopy),
            Err(e) => Err(Kept::Failed(format!("cannot run objcopy: {e}"))),
        }
    };
    let mut link = OsString::from("--add-gnu-debuglink=");
    link.push(&debug);
    run(&[
        "--only-keep-debug".as_ref(),
        src.as_os_str(),
        debug.as_os_str(),
    ])?;
    run(&[
        "--strip-unneeded".as_ref(),
        link.as_os_str(),
        src.as_os_str(),
        stripped.as_os_str(),
    ])?;
    let read =
        |p: &PathBuf| std::fs::read(p).map_err(|e| Kept::Failed(format!("{}: {e}", p.display())));
    Ok(Split {
        file: read(&stripped)?,
        debug: Some(read(&debug)?),
    })
}

fn tempdir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    for n in 0..100u32 {
        let p = base.join(format!("cuslice-install-{}-{n}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: cannot make it: {e}", p.display())),
        }
    }
    Err(format!(
        "cannot make a temporary directory under {}",
        base.display()
    ))
}

fn is_elf(b: &[u8]) -> bool {
    b.starts_with(b"\x7fELF")
}

/// Whether `b` is a 64-bit little-endian ELF file with DWARF sections (`.debug_*`, `.zdebug_*`,
/// not loaded at run time: `.debug_gdb_scripts`, which Rust puts in executables, is loaded and
/// stays in a stripped file). Anything else (another format, an odd header) reads as "no".
pub fn has_debug_sections(b: &[u8]) -> bool {
    section_names(b).is_some_and(|names| {
        names
            .iter()
            .any(|&(n, alloc)| !alloc && (n.starts_with(b".debug_") || n.starts_with(b".zdebug_")))
    })
}

/// The section names of a 64-bit little-endian ELF file, each with whether it is loaded
/// (SHF_ALLOC).
fn section_names(b: &[u8]) -> Option<Vec<(&[u8], bool)>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?)).ok()
    };
    // EI_CLASS 2 (64-bit), EI_DATA 1 (little-endian).
    if !is_elf(b) || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let (shoff, shentsize) = (u64_at(0x28)?, usize::from(u16_at(0x3a)?));
    let (shnum, shstrndx) = (usize::from(u16_at(0x3c)?), usize::from(u16_at(0x3e)?));
    if shentsize < 0x40 {
        return None;
    }
    let header = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let strtab = header(shstrndx)?;
    let (str_off, str_size) = (u64_at(strtab + 0x18)?, u64_at(strtab + 0x20)?);
    let strings = b.get(str_off..str_off.checked_add(str_size)?)?;
    (0..shnum)
        .map(|i| {
            let h = header(i)?;
            let name = u32_at(h)? as usize;
            let alloc = u64_at(h + 8)? & 0x2 != 0;
            let rest = strings.get(name..)?;
            Some((&rest[..rest.iter().position(|&c| c == 0)?], alloc))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_paths_sit_beside_the_file() {
        assert_eq!(
            debug_path("/usr/local/lib/cuslice/libcuslice.so"),
            "/usr/local/lib/cuslice/.debug/libcuslice.so.debug"
        );
        assert_eq!(
            debug_path("/bin/cuslice-hook"),
            "/bin/.debug/cuslice-hook.debug"
        );
    }

    #[test]
    fn only_elf_files_with_dwarf_count() {
        assert!(!has_debug_sections(b"fake cuslice-hook\n"));
        assert!(!has_debug_sections(b"\x7fELF\x02\x01"));
        // This test binary is built with the release profile's line tables, or the test
        // profile's full debug info.
        let me = std::fs::read(std::env::current_exe().expect("exe")).expect("read");
        assert!(has_debug_sections(&me));
    }
}
