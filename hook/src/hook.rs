//! The hook's stages. `create` (run as `prestart` or `createRuntime`): validate, write the slice's
//! host state, mount it into the container. `poststop`: remove it. `sweep`: remove what
//! containers that vanished without `poststop` left.

use std::path::{Path, PathBuf};

use oci_spec::runtime::State;

use cuslice_state::host::{Record, Root, start_time, valid_id};
use cuslice_state::paths::{CORE_FILE, INSTALLED_LIBRARY, LIBRARY_DIR, LIBRARY_FILE};

use crate::inject::{Plan, inject};
use crate::rootfs::unmake;
use crate::settings;

/// The core beside `library`.
pub fn core_beside(library: &Path) -> PathBuf {
    library.with_file_name(CORE_FILE)
}

/// `library` if the core sits beside it, else the one line that says so.
fn with_core(library: PathBuf) -> Result<PathBuf, String> {
    let core = core_beside(&library);
    if core.is_file() {
        Ok(library)
    } else {
        Err(format!(
            "{}: no such file; libcuslice.so loads it from its own directory, so install both from one build (cuslice install does)",
            core.display()
        ))
    }
}
pub const DEFAULT_NODE_DIR: &str = cuslice_state::paths::DEFAULT_NODE_DIR;

pub struct Options {
    pub state_root: PathBuf,
    pub node_dir: PathBuf,
    pub library: Option<PathBuf>,
    /// The DRA plugin's container index, read for the name of the claim a pod's container uses
    /// (`cuslice_cdi::DEFAULT_CONTAINER_INDEX` by default).
    pub container_index: PathBuf,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The container does not mention cuslice: nothing was touched.
    Untouched,
    /// The slice is in place (now, or already by an earlier stage of the same container).
    Sliced,
    Removed,
    Swept(Vec<String>),
}

/// The library to mount: `--library`, else `libcuslice.so` beside this executable (a build
/// tree), else `../lib/cuslice/libcuslice.so` from it (an install under any prefix), else the
/// default install location.
pub fn find_library(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return if p.is_file() {
            with_core(p.to_path_buf())
        } else {
            Err(format!(
                "--library {}: no such file; pass the path of libcuslice.so",
                p.display()
            ))
        };
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.to_path_buf()));
    let candidates = exe_dir
        .iter()
        .flat_map(|d| {
            [
                d.join(LIBRARY_FILE),
                d.join("..").join(LIBRARY_DIR).join(LIBRARY_FILE),
            ]
        })
        .chain([PathBuf::from(INSTALLED_LIBRARY)]);
    let mut looked = Vec::new();
    for p in candidates {
        if p.is_file() {
            return with_core(p);
        }
        looked.push(p.display().to_string());
    }
    Err(format!(
        "cannot find libcuslice.so (looked at {}); pass --library PATH to cuslice-hook or run `cuslice install`",
        looked.join(" and ")
    ))
}

fn read_state(text: &str) -> Result<State, String> {
    let state: State = serde_json::from_str(text).map_err(|e| {
        format!("cannot read the container state on stdin ({e}); cuslice-hook runs as an OCI hook, which gets the state JSON on stdin")
    })?;
    if !valid_id(state.id()) {
        return Err(format!(
            "container id {} is not a valid OCI container id",
            cuslice_policy::echo::quoted(state.id())
        ));
    }
    Ok(state)
}

/// The spec's `process.env`, read leniently (entries that are not strings are left out).
fn spec_env(spec: &serde_json::Value) -> impl Iterator<Item = &str> {
    spec.pointer("/process/env")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str())
}

