//! The hook with containerd, through `ctr`. ctr does not read the CRI plugin's runtime entries,
//! so each container names the wrapper runtime itself: `ctr run --runc-binary
//! target/release/cuslice-runtime` (cuslice-hook and libcuslice.so lie beside it, where the
//! wrapper and the hook look first). The containers' root filesystems are directories
//! (`ctr run --rootfs`), one fresh per container; `ctr run --read-only` makes one read-only. One containerd serves every test of this
//! binary, with its own root, state, socket and runc root under a temporary directory; it is
//! stopped and the directory removed when the test process exits.
//!
//! CDI (`cdi_*` tests): containerd 1.6 has no CDI, so containers carry the kubelet's
//! annotations (`ctr run --annotation cdi.k8s.io/gpu.cuslice.io_<claim uid>=<device id>`) and
//! cuslice-runtime applies the devices: it runs as the runc binary through a two-line script
//! that adds `--cuslice-cdi-spec-dir=DIR`, the test's spec directory.

use std::ffi::OsString;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;

use super::*;
use cuslice_test_harness::{Sim, bin_dir};

/// Every container of these tests lives in this containerd namespace.
const NAMESPACE: &str = "cuslice-test";

pub struct Containerd {
    daemon: Daemon,
    ctr: PathBuf,
    /// What the shims make outside the state directory, if it was not there before.
    made: Vec<PathBuf>,
}

static ENGINE: OnceLock<Containerd> = OnceLock::new();

pub fn engine() -> &'static Containerd {
    ENGINE.get_or_init(|| {
        let dir = state_dir("containerd");
        std::fs::write(dir.join("config.toml"), base_config(&dir, false)).unwrap();
        let c = Containerd::start(dir);
        at_exit(stop);
        c
    })
}

/// The configuration of a containerd of the tests' own in `dir`: nothing outside `dir` but what
/// the shim keeps under /run/containerd/s while a task runs. `cri`: with the CRI plugin, which
/// holds the runtime handlers (`config dump` leaves a disabled plugin's settings out); without
/// it (ctr does not use it) containerd starts faster.
pub fn base_config(dir: &Path, cri: bool) -> String {
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
{disabled}
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
        d = dir.display(),
        disabled = if cri {
            ""
        } else {
            r#"disabled_plugins = ["io.containerd.grpc.v1.cri"]"#
        }
    )
}

/// At exit: see [`Containerd::stop`].
fn stop() {
    if let Some(e) = ENGINE.get() {
        e.stop();
    }
}

impl Containerd {
    /// Starts containerd with `dir/config.toml`, which holds at least [`base_config`] (`dir`
    /// from [`state_dir`]), once it answers. On failure `dir` is removed.
    pub fn start(dir: PathBuf) -> Containerd {
        let ctr = tool("ctr", "containerd");
        let containerd = tool("containerd", "containerd");
        tool("containerd-shim-runc-v2", "containerd");
        tool("runc", "runc");
        let made = new_paths(&["/run/containerd", "/run/containerd/s"]);
        let mut cmd = Command::new(containerd);
        cmd.arg("--config").arg(dir.join("config.toml"));
        let sock = dir.join("containerd.sock");
        let probe = ctr.clone();
        let ready = move || {
            Command::new(&probe)
                .arg("--address")
                .arg(&sock)
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let daemon = or_undo(
            || Daemon::start("containerd", dir, cmd, ready),
            || remove_new(&made),
        );
        Containerd { daemon, ctr, made }
    }

    /// Its socket, as `CONTAINERD_ADDRESS` names it.
    pub fn address(&self) -> PathBuf {
        self.daemon.dir.join("containerd.sock")
    }

    /// Kills and deletes what is left in the tests' namespace (a shim outlives containerd while
    /// its task exists), then stops containerd and removes its directory. Idempotent.
    pub fn stop(&self) {
        let list = |what: &str| -> Vec<String> {
            self.ctr()
                .args([what, "ls", "-q"])
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        for t in list("task") {
            let _ = self
                .ctr()
                .args(["task", "kill", "-s", "SIGKILL", &t])
                .output();
            let _ = self.ctr().args(["task", "rm", "-f", &t]).output();
        }
        for c in list("container") {
            let _ = self.ctr().args(["container", "rm", &c]).output();
        }
        self.daemon.stop();
        remove_new(&self.made);
    }
}

impl Containerd {
    /// ctr for this containerd, in ctr's own default namespace (`default`), where a user's
    /// `ctr run` puts containers.
    pub fn ctr_default_namespace(&self) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address").arg(self.address()).stdin(Stdio::null());
        c
    }

    fn ctr(&self) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address")
            .arg(self.daemon.dir.join("containerd.sock"))
            .args(["--namespace", NAMESPACE])
            .stdin(Stdio::null());
        c
    }

