//! A process killed while it holds a device lock, halfway through an allocation: the next locker
//! gets the lock (no hang), repairs the device, and the memory is whole again.

use simgpu::layout::MAX_PROCS;
use simgpu::{AllocKind, CreateOptions, GRANULE, State};

#[test]
fn a_lock_whose_owner_died_mid_update_is_recovered_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state");
    let opts = CreateOptions {
        memory: 64 << 20,
        context_overhead: 0,
        ..CreateOptions::default()
    };
    let state = State::create_or_open(&path, &opts, true).unwrap();
    let owner = (MAX_PROCS - 1) as u32;

    // SAFETY: the child only touches the shared mapping it inherited and then kills itself; it
    // never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut g = state.lock_device(0);
        let mut d = g.dev();
        let id = d.alloc(owner, AllocKind::Mem, 10 << 20).unwrap();
        // Die as if between writing the granules and the allocation's record.
        d.allocs[id.head as usize].valid = 0;
        // SAFETY: killing ourselves while the lock is held is the point of the test.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let mut status = 0;
    // SAFETY: waiting for the child we forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);

    let mut g = state.lock_device(0); // would hang forever with a non-robust lock
    let mut d = g.dev();
    assert_eq!(
        d.used(),
        0,
        "the half-made allocation was released by the repair"
    );
    assert_eq!(d.b.procs[owner as usize].held, 0);
    let all = d.alloc(owner, AllocKind::Mem, 64 << 20).unwrap();
    assert_eq!(
        d.granules_of(all).unwrap().len() as u64,
        (64 << 20) / GRANULE
    );
}
