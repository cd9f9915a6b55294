use super::*;
use std::sync::Arc;

const UUID: [u8; 16] = [7; 16];
const CHUNK: u64 = 4096;

/// A "process" of the slice in `dir`: its own open file description (liveness lock) and slot.
fn join(dir: &Path, cap: Option<u64>) -> (Ledger, u32, u32) {
    let l = Ledger::open_dir(dir).unwrap();
    let me = l.register().unwrap();
    let (d, _) = l.device(UUID, cap).unwrap();
    (l, me, d)
}

fn charged_sum(l: &Ledger, d: u32) -> u64 {
    (0..MAX_PROCS as u32).map(|s| l.charged(s, d)).sum()
}

#[test]
fn a_ledger_made_by_create_file_works_like_one_made_by_open_dir() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let made = tempfile::tempdir().unwrap();
    let path = made.path().join(FILE_NAME);
    Ledger::create_file(&path, 0o666).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size() as u64);
    // Whatever the umask, every user of the container may update it.
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    // The process table is a hole until processes take slots.
    assert!(
        meta.blocks() * 512 < size() as u64,
        "{} blocks",
        meta.blocks()
    );
    let formatted = tempfile::tempdir().unwrap();
    let other = Ledger::open_dir(formatted.path()).unwrap();
    let fresh = |mut s: Snapshot| {
        s.slice_id = 0;
        s
    };
    assert_eq!(fresh(Ledger::read(&path).unwrap()), fresh(other.snapshot()));
    // Processes of the slice share it: the locks, the cap and the accounts all work.
    let (a, me_a, d) = join(made.path(), Some(2 * CHUNK));
    let (b, me_b, _) = join(made.path(), Some(2 * CHUNK));
    a.reserve(me_a, d, CHUNK).unwrap();
    b.reserve(me_b, d, CHUNK).unwrap();
    assert!(b.reserve(me_b, d, 1).is_err());
    assert_eq!(Ledger::read(&path).unwrap().devices[0].used, 2 * CHUNK);
    // It is never made over an existing file.
    let err = Ledger::create_file(&path, 0o666).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(Ledger::read(&path).unwrap().devices[0].used, 2 * CHUNK);
}

#[test]
fn tokens_name_their_slot_and_generation() {
    for (slot, generation) in [(0, 1), (1023, 5), (17, GEN_MASK), (3, GEN_MASK + 2)] {
        let t = make_token(slot, generation);
        assert_eq!(token_owner(t), Some((slot, generation & GEN_MASK)));
    }
    assert_eq!(token_owner(UNKNOWN_OWNER), None);
    assert_eq!(token_owner(0), None);
}

#[test]
fn racing_processes_fill_the_cap_exactly_and_give_it_all_back() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1000 * CHUNK;
    let procs: Vec<_> = (0..4)
        .map(|_| Arc::new(join(dir.path(), Some(cap))))
        .collect();
    // 4 processes x 4 threads reserve a chunk at a time until refused, all at once.
    let mut handles = Vec::new();
    for p in &procs {
        for _ in 0..4 {
            let p = Arc::clone(p);
            handles.push(std::thread::spawn(move || {
                let (l, me, d) = &*p;
                let mut got = 0u64;
                while l.reserve(*me, *d, CHUNK).is_ok() {
                    assert!(l.used(*d) <= cap, "the slice went over its cap");
                    got += 1;
                }
                got
            }));
        }
    }
    let got: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let (l, _, d) = &*procs[0];
    // Not a byte over, and no refusal while a chunk still fitted.
    assert_eq!(got.iter().sum::<u64>(), 1000, "{got:?}");
    assert_eq!(l.used(*d), cap);
    assert_eq!(charged_sum(l, *d), cap);
    // Everything given back from the same threads' processes, all at once.
    let mut handles = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        let mine: u64 = got[i * 4..i * 4 + 4].iter().sum();
        let p = Arc::clone(p);
        handles.push(std::thread::spawn(move || {
            let (l, me, d) = &*p;
            for _ in 0..mine {
                l.release(*me, *d, CHUNK);
            }
        }));
    }
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(l.used(*d), 0);
    assert_eq!(charged_sum(l, *d), 0);
}

#[test]
fn a_process_that_dies_holding_the_device_lock_does_not_block_the_slice() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 100 * CHUNK;
    let (mut dead, dead_me, d) = join(dir.path(), Some(cap));
    let (live, live_me, _) = join(dir.path(), None);
    dead.reserve(dead_me, d, 10 * CHUNK).unwrap();
    live.reserve(live_me, d, 5 * CHUNK).unwrap();
    // The process is "killed" inside the lock, half-way through an update: it charged
    // itself 3 more chunks but never added them to the slice's total.
    let rec = dead.dev(d).unwrap();
    let token = dead.token.load(Ordering::Relaxed);
    assert!(matches!(rec.lock.lock(token, |_| false), Locked::Clean));
    let c = &dead.header().procs[dead_me as usize].charged[d as usize];
    c.store(c.load(Ordering::Relaxed) + 3 * CHUNK, Ordering::Relaxed);
    // Its liveness lock goes with its descriptor and its mapping, as at exit.
    dead.forget_in_child();
    // The next process to need the lock takes it over and recounts from the charges.
    live.reserve(live_me, d, CHUNK).unwrap();
    assert_eq!(live.used(d), 19 * CHUNK);
    assert_eq!(charged_sum(&live, d), 19 * CHUNK);
    // And the lock works as before afterwards.
    live.release(live_me, d, 6 * CHUNK);
    assert_eq!(live.used(d), 13 * CHUNK);
}