/// The spec's `annotations`, keys with their values (`None` where a value is not a string).
fn spec_annotations(spec: &serde_json::Value) -> impl Iterator<Item = (&str, Option<&str>)> {
    spec.get("annotations")
        .and_then(|a| a.as_object())
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// Whether the spec's environment or annotations mention cuslice: read leniently, so that a
/// container without cuslice settings is never refused over a spec field the hook would not use.
pub fn spec_mentions(spec: &serde_json::Value) -> bool {
    settings::mentioned(spec_env(spec), spec_annotations(spec).map(|(k, _)| k))
}

/// `prestart` / `createRuntime`.
pub fn create(opts: &Options, state_json: &str) -> Result<Outcome, String> {
    let state = read_state(state_json)?;
    let bundle = state.bundle();
    let config_path = bundle.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("cannot read {}: {e}", config_path.display()))?;
    let spec: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", config_path.display()))?;
    if !spec_mentions(&spec) {
        return Ok(Outcome::Untouched);
    }
    // Only the fields the hook uses are read (not the whole spec into oci-spec's types: that
    // cost about 45 µs of every creation), each checked the way the runtime-spec
    // types would: a setting in a field of the wrong type is refused, never passed over.
    let env: Vec<&str> = spec_env(&spec).collect();
    if env.len()
        != spec
            .pointer("/process/env")
            .and_then(|e| e.as_array())
            .map_or(0, Vec::len)
    {
        return Err(format!(
            "{}: process.env holds an entry that is not a string; the runtime spec's env is a list of \"NAME=VALUE\" strings",
            config_path.display()
        ));
    }
    let annotations = spec_annotations(&spec)
        .map(|(k, v)| {
            v.map(|v| (k, v)).ok_or_else(|| {
                format!(
                    "{}: the annotation {} is not a string; annotations map names to strings",
                    config_path.display(),
                    cuslice_policy::echo::cut(k)
                )
            })
        })
        .collect::<Result<Vec<(&str, &str)>, String>>()?;
    let Some(mut found) = settings::read(env.iter().copied(), annotations.iter().copied())? else {
        return Ok(Outcome::Untouched);
    };
    // A per-device setting for a GPU the container does not have would apply to nothing.
    let device_paths: Vec<&str> = spec
        .pointer("/linux/devices")
        .and_then(|d| d.as_array())
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("path").and_then(|p| p.as_str()))
        .collect();
    if let Some((gpus, seen)) =
        settings::visible_gpus(env.iter().copied(), device_paths.iter().copied())
    {
        found.check_devices(gpus, &seen)?;
    }
    // Which GPU each per-device setting is for, as the engine gave the container its GPUs:
    // not as a process of it lists them for itself.
    found.record_gpus(env.iter().copied(), device_paths.iter().copied());
    let library = find_library(opts.library.as_deref())?;
    let pid = state.pid().filter(|&p| p > 0).ok_or(
        "the container state has no pid; run cuslice-hook at the prestart or createRuntime stage",
    )?;
    let start = start_time(pid).ok_or_else(|| format!("the container's process {pid} is gone"))?;
    let rootfs = spec
        .pointer("/root/path")
        .and_then(|p| p.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| format!("{} has no root.path", config_path.display()))?;
    let rootfs = if rootfs.is_absolute() {
        rootfs
    } else {
        bundle.join(rootfs)
    };
    let id = state.id();
    // The image's own /etc/ld.so.preload is the tenant's data: read (boundedly) and sanitised
    // before the node-wide lock, so that no image can hold up another container's start.
    let preload = crate::inject::image_preload(pid, &rootfs)?;
    // Where it belongs in Kubernetes, with the claim the DRA plugin's index names: read before
    // the lock too (a directory listing, on a node with DRA claims).
    let kubernetes = kubernetes(&annotations, &opts.container_index);
    // The name Docker or Podman gave it (`--name web`), which they keep beside the bundle.
    let engine_name = crate::names::engine_name(&spec, bundle, id);

    let root = Root::new(&opts.state_root);
    let _lock = lock(&root, opts)?;
    root.sweep(&unmake);
    if let Some(r) = root.read_record(id) {
        if r.pid == pid && r.start == start {
            return Ok(Outcome::Sliced);
        }
        return Err(format!(
            "another live container (pid {}) already has the id {id} under {}",
            r.pid,
            opts.state_root.display()
        ));
    }
    let record = Record {
        id: id.to_string(),
        pid,
        start,
        rootfs,
        name: settings::display_name(
            id,
            engine_name.as_deref(),
            spec.get("hostname").and_then(|h| h.as_str()),
            &annotations,
        ),
        kubernetes,
        created: Vec::new(),
        ledger_version: Some(cuslice_state::ledger::VERSION),
        slurm: None,
    };
    make(opts, &root, &found, record, &library, &preload)?;
    Ok(Outcome::Sliced)
}

