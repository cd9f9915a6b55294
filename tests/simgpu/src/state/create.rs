//! Making a new state file: laid out and filled in under a temporary name, then published with a
//! hard link, so a half-made file is never mistaken for a state.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{CreateOptions, Mapping, State, StateError, data_path, io_err};
use crate::clock;
use crate::layout::*;

impl State {
    pub(super) fn make(path: &Path, opts: &CreateOptions) -> Result<(), StateError> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".simgpu-new-{}-{}",
            std::process::id(),
            clock::now_ns()
        ));
        let ngran = (opts.memory / GRANULE) as u32;
        let dl = DeviceLayout::new(ngran);
        let header_size = align_up(std::mem::size_of::<Header>() as u64, 4096);
        let file_size = header_size + dl.size * opts.devices as u64;
        let result = (|| {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(&tmp)
                .map_err(io_err("create", &tmp))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io_err("chmod", &tmp))?;
            f.set_len(file_size).map_err(io_err("size", &tmp))?;
            let map = Mapping::new(&f, file_size as usize).map_err(io_err("map", &tmp))?;
            // SAFETY: the file is new, private to us until linked, and `file_size` long.
            unsafe { init_file(map.base, header_size, &dl, opts) }
                .map_err(io_err("initialise", &tmp))?;
            let data = data_path(path);
            let df = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o666)
                .open(&data)
                .map_err(io_err("create", &data))?;
            df.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io_err("chmod", &data))?;
            df.set_len(opts.memory * opts.devices as u64)
                .map_err(io_err("size", &data))?;
            // Publish atomically; if another process won the race, use its file.
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(io_err("create", path)(e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        result
    }
}

/// # Safety
/// `base` must map a new, zero-filled file of the size computed from `header_size` and `dl`.
unsafe fn init_file(
    base: *mut u8,
    header_size: u64,
    dl: &DeviceLayout,
    o: &CreateOptions,
) -> io::Result<()> {
    // SAFETY: per the contract the memory is ours, zeroed (a valid value for every field) and
    // large enough for the header and every device block.
    unsafe {
        let h = &mut *(base as *mut Header);
        h.version = LAYOUT_VERSION;
        h.header_size = header_size as u32;
        h.file_size = header_size + dl.size * o.devices as u64;
        h.machine_id = random_u64();
        h.ndev = o.devices;
        h.nvlink = o.nvlink.into();
        h.config = SimConfig {
            context_overhead: o.context_overhead,
            timeslice_ns: o.timeslice_ns,
            switch_ns: o.switch_ns,
            util_sample_ns: o.util_sample_ns,
            wall_at_mono_zero_us: crate::clock::wall_us() - crate::clock::now_ns() / 1000,
            memory: o.memory,
            driver_version: o.driver_version,
            sm_count: o.sm_count,
            cc_major: 9,
            cc_minor: 0,
            name: cstr_field(&o.name),
            nvml_driver_version: cstr_field("580.95.05"),
        };
        h.process_samples = AtomicU32::new(o.process_samples as u32);
        // The locks and the lockers' generations are zero: free.
        for d in 0..o.devices {
            let off = header_size + dl.size * d as u64;
            let b = &mut *(base.add(off as usize) as *mut DeviceBlock);
            let mut uuid = [0u8; 16];
            uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
            uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
            uuid[6] = (uuid[6] & 0x0f) | 0x40; // an RFC 4122 version-4 UUID, like real GPUs'
            uuid[8] = (uuid[8] & 0x3f) | 0x80;
            h.devices[d as usize] = DeviceInfo {
                index: d,
                // Apart like a real 8-GPU server's, and within the 8-bit bus number for all 16.
                pci_bus: 0x18 + d * 0x0e,
                uuid,
                total: o.memory,
                ngran: (o.memory / GRANULE) as u32,
                _pad: 0,
                block_off: off,
                granules_off: off + dl.granules,
                allocs_off: off + dl.allocs,
                bitmap_off: off + dl.bitmap,
                data_off: o.memory * d as u64,
            };
            b.engine.current = NONE;
            b.engine.loaded = NONE;
            for c in b.ctxs.iter_mut() {
                c.overhead = NONE;
            }
        }
        // The magic goes last: a half-made file is never mistaken for a state.
        std::sync::atomic::fence(Ordering::SeqCst);
        h.magic = MAGIC;
    }
    Ok(())
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    if n != 8 {
        return clock::now_ns() ^ (std::process::id() as u64) << 32;
    }
    u64::from_le_bytes(b)
}
