//! Slurm jobs' slices. cuslice's SPANK plugin (`node/slurm`) gives each task of a job a mount
//! namespace of its own and runs `cuslice-hook slurm-task` in it before the task execs the
//! user's program; `slurm-epilog` removes the job's slice at the job's end.
//!
//! A job's slice is made by its first task on the node and joined by every later one (every
//! step, every task), so that the job's processes share one ledger, one cap and one compute
//! share per GPU. Its limits come from what Slurm says, never from the job's environment:
//!
//! - which GPUs the job holds on this node, and how many shards on each (`scontrol show job -d`,
//!   the `GRES=` of this node's line: `gpu:2(IDX:0-1)`, `shard:25(IDX:0)`);
//! - how many shards each GPU has and its device file (`slurmd -G`: the node's gres.conf as
//!   slurmd reads it, autodetection included);
//! - each GPU's memory (NVML, by the device file's minor number).
//!
//! A GPU held whole is the slice's whole GPU (cap = its memory); `s` of a GPU's `n` shards are
//! `s/n` of its memory (rounded down to a MiB) and `floor(100 s/n)`% of its compute, as the
//! core request and the core limit. The order of the job's GPUs (by gres index) is the order
//! of `CUDA_VISIBLE_DEVICES`, which Slurm sets, so per-device settings use those ordinals.

use std::path::Path;
use std::process::Command;

use cuslice_state::host::{Record, Root, SlurmJob, boot_id, start_time};

use crate::hook::{Options, Outcome, find_library, lock, make};
use crate::inject::{Plan, image_preload, inject};
use crate::rootfs::unmake;
use crate::settings;

/// What a job holds of one GPU on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The GPU's gres index on the node (`IDX`).
    pub index: u32,
    /// `None`: the whole GPU (`--gres=gpu:N`); `Some(s)`: s shards of it.
    pub shards: Option<u32>,
}

/// A job as `scontrol show job -d` describes it, for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub user: String,
    pub uid: u32,
    /// Sorted by index.
    pub gpus: Vec<Held>,
}

/// One GPU of the node as `slurmd -G` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    pub index: u32,
    pub file: Option<String>,
    /// How many shards it is cut into (0: none configured).
    pub shards: u64,
}

/// `1-3,5` -> [1, 2, 3, 5].
fn indices(list: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("{list:?} is not a list of gres indices");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 1024 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

/// The entries of a `GRES=` value, split at the commas outside parentheses.
fn gres_entries(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in value.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out.into_iter().filter(|e| !e.is_empty()).collect()
}

/// Reads `scontrol show job -d` for the node that `here` recognises in a `Nodes=` expression.
pub fn parse_job(text: &str, here: &dyn Fn(&str) -> bool) -> Result<Job, String> {
    let mut user = None;
    let mut gpus: Vec<Held> = Vec::new();
    for line in text.lines() {
        let mut tokens = line.split_whitespace();
        let Some(first) = tokens.next() else { continue };
        if let Some(u) = first.strip_prefix("UserId=") {
            // name(uid)
            let (name, uid) = u
                .strip_suffix(')')
                .and_then(|u| u.split_once('('))
                .ok_or_else(|| format!("scontrol gives the job's user as {u:?}"))?;
            let uid = uid
                .parse()
                .map_err(|_| format!("scontrol gives the job's user as {u:?}"))?;
            user = Some((name.to_string(), uid));
        }
        let Some(nodes) = first.strip_prefix("Nodes=") else {
            continue;
        };
        if !here(nodes) {
            continue;
        }
        let Some(gres) = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("GRES="))
        else {
            continue;
        };
        for entry in gres_entries(gres) {
            let (head, idx) = match entry.split_once("(IDX:") {
                Some((h, rest)) => (h, rest.trim_end_matches(')')),
                None => (entry, ""),
            };
            let mut fields = head.split(':');
            let name = fields.next().unwrap_or("");
            let count: u32 = fields.next_back().and_then(|c| c.parse().ok()).unwrap_or(0);
            let list = indices(idx)?;
            match name {
                "gpu" => gpus.extend(list.iter().map(|&index| Held {
                    index,
                    shards: None,
                })),
                "shard" if count > 0 => match list.as_slice() {
                    [index] => gpus.push(Held {
                        index: *index,
                        shards: Some(count),
                    }),
                    [] => {
                        return Err(format!(
                            "scontrol gives the job's shards as {entry:?}, without the GPU \
                             they are on"
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "the job holds shards of more than one GPU ({entry}); cuslice \
                             cannot tell how many of each: ask for shards of one GPU per node"
                        ));
                    }
                },
                _ => {}
            }
        }
    }
    let (user, uid) = user.ok_or("scontrol names no user for the job")?;
    gpus.sort_by_key(|g| (g.index, g.shards.is_some()));
    // A GPU held whole and in shards is held whole.
    gpus.dedup_by_key(|g| g.index);
    Ok(Job { user, uid, gpus })
}

