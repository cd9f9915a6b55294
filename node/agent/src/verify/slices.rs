//! The container slices the hook keeps under the state root (each read again when `cuslice
//! set` replaces its hook file), and which slice a process is in, from /proc.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use cuslice_policy::config::Config as SliceConfig;
use cuslice_state::host::{Record, Root};

use super::{Slice, Verifier};
use crate::cgroup::{self, Freezer, Scope};

/// What tells a hook file replaced or changed since it was read.
pub(super) fn stamp(path: &std::path::Path) -> Option<(u64, i64, i64)> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec()))
}

pub(super) fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

impl Verifier {
    /// The live container slices under the state root.
    pub(super) fn slices(&mut self) -> BTreeMap<String, Arc<Slice>> {
        let root = Root::new(&self.cfg.state_root);
        let mut out = BTreeMap::new();
        let mut records: Vec<Record> = root.records();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        let old = self.shared.lock().slices.clone();
        for r in records {
            if !r.alive() {
                continue; // gone; the next hook or `cuslice-hook sweep` removes it
            }
            let config_path = root.mnt(&r.id).join("slice/config");
            let config_stamp = stamp(&config_path);
            if let Some(s) = old.get(&r.id)
                && s.init == r.pid
                && s.config_stamp == config_stamp
            {
                out.insert(r.id.clone(), s.clone());
                continue;
            }
            let config = match fs::read_to_string(&config_path)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    SliceConfig::from_hook_file(&t, std::iter::empty::<(&str, &str)>())
                        .map_err(|e| e.to_string())
                }) {
                Ok(c) => c,
                Err(e) => {
                    self.once(format!(
                        "slice {}: {}: {e}; its limits are unknown, so it is not checked",
                        short(&r.id),
                        config_path.display()
                    ));
                    continue;
                }
            };
            // A Slurm job's tasks sit in slurmd's cgroups (or in a step's): none of them is
            // the job's alone, so its processes are told by their mount namespace's slice.
            let scope = if r.slurm.is_some() {
                Scope::default()
            } else {
                Scope::of(
                    &cgroup::placement(r.pid).unwrap_or_default(),
                    &self.shared.agent,
                )
            };
            let own_ns = fs::read_link("/proc/self/ns/pid").ok();
            let pidns = fs::read_link(format!("/proc/{}/ns/pid", r.pid))
                .ok()
                .filter(|ns| Some(ns) != own_ns.as_ref());
            let freezer = Freezer::for_scope(&scope, &self.mounts);
            let lowered = fs::read_to_string(root.dir(&r.id).join(cuslice_node::set::LOWERED))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            // Its place on the compute board: the last part of the path the hook recorded.
            let place_dir = root.place(&r.id);
            let place = place_dir.as_ref().and_then(|p| {
                let name = p.file_name()?.to_str()?.to_string();
                (name.len() == 16)
                    .then(|| u64::from_str_radix(&name, 16).ok())
                    .flatten()
            });
            out.insert(
                r.id.clone(),
                Arc::new(Slice {
                    job_config: r.slurm.as_ref().and_then(|_| {
                        fs::symlink_metadata(&config_path)
                            .ok()
                            .filter(fs::Metadata::is_file)
                            .map(|m| (m.dev(), m.ino()))
                    }),
                    place,
                    place_dir,
                    ledger_version: r.ledger_version,
                    ledger: root
                        .mnt(&r.id)
                        .join("slice")
                        .join(cuslice_state::ledger::FILE_NAME),
                    id: r.id,
                    name: r.name,
                    init: r.pid,
                    pidns,
                    scope,
                    freezer,
                    config,
                    config_stamp,
                    lowered,
                }),
            );
        }
        // Slices that went away: forget their cgroups (a cgroup that is gone needs no thaw).
        let mut st = self.shared.lock();
        for (id, s) in &old {
            if out.contains_key(id) {
                continue;
            }
            if let Some(f) = st.frozen.remove(id) {
                let _ = f.freezer.thaw();
            }
            if let Ok(f) = &s.freezer {
                let _ = st.record.remove(f);
            }
            st.unfreezable.remove(id);
        }
        out
    }
}

