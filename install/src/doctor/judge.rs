//! `cuslice doctor`'s judging, pure: the facts gathered from the node in, one item per check out
//! (ok, a note, or a problem with the command that fixes it). No I/O here; `gather` reads.

use cuslice_node::nvml::ProcessSamples;
use serde::Serialize;

use crate::transform::slurm;

/// How an item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not applicable here, or worth knowing; not a problem.
    Note,
    Problem,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Note => "note",
            Status::Problem => "PROBLEM",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What is checked: `nvml`, `gpu 0`, `engine podman`, `file PATH`, `agent`, ...
    pub check: String,
    pub status: Status,
    pub detail: String,
    /// The command (or step) that fixes a problem, or that would apply a note.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Item {
    fn new(check: impl Into<String>, status: Status, detail: impl Into<String>) -> Item {
        Item {
            check: check.into(),
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Item {
        self.fix = Some(fix.into());
        self
    }

    /// `ok      engine podman: registered`, `PROBLEM agent: ...; fix: CMD`.
    pub fn line(&self) -> String {
        let mut s = format!("{:<8}{}: {}", self.status.word(), self.check, self.detail);
        if let Some(f) = &self.fix {
            s.push_str(match self.status {
                Status::Problem => "; fix: ",
                _ => "; command: ",
            });
            s.push_str(f);
        }
        s
    }
}

/// What NVML said about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFacts {
    pub index: u32,
    pub name: String,
    /// `nvmlDeviceGetProcessUtilization`: whether it gives per-process samples, or the error.
    pub samples: Result<ProcessSamples, String>,
    /// `nvmlDeviceGetComputeRunningProcesses`: Ok or the error.
    pub processes: Result<(), String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlFacts {
    pub driver: Result<String, String>,
    pub nvml: Result<String, String>,
    pub gpus: Result<Vec<GpuFacts>, String>,
}

/// One engine's registration: whether one is there, and what `cuslice install --engine E`
/// would change (the files; empty: nothing), or why it cannot tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFacts {
    pub engine: &'static str,
    pub present: bool,
    pub would_change: Result<Vec<String>, String>,
}

/// One installed file: its target path and, when it is there, its version (executables
/// answer `--version`; libraries have none to ask).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    pub path: String,
    pub present: bool,
    /// Its release (`--version` for the hook and the CLI, the release mark for the others);
    /// None: not asked (the file is missing); Some(Err): why it could not be read.
    pub version: Option<Result<String, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentFacts {
    pub socket: String,
    /// Ok: the agent answered: its pid (from the socket's peer credentials) and its version
    /// (`None`: could not be told); Err: why it did not.
    pub answer: Result<(Option<i32>, Option<String>), String>,
    /// The age of its findings file (seconds), and the age past which it is stale.
    pub findings_age: Option<(f64, f64)>,
    /// The agent's systemd unit (for the fix), when installed.
    pub unit: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFacts {
    /// The cgroup v2 mount point, and whether it is the only hierarchy (pure v2).
    pub v2: Option<String>,
    pub pure_v2: bool,
    /// The v1 freezer hierarchy's mount point.
    pub v1_freezer: Option<String>,
    /// A cgroup v2 `cgroup.freeze` was found (this process's cgroup or one beside it).
    pub v2_freeze: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRootFacts {
    pub path: String,
    /// None: it does not exist; Some((tmpfs, free bytes)).
    pub fs: Option<(bool, u64)>,
}

/// Everything `gather` found.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// This `cuslice`'s version.
    pub version: String,
    /// Err: NVML could not be loaded or initialised.
    pub nvml: Result<NvmlFacts, String>,
    pub engines: Vec<EngineFacts>,
    pub files: Vec<FileFacts>,
    /// `cuslice install --engine E` with the engines named (for fixes).
    pub install_command: String,
    pub agent: AgentFacts,
    pub cgroup: CgroupFacts,
    pub state_root: StateRootFacts,
    /// Containers whose init is gone but whose state is kept (ids), or why it cannot tell.
    pub stale: Result<Vec<String>, String>,
    /// The SPANK plugin, where cuslice is registered with Slurm.
    pub slurm: Option<SlurmFacts>,
}

/// The installed SPANK plugin and this node's slurmd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmFacts {
    /// PREFIX/lib/cuslice/cuslice_spank.so (target path).
    pub plugin: String,
    /// Its `plugin_version` (SLURM_VERSION_NUMBER it was built for); Err: missing or unreadable.
    pub version: Result<u32, String>,
    /// `slurmd -V`: None: no slurmd; Err: what it said instead of a release.
    pub slurmd: Option<Result<slurm::Release, String>>,
}

