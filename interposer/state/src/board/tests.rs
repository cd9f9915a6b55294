use super::*;
use cuslice_policy::grant::Origin;

const UUID: [u8; 16] = [7; 16];

fn grant(request: u32, limit: u32, priority: Priority) -> Grant {
    Grant {
        request,
        limit,
        priority,
        memory: None,
        freezes: false,
        origin: Origin::Standalone,
    }
}

fn standalone(node: &Path, slice: u64, g: Grant) -> Board {
    Board::open(node, slice, Maker::Standalone(g)).unwrap()
}

fn post(b: &Board, request: u32, limit: u32, priority: Priority, usage: u32) {
    let now = now_ns();
    b.post(
        0,
        &UUID,
        &Post {
            request,
            limit,
            priority,
            usage,
            hungry_until: now + 1_000_000_000,
            active_ns: now,
        },
        now,
    );
}

#[test]
fn a_slice_sees_the_others_bounded_by_their_grants() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(0, FULL, Priority::Normal));
    let b = standalone(node.path(), 2, grant(300_000, 500_000, Priority::Normal));
    a.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    b.claim(0, &UUID, 300_000, 500_000, Priority::Normal)
        .unwrap();
    post(&a, 0, FULL, Priority::Normal, 100_000);
    // B says more than it was granted: the whole device, high priority.
    post(&b, FULL, FULL, Priority::High, 2 * FULL);
    let now = now_ns();
    let views = a.views(0, &UUID, now, now - 1_000_000_000);
    assert_eq!(views.len(), 2);
    assert_eq!(views[0].slice, 1);
    assert_eq!(views[0].demand.usage, 100_000);
    let v = views[1];
    assert_eq!(v.slice, 2);
    assert_eq!((v.demand.request, v.demand.limit), (300_000, 500_000));
    assert_eq!(v.priority, Priority::Normal);
    assert_eq!(v.demand.usage, FULL);
    assert!(v.demand.hungry);
}

#[test]
fn requests_past_the_device_are_refused_and_a_stale_claim_frees_its_request() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(600_000, FULL, Priority::Normal));
    let b = standalone(node.path(), 2, grant(600_000, FULL, Priority::Normal));
    a.claim(0, &UUID, 600_000, FULL, Priority::Normal).unwrap();
    let e = b
        .claim(0, &UUID, 500_000, FULL, Priority::Normal)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has 60% requested by other slices"), "{e}");
    assert!(e.contains("ask for at most 40%"), "{e}");
    b.claim(0, &UUID, 400_000, FULL, Priority::Normal).unwrap();
    // A process of A joining later finds the claim held.
    let a2 = Board::open(node.path(), 1, Maker::Hooked).unwrap();
    a2.claim(0, &UUID, 600_000, FULL, Priority::Normal).unwrap();
    // A's processes die: once its claim is stale, its request counts no more.
    a.entry(0)
        .unwrap()
        .beat_ns
        .store(now_ns() - STALE_NS - 1, Ordering::Relaxed);
    let c = standalone(node.path(), 3, grant(FULL, FULL, Priority::Normal));
    c.claim(0, &UUID, 600_000, FULL, Priority::Normal).unwrap();
}

#[test]
fn slices_posting_at_once_never_both_take_more_than_the_device() {
    for round in 0..20 {
        let node = tempfile::tempdir().unwrap();
        let boards: Vec<Board> = (1..=4)
            .map(|s| standalone(node.path(), s, grant(FULL, FULL, Priority::Normal)))
            .collect();
        let barrier = std::sync::Barrier::new(boards.len());
        let admitted: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = boards
                .iter()
                .map(|b| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        u32::from(b.claim(0, &UUID, 400_000, FULL, Priority::Normal).is_ok())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        // 40% each: two fit, a third would not. Never more than two; and contention is
        // resolved, not turned into refusals for all.
        assert_eq!(admitted, 2, "round {round}");
    }
}

#[test]
fn what_a_slice_does_to_its_own_file_harms_nobody_else() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(500_000, FULL, Priority::Normal));
    let b = standalone(node.path(), 2, grant(0, FULL, Priority::Normal));
    a.claim(0, &UUID, 500_000, FULL, Priority::Normal).unwrap();
    post(&b, 0, FULL, Priority::Normal, 0);
    let claims = slice_dir(node.path(), 2).join(CLAIMS);
    // Truncated: B's own mapping would fault, A's reading does not.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&claims)
        .unwrap()
        .set_len(0)
        .unwrap();
    let now = now_ns();
    let views = a.views(0, &UUID, now, 0);
    assert_eq!(views.len(), 1);
    // Grown past any size, with garbage: read up to its size, found not valid.
    std::fs::write(&claims, vec![0xffu8; 3 * SIZE]).unwrap();
    assert_eq!(a.views(0, &UUID, now, 0).len(), 1);
    // Replaced by a FIFO: passed over without waiting.
    std::fs::remove_file(&claims).unwrap();
    let c = std::ffi::CString::new(claims.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    a.others.lock().clear();
    assert_eq!(a.views(0, &UUID, now, 0).len(), 1);
    // A grant replaced by garbage is the least: no request.
    std::fs::write(slice_dir(node.path(), 2).join(GRANT), b"request x\0").unwrap();
    assert_eq!(
        read_grant(&slice_dir(node.path(), 2).join(GRANT)).request,
        0
    );
}

