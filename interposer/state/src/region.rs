//! The node-level region of one device: a small shared file per device UUID
//! (`$CUSLICE_NODE_DIR/<UUID>`, by default `/dev/shm/cuslice/<UUID>`; the OCI hook mounts the
//! host's directory into containers at the same path) in which every process of every slice that
//! uses the device has a slot: its slice, the slice's request and limit, what it used in the last
//! period and whether it was held back. Each process computes its own slice's allotment from it.
//! It also carries each slot's priority and, for the device, when the high-priority work launched
//! so far is expected to be done (see `cuslice_policy::priority`).
//!
//! A slot is alive while its process holds an OFD lock on the slot's byte: the kernel drops it
//! when the process dies, however it dies, so a dead slice's claims vanish without help. Joining
//! checks, under the region's robust mutex, that the requests of the slices on the device do not
//! add up to more than the device.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use cuslice_policy::priority::Priority;
use cuslice_policy::share::{Demand, FULL};
use cuslice_shm::{Locked, RobustMutex, liveness};

pub const MAGIC: [u8; 8] = *b"CUSLNODE";
/// 2: slot priority and the device's high-priority `high_until`.
pub const VERSION: u32 = 2;
pub const MAX_SLOTS: usize = 256;
pub const DEFAULT_DIR: &str = "/dev/shm/cuslice";
const LIVENESS_BASE: i64 = 1 << 40;

const FREE: u32 = 0;
const LIVE: u32 = 1;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    size: u32,
    lock: RobustMutex,
    /// When the high-priority work launched on the device so far is expected to be done
    /// (CLOCK_MONOTONIC ns): raised by each launch of a high-priority slice, read at the gate of
    /// the slices that yield to it.
    high_until: AtomicU64,
    slots: [Slot; MAX_SLOTS],
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    pid: AtomicI32,
    slice: AtomicU64,
    request: AtomicU32,
    limit: AtomicU32,
    /// Share of the device used in the last period (ppm).
    usage: AtomicU32,
    hungry: AtomicU32,
    /// The slice's allotment as this process last computed it (ppm), for status tools.
    allot: AtomicU32,
    /// The slice's `Priority::code()` (0: normal).
    priority: AtomicU32,
    /// When the process last launched work (CLOCK_MONOTONIC ns); 0: never.
    active_ns: AtomicU64,
}

/// This process's membership of one device's region.
pub struct Region {
    map: *mut Header,
    file: File,
    path: PathBuf,
    slot: usize,
    slice: u64,
}

// SAFETY: the mapping is shared memory touched only through atomics and under a robust mutex.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("cannot use the node region {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error(
        "{path} is not a cuslice node region of version {VERSION} (remove it once no process uses the device, or set CUSLICE_NODE_DIR to another directory)"
    )]
    Foreign { path: PathBuf },
    #[error(
        "CUSLICE_CORE_REQUEST: device {uuid} has {taken}% requested by other slices, so a request of {asked}% would promise more than the whole device; ask for at most {left}% (e.g. CUSLICE_CORE_REQUEST={left})"
    )]
    Oversubscribed {
        uuid: String,
        taken: u32,
        asked: u32,
        left: u32,
    },
    #[error("{path}: all {MAX_SLOTS} slots are in use")]
    Full { path: PathBuf },
}

fn size() -> usize {
    std::mem::size_of::<Header>()
}

fn pct(ppm: u32) -> u32 {
    ppm.div_ceil(FULL / 100)
}

/// What one slice on the device is doing, summed over its processes.
#[derive(Debug, Clone, Copy)]
pub struct SliceView {
    pub slice: u64,
    pub demand: Demand,
    pub priority: Priority,
}

