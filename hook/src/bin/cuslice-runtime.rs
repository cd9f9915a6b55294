//! `cuslice-runtime [--cuslice-runtime=PATH] [--cuslice-hook=PATH] [--cuslice-hook-arg=ARG]...
//! [--cuslice-cdi-spec-dir=DIR]... [--cuslice-container-index=DIR] RUNC-ARGS...`: applies the
//! CDI devices a container's `cdi.k8s.io/*` annotations and the DRA plugin's container index
//! name and adds cuslice-hook to the bundle of a container that
//! mentions cuslice, then execs the real runtime (runc by default) with RUNC-ARGS. See
//! `cuslice_hook::wrapper`.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use cuslice_hook::wrapper::{
    bundle_of, log_line, prepare_config, runtime, runtime_log, split_args,
};
use cuslice_state::fsio::Durability;

cuslice_state::release_mark!();

fn hook_beside_me() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("cuslice-hook")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/cuslice-hook"))
}

/// Rewrites the bundle's config.json when the container names CDI devices or mentions cuslice.
fn prepare(
    bundle: &Path,
    hook: &Path,
    extra: &[String],
    cdi_dirs: &[PathBuf],
    index: &Path,
) -> Result<(), String> {
    let path = bundle.join("config.json");
    // A bundle the runtime cannot read either: let it say so.
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let Some(new) = prepare_config(&text, hook, extra, cdi_dirs, index)? else {
        return Ok(());
    };
    let mode = std::fs::metadata(&path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    // The bundle lives only while the container does: no fsync.
    let written = cuslice_state::fsio::write_atomic(&path, new.as_bytes(), mode, Durability::None);
    written.map_err(|e| {
        format!(
            "cannot add cuslice-hook to {} ({e}); the container asks for cuslice limits, so it is not started without them",
            path.display()
        )
    })
}

/// What `cuslice-runtime --help` says before the real runtime's own help.
fn usage() -> String {
    format!(
        "\
usage: cuslice-runtime [--cuslice-runtime=PATH] [--cuslice-hook=PATH] [--cuslice-hook-arg=ARG]...
                       [--cuslice-cdi-spec-dir=DIR]... [--cuslice-container-index=DIR] RUNTIME-ARGS...

An OCI runtime wrapper: for `create` and `run` it adds cuslice-hook to a container that asks for
cuslice limits and applies the CDI devices its cdi.k8s.io/* annotations name, then runs the real
runtime with RUNTIME-ARGS. Its own options may come anywhere and are removed:
  --cuslice-runtime=PATH         the real runtime (default: runc on PATH)
  --cuslice-hook=PATH            the hook to add (default: cuslice-hook beside this program)
  --cuslice-hook-arg=ARG         an argument for the hook (repeatable)
  --cuslice-cdi-spec-dir=DIR     where CDI specs lie (repeatable; default {})
  --cuslice-container-index=DIR  the DRA plugin's container index (default {})
",
        cuslice_cdi::DEFAULT_SPEC_DIRS.join(", "),
        cuslice_cdi::DEFAULT_CONTAINER_INDEX
    )
}

/// Whether RUNTIME-ARGS ask for help and nothing else.
fn asks_for_help(rest: &[std::ffi::OsString]) -> bool {
    matches!(rest, [one] if ["--help", "-h", "help"].iter().any(|h| one == h))
}

fn main() -> ExitCode {
    let args = split_args(std::env::args_os().skip(1));
    if asks_for_help(&args.rest) {
        let real = runtime(&args);
        print!("{}", usage());
        println!("\nThe runtime's own help ({}):", real.to_string_lossy());
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    if let Some(bundle) = bundle_of(&args.rest) {
        let hook = args.hook.clone().unwrap_or_else(hook_beside_me);
        if let Err(e) = prepare(
            &bundle,
            &hook,
            &args.hook_args,
            &args.spec_dirs(),
            &args.container_index(),
        ) {
            let msg = format!("cuslice-runtime: {e}");
            eprintln!("{msg}");
            // containerd's shim reports the last error in the runtime's log (runc's own errors
            // reach it that way), so the message reaches `ctr` and the kubelet's pod events.
            if let Some((log, json)) = runtime_log(&args.rest) {
                let line = log_line(&msg, json, std::time::SystemTime::now());
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            }
            return ExitCode::FAILURE;
        }
    }
    let real = runtime(&args);
    let err = Command::new(real).args(&args.rest).exec();
    eprintln!(
        "cuslice-runtime: cannot run the runtime {}: {err}; pass --cuslice-runtime=PATH",
        real.to_string_lossy()
    );
    ExitCode::FAILURE
}
