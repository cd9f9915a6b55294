//! A ledger of this release under the previous release's agent, which cuts a ledger larger than
//! its own format back to its size (docs/upgrades.md, downgrade): the slice keeps working, a new
//! process still joins it, and the node's tools still read it.

use cuslice_state::ledger::{self, Ledger};

const UUID: [u8; 16] = [7; 16];
const MIB: u64 = 1 << 20;

#[test]
fn a_ledger_cut_to_the_previous_formats_size_still_joins_and_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(ledger::FILE_NAME);
    let a = Ledger::open_dir(dir.path()).unwrap();
    let me = a.register().unwrap();
    let (d, _) = a.device(UUID, Some(512 * MIB)).unwrap();
    a.reserve(me, d, 100 * MIB).unwrap();
    let previous = ledger::file_size_of(ledger::PREVIOUS).unwrap();
    assert!(previous < ledger::file_size());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(previous)
        .unwrap();
    // The node's tools read it as it was.
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(
        (snap.version, snap.devices[0].used),
        (ledger::VERSION, 100 * MIB)
    );
    // A new process joins it (growing it back) and shares the cap with the first.
    let b = Ledger::open_dir(dir.path()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), ledger::file_size());
    let other = b.register().unwrap();
    let (db, cap) = b.device(UUID, None).unwrap();
    assert_eq!(cap, Some(512 * MIB));
    b.reserve(other, db, 400 * MIB).unwrap();
    assert!(b.reserve(other, db, 13 * MIB).is_err(), "past the cap");
    assert_eq!(Ledger::read(&path).unwrap().devices[0].used, 500 * MIB);
}

#[test]
fn a_ledger_cut_into_its_process_slots_is_still_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(ledger::FILE_NAME);
    let a = Ledger::open_dir(dir.path()).unwrap();
    a.register().unwrap();
    drop(a);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(64 * 1024)
        .unwrap();
    let err = Ledger::open_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("damaged"), "{err}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        64 * 1024,
        "left alone"
    );
}
