//! Start-up: how a process joins its slice. At its first cuInit (or, in a process that never
//! calls it, such as nvidia-smi, at its first wrapped NVML call) it reads the configuration once,
//! opens the slice's ledger and takes a slot there, asks the node agent for its host pid (in a
//! container) and registers its fork handlers (`prepare`); once the real cuInit succeeded it
//! learns its devices, registers them with their caps in the ledger and takes its place on the
//! node's compute board (`attach_devices`, which sets up the compute meters). What it joined is
//! kept by `membership`.
//!
//! This sits above the modules it starts (`membership`, `agent`, `compute`); none of them
//! uses it. Only the NVML wrappers (`nvml`) call `prepare`, and the registry names `cuInit`.

use std::ffi::{c_int, c_uint};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cuda_abi::*;
use cuslice_policy::config::Config;
use parking_lot::Mutex;

use crate::log::{error, info};
use crate::membership::{self, Dev, Slice, State, uuid_string};
use crate::real;
use cuslice_state::ledger::Ledger;

/// Where the OCI hook mounts a container's slice (its `config` and `ledger`). When the config
/// file exists it is the only source of limits: the container's environment cannot lift them.
use cuslice_state::paths::{
    CONTAINER_CONFIG as HOOK_CONFIG, CONTAINER_SLICE_DIR as HOOK_SLICE_DIR,
};

/// Serialises joining and attaching the devices.
static INIT: Mutex<()> = Mutex::new(());

fn refuse(msg: std::fmt::Arguments<'_>) {
    error!("{msg}; CUDA initialisation refused");
    membership::set_refused();
}