/// Makes a slice's state for `record` (its `created` still empty), mounts it into the mount
/// namespace of `record.pid` with `preload` as its `/etc/ld.so.preload`, and writes the record.
/// Requires the state root's lock. On failure nothing is left behind.
pub(crate) fn make(
    opts: &Options,
    root: &Root,
    found: &settings::Settings,
    mut record: Record,
    library: &Path,
    preload: &str,
) -> Result<(), String> {
    let id = record.id.clone();
    make_node_dir(&opts.node_dir)?;
    make_agent_dir(&root.agent())?;
    let skeleton = root.make_skeleton().map_err(|e| {
        format!(
            "cannot make the mount points under {}: {e}",
            root.skeleton().display()
        )
    })?;
    let made = root
        .create(
            &id,
            &found.config_file(&id),
            cuslice_state::init::Init::of(record.pid).as_ref(),
            &opts.node_dir,
            &found.grant(&id, &opts.state_root),
        )
        .map_err(|e| {
            format!(
                "cannot write the slice state under {} and {}: {e}",
                root.dir(&id).display(),
                opts.node_dir.display()
            )
        })?;
    record.created = match inject(&Plan {
        pid: record.pid,
        rootfs: &record.rootfs,
        skeleton: &skeleton,
        mnt: &made.mnt,
        node_dir: &opts.node_dir,
        claims: &made.claims,
        slice: made.slice,
        agent_dir: &root.agent(),
        library,
        preload: Some(preload),
        cover: (record.slurm.is_some()).then_some(opts.node_dir.as_path()),
    }) {
        Ok(c) => c,
        Err(e) => {
            root.remove(&id, &[], &unmake);
            return Err(e);
        }
    };
    root.write_record(&record).map_err(|e| {
        // Without its record no later hook knows what this one made in the rootfs (which other
        // containers may share): it goes now, with the rest.
        unmake(&record.rootfs, &record.created);
        root.remove(&id, &[], &unmake);
        format!("cannot write {}: {e}", root.dir(&id).display())
    })?;
    Ok(())
}

/// The container's place in Kubernetes from its annotations, with the DRA claims the container
/// index names for it (comma-separated where more than one, each cleaned like the names).
fn kubernetes(annotations: &[(&str, &str)], index: &Path) -> Option<settings::Kubernetes> {
    let mut k = settings::kubernetes(annotations)?;
    let claims: Vec<String> = cuslice_cdi::indexed_claims(
        index,
        &k.namespace,
        &k.pod,
        &k.container,
        k.pod_uid.as_deref(),
    )
    .iter()
    .filter_map(|c| settings::clean_name(c))
    .collect();
    k.claim = settings::clean_name(&claims.join(","));
    Some(k)
}

/// The state root's lock, or one line saying why it cannot be had.
pub(crate) fn lock(root: &Root, opts: &Options) -> Result<cuslice_state::host::Locked, String> {
    root.lock().map_err(|e| {
        format!(
            "cannot use the state root {}: {e}",
            opts.state_root.display()
        )
    })
}

/// The node directory (the compute board), like /tmp: 1777, root's. Any account may have made
/// it first (a standalone slice's process makes it where it is missing), or put something else
/// in its place, so what is there is checked without following a link:
/// - a link, a file or a FIFO is removed (in the way, every container start failed; a link
///   put the board where that account chose);
/// - a directory of another account's is made root's (its owner could close it to the others,
///   or move their places out of it, sticky bit or not).
fn make_node_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let bad = |e: std::io::Error| format!("cannot make the node directory {}: {e}", dir.display());
    let root = nix::unistd::geteuid().is_root();
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) if root => std::fs::remove_file(dir).map_err(bad)?,
        Ok(_) => {
            return Err(format!(
                "{} is not a directory; remove it, and cuslice makes the node directory there",
                dir.display()
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(e)),
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(bad)?;
    }
    let made = match std::fs::DirBuilder::new().mode(0o1777).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(bad(e)),
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(bad)?;
    let m = f.metadata().map_err(bad)?;
    let theirs = root && m.uid() != 0;
    if theirs {
        std::os::unix::fs::fchown(&f, Some(0), Some(0)).map_err(bad)?;
    }
    if made || theirs {
        f.set_permissions(std::fs::Permissions::from_mode(0o1777))
            .map_err(bad)?;
    }
    Ok(())
}

