//! dockerd started by the tests: its data root, exec root (and the containerd it starts there),
//! pidfile, socket and daemon.json under a directory of its own, no networking. Used by the
//! hook's Docker test and by `cuslice doctor`'s. Always /usr/bin/docker: a different client may
//! come first on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::*;

pub struct Dockerd {
    daemon: Daemon,
    docker: PathBuf,
    /// What dockerd makes outside its directories, if it was not there before.
    made: Vec<PathBuf>,
}

impl Dockerd {
    /// Starts dockerd with its state in `dir` (from [`state_dir`]) and `config` as its
    /// daemon.json (`--config-file`; it must exist), once it answers. On failure `dir` is
    /// removed.
    pub fn start(dir: PathBuf, config: &Path) -> Dockerd {
        let dockerd = tool("dockerd", "docker.io");
        let docker = tool("/usr/bin/docker", "docker.io");
        tool("containerd", "containerd");
        tool("runc", "runc");
        // dockerd 20.10 writes its trust key to /etc/docker/key.json whatever its options; the
        // containerd it starts makes /opt/containerd; the shims keep their sockets under
        // /run/containerd/s.
        let made = new_paths(&[
            "/etc/docker",
            "/etc/docker/key.json",
            "/opt/containerd",
            "/opt/containerd/bin",
            "/opt/containerd/lib",
            "/run/containerd",
            "/run/containerd/s",
        ]);
        let sock = format!("unix://{}", dir.join("docker.sock").display());
        let mut cmd = Command::new(dockerd);
        cmd.arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .args(["-H", &sock])
            .arg("--config-file")
            .arg(config)
            // No networking: the containers run with --network=none, and the host's firewall and
            // sysctls stay as they are. The storage driver is dockerd's choice: overlay2 where
            // the directory's filesystem takes it, else (on overlayfs, say) the next that works,
            // down to vfs.
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--ip-forward=false",
            ])
            .args(["--ip-masq=false", "--bridge=none"]);
        let probe = docker.clone();
        let probe_sock = sock.clone();
        let ready = move || {
            Command::new(&probe)
                .args(["-H", &probe_sock, "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let daemon = or_undo(
            || Daemon::start("dockerd", dir, cmd, ready),
            || remove_new(&made),
        );
        Dockerd {
            daemon,
            docker,
            made,
        }
    }

    /// Where it listens, as `DOCKER_HOST` names it.
    pub fn host(&self) -> String {
        format!("unix://{}", self.daemon.dir.join("docker.sock").display())
    }

    /// `docker -H HOST` with no input.
    pub fn docker(&self) -> Command {
        let mut c = Command::new(&self.docker);
        c.arg("-H").arg(self.host()).stdin(Stdio::null());
        c
    }

    /// SIGHUP: dockerd reads daemon.json's runtimes again (and forgets none).
    pub fn reload(&self) {
        let pid: i32 = std::fs::read_to_string(self.daemon.dir.join("docker.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    }

    /// Removes what containers are left, stops dockerd (it stops its containerd) and removes its
    /// directory. Idempotent.
    pub fn stop(&self) {
        if let Ok(out) = self.docker().args(["ps", "-aq", "--no-trunc"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = self.docker().args(["rm", "-f", id]).output();
            }
        }
        self.daemon.stop();
        remove_new(&self.made);
    }
}
