//! The previous ledger format (version 6), for the node's tools: after an upgrade, the slices
//! the previous release started keep their old library mapped and keep writing this format, and
//! `cuslice status`, `top`, the exporter, the agent and `cuslice set` must still read and change
//! them (docs/upgrades.md). Nothing here joins a slice: as for the current format, the file is
//! read with `pread` into a copy and fields are written with `pwrite`, one aligned word each.
//!
//! The layout is version 7's without what 7 added: a device record has no wait queue (`waiters`,
//! `wake`, `queue`, `wait_next`) and no spill (`spill_limit`, `spilled`, `spill_peak`), a process
//! record no `spilled`. The structs below are version 6's, field for field (from the release that
//! wrote it); a version-6 slice never waits or spills, so its snapshot shows none.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use cuslice_shm::OwnerLock;

use super::{
    LIMIT_UNSET, LIVE, LIVE_CORE, LIVE_MEMORY, LIVE_PRIORITY, LIVENESS_BASE, LedgerError,
    LiveChange, MARKS, MAX_DEVICES, MAX_PROCS, Mark, read_bytes, read_u32, read_u64, uuid_words,
    write_at,
};
use crate::snapshot::{DeviceSnapshot, MeteredBy, ProcSnapshot, Snapshot};

pub(super) const VERSION: u32 = 6;

#[repr(C)]
pub(super) struct Header {
    magic: [u8; 8],
    version: u32,
    header_size: u32,
    file_size: u64,
    max_devices: u32,
    max_procs: u32,
    procs_used: AtomicU32,
    slice_id: u64,
    devices: [DeviceRec; MAX_DEVICES],
    procs: [ProcRec; MAX_PROCS],
}

#[repr(C, align(64))]
struct DeviceRec {
    lock: OwnerLock,
    state: AtomicU32,
    live: AtomicU32,
    limit: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    uuid: [AtomicU64; 2],
    measure: OwnerLock,
    refusals: AtomicU64,
    context_overhead: AtomicU64,
    tokens: AtomicI64,
    last_refill: AtomicU64,
    share: AtomicU32,
    estimated: AtomicU32,
    core_request: AtomicU32,
    core_limit: AtomicU32,
    priority: AtomicU32,
    device_ns: AtomicU64,
    throttled_ns: AtomicU64,
    metered_ns: AtomicU64,
    marks_seq: AtomicU64,
    marks: [Mark; MARKS],
}

#[repr(C)]
struct ProcRec {
    state: AtomicU32,
    generation: AtomicU32,
    pid: AtomicI32,
    host_pid: AtomicI32,
    charged: [AtomicU64; MAX_DEVICES],
    beat_ns: AtomicU64,
    usage: [AtomicU32; MAX_DEVICES],
}

// The sizes version 6 has on x86_64 and aarch64 (what its files measure): a change to the
// structs above that moved a field would change them.
const _: () = assert!(std::mem::size_of::<DeviceRec>() == 576);
const _: () = assert!(std::mem::size_of::<ProcRec>() == 792);

/// Where field `$field` of device record `$d` lies in a version-6 file.
macro_rules! dev6_at {
    ($d:expr, $field:ident) => {
        std::mem::offset_of!(Header, devices)
            + $d * std::mem::size_of::<DeviceRec>()
            + std::mem::offset_of!(DeviceRec, $field)
    };
}

/// Where field `$field` of process record `$s` lies in a version-6 file.
macro_rules! proc6_at {
    ($s:expr, $field:ident) => {
        std::mem::offset_of!(Header, procs)
            + $s * std::mem::size_of::<ProcRec>()
            + std::mem::offset_of!(ProcRec, $field)
    };
}

/// The size of every version-6 ledger file.
pub(super) fn size() -> usize {
    std::mem::size_of::<Header>()
}

/// A zeroed version-6 header on the heap.
pub(super) fn zeroed() -> Box<Header> {
    // SAFETY: every field of `Header` is an integer, an atomic integer or a lock word, for all of
    // which all-zero bytes are a valid value.
    unsafe { Box::<Header>::new_zeroed().assume_init() }
}

