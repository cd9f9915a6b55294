//! `install` and `uninstall`: read every file involved, compute every change with the pure
//! transforms (refusing before anything is written), then show the changes (`--dry-run`) or
//! write them, each atomically.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use cuslice_state::fsio::Durability;

use crate::fsio;
use crate::layout::{BINARIES, LIBRARIES, Layout, STAGES, SYSTEMD_RUNNING};
use crate::problem::Problem;
use crate::strip;
use crate::transform::{containerd, docker, owned};

/// The container engines cuslice registers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Engine {
    /// daemon.json `runtimes` (the cuslice-runtime wrapper)
    Docker,
    /// a CRI runtime in a conf.d drop-in that config.toml imports
    Containerd,
    /// OCI hook descriptors in hooks.d
    Podman,
    /// a CRI-O runtime handler in crio.conf.d
    #[value(alias = "cri-o")]
    Crio,
    /// a CDI spec in /etc/cdi
    Cdi,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Containerd => "containerd",
            Engine::Podman => "podman",
            Engine::Crio => "crio",
            Engine::Cdi => "cdi",
        }
    }

    pub const ALL: [Engine; 5] = [
        Engine::Docker,
        Engine::Containerd,
        Engine::Podman,
        Engine::Crio,
        Engine::Cdi,
    ];
}

/// Default configuration paths on the target system.
pub const DOCKER_CONFIG: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
pub const CRIO_DIR: &str = "/etc/crio/crio.conf.d";
pub const CDI_DIR: &str = "/etc/cdi";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    Install,
    Uninstall,
}

impl Cmd {
    fn word(self) -> &'static str {
        match self {
            Cmd::Install => "install",
            Cmd::Uninstall => "uninstall",
        }
    }
}

/// Everything the command line says.
#[derive(Debug, Clone)]
pub struct Options {
    pub cmd: Cmd,
    pub engines: Vec<Engine>,
    pub layout: Layout,
    /// The target system's root on this machine (absolute).
    pub root: PathBuf,
    /// `--config`, as a path on the target system.
    pub config: Option<String>,
    /// `--from` (install), on this machine.
    pub from: Option<PathBuf>,
    pub default_runtime: bool,
    pub keep_files: bool,
    /// install: also install and start the node agent (`--no-agent` turns it off).
    pub agent: bool,
    pub dry_run: bool,
}

/// Why the command stopped.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A configuration or a source cuslice will not touch: nothing was written (exit 2).
    #[error("{0}")]
    Refused(String),
    /// An operation failed (exit 1).
    #[error("{0}")]
    Failed(String),
}

/// A file found on the target: its real path, its bytes (None when missing), its mode.
type Found = (PathBuf, Option<Vec<u8>>, Option<u32>);

/// One file's change.
#[derive(Debug, Clone)]
pub struct Change {
    /// The file on this machine (under `--root`).
    pub path: PathBuf,
    pub old: Option<Vec<u8>>,
    pub old_mode: Option<u32>,
    /// None: the file is to be removed.
    pub new: Option<Vec<u8>>,
    /// Permission bits for a new file (an edited configuration keeps its own unless `force_mode`).
    pub mode: u32,
    pub force_mode: bool,
    /// A text file (shown as a diff) rather than an installed binary.
    pub text: bool,
    /// Where an installed file is copied from.
    pub source: Option<PathBuf>,
}

impl Change {
    pub fn is_noop(&self) -> bool {
        self.old == self.new
            && (!self.force_mode || self.new.is_none() || self.old_mode == Some(self.mode))
    }
}

/// All the changes, in the order they are applied, and what to tell the user afterwards.
#[derive(Debug, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Said in a dry run too: what the plan leaves out on purpose.
    pub warnings: Vec<String>,
    /// Said after the changes are written: how to make engines use them.
    pub notes: Vec<String>,
    /// systemctl commands (arguments after `systemctl`) run before the changes are written...
    pub before: Vec<Vec<String>>,
    /// ...and after.
    pub after: Vec<Vec<String>>,
}

struct Ctx<'a> {
    o: &'a Options,
}