/// Reads `slurmd -G` (`slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=… File=/dev/nvidia0`).
pub fn parse_node(text: &str) -> Vec<NodeGpu> {
    let mut gpus: Vec<NodeGpu> = Vec::new();
    let mut shards: Vec<(u32, u64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.split_once("Gres ").map(|(_, r)| r) else {
            continue;
        };
        let field = |key: &str| {
            rest.split_whitespace()
                .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
        };
        let (Some(name), Some(index)) =
            (field("Name"), field("Index").and_then(|i| i.parse().ok()))
        else {
            continue;
        };
        let count: u64 = field("Count").and_then(|c| c.parse().ok()).unwrap_or(0);
        match name {
            "gpu" => gpus.push(NodeGpu {
                index,
                file: field("File").filter(|f| *f != "(null)").map(str::to_string),
                shards: 0,
            }),
            "shard" => shards.push((index, count)),
            _ => {}
        }
    }
    for (index, count) in shards {
        if let Some(g) = gpus.iter_mut().find(|g| g.index == index) {
            g.shards += count;
        }
    }
    gpus.sort_by_key(|g| g.index);
    gpus
}

const MIB: u64 = 1 << 20;

/// The job's settings on this node, from what it holds and each GPU's size: `None` where it
/// holds no GPU here. `memory(index)` is the GPU's memory in bytes.
pub fn job_settings(
    job: &Job,
    node: &[NodeGpu],
    memory: &dyn Fn(&NodeGpu) -> Result<u64, String>,
) -> Result<Option<Vec<String>>, String> {
    if job.gpus.is_empty() {
        return Ok(None);
    }
    let per_device = job.gpus.len() > 1;
    let name = |var: &str, ordinal: usize| {
        if per_device {
            format!("{var}_{ordinal}")
        } else {
            var.to_string()
        }
    };
    let mut env = Vec::new();
    for (ordinal, held) in job.gpus.iter().enumerate() {
        let gpu = node.iter().find(|g| g.index == held.index).ok_or_else(|| {
            format!(
                "slurmctld gave the job GPU {} of this node, which slurmd -G does not list; \
                 check that gres.conf lists the same GPUs on every daemon",
                held.index
            )
        })?;
        let total = memory(gpu)?;
        let (bytes, percent) = match held.shards {
            None => (total, None),
            Some(s) => {
                if gpu.shards == 0 {
                    return Err(format!(
                        "the job holds {s} shards of GPU {}, for which slurmd -G lists no \
                         shards; add Name=shard Count=N File={} to gres.conf",
                        gpu.index,
                        gpu.file.as_deref().unwrap_or("/dev/nvidiaN")
                    ));
                }
                let s = u64::from(s).min(gpu.shards);
                let bytes = (u128::from(total) * u128::from(s) / u128::from(gpu.shards)) as u64;
                let percent = (100 * s / gpu.shards).max(1);
                (bytes / MIB * MIB, Some(percent))
            }
        };
        env.push(format!(
            "{}={}MiB",
            name("CUSLICE_MEMORY_LIMIT", ordinal),
            bytes / MIB
        ));
        if let Some(p) = percent.filter(|&p| p < 100) {
            env.push(format!("{}={p}", name("CUSLICE_CORE_LIMIT", ordinal)));
            env.push(format!("{}={p}", name("CUSLICE_CORE_REQUEST", ordinal)));
        }
    }
    Ok(Some(env))
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {what} ({e}); is Slurm's {what} on PATH?"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            err.lines().next().unwrap_or("")
        ));
    }
    // slurmd -G prints its list on stderr.
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(text)
}

