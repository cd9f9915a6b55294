//! Compute time-share: every launch route (cuLaunchKernel, cuLaunchKernelEx,
//! cuLaunchCooperativeKernel, cuGraphLaunch, each with its `_ptsz` twin) passes a gate that
//! charges the slice's tokens for the device time the launch is expected to take, and puts the
//! launching thread to sleep while the slice owes time. See docs/compute.md. One concern in one
//! file: the gate's fast path and the meter's tick share each device's state here (the policy
//! they apply is `cuslice_policy::share` and `priority`, pure).
//!
//! - Tokens (ns of device time, shared by the slice's processes in its ledger) are earned at the
//!   slice's allotment and banked up to 20 ms worth (two launches' worth if more) while idle.
//! - A launch is charged this process's running estimate of what one launch costs; every period
//!   (50 ms) a meter thread reads the device time the process really used (NVML per-process
//!   utilisation, which the driver measures whether or not contexts time-slice) and pays the
//!   difference into the tokens, so what the slice is charged over time is what it used, whatever
//!   the estimate. The estimate only bounds how much work is queued ahead of the measurement.
//! - The allotment comes from the node's compute board (`cuslice_state::board`): every slice's
//!   request, limit, recent usage and whether it was held back, each bounded by what the node
//!   granted it, through `share::allot`. Each slice writes only its own claims there.
//!
//! - Priority (`CUSLICE_PRIORITY`, `cuslice_policy::priority`): a high-priority process raises
//!   its slice's "high work expected done at" word on the board at each launch; a process of a
//!   slice below it holds each launch while a slice granted high priority has such a time ahead,
//!   and until the launching stream is idle, at most `priority::HOLD_MAX_NS`. Both go through the
//!   metered path (a high-priority process only while another slice is active on the device);
//!   the meter decides who yields and publishes.
//!
//! With no other slice asking for time, no limit of its own and no high-priority slice on the
//! device, a slice's allotment is the whole device and the gate costs two relaxed loads.

#![allow(non_snake_case)]

use std::collections::VecDeque;
use std::ffi::{c_uint, c_void};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cuda_abi::*;
use cuslice_policy::CoreMeter;
use cuslice_policy::grant::{Grant, Origin};
use cuslice_policy::priority::{self, Admit, Priority};
use cuslice_policy::share::{self, FULL};
use cuslice_policy::timing::{self as timing_policy, LaunchCosts, Overlap, launch_kind};
use parking_lot::Mutex;

use crate::log::{debug, error, warning};
use crate::membership::{self, Dev, Slice};
use crate::nvml_query::{self, SampleCursor, Used};
use crate::real;
use crate::timing::{self, Timer};
use cuslice_state::board::{self, Board, HighRef, Maker, Post};
use cuslice_state::ledger::{Ledger, Tokens};
use cuslice_state::paths::CONTAINER_AGENT_DIR;
use cuslice_state::seen;
use cuslice_state::snapshot::MeteredBy;

/// How often the meter thread measures and recomputes the allotment.
pub const PERIOD_NS: u64 = 50_000_000;
/// What a launch is assumed to cost before anything has been measured.
const INITIAL_COST_NS: u64 = 1_000_000;
/// Slices that launched nothing for this long are left out of the allotment.
const ACTIVE_NS: u64 = 1_000_000_000;
/// A slice held back by its tokens, or using all of its allotment (`share::uses_all`), counts as
/// wanting more for this long: NVML's readings lag by up to a sample period, and without the
/// hold a slice given more would at once look as if it did not use it and be cut back.
const HUNGRY_HOLD_NS: u64 = 500_000_000;
/// A process of the slice that has not reported its usage for this long no longer counts in
/// the slice's (it died, or stopped).
const USAGE_FRESH_NS: u64 = 1_000_000_000;
/// Launches NVML has still not accounted for after this long are taken to have cost what they
/// were charged (NVML does not list this process, or its work was too small to sample).
const STALE_NS: u64 = 2_000_000_000;

/// Own samples (a second's worth at the simulator's 100 ms) after which a process's estimate of
/// what a launch costs no longer learns from shared periods (see `Meter::attribute`).
const ANCHOR_SAMPLES: u32 = 10;

static STARTED: AtomicBool = AtomicBool::new(false);
/// Some device of this process has an allotment below the whole device.
static METERED: AtomicBool = AtomicBool::new(false);
/// The node agent's evidence of what the driver saw each slice use, as this process last read it
/// (`cuslice_state::seen`).
static SEEN: Mutex<seen::Cached> = parking_lot::const_mutex(seen::Cached::new());
/// This process's meters, one per device in the order of `Slice::devs`: set once by `join`
/// (before the devices are), never freed (a forked child leaks its parent's).
static METERS: AtomicPtr<Vec<Meter>> = AtomicPtr::new(std::ptr::null_mut());

/// This process's meters (none before cuInit has attached the devices).
#[inline]
fn meters() -> &'static [Meter] {
    let p = METERS.load(Ordering::Acquire);
    // SAFETY: null, or published once with Release after full construction and never freed.
    unsafe { p.as_ref() }.map_or(&[], |v| v.as_slice())
}

/// This process's metering of one device.
pub struct Meter {
    index: u32,
    uuid: [u8; 16],
    request: u32,
    limit: u32,
    /// The slice's place on the node's compute board (shared by its meters).
    board: Option<Arc<Board>>,
    /// Where the other slices granted high priority on the device post when their work is
    /// expected done (set by the meter each period; read by yielding launches).
    highs: Mutex<Arc<Vec<HighRef>>>,
    /// Another slice was active on the device in the meter's last period.
    crowded: AtomicBool,
    cost: AtomicU64,
    /// Launches charged (see `count`: no locked instruction from the launching thread).
    launches: crate::count::Count,
    throttled: AtomicU64,
    period: Mutex<Period>,
    /// The slice's priority (see `prioritise`).
    /// `Priority::code`; `cuslice set --priority` changes it while the process runs.
    priority: AtomicU32,
    /// Whether this process's launches yield to high-priority work on the device (set by the
    /// meter each period).
    yields: AtomicBool,
    /// Launches held for high-priority work: `held_seen` is the count at the last period.
    held: AtomicU64,
    held_seen: AtomicU64,
    /// Whether this high-priority process publishes its launches: another slice was active on
    /// the device in the last second (set by the meter each period).
    publishes: AtomicBool,
    /// When the work this process launched on the device is expected to be done (monotonic ns),
    /// counted only while it is high priority or yields.
    own_until: AtomicU64,
    /// The self-timing meter's sample of timed launches (on where the driver gives no
    /// per-process samples, or `CUSLICE_CORE_METER=self-timing`).
    timer: Timer,
}

