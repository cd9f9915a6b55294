//! `cuslice doctor --container-test runc`: a throwaway container run straight through runc with
//! the installed hook at createRuntime and poststop and `CUSLICE_MEMORY_LIMIT=1GiB`; the test
//! workload (`cuda-workload`, beside this `cuslice`) says from inside what device size it sees.
//! On the simulated GPU (`SIMGPU_STATE`, or `--sim-state FILE`) the simulator's libraries and
//! state are mounted in where the driver's would be.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Places;
use super::judge::{Item, Status};
use crate::fsio;
use crate::layout::{HOOK_BIN, LIBRARY};

const CAP: u64 = 1 << 30;

/// Runs the test; one item saying what it saw.
pub fn runc(p: &Places, sim_state: Option<&Path>) -> Item {
    let check = "container test (runc)";
    let dir = std::env::temp_dir().join(format!("cuslice-doctor-{}", std::process::id()));
    let result = run(p, sim_state, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(Ok(total)) if total == CAP => Item {
            check: check.into(),
            status: Status::Ok,
            detail: "the library loaded in a container with CUSLICE_MEMORY_LIMIT=1GiB and the \
                     container sees a 1 GiB device"
                .into(),
            fix: None,
        },
        Ok(Ok(total)) => Item {
            check: check.into(),
            status: Status::Problem,
            detail: format!(
                "with CUSLICE_MEMORY_LIMIT=1GiB the container sees a device of {total} bytes: \
                 the hook did not make it load the library"
            ),
            fix: Some("check the hook's registration and its log (docs/hook.md)".into()),
        },
        Ok(Err(why)) => Item {
            check: check.into(),
            status: Status::Problem,
            detail: why,
            fix: Some("read the message; docs/hook.md".into()),
        },
        Err(why) => Item {
            check: check.into(),
            status: Status::Note,
            detail: format!("not run: {why}"),
            fix: None,
        },
    }
}

/// Err: the test could not be set up (a note); Ok(Err): the container failed (a problem);
/// Ok(Ok(total)): the device size the container saw.
fn run(p: &Places, sim_state: Option<&Path>, dir: &Path) -> Result<Result<u64, String>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let here = exe.parent().ok_or("no directory for this executable")?;
    let workload = here.join("cuda-workload");
    if !workload.is_file() {
        return Err(format!(
            "{} is missing (the test workload, built with the workspace)",
            workload.display()
        ));
    }
    let sim = sim_state.ok_or(
        "only on the simulated GPU (SIMGPU_STATE or --sim-state); on a real GPU, run a \
         container through your engine with CUSLICE_MEMORY_LIMIT set",
    )?;
    let sim_libs = simgpu_libs(here).ok_or("simgpu's libraries are not found")?;
    let hook = fsio::host(&p.root, &p.layout.hook_path());
    let library = fsio::host(&p.root, &p.layout.library_path());
    if !hook.is_file() || !library.is_file() {
        return Ok(Err(format!(
            "{HOOK_BIN} or {LIBRARY} is not installed under {}",
            p.layout.prefix()
        )));
    }
    let bundle = dir.join("bundle");
    let rootfs = bundle.join("rootfs");
    let io = |e: std::io::Error| e.to_string();
    for d in [
        "bin",
        "proc",
        "dev",
        "sys",
        "tmp",
        "usr/lib/x86_64-linux-gnu",
    ] {
        std::fs::create_dir_all(rootfs.join(d)).map_err(io)?;
    }
    std::fs::copy(&workload, rootfs.join("bin/cuda-workload")).map_err(io)?;
    for lib in libraries(&workload)? {
        let to = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        std::fs::create_dir_all(to.parent().unwrap_or(&rootfs)).map_err(io)?;
        std::fs::copy(&lib, &to).map_err(io)?;
    }
    let out = Command::new("runc")
        .arg("spec")
        .current_dir(&bundle)
        .output()
        .map_err(|e| format!("runc: {e} (apt-get install runc)"))?;
    if !out.status.success() {
        return Err(format!(
            "runc spec: {}",
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(io)?;
    let mut spec: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let state_root = p.state_root.display().to_string();
    let hook_entry = |stage: &str| {
        serde_json::json!({
            "path": hook,
            "args": [HOOK_BIN, stage, "--library", library, "--state-root", state_root],
        })
    };
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/cuda-workload", "info"]);
    spec["process"]["env"] = serde_json::json!([
        "PATH=/bin",
        "CUSLICE_MEMORY_LIMIT=1GiB",
        "SIMGPU_STATE=/run/simgpu/state"
    ]);
    spec["root"]["readonly"] = false.into();
    spec["hooks"] = serde_json::json!({
        "createRuntime": [hook_entry("createRuntime")],
        "poststop": [hook_entry("poststop")],
    });
    let mut mem = sim.as_os_str().to_owned();
    mem.push(".mem");
    let binds = [
        (sim_libs.0, "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (sim_libs.1, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        (sim.to_path_buf(), "/run/simgpu/state"),
        (PathBuf::from(mem), "/run/simgpu/state.mem"),
    ];
    let mounts = spec["mounts"]
        .as_array_mut()
        .ok_or("runc spec wrote no mounts")?;
    for (src, dst) in binds {
        mounts.push(serde_json::json!({
            "destination": dst, "type": "bind", "source": src, "options": ["rbind", "rw"],
        }));
    }
    std::fs::write(&path, spec.to_string()).map_err(io)?;
    let id = format!("cuslice-doctor-{}", std::process::id());
    let runc_root = dir.join("runc");
    let out = Command::new("timeout")
        .arg("60")
        .arg("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("runc: {e}"))?;
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["delete", "-f", &id])
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let start = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "start");
    Ok(match start.and_then(|v| v["reported_total"].as_u64()) {
        Some(total) => Ok(total),
        None => Err(format!(
            "the container did not run ({}): {}",
            out.status,
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr))
        )),
    })
}

/// simgpu's libcuda and libnvidia-ml: on `simgpu run`'s LD_LIBRARY_PATH, or beside this
/// executable (a build's target/release).
fn simgpu_libs(here: &Path) -> Option<(PathBuf, PathBuf)> {
    let ld = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    std::env::split_paths(&ld)
        .chain([here.to_path_buf()])
        .map(|d| (d.join("libsimgpu_cuda.so"), d.join("libsimgpu_nvml.so")))
        .find(|(c, n)| c.is_file() && n.is_file())
}

/// The shared libraries `exe` needs, by ldd.
fn libraries(exe: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(exe)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest.split(' ').next()?,
                None => l.split(' ').next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
