//! A one-node Slurm cluster started by the tests: Debian's munged, slurmctld and slurmd, each
//! in the foreground in a directory of its own under one temporary directory, with cuslice's
//! SPANK plugin in `plugstack.conf` (the build's `libcuslice_spank.so` running the build's
//! `cuslice-hook` with a state root and compute board of the cluster's own). The node's two GPUs
//! are simgpu's devices 0 and 1 behind stand-in device files, as Slurm's own test suite fakes
//! GPUs with `/dev/tty[0-1]`: their minor numbers, 0 and 1, are the devices' to NVML. slurmd
//! runs with simgpu's libraries on its library path (what the driver's installation gives a
//! real node), so the hook finds each GPU's memory through NVML. Jobs are submitted by
//! `nobody`, so that they hold no privilege a tenant would not.
//!
//! Every daemon is stopped, and the directory removed, when the test process exits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cuslice_test_harness::{Sim, bin_dir, simgpu};

use crate::daemon::{Daemon, at_exit, remove_dir, state_dir, tool};

pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    pub node: String,
    pub sim: Sim,
    /// simgpu's libcuda.so.1 and libnvidia-ml.so.1.
    pub libs: PathBuf,
    pub state_root: PathBuf,
    pub node_dir: PathBuf,
    daemons: Vec<Daemon>,
}

/// Each device's memory.
pub const GPU_MEMORY: u64 = 8 << 30;
/// Shards per GPU (gres.conf).
pub const SHARDS: u32 = 100;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster, started by the first test that asks.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let c = Cluster::start();
        at_exit(|| {
            if let Some(c) = CLUSTER.get() {
                c.stop();
            }
        });
        c
    })
}

