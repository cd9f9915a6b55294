//! The hook with Podman: `cuslice install --engine podman --prefix TMP/prefix --config TMP/hooks.d`
//! writes two OCI hook descriptors (createRuntime and poststop), given with `podman --hooks-dir
//! TMP/hooks.d`. Podman runs createRuntime through runc, and poststop itself after it deleted the
//! container. Each container's root filesystem is a fresh `make_rootfs` directory (`podman
//! run --rootfs`), so no image is stored; the storage driver is vfs, which mounts nothing. Podman
//! has no daemon: its root, runroot, tmpdir and network configuration live under one temporary
//! directory per test binary, removed (after every container left in it) when the test process
//! exits.
//!
//! CDI (`cdi_*` tests): claim specs as the DRA plugin writes them, given with `podman run
//! --device gpu.cuslice.io/claim=NAME`; these containers get no hooks.d descriptors (an empty
//! `--hooks-dir`), so cuslice-hook comes from the spec alone. Podman 4.3 has no
//! `--cdi-spec-dir` and no `cdi_spec_dirs` setting: it reads /etc/cdi and /var/run/cdi, so the
//! specs go to /var/run/cdi under unique names and are removed after each test.

use std::ffi::OsString;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;

use super::*;
use cuslice_test_harness::Sim;

pub struct Podman {
    podman: PathBuf,
    dir: PathBuf,
    /// /var/run/cdi if it was not there before (the CDI tests make it; removed if empty).
    made: Vec<PathBuf>,
}

static ENGINE: OnceLock<Podman> = OnceLock::new();

pub fn engine() -> &'static Podman {
    ENGINE.get_or_init(|| {
        let podman = tool("podman", "podman");
        tool("conmon", "conmon");
        tool("runc", "runc");
        let dir = state_dir("podman");
        let made = new_paths(&["/var/run/cdi"]);
        or_undo(
            || cuslice_install("podman", &dir.join("prefix"), &dir.join("hooks.d")),
            || remove_dir(&dir),
        );
        at_exit(stop);
        Podman { podman, dir, made }
    })
}

/// At exit: remove every container left (poststop runs), then the directory.
fn stop() {
    let Some(p) = ENGINE.get() else { return };
    let _ = p
        .podman()
        .args(["rm", "--all", "--force", "--time", "0"])
        .output();
    remove_dir(&p.dir);
    remove_new(&p.made);
}

/// The settings [`Podman`] gives podman as flags, as configuration files in `dir` for a podman
/// that another program runs with no flags of ours: the variables to set (`CONTAINERS_CONF`,
/// `CONTAINERS_STORAGE_CONF`: each then the only file of its kind podman reads) and their
/// files. Hooks come from `hooks` alone.
pub fn scratch_conf(dir: &Path, hooks: &Path) -> Vec<(&'static str, PathBuf)> {
    let d = dir.display();
    let containers = format!(
        r#"[containers]
# Without both, runc fails setting rlimits on this machine kind.
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
# crun refuses this machine kind's hybrid cgroup layout; systemd may not be there.
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
events_logfile_path = "{d}/events.log"
hooks_dir = ["{hooks}"]
tmp_dir = "{d}/tmp"

[network]
network_config_dir = "{d}/networks"
"#,
        hooks = hooks.display()
    );
    let storage = format!(
        r#"[storage]
driver = "vfs"
graphroot = "{d}/root"
runroot = "{d}/runroot"
"#
    );
    let files = [
        ("CONTAINERS_CONF", dir.join("containers.conf"), containers),
        ("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"), storage),
    ];
    files
        .into_iter()
        .map(|(var, path, text)| {
            std::fs::write(&path, text).unwrap();
            (var, path)
        })
        .collect()
}

impl Podman {
    fn podman(&self) -> Command {
        self.podman_with_hooks(&self.dir.join("hooks.d"))
    }

    /// With `--hooks-dir hooks`.
    fn podman_with_hooks(&self, hooks: &Path) -> Command {
        let mut c = Command::new(&self.podman);
        let d = &self.dir;
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .arg("--network-config-dir")
            .arg(d.join("networks"))
            .arg("--hooks-dir")
            .arg(hooks)
            .args(["--storage-driver=vfs", "--events-backend=file"])
            // crun refuses this machine kind's hybrid cgroup layout; systemd may not be there.
            .args(["--cgroup-manager=cgroupfs", "--runtime=runc"])
            .stdin(Stdio::null());
        c
    }

