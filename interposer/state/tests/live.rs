//! The node's changes to a running slice (`cuslice set`) as the slice's processes see them:
//! through the ledger (the cap, the core request and limit), and the node's check of a new
//! request against the other slices' on the compute board.

use cuslice_policy::grant::{Grant, Origin};
use cuslice_policy::priority::Priority;
use cuslice_policy::share::FULL;
use cuslice_state::board::{self, Board, Maker};
use cuslice_state::ledger::{Ledger, LiveChange};

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

/// `cuslice set` checks a new request against what the other slices on the device request,
/// each bounded by its grant; a node without a board has nothing to check.
#[test]
fn the_nodes_check_counts_the_other_slices_requests_as_granted() {
    let node = tempfile::tempdir().unwrap();
    let grant = |request| Grant {
        request,
        limit: FULL,
        priority: Priority::Normal,
        memory: None,
        freezes: false,
        origin: Origin::Standalone,
    };
    let a = Board::open(node.path(), 1, Maker::Standalone(grant(FULL / 5))).unwrap();
    let b = Board::open(node.path(), 2, Maker::Standalone(grant(FULL / 2))).unwrap();
    a.claim(0, &UUID, FULL / 5, FULL, Priority::Normal).unwrap();
    b.claim(0, &UUID, FULL / 2, FULL, Priority::Normal).unwrap();
    assert_eq!(board::requested(node.path(), &UUID, 1), FULL / 2);
    assert_eq!(board::requested(node.path(), &UUID, 2), FULL / 5);
    assert_eq!(board::requested(node.path(), &UUID, 3), FULL / 5 + FULL / 2);
    assert_eq!(board::requested(node.path(), &[9; 16], 3), 0);
    let none = tempfile::tempdir().unwrap();
    assert_eq!(board::requested(&none.path().join("none"), &UUID, 1), 0);
}
