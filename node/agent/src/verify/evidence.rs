//! What the driver saw each container slice use on each device, over the last
//! `cuslice_state::seen::WINDOW_NS`, published for the slices' processes
//! (`<state root>/agent/seen`). A slice's claims on the compute board are its own word; this is
//! the driver's, which the library bounds them by (`cuslice_policy::share::corroborate`).
//!
//! Under one sample a period, each stamp's busy time goes to the slice it names: the driver
//! names a process with a chance in proportion to its busy time, so over the window each slice's
//! figure is its share of the device's time. Under per-process samples, each slice's own. A
//! device without per-process samples is not listed: the library then counts claims as they are.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use cuslice_policy::share::FULL;
use cuslice_state::seen::{self, EVERY_NS, Seen, WINDOW_NS};

use super::{Slice, log};

/// One meter step on one device: the time its samples stand for, and each slice's part of it.
struct Step {
    at_ns: u64,
    cover_ns: u64,
    busy: BTreeMap<String, u64>,
}

/// Per device, the steps of the last `WINDOW_NS`.
#[derive(Default)]
pub(super) struct Window {
    devices: HashMap<String, VecDeque<Step>>,
    written_ns: Option<u64>,
    /// The last write failed (said once until one succeeds).
    failing: bool,
}

impl Window {
    /// Adds a step of device `uuid` at `now_ns`: `cover_ns` of the device's time, `busy` of it
    /// each slice's.
    pub(super) fn add(
        &mut self,
        uuid: &str,
        now_ns: u64,
        cover_ns: u64,
        busy: BTreeMap<String, u64>,
    ) {
        let steps = self.devices.entry(uuid.to_string()).or_default();
        steps.push_back(Step {
            at_ns: now_ns,
            cover_ns,
            busy,
        });
        while steps
            .front()
            .is_some_and(|s| now_ns.saturating_sub(s.at_ns) > WINDOW_NS)
        {
            steps.pop_front();
        }
    }

    /// The figures now: per device with samples in the window, every slice with a place on
    /// the board, with its share of the device's time the samples cover (ppm).
    fn figures(&self, now_ns: u64, places: &[(&str, u64)]) -> Seen {
        let mut out = Seen::default();
        for (uuid, steps) in &self.devices {
            let recent = steps
                .iter()
                .filter(|s| now_ns.saturating_sub(s.at_ns) <= WINDOW_NS);
            let cover: u64 = recent.clone().map(|s| s.cover_ns).sum();
            if cover == 0 {
                continue;
            }
            let out_places = out.devices.entry(uuid.clone()).or_default();
            for &(id, place) in places {
                let busy: u64 = recent.clone().filter_map(|step| step.busy.get(id)).sum();
                let ppm = (busy as u128 * FULL as u128 / cover as u128).min(FULL as u128);
                out_places.insert(place, ppm as u32);
            }
        }
        out
    }

    /// Publishes the figures in `dir` if `EVERY_NS` passed since the last time.
    pub(super) fn publish(
        &mut self,
        dir: &Path,
        now_ns: u64,
        slices: &BTreeMap<String, Arc<Slice>>,
    ) {
        if self
            .written_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < EVERY_NS)
        {
            return;
        }
        self.written_ns = Some(now_ns);
        let places: Vec<(&str, u64)> = slices
            .iter()
            .filter_map(|(id, s)| Some((id.as_str(), s.place?)))
            .collect();
        match seen::write(dir, &self.figures(now_ns, &places)) {
            Ok(()) => self.failing = false,
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    log(&format!(
                        "cannot write {}: {e}; the slices' processes count each other's \
                         claims on the compute board unchecked until it is written",
                        dir.join(seen::FILE).display()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn each_slice_gets_its_part_of_the_time_the_samples_cover() {
        let mut w = Window::default();
        let uuid = "GPU-1";
        // Ten stamps of 100 ms: seven name slice a, three name b, none name c.
        for i in 0..10u64 {
            let who = if i < 7 { "a" } else { "b" };
            w.add(
                uuid,
                i * 100 * MS,
                100 * MS,
                BTreeMap::from([(who.to_string(), 100 * MS)]),
            );
        }
        let places = [("a", 1), ("b", 2), ("c", 3)];
        let seen = w.figures(1_000 * MS, &places);
        assert_eq!(seen.used(uuid, 1), Some(700_000));
        assert_eq!(seen.used(uuid, 2), Some(300_000));
        assert_eq!(
            seen.used(uuid, 3),
            Some(0),
            "a slice the driver never named"
        );
        assert_eq!(seen.used("GPU-2", 1), None, "a device without samples");
        // Past the window, steps are forgotten; a device with nothing left is not listed.
        w.add(uuid, 10_000 * MS, 0, BTreeMap::new());
        assert!(!w.figures(10_000 * MS, &places).covers(uuid));
    }
}
