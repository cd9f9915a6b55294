//! Judging, one step of a tick: each slice's memory against its cap and its ledger against the
//! driver, its files against their size, its compute against its core limit (with notes on what
//! the driver could not establish), and logging what started and ended. The findings say what
//! the next step (`stop`) does about them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::Arc;

use cuslice_node::findings::Finding;
use cuslice_policy::config::Limits;
use cuslice_policy::format_size;
use cuslice_state::host::Root;

use super::holders::{Holders, Measured};

/// What a slice's file may hold beyond its size rounded up to this, before it counts as grown:
/// file systems allocate in blocks and may keep a little ahead.
const ALLOCATED_SLACK: u64 = 1 << 20;
use super::slices::short;
use super::{CapState, Key, KillWhy, Kind, Slice, Verifier, finding, join, log, round1};
use crate::Enforce;
use crate::judge::{self, Held};

/// When a tick judges: now (Unix seconds), the grace over a cap and the window it adds up in
/// (seconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) now: f64,
    pub(super) grace: f64,
    pub(super) window: f64,
}

impl Verifier {
    /// Each slice's memory on each device against its cap (what a cap lowered while it held
    /// more allows aside), and its ledger against the driver (`cleared`: where the ledger looked
    /// short but not when looked at again).
    pub(super) fn check_memory(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
        held: &BTreeMap<(String, String), Vec<Held>>,
        ledger_used: &HashMap<(String, String), u64>,
        cleared: &HashSet<(String, String)>,
        limits: &BTreeMap<(String, String), Limits>,
        at: At,
    ) -> Vec<(Key, Finding)> {
        let At { now, grace, window } = at;
        let mut found: Vec<(Key, Finding)> = Vec::new();
        for ((id, uuid), list) in held {
            let s = &slices[id];
            let driver = judge::total(list);
            let mut pids: Vec<i32> = list.iter().map(|h| h.pid).collect();
            pids.sort_unstable();
            let l = limits
                .get(&(id.clone(), uuid.clone()))
                .copied()
                .unwrap_or_default();
            let st = self
                .caps
                .entry((id.clone(), uuid.clone()))
                .or_insert(CapState {
                    cap: l.memory,
                    ..CapState::default()
                });
            // What `cuslice set` recorded the slice held when it lowered the cap (so an agent
            // that did not see the old cap allows it too), taken once per value.
            let recorded = s.lowered.get(uuid.as_str()).copied();
            let mut allowance = st.allowance;
            if recorded.is_some() && recorded != st.seeded {
                st.seeded = recorded;
                allowance = recorded
                    .map(|r| r.saturating_add(judge::ledger_slack(r)))
                    .max(allowance);
            }
            let allowance = judge::lowered_allowance(st.cap, l.memory, driver, allowance);
            (st.cap, st.allowance) = (l.memory, allowance);
            // Time over the cap adds up within the window (what a lowered cap allows aside).
            let over_cap = l.memory.is_some_and(|cap| driver > cap);
            let allowed = allowance.is_some_and(|a| driver <= a);
            let over_s = self
                .over
                .entry((id.clone(), uuid.clone()))
                .or_default()
                .check(now, over_cap && !allowed, window);
            if let Some(cap) = l.memory
                && driver > cap
            {
                let action = match (self.cfg.enforce, allowance) {
                    (Enforce::Report, _) => "none (--enforce report)".to_string(),
                    (Enforce::Stop, Some(a)) if driver <= a => format!(
                        "none: its cap was lowered while it held {} (cuslice set); nothing is \
                         freed, its new allocations are refused until it is under",
                        format_size(a)
                    ),
                    (Enforce::Stop, _) => format!(
                        "its processes are killed once over for {grace:.1} s in total within \
                         {window:.0} s (--grace)"
                    ),
                };
                found.push((
                    Key {
                        slice: id.clone(),
                        uuid: uuid.clone(),
                        kind: Kind::Memory,
                    },
                    Finding {
                        message: format!(
                            "{} holds {} on {uuid} by the driver's count, over its cap of {} \
                             (pids {})",
                            s.label(),
                            format_size(driver),
                            format_size(cap),
                            join(&pids)
                        ),
                        driver_bytes: Some(driver),
                        cap_bytes: Some(cap),
                        over_s: Some(round1(over_s)),
                        window_s: Some(window),
                        ..finding(s, uuid, Kind::Memory, pids.clone(), action)
                    },
                ));
            }
            if self.unreadable.contains(id) {
                continue;
            }
            let pair = (id.clone(), uuid.clone());
            let ledger = ledger_used.get(&pair).copied().unwrap_or(0);
            let key = Key {
                slice: id.clone(),
                uuid: uuid.clone(),
                kind: Kind::Ledger,
            };
            let streak = self.ledger_streak.entry(key.clone()).or_insert(0);
            // Short at this tick's reads, and at every look again.
            if judge::ledger_short(ledger, driver) && !cleared.contains(&pair) {
                *streak += 1;
            } else {
                *streak = 0;
            }
            if *streak >= judge::LEDGER_TICKS || (*streak > 0 && self.tracker.active(&key)) {
                let unknown: Vec<i32> = list
                    .iter()
                    .filter(|h| h.driver > h.charged.unwrap_or(0) + judge::ledger_slack(0))
                    .map(|h| h.pid)
                    .collect();
                found.push((
                    key,
                    Finding {
                        message: format!(
                            "{}'s ledger does not match the driver on {uuid}: the ledger says \
                             the slice holds {} on the device, the driver {} (pids {} hold more \
                             than their ledger entries, or are marked frozen to the host: they \
                             went around the library, or the ledger was written over)",
                            s.label(),
                            format_size(ledger),
                            format_size(driver),
                            join(&unknown)
                        ),
                        driver_bytes: Some(driver),
                        ledger_bytes: Some(ledger),
                        cap_bytes: l.memory,
                        ..finding(s, uuid, Kind::Ledger, unknown.clone(), "none".into())
                    },
                ));
            }
        }
        found
    }