    /// The DRA plugin's container index the CDI runtime reads.
    pub fn container_index(&self) -> PathBuf {
        self.daemon.dir.join("container-index")
    }

    /// The CDI tests' spec directory, and the runc binary that reads it: a script that runs
    /// cuslice-runtime with `--cuslice-cdi-spec-dir`, and with its own hook at another path
    /// than the specs' (a link to it), as on a node where the plugin's `--hook` and the
    /// runtime's differ: the runtime must still not add a second hook.
    fn cdi_runtime(&self) -> (PathBuf, PathBuf) {
        let dir = self.daemon.dir.join("cdi");
        let script = self.daemon.dir.join("cuslice-runtime-cdi");
        if !script.exists() {
            let own = self.daemon.dir.join("runtime-hook");
            std::fs::create_dir_all(&own).unwrap();
            let _ = std::os::unix::fs::symlink(
                bin_dir().join("cuslice-hook"),
                own.join("cuslice-hook"),
            );
            let text = format!(
                "#!/bin/sh\nexec '{}' '--cuslice-cdi-spec-dir={}' '--cuslice-hook={}' '--cuslice-container-index={}' \"$@\"\n",
                bin_dir().join("cuslice-runtime").display(),
                dir.display(),
                own.join("cuslice-hook").display(),
                self.container_index().display(),
            );
            // Tests run in parallel: each writes its own temporary file, renamed over the script.
            let tmp = script.with_extension(format!("{:?}.tmp", std::thread::current().id()));
            std::fs::write(&tmp, text).unwrap();
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            std::fs::rename(&tmp, &script).unwrap();
        }
        (dir, script)
    }

    /// `ctr run [--rm] ... ROOTFS ID CMD...`; `cdi`: the annotations naming CDI devices (then
    /// the runtime reads the test's spec directory, and the engine mounts only the simulator's
    /// state: the specs bring the rest).
    fn run_command(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        rootfs: &Path,
        rm: bool,
        cdi: Option<&[(String, String)]>,
    ) -> Command {
        let mut a: Vec<OsString> = vec!["run".into()];
        if rm {
            a.push("--rm".into());
        }
        a.push("--rootfs".into());
        a.push("--runc-binary".into());
        let mounts = match cdi {
            None => {
                a.push(bin_dir().join("cuslice-runtime").into());
                gpu_mounts(sim)
            }
            Some(annotations) => {
                a.push(self.cdi_runtime().1.into());
                for (key, id) in annotations {
                    a.push("--annotation".into());
                    a.push(format!("{key}={id}").into());
                }
                sim_state_mount(sim)
            }
        };
        a.push("--runc-root".into());
        a.push(self.daemon.dir.join("runc").into());
        a.push("--fifo-dir".into());
        a.push(self.daemon.dir.join("fifo").into());
        if spec.read_only {
            a.push("--read-only".into());
        }
        for e in all_env(spec) {
            a.push("--env".into());
            a.push(e.into());
        }
        for (src, dst, rw) in mounts {
            a.push("--mount".into());
            a.push(
                format!(
                    "type=bind,src={},dst={dst},options=rbind:{}",
                    src.display(),
                    if rw { "rw" } else { "ro" }
                )
                .into(),
            );
        }
        a.push(rootfs.into());
        a.push(spec.name.into());
        a.extend(spec.cmd.iter().map(OsString::from));
        let mut c = self.ctr();
        c.args(a);
        c
    }

    /// The host pid of a running task's init (`ctr task ls`: TASK PID STATUS).
    fn task_pid(&self, id: &str) -> Option<i32> {
        let out = self.ctr().args(["task", "ls"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [task, pid, "RUNNING"] if task == id => pid.parse().ok().filter(|&p| p > 0),
                _ => None,
            }
        })
    }
}

struct CtrContainer<'a> {
    engine: &'a Containerd,
    id: String,
    child: Child,
    out: BufReader<ChildStdout>,
    removed: bool,
    _rootfs: tempfile::TempDir,
    err: Stderr,
}

