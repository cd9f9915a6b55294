//! `cuslice agent`: the one long-running cuslice process on a node (docs/agent.md).
//!
//! - `hostpid`: a unix socket in `<state root>/agent/`, which the hook mounts into every slice's
//!   container. A process that connects is told its host pid, as the kernel gives it
//!   (SO_PEERCRED, seen from the agent's pid namespace): no race and no guess from NVML.
//! - the exporter (`/metrics`), served from the agent when `--listen` is given.
//! - `verify`: every period, the driver's own per-process memory and utilisation (NVML), mapped
//!   to slices and compared with each slice's cap and limit from the hook's records, not from
//!   the slice's ledger (which tenants can write); `judge` is the pure part, `cgroup` finds and
//!   freezes a container's cgroup. Under `--enforce stop` it kills and freezes.

pub mod cgroup;
pub mod hostpid;
pub mod judge;
pub mod verify;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

/// What the agent does about a slice over its cap or limit by the driver's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforce {
    /// A log line, a status line and a metric.
    Report,
    /// Also: kill the processes of a slice over its memory cap for the grace in total within
    /// a window, and freeze the cgroup of a slice over its core limit while it owes device
    /// time (killing the processes that ran on the device once it owes more than freezing
    /// holds, or at once when the driver's samples that name it put it far over its limit and
    /// nothing else bounds its use).
    Stop,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The OCI hook's state root (`/run/cuslice`); the socket is `<root>/agent/agent.sock`.
    pub state_root: PathBuf,
    /// Standalone slices' state directories to watch too.
    pub state_dirs: Vec<PathBuf>,
    /// Serve /metrics here.
    pub listen: Option<std::net::SocketAddr>,
    /// How often slices are checked against the driver.
    pub period: Duration,
    pub enforce: Enforce,
    /// How long a slice may be over its memory cap, in total within a window of ten times
    /// this (`judge::over_window_s`), before `stop` kills.
    pub grace: Duration,
}

/// The socket's directory under the state root (the hook mounts it into containers).
pub fn socket_dir(state_root: &std::path::Path) -> PathBuf {
    cuslice_state::host::Root::new(state_root).agent()
}

/// Runs until SIGTERM or SIGINT. Err: one line saying why the agent cannot run.
pub fn run(cfg: Config) -> Result<(), String> {
    use nix::sys::signal::{SigSet, Signal};
    // The signals are taken by a thread of ours (sigwait), so every thread blocks them first:
    // the mask is set before any thread is started, and threads inherit it.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| format!("cannot block SIGTERM and SIGINT: {e}"))?;
    let server = hostpid::Server::bind(&socket_dir(&cfg.state_root))?;
    // Removed when the agent stops, so that no stale socket tells containers and `cuslice
    // status` there is an agent ("Connection refused") when there is none.
    let socket = server.path().to_path_buf();
    let socket_id = std::fs::symlink_metadata(&socket)
        .map(|m| (m.dev(), m.ino()))
        .ok();
    let exporter = cfg
        .listen
        .map(cuslice_node::exporter::Exporter::bind)
        .transpose()?;
    let mut verifier = verify::Verifier::new(&cfg);
    let stopper = verifier.stopper();
    std::thread::Builder::new()
        .name("cuslice-signals".into())
        .spawn(move || {
            let signal = signals.wait();
            // Thaws every cgroup the agent froze before it goes.
            stopper.stop();
            // Its own socket only: another agent's, bound after this one's was taken away,
            // stays.
            if std::fs::symlink_metadata(&socket)
                .is_ok_and(|m| Some((m.dev(), m.ino())) == socket_id)
            {
                let _ = std::fs::remove_file(&socket);
            }
            eprintln!(
                "cuslice agent: {}: stopped; nothing left frozen",
                signal.map_or("signal", |s| s.as_str())
            );
            std::process::exit(0);
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    // Tests and scripts wait for these lines to know the agent is up.
    println!("cuslice agent: listening on {}", server.path().display());
    std::thread::Builder::new()
        .name("hostpid".into())
        .spawn(move || server.serve())
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    if let Some(exporter) = exporter {
        println!("{}", exporter.banner());
        let sources = cuslice_node::collect::Sources {
            state_root: cfg.state_root.clone(),
            state_dirs: cfg.state_dirs.clone(),
        };
        std::thread::Builder::new()
            .name("exporter".into())
            .spawn(move || exporter.serve(sources))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
    }
    eprintln!(
        "cuslice agent: checking slices under {} every {:.1} s (--enforce {})",
        cfg.state_root.display(),
        cfg.period.as_secs_f64(),
        match cfg.enforce {
            Enforce::Report => "report",
            Enforce::Stop => "stop",
        }
    );
    let mut said: Vec<String> = Vec::new();
    loop {
        let began = std::time::Instant::now();
        // Processes that started before the agent, or could not reach its socket, are told
        // their host pids here (the way `cuslice status` does), when the last check saw one.
        if verifier.untold() {
            let problems = cuslice_node::collect::tell_host_pids(&cfg.state_root);
            for p in problems.iter().filter(|p| !said.contains(p)) {
                eprintln!("cuslice agent: {p}");
            }
            said = problems;
        }
        verifier.tick();
        std::thread::sleep(cfg.period.saturating_sub(began.elapsed()));
    }
}
