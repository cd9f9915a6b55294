//! The agent's host-pid socket, with the real `cuslice agent` (release build) and real
//! processes: a process in a pid namespace of its own (as in a container) is told the pid the
//! host knows it by, as the kernel says (`/proc/PID/status` NSpid, read here); a socket a dead
//! agent left is replaced, a live agent's is not. Needs root (a new pid namespace).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use cuslice_state::agent::{self, AskError};
use cuslice_test_harness::{bin_dir, require_root};

/// Set in the child the namespace test starts: the socket it asks.
const ASK_ENV: &str = "AGENT_TEST_ASK";

struct Agent {
    child: Child,
    out: BufReader<ChildStdout>,
    socket: PathBuf,
    /// Its log, shown with a failing test's output.
    _err: cuslice_test_harness::Stderr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cuslice() -> PathBuf {
    bin_dir().join("cuslice")
}

/// `cuslice agent --state-root ROOT ARGS`, once it says it listens.
fn start(root: &Path, args: &[&str]) -> Agent {
    let mut child = Command::new(cuslice())
        .args(["agent", "--state-root"])
        .arg(root)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = cuslice_test_harness::Stderr::capture(&mut child);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let socket = root.join("agent").join(agent::SOCKET_NAME);
    assert_eq!(
        line.trim_end(),
        format!("cuslice agent: listening on {}", socket.display())
    );
    Agent {
        child,
        out,
        socket,
        _err: err,
    }
}

/// The child's side of `a_process_in_its_own_pid_namespace_is_told_its_host_pid`: does nothing
/// unless that test started it.
#[test]
fn ask_from_inside() {
    let Some(socket) = std::env::var_os(ASK_ENV) else {
        return;
    };
    let host = agent::ask(Path::new(&socket), Duration::from_secs(5)).unwrap();
    println!("asked: own {} host {host}", std::process::id());
    // Stay until the parent has looked at this process from outside.
    let _ = std::io::stdin().read(&mut [0u8; 1]);
}

#[test]
fn a_process_in_its_own_pid_namespace_is_told_its_host_pid() {
    require_root("this test makes a pid namespace");
    let root = tempfile::tempdir().unwrap();
    let agent = start(root.path(), &[]);
    // The test binary itself, as pid 1 of a new pid namespace with its own /proc, like a
    // container's init.
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ask_from_inside",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ASK_ENV, &agent.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("unshare is missing: apt-get install util-linux");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    let (own, host) = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended without asking: {said}"
        );
        said.push_str(&line);
        // libtest's "test ask_from_inside ... " may come first on the line.
        if let Some((_, rest)) = line.trim_end().split_once("asked: own ") {
            let (own, host) = rest.split_once(" host ").unwrap();
            break (own.parse::<i32>().unwrap(), host.parse::<i32>().unwrap());
        }
    };
    assert_eq!(own, 1, "the child is not pid 1 of its own namespace");
    // The host's view: unshare's one child, and the kernel's list of its pids.
    let unshare = child.id();
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    assert_eq!(children.trim(), host.to_string(), "unshare's child");
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(
        nspid.split_whitespace().skip(1).collect::<Vec<_>>(),
        [host.to_string(), "1".to_string()],
        "{nspid}"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_dead_agents_socket_is_replaced_and_a_live_ones_is_not() {
    let root = tempfile::tempdir().unwrap();
    let me = std::process::id() as i32;
    let first = start(root.path(), &[]);
    assert_eq!(
        agent::ask(&first.socket, Duration::from_secs(5)).unwrap(),
        me
    );

    // A second agent on the same state root: one line, and the first keeps serving.
    let mut second = Command::new(cuslice())
        .args(["agent", "--state-root"])
        .arg(root.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("a second agent on the same socket started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = second.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "cuslice agent: another cuslice agent is listening on {}",
            first.socket.display()
        )),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    assert_eq!(
        agent::ask(&first.socket, Duration::from_secs(5)).unwrap(),
        me
    );

    // Killed, the agent leaves its socket behind; nobody answers on it.
    let socket = first.socket.clone();
    drop(first);
    assert!(socket.exists());
    let e = agent::ask(&socket, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, AskError::NotRunning { .. }), "{e}");
    // The next agent replaces it.
    let mut next = start(root.path(), &[]);
    assert_eq!(
        agent::ask(&next.socket, Duration::from_secs(5)).unwrap(),
        me
    );
    // Stopped (SIGTERM, as systemd and scripts stop it), it takes its socket away: nothing
    // is left for containers or `cuslice status` to find refusing connections.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(next.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(next.child.wait().unwrap().success());
    assert!(!next.socket.exists(), "{} left", next.socket.display());
}

#[test]
fn with_listen_the_agent_serves_metrics_too() {
    let root = tempfile::tempdir().unwrap();
    let mut a = start(root.path(), &["--listen", "127.0.0.1:0"]);
    let mut line = String::new();
    a.out.read_line(&mut line).unwrap();
    let addr = cuslice_test_harness::exporter_address(&line);
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    assert!(body.contains("# EOF"), "{body}");
}

#[test]
fn bad_flags_are_one_line_each() {
    for (args, says) in [
        (
            &["--enforce", "kill"][..],
            "--enforce \"kill\" is not a mode",
        ),
        (&["--period", "0"][..], "--period 0 is not a check period"),
        (
            &["--period", "nan"][..],
            "--period NaN is not a check period",
        ),
        (&["--grace", "-1"][..], "--grace -1 is not a grace time"),
        (
            &["--listen", "nonsense"][..],
            "--listen \"nonsense\" is not an address",
        ),
    ] {
        let out = Command::new(cuslice())
            .args(["agent", "--state-root", "/nonexistent-cuslice-root"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("cuslice agent: "), "{err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
