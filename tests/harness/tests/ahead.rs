//! `ahead` runs a judged workload at a raised CPU priority where the test may raise it (root),
//! with its arguments, environment and folder as given, and `put_ahead` raises a running one's;
//! the kernel's figure for each thread (`/proc/PID/task/TID/stat`'s niceness) is the judge.

use std::process::Command;

use cuslice_test_harness::{AHEAD_NICE, ahead, is_root, put_ahead};

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

/// A running process with several threads: `put_ahead` gives each the raised priority, and a
/// thread it starts afterwards has it too.
#[test]
fn a_running_process_put_ahead_has_every_thread_ahead_and_so_do_its_new_threads() {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, threading, time\n\
             for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n\
             print('started', flush=True)\n\
             sys.stdin.readline()\n\
             threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n\
             print('started', flush=True)\n\
             sys.stdin.readline()\n",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let pid = child.id();
    put_ahead(pid as i32);
    std::io::Write::write_all(&mut stdin, b"\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let threads: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let path = t.unwrap().path().join("stat");
            niceness(&std::fs::read_to_string(path).unwrap())
        })
        .collect();
    drop(stdin);
    child.wait().unwrap();
    let own = niceness(&std::fs::read_to_string("/proc/self/stat").unwrap());
    let want = if is_root() {
        (own + AHEAD_NICE).max(-20)
    } else {
        own
    };
    assert_eq!(
        threads,
        vec![want; 5],
        "the main thread, three, then one more"
    );
}