impl Region {
    /// Joins the region of device `uuid` under `dir` as a process of `slice`, with the slice's
    /// request and limit (ppm). Refuses a request the device cannot guarantee.
    pub fn join(
        dir: &Path,
        uuid: &str,
        slice: u64,
        request: u32,
        limit: u32,
    ) -> Result<Region, RegionError> {
        let path = dir.join(uuid);
        let io = |err| RegionError::Io {
            path: path.clone(),
            err,
        };
        let file = open_or_create(dir, uuid).map_err(io)?;
        let mut head = [0u8; 16];
        let n = (&file).read(&mut head).map_err(io)?;
        let version = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]);
        let stored = u32::from_ne_bytes([head[12], head[13], head[14], head[15]]);
        let len = file.metadata().map_err(io)?.len();
        if n < 16
            || head[..8] != MAGIC
            || version != VERSION
            || stored as usize != size()
            || len != size() as u64
        {
            return Err(RegionError::Foreign { path });
        }
        let map = map(&file).map_err(io)?;
        let mut r = Region {
            map,
            file,
            path,
            slot: usize::MAX,
            slice,
        };
        r.take_slot(uuid, request, limit)?;
        Ok(r)
    }

    /// Makes this process's claim on the device `request` and `limit` (ppm) when it is not
    /// already: what the node changed in the slice's ledger (`cuslice set`), which checked the
    /// device's requests first (`set_claim`).
    pub fn claim(&self, request: u32, limit: u32) {
        let me = self.me();
        if me.request.load(Ordering::Relaxed) != request {
            me.request.store(request, Ordering::Relaxed);
        }
        if me.limit.load(Ordering::Relaxed) != limit {
            me.limit.store(limit, Ordering::Relaxed);
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping lives as long as `self` and was validated.
        unsafe { &*self.map }
    }

    fn alive(&self, s: usize) -> bool {
        s == self.slot || liveness::held_by_other(self.file.as_raw_fd(), LIVENESS_BASE + s as i64)
    }

    fn take_slot(&mut self, uuid: &str, request: u32, limit: u32) -> Result<(), RegionError> {
        let h = self.header();
        if let Ok(Locked::OwnerDied) = h.lock.lock() {
            h.lock.mark_consistent();
        }
        let result = (|| {
            // Each slice's request counts once, whichever of its processes is here.
            let mut seen: Vec<(u64, u32)> = Vec::new();
            for (s, slot) in h.slots.iter().enumerate() {
                if slot.state.load(Ordering::Acquire) == LIVE && self.alive(s) {
                    let id = slot.slice.load(Ordering::Relaxed);
                    if id != self.slice && !seen.iter().any(|(x, _)| *x == id) {
                        seen.push((id, slot.request.load(Ordering::Relaxed)));
                    }
                }
            }
            let taken: u32 = seen.iter().map(|(_, r)| *r).sum();
            if request > 0 && taken.saturating_add(request) > FULL {
                return Err(RegionError::Oversubscribed {
                    uuid: uuid.to_string(),
                    taken: pct(taken),
                    asked: pct(request),
                    left: 100u32.saturating_sub(pct(taken)),
                });
            }
            for (s, slot) in h.slots.iter().enumerate() {
                let free = slot.state.load(Ordering::Acquire) == FREE || !self.alive(s);
                if !free || liveness::hold(self.file.as_raw_fd(), LIVENESS_BASE + s as i64).is_err()
                {
                    continue;
                }
                slot.pid.store(std::process::id() as i32, Ordering::Relaxed);
                slot.slice.store(self.slice, Ordering::Relaxed);
                slot.request.store(request, Ordering::Relaxed);
                slot.limit.store(limit, Ordering::Relaxed);
                slot.usage.store(0, Ordering::Relaxed);
                slot.hungry.store(0, Ordering::Relaxed);
                slot.allot.store(limit, Ordering::Relaxed);
                slot.priority.store(0, Ordering::Relaxed);
                slot.active_ns.store(0, Ordering::Relaxed);
                slot.state.store(LIVE, Ordering::Release);
                return Ok(s);
            }
            Err(RegionError::Full {
                path: self.path.clone(),
            })
        })();
        h.lock.unlock();
        self.slot = result?;
        Ok(())
    }

    fn me(&self) -> &Slot {
        &self.header().slots[self.slot]
    }

    /// Publishes what this process did in the last period.
    pub fn publish(&self, usage: u32, hungry: bool, active_ns: u64, allot: u32) {
        let me = self.me();
        me.usage.store(usage, Ordering::Relaxed);
        me.hungry.store(u32::from(hungry), Ordering::Relaxed);
        if active_ns > 0 {
            me.active_ns.store(active_ns, Ordering::Relaxed);
        }
        me.allot.store(allot, Ordering::Relaxed);
    }

    /// Records this process's slice's priority in its slot (for the node's tools).
    pub fn set_priority(&self, p: Priority) {
        self.me().priority.store(p.code(), Ordering::Relaxed);
    }

    /// A high-priority launch: its work (and what the slice launched before) is expected to be
    /// done at `until`. One relaxed read-modify-write of the device's shared word.
    #[inline]
    pub fn raise_high_until(&self, until: u64) {
        self.header().high_until.fetch_max(until, Ordering::Relaxed);
    }

    /// When the high-priority work launched on the device so far is expected to be done
    /// (CLOCK_MONOTONIC ns; 0: none ever was). One relaxed load.
    #[inline]
    pub fn high_until(&self) -> u64 {
        self.header().high_until.load(Ordering::Relaxed)
    }

    /// The slices on the device that launched work since `since_ns` (this process's slice
    /// always), each with its processes' usage summed; this process's slice first.
    pub fn slices(&self, since_ns: u64) -> Vec<SliceView> {
        let mut out = vec![SliceView {
            slice: self.slice,
            demand: Demand {
                request: self.me().request.load(Ordering::Relaxed),
                limit: self.me().limit.load(Ordering::Relaxed),
                hungry: false,
                usage: 0,
            },
            priority: Priority::from_code(self.me().priority.load(Ordering::Relaxed)),
        }];
        for (s, slot) in self.header().slots.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let id = slot.slice.load(Ordering::Relaxed);
            let mine = id == self.slice;
            if !mine && slot.active_ns.load(Ordering::Relaxed) < since_ns {
                continue;
            }
            if !self.alive(s) {
                continue;
            }
            let i = match out.iter().position(|v| v.slice == id) {
                Some(i) => i,
                None => {
                    out.push(SliceView {
                        slice: id,
                        demand: Demand {
                            request: slot.request.load(Ordering::Relaxed),
                            limit: slot.limit.load(Ordering::Relaxed),
                            hungry: false,
                            usage: 0,
                        },
                        priority: Priority::from_code(slot.priority.load(Ordering::Relaxed)),
                    });
                    out.len() - 1
                }
            };
            let d = &mut out[i].demand;
            d.usage = d.usage.saturating_add(slot.usage.load(Ordering::Relaxed));
            d.hungry |= slot.hungry.load(Ordering::Relaxed) != 0;
        }
        out
    }

    /// In a forked child: the descriptor (and the parent's slot lock with it) must go.
    pub fn forget_in_child(&mut self) {
        // SAFETY: closing our own descriptor is async-signal-safe; the region is leaked with the
        // rest of the parent's slice in the child and never used (or dropped) there again.
        unsafe { libc::close(self.file.as_raw_fd()) };
    }
}