struct Period {
    cursor: SampleCursor,
    launches: u64,
    throttled: u64,
    allot: u32,
    usage: u32,
    /// When the last period ended.
    at_ns: u64,
    /// The slice counts as wanting more than it uses until then (see `HUNGRY_HOLD_NS`).
    hungry_until: u64,
    /// When the allotment last went from the whole device to less (launches are charged since).
    metered_since: u64,
    /// Charges NVML has not accounted for yet, oldest first.
    pending: VecDeque<Charged>,
    /// What the readings say one launch costs (`cost` is its latest figure).
    estimate: share::CostEstimate,
    /// How many of this process's own samples the estimate learnt from (see `attribute`).
    own_samples: u32,
    /// What the launches of the other slices on the device were charged by their estimates, and
    /// what this slice's other processes used, as they said at the last period (ppm of the
    /// device, each within its limit).
    others_launched: u64,
    /// What this process's launches in the last period were charged (ppm of the period).
    launched: u32,
    /// Another slice launched work on the device in the second before the last period (what it
    /// claims, whether or not the device shows it at work).
    others_active: bool,
    /// The device time settled so far (by readings or by estimate) could have run until
    /// this time at the latest.
    frontier_ns: u64,
    /// Whether the "no NVML samples" warning was given.
    warned: bool,
    /// When the driver last gave a utilisation sample of this process's own (not the device's,
    /// taken for this process's while it is alone, nor a shared period's): 0, never.
    sampled_ns: u64,
    /// What each kind of launch costs by the library's own timings.
    costs: LaunchCosts,
    /// The slices' time in flight by their timings over the last second, set beside the device's
    /// busy time: how much of a long kernel's readings was this slice's own
    /// (`timing_policy::Overlap`).
    overlap: Overlap,
    /// That part (ppm), as of the last period: long kinds of launch cost at most that part of
    /// their mean reading.
    within: u32,
    /// Metered by its own timing: the driver gave no per-process samples at the last period.
    self_timed: bool,
    /// The other slices count as idle until then: the device last showed nobody but this slice
    /// at work less than `ACTIVE_NS` before (its readings and this process's own are taken over
    /// different windows, so a slice ramping up into idle time would otherwise see the others
    /// busy again at every other period).
    others_idle_until: u64,
    /// Whether that was proven by this process's own per-process samples (else by its timings).
    idle_proven_by_samples: bool,
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

/// The directory of the node's compute board.
pub fn node_dir(s: &Slice) -> PathBuf {
    s.config
        .node_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(board::DEFAULT_DIR))
}

/// Bounds the other slices' claims on device `uuid` (`views`, this slice's first) by what the
/// driver saw them use, where the node agent says (`share::corroborate`): a claim counts for at
/// most twice what the slice was seen using beyond its request, and one without a request seen
/// idle (or, for a container's slice, not listed) is passed over; what a slice says its launches
/// were in flight (or were charged) counts for at most twice what it was seen using. Where the agent is not
/// running, or has no per-process samples of the device, claims count as they are.
fn corroborate(views: &mut Vec<board::SliceView>, uuid: &[u8; 16], now: u64) {
    if views.len() < 2 {
        return;
    }
    let Some(evidence) = SEEN
        .lock()
        .get(std::path::Path::new(CONTAINER_AGENT_DIR), now)
    else {
        return;
    };
    let uuid = membership::uuid_string(uuid);
    if !evidence.covers(&uuid) {
        return;
    }
    // A container's slice the agent does not list yet (it lists those it found in its last look)
    // has not been seen at work. A standalone slice's is never listed, and counts as it is.
    let seen: Vec<Option<u32>> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (i > 0)
                .then(|| evidence.used(&uuid, v.slice).or(v.hooked.then_some(0)))
                .flatten()
        })
        .collect();
    let demands: Vec<share::Demand> = views.iter().map(|v| v.demand).collect();
    let mut bounded = share::corroborate(&demands, &seen).into_iter().zip(seen);
    views.retain_mut(|v| match bounded.next() {
        Some((Some(d), figure)) => {
            v.demand = d;
            if let Some(s) = figure {
                v.launched = v.launched.min(s.saturating_mul(2));
            }
            true
        }
        Some((None, _)) => false,
        None => true,
    });
}

