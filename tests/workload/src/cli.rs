//! The command line shared by both binaries, and the run from arguments to exit code.
//!
//! Exit codes: 0 the scenario ran as designed, 1 an unexpected driver error (an `error` event is
//! printed first) or a failed check, 2 bad usage.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use serde_json::json;

use crate::driver::{Driver, LoadError, Resolution, ResolveOptions, Route, resolve};
use crate::out::{cu_error, emit};
use crate::requests::{RUNTIME_12_9, RUNTIME_13_0};
use crate::scenarios::{
    self, BenchAllocArgs, BenchLaunchArgs, CalibrateWorkArgs, ChurnArgs, Failure, FillArgs,
    HoldArgs, KeepArgs, LaunchArgs, MemcpyArgs, ProbeArgs, Session, StepsArgs,
};

/// `--route`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RouteArg {
    /// dlsym(handle, "<versioned name>") for each function
    Dlsym,
    /// cuGetProcAddress (v1) by base name
    #[value(name = "proc-v1")]
    ProcV1,
    /// cuGetProcAddress_v2 by base name
    #[value(name = "proc-v2")]
    ProcV2,
    /// replay libcudart 12.9's cuGetProcAddress_v2 requests
    #[value(name = "cudart-12.9")]
    Cudart129,
    /// replay libcudart 13.0's cuGetProcAddress_v2 requests
    #[value(name = "cudart-13.0")]
    Cudart130,
    /// the symbols the binary is linked against (cuda-workload-linked only)
    Direct,
    /// dlsym on a renamed copy of the libcuda.so.1 the program would load: goes around an
    /// interposer (a tenant bypassing cuslice; what the node agent catches)
    Bypass,
}

impl RouteArg {
    fn route(self) -> Route {
        match self {
            RouteArg::Dlsym => Route::Dlsym,
            RouteArg::ProcV1 => Route::ProcV1,
            RouteArg::ProcV2 => Route::ProcV2,
            RouteArg::Cudart129 => Route::Cudart(RUNTIME_12_9),
            RouteArg::Cudart130 => Route::Cudart(RUNTIME_13_0),
            RouteArg::Direct => Route::Direct,
            RouteArg::Bypass => Route::Bypass,
        }
    }
}

