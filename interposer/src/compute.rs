//! Compute time-share: every launch route (cuLaunchKernel, cuLaunchKernelEx,
//! cuLaunchCooperativeKernel, cuGraphLaunch, each with its `_ptsz` twin) passes a gate that
//! charges the slice's tokens for the device time the launch is expected to take, and puts the
//! launching thread to sleep while the slice owes time. See docs/compute.md.
//!
//! - Tokens (ns of device time, shared by the slice's processes in its ledger) are earned at the
//!   slice's allotment and banked up to 20 ms worth while idle.
//! - A launch is charged this process's running estimate of what one launch costs; every period
//!   (50 ms) a meter thread reads the device time the process really used (NVML per-process
//!   utilisation, which the driver measures whether or not contexts time-slice) and pays the
//!   difference into the tokens, so what the slice is charged over time is what it used, whatever
//!   the estimate. The estimate only bounds how much work is queued ahead of the measurement.
//! - The allotment comes from the node-level region of the device (`region`): every slice's
//!   request, limit, recent usage and whether it was held back, through `share::allot`.
//!
//! With no other slice asking for time and no limit of its own, a slice's allotment is the whole
//! device and the gate costs two relaxed loads.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cuda_abi::*;
use cuslice_policy::share::{self, FULL};
use parking_lot::Mutex;

use crate::hooks::real;
use crate::ledger::Tokens;
use crate::log::{debug, error, warning};
use crate::region::{self, Region};
use crate::slice::{self, Dev, Slice};

/// How often the meter thread measures and recomputes the allotment.
pub const PERIOD_NS: u64 = 50_000_000;
/// What a launch is assumed to cost before anything has been measured.
const INITIAL_COST_NS: u64 = 1_000_000;
/// Slices that launched nothing for this long are left out of the allotment.
const ACTIVE_NS: u64 = 1_000_000_000;

static STARTED: AtomicBool = AtomicBool::new(false);
/// Some device of this process has an allotment below the whole device.
static METERED: AtomicBool = AtomicBool::new(false);

/// This process's metering of one device.
pub struct Meter {
    index: u32,
    uuid: [u8; 16],
    request: u32,
    limit: u32,
    region: Option<Region>,
    cost: AtomicU64,
    launches: AtomicU64,
    charged: AtomicU64,
    throttled: AtomicU64,
    period: Mutex<Period>,
}

#[derive(Default)]
struct Period {
    at_ns: u64,
    last_seen_us: u64,
    launches: u64,
    charged: u64,
    throttled: u64,
    allot: u32,
}

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn ppm(percent: Option<u32>, none: u32) -> u32 {
    percent.map_or(none, |p| p.min(100) * (FULL / 100))
}

/// The directory of the node-level regions.
pub fn node_dir(s: &Slice) -> PathBuf {
    s.config
        .node_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(region::DEFAULT_DIR))
}

/// Joins each device's node region with this slice's request and limit (at cuInit). Err: a
/// one-line reason to refuse CUDA (a request the device cannot guarantee, or a core setting
/// that cannot be coordinated).
pub fn join(s: &Slice, devs: &[Dev]) -> Result<Vec<Meter>, String> {
    let dir = node_dir(s);
    let now = now_ns();
    let mut meters = Vec::with_capacity(devs.len());
    for (ordinal, d) in devs.iter().enumerate() {
        let l = s.config.limits(ordinal as u32);
        let (request, limit) = (ppm(l.core_request, 0), ppm(l.core_limit, FULL));
        let uuid = slice::uuid_string(&d.uuid);
        let region = match Region::join(&dir, &uuid, s.ledger.slice_id(), request, limit) {
            Ok(r) => Some(r),
            Err(e @ region::RegionError::Oversubscribed { .. }) => return Err(e.to_string()),
            Err(e) if l.core_request.is_some() || l.core_limit.is_some() => {
                return Err(format!("{e}; core limits and requests need it"));
            }
            Err(e) => {
                warning!("{e}; this slice's work on device {ordinal} is not coordinated");
                None
            }
        };
        if let Some(t) = s.ledger.tokens(d.index) {
            if t.last_refill.load(Ordering::Relaxed) == 0 {
                t.last_refill.store(now, Ordering::Relaxed);
            }
            if limit < FULL {
                t.share.fetch_min(limit, Ordering::Relaxed);
                METERED.store(true, Ordering::Relaxed);
            }
        }
        meters.push(Meter {
            index: d.index,
            uuid: d.uuid,
            request,
            limit,
            region,
            cost: AtomicU64::new(INITIAL_COST_NS),
            launches: AtomicU64::new(0),
            charged: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            period: Mutex::new(Period {
                at_ns: now,
                last_seen_us: wall_us(),
                allot: limit,
                ..Period::default()
            }),
        });
    }
    Ok(meters)
}

/// Adds the slice's earnings since the last refill (by any of its processes), banking at most
/// `share::bank` while idle.
fn refill(t: &Tokens<'_>, now: u64) {
    let last = t.last_refill.load(Ordering::Relaxed);
    if now <= last
        || t.last_refill
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let share = t.share.load(Ordering::Relaxed);
    let cap = share::bank(share);
    let cur = t.tokens.load(Ordering::Relaxed);
    if cur < cap {
        t.tokens.fetch_add(
            share::earned(share, now - last).min(cap - cur),
            Ordering::Relaxed,
        );
    }
}