/// The simulated GPU's device name (tests/simgpu).
pub const SIMULATED: &str = "SimGPU (simulated)";
/// Less free space than this under the state root is a problem (each slice takes a few pages).
pub const MIN_FREE: u64 = 16 << 20;

pub fn judge(f: &Facts) -> Vec<Item> {
    let mut out = Vec::new();
    nvml(f, &mut out);
    engines(f, &mut out);
    if let Some(s) = &f.slurm {
        out.push(slurm_plugin(s));
    }
    files(f, &mut out);
    agent(f, &mut out);
    cgroup(&f.cgroup, &mut out);
    state_root(f, &mut out);
    out
}

/// True when no item is a problem (exit 0).
pub fn healthy(items: &[Item]) -> bool {
    items.iter().all(|i| i.status != Status::Problem)
}

fn nvml(f: &Facts, out: &mut Vec<Item>) {
    let n = match &f.nvml {
        Err(e) => {
            out.push(Item::new(
                "nvml",
                Status::Note,
                format!(
                    "no NVML ({e}): no GPU driver on this node, so nothing to slice here; \
                     install the NVIDIA driver on GPU nodes"
                ),
            ));
            return;
        }
        Ok(n) => n,
    };
    let show = |r: &Result<String, String>| match r {
        Ok(v) => v.clone(),
        Err(e) => format!("unknown ({e})"),
    };
    let gpus = match &n.gpus {
        Ok(g) => g,
        Err(e) => {
            out.push(
                Item::new(
                    "nvml",
                    Status::Problem,
                    format!(
                        "driver {}, NVML {}, but its devices cannot be listed: {e}",
                        show(&n.driver),
                        show(&n.nvml)
                    ),
                )
                .fix("check the driver with `nvidia-smi`"),
            );
            return;
        }
    };
    let status = if n.driver.is_ok() {
        Status::Ok
    } else {
        Status::Problem
    };
    let mut item = Item::new(
        "nvml",
        status,
        format!(
            "driver {}, NVML {}, {} GPU{}",
            show(&n.driver),
            show(&n.nvml),
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" }
        ),
    );
    if status == Status::Problem {
        item = item.fix("check the driver with `nvidia-smi`");
    }
    out.push(item);
    if gpus.is_empty() {
        out.push(Item::new(
            "gpu",
            Status::Note,
            "NVML lists no GPU: nothing to slice on this node",
        ));
    }
    if gpus.iter().any(|g| g.name == SIMULATED) {
        out.push(Item::new(
            "gpu",
            Status::Note,
            "the GPU is simgpu's simulated device (a test instrument), not a real one",
        ));
    }
    for g in gpus {
        let check = format!("gpu {}", g.index);
        out.push(meter(&check, g));
        out.push(match &g.processes {
            Ok(()) => Item::new(
                format!("{check} processes"),
                Status::Ok,
                "per-process memory (nvmlDeviceGetComputeRunningProcesses): the agent checks \
                 slices against the driver's count",
            ),
            Err(e) => Item::new(
                format!("{check} processes"),
                Status::Problem,
                format!(
                    "no per-process memory ({e}): the agent cannot check slices against the \
                     driver's count"
                ),
            )
            .fix("update the NVIDIA driver"),
        });
    }
}