impl Ctx<'_> {
    fn refuse(&self, path: &Path, p: Problem) -> Failure {
        Failure::Refused(format!(
            "cuslice {}: {}: {p}",
            self.o.cmd.word(),
            path.display()
        ))
    }

    fn failed(&self, path: &Path, what: &str, e: &std::io::Error) -> Failure {
        Failure::Failed(format!(
            "cuslice {}: {}: {what}: {e}; check the path and permissions (run as root for system \
             paths, or use --root DIR)",
            self.o.cmd.word(),
            path.display()
        ))
    }

    /// A configuration file on the target system: its real path (links followed), its text
    /// (None when missing) and its mode.
    fn read_text(&self, target: &str) -> Result<(PathBuf, Option<String>, Option<u32>), Failure> {
        let path = fsio::resolve(&self.o.root, target);
        if path.is_dir() {
            return Err(self.refuse(
                &path,
                Problem::new(
                    "is a directory, not a file",
                    "give the file with --config, or move the directory away",
                ),
            ));
        }
        match fsio::read(&path) {
            Ok(None) => Ok((path, None, None)),
            Ok(Some((bytes, mode))) => match String::from_utf8(bytes) {
                Ok(s) => Ok((path, Some(s), Some(mode))),
                Err(e) => Err(self.refuse(
                    &path,
                    Problem::new(
                        format!(
                            "not UTF-8 text (byte {} is invalid)",
                            e.utf8_error().valid_up_to()
                        ),
                        "fix or move the file, then run again",
                    ),
                )),
            },
            Err(e) => Err(self.failed(&path, "cannot read it", &e)),
        }
    }

    /// A change to a configuration file cuslice edits (keeps the file's mode).
    fn text_change(
        path: PathBuf,
        old: Option<String>,
        old_mode: Option<u32>,
        new: Option<String>,
    ) -> Change {
        Change {
            path,
            old: old.map(String::into_bytes),
            old_mode,
            new: new.map(String::into_bytes),
            mode: old_mode.unwrap_or(0o644),
            force_mode: false,
            text: true,
            source: None,
        }
    }

    /// A file cuslice owns: written whole on install, removed on uninstall.
    fn owned(&self, target: &str, contents: &str) -> Result<Change, Failure> {
        let (path, old, mode) = self.read_text_lenient(target)?;
        let new = match self.o.cmd {
            Cmd::Install => Some(contents.as_bytes().to_vec()),
            Cmd::Uninstall => None,
        };
        Ok(Change {
            path,
            old,
            old_mode: mode,
            new,
            mode: mode.unwrap_or(0o644),
            force_mode: false,
            text: true,
            source: None,
        })
    }

    /// Like `read_text` but keeps bytes that are not UTF-8 (a file cuslice owns is replaced or
    /// removed whole, whatever it holds).
    fn read_text_lenient(&self, target: &str) -> Result<Found, Failure> {
        let path = fsio::resolve(&self.o.root, target);
        if path.is_dir() {
            return Err(self.refuse(
                &path,
                Problem::new(
                    "is a directory, not a file",
                    "move the directory away, or give another path with --config",
                ),
            ));
        }
        match fsio::read(&path) {
            Ok(None) => Ok((path, None, None)),
            Ok(Some((b, m))) => Ok((path, Some(b), Some(m))),
            Err(e) => Err(self.failed(&path, "cannot read it", &e)),
        }
    }

    fn config_or(&self, default: &str) -> String {
        self.o.config.clone().unwrap_or_else(|| default.to_owned())
    }
}

fn parent_of(target: &str) -> String {
    match target.trim_end_matches('/').rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => target[..i].to_owned(),
    }
}

fn join(dir: &str, file: &str) -> String {
    format!("{}/{file}", dir.trim_end_matches('/'))
}

/// Target paths of the containerd files: (main config, drop-in).
pub fn containerd_paths(config: &str, name: &str) -> (String, String) {
    let dir = parent_of(config);
    let dropin = join(&join(&dir, "conf.d"), &format!("{name}.toml"));
    (config.to_owned(), dropin)
}

/// Computes every change; refuses (touching nothing) if any file is unusable.
pub fn plan(o: &Options) -> Result<Plan, Failure> {
    let cx = Ctx { o };
    let mut plan = Plan::default();
    let config_changes = registrations(o, &mut plan)?;
    finish(&cx, config_changes, plan)
}

