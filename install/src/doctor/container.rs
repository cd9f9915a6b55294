//! `cuslice doctor --container-test ENGINE`: a throwaway container with
//! `CUSLICE_MEMORY_LIMIT=1GiB`, started the way a user of ENGINE starts one and through ENGINE's
//! registration of cuslice; the test workload (`cuda-workload`, beside this `cuslice`) says from
//! inside what device size it sees. On the simulated GPU (`SIMGPU_STATE`, or `--sim-state FILE`)
//! the simulator's libraries and state are mounted in where the driver's would be.
//!
//! - this file: the root filesystem, the mounts, and what a run came to as one item;
//! - one module per engine: [`runc`] (the installed hook put in the bundle by hand), [`podman`]
//!   (hooks.d), [`docker`] (the runtime in daemon.json), [`containerd`] (the CRI runtime
//!   handler, run through `ctr`).

mod containerd;
mod docker;
mod podman;
mod runc;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::Places;
use super::judge::{Item, Status};

/// The engines `--container-test` takes.
pub const ENGINES: [&str; 4] = ["runc", "podman", "docker", "containerd"];

/// The cap the container asks for, and what it must then see.
const CAP: u64 = 1 << 30;
/// The container's environment: the cap, and where the simulator's state is mounted.
const ENV: [&str; 3] = [
    "PATH=/bin",
    "CUSLICE_MEMORY_LIMIT=1GiB",
    "SIMGPU_STATE=/run/simgpu/state",
];
/// What the container runs: prints a `start` event with the device size CUDA reports.
const CMD: [&str; 2] = ["/bin/cuda-workload", "info"];
/// The longest a container may take; then it is killed and the test fails.
const TIMEOUT_S: &str = "60";

/// What a run through an engine came to.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The workload ran and CUDA reported a device of this many bytes.
    Saw(u64),
    /// The engine or cuslice's registration with it is wrong: what, and the fix.
    Problem(String, String),
    /// The test cannot run here: why.
    NotRun(String),
}

/// What is set up for any engine: a root filesystem holding the workload and its libraries,
/// the simulator's files to mount (host path, container path, writable), and a unique name.
struct Bench {
    dir: PathBuf,
    rootfs: PathBuf,
    mounts: Vec<(PathBuf, &'static str, bool)>,
    name: String,
}

/// Runs the test through `engine` (one of [`ENGINES`]); one item saying what it saw.
pub fn test(p: &Places, engine: &str, sim_state: Option<&Path>) -> Item {
    let check = format!("container test ({engine})");
    let name = format!("cuslice-doctor-{}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let outcome = match bench(sim_state, &dir, name) {
        Err(why) => Outcome::NotRun(why),
        Ok(b) => match engine {
            "runc" => runc::run(p, &b),
            "podman" => podman::run(&b),
            "docker" => docker::run(p, &b),
            "containerd" => containerd::run(p, &b),
            other => Outcome::NotRun(format!("no container test for {other}")),
        },
    };
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Outcome::Saw(total) if total == CAP => Item {
            check,
            status: Status::Ok,
            detail: "the library loaded in a container with CUSLICE_MEMORY_LIMIT=1GiB and the \
                     container sees a 1 GiB device"
                .into(),
            fix: None,
        },
        Outcome::Saw(total) => {
            let (why, fix) = match engine {
                "runc" => runc::uncapped(),
                "podman" => podman::uncapped(p),
                "docker" => docker::uncapped(p),
                _ => containerd::uncapped(p),
            };
            Item {
                check,
                status: Status::Problem,
                detail: format!(
                    "with CUSLICE_MEMORY_LIMIT=1GiB the container sees a device of {total} \
                     bytes: {why}"
                ),
                fix: Some(fix),
            }
        }
        Outcome::Problem(detail, fix) => Item {
            check,
            status: Status::Problem,
            detail,
            fix: Some(fix),
        },
        Outcome::NotRun(why) => Item {
            check,
            status: Status::Note,
            detail: format!("not run: {why}"),
            fix: None,
        },
    }
}

/// Err: the test cannot run here (no workload, not on the simulated GPU).
fn bench(sim_state: Option<&Path>, dir: &Path, name: String) -> Result<Bench, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let here = exe.parent().ok_or("no directory for this executable")?;
    let workload = here.join("cuda-workload");
    if !workload.is_file() {
        return Err(format!(
            "{} is missing (the test workload, built with the workspace)",
            workload.display()
        ));
    }
    let sim = sim_state.filter(|s| !s.as_os_str().is_empty()).ok_or(
        "only on the simulated GPU (SIMGPU_STATE or --sim-state); on a real GPU, run a \
             container through your engine with CUSLICE_MEMORY_LIMIT set",
    )?;
    if !sim.is_file() {
        return Err(format!(
            "{}: no simulated GPU's state there (simgpu init makes one)",
            sim.display()
        ));
    }
    let (cuda, nvml) = simgpu_libs(here).ok_or("simgpu's libraries are not found")?;
    let rootfs = dir.join("rootfs");
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
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
    let mut mem = sim.as_os_str().to_owned();
    mem.push(".mem");
    Ok(Bench {
        dir: dir.to_path_buf(),
        rootfs,
        mounts: vec![
            (cuda, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", false),
            (nvml, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", false),
            (sim.to_path_buf(), "/run/simgpu/state", true),
            (PathBuf::from(mem), "/run/simgpu/state.mem", true),
        ],
        name,
    })
}

/// What the workload printed about the device, from the container's output; else what went
/// wrong, from the engine's (`how`: the command, as the user would name it).
fn seen(out: &Output, how: &str) -> Outcome {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let start = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "start");
    match start.and_then(|v| v["reported_total"].as_u64()) {
        Some(total) => Outcome::Saw(total),
        None => Outcome::Problem(
            format!(
                "`{how}` did not run the container ({}): {}",
                exit(out),
                crate::problem::one_line(&String::from_utf8_lossy(&out.stderr))
            ),
            "read the message; docs/hook.md".into(),
        ),
    }
}

/// An exit status, naming the container test's time limit where `timeout` ended it.
fn exit(out: &Output) -> String {
    match out.status.code() {
        Some(124) => format!("killed after {TIMEOUT_S} s"),
        _ => out.status.to_string(),
    }
}

/// `cmd` run to its end with no input.
fn output(cmd: &mut Command) -> std::io::Result<Output> {
    cmd.stdin(Stdio::null()).output()
}

/// `timeout 60 PROGRAM ARGS...`: the command, killed if it runs longer.
fn timed(program: &str, args: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>) -> Command {
    let mut c = Command::new("timeout");
    c.arg(TIMEOUT_S).arg(program).args(args);
    c
}

/// `cuslice install --engine ENGINE`, with this doctor's `--prefix` and `--name` where they
/// are not the defaults.
fn install_command(p: &Places, engine: &str) -> String {
    let mut s = format!("cuslice install --engine {engine}");
    if p.layout.prefix() != cuslice_state::paths::DEFAULT_PREFIX {
        s.push_str(&format!(" --prefix {}", p.layout.prefix()));
    }
    if p.layout.name() != "cuslice" {
        s.push_str(&format!(" --name {}", p.layout.name()));
    }
    s
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