#[test]
fn turns_are_read_from_every_slice_on_the_device_with_the_priority_granted() {
    use cuslice_policy::turn::{Rival, Turn};
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(0, FULL, Priority::Normal));
    let hi = standalone(node.path(), 2, grant(0, FULL, Priority::High));
    let liar = standalone(node.path(), 3, grant(0, FULL, Priority::Normal));
    let idle = standalone(node.path(), 4, grant(0, FULL, Priority::Normal));
    for b in [&a, &hi, &liar, &idle] {
        b.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    }
    post(&hi, 0, FULL, Priority::High, FULL);
    // Says high priority, was not granted it.
    post(&liar, 0, FULL, Priority::High, FULL);
    let now = now_ns();
    hi.post_turn(0, Turn::Waiting { since: now - 5 });
    liar.post_turn(
        0,
        Turn::Holding {
            since: now - 10,
            until: now + 1_000,
        },
    );
    // Before any view, nothing is known of the others.
    assert!(a.rivals(0, &UUID).is_empty());
    // Slices that launched nothing lately are not in the allotment, but their turns are read.
    assert_eq!(a.views(0, &UUID, now, now - 1_000_000_000).len(), 3);
    let mut r = a.rivals(0, &UUID);
    r.sort_by_key(|r| r.slice);
    assert_eq!(
        r,
        vec![
            Rival {
                slice: 2,
                turn: Turn::Waiting { since: now - 5 },
                priority: Priority::High
            },
            Rival {
                slice: 3,
                turn: Turn::Holding {
                    since: now - 10,
                    until: now + 1_000
                },
                priority: Priority::Normal
            },
            Rival {
                slice: 4,
                turn: Turn::Idle,
                priority: Priority::Normal
            },
        ]
    );
    // Read afresh at every call: the holder passes it on.
    liar.post_turn(0, Turn::Idle);
    assert!(
        a.rivals(0, &UUID)
            .iter()
            .all(|r| !matches!(r.turn, Turn::Holding { .. }))
    );
    // Of the slice's processes, one takes the turn.
    let a2 = Board::open(node.path(), 1, Maker::Hooked).unwrap();
    let held = Turn::Holding {
        since: now,
        until: now + 5,
    };
    assert!(a.swap_turn(0, Turn::IDLE, held));
    assert!(!a2.swap_turn(0, Turn::IDLE, held));
    assert_eq!(a2.turn(0), held);
}

#[test]
fn a_standalone_slice_leaves_and_its_leftovers_are_swept() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(0, FULL, Priority::Normal));
    assert!(a.dir().join(CLAIMS).is_file());
    a.leave();
    assert!(!a.dir().exists());
    let b = standalone(node.path(), 2, grant(0, FULL, Priority::Normal));
    post(&b, 0, FULL, Priority::Normal, 0);
    b.claims()
        .header
        .beat_ns
        .store(now_ns() - LEFTOVER_NS - 1, Ordering::Relaxed);
    // Its directory made long ago too (a place made in the last minute is never swept).
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::open(b.dir())
        .unwrap()
        .set_modified(old)
        .unwrap();
    // A container's place is never a standalone sweep's.
    let c = slice_dir(node.path(), 3);
    std::fs::create_dir(&c).unwrap();
    let hooked = Grant {
        origin: Origin::Hook {
            id: "c1".into(),
            root: "/run/cuslice".into(),
        },
        ..grant(0, FULL, Priority::Normal)
    };
    write_grant(&c.join(GRANT), &hooked, 0o644).unwrap();
    create_claims(&c.join(CLAIMS), 3, 0o666).unwrap();
    // One being made: an empty directory, no grant yet.
    let making = slice_dir(node.path(), 4);
    std::fs::create_dir(&making).unwrap();
    sweep(node.path(), None, &remove_place);
    assert!(!b.dir().exists());
    assert!(making.exists());
    assert!(c.exists());
    // The hook's sweep removes it once its container is gone.
    sweep(
        node.path(),
        Some((Path::new("/run/cuslice"), &|id| id != "c1")),
        &remove_place,
    );
    assert!(!c.exists());
}