/// The agent's directory, made if the agent has not run yet: mounted into the container now,
/// it shows the socket once the agent starts.
fn make_agent_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("cannot make the agent's directory {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// `poststop`.
pub fn poststop(opts: &Options, state_json: &str) -> Result<Outcome, String> {
    let state = read_state(state_json)?;
    let root = Root::new(&opts.state_root);
    if !root.dir(state.id()).exists() {
        return Ok(Outcome::Untouched);
    }
    let _lock = lock(&root, opts)?;
    let live: Vec<Record> = root
        .records()
        .into_iter()
        .filter(|r| &r.id != state.id() && r.alive())
        .collect();
    root.discard(state.id(), &live, &unmake);
    root.sweep(&unmake);
    drop(_lock);
    empty_trash_later(&root);
    Ok(Outcome::Removed)
}

/// Deletes the trash in a child that outlives the hook, so that the engine, which waits for the
/// hook to exit and close its output, does not wait for the deletion (see `Root::discard`). The
/// child holds none of the hook's descriptors (the state root's lock is released before this)
/// and has its own session. If it cannot be started, the next `poststop` empties the trash.
fn empty_trash_later(root: &Root) {
    use nix::unistd::{ForkResult, fork, setsid};
    // SAFETY: the hook is single-threaded (it starts no threads), so the child may do anything
    // the parent could; it leaves only through `_exit`.
    if let Ok(ForkResult::Child) = unsafe { fork() } {
        let _ = setsid();
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            use std::os::fd::AsRawFd;
            for fd in 0..3 {
                // SAFETY: dup2 onto the standard descriptors, which the child owns.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
        } else {
            for fd in 0..3 {
                // SAFETY: closes the standard descriptors, which the child owns and no longer
                // uses (the engine waits for their other ends to close).
                unsafe { libc::close(fd) };
            }
        }
        root.empty_trash();
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(0) }
    }
}