    // The files a slice's processes may write: no larger than cuslice makes them, by their size
    // and by the space they hold. Under `stop`, cut back to that size (the slice's own mappings
    // never reach past it; truncating to the size a file has also frees what was reserved past
    // its end, on tmpfs as on ext4).
    pub(super) fn check_files(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
    ) -> Vec<(Key, Finding)> {
        let mut found: Vec<(Key, Finding)> = Vec::new();
        for (id, s) in slices {
            // The claims and turns where the slice's processes write them: in its own space (a
            // slice of the previous release: on the board itself), where they can be cut.
            let root = Root::new(&self.cfg.state_root);
            let own = root.mnt(id).join(cuslice_state::host::OWN_PLACE);
            let place = if own.is_dir() {
                Some(own)
            } else {
                s.place_dir.clone()
            };
            let claims = place.as_ref().map(|p| p.join(cuslice_state::board::CLAIMS));
            let turns = place.map(|p| p.join(cuslice_state::board::turns::FILE));
            // The size of the ledger's own format, as the hook recorded it (a slice of the
            // previous release has the previous one's). A format this release does not read (a
            // later release's, after a downgrade) is measured against this one's but never
            // cut: its size may be its own.
            let ledger_size = cuslice_state::ledger::file_size_of(s.ledger_format());
            let files = [
                Some((
                    s.ledger.clone(),
                    ledger_size.unwrap_or(cuslice_state::ledger::file_size()),
                    ledger_size.is_some(),
                )),
                claims.map(|c| (c, cuslice_state::board::SIZE as u64, true)),
                turns.map(|t| (t, cuslice_state::board::turns::SIZE as u64, true)),
            ];
            let mut grown = Vec::new();
            for (path, want, known) in files.into_iter().flatten() {
                let Ok(m) = fs::symlink_metadata(&path) else {
                    continue;
                };
                // Space allocated past the end (`fallocate` keeping the size) is the host's
                // memory too, though the size does not show it: by the blocks the file holds.
                let allocated = m.blocks().saturating_mul(512);
                let room = want.next_multiple_of(ALLOCATED_SLACK) + ALLOCATED_SLACK;
                if !m.is_file() || (m.len() <= want && allocated <= room) {
                    continue;
                }
                let mut what = if m.len() > want {
                    format!("{} is {} bytes, not {want}", path.display(), m.len())
                } else {
                    format!(
                        "{} holds {} allocated for {want} bytes (space reserved past its end)",
                        path.display(),
                        format_size(allocated)
                    )
                };
                if self.cfg.enforce == Enforce::Stop && !known {
                    what.push_str(" (not cut: a ledger format this release does not read)");
                } else if self.cfg.enforce == Enforce::Stop {
                    let cut = fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                        .open(&path)
                        .and_then(|f| f.set_len(want));
                    what.push_str(&match cut {
                        Ok(()) => " (cut back)".to_string(),
                        Err(e) => format!(" (cannot cut it back: {e})"),
                    });
                }
                grown.push(what);
            }
            if grown.is_empty() {
                continue;
            }
            let action = if self.cfg.enforce == Enforce::Stop {
                "cut back to their size"
            } else {
                "none"
            };
            found.push((
                Key {
                    slice: id.clone(),
                    uuid: "-".into(),
                    kind: Kind::Files,
                },
                Finding {
                    message: format!(
                        "{}'s processes wrote past the end of their files, which use the host's \
                         memory: {}",
                        s.label(),
                        grown.join("; ")
                    ),
                    ..finding(s, "-", Kind::Files, Vec::new(), action.into())
                },
            ));
        }
        found
    }