impl CtrContainer<'_> {
    /// Kill the task; `ctr run` then deletes it (runc delete: poststop runs) and exits; then the
    /// container goes.
    fn remove_now(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.removed, true) {
            return Ok(());
        }
        let e = self.engine;
        let _ = e
            .ctr()
            .args(["task", "kill", "-s", "SIGKILL", &self.id])
            .output();
        let _ = self.child.wait();
        // Already gone unless `ctr run` died before deleting it.
        let _ = e.ctr().args(["task", "rm", "-f", &self.id]).output();
        let out = e
            .ctr()
            .args(["container", "rm", &self.id])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }
}

/// A test that failed half-way still removes its container.
impl Drop for CtrContainer<'_> {
    fn drop(&mut self) {
        let _ = self.remove_now();
    }
}

impl Container for CtrContainer<'_> {
    fn host_pid(&self) -> i32 {
        poll("running task", || self.engine.task_pid(&self.id))
    }
    fn id(&self) -> String {
        // ctr's container id is the id runc sees.
        self.id.clone()
    }
    fn stdout(&mut self) -> &mut BufReader<ChildStdout> {
        &mut self.out
    }
    fn stderr(&self) -> String {
        self.err.text()
    }
    fn remove(mut self: Box<Self>) {
        if let Err(e) = self.remove_now() {
            panic!("ctr container rm {}: {e}", self.id);
        }
    }
}

/// CDI device ids as the annotations a user gives `ctr run` for cuslice-runtime to apply
/// (`cdi.k8s.io/<name>=<id>`, as containerd 1.7 and the kubelet write them).
fn annotations(ids: &[String]) -> Vec<(String, String)> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| (format!("cdi.k8s.io/device-{i}"), id.clone()))
        .collect()
}

fn fresh_rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    make_rootfs(dir.path());
    dir
}

impl Containerd {
    fn run_cdi(&self, sim: &Sim, spec: &Spec<'_>, cdi: Option<&[(String, String)]>) -> Output {
        let rootfs = fresh_rootfs();
        let out = self
            .run_command(sim, spec, rootfs.path(), true, cdi)
            .output()
            .unwrap();
        // `--rm` removes the container unless it never started a task; make sure.
        let _ = self.ctr().args(["container", "rm", spec.name]).output();
        out
    }

    fn spawn_cdi(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        cdi: Option<&[(String, String)]>,
    ) -> Box<dyn Container + '_> {
        let rootfs = fresh_rootfs();
        let (child, out, err) = spawn_piped(self.run_command(sim, spec, rootfs.path(), false, cdi));
        Box::new(CtrContainer {
            engine: self,
            id: spec.name.to_string(),
            child,
            out,
            removed: false,
            err,
            _rootfs: rootfs,
        })
    }
}

impl Engine for Containerd {
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output {
        self.run_cdi(sim, spec, None)
    }
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_> {
        self.spawn_cdi(sim, spec, None)
    }
}

impl super::cdi::CdiEngine for Containerd {
    fn spec_dir(&self) -> PathBuf {
        self.cdi_runtime().0
    }
    fn spawn_with(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        claims: &[&super::cdi::Claim],
    ) -> Box<dyn Container + '_> {
        let annotations: Vec<(String, String)> = claims.iter().map(|c| c.annotation()).collect();
        self.spawn_cdi(sim, spec, Some(&annotations))
    }
    fn run_with(&self, sim: &Sim, spec: &Spec<'_>, ids: &[(String, String)]) -> Output {
        self.run_cdi(sim, spec, Some(ids))
    }
    fn spawn_registered(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        ids: &[String],
    ) -> Box<dyn Container + '_> {
        self.spawn_cdi(sim, spec, Some(&annotations(ids)))
    }
    fn run_registered(&self, sim: &Sim, spec: &Spec<'_>, ids: &[String]) -> Output {
        self.run_cdi(sim, spec, Some(&annotations(ids)))
    }
    fn bundle_config(&self, c: &dyn Container) -> serde_json::Value {
        // The bundle the shim made for the task, with the config.json the runtime rewrote.
        let path = self
            .daemon
            .dir
            .join("state/io.containerd.runtime.v2.task")
            .join(NAMESPACE)
            .join(c.id())
            .join("config.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }
    fn knows(&self, name: &str) -> bool {
        let out = self.ctr().args(["container", "ls", "-q"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == name)
    }
}
