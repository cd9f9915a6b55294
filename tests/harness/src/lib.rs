//! Helpers for tests that run real processes against the simulated driver (simgpu's own tests
//! and the interposer's). They need the release build of the whole workspace
//! (`cargo build --release --workspace`), which `tests/run` does first.

pub mod direct;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const MIB: u64 = 1 << 20;

/// Tests that measure shares of time or watch the simulator's clock take the machine by this
/// lock, so a loaded machine does not skew them: within a binary by `MACHINE`, and across the
/// test binaries that `tests/run` runs side by side (the node agent's beside the container
/// engines') by the lock file `machine_lock`.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The machine lock's files: the lock itself and a turnstile that every taker passes through
/// first, so that a `serial()` test waiting for the lock holds back new `quiet()` ones of other
/// binaries (a file lock by itself would let a stream of overlapping shared holders starve it).
/// `CUSLICE_TEST_MACHINE_LOCK` names another lock file.
pub fn machine_lock() -> (PathBuf, PathBuf) {
    let lock = std::env::var_os("CUSLICE_TEST_MACHINE_LOCK")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cuslice-tests-machine.lock"));
    let mut turnstile = lock.clone().into_os_string();
    turnstile.push(".turnstile");
    (lock, turnstile.into())
}

/// A lock file, opened to read (a file lock needs no more, so a file another user created
/// serves), or created where there is none.
fn lock_file(path: &Path) -> std::fs::File {
    std::fs::File::open(path)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path),
            _ => Err(e),
        })
        .unwrap_or_else(|e| panic!("the machine lock {}: {e}", path.display()))
}

/// The machine lock across binaries, held alone (`serial`) or shared, after passing the
/// turnstile.
fn machine_file(alone: bool) -> std::fs::File {
    let (lock, turnstile) = machine_lock();
    let gate = lock_file(&turnstile);
    gate.lock()
        .unwrap_or_else(|e| panic!("the machine lock {}: {e}", turnstile.display()));
    let f = lock_file(&lock);
    let held = if alone { f.lock() } else { f.lock_shared() };
    held.unwrap_or_else(|e| panic!("the machine lock {}: {e}", lock.display()));
    // Closing the turnstile's file lets the next taker through.
    drop(gate);
    f
}

/// The machine, held by a test (`serial` or `quiet`) until dropped.
pub struct Machine<G> {
    // The file before the guard: released first, then the binary's own lock.
    _file: std::fs::File,
    _guard: G,
}

/// A test whose processes keep the host's CPUs busy, or whose judgement needs them idle (a loop
/// bound by the host's launches, judged against its rate alone, or a share of time), runs with
/// no other test that takes `serial()` or `quiet()` beside it, in its binary or another.
pub fn serial() -> Machine<std::sync::RwLockWriteGuard<'static, ()>> {
    let guard = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    Machine {
        _file: machine_file(true),
        _guard: guard,
    }
}

/// A test that watches the simulator's clock (a share, a window, a finding) while its processes
/// hardly use the host's CPUs (under half a core over its run, measured: docs/testing.md) runs
/// beside other such tests, never beside a `serial()` one: its windows are waiting, not work.
pub fn quiet() -> Machine<std::sync::RwLockReadGuard<'static, ()>> {
    let guard = MACHINE.read().unwrap_or_else(|e| e.into_inner());
    Machine {
        _file: machine_file(false),
        _guard: guard,
    }
}

/// Runs a scenario judged by a share of time; one that fails (its panic printed) is run once
/// more, and the test fails when it fails twice running. On the 2-core machine a host that
/// stalls a slice's launching thread for a while can put one window off by a few points
/// (docs/testing.md); a share that is wrong misses both.
pub fn twice(scenario: fn()) {
    if std::panic::catch_unwind(scenario).is_err() {
        eprintln!("failed once (above): run once more");
        scenario();
    }
}
/// Whether the shares `got` (percent of the device, one a slice) are each within `points` of
/// `want`, or, where `want` adds up to the whole device, held in proportion: each slice's part of
/// what the slices got together within `points`, the slices together keeping the device at least
/// 80% busy. A host that leaves the device idle in a slice's turn (its launching thread waiting
/// for a CPU) takes from every slice; how the device was split is the library's doing.
pub fn held_to_shares(got: &[f64], want: &[f64], points: f64) -> bool {
    within(got, want, points) || in_proportion(got, want).is_some_and(|p| within(&p, want, points))
}