/// How compute limits are metered on a GPU: by the slices' turns, whatever the driver gives
/// (docs/compute.md); and what the driver's per-process samples leave the node agent to check
/// slices by. Never a problem: limits and caps hold either way.
fn meter(check: &str, g: &GpuFacts) -> Item {
    let check = format!("{check} meter");
    let turns = "turns (each slice's device time is its turns' spans, timed with nobody else on \
                 the device)";
    match &g.samples {
        Ok(ProcessSamples::Given) => Item::new(
            check,
            Status::Ok,
            format!(
                "{}: {turns}; the driver gives per-process utilisation samples, by which the \
                 node agent checks each slice",
                g.name
            ),
        ),
        Ok(ProcessSamples::NotSupported) => Item::new(
            check,
            Status::Note,
            format!(
                "{}: {turns}; the driver gives no per-process utilisation samples \
                 (nvmlDeviceGetProcessUtilization answers NOT_SUPPORTED, as on MIG instances \
                 and some virtual GPUs): the node agent checks slices by the device's busy time \
                 alone",
                g.name
            ),
        ),
        Err(e) => Item::new(
            check,
            Status::Note,
            format!(
                "{}: {turns}; per-process utilisation cannot be read ({e}): the node agent \
                 checks slices by the device's busy time alone; `nvidia-smi` may say why",
                g.name
            ),
        ),
    }
}

fn engines(f: &Facts, out: &mut Vec<Item>) {
    let mut any = false;
    for e in &f.engines {
        let check = format!("engine {}", e.engine);
        let install = format!("cuslice install --engine {}", e.engine);
        let item = match (&e.would_change, e.present) {
            // Also where cuslice is not registered with E: the engine itself may not start
            // with such a file, or a runtime of cuslice's name runs something else.
            (Err(why), _) => Item::new(
                check,
                Status::Problem,
                format!(
                    "install would refuse: {}",
                    why.strip_prefix("cuslice install: ").unwrap_or(why)
                ),
            )
            .fix(format!("what the refusal says, then {install}")),
            (Ok(files), true) if files.is_empty() => {
                any = true;
                Item::new(check, Status::Ok, "registered")
            }
            (Ok(files), true) => {
                any = true;
                Item::new(
                    check,
                    Status::Problem,
                    format!(
                        "registered, but out of date: install would change {}",
                        files.join(", ")
                    ),
                )
                .fix(install)
            }
            (Ok(_), false) => Item::new(check, Status::Note, "not registered").fix(install),
        };
        out.push(item);
    }
    if !any {
        out.push(
            Item::new(
                "engines",
                Status::Problem,
                "cuslice is registered with no container engine: no container gets a slice",
            )
            .fix("cuslice install --engine docker|containerd|podman|crio|cdi|slurm"),
        );
    }
}

/// The SPANK plugin slurmd loads: there, and built for slurmd's release.
fn slurm_plugin(s: &SlurmFacts) -> Item {
    let check = format!("slurm plugin {}", s.plugin);
    let version = match &s.version {
        Ok(v) => *v,
        Err(e) => {
            return Item::new(
                check,
                Status::Problem,
                format!("{e}; plugstack.conf requires it, so slurmd and srun fail to load it"),
            )
            .fix("cuslice install --engine slurm");
        }
    };
    let node = s.slurmd.as_ref().and_then(|r| r.as_ref().ok().copied());
    if let Err(p) = slurm::version_problem(version, node) {
        return Item::new(check, Status::Problem, p.what).fix(p.fix);
    }
    let built = slurm::show(slurm::release_of(version));
    match &s.slurmd {
        Some(Ok(_)) => Item::new(
            check,
            Status::Ok,
            format!("built for Slurm {built}, this node's slurmd's release"),
        ),
        None => Item::new(
            check,
            Status::Note,
            format!(
                "built for Slurm {built}; no slurmd found to compare (slurmd starts only with a \
                 SPANK plugin of its own release)"
            ),
        ),
        Some(Err(why)) => Item::new(
            check,
            Status::Note,
            format!("built for Slurm {built}; this node's release is unknown ({why})"),
        ),
    }
}