/// Takes the slice's place on the node's compute board, claims each device with this slice's
/// request, limit and priority, and sets up this process's meters (at cuInit, before the devices
/// are set). Err: a one-line reason to refuse CUDA (a request the device cannot guarantee, or a
/// core setting that cannot be coordinated).
pub fn join(s: &Slice, devs: &[Dev]) -> Result<(), String> {
    let dir = node_dir(s);
    let now = now_ns();
    // In a container the hook made the slice's place (and its grant, from the same settings);
    // a standalone slice makes its own.
    let maker = if s.hooked {
        Maker::Hooked
    } else {
        Maker::Standalone(Grant::from_config(&s.config, Origin::Standalone))
    };
    let board = match Board::open(&dir, s.ledger.slice_id(), maker) {
        Ok(b) => Some(Arc::new(b)),
        Err(e) => {
            let core = (0..devs.len() as u32).any(|o| {
                let l = s.config.limits(o);
                l.core_request.is_some() || l.core_limit.is_some()
            });
            if core {
                return Err(format!("{e}; core limits and requests need it"));
            }
            warning!("{e}; this slice's work is not coordinated with other slices'");
            None
        }
    };
    let mut meters = Vec::with_capacity(devs.len());
    for (ordinal, d) in devs.iter().enumerate() {
        let l = s.config.limits(ordinal as u32);
        // What `cuslice set` changed while the slice ran wins over this process's configuration.
        let (request, limit) = s
            .ledger
            .live_core(d.index)
            .unwrap_or((ppm(l.core_request, 0), ppm(l.core_limit, FULL)));
        // What `cuslice set` changed while the slice ran wins here too.
        let priority = s
            .ledger
            .live_priority(d.index)
            .map_or(s.config.priority, Priority::from_code);
        if let Some(b) = &board {
            b.claim(d.index, &d.uuid, request, limit, priority)
                .map_err(|e| e.to_string())?;
        }
        s.ledger.set_priority(d.index, priority.code());
        s.ledger.set_core(d.index, request, limit);
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
            board: board.clone(),
            highs: Mutex::new(Arc::new(Vec::new())),
            crowded: AtomicBool::new(false),
            cost: AtomicU64::new(INITIAL_COST_NS),
            launches: crate::count::Count::new(),
            throttled: AtomicU64::new(0),
            period: Mutex::new(Period {
                cursor: SampleCursor::new(wall_us(), PERIOD_NS / 1000),
                at_ns: now,
                hungry_until: 0,
                metered_since: if limit < FULL { 0 } else { u64::MAX },
                launches: 0,
                throttled: 0,
                allot: limit,
                usage: 0,
                pending: VecDeque::new(),
                estimate: share::CostEstimate::default(),
                own_samples: 0,
                others_launched: 0,
                launched: 0,
                others_active: false,
                frontier_ns: now,
                warned: false,
                sampled_ns: 0,
                others_idle_until: 0,
                idle_proven_by_samples: false,
                costs: LaunchCosts::default(),
                overlap: Overlap::default(),
                within: FULL,
                self_timed: false,
            }),
            priority: AtomicU32::new(priority.code()),
            yields: AtomicBool::new(false),
            publishes: AtomicBool::new(false),
            held: AtomicU64::new(0),
            held_seen: AtomicU64::new(0),
            own_until: AtomicU64::new(0),
            timer: Timer::default(),
        });
    }
    let meters: &'static Vec<Meter> = Box::leak(Box::new(meters));
    for m in meters {
        timing::register(&m.timer);
    }
    METERS.store(
        meters as *const Vec<Meter> as *mut Vec<Meter>,
        Ordering::Release,
    );
    Ok(())
}

/// Adds the slice's earnings since the last refill (by any of its processes), banking at most
/// `share::bank` while idle (at least two launches at `cost`, this process's estimate).
fn refill(t: &Tokens<'_>, now: u64, cost: u64) {
    let last = t.last_refill.load(Ordering::Relaxed);
    if now <= last
        || t.last_refill
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let share = t.share.load(Ordering::Relaxed);
    let cap = share::bank(share, cost);
    let cur = t.tokens.load(Ordering::Relaxed);
    if cur < cap {
        t.tokens.fetch_add(
            share::earned(share, now - last).min(cap - cur),
            Ordering::Relaxed,
        );
    }
}

impl Meter {
    /// Charges one launch; sleeps while the slice owes device time. Inlined into the gate: the
    /// launch under budget makes no call here.
    #[inline(always)]
    fn charge(&self, ledger: &Ledger, t: Tokens<'_>) {
        let cost = self.cost.load(Ordering::Relaxed);
        self.launches.add_one();
        if t.share.load(Ordering::Relaxed) >= FULL {
            return;
        }
        let left = t.tokens.fetch_sub(cost as i64, Ordering::Relaxed) - cost as i64;
        if left < 0 {
            self.hold(ledger, t, cost);
        }
    }