/// Whether the hostlist expression `nodes` (`vm`, `gpu[01-04]`) names `node`.
fn names(nodes: &str, node: &str) -> bool {
    if nodes == node {
        return true;
    }
    if !nodes.contains('[') && !nodes.contains(',') {
        return false;
    }
    run(
        Command::new("scontrol").args(["show", "hostnames", nodes]),
        "scontrol",
    )
    .is_ok_and(|t| t.lines().any(|l| l.trim() == node))
}

fn node_name(given: Option<&str>) -> String {
    given.map(str::to_string).unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| h.split('.').next().unwrap_or("").to_string())
            .unwrap_or_default()
    })
}

/// The memory of the GPU behind `file`, from NVML (matched by the device file's minor number,
/// as `/dev/nvidiaN` is GPU N to the driver).
fn gpu_memory(file: Option<&str>) -> Result<u64, String> {
    use std::os::unix::fs::MetadataExt;
    let file =
        file.ok_or("gres.conf gives the GPU no File=; cuslice finds a GPU by its device file")?;
    let rdev = std::fs::metadata(file)
        .map_err(|e| format!("gres.conf names {file}: {e}"))?
        .rdev();
    let minor = nix::sys::stat::minor(rdev) as u32;
    let nvml = cuslice_node::nvml::Nvml::open()?;
    for d in nvml.devices()? {
        let desc = nvml.describe(d)?;
        if desc.minor == Some(minor) {
            return Ok(desc.total);
        }
    }
    Err(format!(
        "NVML lists no GPU with minor number {minor} ({file}); gres.conf's File= must name the \
         GPUs' device files"
    ))
}

/// What Slurm says of job `job` on `node`, as settings.
fn query(job: u32, node: &str) -> Result<(Job, Option<Vec<String>>), String> {
    let text = run(
        Command::new("scontrol").args(["show", "job", "-d", &job.to_string()]),
        "scontrol",
    )?;
    let parsed = parse_job(&text, &|nodes| names(nodes, node))?;
    if parsed.gpus.is_empty() {
        return Ok((parsed, None));
    }
    let gres = run(Command::new("slurmd").args(["-G", "-N", node]), "slurmd")?;
    let gpus = parse_node(&gres);
    let env = job_settings(&parsed, &gpus, &|g| gpu_memory(g.file.as_deref()))?;
    Ok((parsed, env))
}

/// Moves the hook into the mount namespace of `host` (slurmstepd's: the node's), where the
/// slice's state is made and seen by the node's tools; the plugin ran the hook from the task's
/// own namespace.
pub fn enter_host(host: Option<i32>) -> Result<(), String> {
    use std::os::fd::AsFd;
    let Some(pid) = host else { return Ok(()) };
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|e| format!("cannot open the node's mount namespace (/proc/{pid}/ns/mnt): {e}"))?;
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot enter the node's mount namespace: {e}"))
}

pub fn slice_id(job: u32) -> String {
    format!("slurm-{job}")
}

/// `slurm-task`: the job's slice, made by its first task on the node, mounted into the mount
/// namespace of task `pid` (the plugin's own, unshared from the node's).
pub fn task(opts: &Options, job: u32, pid: i32, node: Option<&str>) -> Result<Outcome, String> {
    let id = slice_id(job);
    let root = Root::new(&opts.state_root);
    let library = find_library(opts.library.as_deref())?;
    let start = start_time(pid).ok_or_else(|| format!("the task's process {pid} is gone"))?;
    {
        let _lock = lock(&root, opts)?;
        if let Some(r) = root.read_record(&id).filter(Record::alive) {
            return join(opts, &root, r, pid, &library).map(|()| Outcome::Sliced);
        }
    }
    let node = node_name(node);
    let (held, env) = query(job, &node)?;
    let Some(env) = env else {
        return Ok(Outcome::Untouched);
    };
    let found = settings::read(env.iter().map(String::as_str), std::iter::empty())?
        .ok_or("the job's settings came out empty")?;
    let preload = image_preload(pid, Path::new("/"))?;
    let boot = boot_id().ok_or("cannot read this boot's id (/proc/sys/kernel/random/boot_id)")?;
    let _lock = lock(&root, opts)?;
    root.sweep(&unmake);
    if let Some(r) = root.read_record(&id).filter(Record::alive) {
        return join(opts, &root, r, pid, &library).map(|()| Outcome::Sliced);
    }
    let record = Record {
        id: id.clone(),
        pid,
        start,
        rootfs: "/".into(),
        name: settings::clean_name(&format!("job {job} ({})", held.user)),
        kubernetes: None,
        created: Vec::new(),
        ledger_version: Some(cuslice_state::ledger::VERSION),
        slurm: Some(SlurmJob {
            job,
            user: held.user,
            uid: held.uid,
            boot,
        }),
    };
    make(opts, &root, &found, record, &library, &preload)?;
    Ok(Outcome::Sliced)
}

