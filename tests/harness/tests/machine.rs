//! The machine lock (`serial()` and `quiet()`) holds across processes, as `tests/run` needs when
//! it runs test binaries side by side: another process (util-linux's `flock`, which takes the
//! same kind of lock) sees a `serial()` test holding it alone and a `quiet()` one holding it
//! shared, and a process at the turnstile holds new takers back.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use cuslice_test_harness::{machine_lock, quiet, serial};

/// Whether another process gets `path` at once, shared (`-s`) or alone (`-x`).
fn others_get(path: &Path, how: &str) -> bool {
    let out = Command::new("flock")
        .args(["-n", how])
        .arg(path)
        .arg("true")
        .output()
        .expect("flock (util-linux) runs");
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("flock: {out:?}"),
    }
}

// One test: the binary's own lock orders its tests, and these take it in turn.
#[test]
fn serial_and_quiet_hold_the_machine_across_processes() {
    // A lock of its own: tests of another checkout on this machine take the usual one.
    let own = tempfile::tempdir().unwrap();
    // SAFETY: this binary has one test and it starts no thread before this; the test harness's
    // own thread only waits for it, reading no environment meanwhile.
    unsafe { std::env::set_var("CUSLICE_TEST_MACHINE_LOCK", own.path().join("machine.lock")) };
    let (lock, turnstile) = machine_lock();
    assert!(lock.starts_with(own.path()), "{}", lock.display());

    let alone = serial();
    assert!(
        !others_get(&lock, "-s"),
        "a serial() test holds it, yet another process shares it"
    );
    drop(alone);
    assert!(
        others_get(&lock, "-x"),
        "released, yet another process cannot take it alone"
    );

    let shared = quiet();
    assert!(
        others_get(&lock, "-s"),
        "a quiet() test holds it, yet another cannot share it"
    );
    assert!(
        !others_get(&lock, "-x"),
        "a quiet() test holds it, yet another takes it alone"
    );
    drop(shared);

    // A process that waits to take it alone holds the turnstile: a new taker waits behind it
    // (the holder writes `done` before it lets the turnstile go).
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let mut waiter = Command::new("flock")
        .arg("-x")
        .arg(&turnstile)
        .arg("-c")
        .arg(format!("echo held; sleep 1; touch {}", done.display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("flock (util-linux) runs");
    let mut line = String::new();
    BufReader::new(waiter.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    let after = quiet();
    assert!(
        done.exists(),
        "quiet() went past the turnstile while another process held it"
    );
    drop(after);
    waiter.wait().unwrap();
}
