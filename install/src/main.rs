//! `cuslice install` / `cuslice uninstall`: copy cuslice's binaries into PREFIX and register the
//! hook with Docker, containerd, Podman, CRI-O or CDI, or its SPANK plugin with Slurm. See
//! docs/install.md.

mod doctor;
mod elfsym;
mod fsio;
mod layout;
mod plan;
mod problem;
mod strip;
mod transform;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::layout::Layout;
use crate::plan::{Cmd, Engine, Failure, Options};

#[derive(Parser, Debug)]
#[command(
    name = "cuslice",
    version,
    about = "cuslice: GPU memory caps and compute shares for containers",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Copy the hook, the wrapper runtime, this command and libcuslice.so into PREFIX, and
    /// register them with the container engines (slurm: the SPANK plugin, in plugstack.conf)
    Install(InstallArgs),
    /// Remove what install added (configuration entries, files), leaving everything else as it was
    Uninstall(UninstallArgs),
    /// What each slice on this node holds and gets: memory held, cap, peak, refusals; compute
    /// share over the last 1 s and 10 s against request and limit; time throttled
    Status(StatusArgs),
    /// `status`, refreshed in the terminal until interrupted
    Top(TopArgs),
    /// Serve the same figures for Prometheus at http://ADDR/metrics
    Exporter(ExporterArgs),
    /// Change a running slice's limits or priority, without a restart (docs/live-limits.md)
    Set(SetArgs),
    /// The node agent: tells container processes their host pids, checks every slice against
    /// the driver's own counts, serves /metrics (docs/agent.md)
    // A flag given twice takes the later value: the systemd unit says `--enforce stop` before
    // the operator's own options, which may say `--enforce report`.
    #[command(args_override_self = true)]
    Agent(AgentArgs),
    /// Check this node: NVML, each engine's registration, the installed files, the agent,
    /// cgroups, the state root; one line per item, exit 1 on a problem (docs/doctor.md)
    Doctor(DoctorArgs),
}

