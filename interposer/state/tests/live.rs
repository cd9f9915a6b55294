//! The node's changes to a running slice (`cuslice set`) as the slice's processes see them:
//! through the ledger (the cap, the core request and limit) and the device's node region (the
//! slice's claim, checked against the other slices' requests).

use cuslice_policy::share::FULL;
use cuslice_state::ledger::{Ledger, LiveChange};
use cuslice_state::region::{self, Region};

const GIB: u64 = 1 << 30;
const UUID: [u8; 16] = [7; 16];

#[test]
fn a_cap_set_live_is_the_slices_cap_and_wins_over_a_joiners_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open_dir(dir.path()).unwrap();
    let me = l.register().unwrap();
    let (d, cap) = l.device(UUID, Some(GIB)).unwrap();
    assert_eq!(cap, Some(GIB));
    l.reserve(me, d, GIB / 2).unwrap();
    let path = dir.path().join("ledger");
    let change = LiveChange {
        memory: Some(GIB / 4),
        core: Some((FULL / 10, FULL / 2)),
        priority: Some(2),
    };
    Ledger::set_live(&path, &UUID, &change).unwrap();
    // Below what the slice holds: refused, nothing released.
    assert!(l.reserve(me, d, 1).is_err());
    assert_eq!((l.limit(d), l.used(d)), (Some(GIB / 4), GIB / 2));
    assert_eq!(l.live_core(d), Some((FULL / 10, FULL / 2)));
    // The priority set live wins over what a process's configuration records.
    assert_eq!(l.live_priority(d), Some(2));
    l.set_priority(d, 0);
    assert_eq!(l.live_priority(d), Some(2));
    // A process joining with the old configuration gets the slice's cap, no conflict.
    let other = Ledger::open_dir(dir.path()).unwrap();
    assert_eq!(other.device(UUID, Some(GIB)).unwrap().1, Some(GIB / 4));
    let snap = Ledger::read(&path).unwrap();
    assert_eq!(snap.devices[0].limit, Some(GIB / 4));
    assert_eq!(snap.devices[0].core_limit, FULL / 2);
    assert_eq!(snap.devices[0].priority, 2);
    // A device the slice has not used: nothing to change.
    assert!(Ledger::set_live(&path, &[9; 16], &change).is_err());
}

/// (The node's check against other slices' requests, `region::set_claim`, counts the slots of
/// other live processes only; it is tested with real processes in install/tests/set.rs.)
#[test]
fn a_meter_makes_its_claim_the_ledgers_and_a_device_without_a_region_has_nothing_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let uuid = "GPU-07070707-0707-0707-0707-070707070707";
    let b = Region::join(dir.path(), uuid, 2, FULL * 3 / 10, FULL).unwrap();
    b.claim(FULL / 5, FULL / 4);
    let mine = &b.slices(0)[0];
    assert_eq!(
        (mine.demand.request, mine.demand.limit),
        (FULL / 5, FULL / 4)
    );
    let none = tempfile::tempdir().unwrap();
    region::set_claim(none.path(), uuid, 2, FULL, FULL, true).unwrap();
    assert!(!none.path().join(uuid).exists());
}
