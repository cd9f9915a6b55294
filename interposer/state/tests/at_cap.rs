//! The ledger at the cap: the queue of allocations waiting for the slice's frees (first come,
//! first served; a dead waiter holds nobody up; a free wakes the sleepers) and the spill
//! charged apart from device memory. Each `Ledger` opened on the same directory stands for a
//! process of the slice (each holds its own liveness lock).

use std::time::{Duration, Instant};

use cuslice_state::ledger::Ledger;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const UUID: [u8; 16] = [3; 16];

fn join(dir: &std::path::Path) -> (Ledger, u32, u32) {
    let l = Ledger::open_dir(dir).unwrap();
    let me = l.register().unwrap();
    let (d, _) = l.device(UUID, Some(GIB)).unwrap();
    (l, me, d)
}

#[test]
fn waiters_are_served_in_the_order_they_came() {
    let dir = tempfile::tempdir().unwrap();
    let (a, am, d) = join(dir.path());
    let (b, bm, _) = join(dir.path());
    let (c, cm, _) = join(dir.path());
    a.reserve(am, d, 900 * MIB).unwrap();
    let tb = b.wait_enter(d).unwrap();
    let tc = c.wait_enter(d).unwrap();
    assert!(a.queued(d));
    // C's 100 MiB fits, but B came first.
    assert!(c.wait_try(cm, d, 100 * MIB, tc).is_err());
    assert!(b.wait_try(bm, d, 200 * MIB, tb).is_err());
    a.release(am, d, 900 * MIB);
    b.wait_try(bm, d, 200 * MIB, tb).unwrap();
    c.wait_try(cm, d, 100 * MIB, tc).unwrap();
    assert!(!a.queued(d));
    assert_eq!(a.used(d), 300 * MIB);
    assert_eq!(
        Ledger::read(&dir.path().join("ledger")).unwrap().devices[0].waiting,
        0
    );
}

#[test]
fn a_dead_waiter_holds_nobody_up_and_one_out_of_time_leaves_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (a, am, d) = join(dir.path());
    a.reserve(am, d, GIB).unwrap();
    let (b, _, _) = join(dir.path());
    b.wait_enter(d).unwrap();
    // B dies waiting (its file, and with it its liveness lock, goes).
    drop(b);
    let (c, cm, _) = join(dir.path());
    let tc = c.wait_enter(d).unwrap();
    a.release(am, d, GIB);
    c.wait_try(cm, d, GIB, tc).unwrap();
    assert!(!a.queued(d));
    // One that gives up leaves the queue.
    let (e, _, _) = join(dir.path());
    let te = e.wait_enter(d).unwrap();
    assert!(a.queued(d));
    e.wait_leave(d, te);
    assert!(!a.queued(d));
}

#[test]
fn a_free_wakes_a_sleeping_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (a, am, d) = join(dir.path());
    a.reserve(am, d, GIB).unwrap();
    let path = dir.path().to_path_buf();
    let waiter = std::thread::spawn(move || {
        let (b, bm, d) = join(&path);
        let t = b.wait_enter(d).unwrap();
        let start = Instant::now();
        loop {
            match b.wait_try(bm, d, GIB / 2, t) {
                Ok(()) => return start.elapsed(),
                Err(seq) => b.wait_sleep(d, seq, Duration::from_secs(20)),
            }
        }
    });
    while !a.queued(d) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    a.release(am, d, GIB / 2);
    let took = waiter.join().unwrap();
    // Woken by the free: not at the end of its 20 s sleep.
    assert!(took < Duration::from_secs(5), "woken after {took:?}");
}

#[test]
fn spill_is_charged_apart_up_to_its_limit_and_a_dead_processs_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (a, am, d) = join(dir.path());
    assert_eq!(a.set_spill_limit(d, GIB), GIB);
    // A later process's own figure does not change the slice's.
    let (b, bm, _) = join(dir.path());
    assert_eq!(b.set_spill_limit(d, 4 * GIB), GIB);
    a.reserve(am, d, GIB).unwrap();
    a.reserve_spill(am, d, 600 * MIB).unwrap();
    assert!(b.reserve_spill(bm, d, 500 * MIB).is_err());
    b.reserve_spill(bm, d, 424 * MIB).unwrap();
    assert_eq!((a.used(d), a.spilled(d)), (GIB, GIB));
    let snap = Ledger::read(&dir.path().join("ledger")).unwrap();
    assert_eq!(snap.devices[0].spilled, GIB);
    assert_eq!(snap.devices[0].spill_limit, Some(GIB));
    assert_eq!(snap.procs[1].spilled, vec![424 * MIB]);
    // B dies: its host memory went with it, at once.
    drop(b);
    a.sweep(am, &|_, _| false);
    assert_eq!(a.spilled(d), 600 * MIB);
    a.release_spill(am, d, 600 * MIB);
    assert_eq!(a.spilled(d), 0);
}