fn files(f: &Facts, out: &mut Vec<Item>) {
    if !f.files.is_empty() && f.files.iter().all(|file| !file.present) {
        let shown: Vec<&str> = f.files.iter().map(|file| file.path.as_str()).collect();
        out.push(
            Item::new(
                "files",
                Status::Problem,
                format!("cuslice is not installed (none of {})", shown.join(", ")),
            )
            .fix(f.install_command.clone()),
        );
        return;
    }
    for file in &f.files {
        let check = format!("file {}", file.path);
        let item = if !file.present {
            Item::new(check, Status::Problem, "missing").fix(f.install_command.clone())
        } else {
            match &file.version {
                None => Item::new(check, Status::Ok, "present"),
                Some(Ok(v)) if *v == f.version => Item::new(check, Status::Ok, v.clone()),
                Some(Ok(v)) => Item::new(
                    check,
                    Status::Problem,
                    format!("version {v}, but this cuslice is {}", f.version),
                )
                .fix(f.install_command.clone()),
                Some(Err(e)) => {
                    Item::new(check, Status::Problem, e.clone()).fix(f.install_command.clone())
                }
            }
        };
        out.push(item);
    }
}

fn agent(f: &Facts, out: &mut Vec<Item>) {
    let a = &f.agent;
    let start = match &a.unit {
        Some(u) => format!("systemctl restart {u}"),
        None => {
            "run `cuslice agent --enforce stop` as root (at boot, with the init system you use)"
                .to_owned()
        }
    };
    const WITHOUT: &str = "container processes other than each container's first cannot learn \
                           their host pids and nothing checks slices against the driver";
    let item =
        match &a.answer {
            Err(e) => Item::new("agent", Status::Problem, format!("{e}: {WITHOUT}")).fix(start),
            Ok((pid, version)) => {
                let who = match pid {
                    Some(p) => format!("running (pid {p}), answers on {}", a.socket),
                    None => format!("running, answers on {}", a.socket),
                };
                match version {
                Some(v) if *v != f.version => Item::new(
                    "agent",
                    Status::Problem,
                    format!("{who}, but it is version {v} and this cuslice is {}", f.version),
                )
                .fix(start),
                Some(v) => match a.findings_age {
                    Some((age, stale)) if age > stale => Item::new(
                        "agent",
                        Status::Problem,
                        format!(
                            "{who}, version {v}, but its findings are {age:.0} s old: its checks \
                             against the driver are stuck"
                        ),
                    )
                    .fix(start),
                    _ => Item::new("agent", Status::Ok, format!("{who}, version {v}")),
                },
                None => Item::new(
                    "agent",
                    Status::Note,
                    format!("{who}; its version cannot be told"),
                ),
            }
            }
        };
    out.push(item);
}

fn cgroup(c: &CgroupFacts, out: &mut Vec<Item>) {
    let layout = match (&c.v2, &c.v1_freezer, c.pure_v2) {
        (Some(_), _, true) => "v2 (unified only)".to_owned(),
        (Some(v2), Some(_), false) => format!("v1 with a v2 hierarchy at {v2} (hybrid)"),
        (Some(v2), None, false) => format!("v1 with a v2 hierarchy at {v2} (hybrid)"),
        (None, Some(_), _) => "v1".to_owned(),
        (None, None, _) => "none found".to_owned(),
    };
    let freezer = match (&c.v1_freezer, c.v2_freeze) {
        (Some(p), _) => Some(format!("the v1 freezer at {p}")),
        (None, true) => Some("cgroup v2 cgroup.freeze".to_owned()),
        (None, false) => None,
    };
    out.push(match freezer {
        Some(fz) => Item::new("cgroup", Status::Ok, format!("{layout}; freezer: {fz}")),
        None => Item::new(
            "cgroup",
            Status::Problem,
            format!(
                "{layout}; no freezer (no v1 freezer hierarchy, no cgroup.freeze): `cuslice \
                 agent --enforce stop` cannot hold a slice over its core limit"
            ),
        )
        .fix("run Linux 5.2 or later with cgroup v2, or mount the v1 freezer controller"),
    });
}