fn bytes_of(copy: &mut Header) -> &mut [u8] {
    // SAFETY: `copy` is `size()` bytes we hold exclusively; any bytes are a valid `Header`.
    unsafe { std::slice::from_raw_parts_mut((copy as *mut Header).cast::<u8>(), size()) }
}

/// Reads the header, the device records and the process slots ever taken into `copy`.
fn read_used(f: &File, copy: &mut Header) {
    let table = std::mem::offset_of!(Header, procs);
    read_bytes(f, bytes_of(copy), 0, table);
    let used = (copy.procs_used.load(Ordering::Relaxed) as usize).min(MAX_PROCS);
    let end = table + used * std::mem::size_of::<ProcRec>();
    read_bytes(f, bytes_of(copy), table, end);
}

/// What the version-6 ledger in `f` holds now, copied out through `copy`: as the current
/// format's `ReadOnly::snapshot`, a device's marks taken from a copy no writer was changing.
pub(super) fn snapshot(f: &File, copy: &mut Header) -> Snapshot {
    for _ in 0..10 {
        read_used(f, copy);
        if marks_settled(f, copy) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(f);
    snapshot_of(copy, |s| {
        cuslice_shm::liveness::held_by_other(fd, LIVENESS_BASE + s as i64)
    })
}

fn marks_settled(f: &File, copy: &Header) -> bool {
    copy.devices.iter().enumerate().all(|(i, d)| {
        if d.state.load(Ordering::Relaxed) != LIVE {
            return true;
        }
        let seq = d.marks_seq.load(Ordering::Relaxed);
        seq.is_multiple_of(2) && read_u64(f, dev6_at!(i, marks_seq) as u64) == Some(seq)
    })
}

fn uuid_of(rec: &DeviceRec) -> [u8; 16] {
    let mut u = [0u8; 16];
    let (a, b) = u.split_at_mut(8);
    a.copy_from_slice(&rec.uuid[0].load(Ordering::Relaxed).to_be_bytes());
    b.copy_from_slice(&rec.uuid[1].load(Ordering::Relaxed).to_be_bytes());
    u
}

fn snapshot_of(h: &Header, alive: impl Fn(usize) -> bool) -> Snapshot {
    let devices: Vec<(usize, DeviceSnapshot)> = h
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.state.load(Ordering::Relaxed) == LIVE)
        .map(|(i, d)| (i, device_snapshot(d)))
        .collect();
    let procs = h
        .procs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.state.load(Ordering::Relaxed) == LIVE)
        .map(|(s, p)| ProcSnapshot {
            pid: p.pid.load(Ordering::Relaxed),
            host_pid: Some(p.host_pid.load(Ordering::Relaxed)).filter(|&h| h > 0),
            alive: alive(s),
            charged: devices
                .iter()
                .map(|(i, _)| p.charged.get(*i).map_or(0, |c| c.load(Ordering::Relaxed)))
                .collect(),
            spilled: vec![0; devices.len()],
        })
        .collect();
    Snapshot {
        version: VERSION,
        slice_id: h.slice_id,
        devices: devices.into_iter().map(|(_, d)| d).collect(),
        procs,
    }
}

