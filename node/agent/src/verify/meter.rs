//! The meter and thaw threads. The meter reads the driver's utilisation samples every `POLL`
//! into each slice's window and bucket and freezes a slice that owes device time; the thaw
//! thread thaws each when its time is served, taking only the state's lock, never the driver.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::slices::classify;
use super::{ComputeKill, Frozen, KillWhy, POLL, Shared, State, join, log, unix_now, wall_us};
use crate::Enforce;
use crate::judge::{self, Bucket, Hold, SampleClock};
use cuslice_node::nvml::ProcessSamples;

/// Starts one of the verifier's threads; None (and a line saying what is lost) if it cannot.
pub(super) fn spawn(
    shared: &Arc<Shared>,
    name: &str,
    body: fn(&Shared),
    lost: &str,
) -> Option<JoinHandle<()>> {
    let s = shared.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(&s))
        .map_err(|e| log(&format!("cannot start the {name} thread: {e}; {lost}")))
        .ok()
}

pub(super) fn meter_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        poll(shared);
        std::thread::sleep(POLL.saturating_sub(t0.elapsed()));
    }
}

/// The thaw thread: thaws each frozen slice when its time is served, waking when the meter
/// freezes one and at the earliest end. Takes only the state's lock, never the driver.
pub(super) fn thaw_loop(shared: &Shared) {
    let mut st = shared.lock();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let due: Vec<String> = st
            .frozen
            .iter()
            .filter(|(_, f)| f.until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            st.unfreeze(&id, now);
        }
        let next = st.frozen.values().map(|f| f.until).min();
        st = match next {
            Some(t) => {
                let wait = t.saturating_duration_since(Instant::now());
                shared
                    .wake
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// One meter step: new samples into each slice's window and bucket, then freezes what owes
/// (the thaw thread thaws).
pub(super) fn poll(shared: &Shared) {
    let (nvml, devices, since) = {
        let st = shared.lock();
        let Some(nvml) = st.nvml.clone() else { return };
        let since: Vec<u64> = st
            .devices
            .iter()
            .map(|(_, u)| st.clocks.get(u).map_or(0, |c| c.seen_us))
            .collect();
        (nvml, st.devices.clone(), since)
    };
    let now_wall = wall_us();
    // The driver's calls are made without the lock: `tick` may take it meanwhile. A device
    // without per-process samples (MIG instances, some virtual GPUs) gives its utilisation.
    let mut device_only: Vec<(String, u32)> = Vec::new();
    let samples: Vec<(String, Vec<cuslice_node::nvml::Sample>)> = devices
        .iter()
        .zip(since)
        .filter_map(|((d, uuid), since)| {
            let since = if since == 0 { now_wall } else { since };
            match nvml.samples(*d, since) {
                Ok(list) => Some((uuid.clone(), list)),
                Err(_) => {
                    if nvml.process_samples(*d) == Ok(ProcessSamples::NotSupported)
                        && let Ok(util) = nvml.device_utilisation(*d)
                    {
                        device_only.push((uuid.clone(), util));
                    }
                    None
                }
            }
        })
        .collect();
    let now = Instant::now();
    let now_ns = shared.mono_ns(now);
    let mut st = shared.lock();
    let st = &mut *st;
    let dt = st
        .last_poll
        .map_or(0, |t| now.duration_since(t).as_nanos() as u64);
    let prev = st.last_poll.unwrap_or(now);
    st.last_poll = Some(now);
    // Per slice and device: its device time by its own samples (per-process samples).
    let mut used: BTreeMap<(String, String), u64> = BTreeMap::new();
    // Per device under one sample a period: the time the step's stamps stand for, the device's
    // busy time in it, and the slices (None: processes in no slice) the samples named.
    let mut one_per_period: BTreeMap<String, (u64, u64, BTreeSet<Option<String>>)> =
        BTreeMap::new();
    // Per device under one sample a period: the stamps it gave in the step; per slice and
    // device, the busy time of the stamps that named it (`judge::Named`).
    let mut stamps: BTreeMap<String, u64> = BTreeMap::new();
    let mut named_busy: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (uuid, mut list) in samples {
        list.sort_by_key(|x| (x.time_us, x.pid));
        let clock = st
            .clocks
            .entry(uuid.clone())
            .or_insert_with(|| SampleClock::new(now_wall));
        if list
            .windows(2)
            .any(|w| w[0].time_us == w[1].time_us && w[0].pid != w[1].pid)
        {
            clock.multi_seen_us = Some(now_wall);
        }
        let model = judge::sample_model(clock.multi_seen_us, now_wall);
        let (mut cover, mut busy, mut named) = (0, 0, BTreeSet::new());
        // Each slice's part of the step's device time, for what the slices are told the
        // driver saw (`evidence`).
        let mut seen_busy: BTreeMap<String, u64> = BTreeMap::new();
        for x in list {
            let slice = st
                .pids
                .entry(x.pid)
                .or_insert_with(|| classify(x.pid as i32, &st.slices))
                .clone();
            let ns = clock.take(x.pid, x.time_us, x.sm);
            let mut part = ns;
            if model == judge::SampleModel::OnePerPeriod {
                let (c, b) = clock.take_stamp(x.time_us, x.sm);
                cover += c;
                busy += b;
                named.insert(slice.clone());
                part = b;
                if c > 0 {
                    *stamps.entry(uuid.clone()).or_default() += 1;
                    if let Some(id) = &slice {
                        *named_busy.entry((id.clone(), uuid.clone())).or_default() += b;
                    }
                }
            }
            if let Some(id) = &slice {
                *seen_busy.entry(id.clone()).or_default() += part;
            }
            if let Some(id) = slice {
                let key = (id, uuid.clone());
                if model == judge::SampleModel::PerProcess {
                    *used.entry(key.clone()).or_default() += ns;
                }
                if ns > 0 {
                    st.meters.entry(key).or_default().pids.insert(x.pid, now_ns);
                }
            }
        }
        clock.forget_before(now_wall, 10_000_000);
        let seen_cover = match model {
            judge::SampleModel::OnePerPeriod => cover,
            judge::SampleModel::PerProcess => dt,
        };
        st.seen.add(&uuid, now_ns, seen_cover, seen_busy);
        if model == judge::SampleModel::OnePerPeriod {
            one_per_period.insert(uuid, (cover, busy, named));
        }
    }
    // Without per-process samples the device's utilisation over the step is all the driver
    // says, as a stamp under one sample a period that names nobody: the same lower bounds.
    for (uuid, util) in device_only {
        let busy = dt * u64::from(util.min(100)) / 100;
        one_per_period.insert(uuid, (dt, busy, BTreeSet::new()));
    }
    // Under one sample a period, each slice's bound (`judge::bounds`) over who may have run:
    // the parties NVML's process list showed at the last tick, and any the samples named since.
    let mut bound: BTreeMap<(String, String), (judge::Bound, u64)> = BTreeMap::new();
    for (uuid, (cover, busy, named)) in &one_per_period {
        let mut parties = st.parties.get(uuid).cloned().unwrap_or_default();
        for n in named {
            parties.entry(n.clone()).or_insert(judge::Party {
                cap: None,
                limited: n
                    .as_ref()
                    .is_some_and(|id| st.meters.contains_key(&(id.clone(), uuid.clone()))),
            });
        }
        let list: Vec<judge::Party> = parties.values().cloned().collect();
        let found = judge::bounds(*busy, *cover, &list);
        for (id, b) in parties.keys().zip(found) {
            if let Some(id) = id {
                bound.insert((id.clone(), uuid.clone()), (b, *busy));
            }
        }
        // A slice with a meter here and no process: it used nothing.
        for (id, u) in st.meters.keys() {
            if u == uuid && !parties.contains_key(&Some(id.clone())) {
                bound.insert(
                    (id.clone(), u.clone()),
                    (judge::Bound::Established(0), *busy),
                );
            }
        }
        // The slices a bound may be acted on for: their processes on the device count as
        // having run there (the samples may never name a slice that uses a minority share).
        // (By the slices' keys in `bound`: no key is made for each process at each step.)
        let established: HashMap<&str, &(String, String)> = bound
            .iter()
            .filter(|(key, (b, _))| {
                key.1 == *uuid && matches!(b, judge::Bound::Established(lb) if *lb > 0)
            })
            .map(|(key, _)| (key.0.as_str(), key))
            .collect();
        if !established.is_empty() {
            for (pid, id) in st.device_pids.get(uuid).into_iter().flatten() {
                if let Some(m) = established
                    .get(id.as_str())
                    .and_then(|key| st.meters.get_mut(*key))
                {
                    m.pids.insert(*pid, now_ns);
                }
            }
        }
    }
    // Time each slice spent frozen since the last step (frozen now, or thawed meanwhile).
    let thawed = std::mem::take(&mut st.thawed);
    let frozen_ns = |id: &str| -> u64 {
        let span = |since: Instant, to: Instant| to.saturating_duration_since(since.max(prev));
        let now_frozen = st.frozen.get(id).map(|f| span(f.since, now));
        let was_frozen = thawed.get(id).map(|&(since, at)| span(since, at));
        (now_frozen.unwrap_or_default() + was_frozen.unwrap_or_default()).as_nanos() as u64
    };
    let mut holds: Vec<((String, String), Hold)> = Vec::new();
    // Slices the stamps that name them found far over their limits at this step.
    let mut named_found: Vec<((String, String), judge::NamedShare)> = Vec::new();
    for (key, m) in st.meters.iter_mut() {
        let f = frozen_ns(&key.0);
        let (u, b) = match bound.get(key) {
            Some(&(b, busy)) => match b {
                judge::Bound::Established(lb) => (lb, Some((b, busy))),
                _ => (0, Some((b, busy))),
            },
            None => (
                used.get(key).copied().unwrap_or(0).min(i64::MAX as u64) as i64,
                None,
            ),
        };
        let (frozen, just_thawed) = (st.frozen.contains_key(&key.0), thawed.contains_key(&key.0));
        // Under one sample a period, the stamps that named the slice: once far over its limit
        // by them, its device time in a step is what they name (the bounds cannot say whose
        // the busy time was beside other slices), from then on.
        let mut u = u;
        if let Some((cover, _, _)) = one_per_period.get(&key.1) {
            let mine = named_busy.get(key).copied().unwrap_or(0);
            m.named.add(
                now_ns,
                mine,
                *cover,
                stamps.get(&key.1).copied().unwrap_or(0),
            );
            m.named_over |= m
                .limit_pct
                .is_some_and(|limit| judge::named_over(m.named.share(), limit));
            // Killed where nothing bounds its use beside the others (freezing it, the work it
            // queued runs on beside them unpaid for); where the driver establishes its use,
            // freezing holds it to its limit and its debt decides, as for any slice.
            let unbounded = matches!(
                b,
                Some((judge::Bound::Unbounded | judge::Bound::Shared(_), _))
            );
            if m.named_over && !m.named_killed && unbounded {
                named_found.extend(m.named.share().map(|n| (key.clone(), n)));
            }
            if m.named_over {
                u = u.max(mine.min(i64::MAX as u64) as i64);
            }
        } else {
            m.named = judge::Named::default();
            m.named_over = false;
            m.named_killed = false;
        }
        m.window.add_signed(now_ns, u, f);
        m.bound = b.map(|b| b.0);
        if let Some((b, busy)) = b {
            m.busy.add(now_ns, busy, 0);
            let beyond = match b {
                judge::Bound::Shared(e) => e,
                _ => 0,
            };
            m.beyond.add_signed(now_ns, beyond, 0);
        }
        m.pids
            .retain(|_, t| now_ns.saturating_sub(*t) < judge::WINDOW_NS);
        if let Some(rate) = m.rate {
            if now_ns < m.settle_until {
                m.bucket = Bucket::default();
            } else {
                m.bucket.step_signed(rate, dt, u);
            }
            holds.push((key.clone(), m.bucket.hold(rate, frozen, just_thawed)));
        }
    }
    if !shared.stop.load(Ordering::SeqCst) {
        st.seen.publish(&shared.agent_dir, now_ns, &st.slices);
    }
    if shared.enforce != Enforce::Stop || !st.thawing || shared.stop.load(Ordering::SeqCst) {
        return;
    }
    // Per slice: the processes to kill for device time owed, and how long to hold it frozen
    // (the longest any device asks).
    let mut owed: BTreeMap<String, u64> = BTreeMap::new();
    for (key, hold) in holds {
        match hold {
            Hold::Nothing => {}
            Hold::Freeze(ns) | Hold::Extend(ns) => {
                let e = owed.entry(key.0.clone()).or_default();
                *e = (*e).max(ns);
            }
            Hold::Kill => {
                let why = KillWhy::Debt(st.meters.get(&key).map_or(0, |m| m.bucket.debt_ns()));
                kill_ran(st, &key, now, now_ns, why);
            }
        }
    }
    // Found going around the library where nothing bounds it: its processes on the device are
    // killed at once (frozen, the work it queued runs on, and it would soon look within its
    // limit by the stamps of the time it waited).
    for (key, named) in named_found {
        if st.meters.get(&key).is_some_and(|m| m.rate.is_some()) {
            kill_ran(st, &key, now, now_ns, KillWhy::Named(named));
        }
    }
    for (id, ns) in owed {
        let until = now + Duration::from_nanos(ns);
        if let Some(f) = st.frozen.get_mut(&id) {
            // Still owed, counting what ran while frozen: frozen on.
            f.until = f.until.max(until);
            continue;
        }
        if thawed.contains_key(&id) || st.thawed.contains_key(&id) {
            continue; // thawed since the last step, or just now to be killed
        }
        let Some(s) = st.slices.get(&id).cloned() else {
            continue;
        };
        let freezer = match &s.freezer {
            Ok(f) => f.clone(),
            Err(e) => {
                if st.unfreezable.insert(id.clone()) {
                    log(&format!(
                        "{} is over its core limit but cannot be frozen: {e}",
                        s.label()
                    ));
                }
                continue;
            }
        };
        // A cgroup frozen by someone else (an operator's `runc pause`) is theirs: the agent
        // neither freezes it nor, later, thaws it.
        if freezer.requested().unwrap_or(false) {
            if st.paused.insert(id.clone()) {
                log(&format!(
                    "{} is over its core limit, but {} is frozen by someone else (a pause); \
                     the agent leaves it as it is",
                    s.label(),
                    freezer.dir().display()
                ));
            }
            continue;
        }
        st.paused.remove(&id);
        if let Err(e) = st.record.add(&freezer) {
            log(&format!(
                "cannot record {} before freezing it: {e}; not frozen",
                freezer.dir().display()
            ));
            continue;
        }
        match freezer.freeze() {
            Ok(()) => {
                st.actions.freezes += 1;
                st.frozen.insert(
                    id,
                    Frozen {
                        freezer,
                        since: now,
                        until: now + Duration::from_nanos(ns),
                    },
                );
                shared.wake.notify_all();
            }
            Err(e) => {
                if st.unfreezable.insert(id.clone()) {
                    log(&format!(
                        "cannot freeze {} ({}): {e}",
                        s.label(),
                        freezer.dir().display()
                    ));
                }
            }
        }
    }
}

/// Kills the processes of slice `key.0` that ran on device `key.1` (those the driver's samples
/// showed in the last second), each checked to be the slice's still: the slice owes more
/// device time than freezing holds (`judge::KILL_DEBT_NS`). Its cgroup is thawed first
/// (SIGKILL stays pending on a process frozen by the v1 freezer); the debt stands, so the meter
/// freezes what is left of the slice again until it is paid.
pub(super) fn kill_ran(
    st: &mut State,
    key: &(String, String),
    now: Instant,
    now_ns: u64,
    why: KillWhy,
) {
    let (id, uuid) = key;
    let Some(s) = st.slices.get(id).cloned() else {
        return;
    };
    let Some(m) = st.meters.get(key) else { return };
    let limit = m.limit_pct.unwrap_or(0.0);
    // Each checked to be the slice's still (not gone, not another process's pid now).
    let ran: Vec<i32> = m
        .pids
        .iter()
        .filter(|(_, t)| now_ns.saturating_sub(**t) < 1_000_000_000)
        .map(|(&p, _)| p as i32)
        .filter(|&p| classify(p, &st.slices).as_deref() == Some(id.as_str()))
        .collect();
    if !ran.is_empty() {
        st.unfreeze(id, now);
    }
    let mut killed = Vec::new();
    for pid in ran {
        match nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            Ok(()) => killed.push(pid),
            Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => log(&format!("cannot kill pid {pid} of {}: {e}", s.label())),
        }
    }
    let m = st.meters.get_mut(key).expect("read above");
    m.bucket.killed();
    if killed.is_empty() {
        return;
    }
    st.actions.kills += killed.len() as u64;
    if matches!(why, KillWhy::Named(_)) {
        m.named_killed = true;
    }
    log(&match why {
        KillWhy::Debt(debt_ns) => format!(
            "killed pids {} of {}: by the driver's count it owed {:.2} s of device time on \
             {uuid} beyond its core limit of {limit:.0}%, more than freezing holds ({:.1} s): \
             work it queued ran on while it was frozen",
            join(&killed),
            s.label(),
            debt_ns as f64 / 1e9,
            judge::KILL_DEBT_NS as f64 / 1e9
        ),
        KillWhy::Named(n) => format!(
            "killed pids {} of {}: the driver's samples named its processes for {:.1}% of \
             {uuid} over the last {:.0} s ({} stamps), more than {:.0} points over its core \
             limit of {limit:.0}%: its work goes around the library",
            join(&killed),
            s.label(),
            n.share * 100.0,
            n.cover_ns as f64 / 1e9,
            n.stamps,
            judge::NAMED_OVER_PCT
        ),
    });
    m.killed = Some(ComputeKill {
        at: unix_now(),
        pids: killed,
        why,
    });
}