/// Drives a CUDA driver the ways real software does, runs one scenario and prints JSON lines.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Cli {
    /// How driver entry points are obtained [default: dlsym; direct for cuda-workload-linked]
    #[arg(long, value_enum, global = true)]
    pub route: Option<RouteArg>,
    /// cudaVersion passed to cuGetProcAddress by the proc-v1/proc-v2 routes
    #[arg(long, global = true, default_value_t = 12090)]
    pub cuda_version: i32,
    /// Ask for per-thread-default-stream variants (flags 2; _ptsz/_ptds names with dlsym)
    #[arg(long, global = true)]
    pub ptds: bool,
    /// Open libcuda.so.1 with `dlmopen(LM_ID_NEWLM, ...)`: a new link-map namespace, where no
    /// preloaded library applies (a way around an interposer)
    #[arg(long, global = true)]
    pub dlmopen: bool,
    /// CUDA device ordinal
    #[arg(long, global = true, default_value_t = 0)]
    pub device: i32,
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Everything the driver and NVML report
    Info,
    /// Allocate chunks of one family until the driver refuses, then free them
    Fill(FillArgs),
    /// Hold one allocation for a while (by default until stdin reaches EOF)
    Hold(HoldArgs),
    /// Launch the spin or work kernel for a while
    #[command(long_about = "Launch the spin or work kernel for a while.\n\n\
        Launches --kernel (spin: waits on the device's clock; work: a fixed amount of arithmetic) \
        of --ns-per-block x --blocks ns each through --via, round-robin over --streams, with at \
        most --depth in flight per stream, or --sync-every K: K launched, then all waited for; \
        with --idle-secs S, the first launch waits S seconds after the context is made. \
        With --progress-ms MS, every MS a `progress` line: mono_ns (CLOCK_MONOTONIC), completed \
        (kernels known done), launches, work_ns (completed x the ns each asks for); one more at \
        the end. \
        Then one `launched` line: launches, wall_ns, engine_ns_requested, elapsed_ns (events \
        around the run), the kernel, its image and its shape.")]
    Launch(LaunchArgs),
    /// Find the work kernel's iterations for a kernel length, and its rate alone
    #[command(
        long_about = "Find the work kernel's iterations for a kernel length, and its rate alone.\n\n\
        Times rounds of --kernels work kernels back to back with events, shaped as `launch \
        --kernel work --ns-per-block 1000 --blocks US` shapes them, scaling the iterations until a \
        round's mean is within 2% of --us (5 rounds at most). One `calibrated` line: iters (pass \
        it to `launch --work-iters`), kernel_ns and measured_iters (the last round), iters_per_us, \
        kernels_per_sec and work_ns_per_sec (the rate alone), grid, rounds. On the simulated GPU \
        a work kernel's length is the ns it is launched with, whatever its iterations."
    )]
    CalibrateWork(CalibrateWorkArgs),
    /// Allocate --bytes at each SIGUSR1 (kept), a `step` line each; free all at SIGTERM
    Steps(StepsArgs),
    /// Copy host -> device -> host and device -> device, and compare
    Memcpy(MemcpyArgs),
    /// A notebook's kernel: keep a pattern on the device, read it back after each idle spell
    Keep(KeepArgs),
    /// Threads allocate and free random sizes for a while, counting refusals (error 2)
    #[command(
        long_about = "Threads allocate and free random sizes for a while, counting refusals.\n\n\
        Each of --threads threads makes the process's primary context current and, for --secs \
        seconds, allocates a pseudo-random size in [--min, --max] (whole MiB when the range holds \
        one), keeps it, and frees a random one of its allocations when it holds --hold-max of \
        them or on a coin toss. CUDA_ERROR_OUT_OF_MEMORY is counted and the loop goes on; any \
        other error stops every thread (an `error` event each, exit 1). Everything is freed at \
        the end and one `churned` line reports allocs, frees, refused, refused_bytes_max and \
        errors. A thread holds at most --hold-max allocations, so threads x hold-max x max bytes \
        bound what the process holds."
    )]
    Churn(ChurnArgs),
    /// Time cuMemAlloc_v2 + cuMemFree_v2 pairs on one or more threads
    #[command(
        long_about = "Time cuMemAlloc_v2 + cuMemFree_v2 pairs on one or more threads.\n\n\
        Each of --threads threads makes the process's primary context current, makes 1000 \
        untimed pairs, waits for the others, then times --iters pairs, in batches of 1000. One \
        `bench` line: ns_per_pair and pairs_per_sec_per_thread (means over the threads), \
        ns_per_pair_p10 and ns_per_pair_median (over every thread's whole batches: batch, the \
        pairs in one), total_pairs_per_sec \
        (all pairs over the wall time from the first thread's start to the last one's end), \
        per_thread_ns_per_pair, wall_ns, and start_mono_ns / end_mono_ns (CLOCK_MONOTONIC) to \
        line up several processes."
    )]
    BenchAlloc(BenchAllocArgs),
    /// Time launches of a short kernel, in paced batches
    #[command(long_about = "Time launches of a short kernel, in paced batches.\n\n\
        Loads --kernel (spin or work) of --kernel-ns per block and, after --warmup-secs of untimed batches, \
        times --batches batches of --batch one-block launches through --via, synchronising the \
        stream and sleeping --pause-us after each batch (untimed), so that a slice with a core \
        limit is never held back while timed. One `bench` line: ns_per_launch_p10, _median, \
        _mean, _p90 and _max over the batches (each batch's time / --batch).")]
    BenchLaunch(BenchLaunchArgs),
    /// A latency probe: a short kernel every few milliseconds, each waited for
    #[command(
        long_about = "A latency probe: a short kernel every few milliseconds, each waited for.\n\n\
        Every --period-ms, launches one --kernel-us kernel on its own stream and waits for it \
        with cuStreamSynchronize. One `probed` line: latencies_ns (each probe's wall time from \
        just before the launch to the synchronisation's return, in order), p50_ns, p99_ns, \
        max_ns, and start_mono_ns / end_mono_ns (CLOCK_MONOTONIC) of the reported probes."
    )]
    Probe(ProbeArgs),
    /// A hostile tenant: attack the cuslice state the container can reach (see `tamper.rs`)
    Tamper(crate::tamper::TamperArgs),
    /// A hostile tenant: run a command with the preload file hidden, in a user namespace of its
    /// own with a bind mount over it (see `tamper.rs`)
    DropPreload(crate::tamper::DropPreloadArgs),
    /// Fill memory on --device (or, with --location host, host memory mapped for it) and share
    /// it with other processes (CUDA IPC or an exported VMM handle): one `exported` line to pass
    /// to `import --from`; held until stdin reaches EOF, then a `released` line (written_back)
    Export(crate::share::ExportArgs),
    /// Open memory another process exported, map it on --device, read its pattern back and write
    /// another over its first bytes: one `imported` line (pattern_ok); held until stdin reaches
    /// EOF
    Import(crate::share::ImportArgs),
    /// Peer access between every pair of devices, a peer copy from each device to each other
    /// (cuMemcpyPeer, then cuMemcpyPeerAsync), and multicast objects across them: one `peers`
    /// line (no --device)
    Peers(crate::share::PeersArgs),
    /// Only resolve the entry points and report how (no cuInit)
    Resolve,
}