fn state_root(f: &Facts, out: &mut Vec<Item>) {
    let s = &f.state_root;
    let check = format!("state root {}", s.path);
    out.push(match s.fs {
        None => Item::new(
            check,
            Status::Note,
            "does not exist yet (the hook makes it at the first container)",
        ),
        Some((_, free)) if free < MIN_FREE => {
            Item::new(check, Status::Problem, format!("only {} free", size(free)))
                .fix(format!("free space on the file system of {}", s.path))
        }
        Some((true, free)) => Item::new(check, Status::Ok, format!("tmpfs, {} free", size(free))),
        Some((false, free)) => Item::new(
            check,
            Status::Note,
            format!(
                "not tmpfs ({} free): state outlives a reboot, so sweep it at boot",
                size(free)
            ),
        )
        .fix(format!("cuslice-hook sweep --state-root {}", s.path)),
    });
    let check = "stale state";
    out.push(match &f.stale {
        Ok(ids) if ids.is_empty() => Item::new(check, Status::Ok, "none"),
        Ok(ids) => {
            let shown: Vec<&str> = ids.iter().take(5).map(|i| &i[..i.len().min(12)]).collect();
            let more = if ids.len() > 5 { ", ..." } else { "" };
            Item::new(
                check,
                Status::Problem,
                format!(
                    "{} container{} whose init is gone still hold state ({}{more})",
                    ids.len(),
                    if ids.len() == 1 { "" } else { "s" },
                    shown.join(", ")
                ),
            )
            .fix(format!("cuslice-hook sweep --state-root {}", s.path))
        }
        Err(e) => Item::new(check, Status::Note, format!("cannot tell: {e}")),
    });
}

