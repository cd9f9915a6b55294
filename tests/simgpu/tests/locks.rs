//! simgpu's locks between processes of different pid namespaces (containers, each with its own
//! pid 1, so their thread ids collide): a waiter killed in one namespace never hands on a lock
//! that a live process of another one holds; a holder that is frozen is waited for, never taken
//! over; a holder that is killed is taken over, and what it left half-done is repaired.
//!
//! The holders and waiters are this test binary itself, run as pid 1 of a new pid namespace
//! (`helper` below does what `HELPER_ENV` asks).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuslice_test_harness::require_root;
use simgpu::layout::MAX_PROCS;
use simgpu::{AllocKind, CreateOptions, State};

const HELPER_ENV: &str = "SIMGPU_LOCK_TEST_HELPER";
const STATE_ENV: &str = "SIMGPU_LOCK_TEST_STATE";

/// The slot the half-made allocation is charged to.
const HALF_MADE_OWNER: u32 = (MAX_PROCS - 1) as u32;

/// A waiter's checks for a dead holder come every 20 ms; this is several of them.
const LONGER_THAN_A_DEAD_CHECK: Duration = Duration::from_millis(300);

/// The helper's side: does nothing unless a test below started this binary as one.
#[test]
fn helper() {
    let Ok(what) = std::env::var(HELPER_ENV) else {
        return;
    };
    let state = State::open(Path::new(&std::env::var(STATE_ENV).unwrap())).unwrap();
    let say = |s: &str| {
        let mut o = std::io::stdout().lock();
        writeln!(o, "helper: {s}").unwrap();
        o.flush().unwrap();
    };
    let wait_for_eof = || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).unwrap_or(0) > 0 {}
    };
    match what.as_str() {
        "hold-device" => {
            let g = state.lock_device(0);
            say(&format!("holding as pid {}", std::process::id()));
            wait_for_eof();
            drop(g);
            say("released");
        }
        "wait-device" => {
            say(&format!("waiting as pid {}", std::process::id()));
            let g = state.lock_device(0);
            say("got it");
            drop(g);
        }
        "hold-device-mid-alloc" => {
            let mut g = state.lock_device(0);
            let mut d = g.dev();
            let id = d.alloc(HALF_MADE_OWNER, AllocKind::Mem, 10 << 20).unwrap();
            // As if killed between writing the granules and the allocation's record.
            d.allocs[id.head as usize].valid = 0;
            say(&format!("holding as pid {}", std::process::id()));
            wait_for_eof();
            unreachable!("killed before");
        }
        "hold-procs" => {
            let g = state.lock_process_table();
            say(&format!("holding as pid {}", std::process::id()));
            wait_for_eof();
            drop(g);
            say("released");
        }
        "wait-procs" => {
            say(&format!("waiting as pid {}", std::process::id()));
            let g = state.lock_process_table();
            say("got it");
            drop(g);
        }
        "hold-device-with-child" => {
            // A locker first (as any process that used the device before it forked).
            drop(state.lock_device(0));
            let mut pipe = [0i32; 2];
            // SAFETY: pipe writes two descriptors into the array.
            assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
            // SAFETY: the child only locks the device (through a locker of its own), tells the
            // parent, and waits to be killed; it never returns into the test harness.
            let child = unsafe { libc::fork() };
            assert!(child >= 0);
            if child == 0 {
                drop(state.lock_device(0));
                // SAFETY: one byte to the parent through the pipe made above.
                unsafe { libc::write(pipe[1], b"x".as_ptr().cast(), 1) };
                loop {
                    // SAFETY: waiting for the signal that ends the child.
                    unsafe { libc::pause() };
                }
            }
            let mut b = [0u8; 1];
            // SAFETY: reading one byte into a local buffer.
            assert_eq!(unsafe { libc::read(pipe[0], b.as_mut_ptr().cast(), 1) }, 1);
            let _g = state.lock_device(0);
            say(&format!("holding with child {child}"));
            wait_for_eof();
            unreachable!("killed before");
        }
        other => panic!("unknown helper {other}"),
    }
}

struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    /// Shown if the test fails.
    _err: cuslice_test_harness::Stderr,
}

