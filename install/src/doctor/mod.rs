//! `cuslice doctor`: checks this node (NVML, each engine's registration, the installed files,
//! the agent, cgroups, the state root) and prints one line per item. This module gathers the
//! facts (all the I/O); `judge` turns them into items. See docs/doctor.md.

pub mod container;
pub mod judge;

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::fsio;
use crate::layout::{BINARIES, CLI_BIN, HOOK_BIN, LIBRARIES, Layout};
use crate::plan::{self, Cmd, Engine, Options};
use judge::{
    AgentFacts, CgroupFacts, EngineFacts, Facts, FileFacts, GpuFacts, NvmlFacts, SlurmFacts,
    StateRootFacts,
};

/// Where to look.
pub struct Places {
    /// The target system's root on this machine (absolute).
    pub root: PathBuf,
    pub layout: Layout,
    pub state_root: PathBuf,
}

pub fn gather(p: &Places) -> Facts {
    let engines = engines(p);
    let slurm = slurm(p, &engines);
    let mut install_command = format!(
        "cuslice install --engine {}",
        match engines
            .iter()
            .filter(|e| e.present)
            .map(|e| e.engine)
            .collect::<Vec<_>>()
        {
            v if v.is_empty() => "docker|containerd|podman|crio|cdi|slurm".to_owned(),
            v => v.join(","),
        }
    );
    if p.layout.prefix() != "/usr/local" {
        install_command.push_str(&format!(" --prefix {}", p.layout.prefix()));
    }
    if p.layout.name() != "cuslice" {
        install_command.push_str(&format!(" --name {}", p.layout.name()));
    }
    if p.root != Path::new("/") {
        install_command.push_str(&format!(" --root {}", p.root.display()));
    }
    Facts {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        nvml: nvml(),
        engines,
        files: files(p),
        install_command,
        agent: agent(p),
        cgroup: cgroup(),
        state_root: state_root(&p.state_root),
        stale: stale(&p.state_root),
        slurm,
    }
}

/// The installed SPANK plugin and this node's slurmd, where cuslice is registered with Slurm.
fn slurm(p: &Places, engines: &[EngineFacts]) -> Option<SlurmFacts> {
    engines.iter().find(|e| e.engine == "slurm" && e.present)?;
    let plugin = p.layout.spank_path();
    let version = match std::fs::read(fsio::host(&p.root, &plugin)) {
        Ok(b) => crate::elfsym::exported_u32(&b, "plugin_version"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("missing".to_owned()),
        Err(e) => Err(format!("cannot read it ({e})")),
    };
    Some(SlurmFacts {
        plugin,
        version,
        slurmd: plan::slurm::slurmd_release(),
    })
}

fn nvml() -> Result<NvmlFacts, String> {
    use cuslice_node::nvml::Nvml;
    let n = Nvml::open()?;
    let gpus = n.devices().map(|devices| {
        devices
            .into_iter()
            .map(|d| GpuFacts {
                index: d.0,
                name: n
                    .describe(d)
                    .map(|x| x.name)
                    .unwrap_or_else(|e| format!("(no name: {e})")),
                samples: n.process_samples(d),
                processes: n.processes(d).map(|_| ()),
            })
            .collect()
    });
    Ok(NvmlFacts {
        driver: n.driver_version(),
        nvml: n.nvml_version(),
        gpus,
    })
}

/// What `cuslice install --engine E` would change, engine by engine, from install's own plan.
fn engines(p: &Places) -> Vec<EngineFacts> {
    Engine::ALL
        .iter()
        .map(|&engine| {
            let o = Options {
                cmd: Cmd::Install,
                engines: vec![engine],
                layout: p.layout.clone(),
                root: p.root.clone(),
                config: None,
                from: None,
                default_runtime: false,
                keep_files: false,
                agent: false,
                dry_run: true,
            };
            let would_change = plan::registrations(&o, &mut plan::Plan::default())
                .map(|changes| {
                    changes
                        .iter()
                        .filter(|c| !c.is_noop())
                        .map(|c| target(&p.root, &c.path))
                        .collect()
                })
                .map_err(|e| e.to_string());
            EngineFacts {
                engine: engine.name(),
                present: plan::registered(&o, engine),
                would_change,
            }
        })
        .collect()
}

/// A path under `root` as the target system names it.
fn target(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) if root != Path::new("/") => format!("/{}", rel.display()),
        _ => path.display().to_string(),
    }
}

fn files(p: &Places) -> Vec<FileFacts> {
    let l = &p.layout;
    let bins = BINARIES.iter().map(|&b| (b, l.bin(b)));
    let libs = LIBRARIES.iter().map(|&f| (f, l.lib(f)));
    bins.chain(libs)
        .map(|(file, path)| {
            let host = fsio::host(&p.root, &path);
            let present = host.is_file();
            // cuslice-runtime hands --version to runc and the libraries have nothing to ask:
            // their release is marked in the file (`cuslice_state::release`).
            let version = present.then(|| {
                if file == HOOK_BIN || file == CLI_BIN {
                    version_of(&host)
                } else {
                    marked_release(&host)
                }
            });
            FileFacts {
                path,
                present,
                version,
            }
        })
        .collect()
}