impl Scenario {
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Info => "info",
            Scenario::Fill(_) => "fill",
            Scenario::Hold(_) => "hold",
            Scenario::Launch(_) => "launch",
            Scenario::CalibrateWork(_) => "calibrate-work",
            Scenario::Steps(_) => "steps",
            Scenario::Memcpy(_) => "memcpy",
            Scenario::Keep(_) => "keep",
            Scenario::Churn(_) => "churn",
            Scenario::BenchAlloc(_) => "bench-alloc",
            Scenario::BenchLaunch(_) => "bench-launch",
            Scenario::Probe(_) => "probe",
            Scenario::Tamper(_) => "tamper",
            Scenario::DropPreload(_) => "drop-preload",
            Scenario::Export(_) => "export",
            Scenario::Import(_) => "import",
            Scenario::Peers(_) => "peers",
            Scenario::Resolve => "resolve",
        }
    }
}

/// What distinguishes the two binaries.
pub struct Binary {
    pub name: &'static str,
    pub default_route: RouteArg,
    /// The linked symbols (`cuda-workload-linked` only).
    pub direct: Option<fn() -> Driver>,
}

fn usage(bin: &Binary, message: &str) -> ! {
    Cli::command()
        .name(bin.name)
        .bin_name(bin.name)
        .error(ErrorKind::ArgumentConflict, message)
        .exit()
}

/// Parses the command line, resolves the driver and runs the scenario.
pub fn main_with(bin: Binary) -> ExitCode {
    let matches = Cli::command()
        .name(bin.name)
        .bin_name(bin.name)
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Scenario::DropPreload(a) = &cli.scenario {
        return ExitCode::from(crate::tamper::drop_preload(a));
    }
    let route_arg = cli.route.unwrap_or(bin.default_route);
    match (route_arg == RouteArg::Direct, bin.direct.is_some()) {
        (true, false) => usage(&bin, "--route direct needs the cuda-workload-linked binary"),
        (false, true) => usage(&bin, "cuda-workload-linked only has --route direct"),
        _ => {}
    }
    if route_arg == RouteArg::Direct && cli.ptds {
        usage(
            &bin,
            "--ptds has no effect with --route direct (it links the default-stream symbols)",
        );
    }
    if matches!(&cli.scenario, Scenario::Launch(a) if a.secs == 0.0 && a.count.is_none()) {
        usage(&bin, "launch --secs 0 needs --count");
    }
    if matches!(&cli.scenario, Scenario::Churn(a) if a.min == 0 || a.min > a.max) {
        usage(&bin, "churn needs 1 <= --min <= --max");
    }
    ExitCode::from(run(&cli, route_arg.route(), bin.direct))
}

