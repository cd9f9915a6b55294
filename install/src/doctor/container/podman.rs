//! Through Podman: `podman run --rm -e CUSLICE_MEMORY_LIMIT=1GiB --rootfs DIR`, with Podman's
//! own configuration (containers.conf, `CONTAINERS_CONF`): Podman runs the hooks.d
//! descriptors `cuslice install --engine podman` wrote when its hooks directories hold them.
//! `--rootfs` runs the test's directory as it is, so no image is stored.

use std::ffi::OsString;
use std::process::Command;

use super::{Bench, CMD, ENV, Outcome, Places, install_command, output, seen, timed};

pub fn run(b: &Bench) -> Outcome {
    let mut a: Vec<OsString> = vec![
        "run".into(),
        "--rm".into(),
        "--name".into(),
        b.name.clone().into(),
        "--network=none".into(),
    ];
    for e in ENV {
        a.push("-e".into());
        a.push(e.into());
    }
    for (src, dst, rw) in &b.mounts {
        a.push("-v".into());
        a.push(format!("{}:{dst}:{}", src.display(), if *rw { "rw" } else { "ro" }).into());
    }
    a.push("--rootfs".into());
    a.push(b.rootfs.clone().into());
    a.extend(CMD.map(OsString::from));
    let run = timed("podman", &a)
        .stdin(std::process::Stdio::null())
        .output();
    // Gone with --rm, unless podman was killed first.
    let _ = output(Command::new("podman").args(["rm", "--force", "--time", "0", &b.name]));
    match run {
        Ok(out) if out.status.code() == Some(127) => {
            Outcome::NotRun("podman is not installed (apt-get install podman)".into())
        }
        Ok(out) => seen(&out, "podman run"),
        Err(e) => Outcome::NotRun(format!("timeout: {e}")),
    }
}

/// Why Podman ran the container uncapped, and what to do.
pub fn uncapped(p: &Places) -> (String, String) {
    (
        "podman ran no cuslice hook (no descriptor in the hooks directories it reads)".into(),
        format!(
            "{} (podman reads /etc/containers/oci/hooks.d unless containers.conf's hooks_dir \
             names others)",
            install_command(p, "podman")
        ),
    )
}