/// Whether each share of `got` is within `points` of `want`'s.
pub fn within(got: &[f64], want: &[f64], points: f64) -> bool {
    got.iter().zip(want).all(|(g, w)| (g - w).abs() <= points)
}

/// Where the configured shares `want` add up to the whole device (every slice busy), each slice's
/// part of what the slices `got` together, scaled to the whole. None where the shares do not add
/// up to the device, or where the slices together got less than `TOGETHER` points of it (turns
/// that lose that much fail however they split the rest).
pub fn in_proportion(got: &[f64], want: &[f64]) -> Option<Vec<f64>> {
    let together: f64 = got.iter().sum();
    ((want.iter().sum::<f64>() - 100.0).abs() < 0.01 && got.len() > 1 && together >= TOGETHER)
        .then(|| got.iter().map(|g| 100.0 * g / together).collect())
}

/// The least of the device (points) that slices whose shares add up to it must keep busy
/// together for their split to be judged (`in_proportion`). On the 2-core machine with two
/// other busy processes on each core, the 50 us loops at 30/70 got 90.7 and 94.4% of their rate
/// alone together (30.0/70.0 and 29.6/70.4% of that).
pub const TOGETHER: f64 = 80.0;

pub const GIB: u64 = 1 << 30;

/// target/release, where the simulated libraries and the workload are built.
pub fn bin_dir() -> PathBuf {
    // A test binary runs from target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    for f in [
        "simgpu",
        "libcuslice.so",
        "libsimgpu_cuda.so",
        "libsimgpu_nvml.so",
        "cuda-workload",
        "cuda-workload-linked",
    ] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: run `cargo build --release --workspace` before the tests (tests/run does)",
            dir.join(f).display()
        );
    }
    dir
}

pub fn simgpu() -> PathBuf {
    bin_dir().join("simgpu")
}

/// The interposer library under test.
pub fn libcuslice() -> PathBuf {
    bin_dir().join("libcuslice.so")
}

pub fn workload() -> PathBuf {
    bin_dir().join("cuda-workload")
}

pub fn data_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data")
        .join(name)
}

/// A simulated machine in a temporary folder.
pub struct Sim {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
}

impl Sim {
    pub fn new(args: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let out = Command::new(simgpu())
            .arg("init")
            .arg("--state")
            .arg(&state)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "simgpu init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Sim { dir, state }
    }

    /// The simulated device's memory, beside the state file (`STATE.mem`): a container that uses
    /// the simulator needs it as well as the state, as it would need a real GPU's device nodes.
    pub fn memory_file(&self) -> PathBuf {
        let mut p = self.state.clone().into_os_string();
        p.push(".mem");
        PathBuf::from(p)
    }

    /// A command that runs `program args` under `simgpu run --state`.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(simgpu());
        c.arg("run")
            .arg("--state")
            .arg(&self.state)
            .arg("--")
            .arg(program)
            .args(args);
        c
    }

    /// Runs the workload to completion; returns its JSON lines and exit code.
    pub fn workload(&self, args: &[&str]) -> (Vec<Value>, i32) {
        let out = self.command(&workload(), args).output().unwrap();
        let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            // The test's own output: shown only if the test fails.
            eprintln!(
                "workload {args:?} exited {:?}; stderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (lines, out.status.code().unwrap_or(-1))
    }

    /// Starts the workload in the background with piped stdin and stdout; its stderr is
    /// captured (see [`Stderr`]).
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running::start(self.command(&workload(), args))
    }

    pub fn show(&self) -> Value {
        let out = Command::new(simgpu())
            .args(["show", "--json", "--state"])
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "simgpu show failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn device(&self, i: usize) -> Value {
        self.show()["devices"][i].clone()
    }

    /// Device time (ns) per pid on device `i`, by the simulator's count: the live processes and
    /// the exited records (oldest first), a live process's own figure over any exited record of
    /// the same pid.
    pub fn device_times(&self, i: usize) -> std::collections::HashMap<i64, u64> {
        let d = self.device(i);
        ["exited", "processes"]
            .iter()
            .flat_map(|k| d[*k].as_array().cloned().unwrap_or_default())
            .filter_map(|p| Some((p["pid"].as_i64()?, p["device_time_ns"].as_u64()?)))
            .collect()
    }

    /// [`device_times`](Self::device_times) with the instant the count stands for: the middle
    /// of the call that read it. A busy host can make that call take seconds (while a tenant's
    /// hundreds of processes initialise CUDA), which a rate over wall time would count as time
    /// the device gave nobody: a count whose call took over 100 ms is taken again, up to 50
    /// times.
    pub fn device_times_at(
        &self,
        i: usize,
    ) -> (std::time::Instant, std::collections::HashMap<i64, u64>) {
        let mut tries = 0;
        loop {
            let before = std::time::Instant::now();
            let c = self.device_times(i);
            let took = before.elapsed();
            tries += 1;
            if took < std::time::Duration::from_millis(100) || tries == 50 {
                return (before + took / 2, c);
            }
        }
    }
}