#[derive(Args, Debug)]
struct DoctorArgs {
    /// Where cuslice was installed (as given to `cuslice install --prefix`); default: the prefix
    /// of this `cuslice` where it runs from PREFIX/bin beside the hook (as the Debian package's
    /// /usr), else /usr/local
    #[arg(long, value_name = "DIR")]
    prefix: Option<String>,
    /// Look at the files under DIR (as `cuslice install --root`)
    #[arg(long, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// The runtime name cuslice was installed under
    #[arg(long, default_value = "cuslice")]
    name: String,
    /// The OCI hook's state root (the agent's socket is DIR/agent/agent.sock)
    #[arg(long, default_value = cuslice_state::paths::DEFAULT_STATE_ROOT, value_name = "DIR")]
    state_root: PathBuf,
    /// Print JSON (the items, and whether the node is healthy)
    #[arg(long)]
    json: bool,
    /// Also start a throwaway container with CUSLICE_MEMORY_LIMIT=1GiB through ENGINE's
    /// registration of cuslice (runc: runc directly, with the installed hook) and check from
    /// inside that the cap is seen
    #[arg(long, value_name = "ENGINE", value_parser = doctor::container::ENGINES)]
    container_test: Option<String>,
    /// The simulated GPU's state file, mounted into the test container [default:
    /// $SIMGPU_STATE]
    #[arg(long, value_name = "FILE")]
    sim_state: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
struct SourceArgs {
    /// The OCI hook's state root, where container slices are found
    #[arg(long, default_value = cuslice_state::paths::DEFAULT_STATE_ROOT, value_name = "DIR")]
    state_root: PathBuf,
    /// A standalone slice's CUSLICE_STATE_DIR (repeat for several) [default: $CUSLICE_STATE_DIR
    /// if set]
    #[arg(long = "state-dir", value_name = "DIR")]
    state_dirs: Vec<PathBuf>,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Print JSON (docs/status.md describes the fields)
    #[arg(long)]
    json: bool,
}

/// `cuslice set`'s values take a leading `-` (`--memory-limit -1`), so that a negative or
/// otherwise bad value reaches cuslice's own check and its one-line refusal, not clap's usage.
#[derive(Args, Debug)]
struct SetArgs {
    /// The slice: a container's id (or a unique prefix), name or pod/container, or a standalone
    /// slice's CUSLICE_STATE_DIR
    target: String,
    /// The new memory cap for every device of the slice, or the one --device names (e.g.
    /// 4GiB); lowered below what the slice holds, new allocations are refused until it is under
    /// it
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    memory_limit: Option<String>,
    /// The new core limit, percent of device time (1-100)
    #[arg(long, value_name = "PERCENT", allow_hyphen_values = true)]
    core_limit: Option<String>,
    /// The new core request, percent of device time (1-100); refused if the requests on the
    /// device would add up to more than 100
    #[arg(long, value_name = "PERCENT", allow_hyphen_values = true)]
    core_request: Option<String>,
    /// The new priority on the slice's devices: high, normal or low (docs/compute.md,
    /// "Priority")
    #[arg(long, value_name = "PRIORITY", allow_hyphen_values = true)]
    priority: Option<String>,
    /// Change the memory limit, core limit and core request of this device alone: its index as
    /// the slice sees it (0 is the first device its processes see, as CUSLICE_MEMORY_LIMIT_0
    /// counts), or its UUID (GPU-..., or a prefix naming one device) [default: every device]
    #[arg(long, value_name = "N|UUID", allow_hyphen_values = true)]
    device: Option<String>,
    /// The OCI hook's state root, where container slices are found
    #[arg(long, default_value = cuslice_state::paths::DEFAULT_STATE_ROOT, value_name = "DIR")]
    state_root: PathBuf,
    /// The node's compute board: the hook's --node-dir, a standalone slice's
    /// CUSLICE_NODE_DIR [default: $CUSLICE_NODE_DIR if set, else /dev/shm/cuslice]
    #[arg(long, value_name = "DIR")]
    node_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TopArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Seconds between refreshes
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    interval: f64,
    /// Stop after this many refreshes [default: run until interrupted]
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Print each refresh as one line of JSON (the fields of `status --json`) instead of
    /// redrawing the table: a timeline to record
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ExporterArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// HOST:PORT to listen on (`:9400` for every address; port 0 picks a free one)
    #[arg(long, value_name = "ADDR")]
    listen: String,
}

#[derive(Args, Debug)]
struct AgentArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Also serve /metrics at HOST:PORT (`:9400` for every address)
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// What to do about a slice over its cap or limit by the driver's count: `report` (a log
    /// line, status and a metric) or `stop` (also kill over the memory cap, freeze over the
    /// core limit). `report` when run by hand; the service `cuslice install` sets up runs
    /// `--enforce stop` (docs/agent.md)
    #[arg(long, default_value = "report", value_name = "MODE")]
    enforce: String,
    /// Seconds between checks against the driver
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    period: f64,
    /// Seconds a slice may be over its memory cap, in total within any window of ten times
    /// this, before `--enforce stop` acts
    #[arg(
        long,
        default_value_t = 2.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    grace: f64,
}

fn sources(a: SourceArgs) -> cuslice_node::collect::Sources {
    let mut state_dirs = a.state_dirs;
    if state_dirs.is_empty()
        && let Some(d) = std::env::var_os("CUSLICE_STATE_DIR").filter(|d| !d.is_empty())
    {
        state_dirs.push(PathBuf::from(d));
    }
    cuslice_node::collect::Sources {
        state_root: a.state_root,
        state_dirs: state_dirs.iter().map(|d| absolute(d)).collect(),
    }
}