/// The release marked in `path` (`cuslice_state::release`), or why none can be read.
fn marked_release(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    cuslice_state::release::release_in(&bytes)
        .ok_or_else(|| "no cuslice release mark in it (from a release before marks)".to_owned())
}

/// The last word of `EXE --version`'s first line (`cuslice-hook 0.1.0`; lines after it may
/// list the state formats).
fn version_of(exe: &Path) -> Result<String, String> {
    let out = std::process::Command::new(exe)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("does not run: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match (
        out.status.success(),
        text.lines()
            .next()
            .and_then(|l| l.split_whitespace().last()),
    ) {
        (true, Some(v)) => Ok(v.to_owned()),
        _ => Err(format!(
            "does not run: `{} --version` said {:?} ({})",
            exe.display(),
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr)),
            out.status
        )),
    }
}

fn agent(p: &Places) -> AgentFacts {
    let socket = p
        .state_root
        .join("agent")
        .join(cuslice_state::agent::SOCKET_NAME);
    let answer = ask_agent(&socket).map(|pid| (Some(pid), agent_version(pid)));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let findings_age = match cuslice_node::findings::read(&p.state_root) {
        Ok(Some(f)) => Some((
            now - f.time,
            (cuslice_node::findings::STALE_PERIODS * f.period_s)
                .max(cuslice_node::findings::STALE_MIN_S),
        )),
        _ => None,
    };
    let unit = fsio::host(&p.root, &p.layout.agent_unit_path())
        .is_file()
        .then(|| p.layout.agent_unit());
    AgentFacts {
        socket: socket.display().to_string(),
        answer,
        findings_age,
        unit,
    }
}

/// Connects to the agent's socket and reads its greeting (docs/agent.md); Ok: the agent's pid,
/// from the socket's peer credentials.
fn ask_agent(socket: &Path) -> Result<i32, String> {
    let mut s = UnixStream::connect(socket)
        .map_err(|e| format!("no cuslice agent at {} ({e})", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    let pid = peer_pid(&s);
    let mut line = Vec::new();
    let _ = (&mut s).take(512).read_to_end(&mut line);
    let line = String::from_utf8_lossy(&line);
    cuslice_state::agent::parse(&line).map_err(|e| {
        format!(
            "the cuslice agent at {} did not answer as an agent does: {e}",
            socket.display()
        )
    })?;
    Ok(pid.unwrap_or(0))
}

/// The pid of the process at the other end of a connected Unix socket (SO_PEERCRED).
fn peer_pid(s: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket, and an out-buffer of the size passed.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(s),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.pid)
}

/// The agent's version: this cuslice's when it runs the same file, else what its executable
/// says to `--version`. None: cannot be told (no access to /proc/PID/exe).
fn agent_version(pid: i32) -> Option<String> {
    if pid <= 0 {
        return None;
    }
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let theirs = std::fs::metadata(&exe).ok()?;
    let ours = std::env::current_exe().and_then(std::fs::metadata).ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Some(env!("CARGO_PKG_VERSION").to_owned());
    }
    version_of(&exe).ok()
}

fn cgroup() -> CgroupFacts {
    use cuslice_agent::cgroup;
    let m = cgroup::mounts();
    let own = cgroup::placement(std::process::id() as i32).unwrap_or_default();
    let v2_freeze = m.v2.as_ref().is_some_and(|root| {
        let mine = own
            .v2
            .as_deref()
            .map(|rel| root.join(rel.trim_start_matches('/')))
            .unwrap_or_else(|| root.clone());
        // This process's cgroup, or (in the root cgroup, which has none) one beside it.
        [mine.clone(), root.clone()].iter().any(|dir| {
            dir.join("cgroup.freeze").exists()
                || std::fs::read_dir(dir)
                    .is_ok_and(|d| d.flatten().any(|e| e.path().join("cgroup.freeze").exists()))
        })
    });
    CgroupFacts {
        pure_v2: m.v2.as_deref() == Some(Path::new("/sys/fs/cgroup")),
        v2: m.v2.map(|p| p.display().to_string()),
        v1_freezer: m.v1_freezer.map(|p| p.display().to_string()),
        v2_freeze,
    }
}

fn state_root(dir: &Path) -> StateRootFacts {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let fs = (|| {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: statfs is plain data; all zeroes is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and an out-pointer to a local.
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast)]
        let tmpfs = st.f_type as i64 == TMPFS_MAGIC;
        Some((tmpfs, st.f_bavail as u64 * st.f_bsize as u64))
    })();
    StateRootFacts {
        path: dir.display().to_string(),
        fs,
    }
}

/// Containers whose state the hook keeps but whose init is gone (what `cuslice-hook sweep`
/// removes).
fn stale(dir: &Path) -> Result<Vec<String>, String> {
    use cuslice_state::host::Root;
    let root = Root::new(dir);
    let containers = root.containers();
    if !containers.exists() {
        return Ok(Vec::new());
    }
    std::fs::read_dir(&containers).map_err(|e| format!("{}: {e}", containers.display()))?;
    Ok(root
        .records()
        .into_iter()
        .filter(|r| !r.alive())
        .map(|r| r.id)
        .collect())
}
