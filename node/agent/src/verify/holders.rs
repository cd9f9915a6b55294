//! The first steps of a tick: who holds what on each device by the driver's count (NVML's
//! process list, each process put in its slice), what each slice's ledger says, the limits that
//! apply from the hook's config, memory that no process's entry shows, and what is handed to the
//! meter thread.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Instant;

use cuslice_node::nvml::{Device, Nvml};
use cuslice_policy::config::Limits;
use cuslice_policy::config::gpus::NvmlGpu;
use cuslice_policy::format_size;
use cuslice_state::ledger::ReadOnly;
use cuslice_state::uuid_string;

use super::slices::{classify, environ};
use super::{Bounded, ComputeKill, Slice, Verifier, log};
use crate::Enforce;
use crate::judge::{self, Bucket, Held, Window};
use cuslice_state::init::inner_pid;

/// What the meter measured for a slice on a device: its usage over the window, the pids whose
/// samples counted, its last kill for device time owed, and (under one sample a period) the
/// bound it established.
pub(super) type Measured = (judge::Usage, Vec<i32>, Option<ComputeKill>, Option<Bounded>);

/// Who holds what on the devices, by the driver's count.
#[derive(Default)]
pub(super) struct Holders {
    /// Pid -> the slice it is in (None: in no slice).
    pub(super) pid_slice: HashMap<u32, Option<String>>,
    /// Per slice and device: its processes there and what each holds.
    pub(super) held: BTreeMap<(String, String), Vec<Held>>,
    /// Devices whose processes were read: a slice with none there holds nothing there.
    pub(super) read: BTreeSet<String>,
    /// Devices with a process in no slice.
    pub(super) outside: BTreeSet<String>,
    /// Per device: the processes of slices there.
    pub(super) device_pids: HashMap<String, Vec<(u32, String)>>,
    /// Per device: the sum of every listed process's entry.
    pub(super) entries: BTreeMap<String, u64>,
    /// Devices with a process whose entry NVML does not give.
    pub(super) blind: BTreeSet<String>,
}

impl Holders {
    /// Devices where some party has no cap: a process in no slice, or one NVML gives no entry
    /// for.
    pub(super) fn uncapped(&self) -> BTreeSet<String> {
        self.outside.union(&self.blind).cloned().collect()
    }
}

impl Verifier {
    /// Who holds what, by the driver's count, per slice and device.
    pub(super) fn holders(
        &mut self,
        nvml: &Nvml,
        devices: &[(Device, String)],
        slices: &BTreeMap<String, Arc<Slice>>,
    ) -> Holders {
        let mut h = Holders::default();
        let Holders {
            pid_slice,
            held,
            read,
            outside,
            device_pids,
            entries,
            blind,
        } = &mut h;
        for (d, uuid) in devices {
            let procs = match nvml.processes(*d) {
                Ok(p) => p,
                Err(e) => {
                    self.once(format!("{uuid}: {e}"));
                    continue;
                }
            };
            read.insert(uuid.clone());
            for p in procs {
                *entries.entry(uuid.clone()).or_default() += p.used.unwrap_or(0);
                if p.used.is_none() {
                    blind.insert(uuid.clone());
                }
                let slice = pid_slice
                    .entry(p.pid)
                    .or_insert_with(|| classify(p.pid as i32, slices))
                    .clone();
                if let Some(s) = &slice {
                    device_pids
                        .entry(uuid.clone())
                        .or_default()
                        .push((p.pid, s.clone()));
                }
                if let Some(s) = slice {
                    held.entry((s, uuid.clone())).or_default().push(Held {
                        pid: p.pid as i32,
                        driver: p.used.unwrap_or(0),
                        charged: None,
                    });
                } else {
                    outside.insert(uuid.clone());
                }
            }
        }
        h
    }