    /// `podman run ... --rootfs ROOTFS CMD...`; `cidfile`: where podman writes the id; `cdi`:
    /// CDI device ids for `--device` (then no GPU mounts but the simulator's state: the specs
    /// bring the rest; and no hooks.d unless `hooks` names one); `hooks`: a hooks directory
    /// other than podman's default here (this engine's own install).
    fn run_command(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        rootfs: &Path,
        cidfile: Option<&Path>,
        cdi: Option<&[String]>,
        hooks: Option<&Path>,
    ) -> Command {
        let mut a: Vec<OsString> = vec!["run".into(), "--name".into(), spec.name.into()];
        match cidfile {
            Some(f) => {
                a.push("--cidfile".into());
                a.push(f.into());
            }
            None => a.push("--rm".into()),
        }
        // Without both, runc fails setting rlimits on this machine kind.
        for u in ["nofile=1024:1024", "nproc=1024:1024"] {
            a.push("--ulimit".into());
            a.push(u.into());
        }
        a.push("--network=none".into());
        if spec.read_only {
            a.push("--read-only".into());
        }
        for e in all_env(spec) {
            a.push("-e".into());
            a.push(e.into());
        }
        let mounts = match cdi {
            None => gpu_mounts(sim),
            Some(ids) => {
                for id in ids {
                    a.push("--device".into());
                    a.push(id.into());
                }
                sim_state_mount(sim)
            }
        };
        for (src, dst, rw) in mounts {
            a.push("-v".into());
            a.push(format!("{}:{dst}:{}", src.display(), if rw { "rw" } else { "ro" }).into());
        }
        a.push("--rootfs".into());
        a.push(rootfs.into());
        a.extend(spec.cmd.iter().map(OsString::from));
        let mut c = match (cdi, hooks) {
            (_, Some(hooks)) => self.podman_with_hooks(hooks),
            (None, None) => self.podman(),
            (Some(_), None) => {
                let none = self.dir.join("no-hooks.d");
                std::fs::create_dir_all(&none).unwrap();
                self.podman_with_hooks(&none)
            }
        };
        c.args(a);
        c
    }
}

struct PodmanContainer<'a> {
    engine: &'a Podman,
    name: String,
    /// The rootfs and the cidfile.
    dir: tempfile::TempDir,
    child: Child,
    out: BufReader<ChildStdout>,
    removed: bool,
    err: Stderr,
}

impl PodmanContainer<'_> {
    /// `podman rm -f`: podman kills the container, has runc delete it and then runs the
    /// poststop hooks itself, before it returns.
    fn remove_now(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.removed, true) {
            return Ok(());
        }
        let out = self
            .engine
            .podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output()
            .map_err(|e| e.to_string());
        let _ = self.child.wait();
        let out = out?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }
}

/// A test that failed half-way still removes its container.
impl Drop for PodmanContainer<'_> {
    fn drop(&mut self) {
        let _ = self.remove_now();
    }
}

impl Container for PodmanContainer<'_> {
    fn host_pid(&self) -> i32 {
        poll("container pid", || {
            let out = self
                .engine
                .podman()
                .args(["inspect", "--format", "{{.State.Pid}}", &self.name])
                .output()
                .ok()?;
            let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
            (pid > 0).then_some(pid)
        })
    }
    fn id(&self) -> String {
        // The full container id, which is the id runc sees.
        poll("container id in the cidfile", || {
            let id = std::fs::read_to_string(self.dir.path().join("cid")).ok()?;
            (id.trim().len() == 64).then(|| id.trim().to_string())
        })
    }
    fn stdout(&mut self) -> &mut BufReader<ChildStdout> {
        &mut self.out
    }
    fn stderr(&self) -> String {
        self.err.text()
    }
    fn remove(mut self: Box<Self>) {
        if let Err(e) = self.remove_now() {
            panic!("podman rm -f {}: {e}", self.name);
        }
    }
}

impl Podman {
    fn run_cdi(&self, sim: &Sim, spec: &Spec<'_>, cdi: Option<&[String]>) -> Output {
        self.run_in(sim, spec, cdi, &|_| {})
    }

    /// `run_cdi` in a rootfs that `prepare` has changed first.
    fn run_in(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        cdi: Option<&[String]>,
        prepare: &dyn Fn(&Path),
    ) -> Output {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        prepare(&dir.path().join("rootfs"));
        let out = self
            .run_command(sim, spec, &dir.path().join("rootfs"), None, cdi, None)
            .output()
            .unwrap();
        // `--rm` removes it; make sure, whatever happened.
        let _ = self
            .podman()
            .args(["rm", "--force", "--time", "0", spec.name])
            .output();
        out
    }