fn run(cli: &Cli, route: Route, direct: Option<fn() -> Driver>) -> u8 {
    let opts = ResolveOptions {
        route,
        cuda_version: cli.cuda_version,
        ptds: cli.ptds,
        dlmopen: cli.dlmopen,
    };
    let (driver, resolution) = match resolve(opts, direct) {
        Ok(r) => r,
        Err(e) => {
            load_error(&e);
            return 1;
        }
    };
    if let Scenario::Resolve = cli.scenario {
        resolved(&opts, &driver, &resolution);
        return 0;
    }
    if let Scenario::Tamper(a) = &cli.scenario
        && a.init_only
    {
        return crate::tamper::init_only(&driver, a.secs);
    }
    if let Scenario::Peers(a) = &cli.scenario {
        return match crate::share::peers(&driver, a) {
            Ok(()) => 0,
            Err(Failure::Cu(e)) => {
                cu_error(&e);
                1
            }
            Err(Failure::Check) => 1,
        };
    }
    let missing = driver.missing();
    if !missing.is_empty() {
        eprintln!(
            "cuda-workload: route {} found no entry point for {}",
            route.name(),
            missing.join(", ")
        );
    }
    match scenario(cli, route, &driver) {
        Ok(()) => 0,
        Err(Failure::Cu(e)) => {
            cu_error(&e);
            1
        }
        Err(Failure::Check) => 1,
    }
}

fn scenario(cli: &Cli, route: Route, driver: &Driver) -> Result<(), Failure> {
    if let Scenario::Steps(_) = cli.scenario {
        // Before cuInit: the threads the driver and an interposer start inherit the mask.
        scenarios::block_steps();
    }
    let session = Session::open(driver, cli.device)?;
    session.start(route.name(), cli.scenario.name())?;
    match &cli.scenario {
        Scenario::Info => scenarios::info(&session)?,
        Scenario::Fill(a) => scenarios::fill(&session, a)?,
        Scenario::Hold(a) => scenarios::hold(&session, a)?,
        Scenario::Launch(a) => scenarios::launch(&session, a)?,
        Scenario::CalibrateWork(a) => scenarios::calibrate_work(&session, a)?,
        Scenario::Steps(a) => scenarios::steps(&session, a)?,
        Scenario::Memcpy(a) => scenarios::memcpy(&session, a)?,
        Scenario::Keep(a) => scenarios::keep(&session, a)?,
        Scenario::Churn(a) => scenarios::churn(&session, a)?,
        Scenario::BenchAlloc(a) => scenarios::bench_alloc(&session, a)?,
        Scenario::BenchLaunch(a) => scenarios::bench_launch(&session, a)?,
        Scenario::Probe(a) => scenarios::probe(&session, a)?,
        Scenario::Tamper(a) => crate::tamper::tamper(&session, a),
        Scenario::Export(a) => crate::share::export(&session, a)?,
        Scenario::Import(a) => crate::share::import(&session, a)?,
        Scenario::Peers(_) | Scenario::Resolve | Scenario::DropPreload(_) => {}
    }
    session.close()?;
    Ok(())
}

fn load_error(e: &LoadError) {
    eprintln!("cuda-workload: {e}");
    match e {
        LoadError::Library { library, message } => {
            emit(
                "error",
                json!({"call": "dlopen", "library": library, "message": message}),
            );
        }
        LoadError::Entry { library, symbol } => {
            emit(
                "error",
                json!({"call": symbol, "code": -1, "missing": true, "library": library}),
            );
        }
        LoadError::Other(message) => emit("error", json!({"message": message})),
    }
}

