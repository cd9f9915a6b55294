//! The previous format (version 7) as the node's tools see it. Its files here are made from
//! this version's by the difference between the two (a process record without its last word,
//! `frozen_ns`); the mixed-version test (tests/upgrade) runs the previous release's own library.

use super::*;

const UUID: [u8; 16] = [7; 16];
const MIB: u64 = 1 << 20;

/// A version-7 ledger as a slice of the previous release leaves it: one device with a 512 MiB
/// cap, 100 MiB held by process slot 0 and 50 MiB by slot 1 (both gone), a core request of 20%
/// and a limit of 50%.
fn previous_file(dir: &Path) -> PathBuf {
    let made = tempfile::tempdir().unwrap();
    {
        let l = Ledger::open_dir(made.path()).unwrap();
        let a = l.register().unwrap();
        let (d, _) = l.device(UUID, Some(512 * MIB)).unwrap();
        l.reserve(a, d, 100 * MIB).unwrap();
        let b = Ledger::open_dir(made.path()).unwrap();
        let bs = b.register().unwrap();
        b.reserve(bs, d, 50 * MIB).unwrap();
        l.set_core(d, 200_000, 500_000);
    }
    let current = std::fs::read(made.path().join(FILE_NAME)).unwrap();
    let table = std::mem::offset_of!(Header, procs);
    let size = file_size_of(PREVIOUS).unwrap() as usize;
    let mut bytes = vec![0u8; size];
    bytes[..table].copy_from_slice(&current[..table]);
    for s in 0..2 {
        let (from, to) = (proc_field_at(VERSION, s, 0), proc_field_at(PREVIOUS, s, 0));
        bytes[to..to + PREVIOUS_PROC_SIZE]
            .copy_from_slice(&current[from..from + PREVIOUS_PROC_SIZE]);
    }
    bytes[8..12].copy_from_slice(&PREVIOUS.to_ne_bytes());
    bytes[12..16].copy_from_slice(&(size as u32).to_ne_bytes());
    bytes[16..24].copy_from_slice(&(size as u64).to_ne_bytes());
    let path = dir.join(FILE_NAME);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_previous_ledger_reads_with_its_own_figures_and_says_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = previous_file(dir.path());
    // 1024 process records of 1304 bytes after the header and the device records.
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        file_size() - 1024 * 8
    );
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(snap.version, 7);
    let d = &snap.devices[0];
    assert_eq!(d.uuid, UUID);
    assert_eq!((d.limit, d.used, d.frozen), (Some(512 * MIB), 150 * MIB, 0));
    assert_eq!((d.request(), d.core_limit()), (Some(0.2), Some(0.5)));
    let procs: Vec<(&[u64], Option<u64>)> = snap
        .procs
        .iter()
        .map(|p| (&p.charged[..], p.frozen_ns))
        .collect();
    assert_eq!(procs, [(&[100 * MIB][..], None), (&[50 * MIB][..], None)]);
    // Nobody holds the processes' liveness locks: they are gone.
    assert!(snap.procs.iter().all(|p| !p.alive));
    // The agent's reader, kept open across ticks, says the same.
    let ro = ReadOnly::open(&path).unwrap();
    assert_eq!(ro.snapshot(), snap);
    assert_eq!(version_of(&path), Some(7));
}

#[test]
fn set_and_host_pids_write_version_seven_offsets_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = previous_file(dir.path());
    let before = std::fs::read(&path).unwrap();
    let pids: Vec<i32> = Ledger::read(&path)
        .unwrap()
        .procs
        .iter()
        .map(|p| p.pid)
        .collect();
    let change = LiveChange {
        memory: Some(256 * MIB),
        core: Some((100_000, 300_000)),
        priority: Some(2),
    };
    Ledger::set_live(&path, &UUID, &change).unwrap();
    // Both processes of the test are this one: the second slot is the one a stride of this
    // version's records would miss.
    Ledger::tell_host_pids(&path, &|p| (p == pids[1]).then_some(4242)).unwrap();
    let after = std::fs::read(&path).unwrap();
    assert_eq!(after.len(), before.len());
    // The host pids, read at version 7's offsets, independently of the reader.
    let word = |at: usize| i32::from_ne_bytes(after[at..at + 4].try_into().unwrap());
    let host = std::mem::offset_of!(ProcRec, host_pid);
    assert_eq!(word(proc_field_at(PREVIOUS, 0, host)), 4242);
    assert_eq!(word(proc_field_at(PREVIOUS, 1, host)), 4242);
    // Those are the only bytes that changed: 4 words of the device, the live bits, two host pids.
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(changed <= 8 + 4 * 4 + 2 * 4, "{changed} bytes changed");
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(snap.devices[0].limit, Some(256 * MIB));
    assert_eq!(snap.devices[0].priority, 2);
    assert!(snap.procs.iter().all(|p| p.host_pid == Some(4242)));
    assert!(Ledger::set_live(&path, &[9; 16], &change).is_err());
}

#[test]
fn the_library_joins_only_its_own_version_and_the_tools_refuse_others_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = previous_file(dir.path());
    let err = Ledger::open_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("version 7"), "{err}");
    for found in [6u32, 9] {
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
    let path = previous_file(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(file_size_of(PREVIOUS).unwrap() - 4096).unwrap();
    let err = Ledger::read(&path).unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
}

/// A frozen process's charges are its slice's frozen bytes on each device, and stay charged
/// against the cap; back on the device, they are not.
#[test]
fn frozen_processes_charges_are_shown_apart_and_still_count_against_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open_dir(dir.path()).unwrap();
    let a = l.register().unwrap();
    let (d, _) = l.device(UUID, Some(512 * MIB)).unwrap();
    l.reserve(a, d, 300 * MIB).unwrap();
    let other = Ledger::open_dir(dir.path()).unwrap();
    let b = other.register().unwrap();
    other.reserve(b, d, 100 * MIB).unwrap();
    l.set_frozen(a, 12_345);
    let snap = Ledger::read(&dir.path().join(FILE_NAME)).unwrap();
    assert_eq!(
        (snap.devices[0].used, snap.devices[0].frozen),
        (400 * MIB, 300 * MIB)
    );
    assert_eq!(snap.procs[a as usize].frozen_ns, Some(12_345));
    assert_eq!(snap.procs[b as usize].frozen_ns, None);
    assert!(
        other.reserve(b, d, 200 * MIB).is_err(),
        "the frozen bytes still count"
    );
    l.set_frozen(a, 0);
    let snap = l.snapshot();
    assert_eq!(
        (snap.devices[0].used, snap.devices[0].frozen),
        (400 * MIB, 0)
    );
    // A process that takes the slot afresh is not frozen.
    drop(l);
    let again = Ledger::open_dir(dir.path()).unwrap();
    let c = again.register().unwrap();
    again.set_frozen(c, 1);
    drop(again);
    let fresh = Ledger::open_dir(dir.path()).unwrap();
    let s = fresh.register().unwrap();
    assert_eq!(fresh.snapshot().procs[s as usize].frozen_ns, None);
}