    /// Forgets what is over: a slice seen on a device before and holding nothing there now is
    /// not over there; slices gone are forgotten.
    pub(super) fn forget(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
        holders: &Holders,
        at: At,
    ) {
        let At { now, window, .. } = at;
        for ((id, uuid), o) in &mut self.over {
            if holders.read.contains(uuid)
                && !holders.held.contains_key(&(id.clone(), uuid.clone()))
            {
                o.check(now, false, window);
            }
        }
        self.over
            .retain(|(id, _), o| slices.contains_key(id) && !o.idle());
        self.ledger_streak
            .retain(|k, n| *n > 0 && slices.contains_key(&k.slice));
        self.caps.retain(|(id, _), _| slices.contains_key(id));
    }

    /// Each slice's compute on each device against its core limit, by the driver's count (or
    /// the lower bound it establishes under one sample a period); notes on what it cannot.
    pub(super) fn check_compute(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
        usage: &BTreeMap<(String, String), Measured>,
        limits: &BTreeMap<(String, String), Limits>,
        now: f64,
    ) -> Vec<(Key, Finding)> {
        let mut found: Vec<(Key, Finding)> = Vec::new();
        let mut notes: BTreeMap<(String, String), String> = BTreeMap::new();
        for ((id, uuid), (u, pids, killed, bounded)) in usage {
            let Some(s) = slices.get(id) else { continue };
            let Some(limit) = limits
                .get(&(id.clone(), uuid.clone()))
                .and_then(|l| l.core_limit)
            else {
                continue;
            };
            let key = Key {
                slice: id.clone(),
                uuid: uuid.clone(),
                kind: Kind::Compute,
            };
            let limit = f64::from(limit);
            // Under one sample a period, what the driver could not establish is said, not
            // guessed.
            let span_s = u.span_ns as f64 / 1e9;
            match bounded.map(|b| b.last) {
                Some(judge::Bound::Unbounded) if bounded.is_some_and(|b| b.named.is_none()) => {
                    notes.insert(
                        (id.clone(), uuid.clone()),
                        format!(
                            "{}'s compute on {uuid} cannot be bounded while it lasts: the driver \
                             gives the device's busy time, not each process's, and a \
                             process in no slice, in a slice without a core limit, or unknown \
                             to its slice's ledger runs beside it; not judged",
                            s.label()
                        ),
                    );
                }
                Some(judge::Bound::Shared(_))
                    if bounded.is_some_and(|b| b.beyond * 100.0 > judge::BACK_PCT)
                        && !usage.iter().any(|((_, u), m)| {
                            u == uuid && m.3.is_some_and(|b| b.named.is_some())
                        })
                        && u.span_ns >= judge::MIN_HISTORY_NS =>
                {
                    let b = bounded.expect("matched");
                    notes.insert(
                        (String::new(), uuid.clone()),
                        format!(
                            "{uuid} was busy {:.1}% over the last {span_s:.1} s, {:.1} points \
                             more than the core limits of the slices on it allow (each limit + \
                             {:.0} points): one of them is over its limit, but the driver names \
                             one process per sample, with the device's figure, so which cannot \
                             be told; nothing frozen",
                            b.busy * 100.0,
                            b.beyond * 100.0,
                            judge::OVER_PCT
                        ),
                    );
                }
                _ => {}
            }
            if !judge::compute_over(Some(*u), limit, self.tracker.active(&key)) {
                continue;
            }
            let by = match bounded {
                None => "by the driver's count".to_string(),
                Some(b) if b.named.is_some() => "by the driver's samples that name it".to_string(),
                Some(_) => "by the lower bound the driver establishes".to_string(),
            };
            // Only figures measured: the driver's device time (or the bound it establishes),
            // the agent's own freezes.
            let kill_past = format!(
                "its processes on the device are killed if it owes more than {:.1} s of device \
                 time beyond its limit",
                judge::KILL_DEBT_NS as f64 / 1e9
            );
            let action = match (self.cfg.enforce, &s.freezer, killed) {
                (Enforce::Report, _, _) => "none (--enforce report)".to_string(),
                (Enforce::Stop, _, Some(k)) if now - k.at < span_s => match k.why {
                    KillWhy::Debt(debt_ns) => format!(
                        "killed pids {} {:.0} s ago: it owed {:.2} s of device time beyond its \
                         limit {by}, more than freezing holds",
                        join(&k.pids),
                        now - k.at,
                        debt_ns as f64 / 1e9
                    ),
                    KillWhy::Named(n) => format!(
                        "killed pids {} {:.0} s ago: the driver's samples named them for \
                         {:.1}% of the device, more than {:.0} points over its limit (its work \
                         goes around the library)",
                        join(&k.pids),
                        now - k.at,
                        n.share * 100.0,
                        judge::NAMED_OVER_PCT
                    ),
                },
                (Enforce::Stop, Ok(_), _) => format!(
                    "its cgroup is frozen while it owes device time {by} (frozen {:.0}% of \
                     the last {span_s:.1} s); {kill_past}",
                    u.frozen * 100.0
                ),
                (Enforce::Stop, Err(e), _) => format!("cannot be frozen ({e}); {kill_past}"),
            };
            found.push((
                key,
                Finding {
                    message: match bounded {
                        None => format!(
                            "{} used {:.1}% of {uuid} by the driver's count over the last \
                             {span_s:.1} s, over its core limit of {limit:.0}% ({:.1}% of the \
                             time it was not frozen; pids {})",
                            s.label(),
                            u.share * 100.0,
                            u.demand * 100.0,
                            join(pids)
                        ),
                        Some(b) if b.named.is_some() => {
                            let n = b.named.expect("matched");
                            format!(
                                "{} used {:.1}% of {uuid} over the last {span_s:.1} s by the \
                                 driver's samples that name it, over its core limit of \
                                 {limit:.0}% ({:.1}% of the time it was not frozen; pids {}): \
                                 its processes were named in stamps standing for {:.1}% of the \
                                 device over the last {:.0} s ({} stamps; the driver names one \
                                 process a stamp, in proportion to its busy time), more than \
                                 {:.0} points over its limit",
                                s.label(),
                                u.share * 100.0,
                                u.demand * 100.0,
                                join(pids),
                                n.share * 100.0,
                                n.cover_ns as f64 / 1e9,
                                n.stamps,
                                judge::NAMED_OVER_PCT
                            )
                        }
                        Some(b) => format!(
                            "{} used at least {:.1}% of {uuid} over the last {span_s:.1} s, \
                             over its core limit of {limit:.0}% ({:.1}% of the time it was not \
                             frozen; pids {}): a lower bound, the device's busy time ({:.1}%) \
                             less what the other slices on it may use by their limits (the \
                             driver gives the device's busy time, not each process's)",
                            s.label(),
                            u.share * 100.0,
                            u.demand * 100.0,
                            join(pids),
                            b.busy * 100.0
                        ),
                    },
                    share_pct: Some(round1(u.share * 100.0)),
                    demand_pct: Some(round1(u.demand * 100.0)),
                    limit_pct: Some(limit),
                    window_s: Some(round1(span_s)),
                    ..finding(s, uuid, Kind::Compute, pids.clone(), action)
                },
            ));
        }
        self.log_notes(notes, slices, usage);
        found
    }

