//! `install` and `uninstall`: read every file involved, compute every change with the pure
//! transforms (refusing before anything is written), then show the changes (`--dry-run`) or
//! write them, each atomically.
//!
//! This file: the options, the plan's types, the engines' registrations and the order of the
//! changes; `files`: the installed files; `agent`: the node agent's systemd unit; `slurm`: Slurm's
//! plugstack line and the checks before it; `notes`: what to tell the user afterwards; `apply`:
//! the dry run and the writing.

mod agent;
mod apply;
mod files;
mod notes;
pub mod slurm;

use std::path::{Path, PathBuf};

use crate::fsio;
use crate::layout::{Layout, STAGES};
use crate::problem::Problem;
use crate::transform::{containerd, docker, owned};

pub use apply::{apply, render_dry_run};

use agent::agent;
use files::{install_files, uninstall_files};
use notes::{cdi_notes, containerd_notes, crio_notes, docker_notes, podman_notes};

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
    /// Slurm: the SPANK plugin cuslice_spank.so, loaded by a line in plugstack.conf
    Slurm,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Containerd => "containerd",
            Engine::Podman => "podman",
            Engine::Crio => "crio",
            Engine::Cdi => "cdi",
            Engine::Slurm => "slurm",
        }
    }

    pub const ALL: [Engine; 6] = [
        Engine::Docker,
        Engine::Containerd,
        Engine::Podman,
        Engine::Crio,
        Engine::Cdi,
        Engine::Slurm,
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
            Engine::Slurm => config_changes.push(slurm::registration(&cx, plan)?),
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
                uninstall_files(cx, true)?
            } else {
                // The SPANK plugin serves Slurm alone: it goes with Slurm's registration.
                let plugin = if o.engines.contains(&Engine::Slurm) {
                    uninstall_files(cx, false)?
                } else {
                    Vec::new()
                };
                plan.warnings.push(format!(
                    "kept the files under {}: cuslice is still registered with {}; uninstall \
                     those engines too to remove them",
                    o.layout.prefix(),
                    elsewhere.join(", ")
                ));
                plugin
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
        Engine::Slurm => slurm::registered(o),
    }
}

#[cfg(test)]
mod tests;