/// The engines' configuration changes alone (no installed files, no agent): what `doctor`
/// compares, and the first part of `plan`. Notes go to `plan`.
pub fn registrations(o: &Options, plan: &mut Plan) -> Result<Vec<Change>, Failure> {
    let cx = Ctx { o };
    let l = &o.layout;
    let mut config_changes: Vec<Change> = Vec::new();
    let runtime_path = l.runtime_path();

    for &engine in &o.engines {
        match engine {
            Engine::Docker => {
                let target = cx.config_or(DOCKER_CONFIG);
                let (path, old, mode) = cx.read_text(&target)?;
                let d = docker::Docker {
                    name: l.name(),
                    runtime_path: &runtime_path,
                    default_runtime: o.default_runtime,
                };
                let new = match o.cmd {
                    Cmd::Install => {
                        Some(docker::install(old.as_deref(), &d).map_err(|p| cx.refuse(&path, p))?)
                    }
                    Cmd::Uninstall => {
                        docker::uninstall(old.as_deref(), &d).map_err(|p| cx.refuse(&path, p))?
                    }
                };
                config_changes.push(Ctx::text_change(path, old, mode, new));
                plan.notes.extend(docker_notes(o, &target));
            }
            Engine::Containerd => {
                let (main_target, dropin_target) =
                    containerd_paths(&cx.config_or(CONTAINERD_CONFIG), l.name());
                let config_dir = parent_of(&main_target);
                let c = containerd::Containerd {
                    name: l.name(),
                    runtime_path: &runtime_path,
                    dropin_path: &dropin_target,
                    config_dir: &config_dir,
                };
                let (path, old, mode) = cx.read_text(&main_target)?;
                match o.cmd {
                    Cmd::Install => {
                        let done = containerd::install(old.as_deref(), &c)
                            .map_err(|p| cx.refuse(&path, p))?;
                        config_changes.push(cx.owned(&dropin_target, &done.dropin)?);
                        config_changes.push(Ctx::text_change(path, old, mode, Some(done.main)));
                        plan.notes.extend(containerd_notes(o, done.version));
                    }
                    Cmd::Uninstall => {
                        let new = containerd::uninstall(old.as_deref(), &c)
                            .map_err(|p| cx.refuse(&path, p))?;
                        config_changes.push(Ctx::text_change(path, old, mode, new));
                        config_changes.push(cx.owned(&dropin_target, "")?);
                        plan.notes.extend(containerd_notes(o, 2));
                    }
                }
            }
            Engine::Podman => {
                let dir = cx.config_or(HOOKS_DIR);
                for (file, text) in owned::podman_hooks(l) {
                    config_changes.push(cx.owned(&join(&dir, &file), &text)?);
                }
                plan.notes.extend(podman_notes(o, &dir));
            }
            Engine::Crio => {
                let target = cx.config_or(&join(CRIO_DIR, &owned::crio_file(l.name())));
                config_changes.push(cx.owned(&target, &owned::crio_dropin(l))?);
                plan.notes.extend(crio_notes(o));
            }
            Engine::Cdi => {
                let target = cx.config_or(&join(CDI_DIR, &owned::cdi_file(l.name())));
                config_changes.push(cx.owned(&target, &owned::cdi_spec(l))?);
                plan.notes.extend(cdi_notes(o));
            }
        }
    }
    Ok(config_changes)
}

fn finish(cx: &Ctx<'_>, mut config_changes: Vec<Change>, mut plan: Plan) -> Result<Plan, Failure> {
    let o = cx.o;
    let files = match o.cmd {
        Cmd::Install => install_files(cx, &mut plan.warnings)?,
        Cmd::Uninstall if o.keep_files => Vec::new(),
        Cmd::Uninstall => {
            let elsewhere = still_registered(o);
            if elsewhere.is_empty() {
                uninstall_files(cx)?
            } else {
                plan.warnings.push(format!(
                    "kept the files under {}: cuslice is still registered with {}; uninstall \
                     those engines too to remove them",
                    o.layout.prefix(),
                    elsewhere.join(", ")
                ));
                Vec::new()
            }
        }
    };
    config_changes.extend(agent(cx, &files, &mut plan)?);
    // Install: binaries before the configuration that names them; uninstall: the reverse.
    match o.cmd {
        Cmd::Install => {
            plan.changes.extend(files);
            plan.changes.extend(config_changes);
        }
        Cmd::Uninstall => {
            plan.changes.extend(config_changes);
            plan.changes.extend(files);
        }
    }
    Ok(plan)
}