    /// Notes on what the driver could not establish: logged when they start and end. A slice
    /// with no window to judge yet (its limit just changed) keeps its note.
    fn log_notes(
        &mut self,
        mut notes: BTreeMap<(String, String), String>,
        slices: &BTreeMap<String, Arc<Slice>>,
        usage: &BTreeMap<(String, String), Measured>,
    ) {
        for (k, line) in &self.notes {
            if !k.0.is_empty() && slices.contains_key(&k.0) && !usage.contains_key(k) {
                notes.entry(k.clone()).or_insert_with(|| line.clone());
            }
        }
        for (k, line) in &notes {
            if !self.notes.contains_key(k) {
                log(line);
            }
        }
        for k in std::mem::take(&mut self.notes).into_keys() {
            if !notes.contains_key(&k) {
                let what = if k.0.is_empty() {
                    format!("{}: busy within the slices' core limits again", k.1)
                } else {
                    format!(
                        "slice {} on {}: its compute can be bounded again",
                        short(&k.0),
                        k.1
                    )
                };
                log(&what);
            }
        }
        self.notes = notes;
    }

    /// Logs the findings that started and ended, and dates each from when it started.
    pub(super) fn log_changes(&mut self, found: &mut [(Key, Finding)], now: f64) {
        let keys: Vec<Key> = found.iter().map(|(k, _)| k.clone()).collect();
        let (started, ended) = self.tracker.update(now, &keys);
        for k in &started {
            if let Some((_, f)) = found.iter().find(|(x, _)| x == k) {
                log(&format!("{}; action: {}", f.message, f.action));
            }
        }
        for (k, since) in &ended {
            let what = match k.kind {
                Kind::Memory => "back within its memory cap",
                Kind::Compute => "back within its core limit",
                Kind::Ledger => "ledger matches the driver again",
                Kind::Files => "its files are their size again",
                Kind::Claims => "its claims on the compute board are as cuslice posts them again",
            };
            log(&format!(
                "slice {} on {}: {what} (after {:.1} s)",
                short(&k.slice),
                k.uuid,
                now - since
            ));
        }
        for (k, f) in found.iter_mut() {
            f.since = self.tracker.since(k).unwrap_or(now);
        }
    }
}

