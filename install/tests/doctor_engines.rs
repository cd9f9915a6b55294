//! `cuslice doctor --container-test ENGINE` through real engines on the simulated GPU: Podman,
//! Docker and containerd, each started here with configuration of its own under a temporary
//! directory (cuslice-test-engines), and cuslice registered with it as a user registers it
//! (`cuslice install --engine ENGINE --prefix P --config C`). The doctor finds each engine as a
//! user's shell would: Podman through `CONTAINERS_CONF`, Docker through `DOCKER_HOST`,
//! containerd through `CONTAINERD_ADDRESS`. With the registration in place the container sees
//! its 1 GiB cap; with the registration gone the item is one PROBLEM naming the command that
//! fixes it, and after that command it is ok again. Nothing is left behind: no container, no
//! image, no file in the doctor's temporary directory.
//!
//! The report's other items describe this machine's own /etc, which these tests leave alone, so
//! only the container test's item is judged (`install/tests/doctor.rs` judges the rest).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cuslice_test_engines::{self as engines, output_of, root_required, state_dir};
use cuslice_test_harness::{Sim, bin_dir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");
const OK: &str = "the library loaded in a container with CUSLICE_MEMORY_LIMIT=1GiB and the \
                  container sees a 1 GiB device";
/// What the simulated device is without a cap.
const UNCAPPED: &str = "with CUSLICE_MEMORY_LIMIT=1GiB the container sees a device of \
                        17179869184 bytes: ";

/// The container test's item: (status, detail, fix).
struct Item {
    status: String,
    detail: String,
    fix: String,
}

/// `cuslice doctor --json --prefix PREFIX --container-test ENGINE` under the simulator, with
/// `env` and a temporary directory of its own, which must be empty afterwards.
fn doctor(sim: &Sim, engine: &str, prefix: &Path, env: &[(&str, PathBuf)]) -> Item {
    let tmp = tempfile::tempdir().unwrap();
    let out = sim
        .command(
            Path::new(BIN),
            &["doctor", "--json", "--container-test", engine, "--prefix"],
        )
        .arg(prefix)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
    let check = format!("container test ({engine})");
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["check"] == check)
        .unwrap_or_else(|| panic!("no {check}: {text}"));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "the doctor left {left:?}: {text}");
    let s = |k: &str| item[k].as_str().unwrap_or_default().to_owned();
    if item["status"] == "problem" {
        // A problem makes the whole report unhealthy.
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert_eq!(v["healthy"], false, "{text}");
    }
    Item {
        status: s("status"),
        detail: s("detail"),
        fix: s("fix"),
    }
}

#[track_caller]
fn assert_ok(i: &Item) {
    assert_eq!(
        (i.status.as_str(), i.detail.as_str()),
        ("ok", OK),
        "{}",
        i.fix
    );
}

#[track_caller]
fn assert_problem(i: &Item, detail: &str, fix: &str) {
    assert_eq!(i.status, "problem", "{}: {}", i.detail, i.fix);
    assert!(i.detail.starts_with(detail), "{detail}\n{}", i.detail);
    assert_eq!(i.fix, fix, "{}", i.detail);
}

/// `cuslice uninstall --engine ENGINE --prefix PREFIX --config CONFIG`: the registration and
/// the files go.
fn uninstall(engine: &str, prefix: &Path, config: &Path) {
    output_of(
        Command::new(bin_dir().join("cuslice"))
            .args(["uninstall", "--engine", engine, "--prefix"])
            .arg(prefix)
            .arg("--config")
            .arg(config),
    );
}

/// Fails unless the command lists nothing (containers, images, namespaces).
#[track_caller]
fn none_listed(cmd: &mut Command) {
    let out = output_of(cmd);
    assert!(out.trim().is_empty(), "{cmd:?} lists {out}");
}

/// Runs `undo` when dropped: a test that fails half-way still stops its engine.
struct Undo<F: FnMut()>(F);
impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

#[test]
fn podman_container_test() {
    root_required();
    let sim = Sim::new(&[]);
    let dir = state_dir("doctor-podman");
    let (prefix, hooks) = (dir.join("prefix"), dir.join("hooks.d"));
    let env = engines::podman::scratch_conf(&dir, &hooks);
    let podman = || {
        let mut c = Command::new("podman");
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c
    };
    let _undo = Undo(|| {
        let _ = podman().args(["rm", "--all", "--force"]).output();
        engines::remove_dir(&dir);
    });
    engines::cuslice_install("podman", &prefix, &hooks);
    assert_ok(&doctor(&sim, "podman", &prefix, &env));
    none_listed(podman().args(["ps", "--all", "--quiet"]));
    none_listed(podman().args(["images", "--quiet"]));

    // The descriptors gone from the hooks directory: podman runs the container uncapped.
    uninstall("podman", &prefix, &hooks);
    let fix = format!(
        "cuslice install --engine podman --prefix {} (podman reads /etc/containers/oci/hooks.d \
         unless containers.conf's hooks_dir names others)",
        prefix.display()
    );
    assert_problem(
        &doctor(&sim, "podman", &prefix, &env),
        &format!("{UNCAPPED}podman ran no cuslice hook"),
        &fix,
    );
    engines::cuslice_install("podman", &prefix, &hooks);
    assert_ok(&doctor(&sim, "podman", &prefix, &env));
    none_listed(podman().args(["ps", "--all", "--quiet"]));
}