/// The slice process `pid` (host pid) belongs to: the one whose init shares its pid namespace,
/// or whose cgroup it is in.
pub(super) fn classify(pid: i32, slices: &BTreeMap<String, Arc<Slice>>) -> Option<String> {
    let ns = fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    if let Some(s) = slices.values().find(|s| s.pidns.as_ref() == Some(&ns)) {
        return Some(s.id.clone());
    }
    if let Some(s) = cgroup::placement(pid)
        .ok()
        .and_then(|p| slices.values().find(|s| s.scope.contains(&p)))
    {
        return Some(s.id.clone());
    }
    // A Slurm job's process: the slice mounted in its mount namespace (read-only to it).
    if !slices.values().any(|s| s.job_config.is_some()) {
        return None;
    }
    let seen = job_slice_config(pid)?;
    slices
        .values()
        .find(|s| s.job_config == Some(seen))
        .map(|s| s.id.clone())
}

/// The file (device, inode) at the slice's config path in process `pid`'s own root: a job's
/// slice is mounted there, so it is the slice's own config file. Told by what the file is, never
/// by what it holds, as a process may put its own file there (with another job's settings in it).
/// Walked one component at a time from the process's root, following no link (an absolute one
/// met on the way would resolve in the agent's root, where another job's slice is) and opening
/// nothing for reading, as it may put a link or a FIFO there. (What `openat2` with
/// `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS` does in one call, as the hook's `rootfs.rs` resolves
/// paths in a container; either needs no more than the kernel cuslice already requires.)
fn job_slice_config(pid: i32) -> Option<(u64, u64)> {
    let path = format!("{}/config", cuslice_state::paths::CONTAINER_SLICE_DIR);
    file_in_root(Path::new(&format!("/proc/{pid}/root")), &path)
}

/// The regular file (device, inode) at `path` under `root`, reached without following a link.
fn file_in_root(root: &Path, path: &str) -> Option<(u64, u64)> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::Mode;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (last, dirs) = parts.split_last()?;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = std::os::fd::OwnedFd::from(fs::File::open(root).ok()?);
    for dir in dirs {
        at = openat(&at, *dir, flags | OFlag::O_DIRECTORY, Mode::empty()).ok()?;
    }
    let file = fs::File::from(openat(&at, *last, flags, Mode::empty()).ok()?);
    let m = file.metadata().ok()?;
    m.is_file().then(|| (m.dev(), m.ino()))
}

/// A variable of process `pid`'s environment as it was at exec.
pub(super) fn environ(pid: i32, name: &str) -> Option<String> {
    let raw = cuslice_state::fsio::read_proc(&format!("/proc/{pid}/environ"))?;
    raw.split(|&b| b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_config_file_is_found_without_following_a_link_or_opening_it() {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let slice = root.path().join("run/cuslice/slice");
        fs::create_dir_all(&slice).unwrap();
        let config = slice.join("config");
        fs::write(&config, "CUSLICE_MEMORY_LIMIT=2GiB\n").unwrap();
        let path = "/run/cuslice/slice/config";
        let m = fs::metadata(&config).unwrap();
        assert_eq!(file_in_root(root.path(), path), Some((m.dev(), m.ino())));
        // Another job's slice, where an absolute link would lead from the agent's root.
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join("config"), "CUSLICE_MEMORY_LIMIT=2GiB\n").unwrap();
        // The file a link, a directory on the way a link: not found.
        fs::remove_file(&config).unwrap();
        symlink(other.path().join("config"), &config).unwrap();
        assert_eq!(file_in_root(root.path(), path), None);
        fs::remove_dir_all(&slice).unwrap();
        symlink(other.path(), &slice).unwrap();
        assert_eq!(file_in_root(root.path(), path), None);
        // A FIFO: not a file, and nothing waits for a writer.
        fs::remove_file(&slice).unwrap();
        fs::create_dir(&slice).unwrap();
        nix::unistd::mkfifo(&config, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        assert_eq!(file_in_root(root.path(), path), None);
    }
}