fn size(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.0} MiB", b as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy_facts() -> Facts {
        Facts {
            version: "0.1.0".into(),
            nvml: Ok(NvmlFacts {
                driver: Ok("580.95.05".into()),
                nvml: Ok("13.580.95.05".into()),
                gpus: Ok(vec![GpuFacts {
                    index: 0,
                    name: "NVIDIA H100".into(),
                    samples: Ok(ProcessSamples::Given),
                    processes: Ok(()),
                }]),
            }),
            engines: vec![
                EngineFacts {
                    engine: "docker",
                    present: true,
                    would_change: Ok(vec![]),
                },
                EngineFacts {
                    engine: "podman",
                    present: false,
                    would_change: Ok(vec!["/etc/x".into()]),
                },
            ],
            files: vec![
                FileFacts {
                    path: "/usr/local/bin/cuslice-hook".into(),
                    present: true,
                    version: Some(Ok("0.1.0".into())),
                },
                FileFacts {
                    path: "/usr/local/lib/cuslice/libcuslice.so".into(),
                    present: true,
                    version: Some(Ok("0.1.0".into())),
                },
            ],
            install_command: "cuslice install --engine docker".into(),
            agent: AgentFacts {
                socket: "/run/cuslice/agent/agent.sock".into(),
                answer: Ok((Some(7), Some("0.1.0".into()))),
                findings_age: Some((0.5, 10.0)),
                unit: None,
            },
            cgroup: CgroupFacts {
                v2: Some("/sys/fs/cgroup".into()),
                pure_v2: true,
                v1_freezer: None,
                v2_freeze: true,
            },
            state_root: StateRootFacts {
                path: "/run/cuslice".into(),
                fs: Some((true, 1 << 30)),
            },
            stale: Ok(vec![]),
            slurm: None,
        }
    }

    #[test]
    fn the_slurm_plugin_matches_slurmd() {
        let mut f = healthy_facts();
        let plugin = "/usr/local/lib/cuslice/cuslice_spank.so".to_owned();
        let item = |f: &Facts| {
            judge(f)
                .into_iter()
                .find(|i| i.check.starts_with("slurm plugin "))
                .map(|i| i.line())
        };
        assert_eq!(item(&f), None, "not registered with Slurm: no item");
        f.slurm = Some(SlurmFacts {
            plugin: plugin.clone(),
            version: Ok(0x160508),
            slurmd: Some(Ok((22, 5))),
        });
        assert_eq!(
            item(&f).as_deref(),
            Some(
                "ok      slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: built for Slurm \
                 22.05, this node's slurmd's release"
            )
        );
        f.slurm = Some(SlurmFacts {
            plugin: plugin.clone(),
            version: Ok(0x160508),
            slurmd: Some(Ok((23, 2))),
        });
        assert_eq!(
            problems(&f),
            [
                "PROBLEM slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: was built for Slurm \
              22.05 but this node's slurmd is 23.02 (slurmd -V); fix: slurmd refuses to start \
              with a SPANK plugin of another release: build cuslice where Slurm 23.02's headers \
              are installed (libslurm-dev) and install again"
            ]
        );
        f.slurm = Some(SlurmFacts {
            plugin: plugin.clone(),
            version: Err("missing".into()),
            slurmd: None,
        });
        assert_eq!(
            problems(&f),
            [
                "PROBLEM slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: missing; \
              plugstack.conf requires it, so slurmd and srun fail to load it; fix: cuslice \
              install --engine slurm"
            ]
        );
        f.slurm = Some(SlurmFacts {
            plugin,
            version: Ok(0x160508),
            slurmd: None,
        });
        assert!(problems(&f).is_empty());
        assert!(item(&f).is_some_and(|l| l.starts_with("note    ")));
    }

    fn problems(f: &Facts) -> Vec<String> {
        judge(f)
            .into_iter()
            .filter(|i| i.status == Status::Problem)
            .map(|i| i.line())
            .collect()
    }

    #[test]
    fn a_healthy_node_has_no_problem_and_says_what_is_not_registered() {
        let f = healthy_facts();
        let items = judge(&f);
        assert!(healthy(&items), "{items:#?}");
        let lines: Vec<String> = items.iter().map(Item::line).collect();
        assert!(lines.contains(&"ok      engine docker: registered".to_owned()));
        assert!(
            lines.contains(
                &"note    engine podman: not registered; command: cuslice install --engine podman"
                    .to_owned()
            )
        );
    }

    #[test]
    fn each_broken_part_is_one_problem_with_its_fix() {
        type Breaks = fn(&mut Facts);
        let table: Vec<(Breaks, &str)> = vec![
            (
                |f| f.agent.answer = Err("no cuslice agent at S (refused)".into()),
                "agent: no cuslice agent at S (refused): ",
            ),
            (
                |f| f.agent.answer = Ok((Some(7), Some("0.0.9".into()))),
                "but it is version 0.0.9 and this cuslice is 0.1.0",
            ),
            (
                |f| f.agent.findings_age = Some((60.0, 10.0)),
                "its findings are 60 s old",
            ),
            (
                |f| f.files[0].present = false,
                "file /usr/local/bin/cuslice-hook: missing; fix: cuslice install --engine docker",
            ),
            (
                |f| f.files[0].version = Some(Ok("0.0.9".into())),
                "version 0.0.9, but this cuslice is 0.1.0",
            ),
            (
                |f| f.files[1].version = Some(Ok("0.0.9".into())),
                "file /usr/local/lib/cuslice/libcuslice.so: version 0.0.9, but this cuslice is \
                 0.1.0; fix: cuslice install --engine docker",
            ),
            (
                |f| {
                    f.files[1].version = Some(Err(
                        "no cuslice release mark in it (from a release before marks)".into(),
                    ))
                },
                "file /usr/local/lib/cuslice/libcuslice.so: no cuslice release mark in it",
            ),
            (
                |f| f.engines[0].would_change = Ok(vec!["/etc/docker/daemon.json".into()]),
                "engine docker: registered, but out of date: install would change \
                 /etc/docker/daemon.json; fix: cuslice install --engine docker",
            ),
            (
                |f| f.engines[0].present = false,
                "engines: cuslice is registered with no container engine",
            ),
            (
                |f| f.cgroup.v2_freeze = false,
                "no freezer (no v1 freezer hierarchy, no cgroup.freeze)",
            ),
            (
                |f| f.stale = Ok(vec!["0123456789abcdef".into()]),
                "stale state: 1 container whose init is gone still hold state (0123456789ab); \
                 fix: cuslice-hook sweep --state-root /run/cuslice",
            ),
            (
                |f| f.state_root.fs = Some((true, 1 << 20)),
                "only 1 MiB free",
            ),
            (
                |f| f.files.iter_mut().for_each(|file| file.present = false),
                "files: cuslice is not installed (none of /usr/local/bin/cuslice-hook, \
                 /usr/local/lib/cuslice/libcuslice.so); fix: cuslice install --engine docker",
            ),
            (
                |f| {
                    if let Ok(n) = &mut f.nvml {
                        n.gpus.as_mut().unwrap()[0].processes = Err("returned 3".into());
                    }
                },
                "gpu 0 processes: no per-process memory (returned 3)",
            ),
        ];
        for (breaks, says) in table {
            let mut f = healthy_facts();
            breaks(&mut f);
            let p = problems(&f);
            assert_eq!(p.len(), 1, "{says}: {p:#?}");
            assert!(p[0].contains(says), "{says}: {p:#?}");
            assert!(p[0].contains("; fix: "), "{p:#?}");
        }
    }

    #[test]
    fn a_file_install_would_refuse_is_a_problem_registered_or_not() {
        let mut f = healthy_facts();
        f.engines[1].would_change = Err("cuslice install: X: not valid JSON".into());
        assert_eq!(
            problems(&f),
            [
                "PROBLEM engine podman: install would refuse: X: not valid JSON; fix: what the \
              refusal says, then cuslice install --engine podman"
            ]
        );
    }

    #[test]
    fn no_gpu_and_no_samples_are_notes_not_problems() {
        let mut f = healthy_facts();
        f.nvml = Err("libnvidia-ml.so.1: cannot open".into());
        assert!(problems(&f).is_empty());
        assert!(judge(&f)[0].line().starts_with("note    nvml: no NVML"));
        let mut f = healthy_facts();
        if let Ok(n) = &mut f.nvml {
            let g = &mut n.gpus.as_mut().unwrap()[0];
            g.samples = Ok(ProcessSamples::NotSupported);
            g.name = SIMULATED.into();
        }
        let items = judge(&f);
        assert!(healthy(&items));
        assert!(items.iter().any(|i| i.detail.contains("simulated device")));
        assert!(
            items
                .iter()
                .any(|i| i.check == "gpu 0 meter" && i.status == Status::Note)
        );
    }

    #[test]
    fn each_gpu_says_how_compute_limits_are_metered_on_it() {
        let table = [
            (
                Ok(ProcessSamples::Given),
                "ok      gpu 0 meter: NVIDIA H100: turns (",
            ),
            (
                Ok(ProcessSamples::NotSupported),
                "note    gpu 0 meter: NVIDIA H100: turns (",
            ),
            (
                Err("libnvidia-ml.so.1: nvmlDeviceGetProcessUtilization returned 4".into()),
                "note    gpu 0 meter: NVIDIA H100: turns (",
            ),
        ];
        for (samples, says) in table {
            let mut f = healthy_facts();
            if let Ok(n) = &mut f.nvml {
                n.gpus.as_mut().unwrap()[0].samples = samples;
            }
            let items = judge(&f);
            assert!(healthy(&items), "{items:#?}");
            let lines: Vec<String> = items
                .iter()
                .filter(|i| i.check == "gpu 0 meter")
                .map(Item::line)
                .collect();
            assert_eq!(lines.len(), 1, "{items:#?}");
            assert!(lines[0].starts_with(says), "{says}: {lines:#?}");
            assert!(
                lines[0].contains("per-process utilisation"),
                "what the agent checks by: {lines:#?}"
            );
        }
    }
}