#[test]
fn a_place_that_is_a_link_removes_nothing_where_it_points() {
    // An account puts a link to a directory of its choice on the board, as a leftover place
    // (no grant: a standalone one whose processes died long ago).
    let node = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    for name in [CLAIMS, GRANT, turns::FILE] {
        std::fs::write(target.path().join(name), "kept").unwrap();
    }
    let link = slice_dir(node.path(), 9);
    std::os::unix::fs::symlink(target.path(), &link).unwrap();
    remove_place(&link);
    sweep(node.path(), None, &remove_place);
    for name in [CLAIMS, GRANT, turns::FILE] {
        assert!(target.path().join(name).exists(), "{name} removed");
    }
}

#[test]
fn a_claim_written_several_times_counts_once_and_is_reported() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(200_000, FULL, Priority::Normal));
    // A posts its one granted request of 20% in five entries naming the same device.
    for d in 0..5 {
        a.claim(d, &UUID, 200_000, FULL, Priority::Normal).unwrap();
    }
    let claims = slice_dir(node.path(), 1).join(CLAIMS);
    let faults = faults(&claims, 1, &grant(200_000, FULL, Priority::Normal));
    assert_eq!(
        faults,
        vec![format!(
            "entries 1, 2, 3, 4 name device {} as entry 0 does: only entry 0 counts",
            crate::uuid_string(&UUID)
        )]
    );
    // Every reader counts it once: `cuslice set`'s sum, admission and the views.
    assert_eq!(requested(node.path(), &UUID, 0), 200_000);
    let b = standalone(node.path(), 2, grant(FULL, FULL, Priority::Normal));
    b.claim(0, &UUID, 800_000, FULL, Priority::Normal).unwrap();
    post(&a, 200_000, FULL, Priority::Normal, 100_000);
    let now = now_ns();
    let views = b.views(0, &UUID, now, 0);
    assert_eq!(views.iter().filter(|v| v.slice == 1).count(), 1);
    assert_eq!(b.rivals(0, &UUID).len(), 1);
}

#[test]
fn figures_past_the_grant_and_a_foreign_file_are_reported() {
    let node = tempfile::tempdir().unwrap();
    let g = grant(200_000, 500_000, Priority::Normal);
    let a = standalone(node.path(), 1, g.clone());
    a.claim(0, &UUID, 200_000, 500_000, Priority::Normal)
        .unwrap();
    let claims = slice_dir(node.path(), 1).join(CLAIMS);
    assert!(faults(&claims, 1, &g).is_empty());
    post(&a, 300_000, 2 * FULL, Priority::Normal, 0);
    assert_eq!(
        faults(&claims, 1, &g),
        vec![
            "entry 0 claims a core request of 30%, more than the 20% granted (counted as 20%)"
                .to_string(),
            format!(
                "entry 0 claims a core limit of {} ppm, more than the whole device ({FULL})",
                2 * FULL
            ),
        ]
    );
    let e = faults(&claims, 2, &g);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].contains("is not a claims file of version 1 for slice 0000000000000002"),
        "{e:?}"
    );
}

#[test]
fn a_want_of_memory_is_read_by_the_other_slices_on_the_board_only_while_it_holds() {
    let node = tempfile::tempdir().unwrap();
    let a = standalone(node.path(), 1, grant(0, FULL, Priority::Normal));
    let b = standalone(node.path(), 2, grant(0, FULL, Priority::Normal));
    let c = standalone(node.path(), 3, grant(0, FULL, Priority::Normal));
    let other = [9u8; 16];
    a.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    b.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    post(&a, 0, FULL, Priority::Normal, 0);
    post(&b, 0, FULL, Priority::Normal, 0);
    let now = now_ns();
    assert_eq!(b.memory_wanted(&UUID, now), 0);
    a.want_memory(&UUID, 3 << 30, now + 1_000_000_000);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 3 << 30);
    // Not on another device, and never the reader's own.
    assert_eq!(b.memory_wanted(&other, now_ns()), 0);
    assert_eq!(a.memory_wanted(&UUID, now_ns()), 0);
    // Over, withdrawn, or posted further ahead than a waiter posts it: nothing.
    a.want_memory(&UUID, 3 << 30, now_ns() - 1);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 0);
    a.want_memory(&UUID, 3 << 30, now_ns() + 10 * WANT_AHEAD_NS);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 0);
    a.want_memory(&UUID, 3 << 30, 0);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 0);
    // The most of several.
    a.want_memory(&UUID, 3 << 30, now_ns() + 1_000_000_000);
    c.want_memory(&UUID, 5 << 30, now_ns() + 1_000_000_000);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 5 << 30);
}