    /// A launch that took the slice's tokens below zero waits until they are earned back.
    #[cold]
    #[inline(never)]
    fn hold(&self, ledger: &Ledger, t: Tokens<'_>, cost: u64) {
        let held_from = now_ns();
        let mut now = held_from;
        let mut held = false;
        loop {
            refill(&t, now, cost);
            let cur = t.tokens.load(Ordering::Relaxed);
            let share = t.share.load(Ordering::Relaxed);
            if cur >= 0 || share >= FULL {
                break;
            }
            // Held back only when what the slice earned since the last refill does not pay for
            // the launch: tokens are refilled every period and here, and a bank smaller than a
            // period's use goes below zero between refills (a light slice counted as throttled
            // so looked hungry every other half second, taking a heavy neighbour from 75% to 50%
            // of the device in turn, with a quarter of it idle).
            if !held {
                held = true;
                self.throttled.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(std::time::Duration::from_nanos(share::pause_ns(
                -cur, share,
            )));
            now = now_ns();
        }
        ledger.note_throttled(self.index, now - held_from);
    }

    /// One period: measure, settle what NVML has accounted for with the tokens, publish,
    /// re-allot.
    fn tick(&self, s: &Slice, now: u64) -> bool {
        let Some(t) = s.ledger.tokens(self.index) else {
            return false;
        };
        let mut p = self.period.lock();
        let launches = self.launches.total();
        let throttled = self.throttled.load(Ordering::Relaxed);
        let (d_launches, d_throttled) = (launches - p.launches, throttled - p.throttled);
        (p.launches, p.throttled) = (launches, throttled);
        let cost = self.cost.load(Ordering::Relaxed);
        let span_ns = now.saturating_sub(p.at_ns).max(1);
        p.launched = (d_launches as u128 * cost as u128 * FULL as u128 / span_ns as u128)
            .min(FULL as u128) as u32;
        if d_launches > 0 {
            let from = p.at_ns;
            p.pending.push_back(Charged {
                from,
                to: now.max(from + 1),
                ns: d_launches * cost,
                launches: d_launches,
            });
        }
        p.at_ns = now;
        // NVML names processes by host pid: in a container, the one the node tools told us.
        let pid = s
            .ledger
            .host_pid(s.slot)
            .map_or(std::process::id(), |h| h as u32);
        let wall = wall_us();
        // Other processes are active on the device: other slices (at the last period), or other
        // processes of this slice.
        let crowded = p.others_active || s.ledger.pids().len() > 1;
        let reading = if s.config.core_meter == CoreMeter::SelfTiming {
            None
        } else {
            nvml_query::own_utilisation(&self.uuid, pid, &mut p.cursor, crowded)
        };
        // Samples of its own (not a shared period's, which the driver gives for the device).
        if reading.is_some_and(|u| u.span_ns > u.shared_span_ns) {
            p.sampled_ns = now;
        }
        // NVML gives no per-process samples (MIG instances, some vGPU profiles), or they are
        // ignored on purpose: the library times a sample of the launches itself.
        let self_timed = reading.is_none();
        // Launches are timed (only metered launches are, a sample of them) where the timings
        // are used: without samples they are the meter's readings; with the driver's one sample
        // a period, beside other processes, they are what a launch costs, by which a shared
        // period is apportioned. A process alone with samples of its own times none: a timed
        // launch's two event records cost the launch path (`tests/bench`, section 4).
        self.timer.collect(&mut p.costs);
        p.costs.decay();
        // This process's time in flight in the period by its timings (stretched ones included):
        // what it posts as `launched` while it times launches, for the other slices' `Overlap`.
        let in_flight = p.costs.mean_read().map(|read| {
            (d_launches as u128 * read as u128 * FULL as u128 / span_ns as u128).min(FULL as u128)
                as u32
        });
        if let Some(read) = in_flight {
            p.launched = read;
        }
        if self_timed {
            if let Some(c) = p.costs.mean_within(p.within) {
                self.cost.store(c.max(1_000), Ordering::Relaxed);
            }
            if !p.self_timed {
                debug!(
                    "device {}: no per-process utilisation samples; metered by its own timing",
                    membership::uuid_string(&self.uuid)
                );
            }
        }
        p.self_timed = self_timed;
        self.timer
            .set(self_timed || crowded, timing_policy::stride(d_launches));
        let cost_now = self.cost.load(Ordering::Relaxed);
        // What the settled launches were charged, less what they (and any work queued before
        // them) really used: paid into the tokens, or taken from them.
        let adjust: i64 = match reading {
            Some(used) if used.newest_us != 0 => {
                // Launches made before the newest sample was taken are accounted for in it.
                let age_ns = wall.saturating_sub(used.newest_us) * 1000;
                let stamp = now.saturating_sub(age_ns);
                let (charged, n) = settle(&mut p.pending, stamp);
                p.frontier_ns = p.frontier_ns.max(stamp);
                let used_ns = self.attribute(&mut p, &used, charged, n);
                p.usage = (used_ns as u128 * FULL as u128 / used.span_ns.max(1) as u128)
                    .min(FULL as u128) as u32;
                // Device time used while the slice had the whole device was not metered (its
                // launches were not charged) and is not owed: only the part of the samples'
                // span after the allotment last dropped below the whole device counts.
                s.ledger
                    .note_device_time(self.index, used_ns, MeteredBy::Samples, now);
                let span_from = stamp.saturating_sub(used.span_ns);
                let owed = if p.metered_since <= span_from {
                    used_ns
                } else {
                    let after = stamp.saturating_sub(p.metered_since) as u128;
                    (used_ns as u128 * after / used.span_ns.max(1) as u128) as u64
                };
                charged as i64 - owed as i64
            }
            other => {
                // No new sample: NVML has not accounted for the launches yet. Once they are
                // STALE_NS old (at once if NVML cannot answer) they count as charged.
                let cutoff = if other.is_none() {
                    now
                } else {
                    now.saturating_sub(STALE_NS)
                };
                let first = p.pending.front().map_or(cutoff, |c| c.from);
                let (charged, n) = settle(&mut p.pending, cutoff);
                // Timed by the library: what the launches cost by its latest timings (those
                // charged before the timings came in were charged the starting figure).
                let used = if self_timed {
                    n.saturating_mul(cost_now)
                } else {
                    charged
                };
                // Samples that arrive later cover none of the time settled here.
                p.cursor
                    .settled(wall.saturating_sub(now.saturating_sub(cutoff) / 1000));
                // A process cannot use more device time than the wall-clock time that passes:
                // the work settled so far ran one piece after another from when it was launched,
                // and cannot have ended later than the cutoff plus what a full bank let it queue
                // ahead. Estimates beyond that are given back.
                let begin = first.max(p.frontier_ns);
                let end = begin
                    .saturating_add(used)
                    .min(cutoff + share::BANK_NS)
                    .max(begin);
                let estimate = (end - begin).min(used);
                p.frontier_ns = p.frontier_ns.max(end);
                // Launches no sample accounted for (NVML does not see this process, or no
                // longer does: in a container, once the driver reports host pids): their
                // estimates are all the node tools can show of its device time.
                let by = if self_timed {
                    MeteredBy::SelfTiming
                } else {
                    MeteredBy::Estimates
                };
                s.ledger.note_device_time(self.index, estimate, by, now);
                let unseen = other.is_none() || !p.cursor.seen_own();
                if n > 0 && !p.warned && unseen && !self_timed {
                    p.warned = true;
                    warning!(
                        "device {}: NVML reports no utilisation for this process (pid {}); \
                         its core limit is held by launch estimates alone ({} µs a launch)",
                        membership::uuid_string(&self.uuid),
                        std::process::id(),
                        cost / 1000
                    );
                }
                if self_timed {
                    p.usage = (estimate as u128 * FULL as u128 / span_ns as u128).min(FULL as u128)
                        as u32;
                } else if p.cursor.idle(wall) {
                    // Samples of other processes newer than a period past ours: this process
                    // was idle since. (A launch is only counted while the slice is metered; a
                    // slice with the whole device shows its use through its samples alone.)
                    p.usage = 0;
                }
                charged as i64 - estimate as i64
            }
        };
        if adjust != 0 && t.share.load(Ordering::Relaxed) < FULL {
            t.tokens.fetch_add(adjust, Ordering::Relaxed);
        }
        let active = if d_launches > 0 || !p.pending.is_empty() || p.usage > 0 {
            now
        } else {
            0
        };
        let usage = p.usage;
        // Held for high-priority work counts as held back: it wants more (its request, as the
        // high slice sees it).
        let held = self.held.load(Ordering::Relaxed);
        let d_held = held - self.held_seen.swap(held, Ordering::Relaxed);
        if d_throttled > 0 || d_held > 0 || share::uses_all(usage, p.allot) {
            p.hungry_until = now + HUNGRY_HOLD_NS;
        }
        let hungry = now < p.hungry_until;
        // The slice's request and limit now: `cuslice set` may have changed them (docs/status.md).
        let (request, limit) = s
            .ledger
            .core(self.index)
            .unwrap_or((self.request, self.limit));
        let prio = match s.ledger.live_priority(self.index) {
            Some(code) if code != self.priority.swap(code, Ordering::Relaxed) => {
                let p = Priority::from_code(code);
                debug!(
                    "device {}: priority {p} (cuslice set)",
                    membership::uuid_string(&self.uuid)
                );
                p
            }
            _ => self.priority(),
        };
        let mut others = false;
        let allot = match &self.board {
            Some(b) => {
                // The slice's usage: what each of its processes reported last.
                let slice_usage =
                    s.ledger
                        .note_usage(s.slot, self.index, usage, now, USAGE_FRESH_NS);
                b.post(
                    self.index,
                    &self.uuid,
                    &Post {
                        request,
                        limit,
                        priority: prio,
                        usage: slice_usage,
                        launched: p
                            .launched
                            .saturating_add(slice_usage.saturating_sub(usage))
                            .min(FULL),
                        hungry_until: if hungry { p.hungry_until } else { 0 },
                        active_ns: active,
                    },
                    now,
                );
                let (mut views, highs) =
                    b.views(self.index, &self.uuid, now, now.saturating_sub(ACTIVE_NS));
                *self.highs.lock() = Arc::new(highs);
                p.others_active = views.len() > 1;
                // What the other slices say they want is theirs to write, what the driver counts
                // is not: when the device shows nobody but this slice at work, their claims do
                // not count (priority aside: a high-priority slice's work is often light). All
                // of them where this process's own use is the driver's per-process count too
                // (in the last second); else (its timings, or the device's figure taken for its
                // own) only those without a request: misjudged idle, it could take a neighbour
                // its own throttling starves for an idle one (`share::claim_counts`).
                let mine = slice_usage;
                let own_samples = p.sampled_ns.saturating_add(ACTIVE_NS) > now;
                let busy = if views.len() > 1 {
                    nvml_query::device_utilisation(&self.uuid)
                        .map(|util| util.min(100) * (FULL / 100))
                } else {
                    None
                };
                if busy.is_some_and(|busy| share::others_idle(busy, mine)) {
                    p.others_idle_until = now + ACTIVE_NS;
                    p.idle_proven_by_samples = own_samples;
                }
                let idle = now < p.others_idle_until;
                let proven = p.idle_proven_by_samples;
                let mut k = 0;
                views.retain(|v| {
                    k += 1;
                    k == 1 || share::claim_counts(idle, proven, v.demand.request)
                });
                corroborate(&mut views, &self.uuid, now);
                others = views.len() > 1;
                // Long kernels beside busy neighbours: the readings' excess over the device's
                // busy time is time counted by more than one slice (`timing_policy::Overlap`).
                // Without the device's figure (MIG instances give none) nothing is taken off.
                if let Some(own) = in_flight {
                    let theirs = views
                        .iter()
                        .skip(1)
                        .map(|v| v.launched)
                        .fold(slice_usage.saturating_sub(usage), u32::saturating_add);
                    p.overlap.note(now, own, theirs);
                }
                p.within = match busy {
                    Some(busy) if in_flight.is_some() => p.overlap.within(busy, views.len()),
                    _ => FULL,
                };
                // What the others' launches were charged, each within its limit (its grant
                // bounds both), and what this slice's other processes used: how shared periods
                // are apportioned (`attribute`).
                p.others_launched = views
                    .iter()
                    .skip(1)
                    .map(|v| v.launched.min(v.demand.limit) as u64)
                    .sum::<u64>()
                    + slice_usage.saturating_sub(usage) as u64;
                let views: Vec<_> = views.iter().map(|v| (v.demand, v.priority)).collect();
                let demands = priority::view(prio, &views);
                share::allot(&demands).first().copied().unwrap_or(limit)
            }
            None => limit,
        };
        self.crowded.store(others, Ordering::Relaxed);
        if allot != p.allot {
            debug!(
                "device {}: allotment {} -> {} ppm (used {usage} ppm, request {}, limit {})",
                membership::uuid_string(&self.uuid),
                p.allot,
                allot,
                request,
                limit
            );
        }
        if allot < FULL && p.allot >= FULL {
            p.metered_since = now;
        }
        p.allot = allot;
        t.share.store(allot, Ordering::Relaxed);
        refill(&t, now, self.cost.load(Ordering::Relaxed));
        // Priority: yield while a high-priority slice launched on the device in the last second.
        let high_active =
            board::high_until(&self.highs.lock(), now).saturating_add(ACTIVE_NS) > now;
        let yields = priority::yields(prio, high_active, request, usage);
        if yields != self.yields.swap(yields, Ordering::Relaxed) {
            debug!(
                "device {}: {} high-priority work (priority {}, used {usage} ppm, request {})",
                membership::uuid_string(&self.uuid),
                if yields {
                    "yielding to"
                } else {
                    "no longer yielding to"
                },
                prio,
                request
            );
        }
        // A high-priority process alone on the device has nobody to tell: its launches stay on
        // the fast path. Beside other active slices it tells them, whatever the device shows of
        // their use (publishing costs only itself).
        let publishes = prio == Priority::High && p.others_active;
        self.publishes.store(publishes, Ordering::Relaxed);
        // Beside other slices its launches are counted even when nothing holds them: what they
        // were charged is how shared periods are apportioned to it, and without them it would
        // read as idle, to itself (its usage, against its request) and to the others (a high
        // slice that sees nobody else publishes nothing to yield to). Beside any active slice
        // on the board, even while the device shows the others idle: a slice that stopped
        // counting then read as idle in the next shared periods, left the board, and the
        // neighbour it had taken for idle went on alone with the whole device, taking it in
        // turn (a best-effort slice beside a busy request of 60 got 10-37% instead of 1%).
        // A process metered by its own timing counts its launches whatever its allotment: they
        // are all it knows of its use, and all the other slices see of it.
        allot < FULL || yields || publishes || p.others_active || p.self_timed
    }

    fn priority(&self) -> Priority {
        Priority::from_code(self.priority.load(Ordering::Relaxed))
    }

    /// Priority, after the launch was charged: a high-priority process publishes when its work
    /// is expected done; a process that yields holds the launch (see `priority::admit`). The
    /// check that there is nothing to do is inlined into the gate.
    #[inline(always)]
    fn prioritise(&self, stream: CUstream, ptsz: bool) {
        if self.board.is_some()
            && (self.publishes.load(Ordering::Relaxed) || self.yields.load(Ordering::Relaxed))
        {
            self.prioritise_slow(stream, ptsz);
        }
    }

    #[cold]
    #[inline(never)]
    fn prioritise_slow(&self, stream: CUstream, ptsz: bool) {
        let Some(b) = &self.board else {
            return;
        };
        let cost = self.cost.load(Ordering::Relaxed);
        if self.priority() == Priority::High {
            if !self.publishes.load(Ordering::Relaxed) {
                return;
            }
            let until = priority::busy_until(
                self.own_until.load(Ordering::Relaxed),
                now_ns(),
                cost,
                || !stream_idle(stream, ptsz),
            );
            self.own_until.store(until, Ordering::Relaxed);
            b.raise_high_until(self.index, until);
            return;
        }
        if !self.yields.load(Ordering::Relaxed) {
            return;
        }
        let from = now_ns();
        let mut now = from;
        let own_until = self.own_until.load(Ordering::Relaxed);
        let highs = self.highs.lock().clone();
        while let Admit::Wait(ns) =
            priority::admit(now, from, board::high_until(&highs, now), own_until, || {
                stream_idle(stream, ptsz)
            })
        {
            std::thread::sleep(std::time::Duration::from_nanos(ns));
            now = now_ns();
        }
        if now != from {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        // Let through with the stream idle: nothing of this process's is queued ahead of the
        // launch (a launch let through by the bound queues behind what its estimate says).
        let behind = if now - from < priority::HOLD_MAX_NS {
            0
        } else {
            own_until
        };
        self.own_until.store(
            priority::busy_until(behind, now, cost, || false),
            Ordering::Relaxed,
        );
    }
}

/// Whether `stream` has no work left on the device (`cuStreamQuery`). A stream being captured
/// counts as idle: what is launched into it is recorded, not run (and querying it would
/// invalidate the capture).
fn stream_idle(stream: CUstream, ptsz: bool) -> bool {
    let query = if ptsz {
        real::cuStreamQuery_ptsz()
    } else {
        real::cuStreamQuery()
    };
    let Some(query) = query else { return true };
    if crate::stream::capturing(stream, ptsz) != Some(false) {
        return true;
    }
    // SAFETY: `stream` is the handle the application is launching on; a non-blocking query.
    let r = unsafe { query(stream) };
    r != CUresult::CUDA_ERROR_NOT_READY
}

impl Meter {
    /// This process's device time in the readings `used`, whose charges (`charged` ns over `n`
    /// launches) they settle.
    ///
    /// Its own samples count as they are. In a shared period (the driver named one process and
    /// gave the device's utilisation, while others were active) its launches cost what the
    /// library's own timings of them say, within the period's busy time. Before it has timed any,
    /// a shared period is apportioned: the device's busy
    /// time there, in proportion to what this process's launches were charged, against what the
    /// others said they used (`others_usage`). What the others say is theirs to write, so it
    /// decides nothing beyond a bound of this process's own:
    /// at most its launches at what a launch cost by its own samples (the 1 ms
    /// starting estimate before it had enough of them). A neighbour that says it used less than
    /// it did cannot have this process charged past that. Which process the driver names is no
    /// bound: it names one that ran, each about as often as its part of the busy time would have
    /// it (on an H100, a slice using 23% of the device was named at 11 of 30 stamps).
    fn attribute(&self, p: &mut Period, used: &Used, charged: u64, n: u64) -> u64 {
        let span = used.span_ns.max(1) as u128;
        let shared = used.shared_span_ns as u128;
        // The launches settled are taken as spread evenly over the readings' span.
        let n_shared = n as u128 * shared / span;
        let n_own = n - n_shared as u64;
        // The process's own samples teach its estimate (see below for shared periods).
        if used.span_ns > used.shared_span_ns && n_own > 0 && used.ns > 0 {
            p.estimate.add(used.ns, n_own);
            p.own_samples = p.own_samples.saturating_add(1);
        }
        let anchored = p.own_samples >= ANCHOR_SAMPLES;
        if shared > 0 && !anchored && p.own_samples > 0 {
            // Too few own samples to go by (at the start, with work queued ahead of them): the
            // estimate starts afresh from the starting figure, as the other slices' have.
            p.estimate = share::CostEstimate::default();
            p.own_samples = 0;
            self.cost.store(INITIAL_COST_NS, Ordering::Relaxed);
        }
        if shared == 0 {
            self.cost.store(self.estimated_cost(p), Ordering::Relaxed);
            return used.ns;
        }
        // Launches the library timed cost what the timings say, in a shared period too: what
        // the other slices' launches were charged (theirs to write, and stretched where their
        // kernels were preempted by this process's) then decides nothing.
        let x = match p.costs.mean_within(p.within) {
            Some(c) => (n_shared * c.max(1_000) as u128).min(used.shared_busy_ns as u128) as u64,
            None => self.apportion(p, used, charged, n_shared, span, anchored),
        };
        // Until it has had enough samples of its own, shared periods teach it too (launches
        // counted, the figure apportioned). Not after: taught by
        // apportioned figures alone, two slices' estimates could drift apart together, the
        // apportioning being the same for any ratio between them; beside a slice whose estimate
        // its own samples anchor, the other's converges.
        if !anchored && n_shared > 0 {
            p.estimate.add(x, n_shared as u64);
        }
        self.cost.store(self.estimated_cost(p), Ordering::Relaxed);
        used.ns + x
    }

    /// What a launch costs by this process's own measurements: its timings where it has them
    /// (the library times a sample of launches whenever it is metered), else what the driver's
    /// samples taught the estimate.
    fn estimated_cost(&self, p: &Period) -> u64 {
        p.costs.mean_within(p.within).map_or_else(
            || p.estimate.cost(self.cost.load(Ordering::Relaxed)),
            |c| c.max(1_000),
        )
    }

    /// The apportioned part of `attribute`: this process's device time in the shared periods
    /// of `used` (span `span` ns), in which `n_shared` of its launches were settled.
    fn apportion(
        &self,
        p: &Period,
        used: &Used,
        charged: u64,
        n_shared: u128,
        span: u128,
        anchored: bool,
    ) -> u64 {
        let shared = used.shared_span_ns as u128;
        let mine = charged as u128 * shared / span;
        let others = p.others_launched as u128 * shared / FULL as u128;
        let apportioned = (used.shared_busy_ns as u128 * mine)
            .checked_div(mine + others)
            .unwrap_or(0);
        // At most its launches at what one cost by its own samples (or by the starting figure,
        // while it has too few of them).
        let cost = self.cost.load(Ordering::Relaxed);
        let ceiling = if anchored || p.costs.mean().is_some() {
            cost
        } else {
            cost.max(INITIAL_COST_NS)
        };
        apportioned.min(n_shared.saturating_mul(ceiling as u128)) as u64
    }
}

/// Launches charged over one period, `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Charged {
    from: u64,
    to: u64,
    ns: u64,
    launches: u64,
}

/// Takes the pending charges made before `cutoff` off the queue: (ns, launches). A period that
/// `cutoff` cuts is split in proportion, as if its launches were evenly spread, so that what is
/// settled does not jump by a whole period when NVML's sample times drift past the meter's.
fn settle(pending: &mut VecDeque<Charged>, cutoff: u64) -> (u64, u64) {
    let (mut ns, mut n) = (0, 0);
    while let Some(c) = pending.front_mut() {
        if c.from >= cutoff {
            break;
        }
        if c.to <= cutoff {
            ns += c.ns;
            n += c.launches;
            pending.pop_front();
            continue;
        }
        let (part, whole) = ((cutoff - c.from) as u128, (c.to - c.from) as u128);
        let (cut_ns, cut_n) = (
            (c.ns as u128 * part / whole) as u64,
            (c.launches as u128 * part / whole) as u64,
        );
        ns += cut_ns;
        n += cut_n;
        c.ns -= cut_ns;
        c.launches -= cut_n;
        c.from = cutoff;
        break;
    }
    (ns, n)
}

fn meter_thread(s: &'static Slice) {
    loop {
        std::thread::sleep(std::time::Duration::from_nanos(PERIOD_NS));
        let now = now_ns();
        let mut metered = false;
        for m in meters() {
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
    let Ok(Some(s)) = membership::active() else {
        return;
    };
    STARTED.store(true, Ordering::Release);
    if meters().is_empty() {
        return;
    }
    if let Err(e) = std::thread::Builder::new()
        .name("cuslice-meter".into())
        .spawn(move || meter_thread(s))
    {
        error!("cannot start the compute meter thread: {e}; core limits are not enforced");
    }
}

/// Whether a launch may go straight on to the driver: the meter is started and no device is
/// metered (no core limit, no other slice asking for time, no priority to act on).
#[inline(always)]
fn gate_open() -> bool {
    STARTED.load(Ordering::Relaxed) && !METERED.load(Ordering::Relaxed)
}

/// Every launch the fast path does not let through passes here first (one call: the metered
/// charge, which every launch under a core limit makes, is inlined here). `stream` (the launch's
/// stream; `ptsz`: a `_ptsz` entry point) is only evaluated on the metered path, for priority.
/// True: the self-timing meter picked this launch to time (`timed_launch`).
#[inline(always)]
fn gate(stream: impl FnOnce() -> CUstream, ptsz: bool) -> bool {
    if !STARTED.load(Ordering::Relaxed) {
        start();
    }
    if METERED.load(Ordering::Relaxed) {
        return gate_metered(stream(), ptsz);
    }
    false
}

/// The slice this process is in and the meter of the device the launch goes to.
#[inline(always)]
fn metered_device() -> Option<(&'static membership::Slice, &'static Meter)> {
    let Ok(Some(s)) = membership::active() else {
        return None;
    };
    let meters = meters();
    // One device (the usual case): no need to ask the driver which context is current.
    let m = if meters.len() == 1 {
        meters.first()
    } else {
        membership::current(s).and_then(|(_, o)| meters.get(o))
    };
    Some((s, m?))
}

#[inline(always)]
fn gate_metered(stream: CUstream, ptsz: bool) -> bool {
    let Some((s, m)) = metered_device() else {
        return false;
    };
    let Some(t) = s.ledger.tokens(m.index) else {
        return false;
    };
    m.charge(&s.ledger, t);
    m.prioritise(stream, ptsz);
    m.timer.due()
}

/// A launch the gate picked to time (already charged): its start event recorded on its stream,
/// the launch made with `launch`, then its end event. `kind`: what kind of launch
/// (`cuslice_policy::timing::launch_kind`).
#[cold]
#[inline(never)]
fn timed_launch(
    stream: CUstream,
    ptsz: bool,
    kind: u64,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let started = metered_device().and_then(|(_, m)| Some((m, m.timer.begin(stream, ptsz, kind)?)));
    let r = launch();
    if let Some((m, st)) = started {
        m.timer.finish(st, r.is_ok());
    }
    r
}

/// The kind of a `cuLaunchKernelEx` launch (its function and grid).
fn ex_kind(config: *const CUlaunchConfig, f: CUfunction) -> u64 {
    // SAFETY: the caller passes the launch's config, which the driver reads too; null is checked.
    let c = unsafe { config.as_ref() };
    c.map_or(f as u64, |c| {
        launch_kind(
            f as usize,
            [c.gridDimX, c.gridDimY, c.gridDimZ],
            [c.blockDimX, c.blockDimY, c.blockDimZ],
        )
    })
}

/// The stream of a `cuLaunchKernelEx` launch (null for a null config, which the driver refuses).
fn ex_stream(config: *const CUlaunchConfig) -> CUstream {
    // SAFETY: the caller passes the launch's config, which the driver reads too; null is checked.
    unsafe { config.as_ref() }.map_or(std::ptr::null_mut(), |c| c.hStream)
}

/// In a forked child: no meter thread runs there (the child joins afresh at its own cuInit).
pub fn child_after_fork() {
    STARTED.store(false, Ordering::Relaxed);
    METERED.store(false, Ordering::Relaxed);
    // The parent's meters are leaked with its slice (`membership::child_after_fork`).
    METERS.store(std::ptr::null_mut(), Ordering::Relaxed);
    timing::child_after_fork();
}

/// At process exit: the last process of a standalone slice takes the slice's place off the
/// node's compute board (a process killed before it could is swept by the next standalone
/// process, once its claims are old: `board::LEFTOVER_NS`).
pub fn at_exit() {
    let Ok(Some(s)) = membership::active() else {
        return;
    };
    let Some(b) = meters().iter().find_map(|m| m.board.as_ref()) else {
        return;
    };
    if s.hooked {
        return;
    }
    let others = s
        .ledger
        .snapshot()
        .procs
        .iter()
        .filter(|p| p.alive && p.pid != std::process::id() as i32)
        .count();
    if others == 0 {
        b.leave();
    }
}

/// Each wrapper's fast path is three loads (the real function, cached in the wrapper, and the two
/// flags of `gate_open`) and a jump to the driver: no call of its own, so no registers to save.
/// The rest (resolving the real function, starting the meter, charging a metered launch) is in
/// the out-of-line `slow` twin, which answers with the real function, so that a metered launch
/// too is a jump to the driver from the wrapper. A launch the self-timing meter picks to time
/// (about ten a period) goes through `timed` instead, which records its events around it.
macro_rules! launch_wrappers {
    ($($name:ident($($arg:ident: $ty:ty),*) on $stream:expr, $ptsz:expr, kind $kind:expr;)*) => {
        $(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            let mut p = slow::$name::REAL.load(Ordering::Relaxed);
            if p.is_null() || !gate_open() {
                p = slow::$name::prepare($stream);
                if p.is_null() {
                    return CUresult::CUDA_ERROR_NOT_INITIALIZED;
                }
                if p == slow::TIMED {
                    // SAFETY: forwarded unchanged.
                    return unsafe { slow::$name::timed($($arg),*) };
                }
            }
            // SAFETY: `p` was stored by `slow::$name::prepare` from `real::$name()`, a pointer
            // of exactly this type (never `slow::TIMED`, which is not stored).
            let f = unsafe {
                std::mem::transmute::<*mut (), unsafe extern "C" fn($($ty),*) -> CUresult>(p)
            };
            // SAFETY: forwarded unchanged.
            unsafe { f($($arg),*) }
        }
        )*

        mod slow {
            #![allow(non_snake_case)]
            use super::*;

            /// What `prepare` answers for a launch to time: an address no function has.
            pub const TIMED: *mut () = std::ptr::dangling_mut::<()>();

            $(
            pub mod $name {
                use super::*;

                /// The real function, once resolved.
                pub static REAL: std::sync::atomic::AtomicPtr<()> =
                    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

                /// Resolves the real function and passes the gate with the launch's stream: the
                /// real function (null if the driver lacks it), or `TIMED`.
                #[cold]
                #[inline(never)]
                pub fn prepare(stream: CUstream) -> *mut () {
                    let Some(f) = real::$name() else {
                        return std::ptr::null_mut();
                    };
                    if REAL.load(Ordering::Relaxed) != f as *mut () {
                        REAL.store(f as *mut (), Ordering::Relaxed);
                    }
                    if gate(|| stream, $ptsz) {
                        return TIMED;
                    }
                    f as *mut ()
                }

                /// The launch, timed (`timed_launch`).
                ///
                /// # Safety
                /// The CUDA driver API contract of the function of the same name.
                #[cold]
                #[inline(never)]
                #[allow(clippy::too_many_arguments)] // the driver function's own arguments
                pub unsafe extern "C" fn timed($($arg: $ty),*) -> CUresult {
                    let Some(f) = real::$name() else {
                        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
                    };
                    // SAFETY: forwarded unchanged.
                    timed_launch($stream, $ptsz, $kind, || unsafe { f($($arg),*) })
                }
            }
            )*
        }
    };
}

launch_wrappers! {
    cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) on stream, false, kind launch_kind(f as usize, [gx, gy, gz], [bx, by, bz]);
    cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) on stream, true, kind launch_kind(f as usize, [gx, gy, gz], [bx, by, bz]);
    cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) on ex_stream(config), false, kind ex_kind(config, f);
    cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) on ex_stream(config), true, kind ex_kind(config, f);
    cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) on stream, false, kind launch_kind(f as usize, [gx, gy, gz], [bx, by, bz]);
    cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) on stream, true, kind launch_kind(f as usize, [gx, gy, gz], [bx, by, bz]);
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream) on stream, false, kind exec as u64;
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) on stream, true, kind exec as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_takes_whole_periods_and_splits_the_one_cut() {
        let c = |from, to, ns, launches| Charged {
            from,
            to,
            ns,
            launches,
        };
        let mut q: VecDeque<Charged> = [c(0, 50, 500, 50), c(50, 100, 1000, 100)].into();
        // Nothing before the first period's start.
        assert_eq!(settle(&mut q, 0), (0, 0));
        // The first period whole, a fifth of the second.
        assert_eq!(settle(&mut q, 60), (700, 70));
        assert_eq!(q.front(), Some(&c(60, 100, 800, 80)));
        // The rest; then nothing is left to settle.
        assert_eq!(settle(&mut q, 1000), (800, 80));
        assert!(q.is_empty());
        assert_eq!(settle(&mut q, 2000), (0, 0));
    }
}