#[test]
fn docker_container_test() {
    root_required();
    let sim = Sim::new(&[]);
    let dir = state_dir("doctor-docker");
    let (prefix, config) = (dir.join("prefix"), dir.join("daemon.json"));
    std::fs::write(&config, "{}\n").unwrap();
    let dockerd = engines::docker::Dockerd::start(dir, &config);
    let _undo = Undo(|| dockerd.stop());
    let env = [("DOCKER_HOST", PathBuf::from(dockerd.host()))];

    // dockerd started before cuslice was registered: it has no such runtime.
    assert_problem(
        &doctor(&sim, "docker", &prefix, &env),
        "dockerd has no runtime cuslice (it has ",
        &format!(
            "cuslice install --engine docker --prefix {}, then kill -HUP $(pidof dockerd)",
            prefix.display()
        ),
    );
    // The fix it names.
    engines::cuslice_install("docker", &prefix, &config);
    dockerd.reload();
    engines::poll("dockerd to read the runtime", || {
        output_of(
            dockerd
                .docker()
                .args(["info", "--format", "{{json .Runtimes}}"]),
        )
        .contains("\"cuslice\"")
        .then_some(())
    });
    assert_ok(&doctor(&sim, "docker", &prefix, &env));
    none_listed(dockerd.docker().args(["ps", "--all", "--quiet"]));
    none_listed(dockerd.docker().args(["images", "--quiet"]));

    // Uninstalled: daemon.json and the files are gone, but dockerd keeps the runtime it read
    // (a SIGHUP does not forget one), which now runs a missing file.
    uninstall("docker", &prefix, &config);
    assert_problem(
        &doctor(&sim, "docker", &prefix, &env),
        &format!(
            "dockerd's runtime cuslice runs {}, which is missing",
            prefix.join("bin/cuslice-runtime").display()
        ),
        &format!(
            "cuslice install --engine docker --prefix {}, then restart dockerd (systemctl \
             restart docker)",
            prefix.display()
        ),
    );
    engines::cuslice_install("docker", &prefix, &config);
    assert_ok(&doctor(&sim, "docker", &prefix, &env));
}

#[test]
fn containerd_container_test() {
    root_required();
    let sim = Sim::new(&[]);
    let dir = state_dir("doctor-containerd");
    let (prefix, config) = (dir.join("prefix"), dir.join("config.toml"));
    std::fs::write(&config, engines::containerd::base_config(&dir, true)).unwrap();
    engines::cuslice_install("containerd", &prefix, &config);
    let started = Instant::now();
    let containerd = engines::containerd::Containerd::start(dir);
    let _undo = Undo(|| containerd.stop());
    let env = [("CONTAINERD_ADDRESS", containerd.address())];
    let ctr = || containerd.ctr_default_namespace();

    assert_ok(&doctor(&sim, "containerd", &prefix, &env));
    // No container, and not the namespace ctr made for it.
    none_listed(ctr().args(["namespaces", "ls", "--quiet"]));

    // Uninstalled: containerd's configuration declares no handler `cuslice`.
    uninstall("containerd", &prefix, &config);
    let fix = format!(
        "cuslice install --engine containerd --prefix {} --config {}, then restart containerd \
         (systemctl restart containerd)",
        prefix.display(),
        config.display()
    );
    let i = doctor(&sim, "containerd", &prefix, &env);
    assert_problem(&i, "containerd (pid ", &fix);
    assert!(
        i.detail.ends_with(&format!(
            ", config {}) has no runtime handler cuslice",
            config.display()
        )),
        "{}",
        i.detail
    );

    // Installed again while containerd runs: it has not read it.
    if let Some(wait) = Duration::from_secs(3).checked_sub(started.elapsed()) {
        std::thread::sleep(wait);
    }
    engines::cuslice_install("containerd", &prefix, &config);
    let i = doctor(&sim, "containerd", &prefix, &env);
    assert_problem(
        &i,
        "containerd (pid ",
        "restart containerd (systemctl restart containerd)",
    );
    assert!(
        i.detail.contains(&format!(
            ") started before {} last changed",
            config.display()
        )),
        "{}",
        i.detail
    );
}

/// Docker and containerd with no daemon where the doctor is told to look: one PROBLEM each,
/// saying so and how to start it.
#[test]
fn an_engine_that_does_not_answer_is_a_problem() {
    let sim = Sim::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let prefix = Path::new("/usr/local");
    let i = doctor(
        &sim,
        "docker",
        prefix,
        &[(
            "DOCKER_HOST",
            PathBuf::from(format!("unix://{}", socket.display())),
        )],
    );
    assert_problem(
        &i,
        "dockerd does not answer (",
        "start dockerd (systemctl start docker), or set DOCKER_HOST to where it listens",
    );
    let i = doctor(
        &sim,
        "containerd",
        prefix,
        &[("CONTAINERD_ADDRESS", socket.clone())],
    );
    assert_problem(
        &i,
        &format!("no containerd answers on {} (", socket.display()),
        "start containerd (systemctl start containerd), or set CONTAINERD_ADDRESS to where it \
         listens",
    );
}