    /// What each slice's ledger says: per slice and device, what it holds by its ledger; and
    /// each process's ledger entry (`Held::charged`) set in `held`. Ledgers stay mapped
    /// between ticks; those of slices gone (or with nothing on a device) are unmapped.
    pub(super) fn read_ledgers(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
        held: &mut BTreeMap<(String, String), Vec<Held>>,
    ) -> HashMap<(String, String), u64> {
        let mut ledger_used: HashMap<(String, String), u64> = HashMap::new();
        let mut mapped = HashMap::new();
        let mut untold = false;
        self.unreadable.clear();
        for (id, s) in slices {
            if !held.keys().any(|(x, _)| x == id) {
                continue;
            }
            let ino = fs::metadata(&s.ledger).map_or(0, |m| m.ino());
            let ledger = match self.ledgers.remove(&s.ledger) {
                Some((i, l)) if i == ino => Ok(l),
                _ => ReadOnly::open(&s.ledger),
            };
            let snap = match ledger {
                Ok(l) => {
                    let snap = l.snapshot();
                    mapped.insert(s.ledger.clone(), (ino, l));
                    snap
                }
                Err(e) => {
                    self.once(format!("{}: {e}", s.label()));
                    // Only a format this release does not read: a ledger whose header was
                    // written over is compared with the driver as if empty, as before.
                    if cuslice_state::ledger::file_size_of(s.ledger_format()).is_none() {
                        self.unreadable.insert(id.clone());
                    }
                    continue;
                }
            };
            untold |= snap.procs.iter().any(|p| p.alive && p.host_pid.is_none());
            for (i, dev) in snap.devices.iter().enumerate() {
                let uuid = uuid_string(&dev.uuid);
                // On the device by the ledger: what frozen processes hold is in their host
                // memory (the driver lists them with nothing; a process marked frozen that the
                // driver lists with memory is counted as holding none, and found short).
                ledger_used.insert(
                    (id.clone(), uuid.clone()),
                    dev.used.saturating_sub(dev.frozen),
                );
                if let Some(list) = held.get_mut(&(id.clone(), uuid)) {
                    for h in list.iter_mut() {
                        // By the host pid the agent told the process (no /proc read), else by
                        // its pid in its own namespace.
                        let told = snap
                            .procs
                            .iter()
                            .find(|p| p.alive && p.host_pid == Some(h.pid));
                        let entry = told.or_else(|| {
                            let inner = inner_pid(h.pid);
                            snap.procs
                                .iter()
                                .find(|p| p.alive && p.host_pid.is_none() && Some(p.pid) == inner)
                        });
                        h.charged = entry.map(|p| match p.frozen_ns {
                            Some(_) => 0,
                            None => p.charged.get(i).copied().unwrap_or(0),
                        });
                    }
                }
            }
        }

        self.ledgers = mapped;
        self.untold = untold;
        ledger_used
    }

    /// The slices (and devices) whose ledger looked short of the driver's count at this tick's
    /// reads, read at different moments, but not when looked at again
    /// (`judge::short_at_a_look`, `judge::LEDGER_LOOKS` times at most): a slice that freed
    /// between the reads, not one holding memory the ledger does not know of.
    pub(super) fn looked_again(
        &self,
        nvml: &Nvml,
        devices: &[(Device, String)],
        slices: &BTreeMap<String, Arc<Slice>>,
        holders: &Holders,
        ledger_used: &HashMap<(String, String), u64>,
    ) -> HashSet<(String, String)> {
        let mut cleared = HashSet::new();
        for (key, list) in &holders.held {
            let (id, uuid) = key;
            let ledger = ledger_used.get(key).copied().unwrap_or(0);
            if self.unreadable.contains(id) || !judge::ledger_short(ledger, judge::total(list)) {
                continue;
            }
            let (Some(s), Some((d, _))) = (slices.get(id), devices.iter().find(|d| &d.1 == uuid))
            else {
                continue;
            };
            for _ in 0..judge::LEDGER_LOOKS {
                let before = self.ledger_on(s, uuid);
                let Ok(procs) = nvml.processes(*d) else {
                    break;
                };
                let after = self.ledger_on(s, uuid);
                // The slice's processes as this tick placed them (one started since is left
                // out: it may only clear the look).
                let driver = procs
                    .iter()
                    .filter(|p| matches!(holders.pid_slice.get(&p.pid), Some(Some(x)) if x == id))
                    .map(|p| p.used.unwrap_or(0))
                    .sum();
                if !judge::short_at_a_look(before, driver, after) {
                    cleared.insert(key.clone());
                    break;
                }
            }
        }
        cleared
    }

