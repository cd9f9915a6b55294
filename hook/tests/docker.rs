//! The hook with Docker: `cuslice install --engine docker --prefix TMP/prefix --config
//! TMP/daemon.json` registers cuslice-runtime as the runtime `cuslice`, dockerd is started with
//! `--config-file TMP/daemon.json`, and containers choose it with `docker run --runtime=cuslice`.
//! The image is an import of `make_rootfs`'s root filesystem. One dockerd
//! (`cuslice_test_engines::docker`) serves every test of this binary, with its data root, exec
//! root, pidfile, socket and daemon.json under a temporary directory; it is stopped and the
//! directory removed when the test process exits.

use std::ffi::OsString;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output};
use std::sync::OnceLock;

use cuslice_test_engines::*;
use cuslice_test_harness::Sim;

const IMAGE: &str = "cuslice-test:local";

struct Docker {
    dockerd: docker::Dockerd,
}

static ENGINE: OnceLock<Docker> = OnceLock::new();

fn engine() -> &'static Docker {
    ENGINE.get_or_init(|| {
        let dir = state_dir("dockerd");
        let config = dir.join("daemon.json");
        let prefix = dir.join("prefix");
        or_undo(
            || {
                cuslice_install("docker", &prefix, &config);
            },
            || remove_dir(&dir),
        );
        let d = Docker {
            dockerd: docker::Dockerd::start(dir, &config),
        };
        or_undo(
            || output_of(d.docker().arg("import").arg(rootfs_tar()).arg(IMAGE)),
            || d.dockerd.stop(),
        );
        at_exit(stop);
        d
    })
}

/// At exit: removes what containers are left, stops dockerd and removes its directory.
fn stop() {
    if let Some(d) = ENGINE.get() {
        d.dockerd.stop();
    }
}

impl Docker {
    fn docker(&self) -> Command {
        self.dockerd.docker()
    }

    /// `docker run ... IMAGE CMD...`; `cidfile`: where docker writes the container's id.
    fn run_command(&self, sim: &Sim, spec: &Spec<'_>, cidfile: Option<&Path>) -> Command {
        let mut a: Vec<OsString> = vec!["run".into(), "--name".into(), spec.name.into()];
        match cidfile {
            Some(f) => {
                a.push("--cidfile".into());
                a.push(f.into());
            }
            None => a.push("--rm".into()),
        }
        a.push("--runtime=cuslice".into());
        a.push("--network=none".into());
        if spec.read_only {
            a.push("--read-only".into());
        }
        for e in all_env(spec) {
            a.push("-e".into());
            a.push(e.into());
        }
        for (src, dst, rw) in gpu_mounts(sim) {
            a.push("--mount".into());
            a.push(
                format!(
                    "type=bind,source={},target={dst}{}",
                    src.display(),
                    if rw { "" } else { ",readonly" }
                )
                .into(),
            );
        }
        a.push(IMAGE.into());
        a.extend(spec.cmd.iter().map(OsString::from));
        let mut c = self.docker();
        c.args(a);
        c
    }
}

struct DockerContainer<'a> {
    engine: &'a Docker,
    name: String,
    cidfile: tempfile::TempDir,
    child: Child,
    out: BufReader<ChildStdout>,
    removed: bool,
    err: Stderr,
}

impl DockerContainer<'_> {
    fn cidfile(&self) -> PathBuf {
        self.cidfile.path().join("cid")
    }

    /// `docker rm -f`: dockerd kills the container, deletes its task (runc delete: poststop
    /// runs) and only then calls it stopped and removes it.
    fn remove_now(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.removed, true) {
            return Ok(());
        }
        let out = self
            .engine
            .docker()
            .args(["rm", "-f", &self.name])
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
impl Drop for DockerContainer<'_> {
    fn drop(&mut self) {
        let _ = self.remove_now();
    }
}

impl Container for DockerContainer<'_> {
    fn host_pid(&self) -> i32 {
        poll("container pid", || {
            let out = self
                .engine
                .docker()
                .args(["inspect", "-f", "{{.State.Pid}}", &self.name])
                .output()
                .ok()?;
            let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
            (pid > 0).then_some(pid)
        })
    }
    fn id(&self) -> String {
        // The full container id, which is the id runc sees.
        poll("container id in the cidfile", || {
            let id = std::fs::read_to_string(self.cidfile()).ok()?;
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
            panic!("docker rm -f {}: {e}", self.name);
        }
    }
}

impl Engine for Docker {
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output {
        let out = self.run_command(sim, spec, None).output().unwrap();
        // `--rm` removes it; make sure, whatever happened.
        let _ = self.docker().args(["rm", "-f", spec.name]).output();
        out
    }
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_> {
        let cidfile = tempfile::tempdir().unwrap();
        let (child, out, err) =
            spawn_piped(self.run_command(sim, spec, Some(&cidfile.path().join("cid"))));
        Box::new(DockerContainer {
            engine: self,
            name: spec.name.to_string(),
            cidfile,
            child,
            out,
            removed: false,
            err,
        })
    }
}

engine_scenarios!(engine());