fn status(a: StatusArgs) -> Result<(), Failure> {
    let view = cuslice_node::collect::collect(&sources(a.sources));
    if a.json {
        let text = serde_json::to_string_pretty(&view)
            .map_err(|e| Failure::Failed(format!("cuslice status: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", cuslice_node::text::render(&view));
    }
    Ok(())
}

fn top(a: TopArgs) -> Result<(), Failure> {
    if !(a.interval.is_finite() && a.interval >= 0.1) {
        return Err(Failure::Refused(format!(
            "cuslice top: --interval {} is not a refresh period; give seconds, at least 0.1 \
             (e.g. --interval 2)",
            a.interval
        )));
    }
    let src = sources(a.sources);
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut n = 0u64;
    loop {
        let view = cuslice_node::collect::collect(&src);
        if a.json {
            let line = serde_json::to_string(&view)
                .map_err(|e| Failure::Failed(format!("cuslice top: {e}")))?;
            // A reader that went away (a closed pipe) ends the loop.
            if writeln!(std::io::stdout(), "{line}").is_err() {
                return Ok(());
            }
        } else if terminal {
            // Home, clear to the end of the screen: the table is redrawn in place.
            print!("\x1b[H\x1b[2J{}", cuslice_node::text::render(&view));
            println!("\n(every {} s; Ctrl-C to stop)", a.interval);
        } else {
            // Into a pipe or a file: each table as it is, a blank line between them, no
            // escapes for a terminal that is not there.
            let text = format!("{}\n", cuslice_node::text::render(&view));
            let mut out = std::io::stdout();
            if out
                .write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return Ok(());
            }
        }
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(a.interval));
    }
}