#[test]
fn a_want_counts_no_further_than_the_wanters_memory_cap() {
    let node = tempfile::tempdir().unwrap();
    let capped = Grant {
        memory: Some(2 << 30),
        ..grant(0, FULL, Priority::Normal)
    };
    let a = standalone(node.path(), 1, capped.clone());
    let b = standalone(node.path(), 2, grant(0, FULL, Priority::Normal));
    a.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    b.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    // A slice capped at 2 GiB that says it waits for everything is read as waiting for 2 GiB,
    // and the node agent's check of its claims names it.
    let claims = slice_dir(node.path(), 1).join(CLAIMS);
    a.want_memory(&UUID, 3 << 40, now_ns() + 1_000_000_000);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 2 << 30);
    assert_eq!(
        faults(&claims, 1, &capped),
        [
            "it says it waits for 3 TiB of device memory, more than its cap of 2 GiB (counted as 2 GiB)"
        ]
    );
    a.want_memory(&UUID, 1 << 30, now_ns() + 1_000_000_000);
    assert_eq!(b.memory_wanted(&UUID, now_ns()), 1 << 30);
    assert!(faults(&claims, 1, &capped).is_empty());
    // A slice without a cap is read as it says.
    b.want_memory(&UUID, 7 << 30, now_ns() + 1_000_000_000);
    assert_eq!(a.memory_wanted(&UUID, now_ns()), 7 << 30);
}

#[test]
fn thaws_and_allocations_see_each_others_room_until_it_lapses() {
    let node = tempfile::tempdir().unwrap();
    let freezing = Grant {
        freezes: true,
        ..grant(0, FULL, Priority::Normal)
    };
    let a = standalone(node.path(), 1, freezing);
    let b = standalone(node.path(), 2, grant(0, FULL, Priority::Normal));
    a.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    b.claim(0, &UUID, 0, FULL, Priority::Normal).unwrap();
    let now = now_ns();
    assert_eq!(a.rooms(0, &UUID, now, true), []);
    assert!(b.freezers_on(0, &UUID, now), "A may freeze");
    assert!(!a.freezers_on(0, &UUID, now), "B may not");
    // A thaw of 4 GiB in A, two allocations of 1 GiB in B (two processes).
    a.begin_room(0, true, 4 << 30, now + 10_000_000_000);
    b.begin_room(0, false, 1 << 30, now + 5_000_000_000);
    b.begin_room(0, false, 1 << 30, now + 5_000_000_000);
    let thaw = Room {
        slice: 1,
        thawing: 4 << 30,
        allocating: 0,
    };
    let allocs = Room {
        slice: 2,
        thawing: 0,
        allocating: 2 << 30,
    };
    assert_eq!(a.rooms(0, &UUID, now, true), [thaw, allocs]);
    assert_eq!(b.rooms(0, &UUID, now, true), [allocs, thaw]);
    // Another device's readers see none of it.
    assert_eq!(b.rooms(0, &[8; 16], now, true), []);
    // One allocation ends; then the other.
    b.end_room(0, false, 1 << 30);
    assert_eq!(a.rooms(0, &UUID, now, true)[1].allocating, 1 << 30);
    b.end_room(0, false, 1 << 30);
    b.end_room(0, false, 1 << 30);
    assert_eq!(
        a.rooms(0, &UUID, now, true),
        [thaw],
        "taken back, never below 0"
    );
    // A post counts until its time, and not from further ahead than ROOM_AHEAD_NS.
    assert_eq!(b.rooms(0, &UUID, now + 10_000_000_001, true), []);
    b.begin_room(0, false, 1 << 30, u64::MAX);
    a.end_room(0, true, 4 << 30);
    assert_eq!(
        a.rooms(0, &UUID, now, true),
        [],
        "{:?}",
        b.rooms(0, &UUID, now, true)
    );
    // A slice whose grant does not let it freeze has no thaw to count, whatever it posts.
    b.begin_room(0, true, 4 << 30, now + 5_000_000_000);
    assert_eq!(a.rooms(0, &UUID, now, true), []);
}