/// Mounts the job's slice (made by an earlier task) into task `pid`'s namespace. Requires the
/// lock.
fn join(
    opts: &Options,
    root: &Root,
    mut r: Record,
    pid: i32,
    library: &Path,
) -> Result<(), String> {
    let place = root
        .place(&r.id)
        .ok_or_else(|| format!("the slice {} has no place on the compute board", r.id))?;
    let slice = place
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| u64::from_str_radix(n, 16).ok())
        .ok_or_else(|| format!("{} does not name a place on the board", place.display()))?;
    let skeleton = root.make_skeleton().map_err(|e| {
        format!(
            "cannot make the mount points under {}: {e}",
            root.skeleton().display()
        )
    })?;
    let created = inject(&Plan {
        pid,
        rootfs: Path::new("/"),
        skeleton: &skeleton,
        mnt: &root.mnt(&r.id),
        node_dir: &opts.node_dir,
        claims: &root
            .mnt(&r.id)
            .join(cuslice_state::host::OWN_PLACE)
            .join(cuslice_state::board::CLAIMS),
        slice,
        agent_dir: &root.agent(),
        library,
        preload: None,
        cover: Some(&opts.node_dir),
    })?;
    if !created.is_empty() {
        r.created.extend(created);
        root.write_record(&r)
            .map_err(|e| format!("cannot write {}: {e}", root.dir(&r.id).display()))?;
    }
    Ok(())
}

