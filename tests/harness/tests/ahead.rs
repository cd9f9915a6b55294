//! `ahead` runs a judged workload at a raised CPU priority where the test may raise it (root),
//! with its arguments, environment and folder as given; the kernel's figure for the process
//! (`/proc/PID/stat`'s niceness) is the judge.

use std::process::Command;

use cuslice_test_harness::{AHEAD_NICE, ahead, is_root};

#[test]
fn a_command_run_ahead_keeps_its_arguments_environment_and_folder_at_the_raised_priority() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "echo \"$AHEAD_CHECK $1 $(pwd)\"; cat /proc/self/stat",
        "sh",
        "two words",
    ])
    .env("AHEAD_CHECK", "set")
    .current_dir(dir.path());
    let out = ahead(c).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let (said, stat) = text.split_once('\n').unwrap();
    assert_eq!(
        said,
        format!(
            "set two words {}",
            dir.path().canonicalize().unwrap().display()
        )
    );
    let nice = niceness(stat);
    let own = niceness(&std::fs::read_to_string("/proc/self/stat").unwrap());
    if is_root() {
        assert_eq!(nice, (own + AHEAD_NICE).max(-20), "{stat}");
    } else {
        assert_eq!(nice, own, "not root: as it is; {stat}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).is_empty(), "{out:?}");
}

/// The niceness in a `/proc/PID/stat` line: its 19th field (the command, field 2, is in
/// parentheses and may hold spaces).
fn niceness(stat: &str) -> i32 {
    stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(16)
        .unwrap()
        .parse()
        .unwrap()
}