/// What systemctl runs for the agent's unit, on a live system that runs systemd: (before the
/// files are written, after). `existed`: the unit was there before; `changed`: its text changes;
/// `cli_changed`: the `cuslice` binary it runs is replaced.
pub fn agent_commands(
    cmd: Cmd,
    unit: &str,
    existed: bool,
    changed: bool,
    cli_changed: bool,
) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    match cmd {
        Cmd::Install => {
            let mut after = Vec::new();
            if changed {
                after.push(v(&["daemon-reload"]));
            }
            after.push(v(&["enable", "--now", unit]));
            // A running agent keeps the old binary and unit until it restarts.
            if existed && (changed || cli_changed) {
                after.push(v(&["restart", unit]));
            }
            (Vec::new(), after)
        }
        Cmd::Uninstall if existed => (
            vec![v(&["disable", "--now", unit])],
            vec![v(&["daemon-reload"])],
        ),
        Cmd::Uninstall => (Vec::new(), Vec::new()),
    }
}

/// The node agent's systemd unit (`cuslice install` installs and starts it unless
/// `--no-agent`; uninstall stops and removes it with the last engine's registration).
fn agent(cx: &Ctx<'_>, files: &[Change], plan: &mut Plan) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let l = &o.layout;
    if o.cmd == Cmd::Install && !o.agent {
        return Ok(Vec::new());
    }
    let unit = l.agent_unit();
    let cli = l.cli_path();
    let systemd = fsio::host(&o.root, SYSTEMD_RUNNING).is_dir();
    let live = o.root.canonicalize().is_ok_and(|r| r == Path::new("/"));
    let (path, old, mode) = cx.read_text_lenient(&l.agent_unit_path())?;
    let runs = old
        .as_deref()
        .and_then(|b| owned::unit_exec(&String::from_utf8_lossy(b)));
    let foreign = runs.filter(|p| *p != cli);
    let under_root = if live {
        String::new()
    } else {
        format!(" under --root {}", o.root.display())
    };
    let mut changes = Vec::new();
    match o.cmd {
        Cmd::Install => {
            if let Some(other) = foreign {
                return Err(cx.refuse(
                    &path,
                    Problem::new(
                        format!("the agent's unit already runs {other}, not {cli}"),
                        "one agent serves a node: uninstall the other installation first (with its --prefix), or add --no-agent",
                    ),
                ));
            }
            if !systemd && old.is_none() {
                plan.warnings.push(format!(
                    "agent: systemd does not run this system (no {SYSTEMD_RUNNING}{under_root}), so no unit was installed: start `{cli} agent` as root at boot with the init system you use, and restart it when it exits (docs/agent.md, \"Installing it as a service\")"
                ));
                return Ok(changes);
            }
            let change = Change {
                path,
                old,
                old_mode: mode,
                new: Some(owned::agent_unit(l).into_bytes()),
                mode: 0o644,
                force_mode: false,
                text: true,
                source: None,
            };
            let cli_target = fsio::host(&o.root, &cli);
            let cli_changed = files
                .iter()
                .any(|c| c.path == cli_target && c.old.is_some() && !c.is_noop());
            if live && systemd {
                let (before, after) = agent_commands(
                    o.cmd,
                    &unit,
                    change.old.is_some(),
                    !change.is_noop(),
                    cli_changed,
                );
                plan.before.extend(before);
                plan.after.extend(after);
            } else if systemd {
                plan.warnings.push(format!(
                    "agent: systemctl not run{under_root}; on the target system run: systemctl daemon-reload && systemctl enable --now {unit}"
                ));
            } else {
                plan.warnings.push(format!(
                    "agent: systemd does not run this system (no {SYSTEMD_RUNNING}{under_root}): {unit} is up to date, but nothing starts it"
                ));
            }
            changes.push(change);
        }
        Cmd::Uninstall => {
            if old.is_none() {
                return Ok(changes);
            }
            if let Some(other) = foreign {
                plan.warnings.push(format!(
                    "kept {}: it runs {other}, not {cli}; uninstall with the --prefix it was installed with",
                    path.display()
                ));
                return Ok(changes);
            }
            let elsewhere = still_registered(o);
            if !elsewhere.is_empty() {
                plan.warnings.push(format!(
                    "kept the agent ({unit}): cuslice is still registered with {}",
                    elsewhere.join(", ")
                ));
                return Ok(changes);
            }
            if live && systemd {
                let (before, after) = agent_commands(o.cmd, &unit, true, true, false);
                plan.before.extend(before);
                plan.after.extend(after);
            } else {
                // What `systemctl disable` would remove: the link that starts it at boot.
                let link = fsio::host(&o.root, &l.agent_wants_link());
                if let Ok(target) = std::fs::read_link(&link) {
                    changes.push(Change {
                        path: link,
                        old: Some(target.as_os_str().as_encoded_bytes().to_vec()),
                        old_mode: None,
                        new: None,
                        mode: 0o777,
                        force_mode: false,
                        text: false,
                        source: None,
                    });
                }
                if systemd {
                    plan.warnings.push(format!(
                        "agent: systemctl not run{under_root}; on the target system run: systemctl stop {unit} && systemctl daemon-reload"
                    ));
                }
            }
            changes.push(Change {
                path,
                old,
                old_mode: mode,
                new: None,
                mode: 0o644,
                force_mode: false,
                text: true,
                source: None,
            });
        }
    }
    Ok(changes)
}