impl Helper {
    /// This binary's `helper` doing `what` on `state`, as pid 1 of a new pid namespace.
    fn start(what: &str, state: &Path) -> Helper {
        let mut child = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, what)
            .env(STATE_ENV, state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare is missing: apt-get install util-linux");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let _err = cuslice_test_harness::Stderr::capture(&mut child);
        Helper {
            child,
            stdin,
            out,
            _err,
        }
    }

    /// Reads the helper's lines until one that says `what`; returns that line.
    fn said(&mut self, what: &str) -> String {
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "the helper ended before saying {what:?}: {seen}"
            );
            seen.push_str(&line);
            if let Some((_, rest)) = line.split_once("helper: ")
                && rest.starts_with(what)
            {
                if what.starts_with("holding") || what.starts_with("waiting") {
                    assert!(
                        rest.contains("as pid 1"),
                        "not pid 1 of its namespace: {rest}"
                    );
                }
                return rest.trim().to_string();
            }
        }
    }

    /// The helper process itself: pid 1 of its namespace, unshare's child.
    fn pid(&self) -> i32 {
        let u = self.child.id();
        let children =
            std::fs::read_to_string(format!("/proc/{u}/task/{u}/children")).unwrap_or_default();
        children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("unshare has no child")
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling a process this test started.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Closes the helper's stdin (a holder then releases) and waits for it to end.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        self.child.wait().unwrap()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn new_state(dir: &Path) -> Arc<State> {
    let opts = CreateOptions {
        memory: 64 << 20,
        context_overhead: 0,
        ..CreateOptions::default()
    };
    Arc::new(State::create_or_open(&dir.join("state"), &opts, true).unwrap())
}

/// Which lock a test is about.
#[derive(Clone, Copy)]
enum Which {
    Device,
    ProcessTable,
}

/// Takes lock `which` on a thread of this process; the flag is set once it has the lock, which
/// it keeps until `release` is set. The thread returns whether it took the lock over from a dead
/// holder.
fn lock_on_a_thread(
    state: &Arc<State>,
    which: Which,
    release: &Arc<AtomicBool>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<bool>) {
    let got = Arc::new(AtomicBool::new(false));
    let t = {
        let (state, got, release) = (Arc::clone(state), Arc::clone(&got), Arc::clone(release));
        std::thread::spawn(move || {
            let hold = || {
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            };
            match which {
                Which::Device => {
                    let g = state.lock_device(0);
                    got.store(true, Ordering::SeqCst);
                    hold();
                    g.taken_over()
                }
                Which::ProcessTable => {
                    let g = state.lock_process_table();
                    got.store(true, Ordering::SeqCst);
                    hold();
                    g.taken_over()
                }
            }
        })
    };
    (got, t)
}

fn names(which: Which) -> (&'static str, &'static str) {
    match which {
        Which::Device => ("hold-device", "wait-device"),
        Which::ProcessTable => ("hold-procs", "wait-procs"),
    }
}

fn until(what: &AtomicBool, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if what.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    what.load(Ordering::SeqCst)
}

/// A holder in one pid namespace; a waiter in another, with the holder's thread id, killed while
/// it waits; then a thread of this process tries: it must wait for the holder.
fn a_killed_waiter_hands_nothing_on(which: Which) {
    require_root("these tests make pid namespaces");
    let dir = tempfile::tempdir().unwrap();
    let state = new_state(dir.path());
    let (hold, wait) = names(which);
    let mut holder = Helper::start(hold, state.path());
    holder.said("holding");
    let mut waiter = Helper::start(wait, state.path());
    waiter.said("waiting");
    std::thread::sleep(Duration::from_millis(200));
    waiter.signal(libc::SIGKILL);
    let _ = waiter.child.wait();

    let release = Arc::new(AtomicBool::new(false));
    let (got, t) = lock_on_a_thread(&state, which, &release);
    let handed_on = until(&got, LONGER_THAN_A_DEAD_CHECK);
    release.store(true, Ordering::SeqCst);
    assert!(
        !handed_on,
        "the lock was handed on while its holder, a live process in another pid namespace, held it"
    );
    // The holder gives it back; only then does the next one get it, from a live holder.
    let status = holder.finish();
    assert!(status.success(), "the holder ended with {status}");
    assert!(
        until(&got, Duration::from_secs(5)),
        "the lock was never free again"
    );
    assert!(!t.join().unwrap(), "taken over from a live holder");
}

