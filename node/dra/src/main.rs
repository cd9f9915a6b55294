//! `cuslice-dra-plugin`: see the crate documentation (src/lib.rs) and docs/kubernetes.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cuslice_dra::{Options, discover::Roots, run};

/// The Kubernetes DRA kubelet plugin for gpu.cuslice.io: GPU fractions (memory and cores) as
/// consumable capacity, prepared as CDI devices that carry cuslice's caps.
#[derive(Parser)]
#[command(name = "cuslice-dra-plugin", version)]
struct Cli {
    /// This node's name (the ResourceSlice's node and pool)
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The plugin's own directory: dra.sock and checkpoint.json
    #[arg(long, default_value = cuslice_cdi::DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// The kubelet's plugin registration directory
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// Where the CDI spec of each prepared claim is written
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Where the NVIDIA driver is installed on the host (/run/nvidia/driver with NVIDIA's GPU
    /// operator)
    #[arg(long, default_value = "/")]
    driver_root: PathBuf,
    /// Where this plugin sees the host's / (the host's / mounted in its container)
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// cuslice-hook, as a path on the host
    #[arg(long, default_value = "/usr/local/bin/cuslice-hook")]
    hook: String,
    /// libcuslice.so, as a path on the host
    #[arg(long, default_value = cuslice_state::paths::INSTALLED_LIBRARY)]
    library: String,
    /// The API server's kubeconfig (default: $KUBECONFIG, else the pod's service account)
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where to keep the container index: for each container that uses a prepared claim, its
    /// CDI devices, which cuslice-runtime applies on containerd 1.6 (whose CRI does not pass
    /// them on)
    #[arg(long, default_value = cuslice_cdi::DEFAULT_CONTAINER_INDEX)]
    container_index: PathBuf,
    /// Keep no container index (every node's runtime applies CDI itself: containerd >= 1.7,
    /// CRI-O); the plugin then reads no pods
    #[arg(long)]
    no_container_index: bool,
    /// Seconds between reads of the GPUs (published again when they changed)
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    rescan: u64,
    /// How far the memory caps of the claims on one GPU may add up, percent of its memory, from
    /// 100 (no further: the default) to 1000. Past 100, a claim's processes wait for room when
    /// the GPU is full (memoryWait, 60s unless the claim says) while quiet processes of other
    /// claims give theirs back to the host (memoryFreezeIdle, 1h unless the claim says); one
    /// claim still takes at most the GPU's memory. See docs/oversubscription.md
    #[arg(long, default_value_t = 100, value_name = "PERCENT",
          value_parser = clap::value_parser!(u32).range(100..=1000))]
    memory_oversubscription: u32,
}

fn main() -> ExitCode {
    let c = Cli::parse();
    for (flag, p) in [("--hook", &c.hook), ("--library", &c.library)] {
        if !p.starts_with('/') {
            eprintln!(
                "cuslice-dra-plugin: {flag} {p:?} is not an absolute path; write e.g. {flag} /usr/local/bin/cuslice-hook"
            );
            return ExitCode::from(2);
        }
    }
    let opts = Options {
        node_name: c.node_name,
        plugin_dir: c.plugin_dir,
        registry_dir: c.registry_dir,
        cdi_dir: c.cdi_dir,
        roots: Roots {
            host: c.host_root,
            driver: c.driver_root,
        },
        hook: c.hook,
        library: c.library,
        kubeconfig: c.kubeconfig,
        rescan: Duration::from_secs(c.rescan),
        container_index: (!c.no_container_index).then_some(c.container_index),
        memory_oversubscription: c.memory_oversubscription,
    };
    match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuslice-dra-plugin: {e}");
            ExitCode::from(1)
        }
    }
}