/// The node side of `cuslice set`: checks, under the region's lock, that slice `slice` may
/// claim `request` (ppm) of device `uuid` beside the other slices' requests, and with `write`
/// makes `request` and `limit` the claim of every process of the slice there. A device whose
/// region does not exist yet has no other claims: Ok, nothing written.
pub fn set_claim(
    dir: &Path,
    uuid: &str,
    slice: u64,
    request: u32,
    limit: u32,
    write: bool,
) -> Result<(), RegionError> {
    let path = dir.join(uuid);
    let io = |err| RegionError::Io {
        path: path.clone(),
        err,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    let len = file.metadata().map_err(io)?.len();
    let mut head = [0u8; 16];
    let n = (&file).read(&mut head).map_err(io)?;
    let version = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]);
    if n < 16 || head[..8] != MAGIC || version != VERSION || len != size() as u64 {
        return Err(RegionError::Foreign { path });
    }
    let map = map(&file).map_err(io)?;
    // SAFETY: the mapping was just made and validated; it is unmapped at the end of this call.
    let h = unsafe { &*map };
    if let Ok(Locked::OwnerDied) = h.lock.lock() {
        h.lock.mark_consistent();
    }
    let alive = |s: usize| liveness::held_by_other(file.as_raw_fd(), LIVENESS_BASE + s as i64);
    let mut seen: Vec<(u64, u32)> = Vec::new();
    for (s, slot) in h.slots.iter().enumerate() {
        if slot.state.load(Ordering::Acquire) == LIVE && alive(s) {
            let id = slot.slice.load(Ordering::Relaxed);
            if id != slice && !seen.iter().any(|(x, _)| *x == id) {
                seen.push((id, slot.request.load(Ordering::Relaxed)));
            }
        }
    }
    let taken: u32 = seen.iter().map(|(_, r)| *r).sum();
    let result = if request > 0 && taken.saturating_add(request) > FULL {
        Err(RegionError::Oversubscribed {
            uuid: uuid.to_string(),
            taken: pct(taken),
            asked: pct(request),
            left: 100u32.saturating_sub(pct(taken)),
        })
    } else {
        if write {
            for (s, slot) in h.slots.iter().enumerate() {
                if slot.state.load(Ordering::Acquire) == LIVE
                    && slot.slice.load(Ordering::Relaxed) == slice
                    && alive(s)
                {
                    slot.request.store(request, Ordering::Relaxed);
                    slot.limit.store(limit, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    };
    h.lock.unlock();
    // SAFETY: our own mapping of size() bytes; `h` is not used past this point.
    unsafe { libc::munmap(map.cast(), size()) };
    result
}

fn map(file: &File) -> io::Result<*mut Header> {
    // SAFETY: maps the whole (validated or freshly sized) file shared; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Opens `dir/<uuid>`, or makes it. The directory is world-writable and sticky (like /tmp):
/// slices of different users share a device.
fn open_or_create(dir: &Path, uuid: &str) -> io::Result<File> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
    cuslice_shm::file::open_or_create(dir, uuid, size() as u64, 0o666, |f, _| {
        let h = map(f)?;
        // SAFETY: the file is new, under a name no other process opens; the mapping is
        // unmapped right after formatting, and the magic is written last.
        unsafe {
            (*h).version = VERSION;
            (*h).size = size() as u32;
            let init = (*h).lock.init();
            if init.is_ok() {
                (*h).magic = MAGIC;
            }
            libc::munmap(h.cast(), size());
            init
        }
    })
}