fn set(a: SetArgs) -> Result<(), Failure> {
    let node_dir = a
        .node_dir
        .or_else(|| {
            std::env::var_os("CUSLICE_NODE_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(cuslice_node::set::DEFAULT_NODE_DIR));
    let change = cuslice_node::set::Change {
        memory_limit: a.memory_limit,
        core_limit: a.core_limit,
        core_request: a.core_request,
        priority: a.priority,
        device: a.device,
    };
    let places = cuslice_node::set::Places {
        state_root: a.state_root,
        node_dir,
    };
    let done = cuslice_node::set::set(&a.target, &change, &places)
        .map_err(|e| Failure::Refused(format!("cuslice set: {e}")))?;
    println!("{done}");
    Ok(())
}

fn exporter(a: ExporterArgs) -> Result<(), Failure> {
    let addr = cuslice_node::exporter::parse_listen(&a.listen)
        .map_err(|e| Failure::Refused(format!("cuslice exporter: {e}")))?;
    cuslice_node::exporter::serve(addr, sources(a.sources))
        .map_err(|e| Failure::Failed(format!("cuslice exporter: {e}")))
}

#[derive(Args, Debug)]
struct Common {
    /// The container engines (and Slurm): install registers cuslice with them, uninstall removes
    /// it from them (repeat the flag, or separate with commas)
    #[arg(long = "engine", value_enum, required = true, value_delimiter = ',')]
    engines: Vec<Engine>,
    /// Where the files go: PREFIX/bin/cuslice-hook, PREFIX/bin/cuslice-runtime, PREFIX/bin/cuslice,
    /// PREFIX/lib/cuslice/libcuslice.so and PREFIX/lib/cuslice/libcuslice_core.so
    #[arg(long, default_value = cuslice_state::paths::DEFAULT_PREFIX, value_name = "DIR")]
    prefix: PathBuf,
    /// Read and write every file under DIR (like DESTDIR); paths written into the configuration
    /// stay those of the target system
    #[arg(long, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// The file the engine's registration edits (docker: daemon.json; containerd: config.toml;
    /// podman: the hooks.d directory; crio: the drop-in; cdi: the spec; slurm: the plugstack file
    /// [default: slurm.conf's PlugStackConfig, else plugstack.conf beside slurm.conf]), on the
    /// target system
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The runtime name engines know cuslice by
    #[arg(long, default_value = "cuslice")]
    name: String,
    /// Print each file's change as a unified diff (or "no change") and write nothing
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct InstallArgs {
    #[command(flatten)]
    common: Common,
    /// Where cuslice-hook, cuslice-runtime, cuslice, libcuslice.so and libcuslice_core.so are
    /// (and, for slurm, libcuslice_spank.so) [default: the directory holding this executable]
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,
    /// docker: also make cuslice dockerd's default runtime
    #[arg(long)]
    default_runtime: bool,
    /// Do not install the node agent (`cuslice agent --enforce stop` as the systemd unit
    /// NAME-agent.service, enabled and started); by default install does, where systemd runs
    /// the system
    #[arg(long)]
    no_agent: bool,
}

#[derive(Args, Debug)]
struct UninstallArgs {
    #[command(flatten)]
    common: Common,
    /// Keep the installed binaries and library; remove only the registrations
    #[arg(long)]
    keep_files: bool,
}

fn agent(a: AgentArgs) -> Result<(), Failure> {
    let refuse = |msg: String| Failure::Refused(format!("cuslice agent: {msg}"));
    let listen = a
        .listen
        .as_deref()
        .map(cuslice_node::exporter::parse_listen)
        .transpose()
        .map_err(refuse)?;
    let enforce = match a.enforce.as_str() {
        "report" => cuslice_agent::Enforce::Report,
        "stop" => cuslice_agent::Enforce::Stop,
        other => {
            return Err(refuse(format!(
                "--enforce {other:?} is not a mode; write --enforce report (say what is over) \
                 or --enforce stop (also stop it)"
            )));
        }
    };
    if !(a.period.is_finite() && (0.1..=3600.0).contains(&a.period)) {
        return Err(refuse(format!(
            "--period {} is not a check period; give seconds from 0.1 to 3600 (e.g. --period 1)",
            a.period
        )));
    }
    if !(a.grace.is_finite() && (0.0..=3600.0).contains(&a.grace)) {
        return Err(refuse(format!(
            "--grace {} is not a grace time; give seconds from 0 to 3600 (e.g. --grace 2)",
            a.grace
        )));
    }
    let src = sources(a.sources);
    cuslice_agent::run(cuslice_agent::Config {
        state_root: src.state_root,
        state_dirs: src.state_dirs,
        listen,
        period: std::time::Duration::from_secs_f64(a.period),
        enforce,
        grace: std::time::Duration::from_secs_f64(a.grace),
    })
    .map_err(|e| Failure::Failed(format!("cuslice agent: {e}")))
}

/// The prefix this `cuslice` is installed under: PREFIX where it runs as PREFIX/bin/cuslice with
/// the hook beside it.
fn own_prefix() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    if bin.file_name()? != "bin" || !bin.join("cuslice-hook").is_file() {
        return None;
    }
    bin.parent()?.to_str().map(str::to_owned)
}

fn doctor(a: DoctorArgs) -> Result<(), Failure> {
    let refuse = |msg: String| Failure::Refused(format!("cuslice doctor: {msg}"));
    let root = absolute(&a.root);
    let prefix = a
        .prefix
        .clone()
        .or_else(|| (root == Path::new("/")).then(own_prefix).flatten())
        .unwrap_or_else(|| cuslice_state::paths::DEFAULT_PREFIX.to_owned());
    let layout = Layout::new(&prefix, &a.name).map_err(refuse)?;
    if !root.is_dir() {
        return Err(refuse(format!(
            "--root {}: not a directory; give the directory holding the target system, or leave \
             it out for /",
            root.display()
        )));
    }
    let places = doctor::Places {
        root,
        layout,
        state_root: absolute(&a.state_root),
    };
    let facts = doctor::gather(&places);
    let mut items = doctor::judge::judge(&facts);
    if let Some(engine) = &a.container_test {
        let sim = a
            .sim_state
            .or_else(|| std::env::var_os("SIMGPU_STATE").map(PathBuf::from))
            .map(|s| absolute(&s));
        items.push(doctor::container::test(&places, engine, sim.as_deref()));
    }
    let healthy = doctor::judge::healthy(&items);
    if a.json {
        let v = serde_json::json!({ "healthy": healthy, "version": facts.version, "items": items });
        println!("{v:#}");
    } else {
        for i in &items {
            println!("{}", i.line());
        }
    }
    let problems = items
        .iter()
        .filter(|i| i.status == doctor::judge::Status::Problem)
        .count();
    match problems {
        0 => Ok(()),
        n => Err(Failure::Failed(format!(
            "cuslice doctor: {n} problem{} (PROBLEM lines above)",
            if n == 1 { "" } else { "s" }
        ))),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn options(command: Command) -> Result<Options, Failure> {
    let (cmd, common, from, default_runtime, keep_files, agent) = match command {
        Command::Install(a) => (
            Cmd::Install,
            a.common,
            a.from,
            a.default_runtime,
            false,
            !a.no_agent,
        ),
        Command::Uninstall(a) => (Cmd::Uninstall, a.common, None, false, a.keep_files, true),
        _ => unreachable!("only install and uninstall have install options"),
    };
    let word = match cmd {
        Cmd::Install => "install",
        Cmd::Uninstall => "uninstall",
    };
    let refuse = |msg: String| Failure::Refused(format!("cuslice {word}: {msg}"));

    let mut engines = common.engines;
    engines.sort();
    engines.dedup();

    let prefix = common.prefix.to_str().ok_or_else(|| {
        refuse(format!(
            "--prefix {}: not UTF-8; it is written into configuration files, so give a UTF-8 path",
            common.prefix.display()
        ))
    })?;
    let layout = Layout::new(prefix, &common.name).map_err(refuse)?;

    let root = absolute(&common.root);
    if !root.is_dir() {
        return Err(refuse(format!(
            "--root {}: not a directory; give the directory holding the target system (e.g. \
             --root /host), or leave it out for /",
            root.display()
        )));
    }

    let config = match common.config {
        None => None,
        Some(c) => {
            if engines.len() > 1 {
                return Err(refuse(format!(
                    "--config {}: names one engine's file, but {} engines were given; run once \
                     per engine",
                    c.display(),
                    engines.len()
                )));
            }
            let c = absolute(&c);
            let s = c.to_str().ok_or_else(|| {
                refuse(format!(
                    "--config {}: not UTF-8; give a UTF-8 path",
                    c.display()
                ))
            })?;
            Some(s.to_owned())
        }
    };
    Ok(Options {
        cmd,
        engines,
        layout,
        root,
        config,
        from: from.map(|f| absolute(&f)),
        default_runtime,
        keep_files,
        agent,
        dry_run: common.dry_run,
    })
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Status(a) => status(a),
        Command::Top(a) => top(a),
        Command::Exporter(a) => exporter(a),
        Command::Set(a) => set(a),
        Command::Agent(a) => agent(a),
        Command::Doctor(a) => doctor(a),
        c => install(c),
    }
}

fn install(command: Command) -> Result<(), Failure> {
    let o = options(command)?;
    let plan = plan::plan(&o)?;
    if o.dry_run {
        print!("{}", plan::render_dry_run(&plan));
        return Ok(());
    }
    print!("{}", plan::apply(&o, &plan)?);
    for note in &plan.notes {
        println!("{note}");
    }
    Ok(())
}

/// `cuslice --version`: the release, then the state formats it writes and reads
/// (docs/upgrades.md).
fn version() -> &'static str {
    let s = format!(
        "{}\n{}",
        env!("CARGO_PKG_VERSION"),
        cuslice_state::formats::describe()
    );
    // Once per process, for clap, which takes a 'static string.
    Box::leak(s.into_boxed_str())
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().version(version()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            match e {
                Failure::Refused(_) => ExitCode::from(2),
                Failure::Failed(_) => ExitCode::from(1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn set_takes_values_with_a_leading_hyphen_for_its_own_check() {
        let cli = Cli::try_parse_from([
            "cuslice",
            "set",
            "web",
            "--memory-limit",
            "-1",
            "--core-limit",
            "-5",
            "--core-request",
            "-1",
            "--priority",
            "-high",
        ])
        .expect("parse");
        let Command::Set(a) = cli.command else {
            panic!("not set: {cli:?}");
        };
        assert_eq!(
            (a.memory_limit, a.core_limit, a.core_request, a.priority),
            (
                Some("-1".into()),
                Some("-5".into()),
                Some("-1".into()),
                Some("-high".into())
            )
        );
    }

    #[test]
    fn engines_repeat_or_comma() {
        let cli = Cli::try_parse_from([
            "cuslice",
            "install",
            "--engine",
            "docker,podman",
            "--engine",
            "cri-o",
            "--engine",
            "docker",
        ])
        .expect("parse");
        let o = options(cli.command).expect("options");
        assert_eq!(o.engines, [Engine::Docker, Engine::Podman, Engine::Crio]);
        assert!(Cli::try_parse_from(["cuslice", "install", "--engine", "lxc"]).is_err());
        assert!(Cli::try_parse_from(["cuslice", "install"]).is_err());
    }

    #[test]
    fn config_needs_one_engine() {
        let cli = Cli::try_parse_from([
            "cuslice",
            "install",
            "--engine",
            "docker,cdi",
            "--config",
            "/etc/x",
        ])
        .expect("parse");
        let e = options(cli.command).expect_err("two engines");
        assert!(e.to_string().contains("names one engine's file"), "{e}");
    }
}