fn resolved(opts: &ResolveOptions, driver: &Driver, r: &Resolution) {
    let cuda_version = match opts.route {
        Route::ProcV1 | Route::ProcV2 => Some(opts.cuda_version),
        Route::Cudart(rt) => Some(rt.cuda_version),
        Route::Dlsym | Route::Direct | Route::Bypass => None,
    };
    emit(
        "resolved",
        json!({
            "route": opts.route.name(),
            "cuda_version": cuda_version,
            "ptds": opts.ptds,
            "requests": r.requests,
            "found": r.found,
            "not_found": r.not_found,
            "version_not_sufficient": r.version_not_sufficient,
            "extra": r.extra,
            "older_abi": r.older_abi,
            "missing": driver.missing(),
            "switched_gpa": r.switched_gpa,
            "kept_gpa_v1": r.kept_gpa_v1,
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cuda-workload").chain(args.iter().copied()))
    }

    #[test]
    fn options_go_before_or_after_the_scenario() {
        let cli = parse(&[
            "--route",
            "cudart-13.0",
            "fill",
            "--family",
            "array3d",
            "--chunk",
            "1.5GiB",
            "--ptds",
        ])
        .unwrap();
        assert_eq!(cli.route, Some(RouteArg::Cudart130));
        assert!(cli.ptds);
        let Scenario::Fill(f) = cli.scenario else {
            panic!()
        };
        assert_eq!(f.chunk, 3 << 29);
        assert_eq!(f.family, scenarios::Family::Array3d);
        assert_eq!(f.hold, 0.0);
        let cli = parse(&[
            "hold",
            "--bytes",
            "4g",
            "--route",
            "proc-v1",
            "--cuda-version",
            "11040",
        ])
        .unwrap();
        assert_eq!(cli.route, Some(RouteArg::ProcV1));
        assert_eq!(cli.cuda_version, 11040);
        let Scenario::Hold(h) = cli.scenario else {
            panic!()
        };
        assert_eq!(
            (h.bytes, h.secs, h.family),
            (4 << 30, None, scenarios::Family::Mem)
        );
    }

    #[test]
    fn bad_usage_is_an_error() {
        assert!(parse(&["fill", "--family", "mem", "--chunk", "lots"]).is_err());
        assert!(parse(&["fill", "--family", "heap", "--chunk", "1g"]).is_err());
        assert!(
            parse(&[
                "launch",
                "--ns-per-block",
                "10",
                "--blocks",
                "0",
                "--secs",
                "1"
            ])
            .is_err()
        );
        assert!(
            parse(&[
                "launch",
                "--ns-per-block",
                "10",
                "--blocks",
                "1",
                "--secs",
                "-1"
            ])
            .is_err()
        );
        assert!(parse(&["--route", "nope", "resolve"]).is_err());
        assert!(parse(&[]).is_err());
        let e = parse(&["memcpy"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn bypass_and_zero_ledger() {
        let cli = parse(&[
            "--route",
            "bypass",
            "hold",
            "--bytes",
            "2GiB",
            "--zero-ledger",
            "/run/cuslice/slice/ledger",
        ])
        .unwrap();
        assert_eq!(cli.route.map(RouteArg::route), Some(Route::Bypass));
        let Scenario::Hold(h) = cli.scenario else {
            panic!()
        };
        assert_eq!(
            h.zero_ledger.as_deref(),
            Some(std::path::Path::new("/run/cuslice/slice/ledger"))
        );
    }

    #[test]
    fn launch_defaults() {
        let cli = parse(&[
            "launch",
            "--ns-per-block",
            "1000",
            "--blocks",
            "8",
            "--secs",
            "0",
            "--count",
            "5",
        ])
        .unwrap();
        let Scenario::Launch(l) = cli.scenario else {
            panic!()
        };
        assert_eq!(
            (l.via, l.streams, l.depth, l.count, l.idle_secs),
            (scenarios::Via::Kernel, 1, 4, Some(5), 0.0)
        );
    }

    #[test]
    fn churn_and_bench_alloc_arguments() {
        let cli = parse(&[
            "churn",
            "--threads",
            "4",
            "--secs",
            "0.5",
            "--min",
            "1MiB",
            "--max",
            "64m",
        ])
        .unwrap();
        let Scenario::Churn(c) = cli.scenario else {
            panic!()
        };
        assert_eq!(
            (
                c.threads, c.secs, c.min, c.max, c.hold_max, c.seed, c.family
            ),
            (4, 0.5, 1 << 20, 64 << 20, 4, 1, scenarios::Family::Mem)
        );
        assert!(
            parse(&[
                "churn",
                "--threads",
                "0",
                "--secs",
                "1",
                "--min",
                "1",
                "--max",
                "2"
            ])
            .is_err()
        );
        assert!(parse(&["churn", "--secs", "1", "--min", "1", "--max", "2"]).is_err());
        let cli = parse(&["bench-alloc"]).unwrap();
        let Scenario::BenchAlloc(b) = cli.scenario else {
            panic!()
        };
        assert_eq!((b.iters, b.threads, b.size), (200_000, 1, 1 << 20));
        assert!(parse(&["bench-alloc", "--iters", "0"]).is_err());
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }
}