fn short_hostname() -> String {
    let out = Command::new("hostname").arg("-s").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Cluster {
    fn start() -> Cluster {
        let munged = tool("munged", "munge");
        let slurmctld = tool("slurmctld", "slurmctld");
        let slurmd = tool("slurmd", "slurmd");
        tool("srun", "slurm-client");
        let plugin = bin_dir().join("libcuslice_spank.so");
        assert!(
            plugin.is_file(),
            "{} is missing: cargo build --release --workspace",
            plugin.display()
        );
        let dir = state_dir("slurm");
        // Jobs run as nobody: the state and the programs must be reachable by it.
        chmod(&dir, 0o755);
        let sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
        chmod(sim.dir.path(), 0o755);
        chmod(&sim.state, 0o666);
        chmod(&sim.memory_file(), 0o666);
        let libs = dir.join("simgpu-lib");
        let out = Command::new(simgpu())
            .args(["lib-dir", "--out"])
            .arg(&libs)
            .output()
            .unwrap();
        assert!(out.status.success(), "simgpu lib-dir: {out:?}");
        chmod(&libs, 0o755);
        for e in std::fs::read_dir(&libs).unwrap().flatten() {
            chmod(&e.path(), 0o755);
        }
        let node = short_hostname();
        for sub in ["etc", "munge", "ctld", "d", "state", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // Ports of this test process's own, so that a cluster left by another never answers.
        let port = 20000 + (std::process::id() % 20000) as u16;
        let socket = dir.join("munge/munge.socket");
        let key = dir.join("munge/munge.key");
        std::fs::write(
            &key,
            (0..1024).map(|i| (i * 7 + 13) as u8).collect::<Vec<u8>>(),
        )
        .unwrap();
        chmod(&key, 0o400);
        // munged runs as the munge user, as Debian runs it: run as root, it authorises no
        // decoding client but root.
        let munge = nix::unistd::User::from_name("munge")
            .ok()
            .flatten()
            .expect("the munge user (apt-get install munge) is missing");
        for p in [dir.join("munge"), key.clone()] {
            nix::unistd::chown(&p, Some(munge.uid), Some(munge.gid)).unwrap();
        }
        let state_root = dir.join("cuslice");
        let node_dir = dir.join("board");
        let conf = dir.join("etc/slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=cuslice\n\
                 SlurmctldHost={node}\n\
                 SlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nCredType=cred/munge\n\
                 AuthInfo=socket={socket}\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/ctld/pid\nSlurmdPidFile={d}/d/pid\n\
                 SlurmctldPort={port}\nSlurmdPort={}\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
                 GresTypes=gpu,shard\nMpiDefault=none\nReturnToService=2\n\
                 SchedulerParameters=sched_interval=1\n\
                 PlugStackConfig={d}/etc/plugstack.conf\n\
                 NodeName={node} CPUs=2 Gres=gpu:2,shard:{} State=UNKNOWN\n\
                 PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                port + 1,
                2 * SHARDS,
                socket = socket.display(),
                d = dir.display(),
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("etc/gres.conf"),
            format!(
                "Name=gpu File=/dev/tty[0-1]\n\
                 Name=shard Count={SHARDS} File=/dev/tty0\n\
                 Name=shard Count={SHARDS} File=/dev/tty1\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("etc/plugstack.conf"),
            format!(
                "required {} hook={} state_root={} node_dir={}\n",
                plugin.display(),
                bin_dir().join("cuslice-hook").display(),
                state_root.display(),
                node_dir.display()
            ),
        )
        .unwrap();
        let mut daemons = Vec::new();
        let mut m = Command::new(&munged);
        {
            use std::os::unix::process::CommandExt;
            m.uid(munge.uid.as_raw()).gid(munge.gid.as_raw());
        }
        m.args(["-F", "--num-threads", "2"])
            .arg("--socket")
            .arg(&socket)
            .arg("--key-file")
            .arg(&key)
            .arg("--pid-file")
            .arg(dir.join("munge/pid"))
            .arg("--seed-file")
            .arg(dir.join("munge/seed"))
            .arg("--log-file")
            .arg(dir.join("munge/log"));
        let s = socket.clone();
        daemons.push(Daemon::start("munged", dir.join("munge"), m, move || {
            s.exists()
        }));
        let mut c = Command::new(&slurmctld);
        c.args(["-D", "-i", "-f"])
            .arg(&conf)
            .env("SLURM_CONF", &conf);
        daemons.push(Daemon::start("slurmctld", dir.join("ctld"), c, || true));
        let mut d = Command::new(&slurmd);
        d.args(["-D", "-f"])
            .arg(&conf)
            .args(["-N", &node])
            .env("SLURM_CONF", &conf)
            .env("SIMGPU_STATE", &sim.state)
            .env("LD_LIBRARY_PATH", &libs);
        let cluster_conf = conf.clone();
        daemons.push(Daemon::start("slurmd", dir.join("d"), d, move || {
            Command::new("sinfo")
                .args(["-h", "-o", "%T"])
                .env("SLURM_CONF", &cluster_conf)
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        }));
        Cluster {
            dir,
            conf,
            node,
            sim,
            libs,
            state_root,
            node_dir,
            daemons,
        }
    }

    fn stop(&self) {
        // Whatever still runs, then the daemons, node first.
        let _ = self.command("scancel").args(["--user", "nobody"]).output();
        std::thread::sleep(std::time::Duration::from_secs(1));
        // Clients of a test that failed half-way (an `sbatch --wait` would wait on for a
        // controller that is gone): the tests' own, run as nobody.
        for client in ["sbatch", "srun"] {
            let _ = Command::new("pkill")
                .args(["-KILL", "-u", "nobody", "-x", client])
                .status();
        }
        for d in self.daemons.iter().rev() {
            d.stop();
        }
        remove_dir(&self.dir);
    }

    /// A Slurm client command aimed at this cluster, run as nobody, with the environment a job
    /// needs for the simulated GPUs (a real node's driver needs none), which `--export=ALL`
    /// passes on.
    pub fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(program);
        c.uid(65534)
            .gid(65534)
            .current_dir("/")
            .env("SLURM_CONF", &self.conf)
            .env("SIMGPU_STATE", &self.sim.state)
            .env("LD_LIBRARY_PATH", &self.libs);
        c
    }

    /// `srun` as nobody, with ARGS before `--`, running the workload with WORKLOAD.
    pub fn srun(&self, args: &[&str], workload: &[&str]) -> Command {
        let mut c = self.command("srun");
        c.args(["-n1", "--quiet"])
            .arg("--export=ALL")
            .args(args)
            .arg(cuslice_test_harness::workload())
            .args(workload);
        c
    }

    /// The slurmd log, for a failing test's message.
    pub fn slurmd_log(&self) -> String {
        self.daemons.last().map(|d| d.log()).unwrap_or_default()
    }

    /// The slices under the cluster's state root.
    pub fn slices(&self) -> Vec<String> {
        std::fs::read_dir(self.state_root.join("containers"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
