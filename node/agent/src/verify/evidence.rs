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
    /// What the file holds, as last written: the same figures again only mark it fresh.
    written: Option<Seen>,
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

    /// Publishes the figures in `dir` if `EVERY_NS` passed since the last time: written, or
    /// where they are what the file already holds, the file only marked fresh (a rewrite is a
    /// new file and a rename, which a disk file system pays for).
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
        let places: Vec<(&str, u64)> = slices
            .iter()
            .filter_map(|(id, s)| Some((id.as_str(), s.place?)))
            .collect();
        self.publish_places(dir, now_ns, &places);
    }

    /// Publishes the figures of the slices at `places` in `dir` now.
    fn publish_places(&mut self, dir: &Path, now_ns: u64, places: &[(&str, u64)]) {
        self.written_ns = Some(now_ns);
        let figures = self.figures(now_ns, places);
        if self.written.as_ref() == Some(&figures) && seen::touch(dir).is_ok() {
            return;
        }
        self.written = None;
        match seen::write(dir, &figures) {
            Ok(()) => {
                self.failing = false;
                self.written = Some(figures);
            }
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

    #[test]
    fn the_same_figures_again_leave_the_file_and_keep_it_fresh() {
        use std::os::unix::fs::MetadataExt;
        use std::time::{Duration, SystemTime};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(seen::FILE);
        let (uuid, places) = ("GPU-1", [("a", 1)]);
        let mut w = Window::default();
        w.add(
            uuid,
            0,
            100 * MS,
            BTreeMap::from([("a".to_string(), 40 * MS)]),
        );
        w.publish_places(dir.path(), 100 * MS, &places);
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(written.contains("0000000000000001 400000"), "{written}");
        let ino = std::fs::metadata(&path).unwrap().ino();
        // Made to look old: the next publish with the same figures marks it fresh, in place.
        let old = SystemTime::now() - Duration::from_secs(10);
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(old).unwrap();
        w.publish_places(dir.path(), 600 * MS, &places);
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.ino(), ino);
        assert!(m.modified().unwrap() > old + Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written);
        // Other figures are written (a new file).
        w.add(uuid, 700 * MS, 100 * MS, BTreeMap::new());
        w.publish_places(dir.path(), 1_100 * MS, &places);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("0000000000000001 200000")
        );
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), ino);
        // Taken away meanwhile: written again, the figures unchanged.
        std::fs::remove_file(&path).unwrap();
        w.publish_places(dir.path(), 1_600 * MS, &places);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("0000000000000001 200000")
        );
    }
}