    fn spawn_cdi(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        cdi: Option<&[String]>,
    ) -> Box<dyn Container + '_> {
        self.spawn_in(sim, spec, cdi, None, &|_| {})
    }

    /// A container started with the hook descriptors in `hooks` (another install than this
    /// engine's own, as an upgrade test makes), with the GPU mounts.
    pub fn spawn_with_hooks(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        hooks: &Path,
    ) -> Box<dyn Container + '_> {
        self.spawn_in(sim, spec, None, Some(hooks), &|_| {})
    }

    /// `podman exec NAME ARGS...`: a new process in a running container.
    pub fn exec(&self, name: &str, args: &[&str]) -> Command {
        let mut c = self.podman();
        c.args(["exec", name]).args(args);
        c
    }

    /// The host pids of a running container's processes (`podman top NAME hpid`).
    pub fn host_pids(&self, name: &str) -> Vec<i32> {
        let out = self.podman().args(["top", name, "hpid"]).output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
    }

    /// `spawn_cdi` (or, with `hooks`, `spawn_with_hooks`) in a rootfs that `prepare` has
    /// changed first.
    fn spawn_in(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        cdi: Option<&[String]>,
        hooks: Option<&Path>,
        prepare: &dyn Fn(&Path),
    ) -> Box<dyn Container + '_> {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        prepare(&dir.path().join("rootfs"));
        let (child, out, err) = spawn_piped(self.run_command(
            sim,
            spec,
            &dir.path().join("rootfs"),
            Some(&dir.path().join("cid")),
            cdi,
            hooks,
        ));
        Box::new(PodmanContainer {
            engine: self,
            name: spec.name.to_string(),
            dir,
            child,
            out,
            removed: false,
            err,
        })
    }
}

impl Engine for Podman {
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output {
        self.run_cdi(sim, spec, None)
    }
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_> {
        self.spawn_cdi(sim, spec, None)
    }
}

impl super::preload::Prepared for Podman {
    fn run_prepared(&self, sim: &Sim, spec: &Spec<'_>, prepare: &dyn Fn(&Path)) -> Output {
        self.run_in(sim, spec, None, prepare)
    }
    fn spawn_prepared(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        prepare: &dyn Fn(&Path),
    ) -> Box<dyn Container + '_> {
        self.spawn_in(sim, spec, None, None, prepare)
    }
}

impl super::cdi::CdiEngine for Podman {
    fn spec_dir(&self) -> PathBuf {
        PathBuf::from("/var/run/cdi")
    }
    fn spawn_with(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        claims: &[&super::cdi::Claim],
    ) -> Box<dyn Container + '_> {
        let ids: Vec<String> = claims.iter().map(|c| c.id.clone()).collect();
        self.spawn_cdi(sim, spec, Some(&ids))
    }
    fn run_with(&self, sim: &Sim, spec: &Spec<'_>, ids: &[(String, String)]) -> Output {
        let ids: Vec<String> = ids.iter().map(|(_, id)| id.clone()).collect();
        self.run_cdi(sim, spec, Some(&ids))
    }
    fn spawn_registered(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        ids: &[String],
    ) -> Box<dyn Container + '_> {
        self.spawn_in(
            sim,
            spec,
            Some(ids),
            Some(&self.dir.join("hooks.d")),
            &|_| {},
        )
    }
    fn run_registered(&self, sim: &Sim, spec: &Spec<'_>, ids: &[String]) -> Output {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        let hooks = self.dir.join("hooks.d");
        let out = self
            .run_command(
                sim,
                spec,
                &dir.path().join("rootfs"),
                None,
                Some(ids),
                Some(&hooks),
            )
            .output()
            .unwrap();
        let _ = self
            .podman()
            .args(["rm", "--force", "--time", "0", spec.name])
            .output();
        out
    }
    fn bundle_config(&self, c: &dyn Container) -> serde_json::Value {
        let path = self
            .dir
            .join("root/vfs-containers")
            .join(c.id())
            .join("userdata/config.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }
    fn knows(&self, name: &str) -> bool {
        self.podman()
            .args(["container", "exists", name])
            .status()
            .is_ok_and(|s| s.success())
    }
}
