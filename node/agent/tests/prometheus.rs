//! The monitoring files (`install/monitoring`: the alerting rules and the Grafana dashboard)
//! in a real Prometheus (Debian's `prometheus` package), scraping a real `cuslice agent` while
//! runc containers run on simgpu. What Prometheus answers over its HTTP API is held against the
//! simulator's count, and the rules' alerts against what the containers do (a bypass over its
//! cap, the agent killed). Every PromQL expression of the dashboard is asked of the same
//! Prometheus: it must parse and return data.
//!
//! Needs root, runc and busybox, Debian's prometheus package (`tests/tools/ensure-tools` installs
//! them), and the release build. Without prometheus the tests are skipped with one line, except
//! under `CI`, where they fail.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_engines as engines;
use cuslice_test_engines::runc::RuncContainer;
use cuslice_test_engines::{Container, Spec, name, root_required};
use cuslice_test_harness::{GIB, Sim, bin_dir, poll};
use serde_json::Value;

/// install/monitoring, where the files under test live.
fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../install/monitoring")
}

/// `prometheus` and `promtool` on PATH, or a skip (a failure under `CI`).
fn prometheus_tools() -> Option<(PathBuf, PathBuf)> {
    let find = |tool: &str| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
        })
    };
    if let (Some(p), Some(t)) = (find("prometheus"), find("promtool")) {
        return Some((p, t));
    }
    let why = "prometheus and promtool are not on PATH: Debian's prometheus package is missing \
               (tests/tools/ensure-tools installs it)";
    assert!(std::env::var_os("CI").is_none(), "{why}");
    println!("SKIPPED: {why}");
    None
}

// ---- HTTP ------------------------------------------------------------------------------------