/// The configuration, the slice's directory, and whether the OCI hook set them (a container).
fn read_config() -> Result<(Config, Option<PathBuf>, bool), String> {
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    match std::fs::read_to_string(HOOK_CONFIG) {
        Ok(text) => Config::from_hook_file(&text, env)
            .map(|c| (c, Some(PathBuf::from(HOOK_SLICE_DIR)), true))
            .map_err(|e| format!("{HOOK_CONFIG}: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Config::from_vars(env)
            .map(|c| {
                let dir = c.state_dir.clone();
                (c, dir, false)
            })
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!("cannot read {HOOK_CONFIG}: {e}")),
    }
}

/// Reads the configuration and joins the slice (once). Returns false if CUDA must be refused.
pub fn prepare() -> bool {
    if let Some(ok) = membership::settled() {
        return ok;
    }
    let _g = INIT.lock();
    if let Some(ok) = membership::settled() {
        return ok;
    }
    register_fork_handlers();
    let (config, dir, in_container) = match read_config() {
        Ok(c) => c,
        Err(e) => {
            refuse(format_args!("{e}"));
            return false;
        }
    };
    crate::log::set_level(config.log);
    for n in &config.notices {
        error!("{n}");
    }
    if dir.is_none() && !config.any_limit() {
        membership::set_off();
        return true;
    }
    let ledger = match dir.as_deref().map(absolute) {
        Some(d) => Ledger::open_dir(&d),
        None => Ledger::private(),
    };
    let ledger = match ledger {
        Ok(l) => l,
        Err(e) => {
            refuse(format_args!("{e}"));
            return false;
        }
    };
    let slot = match ledger.register() {
        Ok(s) => s,
        Err(e) => {
            refuse(format_args!("{e}"));
            return false;
        }
    };
    info!("joined slice {} as slot {slot}", ledger.path().display());
    let slice = Box::new(Slice {
        config,
        ledger,
        slot,
        hooked: in_container,
        devs: OnceLock::new(),
    });
    if in_container {
        // NVML names this process by its host pid, which only the node agent can tell it.
        crate::agent::tell_slot(&slice);
    }
    membership::set_joined(slice);
    true
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn device_uuid(d: CUdevice) -> Option<[u8; 16]> {
    let mut u = CUuuid { bytes: [0; 16] };
    let f = real::cuDeviceGetUuid_v2().or(real::cuDeviceGetUuid())?;
    // SAFETY: a writable CUuuid and a device handle from cuDeviceGet.
    (unsafe { f(&mut u, d) }).is_ok().then_some(u.bytes)
}

fn granularity(ordinal: c_int) -> u64 {
    const DEFAULT: u64 = 2 << 20;
    let Some(f) = real::cuMemGetAllocationGranularity() else {
        return DEFAULT;
    };
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        compressionType: 0,
        gpuDirectRDMACapable: 0,
        usage: 0,
        reserved: [0; 4],
    };
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property struct.
    let r = unsafe { f(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
    if r.is_ok() && g > 0 {
        g as u64
    } else {
        DEFAULT
    }
}

/// After the real cuInit succeeded: learns the devices and registers them (with this process's
/// caps) in the ledger. False if CUDA must be refused.
pub fn attach_devices() -> bool {
    let State::On(s) = membership::state() else {
        return membership::settled() != Some(false);
    };
    if s.devs.get().is_some() {
        return true;
    }
    let _g = INIT.lock();
    if s.devs.get().is_some() {
        return true;
    }
    let (Some(get_count), Some(get), Some(total)) = (
        real::cuDeviceGetCount(),
        real::cuDeviceGet(),
        real::cuDeviceTotalMem_v2(),
    ) else {
        refuse(format_args!(
            "the CUDA driver lacks cuDeviceGetCount/cuDeviceGet/cuDeviceTotalMem_v2"
        ));
        return false;
    };
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    if !unsafe { get_count(&mut n) }.is_ok() {
        n = 0;
    }
    // A setting for a device this process does not see would apply to none, and the device
    // the user meant would run without it: refused, before any device is registered. In a
    // container whose GPUs the hook recorded, the settings number the container's GPUs (the
    // hook checked them against those), not this process's.
    if s.config.gpus().is_none()
        && let Err(e) = s
            .config
            .check_device_count(n.max(0) as u32, "this process sees")
    {
        refuse(format_args!("{e}"));
        return false;
    }
    let mut devs = Vec::new();
    for i in 0..n {
        let mut d: CUdevice = 0;
        let mut bytes = 0usize;
        // SAFETY: valid out-pointers; `i` is below the device count.
        if !unsafe { get(&mut d, i) }.is_ok() || !unsafe { total(&mut bytes, d) }.is_ok() {
            refuse(format_args!("cannot query CUDA device {i}"));
            return false;
        }
        let Some(uuid) = device_uuid(d) else {
            refuse(format_args!("cannot read the UUID of CUDA device {i}"));
            return false;
        };
        let cap = crate::nvml_query::device_limits(&s.config, i as u32, &uuid).memory;
        let index = match s.ledger.device(uuid, cap) {
            Ok((index, effective)) => {
                if let Some(c) = effective {
                    info!(
                        "device {i} ({}): cap {} of {}",
                        uuid_string(&uuid),
                        cuslice_policy::format_size(c),
                        cuslice_policy::format_size(bytes as u64)
                    );
                }
                if let Some(spill) = s.config.memory_spill {
                    let slice = s.ledger.set_spill_limit(index, spill);
                    if slice != spill {
                        crate::log::warning!(
                            "device {i}: the slice spills up to {} in all, as its first process \
                             said; CUSLICE_MEMORY_SPILL={} here bounds what this process spills",
                            cuslice_policy::format_size(slice),
                            cuslice_policy::format_size(spill)
                        );
                    }
                }
                index
            }
            Err(e) => {
                refuse(format_args!("{e}"));
                return false;
            }
        };
        devs.push(Dev {
            cudev: d,
            index,
            uuid,
            physical: bytes as u64,
            granularity: granularity(i),
        });
    }

    // The meters first: whoever sees the devices set finds them.
    if let Err(e) = crate::compute::join(s, &devs) {
        refuse(format_args!("{e}"));
        return false;
    }
    let _ = s.devs.set(devs);
    crate::freeze::start(s);
    true
}

// ---- cuInit ----------------------------------------------------------------------------------

/// # Safety
/// The CUDA driver API contract of cuInit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    let Some(f) = real::cuInit() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    if !prepare() {
        return CUresult::CUDA_ERROR_NOT_PERMITTED;
    }
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(flags) };
    if r.is_ok() && !attach_devices() {
        return CUresult::CUDA_ERROR_NOT_PERMITTED;
    }
    r
}

// ---- fork ------------------------------------------------------------------------------------

extern "C" fn before_fork() {
    std::mem::forget(INIT.lock());
    membership::before_fork();
}

fn unlock_after_fork() {
    // SAFETY: all locked by before_fork in this thread, with their guards forgotten.
    unsafe {
        membership::unlock_after_fork();
        INIT.force_unlock();
    }
}

extern "C" fn parent_after_fork() {
    unlock_after_fork();
}

/// The child has no CUDA state of its own and must not pass for its parent in the ledger: it
/// starts over (a fresh registration at its own cuInit), and drops the parent's liveness lock.
extern "C" fn child_after_fork() {
    // The child has one thread.
    unlock_after_fork();
    crate::freeze::child_after_fork();
    if membership::child_after_fork() {
        crate::compute::child_after_fork();
    }
}

fn register_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers three extern "C" fns that live as long as the library.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(parent_after_fork),
                Some(child_after_fork),
            )
        };
    });
}