/// How long after its grant changed a slice's claims are not judged: `cuslice set` writes the
/// grant before the ledger, and the slice's processes post the new figures at their meter's next
/// period (50 ms), so for a moment an honest slice claims what its old grant allowed.
const GRANT_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A slice whose claims on the compute board say what no honest process of it posts (a device
/// claimed in several entries, figures past its grant, a file not its own): reported, nothing
/// done. Every reader counts such claims once or not at all (`cuslice_state::board::faults`), so
/// they harm nobody; the finding names the container that wrote them. Not judged while its grant
/// is fresh (`GRANT_SETTLE`).
pub(super) fn check_claims(slices: &BTreeMap<String, Arc<Slice>>) -> Vec<(Key, Finding)> {
    use cuslice_state::board;
    let mut found = Vec::new();
    for (id, s) in slices {
        let Some(slice) = s.place else { continue };
        let Some(place) = &s.place_dir else {
            continue;
        };
        let grant_path = place.join(board::GRANT);
        let grant = board::read_grant(&grant_path);
        let faults = board::faults(&place.join(board::CLAIMS), slice, &grant);
        // The grant's age is looked at only for a slice with faults.
        let fresh = || {
            fs::metadata(&grant_path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < GRANT_SETTLE))
        };
        if faults.is_empty() || fresh() {
            continue;
        }
        found.push((
            Key {
                slice: id.clone(),
                uuid: "-".into(),
                kind: Kind::Claims,
            },
            Finding {
                message: format!(
                    "{}'s claims on the compute board are not as cuslice posts them (they count \
                     once or not at all): {}",
                    s.label(),
                    faults.join("; ")
                ),
                ..finding(s, "-", Kind::Claims, Vec::new(), "none".into())
            },
        ));
    }
    found
}