/// `slurm-epilog`: removes the job's slice, and those of jobs this node no longer runs (an
/// epilog that never ran, after slurmd was killed).
pub fn epilog(opts: &Options, job: u32) -> Result<Outcome, String> {
    let root = Root::new(&opts.state_root);
    // Only slices made before squeue answered: a job that started since is not in its list.
    let asked = std::time::SystemTime::now();
    let running: Option<Vec<u32>> = run(
        Command::new("squeue").args(["-h", "-o", "%A", "-w", &node_name(None)]),
        "squeue",
    )
    .ok()
    .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect());
    let _lock = lock(&root, opts)?;
    let records = root.records();
    let gone: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.slurm.as_ref().is_some_and(|s| {
                s.job == job
                    || running.as_ref().is_some_and(|run| {
                        !run.contains(&s.job)
                            && std::fs::metadata(root.dir(&r.id))
                                .and_then(|m| m.modified())
                                .is_ok_and(|made| made < asked)
                    })
            })
        })
        .collect();
    for r in &gone {
        let live: Vec<Record> = records
            .iter()
            .filter(|o| o.id != r.id && !gone.iter().any(|g| g.id == o.id) && o.alive())
            .cloned()
            .collect();
        root.discard(&r.id, &live, &unmake);
    }
    root.sweep(&unmake);
    drop(_lock);
    root.empty_trash();
    Ok(if gone.is_empty() {
        Outcome::Untouched
    } else {
        Outcome::Removed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARD_JOB: &str = "JobId=4 JobName=wrap
   UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A
   JOB_GRES=shard:25
     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:25(IDX:0)
   TresPerNode=gres:shard:25
";

    const NODE: &str = "slurmd: Gres Name=shard Type=(null) Count=100 Index=0 ID=1918986455 File=/dev/nvidia0 (null)
slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=7696487 File=/dev/nvidia0 (null)
slurmd: Gres Name=shard Type=(null) Count=40 Index=1 ID=1918986455 File=/dev/nvidia1 (null)
slurmd: Gres Name=gpu Type=(null) Count=1 Index=1 ID=7696487 File=/dev/nvidia1 (null)
";

    fn here(n: &str) -> bool {
        n == "vm"
    }

    #[test]
    fn a_shard_job_is_its_share_of_one_gpu() {
        let job = parse_job(SHARD_JOB, &here).unwrap();
        assert_eq!(job.user, "alice");
        assert_eq!(job.uid, 1001);
        assert_eq!(
            job.gpus,
            [Held {
                index: 0,
                shards: Some(25)
            }]
        );
        let env = job_settings(&job, &parse_node(NODE), &|_| Ok(16 << 30))
            .unwrap()
            .unwrap();
        assert_eq!(
            env,
            [
                "CUSLICE_MEMORY_LIMIT=4096MiB",
                "CUSLICE_CORE_LIMIT=25",
                "CUSLICE_CORE_REQUEST=25"
            ]
        );
    }

    #[test]
    fn shards_of_a_gpu_cut_in_40_round_down() {
        let text = SHARD_JOB.replace("shard:25(IDX:0)", "shard:7(IDX:1)");
        let job = parse_job(&text, &here).unwrap();
        let env = job_settings(&job, &parse_node(NODE), &|_| Ok(10 << 30))
            .unwrap()
            .unwrap();
        // 7/40 of 10 GiB = 1792 MiB; 17.5% -> 17.
        assert_eq!(
            env,
            [
                "CUSLICE_MEMORY_LIMIT=1792MiB",
                "CUSLICE_CORE_LIMIT=17",
                "CUSLICE_CORE_REQUEST=17"
            ]
        );
    }

    #[test]
    fn whole_gpus_get_per_device_caps_in_index_order() {
        let text = SHARD_JOB.replace("GRES=shard:25(IDX:0)", "GRES=gpu:h100:2(IDX:0-1)");
        let job = parse_job(&text, &here).unwrap();
        assert_eq!(job.gpus.len(), 2);
        let env = job_settings(&job, &parse_node(NODE), &|g| {
            Ok(if g.index == 0 { 8 << 30 } else { 4 << 30 })
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            env,
            [
                "CUSLICE_MEMORY_LIMIT_0=8192MiB",
                "CUSLICE_MEMORY_LIMIT_1=4096MiB"
            ]
        );
    }

    #[test]
    fn another_node_and_no_gpu_are_nothing_here() {
        let job = parse_job(SHARD_JOB, &|n| n == "other").unwrap();
        assert!(job.gpus.is_empty());
        assert_eq!(
            job_settings(&job, &parse_node(NODE), &|_| Ok(1)).unwrap(),
            None
        );
    }

    #[test]
    fn gres_lists_split_outside_parentheses() {
        assert_eq!(
            gres_entries("gpu:3(IDX:0-1,3),shard:0(IDX:)"),
            ["gpu:3(IDX:0-1,3)", "shard:0(IDX:)"]
        );
        assert_eq!(indices("0-1,3").unwrap(), [0, 1, 3]);
        assert!(indices("3-1").is_err());
    }

    #[test]
    fn shards_over_two_gpus_are_refused_with_a_line() {
        let text = SHARD_JOB.replace("shard:25(IDX:0)", "shard:50(IDX:0-1)");
        let e = parse_job(&text, &here).unwrap_err();
        assert!(e.contains("more than one GPU"), "{e}");
    }

    #[test]
    fn shards_on_a_gpu_without_shards_configured_are_refused() {
        let job = parse_job(SHARD_JOB, &here).unwrap();
        let node: Vec<NodeGpu> = parse_node(NODE)
            .into_iter()
            .map(|g| NodeGpu { shards: 0, ..g })
            .collect();
        let e = job_settings(&job, &node, &|_| Ok(1 << 30)).unwrap_err();
        assert!(e.contains("Name=shard Count=N File=/dev/nvidia0"), "{e}");
    }
}