/// GET `target` (path and query) from `addr` over HTTP/1.0: the status code and the body.
fn get(addr: &str, target: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// Percent-encoding for a query string value: everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---- Prometheus ------------------------------------------------------------------------------

/// A Prometheus of the test's own: its own data directory, on a free loopback port, scraping
/// `target` every second and evaluating the rules every second.
struct Prometheus {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(bin: &Path, target: &str, rules: &Path) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("cuslice-prometheus-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: cuslice\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        // A free port: bound, read and let go (Prometheus binds it a moment later).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut p = Prometheus { child, addr, dir };
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = get(&p.addr, "/-/ready") {
                break;
            }
            assert!(
                p.child.try_wait().unwrap().is_none(),
                "prometheus exited: {}",
                p.log()
            );
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "prometheus not ready in 30 s: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/query?query=EXPR` at the current time: the whole answer.
    fn ask(&self, expr: &str) -> Value {
        let (code, body) = get(&self.addr, &format!("/api/v1/query?query={}", encode(expr)))
            .unwrap_or_else(|e| panic!("querying {expr:?}: {e}"));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{expr:?}: HTTP {code}, not JSON ({e}): {body}"))
    }

    /// The instant vector `expr` evaluates to; panics on an error answer (a parse error).
    fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.ask(expr);
        assert_eq!(v["status"], "success", "{expr:?}: {v}");
        assert_eq!(v["data"]["resultType"], "vector", "{expr:?}: {v}");
        v["data"]["result"].as_array().unwrap().clone()
    }

    /// The one sample `expr` evaluates to, if there is exactly one.
    fn value(&self, expr: &str) -> Option<f64> {
        match self.query(expr).as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// The active alerts (`/api/v1/alerts`): pending and firing.
    fn alerts(&self) -> Vec<Value> {
        let (_, body) = get(&self.addr, "/api/v1/alerts").unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{v}");
        v["data"]["alerts"].as_array().unwrap().clone()
    }

    /// The alert `name` for slice `slice` (any slice if `None`), if active.
    fn alert(&self, name: &str, slice: Option<&str>) -> Option<Value> {
        self.alerts().into_iter().find(|a| {
            a["labels"]["alertname"] == name && slice.is_none_or(|s| a["labels"]["slice"] == s)
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the agent -------------------------------------------------------------------------------

/// `cuslice agent --state-root ROOT --listen 127.0.0.1:0 ARGS` under `simgpu run`.
struct Agent {
    child: Child,
    /// Where it serves /metrics.
    addr: String,
}

impl Agent {
    fn start(sim: &Sim, root: &Path, args: &[&str]) -> Agent {
        let mut c = sim.command(&bin_dir().join("cuslice"), &["agent", "--state-root"]);
        c.arg(root).args(["--listen", "127.0.0.1:0"]).args(args);
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[agent] {line}");
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(a) = line
                    .strip_prefix("cuslice exporter: serving http://")
                    .and_then(|s| s.strip_suffix("/metrics"))
                {
                    let _ = tx.send(a.to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the agent's `cuslice exporter: serving` line");
        Agent { child, addr }
    }

    /// SIGTERM to `simgpu run`, which passes it on; waits for the agent to end.
    fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A slice alert names the pod where the slice belongs to one (its `namespace` and `pod`
/// labels), and only the slice where it does not: `promtool test rules` renders the summary.
#[test]
fn slice_alerts_name_the_pod() {
    let Some((_, promtool)) = prometheus_tools() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = monitoring().join("cuslice-rules.yaml");
    let test = dir.path().join("pod.test.yaml");
    let over = |slice: &str, pod: &str| {
        format!(
            "      - series: 'cuslice_slice_violation{{check=\"memory\",slice=\"{slice}\",\
             name=\"n\",uuid=\"GPU-0\",instance=\"node-a\"{pod}}}'\n        values: '1x5'\n"
        )
    };
    let expect = |slice: &str, pod: &str, summary: &str| {
        format!(
            "          - exp_labels: {{severity: critical, check: memory, slice: {slice}, name: n, \
             uuid: GPU-0, instance: node-a{pod}}}\n            exp_annotations:\n              \
             summary: '{summary}'\n              description: 'The node agent on node-a finds \
             slice {slice} (n) holding more than its memory cap on GPU GPU-0 by the driver''s \
             count: a process went around the library.'\n"
        )
    };
    let text = format!(
        "rule_files: ['{}']\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    \
         input_series:\n{}{}    alert_rule_test:\n      - eval_time: 2m\n        \
         alertname: CusliceSliceOverMemoryCap\n        exp_alerts:\n{}{}",
        rules.display(),
        over("abc", ",namespace=\"ml\",pod=\"train-0\""),
        over("def", ""),
        expect(
            "abc",
            ", namespace: ml, pod: train-0",
            "cuslice slice abc (pod ml/train-0) is over its memory cap"
        ),
        expect("def", "", "cuslice slice def is over its memory cap"),
    );
    std::fs::write(&test, &text).unwrap();
    let out = Command::new(promtool)
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the scenario ----------------------------------------------------------------------------

/// The rules file is valid to Prometheus's own checker.
#[test]
fn the_rules_pass_promtool() {
    let Some((_, promtool)) = prometheus_tools() else {
        return;
    };
    let rules = monitoring().join("cuslice-rules.yaml");
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules: {text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// Every PromQL expression of the dashboard (its panels' targets and its variables' queries),
/// with Grafana's variables replaced by what "All" and a short interval make of them.
fn dashboard_exprs() -> Vec<String> {
    let path = monitoring().join("cuslice-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut exprs = Vec::new();
    let mut panels: Vec<&Value> = d["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(
                t["expr"]
                    .as_str()
                    .expect("a target with an expr")
                    .to_string(),
            );
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    // The variables the panels filter by (the node, the Kubernetes namespace) must take their
    // values from metrics that exist.
    let vars = d["templating"]["list"].as_array().unwrap();
    let queried: Vec<&Value> = vars.iter().filter(|v| v["type"] == "query").collect();
    for name in ["instance", "namespace"] {
        assert!(
            queried.iter().any(|v| v["name"] == name),
            "the dashboard has no {name} variable"
        );
    }
    for v in queried {
        let def = v["definition"].as_str().unwrap();
        let metric = def
            .strip_prefix("label_values(")
            .and_then(|s| s.rsplit_once(','))
            .map(|(m, _)| m)
            .unwrap_or_else(|| panic!("{def}"));
        exprs.push(metric.to_string());
    }
    exprs
        .into_iter()
        .map(|e| {
            e.replace("$__rate_interval", "10s")
                .replace("$instance", ".*")
                .replace("$namespace", ".*")
        })
        .collect()
}

/// A real Prometheus scraping `cuslice agent --enforce report` while two runc containers run
/// on simgpu: an honest slice (1 GiB cap, 30% core limit, 20% request; one allocation refused
/// at the cap, then holding what fits and launching kernels) and a bypass (1 GiB cap, 2 GiB
/// held around the library).
///
/// - The figures Prometheus answers are the simulator's: the slice's memory is what simgpu
///   counts for its processes, contexts included; the device's used memory is simgpu's NVML
///   reading; the refusal is counted once; the device time is simgpu's within what one scrape
///   lags.
/// - The bypass makes `CusliceSliceOverMemoryCap` fire for its slice (and the ledger check
///   pending), and the alert ends when the bypass does.
/// - Every dashboard expression parses and returns data.
/// - With the agent killed, `up` is 0 and `CusliceAgentDown` is pending.
#[test]
fn prometheus_scrapes_the_agent_and_fires_on_a_bypass() {
    let Some((prometheus, _)) = prometheus_tools() else {
        return;
    };
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::Builder::new()
        .prefix("cuslice-agent-test-")
        .tempdir()
        .unwrap();
    let mut agent = Agent::start(&sim, root.path(), &["--enforce", "report", "--grace", "1"]);
    let prom = Prometheus::start(
        &prometheus,
        &agent.addr,
        &monitoring().join("cuslice-rules.yaml"),
    );
    let hook_args = ["--state-root", root.path().to_str().unwrap()];

    // The honest slice.
    let honest = name("prom-honest");
    let mut h = RuncContainer::start(
        &sim,
        &Spec {
            name: &honest,
            env: &[
                "CUSLICE_MEMORY_LIMIT=1GiB",
                "CUSLICE_CORE_LIMIT=30",
                "CUSLICE_CORE_REQUEST=20",
            ],
            cmd: &[
                "sh",
                "-c",
                // The launching process makes its context first, so that the refusal is
                // the fill's.
                "cuda-workload launch --ns-per-block 1000000 --blocks 1 --secs 180 & sleep 2; \
                 exec cuda-workload fill --family mem --chunk 256MiB --hold 180",
            ],
            read_only: false,
        },
        &hook_args,
    );
    engines::wait_for(&mut h, "holding");
    let sel = format!("slice=\"{honest}\"");
    poll("Prometheus's first scrape of the agent", 20, || {
        (prom.value("up{job=\"cuslice\"}") == Some(1.0)).then_some(())
    });

    // Memory: what simgpu counts for the container's processes (it runs nothing else).
    let (held, reported) = poll(
        "the slice's memory in Prometheus as simgpu counts it",
        20,
        || {
            let dev = sim.device(0);
            let procs = dev["processes"].as_array().unwrap();
            let held: u64 = procs.iter().map(|p| p["held"].as_u64().unwrap()).sum();
            let q = prom.value(&format!("cuslice_slice_memory_used_bytes{{{sel}}}"))?;
            (procs.len() == 2 && q == held as f64).then_some((held, q))
        },
    );
    println!(
        "memory: Prometheus cuslice_slice_memory_used_bytes {reported}, simgpu {held} \
         (2 processes, contexts included)"
    );
    assert!(held <= GIB, "{held}");
    assert_eq!(
        prom.value(&format!("cuslice_slice_memory_limit_bytes{{{sel}}}")),
        Some(GIB as f64)
    );
    assert_eq!(
        prom.value(&format!("cuslice_slice_memory_refusals_total{{{sel}}}")),
        Some(1.0)
    );
    assert_eq!(
        prom.value(&format!("cuslice_slice_processes{{{sel}}}")),
        Some(2.0)
    );
    assert_eq!(
        prom.value(&format!("cuslice_slice_core_limit_ratio{{{sel}}}")),
        Some(0.3)
    );
    assert_eq!(
        prom.value(&format!("cuslice_slice_core_request_ratio{{{sel}}}")),
        Some(0.2)
    );
    let (used, nvml) = poll(
        "the device's used memory as simgpu's NVML reads it",
        20,
        || {
            let used = sim.device(0)["used"].as_u64().unwrap();
            let q = prom.value("cuslice_device_memory_used_bytes")?;
            (q == used as f64).then_some((used, q))
        },
    );
    println!("device: Prometheus cuslice_device_memory_used_bytes {nvml}, simgpu {used}");
    assert_eq!(
        prom.value("cuslice_device_memory_total_bytes"),
        Some((8 * GIB) as f64)
    );

    // Compute: the device time, against simgpu's, over a few seconds of the 30% limit.
    std::thread::sleep(Duration::from_secs(5));
    let truth = || -> f64 {
        let dev = sim.device(0);
        dev["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["device_time_ns"].as_u64().unwrap())
            .sum::<u64>() as f64
            / 1e9
    };
    let before = truth();
    let q = prom
        .value(&format!("cuslice_slice_device_seconds_total{{{sel}}}"))
        .unwrap();
    let scraped = prom
        .value(&format!(
            "timestamp(cuslice_slice_device_seconds_total{{{sel}}})"
        ))
        .unwrap();
    let after = truth();
    // How old Prometheus's sample is: one scrape (1 s) where the host keeps up.
    let age = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - scraped;
    println!(
        "device time: Prometheus cuslice_slice_device_seconds_total {q:.3} s, simgpu \
         {before:.3}-{after:.3} s, the sample {age:.2} s old"
    );
    // Behind by no more than the slice ran since the scrape (30% of the time; at most all of
    // it) and one meter report (50 ms); never ahead of the simulator.
    assert!(
        q <= after + 0.05 && q >= before - age.max(1.0) * 0.5 - 0.05,
        "{q} vs {before}, the sample {age:.2} s old"
    );
    let share = prom
        .value(&format!(
            "rate(cuslice_slice_device_seconds_total{{{sel}}}[5s])"
        ))
        .unwrap();
    println!("share: rate(cuslice_slice_device_seconds_total[5s]) {share:.3} under a 0.3 limit");
    assert!((0.2..=0.36).contains(&share), "{share}");
    let throttled = prom
        .value(&format!(
            "rate(cuslice_slice_throttled_seconds_total{{{sel}}}[5s])"
        ))
        .unwrap();
    println!("throttled: rate(cuslice_slice_throttled_seconds_total[5s]) {throttled:.3}");
    assert!(throttled > 0.0, "{throttled}");
    let alerts = prom.alerts();
    assert!(
        alerts.is_empty(),
        "{alerts:?} (scrapes: up at least {:?}, taking up to {:?} s)",
        prom.value("min_over_time(up{job=\"cuslice\"}[1m])"),
        prom.value("max_over_time(scrape_duration_seconds{job=\"cuslice\"}[1m])")
    );

    // The bypass: 2 GiB under a 1 GiB cap, around the library.
    let bypass = name("prom-bypass");
    let mut b = RuncContainer::start(
        &sim,
        &Spec {
            name: &bypass,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "cuda-workload",
                "--route",
                "bypass",
                "hold",
                "--bytes",
                "2GiB",
                "--secs",
                "120",
            ],
            read_only: false,
        },
        &hook_args,
    );
    engines::wait_for(&mut b, "holding");
    let started = Instant::now();
    let pid = b.host_pid();
    let firing = poll(
        "CusliceSliceOverMemoryCap firing for the bypass",
        30,
        || {
            prom.alert("CusliceSliceOverMemoryCap", Some(bypass.as_str()))
                .filter(|a| a["state"] == "firing")
        },
    );
    let dev = sim.device(0);
    let bypass_held = dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map(|p| p["held"].as_u64().unwrap())
        .unwrap();
    println!(
        "alert: CusliceSliceOverMemoryCap firing {:.1} s after the bypass held {bypass_held} \
         bytes by simgpu's count (cap {GIB}): {firing}",
        started.elapsed().as_secs_f64()
    );
    assert!(bypass_held > GIB);
    assert_eq!(firing["labels"]["severity"], "critical", "{firing}");
    assert_eq!(firing["labels"]["check"], "memory", "{firing}");
    let ledger = poll("CusliceSliceLedgerMismatch for the bypass", 20, || {
        prom.alert("CusliceSliceLedgerMismatch", Some(bypass.as_str()))
    });
    assert_eq!(ledger["state"], "pending", "{ledger}");
    // The honest slice is not alerted on.
    assert!(
        !prom.alerts().iter().any(|a| a["labels"]["slice"] == honest),
        "{:?}",
        prom.alerts()
    );

    // The dashboard, with every kind of series present now (the violation too).
    let exprs = dashboard_exprs();
    for e in &exprs {
        let v = prom.ask(e);
        assert_eq!(v["status"], "success", "dashboard expression {e:?}: {v}");
        let n = poll(&format!("data for dashboard expression {e:?}"), 20, || {
            let r = prom.query(e);
            (!r.is_empty()).then_some(r.len())
        });
        println!("dashboard: {e} -> {n} series");
    }
    println!(
        "dashboard: {} expressions parse and return data",
        exprs.len()
    );

    // The alert ends with the bypass.
    Box::new(b).remove();
    poll("CusliceSliceOverMemoryCap resolved", 20, || {
        prom.alert("CusliceSliceOverMemoryCap", Some(bypass.as_str()))
            .is_none()
            .then_some(())
    });

    // The agent gone: up is 0 and CusliceAgentDown waits its 2 minutes, pending.
    agent.stop();
    poll("up == 0 for the agent", 20, || {
        (prom.value("up{job=\"cuslice\"}") == Some(0.0)).then_some(())
    });
    let down = poll("CusliceAgentDown pending", 20, || {
        prom.alert("CusliceAgentDown", None)
    });
    assert_eq!(down["state"], "pending", "{down}");
    Box::new(h).remove();
}

/// `--enforce stop`: the agent kills a bypass over its cap within its grace, and
/// `CusliceAgentKilled` fires, with the kill counted once; simgpu shows the memory gone.
#[test]
fn prometheus_fires_when_the_agent_kills_a_bypass() {
    let Some((prometheus, _)) = prometheus_tools() else {
        return;
    };
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::Builder::new()
        .prefix("cuslice-agent-test-")
        .tempdir()
        .unwrap();
    let agent = Agent::start(&sim, root.path(), &["--enforce", "stop", "--grace", "1"]);
    let prom = Prometheus::start(
        &prometheus,
        &agent.addr,
        &monitoring().join("cuslice-rules.yaml"),
    );
    poll("Prometheus's first scrape of the agent", 20, || {
        (prom.value("cuslice_agent_actions_total{action=\"kill\"}") == Some(0.0)).then_some(())
    });
    let bypass = name("prom-stop");
    let mut b = RuncContainer::start(
        &sim,
        &Spec {
            name: &bypass,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "cuda-workload",
                "--route",
                "bypass",
                "hold",
                "--bytes",
                "2GiB",
                "--secs",
                "120",
            ],
            read_only: false,
        },
        &["--state-root", root.path().to_str().unwrap()],
    );
    engines::wait_for(&mut b, "holding");
    let pid = b.host_pid();
    let started = Instant::now();
    let killed = poll("CusliceAgentKilled firing", 30, || {
        prom.alert("CusliceAgentKilled", None)
            .filter(|a| a["state"] == "firing")
    });
    println!(
        "alert: CusliceAgentKilled firing {:.1} s after the bypass held 2 GiB: {killed}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(killed["labels"]["action"], "kill", "{killed}");
    // The kill is real: simgpu no longer lists the bypass, and the container ended.
    assert!(
        !sim.device(0)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid),
        "{}",
        sim.device(0)
    );
    poll("the bypass container's end", 10, || b.exited());
    assert_eq!(
        prom.value("cuslice_agent_actions_total{action=\"kill\"}"),
        Some(1.0)
    );
}