/// Runs `systemctl ARGS`; Err: one line saying what failed.
fn systemctl(o: &Options, args: &[String]) -> Result<(), Failure> {
    let shown = format!("systemctl {}", args.join(" "));
    let fail = |why: String| {
        Failure::Failed(format!(
            "cuslice {}: `{shown}` failed: {why}; the files listed above were written; fix that and run `{shown}` yourself, or run the command again",
            o.cmd.word()
        ))
    };
    let out = std::process::Command::new("systemctl")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot run it ({e})")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{} ({})",
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr)),
            out.status
        )))
    }
}

/// The installed files: (file name in --from, target path, mode). Each also gets its debug
/// info beside it where the source has some (`strip`).
fn artefacts(l: &Layout) -> Vec<(&'static str, String, u32)> {
    let bins = BINARIES.iter().map(|&b| (b, l.bin(b), 0o755));
    let libs = LIBRARIES.iter().map(|&f| (f, l.lib(f), 0o644));
    bins.chain(libs).collect()
}

fn install_files(cx: &Ctx<'_>, warnings: &mut Vec<String>) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let from = match &o.from {
        Some(f) => f.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .ok_or_else(|| {
                Failure::Failed(
                    "cuslice install: cannot tell where this executable lives; pass --from DIR"
                        .to_owned(),
                )
            })?,
    };
    // The library sits next to the binaries in a build (target/release) or in an image, and in
    // PREFIX/lib/cuslice next to PREFIX/bin once installed.
    let source = |file: &str| -> PathBuf {
        let direct = from.join(file);
        if LIBRARIES.contains(&file) && !direct.is_file() {
            let installed = from.join("../lib/cuslice").join(file);
            if installed.is_file() {
                return installed;
            }
        }
        direct
    };
    let missing: Vec<String> = artefacts(&o.layout)
        .iter()
        .map(|(f, _, _)| source(f))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Failure::Refused(format!(
            "cuslice install: {}: missing; build with `cargo build --release` (target/release \
             then holds cuslice-hook, cuslice-runtime, cuslice, libcuslice.so and \
             libcuslice_core.so) or pass --from DIR with those five files",
            missing.join(", ")
        )));
    }
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for (file, target, mode) in artefacts(&o.layout) {
        let src = source(file);
        let (split, why) = strip::split(&src, file)
            .map_err(|e| Failure::Failed(format!("cuslice {}: {e}", o.cmd.word())))?;
        match why {
            Some(strip::Kept::NoObjcopy) => kept.push(file.to_owned()),
            Some(strip::Kept::Failed(e)) => {
                warnings.push(format!("{file}: installed with its debug info ({e})"))
            }
            None => {}
        }
        let debug = split.debug.map(|d| (strip::debug_path(&target), d, 0o644));
        for (target, bytes, mode) in [(target, split.file, mode)].into_iter().chain(debug) {
            let path = fsio::host(&o.root, &target);
            let (old, old_mode) = match fsio::read(&path) {
                Ok(Some((b, m))) => (Some(b), Some(m)),
                Ok(None) => (None, None),
                Err(e) => return Err(cx.failed(&path, "cannot read it", &e)),
            };
            out.push(Change {
                path,
                old,
                old_mode,
                new: Some(bytes),
                mode,
                force_mode: true,
                text: false,
                source: Some(src.clone()),
            });
        }
    }
    if !kept.is_empty() {
        warnings.push(format!(
            "{}: installed with their debug info: objcopy (binutils) is not on PATH; install \
             binutils and run the command again to install them stripped, with the debug info \
             in .debug/ beside them",
            kept.join(", ")
        ));
    }
    Ok(out)
}

