//! The previous format as the node's tools see it. The files here are laid out by version 6's
//! structs; the mixed-version test (tests/upgrade) runs the previous release's own library.

use super::*;
use crate::ledger::{Ledger, ReadOnly};

const UUID: [u8; 16] = [7; 16];
const MIB: u64 = 1 << 20;

/// A version-6 ledger as a slice of the previous release leaves it: one device with a 512 MiB
/// cap, 100 MiB held by process slot 0 (pid 7), a core request of 20% and limit of 50%.
fn v6_file(dir: &Path) -> std::path::PathBuf {
    let mut h = zeroed();
    h.magic = super::super::MAGIC;
    h.version = VERSION;
    h.header_size = size() as u32;
    h.file_size = size() as u64;
    h.max_devices = MAX_DEVICES as u32;
    h.max_procs = MAX_PROCS as u32;
    h.procs_used.store(1, Ordering::Relaxed);
    h.slice_id = 42;
    let (a, b) = uuid_words(&UUID);
    let d = &h.devices[0];
    d.uuid[0].store(a, Ordering::Relaxed);
    d.uuid[1].store(b, Ordering::Relaxed);
    d.limit.store(512 * MIB, Ordering::Relaxed);
    d.used.store(100 * MIB, Ordering::Relaxed);
    d.peak.store(200 * MIB, Ordering::Relaxed);
    d.refusals.store(3, Ordering::Relaxed);
    d.core_request.store(200_000, Ordering::Relaxed);
    d.core_limit.store(500_000, Ordering::Relaxed);
    d.share.store(500_000, Ordering::Relaxed);
    d.device_ns.store(9_000, Ordering::Relaxed);
    d.state.store(LIVE, Ordering::Relaxed);
    for d in h.devices[1..].iter() {
        d.limit.store(LIMIT_UNSET, Ordering::Relaxed);
    }
    let p = &h.procs[0];
    p.pid.store(7, Ordering::Relaxed);
    p.generation.store(1, Ordering::Relaxed);
    p.charged[0].store(100 * MIB, Ordering::Relaxed);
    p.state.store(LIVE, Ordering::Relaxed);
    let path = dir.join("ledger");
    std::fs::write(&path, bytes_of(&mut h)).unwrap();
    path
}

#[test]
fn a_previous_ledger_reads_with_its_own_figures_and_says_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = v6_file(dir.path());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 847_936);
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(snap.version, 6);
    assert_eq!(snap.slice_id, 42);
    let d = &snap.devices[0];
    assert_eq!(d.uuid, UUID);
    assert_eq!(
        (d.limit, d.used, d.peak),
        (Some(512 * MIB), 100 * MIB, 200 * MIB)
    );
    assert_eq!((d.refusals, d.device_ns), (3, 9_000));
    assert_eq!((d.request(), d.core_limit()), (Some(0.2), Some(0.5)));
    assert_eq!((d.spill_limit, d.spilled, d.waiting), (None, 0, 0));
    assert_eq!(snap.procs.len(), 1);
    assert_eq!(
        (snap.procs[0].pid, &snap.procs[0].charged[..]),
        (7, &[100 * MIB][..])
    );
    // Nobody holds the process's liveness lock: its process is gone.
    assert!(!snap.procs[0].alive);
    // The agent's reader, kept open across ticks, says the same.
    let ro = ReadOnly::open(&path).unwrap();
    assert_eq!(ro.snapshot(), snap);
    assert_eq!(crate::ledger::version_of(&path), Some(6));
}

#[test]
fn set_and_host_pids_write_version_six_offsets_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = v6_file(dir.path());
    let before = std::fs::read(&path).unwrap();
    let change = LiveChange {
        memory: Some(256 * MIB),
        core: Some((100_000, 300_000)),
        priority: Some(2),
    };
    Ledger::set_live(&path, &UUID, &change).unwrap();
    Ledger::tell_host_pids(&path, &|p| (p == 7).then_some(4242)).unwrap();
    let after = std::fs::read(&path).unwrap();
    assert_eq!(after.len(), before.len());
    // Read back through version 6's own layout, independently of the reader.
    let mut h = zeroed();
    bytes_of(&mut h).copy_from_slice(&after);
    let d = &h.devices[0];
    assert_eq!(d.limit.load(Ordering::Relaxed), 256 * MIB);
    assert_eq!(d.core_request.load(Ordering::Relaxed), 100_000);
    assert_eq!(d.core_limit.load(Ordering::Relaxed), 300_000);
    assert_eq!(d.priority.load(Ordering::Relaxed), 2);
    assert_eq!(
        d.live.load(Ordering::Relaxed),
        LIVE_MEMORY | LIVE_CORE | LIVE_PRIORITY
    );
    assert_eq!(h.procs[0].host_pid.load(Ordering::Relaxed), 4242);
    // Those are the only bytes that changed: 4 words of the device, the live bits, a host pid.
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(changed <= 8 + 4 * 4 + 4, "{changed} bytes changed");
    // What the tools show follows.
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(snap.devices[0].limit, Some(256 * MIB));
    assert_eq!(snap.procs[0].host_pid, Some(4242));
    // A device the slice has not used: nothing to change.
    assert!(Ledger::set_live(&path, &[9; 16], &change).is_err());
}

#[test]
fn the_library_joins_only_its_own_version_and_the_tools_refuse_others_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = v6_file(dir.path());
    // A library of this release does not join a previous slice.
    let err = Ledger::open_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("version 6"), "{err}");
    // A version no tool of this release knows (a later release's, or an older one).
    for found in [5u32, 8] {
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&found.to_ne_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = Ledger::read(&path).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(
            err.contains(&format!("version {found}"))
                && err.contains("use the cuslice release that started the slice"),
            "{err}"
        );
        let change = LiveChange {
            memory: Some(MIB),
            ..Default::default()
        };
        assert!(Ledger::set_live(&path, &UUID, &change).is_err());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "a refusal wrote nothing"
        );
    }
}

#[test]
fn a_previous_ledger_cut_short_is_damaged_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let path = v6_file(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(size() as u64 - 4096).unwrap();
    let err = Ledger::read(&path).unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
}
