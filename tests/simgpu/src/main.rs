//! `simgpu`: make simulated-GPU state files, run programs against them, show the ground truth.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use simgpu::{CreateOptions, GpuKind, ProcessSamples, STATE_ENV, State};

#[derive(Parser)]
#[command(
    name = "simgpu",
    about = "A simulated GPU driver for tests (libcuda.so.1 + libnvidia-ml.so.1 over a shared device model). Not a GPU."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run CMD with the simulated libcuda.so.1 and libnvidia-ml.so.1 first in LD_LIBRARY_PATH.
    Run {
        #[command(flatten)]
        device: DeviceArgs,
        /// Share this state file (made if missing); default: a fresh temporary state.
        #[arg(long)]
        state: Option<PathBuf>,
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Make a state file (or check that an existing one matches the options).
    Init {
        #[command(flatten)]
        device: DeviceArgs,
        #[arg(long)]
        state: PathBuf,
    },
    /// Change what the simulated driver does, for every process using the state at once.
    Set {
        #[arg(long)]
        state: PathBuf,
        /// Per-process utilisation samples in NVML: `one-per-period` (or `on`: what a real
        /// driver does), `per-process`, or `off` (NOT_SUPPORTED)
        #[arg(long, value_name = "on|off|one-per-period|per-process", value_parser = ProcessSamples::parse)]
        process_samples: Option<ProcessSamples>,
        /// The device `--lost` applies to (its index)
        #[arg(long, requires = "lost")]
        device: Option<u32>,
        /// Device `--device` falls off the bus (`on`: NVML answers GPU_IS_LOST about it) or
        /// comes back (`off`)
        #[arg(long, value_name = "on|off", value_parser = on_off, requires = "device")]
        lost: Option<bool>,
    },
    /// Print the ground truth: devices, memory, and per-process holdings and device time.
    Show {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Copy the simulated libraries into DIR (e.g. to mount into a container) and print DIR.
    LibDir {
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
struct DeviceArgs {
    /// A device of this kind: `h100` (NVIDIA H100 80GB HBM3, 79.2 GiB) or `h200` (NVIDIA H200,
    /// 139.8 GiB), each with a 518 MiB context and the hardware's timing (1024 us slices, 50 us
    /// switches, 200 ms samples); the options below change it further
    #[arg(long, value_name = "h100|h200", value_parser = GpuKind::parse)]
    gpu: Option<GpuKind>,
    /// Number of devices [default: 1]
    #[arg(long)]
    devices: Option<u32>,
    /// Memory per device, e.g. 16GiB [default: 16GiB]
    #[arg(long, value_parser = size)]
    memory: Option<u64>,
    /// Hidden device memory each context takes, e.g. 300MiB [default: 300MiB]
    #[arg(long, value_parser = size)]
    context_overhead: Option<u64>,
    /// Engine time slice between contexts, in microseconds [default: 2000; 1024 with --gpu]
    #[arg(long)]
    timeslice_us: Option<u64>,
    /// Mean length of a switch between contexts, in microseconds (each takes 0 to twice this)
    /// [default: 0; 50 with --gpu]
    #[arg(long)]
    switch_us: Option<u64>,
    /// How often the driver samples utilisation for NVML, in milliseconds (a multiple of 10, at
    /// most 1000) [default: 100; 200 with --gpu]
    #[arg(long)]
    util_sample_ms: Option<u64>,
    /// Streaming multiprocessors per device [default: 132]
    #[arg(long)]
    sm_count: Option<u32>,
    /// How NVML gives per-process utilisation samples: `one-per-period` (what a real driver
    /// does: each sample period, one process that ran, drawn with a chance in proportion to its
    /// busy time, with the device's utilisation), `per-process` (each process that ran, with its
    /// own share)
    /// [default: one-per-period]
    #[arg(long, value_name = "one-per-period|per-process", value_parser = ProcessSamples::parse)]
    process_samples: Option<ProcessSamples>,
    /// NVML gives no per-process utilisation samples (nvmlDeviceGetProcessUtilization answers
    /// NOT_SUPPORTED, as on MIG instances and some vGPU profiles); device-wide utilisation stays
    #[arg(long, conflicts_with = "process_samples")]
    no_process_samples: bool,
    /// Every pair of devices is linked by NVLink, with peer access (an SXM board); without it
    /// the devices are PCIe cards that cannot reach each other
    #[arg(long)]
    nvlink: bool,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither `on` nor `off`")),
    }
}

fn size(s: &str) -> Result<u64, String> {
    cuslice_policy::parse_size(s).map_err(|e| e.to_string())
}

impl DeviceArgs {
    fn explicit(&self) -> bool {
        self.gpu.is_some()
            || self.devices.is_some()
            || self.memory.is_some()
            || self.context_overhead.is_some()
    }

    fn options(&self) -> CreateOptions {
        let d = self
            .gpu
            .map_or_else(CreateOptions::default, GpuKind::options);
        CreateOptions {
            devices: self.devices.unwrap_or(d.devices),
            memory: self.memory.unwrap_or(d.memory),
            context_overhead: self.context_overhead.unwrap_or(d.context_overhead),
            timeslice_ns: self.timeslice_us.map_or(d.timeslice_ns, |us| us * 1000),
            switch_ns: self.switch_us.map_or(d.switch_ns, |us| us * 1000),
            util_sample_ns: self
                .util_sample_ms
                .map_or(d.util_sample_ns, |ms| ms.saturating_mul(1_000_000)),
            sm_count: self.sm_count.unwrap_or(d.sm_count),
            process_samples: if self.no_process_samples {
                ProcessSamples::Off
            } else {
                self.process_samples.unwrap_or(d.process_samples)
            },
            nvlink: self.nvlink,
            ..d
        }
    }
}

/// Where the simulated libraries were built: next to this executable.
fn built_libraries() -> Result<[(PathBuf, &'static [&'static str]); 2]> {
    let exe = std::env::current_exe().context("cannot find the simgpu executable")?;
    let dir = exe.parent().context("simgpu executable has no folder")?;
    let cuda = dir.join("libsimgpu_cuda.so");
    let nvml = dir.join("libsimgpu_nvml.so");
    for p in [&cuda, &nvml] {
        if !p.exists() {
            bail!(
                "{} is missing; build the simulated driver with `cargo build --release --workspace`",
                p.display()
            );
        }
    }
    Ok([
        (cuda, &["libcuda.so.1", "libcuda.so"]),
        (nvml, &["libnvidia-ml.so.1", "libnvidia-ml.so"]),
    ])
}

fn make_lib_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (src, names) in built_libraries()? {
        for name in names {
            let dst = dir.join(name);
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            std::fs::copy(&src, &tmp)
                .with_context(|| format!("cannot copy {} to {}", src.display(), tmp.display()))?;
            std::fs::rename(&tmp, &dst)
                .with_context(|| format!("cannot write {}", dst.display()))?;
        }
    }
    Ok(())
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: i32) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Removes the work folders of earlier `simgpu run`s that were killed before they could clean up
/// (SIGKILL leaves them behind): `simgpu-<pid>-<ns>` whose process is gone.
fn sweep_stale_work_dirs() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("simgpu-"))
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn run(device: &DeviceArgs, state: Option<PathBuf>, cmd: &[String]) -> Result<u8> {
    sweep_stale_work_dirs();
    let work = std::env::temp_dir().join(format!(
        "simgpu-{}-{}",
        std::process::id(),
        simgpu::clock::now_ns()
    ));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let result = (|| {
        let lib = work.join("lib");
        make_lib_dir(&lib)?;
        let (path, explicit) = match &state {
            Some(p) => (p.clone(), device.explicit()),
            None => (work.join("state"), false),
        };
        let st = State::create_or_open(&path, &device.options(), explicit)?;
        drop(st);
        let ld = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut v = lib.clone().into_os_string();
                v.push(":");
                v.push(old);
                v
            }
            _ => lib.clone().into_os_string(),
        };
        let mut c = Command::new(&cmd[0]);
        c.args(&cmd[1..])
            .env("LD_LIBRARY_PATH", ld)
            .env(STATE_ENV, &path);
        // The program dies with simgpu. If simgpu died before the child asked for that, the
        // child has been re-parented already and no signal will come: it kills itself.
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: prctl, getppid and raise in the child before exec are async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
        let mut child = c
            .spawn()
            .with_context(|| format!("cannot run {}", cmd[0]))?;
        CHILD.store(child.id() as i32, Ordering::Relaxed);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: installing an async-signal-safe handler.
            unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
        }
        let status = child.wait().context("cannot wait for the program")?;
        use std::os::unix::process::ExitStatusExt;
        Ok(match (status.code(), status.signal()) {
            (Some(c), _) => c as u8,
            (None, Some(s)) => 128 + s as u8,
            _ => 1,
        })
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn show(state: &Path, json: bool) -> Result<()> {
    let s = State::open(state)?;
    let snap = s.snapshot();
    if json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
        return Ok(());
    }
    use cuslice_policy::format_size as fs;
    println!(
        "simgpu state {} (simulated; context overhead {}, time slice {} us, switches {} us on \
         average, NVML utilisation sampled every {} ms)",
        snap.state,
        fs(snap.context_overhead),
        snap.timeslice_ns / 1000,
        snap.switch_ns / 1000,
        snap.util_sample_ns / 1_000_000
    );
    for d in &snap.devices {
        println!(
            "device {}  {}  {}  {}",
            d.index, d.uuid, d.name, d.pci_bus_id
        );
        println!(
            "  memory  {} used of {}  ({} free)   engine busy {}% over the last second",
            fs(d.used),
            fs(d.total),
            fs(d.free),
            d.utilization
        );
        if d.processes.is_empty() {
            println!("  no processes");
        }
        for p in &d.processes {
            let kinds: Vec<String> = p
                .by_kind
                .iter()
                .map(|(k, v)| format!("{k} {}", fs(*v)))
                .collect();
            println!(
                "  pid {:>7} {:<16} held {:>10}  peak {:>10}  device time {:>8.3} s  refusals {}  [{}]",
                p.pid,
                p.comm,
                fs(p.held),
                fs(p.peak),
                p.device_time_ns as f64 / 1e9,
                p.oom_refusals,
                kinds.join(", ")
            );
        }
        for p in &d.exited {
            println!(
                "  exited pid {:>7} {:<16} peak {:>10}  device time {:>8.3} s",
                p.pid,
                p.comm,
                fs(p.peak),
                p.device_time_ns as f64 / 1e9
            );
        }
    }
    for c in &snap.checkpoints {
        println!(
            "{} pid {:>7} {:<16} device memory in host memory {}{}",
            c.state,
            c.pid,
            c.comm,
            fs(c.host_bytes),
            if c.stuck {
                "  (a restore failed for lack of device memory; it stays checkpointed)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run { device, state, cmd } => run(&device, state, &cmd),
        Cmd::Init { device, state } => {
            State::create_or_open(&state, &device.options(), device.explicit())
                .map(|_| 0)
                .map_err(Into::into)
        }
        Cmd::Set {
            state,
            process_samples,
            device,
            lost,
        } => State::open(&state).map_err(Into::into).and_then(|s| {
            if let (Some(i), Some(lost)) = (device, lost) {
                if i >= s.ndev() {
                    anyhow::bail!(
                        "--device {i}: {} has {} device(s), numbered from 0",
                        state.display(),
                        s.ndev()
                    );
                }
                s.set_lost(i, lost);
            }
            if let Some(how) = process_samples {
                s.set_process_samples(how);
            }
            Ok(0)
        }),
        Cmd::Show { state, json } => show(&state, json).map(|_| 0),
        Cmd::LibDir { out } => make_lib_dir(&out).map(|_| {
            println!("{}", out.display());
            0
        }),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("simgpu: {e:#}");
            ExitCode::from(2)
        }
    }
}
