//! `cuslice-hook STAGE [--library PATH] [--state-root DIR] [--node-dir DIR] [--container-index
//! DIR]`: the OCI hook. The container state comes on stdin; the spec is read from the bundle. A
//! bad setting exits 1 with one line on stderr, which the engine shows to whoever started the
//! container.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use cuslice_hook::hook::{self, DEFAULT_NODE_DIR, Options, Outcome};
use cuslice_hook::slurm;
use cuslice_state::host::DEFAULT_ROOT;

#[derive(Clone, Copy, ValueEnum)]
enum Stage {
    /// At container creation (runc runs it where it runs createRuntime).
    #[value(name = "prestart")]
    Prestart,
    /// At container creation, after the namespaces exist and before pivot_root.
    #[value(name = "createRuntime")]
    CreateRuntime,
    /// After the container is deleted: removes its slice state.
    #[value(name = "poststop")]
    Poststop,
    /// Not an OCI stage: removes the state of containers that are gone (no stdin).
    #[value(name = "sweep")]
    Sweep,
    /// Not an OCI stage: cuslice's SPANK plugin, in a Slurm task's own mount namespace, before
    /// the task execs (--job, --pid; no stdin).
    #[value(name = "slurm-task")]
    SlurmTask,
    /// Not an OCI stage: cuslice's SPANK plugin, at a Slurm job's epilog (--job; no stdin).
    #[value(name = "slurm-epilog")]
    SlurmEpilog,
}

/// cuslice's OCI hook: holds a container to its CUSLICE_* limits.
#[derive(Parser)]
#[command(name = "cuslice-hook", version)]
struct Cli {
    stage: Stage,
    /// The interposer to mount [default: libcuslice.so beside this executable, then
    /// ../lib/cuslice/libcuslice.so from it, then /usr/local/lib/cuslice/libcuslice.so]
    #[arg(long)]
    library: Option<PathBuf>,
    /// Where the containers' slice state lives on the host.
    #[arg(long, default_value = DEFAULT_ROOT)]
    state_root: PathBuf,
    /// The node's compute board (the interposer's CUSLICE_NODE_DIR on the host).
    #[arg(long, default_value = DEFAULT_NODE_DIR)]
    node_dir: PathBuf,
    /// The DRA plugin's container index, read for the name of the claim a pod's container
    /// uses (a label for the node tools).
    #[arg(long, default_value = cuslice_cdi::DEFAULT_CONTAINER_INDEX)]
    container_index: PathBuf,
    /// slurm-task, slurm-epilog: the Slurm job.
    #[arg(long)]
    job: Option<u32>,
    /// slurm-task: the task's process, in the mount namespace to mount the job's slice into.
    #[arg(long)]
    pid: Option<i32>,
    /// slurm-task: a process in the node's mount namespace (slurmstepd), where the slice is
    /// made [default: the hook's own namespace].
    #[arg(long)]
    host_pid: Option<i32>,
    /// slurm-task: the node's name to Slurm [default: the host name up to its first dot].
    #[arg(long)]
    node: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = Options {
        state_root: cli.state_root,
        node_dir: cli.node_dir,
        library: cli.library,
        container_index: cli.container_index,
    };
    let mut state = String::new();
    if matches!(
        cli.stage,
        Stage::Prestart | Stage::CreateRuntime | Stage::Poststop
    ) && let Err(e) = std::io::stdin().read_to_string(&mut state)
    {
        eprintln!("cuslice-hook: cannot read the container state on stdin: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.stage {
        Stage::Prestart | Stage::CreateRuntime => {
            hook::create(&opts, &state).map_err(|e| format!("{e}; the container is not started"))
        }
        Stage::Poststop => hook::poststop(&opts, &state),
        Stage::Sweep => hook::sweep(&opts),
        Stage::SlurmTask => match (cli.job, cli.pid) {
            (Some(job), Some(pid)) => slurm::enter_host(cli.host_pid)
                .and_then(|()| slurm::task(&opts, job, pid, cli.node.as_deref()))
                .map_err(|e| format!("job {job}: {e}; the task is not started")),
            _ => Err("slurm-task needs --job ID and --pid PID".to_string()),
        },
        Stage::SlurmEpilog => match cli.job {
            Some(job) => slurm::epilog(&opts, job).map_err(|e| format!("job {job}: {e}")),
            None => Err("slurm-epilog needs --job ID".to_string()),
        },
    };
    match result {
        Ok(Outcome::Swept(ids)) => {
            for id in ids {
                println!("removed the state of {id}");
            }
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuslice-hook: {e}");
            ExitCode::FAILURE
        }
    }
}