/// A child's stderr, read on a thread of its own. Each line is passed to the test's output as it
/// comes (`eprint!`, which libtest captures per test: shown when the test fails or runs with
/// `--nocapture`, dropped when it passes), and kept for the test to read. So the refusals and
/// errors a scenario provokes on purpose stay out of a passing run's log, and a failing test
/// still shows every line its processes wrote.
pub struct Stderr {
    text: Arc<Mutex<Vec<u8>>>,
    done: Option<(Receiver<()>, JoinHandle<()>)>,
}

impl Stderr {
    /// How long [`Stderr::finish`] (and drop) waits for the end of the stream once the child is
    /// gone: a grandchild may still hold the pipe.
    const LINGER: Duration = Duration::from_secs(5);

    /// Takes `child`'s stderr (which must have been `Stdio::piped()`; otherwise there is nothing
    /// to capture and the text stays empty).
    pub fn capture(child: &mut Child) -> Stderr {
        Stderr::of(child.stderr.take())
    }

    /// Captures any readable stream (a child's stderr).
    pub fn of<R: Read + Send + 'static>(stream: Option<R>) -> Stderr {
        let text = Arc::new(Mutex::new(Vec::new()));
        let Some(stream) = stream else {
            return Stderr { text, done: None };
        };
        let (tx, rx) = channel();
        let kept = Arc::clone(&text);
        // The spawned thread inherits the test's output capture.
        let thread = std::thread::spawn(move || {
            let mut r = BufReader::new(stream);
            let mut line = Vec::new();
            while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                eprint!("{}", String::from_utf8_lossy(&line));
                kept.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&line);
                line.clear();
            }
            let _ = tx.send(());
        });
        Stderr {
            text,
            done: Some((rx, thread)),
        }
    }

    /// What the child has written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Waits for the end of the stream (call it once the child has exited; at most
    /// [`Stderr::LINGER`]) and returns everything the child wrote.
    pub fn finish(mut self) -> String {
        self.wait();
        self.text()
    }

    fn wait(&mut self) {
        if let Some((rx, thread)) = self.done.take()
            && rx.recv_timeout(Self::LINGER).is_ok()
        {
            let _ = thread.join();
        }
    }
}

impl Drop for Stderr {
    fn drop(&mut self) {
        self.wait();
    }
}

pub struct Running {
    pub child: Child,
    pub out: BufReader<std::process::ChildStdout>,
    pub err: Stderr,
}