impl Meter {
    /// Charges one launch; sleeps while the slice owes device time.
    fn charge(&self, t: Tokens<'_>) {
        let cost = self.cost.load(Ordering::Relaxed);
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.charged.fetch_add(cost, Ordering::Relaxed);
        if t.share.load(Ordering::Relaxed) >= FULL {
            return;
        }
        let left = t.tokens.fetch_sub(cost as i64, Ordering::Relaxed) - cost as i64;
        if left >= 0 {
            return;
        }
        self.throttled.fetch_add(1, Ordering::Relaxed);
        loop {
            let now = now_ns();
            refill(&t, now);
            let cur = t.tokens.load(Ordering::Relaxed);
            let share = t.share.load(Ordering::Relaxed);
            if cur >= 0 || share >= FULL {
                break;
            }
            std::thread::sleep(std::time::Duration::from_nanos(share::pause_ns(
                -cur, share,
            )));
        }
    }

    /// One period: measure, settle the difference with the tokens, publish, re-allot.
    fn tick(&self, s: &Slice, now: u64) -> bool {
        let Some(t) = s.ledger.tokens(self.index) else {
            return false;
        };
        let mut p = self.period.lock();
        let window = now.saturating_sub(p.at_ns).max(1);
        let measured =
            crate::nvml::own_device_time(&self.uuid, std::process::id(), &mut p.last_seen_us)
                .unwrap_or(0);
        let launches = self.launches.load(Ordering::Relaxed);
        let charged = self.charged.load(Ordering::Relaxed);
        let throttled = self.throttled.load(Ordering::Relaxed);
        let (d_launches, d_charged, d_throttled) = (
            launches - p.launches,
            charged - p.charged,
            throttled - p.throttled,
        );
        (p.at_ns, p.launches, p.charged, p.throttled) = (now, launches, charged, throttled);
        if t.share.load(Ordering::Relaxed) < FULL {
            t.tokens
                .fetch_add(d_charged as i64 - measured as i64, Ordering::Relaxed);
        }
        self.cost.store(
            share::next_cost(self.cost.load(Ordering::Relaxed), measured, d_launches),
            Ordering::Relaxed,
        );
        let usage = (measured as u128 * FULL as u128 / window as u128).min(FULL as u128) as u32;
        let active = if measured > 0 || d_launches > 0 {
            now
        } else {
            0
        };
        let allot = match &self.region {
            Some(r) => {
                r.publish(usage, d_throttled > 0, active, p.allot);
                let views = r.slices(now.saturating_sub(ACTIVE_NS));
                let demands: Vec<_> = views.iter().map(|v| v.demand).collect();
                share::allot(&demands)
                    .first()
                    .copied()
                    .unwrap_or(self.limit)
            }
            None => self.limit,
        };
        if allot != p.allot {
            debug!(
                "device {}: allotment {} -> {} ppm (used {usage} ppm, request {}, limit {})",
                slice::uuid_string(&self.uuid),
                p.allot,
                allot,
                self.request,
                self.limit
            );
        }
        p.allot = allot;
        t.share.store(allot, Ordering::Relaxed);
        refill(&t, now);
        allot < FULL
    }
}

fn meter_thread(s: &'static Slice) {
    loop {
        std::thread::sleep(std::time::Duration::from_nanos(PERIOD_NS));
        let now = now_ns();
        let mut metered = false;
        for m in s.meters() {
            metered |= m.tick(s, now);
        }
        METERED.store(metered, Ordering::Relaxed);
    }
}

fn start() {
    static ONCE: Mutex<()> = Mutex::new(());
    let _g = ONCE.lock();
    if STARTED.load(Ordering::Acquire) {
        return;
    }
    let Ok(Some(s)) = slice::active() else {
        return;
    };
    STARTED.store(true, Ordering::Release);
    if s.meters().is_empty() {
        return;
    }
    if let Err(e) = std::thread::Builder::new()
        .name("cuslice-meter".into())
        .spawn(move || meter_thread(s))
    {
        error!("cannot start the compute meter thread: {e}; core limits are not enforced");
    }
}

/// Every launch passes here first.
#[inline]
fn gate() {
    if !STARTED.load(Ordering::Relaxed) {
        start();
    }
    if METERED.load(Ordering::Relaxed) {
        gate_metered();
    }
}

#[cold]
fn gate_metered() {
    let Ok(Some(s)) = slice::active() else {
        return;
    };
    let Some((_, o)) = slice::current(s) else {
        return;
    };
    if let Some(m) = s.meters().get(o)
        && let Some(t) = s.ledger.tokens(m.index)
    {
        m.charge(t);
    }
}

/// In a forked child: no meter thread runs there, and the parent's region slots are not ours.
pub fn child_after_fork(s: &mut Slice) {
    STARTED.store(false, Ordering::Relaxed);
    METERED.store(false, Ordering::Relaxed);
    if let Some(ms) = s.meters.get_mut() {
        for m in ms.iter_mut() {
            if let Some(r) = m.region.as_mut() {
                r.forget_in_child();
            }
        }
    }
}

macro_rules! launch_wrappers {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            let Some(f) = real::$name() else {
                return CUresult::CUDA_ERROR_NOT_INITIALIZED;
            };
            gate();
            // SAFETY: forwarded unchanged.
            unsafe { f($($arg),*) }
        }
    )*};
}

launch_wrappers! {
    cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void);
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);
}