fn device_snapshot(r: &DeviceRec) -> DeviceSnapshot {
    // The copy is ours: its marks are consistent when their count is even (a writer was not at
    // work when it was read); otherwise there is no history to show yet.
    let mut marks: Vec<crate::snapshot::Mark> = Vec::new();
    if r.marks_seq.load(Ordering::Relaxed).is_multiple_of(2) {
        marks = r
            .marks
            .iter()
            .filter(|m| m.at_ns.load(Ordering::Relaxed) != 0)
            .map(|m| crate::snapshot::Mark {
                at_ns: m.at_ns.load(Ordering::Relaxed),
                device_ns: m.device_ns.load(Ordering::Relaxed),
                throttled_ns: m.throttled_ns.load(Ordering::Relaxed),
            })
            .collect();
    }
    marks.sort_by_key(|m| m.at_ns);
    let limit = r.limit.load(Ordering::Relaxed);
    DeviceSnapshot {
        uuid: uuid_of(r),
        limit: (limit != LIMIT_UNSET).then_some(limit),
        spill_limit: None,
        spilled: 0,
        spill_peak: 0,
        waiting: 0,
        used: r.used.load(Ordering::Relaxed),
        peak: r.peak.load(Ordering::Relaxed),
        refusals: r.refusals.load(Ordering::Relaxed),
        context_overhead: r.context_overhead.load(Ordering::Relaxed),
        core_request: r.core_request.load(Ordering::Relaxed),
        core_limit: r.core_limit.load(Ordering::Relaxed),
        priority: r.priority.load(Ordering::Relaxed),
        live: r.live.load(Ordering::Relaxed),
        allotted: r.share.load(Ordering::Relaxed),
        device_ns: r.device_ns.load(Ordering::Relaxed),
        throttled_ns: r.throttled_ns.load(Ordering::Relaxed),
        metered_by: MeteredBy::from_code(r.estimated.load(Ordering::Relaxed)),
        metered_ns: r.metered_ns.load(Ordering::Relaxed),
        marks,
    }
}

/// `Ledger::set_live` on a version-6 file: the same fields, which version 6's library reads the
/// same way (the `live` bits, then the values), at version 6's offsets.
pub(super) fn set_live(
    f: &File,
    path: &Path,
    uuid: &[u8; 16],
    change: &LiveChange,
) -> Result<(), LedgerError> {
    let mut copy = zeroed();
    read_bytes(
        f,
        bytes_of(&mut copy),
        0,
        std::mem::offset_of!(Header, procs),
    );
    let (a, b) = uuid_words(uuid);
    let d = copy
        .devices
        .iter()
        .position(|r| {
            r.state.load(Ordering::Relaxed) == LIVE
                && r.uuid[0].load(Ordering::Relaxed) == a
                && r.uuid[1].load(Ordering::Relaxed) == b
        })
        .ok_or_else(|| LedgerError::NoDevice {
            path: path.to_path_buf(),
            uuid: crate::uuid_string(uuid),
        })?;
    let mut live = copy.devices[d].live.load(Ordering::Relaxed);
    let io = |err| LedgerError::Io {
        path: path.to_path_buf(),
        err,
    };
    if let Some(bytes) = change.memory {
        write_at(f, dev6_at!(d, limit), &bytes.to_ne_bytes()).map_err(io)?;
        live |= LIVE_MEMORY;
    }
    if let Some((request, limit)) = change.core {
        write_at(f, dev6_at!(d, core_request), &request.to_ne_bytes()).map_err(io)?;
        write_at(f, dev6_at!(d, core_limit), &limit.to_ne_bytes()).map_err(io)?;
        live |= LIVE_CORE;
    }
    if let Some(code) = change.priority {
        write_at(f, dev6_at!(d, priority), &code.to_ne_bytes()).map_err(io)?;
        live |= LIVE_PRIORITY;
    }
    write_at(f, dev6_at!(d, live), &live.to_ne_bytes()).map_err(io)
}

/// `Ledger::tell_host_pids` on a version-6 file.
pub(super) fn tell_host_pids(
    f: &File,
    path: &Path,
    host: &dyn Fn(i32) -> Option<i32>,
) -> Result<(), LedgerError> {
    let mut copy = zeroed();
    read_used(f, &mut copy);
    let io = |err: io::Error| LedgerError::Io {
        path: path.to_path_buf(),
        err,
    };
    for (s, p) in copy.procs.iter().enumerate() {
        let generation = p.generation.load(Ordering::Relaxed);
        if p.state.load(Ordering::Relaxed) != LIVE {
            continue;
        }
        let Some(h) = host(p.pid.load(Ordering::Relaxed)) else {
            continue;
        };
        if p.host_pid.load(Ordering::Relaxed) == h {
            continue;
        }
        write_at(f, proc6_at!(s, host_pid), &h.to_ne_bytes()).map_err(io)?;
        if read_u32(f, proc6_at!(s, generation) as u64) != Some(generation) {
            write_at(f, proc6_at!(s, host_pid), &0i32.to_ne_bytes()).map_err(io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
