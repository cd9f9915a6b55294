//! cuslice's SPANK plugin. slurmd and slurmstepd load it from `plugstack.conf`:
//!
//! ```text
//! required /usr/local/lib/cuslice/cuslice_spank.so hook=/usr/local/bin/cuslice-hook
//! ```
//!
//! - `slurm_spank_task_init_privileged` runs in each task of each step, as root, after the fork
//!   and before the task drops its privileges and execs the user's program. It gives the task a
//!   mount namespace of its own (whose mounts never reach the node's: `/` is made a slave) and
//!   runs `cuslice-hook slurm-task`, which makes the job's slice on first use (its limits from
//!   the job's GPUs and shards, as slurmctld and slurmd tell them) and mounts it into that
//!   namespace with `/etc/ld.so.preload`, as it does into a container. Everything the task
//!   starts inherits the namespace; the job can neither unmount nor remount (no
//!   `CAP_SYS_ADMIN`), so unsetting `LD_PRELOAD`, setting its own `CUSLICE_*` or starting
//!   processes with `env -i` changes nothing.
//! - `slurm_spank_job_epilog` runs `cuslice-hook slurm-epilog`, which removes the job's slice.
//!
//! Arguments (after the path in `plugstack.conf`): `hook=PATH` (default
//! `/usr/local/bin/cuslice-hook`), and `state_root=DIR`, `node_dir=DIR`, `library=PATH`, passed
//! to the hook as its options of those names. A failure is one line in slurmd's log and the
//! task's error output, and fails the task: with `required`, no task runs on a GPU uncapped
//! because its slice could not be made.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::process::Command;

/// The names slurmd's plugin loader looks up.
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 8] = *b"cuslice\0";
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 6] = *b"spank\0";
/// The Slurm release (`SLURM_VERSION_NUMBER`) of the headers it was built with (build.rs); 0
/// when there were none.
#[unsafe(no_mangle)]
pub static plugin_version: c_uint = include!(concat!(env!("OUT_DIR"), "/slurm_version.rs"));
#[unsafe(no_mangle)]
pub static spank_plugin_version: c_uint = 1;

type Spank = *mut c_void;

/// `enum spank_item` in `slurm/spank.h`.
const S_JOB_ID: c_int = 2;
/// `ESPANK_SUCCESS`.
const SUCCESS: c_int = 0;
const DEFAULT_HOOK: &str = "/usr/local/bin/cuslice-hook";

// Resolved in slurmd, slurmstepd, srun and sbatch, which load the plugin.
unsafe extern "C" {
    fn spank_get_item(sp: Spank, item: c_int, ...) -> c_int;
    fn slurm_error(format: *const c_char, ...);
}

fn log_error(line: &str) {
    let line = CString::new(line.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a "%s" format with one NUL-terminated string, as slurm_error's printf-style
    // contract asks.
    unsafe { slurm_error(c"cuslice: %s".as_ptr(), line.as_ptr()) };
}

/// The plugin's arguments from `plugstack.conf`.
struct Args {
    hook: String,
    options: Vec<String>,
}

/// # Safety
/// `av` holds `ac` NUL-terminated strings (or is null with `ac` 0), as slurm passes them.
unsafe fn args(ac: c_int, av: *const *const c_char) -> Result<Args, String> {
    let mut out = Args {
        hook: DEFAULT_HOOK.to_string(),
        options: Vec::new(),
    };
    for i in 0..usize::try_from(ac).unwrap_or(0) {
        if av.is_null() {
            break;
        }
        // SAFETY: i < ac, and the caller promises ac valid C strings.
        let arg = unsafe { CStr::from_ptr(*av.add(i)) }.to_string_lossy();
        match arg.split_once('=') {
            Some(("hook", path)) => out.hook = path.to_string(),
            Some((name @ ("state_root" | "node_dir" | "library"), value)) => {
                out.options.push(format!("--{}", name.replace('_', "-")));
                out.options.push(value.to_string());
            }
            _ => {
                return Err(format!(
                    "plugstack.conf gives the argument {arg:?}, which cuslice_spank.so does not \
                     know; write e.g. hook=/usr/local/bin/cuslice-hook (known: hook, state_root, \
                     node_dir, library)"
                ));
            }
        }
    }
    Ok(out)
}

fn job_id(sp: Spank) -> Option<u32> {
    let mut id: u32 = 0;
    // SAFETY: S_JOB_ID takes one uint32_t *, which points at `id`.
    let rc = unsafe { spank_get_item(sp, S_JOB_ID, &mut id as *mut u32) };
    // Never the job's SLURM_JOB_ID: its user sets the job's environment.
    (rc == SUCCESS && id != 0).then_some(id)
}

/// Runs the hook; its last line of stderr on failure.
fn hook(args: &Args, stage: &str, extra: &[String]) -> Result<(), String> {
    let out = Command::new(&args.hook)
        .arg(stage)
        .args(&args.options)
        .args(extra)
        .output()
        .map_err(|e| format!("cannot run {} ({e}); the task is not started", args.hook))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!(
        "{} {stage} failed ({}): {line}",
        args.hook, out.status
    ))
}

/// A mount namespace of the calling task's own, whose mounts do not propagate to the node's.
fn own_mount_namespace() -> Result<(), String> {
    // SAFETY: unshare and mount with constant, valid arguments; they change only this process.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    if rc != 0 {
        return Err(format!(
            "cannot give the task a mount namespace of its own: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above; null source, type and data are what a propagation change takes.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot keep the task's mounts from the node's: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn task_init(sp: Spank, args: &Args) -> Result<(), String> {
    let job = job_id(sp).ok_or("slurmstepd gave no job id")?;
    own_mount_namespace()?;
    // The hook starts in the task's namespace; it does the node's side of its work in
    // slurmstepd's, which is the node's.
    let mut extra = vec![
        "--job".to_string(),
        job.to_string(),
        "--pid".to_string(),
        std::process::id().to_string(),
        "--host-pid".to_string(),
        std::os::unix::process::parent_id().to_string(),
    ];
    // This node's name in slurm.conf, from slurmstepd's own environment (slurmd sets it there),
    // never the job's: its user sets that, and a job naming another node would get that node's
    // GPUs, or no slice at all.
    if let Some(node) = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.is_empty())
    {
        extra.extend(["--node".to_string(), node]);
    }
    hook(args, "slurm-task", &extra)
}

/// Each task, as root, before it execs the user's program.
///
/// # Safety
/// Called by slurmstepd with its handle and the plugin's arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_task_init_privileged(
    sp: Spank,
    ac: c_int,
    av: *const *const c_char,
) -> c_int {
    // SAFETY: slurm passes ac arguments in av.
    let result = unsafe { args(ac, av) }.and_then(|a| task_init(sp, &a));
    match result {
        Ok(()) => 0,
        Err(e) => {
            log_error(&e);
            -1
        }
    }
}

/// At the job's end on this node (after `scancel` too), as root.
///
/// # Safety
/// Called by slurmd with its handle and the plugin's arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_job_epilog(
    sp: Spank,
    ac: c_int,
    av: *const *const c_char,
) -> c_int {
    // SAFETY: slurm passes ac arguments in av.
    let result = unsafe { args(ac, av) }.and_then(|a| {
        let job = job_id(sp).ok_or("slurmd gave the epilog no job id")?;
        hook(&a, "slurm-epilog", &["--job".to_string(), job.to_string()])
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            log_error(&e);
            -1
        }
    }
}