#[test]
fn a_waiter_killed_in_another_pid_namespace_never_hands_on_a_held_lock() {
    a_killed_waiter_hands_nothing_on(Which::Device);
}

#[test]
fn a_waiter_killed_in_another_pid_namespace_never_hands_on_the_process_table() {
    a_killed_waiter_hands_nothing_on(Which::ProcessTable);
}

/// A holder in another pid namespace is stopped (as by SIGSTOP or a cgroup freezer) while it
/// holds: it is waited for however long it stays stopped, and gives the lock back when it goes on.
fn a_frozen_holder_is_waited_for(which: Which) {
    require_root("these tests make pid namespaces");
    let dir = tempfile::tempdir().unwrap();
    let state = new_state(dir.path());
    let mut holder = Helper::start(names(which).0, state.path());
    holder.said("holding");
    holder.signal(libc::SIGSTOP);
    // The thread gives the lock back as soon as it has it.
    let release = Arc::new(AtomicBool::new(true));
    let (got, t) = lock_on_a_thread(&state, which, &release);
    assert!(
        !until(&got, LONGER_THAN_A_DEAD_CHECK * 2),
        "the lock of a stopped (live) holder was taken"
    );
    holder.signal(libc::SIGCONT);
    let status = holder.finish();
    assert!(status.success(), "the holder ended with {status}");
    assert!(
        until(&got, Duration::from_secs(5)),
        "the lock was never free again"
    );
    assert!(!t.join().unwrap(), "taken over from a live holder");
}

#[test]
fn a_device_lock_holder_stopped_in_another_pid_namespace_is_waited_for() {
    a_frozen_holder_is_waited_for(Which::Device);
}

#[test]
fn a_process_table_holder_stopped_in_another_pid_namespace_is_waited_for() {
    a_frozen_holder_is_waited_for(Which::ProcessTable);
}

#[test]
fn a_device_lock_holder_killed_in_another_pid_namespace_is_taken_over_and_repaired() {
    require_root("these tests make pid namespaces");
    let dir = tempfile::tempdir().unwrap();
    let state = new_state(dir.path());
    let mut holder = Helper::start("hold-device-mid-alloc", state.path());
    holder.said("holding");
    holder.signal(libc::SIGKILL);
    let _ = holder.child.wait();
    let start = Instant::now();
    let mut g = state.lock_device(0);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(g.taken_over());
    let d = g.dev();
    assert_eq!(d.used(), 0, "the half-made allocation was undone");
    assert_eq!(d.b.procs[HALF_MADE_OWNER as usize].held, 0);
}

#[test]
fn a_process_table_holder_killed_in_another_pid_namespace_is_taken_over() {
    require_root("these tests make pid namespaces");
    let dir = tempfile::tempdir().unwrap();
    let state = new_state(dir.path());
    let mut holder = Helper::start("hold-procs", state.path());
    holder.said("holding");
    holder.signal(libc::SIGKILL);
    let _ = holder.child.wait();
    let start = Instant::now();
    assert!(state.lock_process_table().taken_over());
    drop(state.lock_process_table());
    state.register().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// A process that used the device forks (the child lives on, and uses the device too), then is
/// killed holding the device lock: the child does not keep it looking alive.
#[test]
fn a_forked_child_does_not_keep_a_dead_parent_s_lock() {
    let dir = tempfile::tempdir().unwrap();
    let state = new_state(dir.path());
    let mut parent = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, "hold-device-with-child")
        .env(STATE_ENV, state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(parent.stdout.take().unwrap());
    let mut child = None;
    while child.is_none() {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the helper ended early"
        );
        if let Some((_, pid)) = line.trim().split_once("helper: holding with child ") {
            child = Some(pid.parse::<i32>().unwrap());
        }
    }
    let child = child.unwrap();
    let _ = parent.kill();
    let _ = parent.wait();
    let release = Arc::new(AtomicBool::new(true));
    let (got, t) = lock_on_a_thread(&state, Which::Device, &release);
    let in_time = until(&got, Duration::from_secs(2));
    // SAFETY: killing the child the helper forked (this test's grandchild).
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(
        in_time,
        "the lock of a process killed holding it was not taken over while its forked child lived"
    );
    assert!(t.join().unwrap(), "not taken over");
}