fn uninstall_files(cx: &Ctx<'_>) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let mut out = Vec::new();
    // Each file, and its debug info where install put some beside it.
    let files = artefacts(&o.layout)
        .into_iter()
        .flat_map(|(_, target, mode)| {
            let debug = strip::debug_path(&target);
            [(target, mode, true), (debug, 0o644, false)]
        });
    for (target, mode, always) in files {
        let path = fsio::host(&o.root, &target);
        if !always && std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let (old, old_mode) = match std::fs::symlink_metadata(&path) {
            Err(_) => (None, None),
            // Not read: only whether it is there matters.
            Ok(m) => (
                Some(Vec::new()),
                Some(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777),
            ),
        };
        out.push(Change {
            path,
            old,
            old_mode,
            new: None,
            mode,
            force_mode: true,
            text: false,
            source: None,
        });
    }
    Ok(out)
}

/// Engines not being uninstalled whose registration (at its default place, under this name)
/// still names these files: the files stay then.
fn still_registered(o: &Options) -> Vec<String> {
    let mut found = Vec::new();
    for engine in Engine::ALL {
        if o.engines.contains(&engine) {
            continue;
        }
        if registered(o, engine) {
            found.push(engine.name().to_owned());
        }
    }
    found
}

/// Whether `engine`'s registration under this name, at its default place, names these files
/// (however out of date the rest of it is).
pub fn registered(o: &Options, engine: Engine) -> bool {
    let l = &o.layout;
    let exists = |target: &str| fsio::resolve(&o.root, target).exists();
    match engine {
        Engine::Docker => {
            let path = fsio::resolve(&o.root, DOCKER_CONFIG);
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| {
                    v.get("runtimes")?
                        .get(l.name())?
                        .get("path")?
                        .as_str()
                        .map(|p| p == l.runtime_path())
                })
                .unwrap_or(false)
        }
        Engine::Containerd => exists(&containerd_paths(CONTAINERD_CONFIG, l.name()).1),
        Engine::Podman => STAGES
            .iter()
            .any(|s| exists(&join(HOOKS_DIR, &owned::podman_hook_file(l.name(), s)))),
        Engine::Crio => exists(&join(CRIO_DIR, &owned::crio_file(l.name()))),
        Engine::Cdi => exists(&join(CDI_DIR, &owned::cdi_file(l.name()))),
    }
}

fn docker_notes(o: &Options, target: &str) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => {
            let mut v = vec![
                "docker: make dockerd read the runtime (it reloads runtimes on SIGHUP): kill -HUP $(pidof dockerd)".to_owned(),
                format!("docker: use it: docker run --runtime={n} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."),
            ];
            if o.default_runtime {
                v.push(format!(
                    "docker: default-runtime is {n}: every container runs through it, --runtime=runc opts out"
                ));
            }
            if target != DOCKER_CONFIG {
                v.push(format!(
                    "docker: dockerd reads {target} only when started with --config-file {target}"
                ));
            }
            v
        }
        Cmd::Uninstall => vec![format!(
            "docker: restart dockerd to drop the runtime: systemctl restart docker (on SIGHUP dockerd keeps a runtime or default-runtime that is no longer in daemon.json; containers running with --runtime={n} keep it until they stop)"
        )],
    }
}

fn containerd_notes(o: &Options, _version: i64) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => vec![
            "containerd: restart it to load the drop-in: systemctl restart containerd".to_owned(),
            format!(
                "containerd: Kubernetes: a RuntimeClass with handler {n} (install/kubernetes/runtimeclass.yaml), then runtimeClassName: {n} and env CUSLICE_MEMORY_LIMIT in the pod"
            ),
            format!(
                "containerd: ctr: ctr run --runc-binary {} --env CUSLICE_MEMORY_LIMIT=8GiB IMAGE ID",
                o.layout.runtime_path()
            ),
        ],
        Cmd::Uninstall => {
            vec![
                "containerd: restart it to drop the runtime: systemctl restart containerd"
                    .to_owned(),
            ]
        }
    }
}

fn podman_notes(o: &Options, dir: &str) -> Vec<String> {
    match o.cmd {
        Cmd::Install => {
            let mut v = vec![
                "podman: nothing to restart: podman reads hooks.d at every run".to_owned(),
                "podman: use it: podman run -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ...".to_owned(),
            ];
            if dir != HOOKS_DIR {
                v.push(format!(
                    "podman: {dir} is not a default hooks directory: pass --hooks-dir {dir} (or set hooks_dir in containers.conf)"
                ));
            }
            v
        }
        Cmd::Uninstall => Vec::new(),
    }
}