impl Running {
    /// Spawns `cmd` with stdin and stdout piped and stderr captured.
    pub fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let out = BufReader::new(child.stdout.take().unwrap());
        let err = Stderr::capture(&mut child);
        Running { child, out, err }
    }

    /// Reads JSON lines until one with `"event": event` (panics after `timeout`: a process that
    /// prints nothing more by then is killed, so that the read ends).
    pub fn wait_for(&mut self, event: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        let done = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let watchdog = {
            let done = done.clone();
            let pid = self.child.id() as libc::pid_t;
            std::thread::spawn(move || {
                let (lock, cv) = &*done;
                let (over, _) = cv
                    .wait_timeout_while(lock.lock().unwrap(), timeout, |over| !*over)
                    .unwrap();
                if !*over {
                    // SAFETY: signals our own child, which is not yet reaped (`self` holds it).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            })
        };
        let finish = |done: &std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>| {
            *done.0.lock().unwrap() = true;
            done.1.notify_all();
        };
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap_or(0);
            if n == 0 {
                finish(&done);
                let _ = watchdog.join();
                assert!(
                    start.elapsed() < timeout,
                    "no {event:?} within {timeout:?} (the process was killed)"
                );
                panic!("workload ended before printing {event:?}");
            }
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["event"] == event
            {
                finish(&done);
                let _ = watchdog.join();
                return v;
            }
            if start.elapsed() >= timeout {
                finish(&done);
                let _ = watchdog.join();
                panic!("no {event:?} within {timeout:?}");
            }
        }
    }

    /// Closes stdin (a `hold` scenario then frees and exits) and waits.
    pub fn release(mut self) -> i32 {
        drop(self.child.stdin.take());
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `err` drops next: it waits for the last lines, so a failing test shows them.
    }
}

pub fn parse_lines(s: &str) -> Vec<Value> {
    s.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == name)
        .unwrap_or_else(|| panic!("no {name:?} event in {lines:?}"))
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Calls `f` every 50 ms until it gives a value; fails the test, naming `what`, if none came
/// within `secs` seconds.
pub fn poll<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "no {what} in {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the test runs as root (the effective uid in /proc/self/status).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// The niceness `ahead` gives the processes a test judges.
pub const AHEAD_NICE: i32 = -10;

/// `cmd` run ahead of the machine's other work (`nice -n -10`, `AHEAD_NICE`) where the test may
/// raise a priority (root; as it is otherwise). For a workload whose share of device time a test
/// judges by the simulator: the library's gate and compute thread run in the workload's process,
/// and a slice whose launching thread the host runs late leaves the device idle in its own turn,
/// which its turn is charged for. On the 2-core machine with three busy loops on each core, a
/// slice limited to 30% then 60% got 28.3-29.3% and 57.0-58.6% by the simulator (five runs), and
/// 29.6-30.0% and 59.3-60.2% run so: the figure is then the library's, not the machine's.
pub fn ahead(cmd: Command) -> Command {
    if !is_root() {
        return cmd;
    }
    under(&["nice", "-n", &AHEAD_NICE.to_string()], &cmd)
}

/// A process already running (one a container engine started, which `ahead` cannot wrap) put
/// ahead as `ahead` puts a command: each of its threads at the test's niceness plus
/// `AHEAD_NICE`, as `nice -n -10` would have started it, where the test may raise a priority
/// (root; left as it is otherwise). Threads it starts later inherit it from the thread that
/// starts them; one started while its threads are gone through is taken on the next pass.
pub fn put_ahead(pid: i32) {
    if !is_root() {
        return;
    }
    // SAFETY: getpriority takes plain integers (0: the calling thread, which exists).
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let nice = (own + AHEAD_NICE).clamp(-20, 19);
    let mut done = std::collections::BTreeSet::new();
    loop {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let new: Vec<u32> = tasks
            .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
            .filter(|t| !done.contains(t))
            .collect();
        if new.is_empty() {
            return;
        }
        for tid in new {
            // SAFETY: plain integers; a thread that has ended is an error, which changes nothing.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
            done.insert(tid);
        }
    }
}

/// `cmd` run by the command line `prefix` (a program and its arguments before `cmd`'s own, as
/// `nice -n -10` or `timeout 60`), with `cmd`'s environment and folder.
pub fn under(prefix: &[&str], cmd: &Command) -> Command {
    let mut c = Command::new(prefix[0]);
    c.args(&prefix[1..])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// Fails the test unless it runs as root; `needs` says what for ("these tests make cgroups").
pub fn require_root(needs: &str) {
    assert!(
        is_root(),
        "{needs} and need root (tests/run is run as root)"
    );
}

/// The address (`host:port`) in the line an exporter prints when it starts serving
/// (`cuslice exporter: serving http://ADDRESS/metrics`); panics on any other line.
pub fn exporter_address(line: &str) -> String {
    line.trim()
        .strip_prefix("cuslice exporter: serving http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("not the exporter's first line: {line:?}"))
        .to_string()
}

/// One `GET /metrics` of `cmd`, a `cuslice exporter --listen 127.0.0.1:0 ...` command: started,
/// its address taken from its first line, scraped once, stopped. The body.
pub fn scrape_exporter(mut cmd: Command) -> String {
    let mut exporter = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(exporter.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = exporter_address(&first);
    let mut response = String::new();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    std::io::Write::write_all(
        &mut s,
        format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    s.read_to_string(&mut response).unwrap();
    let _ = exporter.kill();
    let _ = exporter.wait();
    response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(_, body)| body.to_string())
}

/// Runs `cmd` (a `cuslice ... --json` command) to its end and parses what it printed; panics
/// with its stderr unless it succeeds.
pub fn json_of(cmd: &mut Command) -> Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}
