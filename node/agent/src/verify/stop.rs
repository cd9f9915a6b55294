//! Stopping, the last step of a tick under `Enforce::Stop`: the processes of a slice over its
//! memory cap for the grace in total within the window are killed, and the whole container when
//! it goes over again after that. Every pid is checked to be the slice's still before it is
//! signalled.

use std::collections::BTreeMap;
use std::fs;
use std::sync::Arc;
use std::time::Instant;

use cuslice_node::findings::Finding;
use cuslice_policy::format_size;

use super::check::At;
use super::slices::classify;
use super::{Key, Kind, Slice, Verifier, join, log};
use crate::judge::{self, Held, MemoryAction};

impl Verifier {
    /// Kills what was over its cap for the grace in total within the window, and the whole
    /// container when it goes over again after that; each finding's action says what was done.
    pub(super) fn stop(
        &mut self,
        slices: &BTreeMap<String, Arc<Slice>>,
        held: &BTreeMap<(String, String), Vec<Held>>,
        found: &mut [(Key, Finding)],
        at: At,
    ) {
        let At { now, grace, window } = at;
        // Ticks are `period` apart: a total this close to the grace is taken as over it.
        let slack = self.cfg.period.as_secs_f64() / 10.0;
        for (k, f) in found.iter_mut() {
            if k.kind != Kind::Memory {
                continue;
            }
            let key = (k.slice.clone(), k.uuid.clone());
            let (Some(list), Some(cap)) = (held.get(&key), f.cap_bytes) else {
                continue;
            };
            let allowed = self
                .caps
                .get(&key)
                .and_then(|c| c.allowance)
                .is_some_and(|a| f.driver_bytes.is_some_and(|d| d <= a));
            if allowed {
                continue;
            }
            let (over_s, last_kill) = self
                .over
                .get(&key)
                .map_or((0.0, None), |o| (o.total(), o.kill.clone()));
            let s = &slices[&k.slice];
            let killed =
                match judge::memory_action(cap, list, over_s + slack, grace, last_kill.as_ref()) {
                    MemoryAction::Nothing => continue,
                    MemoryAction::Kill(victims) => {
                        let killed = self.kill(s, &victims, list, cap, over_s, window);
                        f.action = format!("killed pids {}", join(&killed));
                        killed
                    }
                    MemoryAction::KillAll => {
                        let killed = self.kill_all(s, list, cap, window);
                        f.action = format!(
                            "killed every process of the container (pids {}): over its cap \
                         again within {window:.0} s of a kill",
                            join(&killed)
                        );
                        killed
                    }
                };
            if let Some(o) = self.over.get_mut(&key)
                && !killed.is_empty()
            {
                o.kill = Some((now, killed));
            }
        }
    }

    /// SIGKILLs `victims` (host pids of slice `s`, each checked to still be the slice's).
    pub(super) fn kill(
        &mut self,
        s: &Slice,
        victims: &[i32],
        held: &[Held],
        cap: u64,
        over_s: f64,
        window: f64,
    ) -> Vec<i32> {
        let killed = self.signal(s, victims);
        for &pid in &killed {
            let bytes = held.iter().find(|h| h.pid == pid).map_or(0, |h| h.driver);
            log(&format!(
                "killed pid {pid} of {} (it held {} by the driver's count): the slice was over \
                 its cap of {} for {over_s:.1} s in the last {window:.0} s (--grace {:.1} s)",
                s.label(),
                format_size(bytes),
                format_size(cap),
                self.cfg.grace.as_secs_f64()
            ));
        }
        killed
    }

    /// SIGKILLs every process of slice `s` (its init and everything in its pid namespace or
    /// cgroup): it went over its cap again after a kill, within the window.
    pub(super) fn kill_all(&mut self, s: &Slice, held: &[Held], cap: u64, window: f64) -> Vec<i32> {
        let mut all: Vec<i32> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .collect();
        all.sort_unstable();
        // The init first: in a pid namespace of its own, the kernel kills the rest with it.
        all.retain(|&p| p != s.init);
        all.insert(0, s.init);
        let killed = self.signal(s, &all);
        if !killed.is_empty() {
            log(&format!(
                "killed every process of {} (pids {}): it went over its cap of {} again \
                 within {window:.0} s of a kill ({} by the driver's count, pids {})",
                s.label(),
                join(&killed),
                format_size(cap),
                format_size(judge::total(held)),
                join(&held.iter().map(|h| h.pid).collect::<Vec<_>>())
            ));
        }
        killed
    }

    /// SIGKILLs those of `pids` that are slice `s`'s still (not gone, not another process's
    /// pid now), thawing its cgroup first if the agent froze it (SIGKILL stays pending on a
    /// process frozen by the v1 freezer). Returns those killed.
    pub(super) fn signal(&mut self, s: &Slice, pids: &[i32]) -> Vec<i32> {
        let slices: BTreeMap<String, Arc<Slice>> = self.shared.lock().slices.clone();
        let ours: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| classify(p, &slices).as_deref() == Some(s.id.as_str()))
            .collect();
        if ours.is_empty() {
            return ours;
        }
        self.shared.lock().unfreeze(&s.id, Instant::now());
        let mut killed = Vec::new();
        for pid in ours {
            match nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            ) {
                Ok(()) => killed.push(pid),
                Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => log(&format!("cannot kill pid {pid} of {}: {e}", s.label())),
            }
        }
        self.shared.lock().actions.kills += killed.len() as u64;
        killed
    }
}