/// `sweep`: for operators and tests; every hook also sweeps.
pub fn sweep(opts: &Options) -> Result<Outcome, String> {
    let root = Root::new(&opts.state_root);
    let _lock = lock(&root, opts)?;
    let swept = root.sweep(&unmake);
    root.empty_trash();
    // Places on the compute board of this state root's containers that are gone (a directory
    // removed by hand), and standalone slices' leftovers.
    let live: Vec<String> = root
        .records()
        .into_iter()
        .filter(|r| r.alive())
        .map(|r| r.id)
        .collect();
    cuslice_state::board::sweep(
        &opts.node_dir,
        Some((&opts.state_root, &|id: &str| live.iter().any(|l| l == id))),
        &cuslice_state::host::take_off,
    );
    Ok(Outcome::Swept(swept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_directory_is_roots_whoever_made_it_and_nothing_else_stands_in_its_place() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        cuslice_test_harness::require_root("the node directory is made root's");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cuslice");
        let check = |what: &str| {
            let m = std::fs::symlink_metadata(&dir).unwrap();
            assert!(m.is_dir(), "{what}: not a directory");
            assert_eq!((m.uid(), m.gid()), (0, 0), "{what}: owner");
            assert_eq!(m.mode() & 0o7777, 0o1777, "{what}: mode");
        };
        make_node_dir(&dir).unwrap();
        check("missing");
        // Made by another account's process first, and closed to the others.
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        make_node_dir(&dir).unwrap();
        check("another account's");
        // A link to a directory of another's, a file, a FIFO in its place.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        make_node_dir(&dir).unwrap();
        check("a link");
        std::fs::remove_dir(&dir).unwrap();
        std::fs::write(&dir, "").unwrap();
        make_node_dir(&dir).unwrap();
        check("a file");
        std::fs::remove_dir(&dir).unwrap();
        nix::unistd::mkfifo(&dir, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        make_node_dir(&dir).unwrap();
        check("a FIFO");
        // An operator's own root directory keeps its mode.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1770)).unwrap();
        make_node_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o1770);
    }

    /// A bundle whose config.json is `spec`, and the state a runtime would pass for it.
    fn bundle(spec: serde_json::Value) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        let state = serde_json::json!({"ociVersion": "1.0.2", "id": "c1", "status": "creating",
            "pid": std::process::id(), "bundle": dir.path()});
        (dir, state.to_string())
    }

    #[test]
    fn a_pods_container_is_recorded_with_the_claim_the_container_index_names() {
        let index = tempfile::tempdir().unwrap();
        let write = |file: &str, text: &str| std::fs::write(index.path().join(file), text).unwrap();
        write(
            "team-a_job-0_trainer_u1.json",
            r#"{"podUID":"p1","cdiDevices":["gpu.cuslice.io/claim=u1-gpu-0"],"claim":"job-0-gpu-x7k"}"#,
        );
        // Another pod of the same name, another container, an unreadable entry: not its claims.
        write(
            "team-a_job-0_trainer_u0.json",
            r#"{"podUID":"p0","cdiDevices":[],"claim":"old"}"#,
        );
        write(
            "team-a_job-0_sidecar_u2.json",
            r#"{"podUID":"p1","cdiDevices":[],"claim":"other"}"#,
        );
        write("team-a_job-0_trainer_u3.json", "not json");
        let annotations = [
            ("io.kubernetes.cri.sandbox-namespace", "team-a"),
            ("io.kubernetes.cri.sandbox-name", "job-0"),
            ("io.kubernetes.cri.container-name", "trainer"),
            ("io.kubernetes.cri.sandbox-uid", "p1"),
        ];
        let k = kubernetes(&annotations, index.path()).unwrap();
        assert_eq!(k.claim.as_deref(), Some("job-0-gpu-x7k"));
        assert_eq!(k.pod, "job-0");
        // No index: the names without a claim; not a pod's container: nothing.
        let k = kubernetes(&annotations, Path::new("/nonexistent/index")).unwrap();
        assert_eq!((k.container.as_str(), k.claim), ("trainer", None));
        assert_eq!(kubernetes(&[("nerdctl/name", "web")], index.path()), None);
    }

    #[test]
    fn a_setting_in_a_field_of_the_wrong_type_is_refused_not_passed_over() {
        let opts = Options {
            state_root: PathBuf::from("/nonexistent/state"),
            node_dir: PathBuf::from("/nonexistent/node"),
            library: None,
            container_index: PathBuf::from("/nonexistent/index"),
        };
        for (spec, says) in [
            (
                serde_json::json!({"process": {"env": ["PATH=/bin", 7, "CUSLICE_MEMORY_LIMIT=1GiB"]}}),
                "process.env holds an entry that is not a string",
            ),
            (
                serde_json::json!({"annotations": {"cuslice.io/memory-limit": 1024}}),
                "the annotation cuslice.io/memory-limit is not a string",
            ),
        ] {
            let (_dir, state) = bundle(spec);
            let err = create(&opts, &state).unwrap_err();
            assert!(err.contains(says), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        // Without a cuslice setting, the hook leaves the container alone whatever else is in it.
        let (_dir, state) =
            bundle(serde_json::json!({"process": {"env": [7]}, "annotations": {"x": 1}}));
        assert_eq!(create(&opts, &state), Ok(Outcome::Untouched));
    }

    #[test]
    fn a_long_container_id_or_annotation_is_echoed_cut_short() {
        let opts = Options {
            state_root: PathBuf::from("/nonexistent/state"),
            node_dir: PathBuf::from("/nonexistent/node"),
            library: None,
            container_index: PathBuf::from("/nonexistent/index"),
        };
        let state = serde_json::json!({"ociVersion": "1.0.2", "id": "/".repeat(100_000),
            "status": "creating", "pid": 1, "bundle": "/nonexistent"});
        let err = create(&opts, &state.to_string()).unwrap_err();
        assert!(err.len() < 600, "{} bytes", err.len());
        let key = format!("cuslice.io/{}", "x".repeat(100_000));
        let (_dir, state) = bundle(serde_json::json!({"annotations": {key: 1}}));
        let err = create(&opts, &state).unwrap_err();
        assert!(err.len() < 600, "{} bytes", err.len());
    }

    #[test]
    fn a_library_without_its_core_beside_it_is_refused_with_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libcuslice.so");
        std::fs::write(&lib, b"loader").unwrap();
        let err = find_library(Some(&lib)).unwrap_err();
        assert!(!err.contains('\n'), "{err}");
        assert!(
            err.starts_with(&format!("{}: no such file", core_beside(&lib).display())),
            "{err}"
        );
        assert!(err.contains("cuslice install"), "{err}");
        std::fs::write(core_beside(&lib), b"core").unwrap();
        assert_eq!(find_library(Some(&lib)).unwrap(), lib);
    }
}
