//! Through runc directly: `runc spec`'s bundle with the installed hook at createRuntime and
//! poststop, as the registrations run it (runc has no registration of its own).

use std::process::Command;

use super::{Bench, CMD, ENV, Outcome, Places, output, seen, timed};
use crate::fsio;
use crate::layout::{HOOK_BIN, LIBRARY};

pub fn run(p: &Places, b: &Bench) -> Outcome {
    let hook = fsio::host(&p.root, &p.layout.hook_path());
    let library = fsio::host(&p.root, &p.layout.library_path());
    if !hook.is_file() || !library.is_file() {
        return Outcome::Problem(
            format!(
                "{HOOK_BIN} or {LIBRARY} is not installed under {}",
                p.layout.prefix()
            ),
            "read the message; docs/hook.md".into(),
        );
    }
    let bundle = b.dir.join("bundle");
    if let Err(e) = std::fs::create_dir_all(&bundle) {
        return Outcome::NotRun(format!("{}: {e}", bundle.display()));
    }
    let out = match output(Command::new("runc").arg("spec").current_dir(&bundle)) {
        Ok(o) => o,
        Err(e) => return Outcome::NotRun(format!("runc: {e} (apt-get install runc)")),
    };
    if !out.status.success() {
        return Outcome::NotRun(format!(
            "runc spec: {}",
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let path = bundle.join("config.json");
    let spec = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
    let mut spec = match spec {
        Ok(s) => s,
        Err(e) => return Outcome::NotRun(format!("{}: {e}", path.display())),
    };
    let state_root = p.state_root.display().to_string();
    let hook_entry = |stage: &str| {
        serde_json::json!({
            "path": hook,
            "args": [HOOK_BIN, stage, "--library", library, "--state-root", state_root],
        })
    };
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(CMD);
    spec["process"]["env"] = serde_json::json!(ENV);
    spec["root"]["path"] = serde_json::json!(b.rootfs);
    spec["root"]["readonly"] = false.into();
    spec["hooks"] = serde_json::json!({
        "createRuntime": [hook_entry("createRuntime")],
        "poststop": [hook_entry("poststop")],
    });
    let Some(mounts) = spec["mounts"].as_array_mut() else {
        return Outcome::NotRun("runc spec wrote no mounts".into());
    };
    for (src, dst, _) in &b.mounts {
        mounts.push(serde_json::json!({
            "destination": dst, "type": "bind", "source": src, "options": ["rbind", "rw"],
        }));
    }
    if let Err(e) = std::fs::write(&path, spec.to_string()) {
        return Outcome::NotRun(format!("{}: {e}", path.display()));
    }
    let runc_root = b.dir.join("runc");
    let run = timed(
        "runc",
        [
            "--root".as_ref(),
            runc_root.as_os_str(),
            "run".as_ref(),
            "--bundle".as_ref(),
            bundle.as_os_str(),
            b.name.as_ref(),
        ],
    )
    .stdin(std::process::Stdio::null())
    .output();
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["delete", "-f", &b.name])
        .output();
    match run {
        Ok(out) => seen(&out, "runc run"),
        Err(e) => Outcome::NotRun(format!("timeout: {e}")),
    }
}

/// Why the hook ran but the cap is not seen, and what to do.
pub fn uncapped() -> (String, String) {
    (
        "the hook did not make it load the library".into(),
        "check the hook's registration and its log (docs/hook.md)".into(),
    )
}