    /// What a slice's ledger, mapped at this tick, says it holds on a device now (what its
    /// frozen processes hold aside); 0 when not mapped or without the device.
    fn ledger_on(&self, s: &Slice, uuid: &str) -> u64 {
        let Some((_, l)) = self.ledgers.get(&s.ledger) else {
            return 0;
        };
        l.snapshot()
            .devices
            .iter()
            .find(|dev| uuid_string(&dev.uuid) == uuid)
            .map_or(0, |dev| dev.used.saturating_sub(dev.frozen))
    }

    /// Device memory that no process's NVML entry shows, beyond what the slices' caps allow
    /// (`judge::unattributed`): reported, never acted on (no slice can be named).
    pub(super) fn unattributed_memory(
        &mut self,
        nvml: &Nvml,
        read: &BTreeSet<String>,
        entries: &BTreeMap<String, u64>,
        uncapped: &BTreeSet<String>,
        held: &BTreeMap<(String, String), Vec<Held>>,
        limits: &BTreeMap<(String, String), Limits>,
    ) {
        let gpus = match nvml.gpus() {
            Ok(g) => g,
            Err(e) => {
                self.once(format!("cannot read the GPUs' used memory: {e}"));
                return;
            }
        };
        for g in gpus {
            if !read.contains(&g.uuid) {
                continue;
            }
            let listed = entries.get(&g.uuid).copied().unwrap_or(0);
            let own = self.driver_own.entry(g.uuid.clone()).or_insert(u64::MAX);
            *own = (*own).min(g.used.saturating_sub(listed));
            let own = *own;
            // What the slices there may hold that their entries do not show (managed memory
            // made through the library counts against the cap); None: a party with no cap.
            let headroom = if uncapped.contains(&g.uuid) {
                None
            } else {
                held.iter()
                    .filter(|((_, u), _)| *u == g.uuid)
                    .try_fold(0u64, |sum, (key, list)| {
                        let cap = limits.get(key)?.memory?;
                        Some(sum + cap.saturating_sub(judge::total(list)))
                    })
            };
            let streak = self.unattributed.entry(g.uuid.clone()).or_default();
            match judge::unattributed(g.used, listed, own, headroom) {
                Some(beyond) => {
                    *streak += 1;
                    if *streak == judge::LEDGER_TICKS {
                        log(&format!(
                            "{}: the device's used memory is {}, {} more than every listed \
                             process's NVML entry ({}), the driver's own ({}, the least seen) \
                             and what the slices' caps leave them ({}) account for: memory no \
                             process's entry shows, such as managed memory (a real driver never \
                             counts it in a process's entry); no slice can be named; action: \
                             none",
                            g.uuid,
                            format_size(g.used),
                            format_size(beyond),
                            format_size(listed),
                            format_size(own),
                            format_size(headroom.unwrap_or(0))
                        ));
                    }
                }
                None => {
                    if *streak >= judge::LEDGER_TICKS {
                        log(&format!(
                            "{}: the device's used memory is accounted for again",
                            g.uuid
                        ));
                    }
                    *streak = 0;
                }
            }
        }
    }