fn crio_notes(o: &Options) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => vec![
            "crio: restart it to load the handler: systemctl restart crio".to_owned(),
            format!(
                "crio: Kubernetes: a RuntimeClass with handler {n}, then runtimeClassName: {n} and env CUSLICE_MEMORY_LIMIT in the pod"
            ),
        ],
        Cmd::Uninstall => {
            vec!["crio: restart it to drop the handler: systemctl restart crio".to_owned()]
        }
    }
}

fn cdi_notes(o: &Options) -> Vec<String> {
    let device = format!("{}={}", owned::CDI_KIND, owned::cdi_device(o.layout.name()));
    match o.cmd {
        Cmd::Install => vec![
            format!("cdi: podman run --device {device} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."),
            format!(
                "cdi: Docker >= 25 with the cdi feature (\"features\": {{\"cdi\": true}} in daemon.json): docker run --device {device} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."
            ),
            format!(
                "cdi: containerd >= 1.7 with enable_cdi = true in its CRI config: the device {device} is requested through a device plugin or the annotation cdi.k8s.io/..."
            ),
        ],
        Cmd::Uninstall => Vec::new(),
    }
}

/// The unified diff of one text change.
pub fn diff(c: &Change) -> String {
    let name = c.path.display().to_string();
    let old = String::from_utf8_lossy(c.old.as_deref().unwrap_or_default()).into_owned();
    let new = String::from_utf8_lossy(c.new.as_deref().unwrap_or_default()).into_owned();
    let a = if c.old.is_some() {
        name.clone()
    } else {
        "/dev/null".to_owned()
    };
    let b = if c.new.is_some() {
        name
    } else {
        "/dev/null".to_owned()
    };
    similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

/// What `--dry-run` prints.
pub fn render_dry_run(plan: &Plan) -> String {
    let mut out = String::new();
    for args in &plan.before {
        let _ = writeln!(out, "would run: systemctl {}", args.join(" "));
    }
    for c in &plan.changes {
        let p = c.path.display();
        if c.is_noop() {
            let _ = writeln!(out, "{p}: no change");
        } else if c.text {
            out.push_str(&diff(c));
        } else {
            match (&c.new, &c.source) {
                (Some(bytes), src) => {
                    let verb = if c.old.is_some() {
                        "replace"
                    } else {
                        "install"
                    };
                    let from = src
                        .as_ref()
                        .map(|s| format!(" from {}", s.display()))
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "{p}: would {verb}{from} ({} bytes, mode {:04o})",
                        bytes.len(),
                        c.mode
                    );
                }
                (None, _) => {
                    let _ = writeln!(out, "{p}: would remove");
                }
            }
        }
    }
    for args in &plan.after {
        let _ = writeln!(out, "would run: systemctl {}", args.join(" "));
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "{w}");
    }
    out.push_str("dry run: nothing written\n");
    out
}

