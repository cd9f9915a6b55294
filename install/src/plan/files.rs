//! The installed files in a plan: the binaries and the libraries from `--from` (each stripped,
//! its debug info beside it), with the slurm engine the SPANK plugin too, or their removal.

use std::path::{Path, PathBuf};

use super::{Change, Ctx, Engine, Failure, slurm};
use crate::fsio;
use crate::layout::{BINARIES, LIBRARIES, Layout, SPANK_PLUGIN};
use crate::strip;

/// The installed files: (file name in --from, target path, mode). Each also gets its debug
/// info beside it where the source has some (`strip`).
fn artefacts(l: &Layout) -> Vec<(&'static str, String, u32)> {
    let bins = BINARIES.iter().map(|&b| (b, l.bin(b), 0o755));
    let libs = LIBRARIES.iter().map(|&f| (f, l.lib(f), 0o644));
    bins.chain(libs).collect()
}

pub(super) fn install_files(
    cx: &Ctx<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let from = match &o.from {
        Some(f) => f.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .ok_or_else(|| {
                Failure::Failed(
                    "cuslice install: cannot tell where this executable lives; pass --from DIR"
                        .to_owned(),
                )
            })?,
    };
    // The library sits next to the binaries in a build (target/release) or in an image, and in
    // PREFIX/lib/cuslice next to PREFIX/bin once installed.
    let source = |file: &str| -> PathBuf {
        let direct = from.join(file);
        if LIBRARIES.contains(&file) && !direct.is_file() {
            let installed = from.join("../lib/cuslice").join(file);
            if installed.is_file() {
                return installed;
            }
        }
        direct
    };
    let missing: Vec<String> = artefacts(&o.layout)
        .iter()
        .map(|(f, _, _)| source(f))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Failure::Refused(format!(
            "cuslice install: {}: missing; build with `cargo build --release` (target/release \
             then holds cuslice-hook, cuslice-runtime, cuslice, libcuslice.so and \
             libcuslice_core.so) or pass --from DIR with those five files",
            missing.join(", ")
        )));
    }
    let mut sources: Vec<(PathBuf, &str, String, u32)> = artefacts(&o.layout)
        .into_iter()
        .map(|(file, target, mode)| (source(file), file, target, mode))
        .collect();
    if o.engines.contains(&Engine::Slurm) {
        // Checked against this node's slurmd before anything is written.
        let src = slurm::plugin_source(cx, &from, warnings)?;
        sources.push((src, SPANK_PLUGIN, o.layout.spank_path(), 0o644));
    }
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for (src, file, target, mode) in sources {
        let (split, why) = strip::split(&src, file)
            .map_err(|e| Failure::Failed(format!("cuslice {}: {e}", o.cmd.word())))?;
        match why {
            Some(strip::Kept::NoObjcopy) => kept.push(file.to_owned()),
            Some(strip::Kept::Failed(e)) => {
                warnings.push(format!("{file}: installed with its debug info ({e})"))
            }
            None => {}
        }
        let debug = split.debug.map(|d| (strip::debug_path(&target), d, 0o644));
        for (target, bytes, mode) in [(target, split.file, mode)].into_iter().chain(debug) {
            let path = fsio::host(&o.root, &target);
            let (old, old_mode) = match fsio::read(&path) {
                Ok(Some((b, m))) => (Some(b), Some(m)),
                Ok(None) => (None, None),
                Err(e) => return Err(cx.failed(&path, "cannot read it", &e)),
            };
            out.push(Change {
                path,
                old,
                old_mode,
                new: Some(bytes),
                mode,
                force_mode: true,
                text: false,
                source: Some(src.clone()),
            });
        }
    }
    if !kept.is_empty() {
        warnings.push(format!(
            "{}: installed with their debug info: objcopy (binutils) is not on PATH; install \
             binutils and run the command again to install them stripped, with the debug info \
             in .debug/ beside them",
            kept.join(", ")
        ));
    }
    Ok(out)
}

/// The installed files' removal: every file (`everything`), or the SPANK plugin alone. The
/// plugin (installed with the slurm engine only) goes where it is there.
pub(super) fn uninstall_files(cx: &Ctx<'_>, everything: bool) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let mut out = Vec::new();
    let plugin = (o.layout.spank_path(), 0o644, false);
    let listed = match everything {
        true => artefacts(&o.layout)
            .into_iter()
            .map(|(_, target, mode)| (target, mode, true))
            .collect(),
        false => Vec::new(),
    };
    // Each file, and its debug info where install put some beside it.
    let files = listed
        .into_iter()
        .chain([plugin])
        .flat_map(|(target, mode, always)| {
            let debug = strip::debug_path(&target);
            [(target, mode, always), (debug, 0o644, false)]
        });
    for (target, mode, always) in files {
        let path = fsio::host(&o.root, &target);
        if !always && std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let (old, old_mode) = match std::fs::symlink_metadata(&path) {
            Err(_) => (None, None),
            // Not read: only whether it is there matters.
            Ok(m) => (
                Some(Vec::new()),
                Some(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777),
            ),
        };
        out.push(Change {
            path,
            old,
            old_mode,
            new: None,
            mode,
            force_mode: true,
            text: false,
            source: None,
        });
    }
    Ok(out)
}