    /// Hands the slices and limits to the meter (with who may run on each device, for the
    /// bound under one sample a period); returns what it measured.
    pub(super) fn hand_to_meter(
        &mut self,
        devices: &[(Device, String)],
        slices: &BTreeMap<String, Arc<Slice>>,
        holders: &mut Holders,
        limits: &BTreeMap<(String, String), Limits>,
    ) -> BTreeMap<(String, String), Measured> {
        let (held, outside) = (&holders.held, &holders.outside);
        // Who may run on each device, for the bound under one sample a period: a slice with a
        // limit is taken to use at most that limit + `OVER_PCT` only while every process it has
        // there is known to its ledger (held by the library's meter).
        let mut parties: HashMap<String, BTreeMap<Option<String>, judge::Party>> = HashMap::new();
        for ((id, uuid), list) in held {
            let core = limits
                .get(&(id.clone(), uuid.clone()))
                .and_then(|l| l.core_limit);
            let known = list.iter().all(|h| h.charged.is_some());
            parties.entry(uuid.clone()).or_default().insert(
                Some(id.clone()),
                judge::Party {
                    cap: core
                        .filter(|_| known)
                        .map(|l| (f64::from(l) + judge::OVER_PCT) / 100.0),
                    limited: core.is_some(),
                },
            );
        }
        for uuid in outside {
            parties.entry(uuid.clone()).or_default().insert(
                None,
                judge::Party {
                    cap: None,
                    limited: false,
                },
            );
        }

        let mut st = self.shared.lock();
        let now_ns = self.shared.mono_ns(Instant::now());
        st.devices = devices.to_vec();
        st.parties = parties;
        st.device_pids = std::mem::take(&mut holders.device_pids);
        st.slices = slices.clone();
        st.pids = holders.pid_slice.clone();
        for (key, l) in limits {
            let limit_pct = l.core_limit.map(f64::from);
            if limit_pct.is_none() && !st.meters.contains_key(key) {
                continue;
            }
            let m = st.meters.entry(key.clone()).or_default();
            if judge::limit_changed(m.limit_seen, m.limit_pct, limit_pct) {
                // Judged afresh against the new limit (`cuslice set`).
                m.window = Window::default();
                m.bucket = Bucket::default();
                m.named = judge::Named::default();
                m.named_over = false;
                m.named_killed = false;
                m.settle_until = now_ns + judge::LIMIT_SETTLE_NS;
            }
            m.limit_seen = true;
            m.limit_pct = limit_pct;
            m.rate = match self.shared.enforce {
                Enforce::Stop => limit_pct.map(judge::enforced_rate),
                Enforce::Report => None,
            };
        }
        st.meters.retain(|(id, _), _| slices.contains_key(id));
        st.meters
            .iter()
            .filter_map(|(k, m)| {
                Some((
                    k.clone(),
                    (
                        m.window.usage()?,
                        m.pids.keys().map(|&p| p as i32).collect(),
                        m.killed.clone(),
                        m.bound.map(|b| Bounded {
                            last: b,
                            busy: m.busy.usage().map_or(0.0, |u| u.share),
                            beyond: m.beyond.usage().map_or(0.0, |u| u.share),
                            named: m.named_over.then(|| m.named.share()).flatten(),
                        }),
                    ),
                ))
            })
            .collect()
    }
}

/// The limits that apply to each slice on each device, from the hook's config: where the config
/// names devices by ordinal, by the container's GPUs as the hook recorded them (`gpus`: NVML's
/// GPUs in its order), or, for a slice whose hook recorded none (a standalone slice, one of an
/// earlier release), the strictest over the slice's processes there (each numbers the devices
/// by its own `CUDA_VISIBLE_DEVICES`).
pub(super) fn limits(
    slices: &BTreeMap<String, Arc<Slice>>,
    gpus: &[NvmlGpu],
    held: &BTreeMap<(String, String), Vec<Held>>,
) -> BTreeMap<(String, String), Limits> {
    let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    let uuids = uuids.as_slice();
    let mut limits: BTreeMap<(String, String), Limits> = BTreeMap::new();
    for (id, s) in slices {
        // The devices' numbering matters only to a config that names devices by ordinal;
        // without one every device gets the same limits, and no process's environment is read.
        let by_ordinal = !s.config.mentioned_ordinals().is_empty();
        if let (true, Some(recorded)) = (by_ordinal, s.config.gpus()) {
            let order = recorded.order(gpus, true);
            for uuid in uuids {
                limits.insert(
                    (id.clone(), uuid.clone()),
                    s.config.limits_of_gpu(uuid, &order),
                );
            }
            continue;
        }
        let nvidia = by_ordinal
            .then(|| environ(s.init, "NVIDIA_VISIBLE_DEVICES"))
            .flatten();
        for uuid in uuids {
            let key = (id.clone(), uuid.clone());
            let per_process: Vec<Limits> = if !by_ordinal {
                Vec::new()
            } else {
                held.get(&key)
                    .into_iter()
                    .flatten()
                    .map(|h| {
                        let cuda = environ(h.pid, "CUDA_VISIBLE_DEVICES");
                        judge::limits_for(
                            &s.config,
                            uuid,
                            uuids,
                            nvidia.as_deref(),
                            cuda.as_deref(),
                        )
                    })
                    .collect()
            };
            let l = per_process
                .into_iter()
                .reduce(judge::strictest)
                .unwrap_or_else(|| {
                    judge::limits_for(&s.config, uuid, uuids, nvidia.as_deref(), None)
                });
            limits.insert(key, l);
        }
    }
    limits
}