/// Writes the plan; returns the lines to print.
pub fn apply(o: &Options, plan: &Plan) -> Result<String, Failure> {
    let mut out = String::new();
    let mut changed = 0;
    for args in &plan.before {
        systemctl(o, args)?;
        let _ = writeln!(out, "systemctl {}: done", args.join(" "));
    }
    for c in &plan.changes {
        let p = c.path.display();
        if c.is_noop() {
            let what = match o.cmd {
                Cmd::Install => "already installed, no change",
                Cmd::Uninstall => "no change",
            };
            if c.old.is_some() || c.new.is_some() {
                let _ = writeln!(out, "{p}: {what}");
            }
            continue;
        }
        changed += 1;
        match &c.new {
            Some(bytes) => {
                let mode = if c.force_mode {
                    c.mode
                } else {
                    c.old_mode.unwrap_or(c.mode)
                };
                let written = fsio::make_parent(&c.path).and_then(|()| {
                    cuslice_state::fsio::write_atomic(&c.path, bytes, mode, Durability::Full)
                });
                written.map_err(|e| {
                    Failure::Failed(format!(
                        "cuslice {}: {p}: cannot write it: {e}; {} (files listed above were \
                         already written; running the command again is safe)",
                        o.cmd.word(),
                        "check the permissions (run as root for system paths, or use --root DIR)"
                    ))
                })?;
                let verb = match (&c.old, &c.source) {
                    (_, Some(src)) => format!("installed (from {})", src.display()),
                    (None, None) => "created".to_owned(),
                    (Some(_), None) => "updated".to_owned(),
                };
                let _ = writeln!(out, "{p}: {verb}");
            }
            None => {
                fsio::remove(&c.path).map_err(|e| {
                    Failure::Failed(format!(
                        "cuslice {}: {p}: cannot remove it: {e}; check the permissions (files \
                         listed above were already changed; running the command again is safe)",
                        o.cmd.word()
                    ))
                })?;
                let _ = writeln!(out, "{p}: removed");
                // The debug info's directory goes with its last file.
                if let Some(dir) = c.path.parent().filter(|d| d.ends_with(strip::DEBUG_DIR)) {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }
    for args in &plan.after {
        // Failing here leaves the files written; the message says what to run.
        if let Err(e) = systemctl(o, args) {
            print!("{out}");
            return Err(e);
        }
        let _ = writeln!(out, "systemctl {}: done", args.join(" "));
    }
    let engines: Vec<&str> = o.engines.iter().map(|e| e.name()).collect();
    if changed == 0 {
        let _ = writeln!(
            out,
            "{}: nothing to do for {}",
            match o.cmd {
                Cmd::Install => "already installed",
                Cmd::Uninstall => "not installed",
            },
            engines.join(", ")
        );
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "{w}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_dropin_sits_next_to_the_config() {
        assert_eq!(
            containerd_paths("/etc/containerd/config.toml", "cuslice"),
            (
                "/etc/containerd/config.toml".to_owned(),
                "/etc/containerd/conf.d/cuslice.toml".to_owned()
            )
        );
        assert_eq!(
            containerd_paths("/config.toml", "x").1,
            "/conf.d/x.toml".to_owned()
        );
    }

    #[test]
    fn noop_detection() {
        let mut c = Change {
            path: "/x".into(),
            old: Some(b"a".to_vec()),
            old_mode: Some(0o644),
            new: Some(b"a".to_vec()),
            mode: 0o755,
            force_mode: true,
            text: false,
            source: None,
        };
        assert!(!c.is_noop(), "mode differs");
        c.old_mode = Some(0o755);
        assert!(c.is_noop());
        c.new = None;
        assert!(!c.is_noop());
        c.old = None;
        assert!(c.is_noop());
    }

    #[test]
    fn diffs_name_the_file() {
        let c = Change {
            path: "/etc/f".into(),
            old: None,
            old_mode: None,
            new: Some(b"a\n".to_vec()),
            mode: 0o644,
            force_mode: false,
            text: true,
            source: None,
        };
        let d = diff(&c);
        assert!(d.starts_with("--- /dev/null\n+++ /etc/f\n"), "{d}");
        assert!(d.contains("+a\n"));
    }

    #[test]
    fn agent_systemctl_commands() {
        let run = |cmd, existed, changed, cli| {
            let (before, after) = agent_commands(cmd, "a.service", existed, changed, cli);
            let show = |v: Vec<Vec<String>>| v.iter().map(|a| a.join(" ")).collect::<Vec<_>>();
            (show(before), show(after))
        };
        let none: Vec<String> = Vec::new();
        // First install: load the unit, enable and start it.
        assert_eq!(
            run(Cmd::Install, false, true, false),
            (
                none.clone(),
                vec!["daemon-reload".into(), "enable --now a.service".into()]
            )
        );
        // Nothing changed: enable --now only (a no-op if it is enabled and running).
        assert_eq!(
            run(Cmd::Install, true, false, false),
            (none.clone(), vec!["enable --now a.service".into()])
        );
        // A new binary: the running agent restarts onto it.
        assert_eq!(
            run(Cmd::Install, true, false, true),
            (
                none.clone(),
                vec!["enable --now a.service".into(), "restart a.service".into()]
            )
        );
        // A changed unit: reloaded, then restarted.
        assert_eq!(
            run(Cmd::Install, true, true, false),
            (
                none.clone(),
                vec![
                    "daemon-reload".into(),
                    "enable --now a.service".into(),
                    "restart a.service".into()
                ]
            )
        );
        // Uninstall: stopped and disabled while its file is there, reloaded once it is gone.
        assert_eq!(
            run(Cmd::Uninstall, true, true, false),
            (
                vec!["disable --now a.service".into()],
                vec!["daemon-reload".into()]
            )
        );
        assert_eq!(
            run(Cmd::Uninstall, false, false, false),
            (none.clone(), none)
        );
    }
}