#[test]
fn a_forked_child_does_not_keep_its_parent_looking_alive() {
    let dir = tempfile::tempdir().unwrap();
    let (mut parent, parent_me, _) = join(dir.path(), None);
    let (other, _, _) = join(dir.path(), None);
    assert!(other.alive(parent_me as usize));
    // What a child does with the parent's ledger it inherited (and then leaks): afterwards
    // nothing of it refers to the parent's open file.
    parent.forget_in_child();
    assert!(!other.alive(parent_me as usize));
}

#[test]
fn a_slow_holder_is_waited_for_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _, d) = join(dir.path(), Some(100 * CHUNK));
    let (b, b_me, _) = join(dir.path(), None);
    let rec = a.dev(d).unwrap();
    let token = a.token.load(Ordering::Relaxed);
    assert!(matches!(rec.lock.lock(token, |_| false), Locked::Clean));
    let b = Arc::new(b);
    let waiter = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || b.reserve(b_me, d, CHUNK).is_ok())
    };
    // Longer than a waiter's liveness check: the holder is alive, so it must wait.
    std::thread::sleep(std::time::Duration::from_millis(3 * 20 + 20));
    assert!(!waiter.is_finished(), "a live holder's lock was taken over");
    rec.lock.unlock();
    assert!(waiter.join().unwrap());
    assert_eq!(b.used(d), CHUNK);
}

#[test]
fn a_process_that_dies_holding_the_table_lock_does_not_block_the_slice() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dead, _, _) = join(dir.path(), None);
    std::mem::forget(dead.lock_table());
    // Its lock goes with its descriptor and its mapping, as at exit.
    dead.forget_in_child();
    let start = std::time::Instant::now();
    let (live, me, d) = join(dir.path(), None);
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    live.reserve(me, d, CHUNK).unwrap();
    assert_eq!(live.used(d), CHUNK);
}

#[test]
fn a_live_holder_of_the_table_lock_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _, _) = join(dir.path(), None);
    let g = a.lock_table();
    let path = dir.path().to_path_buf();
    let joining = std::thread::spawn(move || join(&path, None).1);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !joining.is_finished(),
        "registered while another held the table lock"
    );
    drop(g);
    joining.join().unwrap();
}

#[test]
fn a_process_that_dies_measuring_passes_the_measuring_lock_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dead, _, d) = join(dir.path(), Some(100 * CHUNK));
    let (live, _, _) = join(dir.path(), None);
    std::mem::forget(dead.measuring(d).unwrap());
    let waiter = {
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let (other, _, d) = join(&path, None);
            let started = std::time::Instant::now();
            drop(other.measuring(d).unwrap());
            started.elapsed()
        })
    };
    // A live holder is waited for...
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!waiter.is_finished(), "a live measurer's lock was taken");
    // ...a dead one is not.
    dead.forget_in_child();
    let waited = waiter.join().unwrap();
    assert!(waited < std::time::Duration::from_secs(2), "{waited:?}");
    drop(live.measuring(d).unwrap());
}

#[test]
fn a_node_tool_reading_again_sees_every_device_the_slice_came_to_use() {
    let dir = tempfile::tempdir().unwrap();
    let (l, me, d0) = join(dir.path(), Some(4 * CHUNK));
    l.reserve(me, d0, CHUNK).unwrap();
    let ro = ReadOnly::open(&dir.path().join(FILE_NAME)).unwrap();
    let first = ro.snapshot();
    assert_eq!(first.devices.len(), 1);
    assert_eq!(first.devices[0].used, CHUNK);
    // Two more devices, each holding something of its own; the same reader, read again.
    for (k, uuid) in [[8u8; 16], [9u8; 16]].into_iter().enumerate() {
        let (d, _) = l.device(uuid, Some(4 * CHUNK)).unwrap();
        l.reserve(me, d, (k as u64 + 2) * CHUNK).unwrap();
    }
    let again = ro.snapshot();
    let used: Vec<([u8; 16], u64)> = again.devices.iter().map(|d| (d.uuid, d.used)).collect();
    assert_eq!(
        used,
        vec![([7; 16], CHUNK), ([8; 16], 2 * CHUNK), ([9; 16], 3 * CHUNK)]
    );
    assert_eq!(
        again,
        l.snapshot(),
        "the slice's own view and the copy agree"
    );
    let p = again.procs.iter().find(|p| p.alive).unwrap();
    assert_eq!(p.charged, vec![CHUNK, 2 * CHUNK, 3 * CHUNK]);
}
