//! The built `cuslice` command, run with `--root` in a temporary directory: what it writes for
//! each engine, idempotency, install-then-uninstall gives back the original bytes, dry runs, and
//! refusals that leave every file as it was. One concern (what the command writes under a root,
//! the agent's systemd unit included), kept in one file.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");
const ALL: &str = "docker,containerd,podman,crio,cdi";

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    from: PathBuf,
}

impl Env {
    /// An empty target root and a `--from` directory with fake artefacts.
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let from = dir.path().join("from");
        fs::create_dir_all(&root).expect("mkdir root");
        fs::create_dir_all(&from).expect("mkdir from");
        for f in [
            "cuslice-hook",
            "cuslice-runtime",
            "cuslice",
            "libcuslice.so",
            "libcuslice_core.so",
        ] {
            fs::write(from.join(f), format!("fake {f}\n")).expect("write artefact");
        }
        Env {
            _dir: dir,
            root,
            from,
        }
    }

    fn path(&self, target: &str) -> PathBuf {
        self.root.join(target.trim_start_matches('/'))
    }

    fn put(&self, target: &str, text: &str) {
        let p = self.path(target);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    fn get(&self, target: &str) -> String {
        fs::read_to_string(self.path(target)).unwrap_or_else(|e| panic!("{target}: {e}"))
    }

    fn exists(&self, target: &str) -> bool {
        self.path(target).exists()
    }

    /// Runs `cuslice CMD --root ROOT [--from FROM] ARGS`.
    fn run(&self, cmd: &str, args: &[&str]) -> Output {
        let mut c = Command::new(BIN);
        c.arg(cmd).arg("--root").arg(&self.root);
        if cmd == "install" {
            c.arg("--from").arg(&self.from);
        }
        c.args(args);
        c.output().expect("run cuslice")
    }

    /// Every file under the root (path relative to it, bytes).
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            let Ok(rd) = fs::read_dir(dir) else { return };
            for e in rd {
                let e = e.expect("entry");
                let p = e.path();
                let ft = e.file_type().expect("type");
                if ft.is_dir() {
                    walk(&p, base, out);
                } else {
                    let rel = p.strip_prefix(base).expect("under root").to_path_buf();
                    let bytes = if ft.is_symlink() {
                        format!("-> {}", fs::read_link(&p).expect("link").display()).into_bytes()
                    } else {
                        fs::read(&p).expect("read")
                    };
                    out.insert(rel, bytes);
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut out);
        out
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Exit code 2, one line on stderr that starts with `cuslice CMD: FILE: `; returns the line.
#[track_caller]
fn refused(o: &Output, cmd: &str, file: &str) -> String {
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let want = format!("cuslice {cmd}: {file}");
    assert!(err.starts_with(&want), "{err:?} should start with {want:?}");
    assert!(stdout(o).is_empty(), "nothing on stdout: {}", stdout(o));
    err
}

const DAEMON_JSON: &str = r#"{
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m"},
  "runtimes": {
    "nvidia": {
      "path": "nvidia-container-runtime",
      "runtimeArgs": []
    }
  }
}
"#;

const CONTAINERD_TOML: &str = r#"# containerd, configured by hand
version = 2
root = "/var/lib/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

# CRI
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"#;

#[test]
fn install_all_engines_then_uninstall_gives_back_the_original_bytes() {
    let env = Env::new();
    env.put("/etc/docker/daemon.json", DAEMON_JSON);
    env.put("/etc/containerd/config.toml", CONTAINERD_TOML);
    env.put(
        "/etc/containers/oci/hooks.d/10-other.json",
        "{\"other\": true}\n",
    );
    let before = env.snapshot();

    let out = ok(&env.run("install", &["--engine", ALL]));
    assert!(out.contains("kill -HUP $(pidof dockerd)"), "{out}");
    assert!(
        out.contains("docker run --runtime=cuslice -e CUSLICE_MEMORY_LIMIT=8GiB"),
        "{out}"
    );
    assert!(out.contains("systemctl restart containerd"), "{out}");
    assert!(out.contains("systemctl restart crio"), "{out}");
    assert!(out.contains("--device cuslice.io/slice=default"), "{out}");

    // Binaries and library, with their modes.
    for (f, mode) in [
        ("/usr/local/bin/cuslice-hook", 0o755),
        ("/usr/local/bin/cuslice-runtime", 0o755),
        ("/usr/local/bin/cuslice", 0o755),
        ("/usr/local/lib/cuslice/libcuslice.so", 0o644),
        ("/usr/local/lib/cuslice/libcuslice_core.so", 0o644),
    ] {
        let m = fs::metadata(env.path(f)).expect(f).permissions().mode() & 0o7777;
        assert_eq!(m, mode, "{f}");
    }
    assert_eq!(
        env.get("/usr/local/bin/cuslice-hook"),
        "fake cuslice-hook\n"
    );

    // docker: the runtime added after nvidia, everything else as it was.
    assert_eq!(
        env.get("/etc/docker/daemon.json"),
        DAEMON_JSON.replace(
            "      \"runtimeArgs\": []\n    }\n",
            "      \"runtimeArgs\": []\n    },\n    \"cuslice\": {\n      \"path\": \"/usr/local/bin/cuslice-runtime\"\n    }\n"
        )
    );
    // containerd: one line added to config.toml; the drop-in declares the runtime.
    assert_eq!(
        env.get("/etc/containerd/config.toml"),
        CONTAINERD_TOML.replace(
            "root = \"/var/lib/containerd\"\n",
            "root = \"/var/lib/containerd\"\nimports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n"
        )
    );
    let dropin = env.get("/etc/containerd/conf.d/cuslice.toml");
    assert!(dropin.contains("version = 2\n"), "{dropin}");
    assert!(
        dropin.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice]\n  runtime_type = \"io.containerd.runc.v2\"\n"
        ),
        "{dropin}"
    );
    assert!(
        dropin.contains("  BinaryName = \"/usr/local/bin/cuslice-runtime\"\n"),
        "{dropin}"
    );
    assert!(
        dropin.contains("SystemdCgroup = true"),
        "the CRI section is carried: {dropin}"
    );
    // podman, crio, cdi.
    let hook: serde_json::Value =
        serde_json::from_str(&env.get("/etc/containers/oci/hooks.d/50-cuslice-createruntime.json"))
            .expect("json");
    assert_eq!(hook["stages"], serde_json::json!(["createRuntime"]));
    assert_eq!(hook["when"]["always"], true);
    assert_eq!(hook["hook"]["path"], "/usr/local/bin/cuslice-hook");
    let post: serde_json::Value =
        serde_json::from_str(&env.get("/etc/containers/oci/hooks.d/50-cuslice-poststop.json"))
            .expect("json");
    assert_eq!(
        post["hook"]["args"],
        serde_json::json!([
            "cuslice-hook",
            "poststop",
            "--library",
            "/usr/local/lib/cuslice/libcuslice.so"
        ])
    );
    let crio = env.get("/etc/crio/crio.conf.d/50-cuslice.conf");
    assert!(crio.contains("[crio.runtime.runtimes.cuslice]\nruntime_path = \"/usr/local/bin/cuslice-runtime\"\nruntime_type = \"oci\"\n"), "{crio}");
    let cdi: serde_json::Value =
        serde_json::from_str(&env.get("/etc/cdi/cuslice.json")).expect("json");
    assert_eq!(cdi["kind"], "cuslice.io/slice");
    assert_eq!(
        cdi["devices"][0]["containerEdits"]["hooks"][1]["hookName"],
        "poststop"
    );

    // No path written into a configuration carries the --root prefix.
    let root = env.root.to_string_lossy().into_owned();
    for (p, bytes) in env.snapshot() {
        if p.starts_with("etc") {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&root),
                "{} names the root",
                p.display()
            );
        }
    }

    // Idempotent.
    let installed = env.snapshot();
    let out = ok(&env.run("install", &["--engine", ALL]));
    assert!(out.contains("already installed: nothing to do"), "{out}");
    assert_eq!(env.snapshot(), installed);

    // The inverse.
    ok(&env.run("uninstall", &["--engine", ALL]));
    assert_eq!(env.snapshot(), before);
    let out = ok(&env.run("uninstall", &["--engine", ALL]));
    assert!(out.contains("not installed: nothing to do"), "{out}");
    assert_eq!(env.snapshot(), before);
}

#[test]
fn missing_configs_are_created_and_removed_again() {
    let env = Env::new();
    ok(&env.run(
        "install",
        &["--engine", "docker,containerd", "--default-runtime"],
    ));
    assert_eq!(
        env.get("/etc/docker/daemon.json"),
        "{\n  \"runtimes\": {\n    \"cuslice\": {\n      \"path\": \"/usr/local/bin/cuslice-runtime\"\n    }\n  },\n  \"default-runtime\": \"cuslice\"\n}\n"
    );
    let main = env.get("/etc/containerd/config.toml");
    assert!(
        main.contains("version = 2\nimports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n"),
        "{main}"
    );
    ok(&env.run("uninstall", &["--engine", "docker,containerd"]));
    assert!(env.snapshot().is_empty(), "{:?}", env.snapshot().keys());
}

#[test]
fn docker_tabs_and_four_spaces_keep_their_indentation() {
    for (before, after) in [
        (
            "{\n\t\"debug\": true\n}\n",
            "{\n\t\"debug\": true,\n\t\"runtimes\": {\n\t\t\"cuslice\": {\n\t\t\t\"path\": \"/opt/cs/bin/cuslice-runtime\"\n\t\t}\n\t}\n}\n",
        ),
        (
            "{\n    \"debug\": true\n}",
            "{\n    \"debug\": true,\n    \"runtimes\": {\n        \"cuslice\": {\n            \"path\": \"/opt/cs/bin/cuslice-runtime\"\n        }\n    }\n}",
        ),
    ] {
        let env = Env::new();
        env.put("/etc/docker/daemon.json", before);
        ok(&env.run("install", &["--engine", "docker", "--prefix", "/opt/cs"]));
        assert_eq!(env.get("/etc/docker/daemon.json"), after);
        assert!(env.exists("/opt/cs/bin/cuslice-runtime"));
        ok(&env.run("uninstall", &["--engine", "docker", "--prefix", "/opt/cs"]));
        assert_eq!(env.get("/etc/docker/daemon.json"), before);
        assert!(!env.exists("/opt/cs/bin/cuslice-runtime"));
    }
}

#[test]
fn containerd_glob_import_and_version_3() {
    let env = Env::new();
    let glob = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
    env.put("/etc/containerd/config.toml", glob);
    let out = ok(&env.run("install", &["--engine", "containerd"]));
    assert!(
        out.contains("config.toml: already installed, no change"),
        "{out}"
    );
    assert_eq!(env.get("/etc/containerd/config.toml"), glob);
    assert!(env.exists("/etc/containerd/conf.d/cuslice.toml"));
    ok(&env.run("uninstall", &["--engine", "containerd"]));
    assert_eq!(env.get("/etc/containerd/config.toml"), glob);
    assert!(!env.exists("/etc/containerd/conf.d/cuslice.toml"));

    let env = Env::new();
    let v3 =
        "version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n";
    env.put("/etc/containerd/config.toml", v3);
    ok(&env.run("install", &["--engine", "containerd"]));
    let dropin = env.get("/etc/containerd/conf.d/cuslice.toml");
    assert!(dropin.contains("version = 3\n"), "{dropin}");
    assert!(
        dropin.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.cuslice]"),
        "{dropin}"
    );
    ok(&env.run("uninstall", &["--engine", "containerd"]));
    assert_eq!(env.get("/etc/containerd/config.toml"), v3);
}

#[test]
fn dry_run_writes_nothing_and_prints_diffs() {
    let env = Env::new();
    env.put("/etc/docker/daemon.json", DAEMON_JSON);
    env.put("/etc/containerd/config.toml", CONTAINERD_TOML);
    let before = env.snapshot();
    let out = ok(&env.run("install", &["--engine", ALL, "--dry-run"]));
    assert_eq!(env.snapshot(), before);
    let daemon = env.path("/etc/docker/daemon.json").display().to_string();
    assert!(
        out.contains(&format!("--- {daemon}\n+++ {daemon}\n")),
        "{out}"
    );
    assert!(out.contains("+    \"cuslice\": {\n"), "{out}");
    assert!(
        out.contains("+imports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n"),
        "{out}"
    );
    assert!(out.contains("--- /dev/null\n"), "{out}");
    assert!(out.contains("cuslice-hook: would install from"), "{out}");
    assert!(out.ends_with("dry run: nothing written\n"), "{out}");

    // Installed: a dry run says "no change"; a dry uninstall shows the removal.
    ok(&env.run("install", &["--engine", "docker"]));
    let installed = env.snapshot();
    let out = ok(&env.run("install", &["--engine", "docker", "--dry-run"]));
    assert!(out.contains(&format!("{daemon}: no change")), "{out}");
    let out = ok(&env.run("uninstall", &["--engine", "docker", "--dry-run"]));
    assert!(out.contains("-    \"cuslice\": {\n"), "{out}");
    assert!(out.contains("cuslice-hook: would remove"), "{out}");
    assert_eq!(env.snapshot(), installed);
}

#[test]
fn refusals_leave_every_file_untouched() {
    let cases: &[(&str, &str, &str, &str)] = &[
        // (engine list, file, contents, what the line says)
        (
            "docker,podman",
            "/etc/docker/daemon.json",
            "{\n  \"debug\": true,\n}\n",
            "not valid JSON",
        ),
        (
            "docker",
            "/etc/docker/daemon.json",
            "[]\n",
            "top level is not a JSON object",
        ),
        (
            "docker",
            "/etc/docker/daemon.json",
            "{\"runtimes\": [\"x\"]}",
            "\"runtimes\" is not an object",
        ),
        (
            "docker",
            "/etc/docker/daemon.json",
            "{\"runtimes\": {\"cuslice\": {\"path\": \"/opt/other/bin/cuslice-runtime\"}}}",
            "runtimes.cuslice already points to /opt/other/bin/cuslice-runtime",
        ),
        (
            "podman,containerd",
            "/etc/containerd/config.toml",
            "version = 2\n[plugins\n",
            "not valid TOML",
        ),
        (
            "containerd",
            "/etc/containerd/config.toml",
            "[plugins.cri]\n",
            "version 1 config",
        ),
        (
            "containerd",
            "/etc/containerd/config.toml",
            "version = 1\n",
            "`version = 1`",
        ),
        (
            "containerd",
            "/etc/containerd/config.toml",
            "version = 2\nimports = \"/x.toml\"\n",
            "`imports` (line 2 column 11) is not an array of strings",
        ),
    ];
    for &(engines, file, text, want) in cases {
        let env = Env::new();
        env.put(file, text);
        let before = env.snapshot();
        for args in [
            vec!["--engine", engines],
            vec!["--engine", engines, "--dry-run"],
        ] {
            let out = env.run("install", &args);
            let line = refused(&out, "install", &env.path(file).display().to_string());
            assert!(line.contains(want), "{file} {text:?}: {line}");
            assert!(line.contains("; "), "says what would work: {line}");
            assert_eq!(env.snapshot(), before, "{line}");
        }
    }
    // Line and column from the JSON parser.
    let env = Env::new();
    env.put("/etc/docker/daemon.json", "{\n  \"debug\": true,\n}\n");
    let line = refused(
        &env.run("install", &["--engine", "docker"]),
        "install",
        &env.path("/etc/docker/daemon.json").display().to_string(),
    );
    assert!(line.contains("line 3 column 1"), "{line}");
    assert!(line.contains("uninstall") || line.contains("fix"), "{line}");
    // The other-path refusal says what would resolve it.
    let env = Env::new();
    env.put(
        "/etc/docker/daemon.json",
        "{\"runtimes\": {\"cuslice\": {\"path\": \"/opt/other/bin/cuslice-runtime\"}}}",
    );
    let line = refused(
        &env.run("install", &["--engine", "docker"]),
        "install",
        &env.path("/etc/docker/daemon.json").display().to_string(),
    );
    assert!(
        line.contains("cuslice uninstall --engine docker --prefix /opt/other"),
        "{line}"
    );
    assert!(line.contains("--name"), "{line}");
    // Uninstall refuses to remove an entry that is not its own.
    let before = env.snapshot();
    let line = refused(
        &env.run("uninstall", &["--engine", "docker"]),
        "uninstall",
        &env.path("/etc/docker/daemon.json").display().to_string(),
    );
    assert!(line.contains("--prefix /opt/other"), "{line}");
    assert_eq!(env.snapshot(), before);
}

#[test]
fn missing_sources_are_refused_before_anything_changes() {
    let env = Env::new();
    env.put("/etc/docker/daemon.json", DAEMON_JSON);
    fs::remove_file(env.from.join("libcuslice.so")).expect("rm");
    fs::remove_file(env.from.join("cuslice-runtime")).expect("rm");
    let before = env.snapshot();
    let out = env.run("install", &["--engine", "docker"]);
    let missing = env.from.join("cuslice-runtime").display().to_string();
    let line = refused(&out, "install", &missing);
    assert!(line.contains("libcuslice.so"), "{line}");
    assert!(line.contains("cargo build --release"), "{line}");
    assert!(line.contains("--from DIR"), "{line}");
    assert_eq!(env.snapshot(), before);
}

#[test]
fn default_from_is_the_executables_directory() {
    let env = Env::new();
    let bin = env.from.join("cuslice");
    fs::copy(BIN, &bin).expect("copy the command");
    // A test thread that forks while the copy is still open for writing holds that descriptor
    // until it execs, and exec of the copy meanwhile fails with ETXTBSY: try again.
    let out = loop {
        match Command::new(&bin)
            .args(["install", "--engine", "cdi", "--root"])
            .arg(&env.root)
            .output()
        {
            Err(e) if e.raw_os_error() == Some(26) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => break r.expect("run"),
        }
    };
    ok(&out);
    assert_eq!(
        env.get("/usr/local/bin/cuslice-hook"),
        "fake cuslice-hook\n"
    );
    // The command itself is installed stripped where objcopy is there (tests/strip.rs), as it
    // is otherwise.
    let installed = fs::read(env.path("/usr/local/bin/cuslice")).expect("read");
    assert!(
        installed == fs::read(BIN).expect("read")
            || env.exists("/usr/local/bin/.debug/cuslice.debug"),
        "cuslice was neither copied as built nor stripped with its debug info beside it"
    );
    // Run from PREFIX/bin once installed: the library is found in PREFIX/lib/cuslice.
    let installed = env.path("/usr/local/bin/cuslice");
    let out = Command::new(&installed)
        .args(["install", "--engine", "cdi", "--root"])
        .arg(&env.root)
        .output()
        .expect("run");
    assert!(ok(&out).contains("already installed: nothing to do"));
}

#[test]
fn uninstall_keeps_files_on_request_or_while_registered_elsewhere() {
    let env = Env::new();
    ok(&env.run("install", &["--engine", "podman,crio"]));
    let out = ok(&env.run("uninstall", &["--engine", "podman"]));
    assert!(out.contains("still registered with crio"), "{out}");
    assert!(env.exists("/usr/local/bin/cuslice-hook"));
    assert!(!env.exists("/etc/containers/oci/hooks.d/50-cuslice-poststop.json"));
    ok(&env.run("uninstall", &["--engine", "crio", "--keep-files"]));
    assert!(!env.exists("/etc/crio/crio.conf.d/50-cuslice.conf"));
    assert!(env.exists("/usr/local/lib/cuslice/libcuslice.so"));
    ok(&env.run("uninstall", &["--engine", "crio"]));
    assert!(!env.exists("/usr/local/lib/cuslice/libcuslice.so"));
    assert!(!env.exists("/usr/local/lib/cuslice/libcuslice_core.so"));
    assert!(!env.exists("/usr/local/bin/cuslice"));
}

#[test]
fn config_overrides_and_names() {
    let env = Env::new();
    ok(&env.run(
        "install",
        &[
            "--engine",
            "podman",
            "--config",
            "/opt/hooks",
            "--name",
            "slice2",
        ],
    ));
    assert!(env.exists("/opt/hooks/50-slice2-createruntime.json"));
    assert!(env.exists("/opt/hooks/50-slice2-poststop.json"));
    ok(&env.run(
        "install",
        &[
            "--engine",
            "containerd",
            "--config",
            "/srv/ctd/config.toml",
            "--name",
            "slice2",
        ],
    ));
    assert!(
        env.get("/srv/ctd/config.toml")
            .contains("imports = [\"/srv/ctd/conf.d/slice2.toml\"]")
    );
    assert!(
        env.get("/srv/ctd/conf.d/slice2.toml")
            .contains("runtimes.slice2]")
    );
    ok(&env.run("install", &["--engine", "cdi", "--name", "slice2"]));
    assert!(
        env.get("/etc/cdi/slice2.json")
            .contains("\"name\": \"slice2\"")
    );
    ok(&env.run(
        "uninstall",
        &[
            "--engine",
            "podman",
            "--config",
            "/opt/hooks",
            "--name",
            "slice2",
            "--keep-files",
        ],
    ));
    assert!(!env.exists("/opt/hooks/50-slice2-poststop.json"));
}

#[test]
fn edits_keep_mode_and_follow_links() {
    let env = Env::new();
    env.put("/srv/docker/daemon.json", "{\n  \"debug\": true\n}\n");
    fs::set_permissions(
        env.path("/srv/docker/daemon.json"),
        fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    fs::create_dir_all(env.path("/etc/docker")).expect("mkdir");
    std::os::unix::fs::symlink(
        "/srv/docker/daemon.json",
        env.path("/etc/docker/daemon.json"),
    )
    .expect("link");
    ok(&env.run("install", &["--engine", "docker"]));
    let meta = fs::symlink_metadata(env.path("/etc/docker/daemon.json")).expect("meta");
    assert!(meta.file_type().is_symlink(), "the link stays a link");
    assert!(
        env.get("/srv/docker/daemon.json")
            .contains("cuslice-runtime")
    );
    let mode = fs::metadata(env.path("/srv/docker/daemon.json"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
    // No temporary files left behind.
    let names: Vec<_> = fs::read_dir(env.path("/srv/docker"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["daemon.json"]);
}

#[test]
fn bad_arguments() {
    let env = Env::new();
    let out = env.run("install", &["--engine", "lxc"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for e in ["docker", "containerd", "podman", "crio", "cdi"] {
        assert!(err.contains(e), "clap lists the engines: {err}");
    }
    let out = env.run("install", &["--engine", "docker", "--prefix", "usr/local"]);
    let line = refused(&out, "install", "--prefix");
    assert!(line.contains("absolute"), "{line}");
    let out = env.run("install", &["--engine", "docker", "--name", "a b"]);
    refused(&out, "install", "--name");
    let out = env.run(
        "install",
        &["--engine", "docker,cdi", "--config", "/x.json"],
    );
    refused(&out, "install", "--config");
    assert!(env.snapshot().is_empty());
}

// ---- the node agent's unit ------------------------------------------------------------------

const UNIT: &str = "/etc/systemd/system/cuslice-agent.service";
const WANTS: &str = "/etc/systemd/system/multi-user.target.wants/cuslice-agent.service";

/// A target root where systemd runs: /run/systemd/system exists (sd_booted(3)).
fn systemd_env() -> Env {
    let env = Env::new();
    fs::create_dir_all(env.path("/run/systemd/system")).expect("mkdir");
    env
}

#[test]
fn the_agent_is_installed_as_a_systemd_unit_and_removed_with_the_last_engine() {
    let env = systemd_env();
    let before = env.snapshot();

    // A dry run shows the unit as a diff and writes nothing.
    let out = ok(&env.run("install", &["--engine", "podman", "--dry-run"]));
    let unit_path = env.path(UNIT).display().to_string();
    assert!(
        out.contains(&format!("--- /dev/null\n+++ {unit_path}\n")),
        "{out}"
    );
    assert!(
        out.contains(
            "+ExecStart=/usr/local/bin/cuslice agent --enforce stop $CUSLICE_AGENT_ARGS\n"
        ),
        "{out}"
    );
    assert_eq!(env.snapshot(), before);

    let out = ok(&env.run("install", &["--engine", "podman,crio"]));
    assert!(out.contains(&format!("{unit_path}: created")), "{out}");
    // Under --root the target's systemd is not reached: the line says what to run there.
    assert!(
        out.contains(&format!(
            "agent: systemctl not run under --root {}; on the target system run: systemctl daemon-reload && systemctl enable --now cuslice-agent.service",
            env.root.display()
        )),
        "{out}"
    );
    let unit = env.get(UNIT);
    // systemd restarts the agent 2 s after it exits, however it exits and however often: the
    // next agent thaws what a killed one left frozen as it starts.
    for line in [
        "ExecStart=/usr/local/bin/cuslice agent --enforce stop $CUSLICE_AGENT_ARGS\n",
        "Restart=always\n",
        "RestartSec=2\n",
        "StartLimitIntervalSec=0\n",
        "EnvironmentFile=-/etc/default/cuslice-agent\n",
        "WantedBy=multi-user.target\n",
    ] {
        assert!(unit.contains(line), "{line:?} in\n{unit}");
    }
    let mode = fs::metadata(env.path(UNIT))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o644);

    // Idempotent.
    let installed = env.snapshot();
    let out = ok(&env.run("install", &["--engine", "podman,crio"]));
    assert!(
        out.contains(&format!("{unit_path}: already installed, no change")),
        "{out}"
    );
    assert_eq!(env.snapshot(), installed);

    // What `systemctl enable` makes on the target, by hand (systemd does not run here).
    fs::create_dir_all(env.path(WANTS).parent().expect("dir")).expect("mkdir");
    std::os::unix::fs::symlink(UNIT, env.path(WANTS)).expect("link");

    // The agent serves every engine: it stays while one is still registered.
    let out = ok(&env.run("uninstall", &["--engine", "podman"]));
    assert!(
        out.contains(
            "kept the agent (cuslice-agent.service): cuslice is still registered with crio"
        ),
        "{out}"
    );
    assert!(env.exists(UNIT));
    // --keep-files keeps PREFIX's files; the agent's unit is a registration and goes.
    let out = ok(&env.run("uninstall", &["--engine", "crio", "--keep-files"]));
    assert!(out.contains(&format!("{unit_path}: removed")), "{out}");
    assert!(
        out.contains("systemctl stop cuslice-agent.service"),
        "{out}"
    );
    assert!(!env.exists(UNIT));
    assert!(
        fs::symlink_metadata(env.path(WANTS)).is_err(),
        "the link went too"
    );
    assert!(env.exists("/usr/local/bin/cuslice"));
    ok(&env.run("uninstall", &["--engine", "crio"]));
    assert_eq!(env.snapshot(), before);
}

#[test]
fn without_systemd_install_says_how_to_start_the_agent() {
    let env = Env::new();
    let line = format!(
        "agent: systemd does not run this system (no /run/systemd/system under --root {}), so no unit was installed: start `/usr/local/bin/cuslice agent --enforce stop` as root at boot",
        env.root.display()
    );
    // Said by a dry run too: it is what the plan leaves out.
    let out = ok(&env.run("install", &["--engine", "cdi", "--dry-run"]));
    assert!(out.contains(&line), "{out}");
    let out = ok(&env.run("install", &["--engine", "cdi"]));
    assert!(out.contains(&line), "{out}");
    assert!(!env.exists(UNIT));
    assert!(!env.exists("/etc/systemd"));
}

#[test]
fn no_agent_installs_no_unit_and_one_agent_serves_a_node() {
    let env = systemd_env();
    let out = ok(&env.run("install", &["--engine", "cdi", "--no-agent"]));
    assert!(!out.contains("agent"), "{out}");
    assert!(!env.exists(UNIT));

    // An agent from another PREFIX: install refuses to replace it, uninstall leaves it.
    let other = "# another installation's\n[Service]\nExecStart=/opt/other/bin/cuslice agent\n";
    env.put(UNIT, other);
    let before = env.snapshot();
    let line = refused(
        &env.run("install", &["--engine", "cdi"]),
        "install",
        &env.path(UNIT).display().to_string(),
    );
    assert!(
        line.contains("already runs /opt/other/bin/cuslice, not /usr/local/bin/cuslice"),
        "{line}"
    );
    assert!(line.contains("--no-agent"), "{line}");
    assert_eq!(env.snapshot(), before);
    ok(&env.run("install", &["--engine", "cdi", "--no-agent"]));
    let out = ok(&env.run("uninstall", &["--engine", "cdi"]));
    assert!(out.contains("it runs /opt/other/bin/cuslice"), "{out}");
    assert_eq!(env.get(UNIT), other);
}

/// systemd's own check of the unit: every key known, the command executable. Where
/// systemd-analyze is installed (systemd need not run).
#[test]
fn systemd_analyze_accepts_the_unit() {
    let env = systemd_env();
    ok(&env.run(
        "install",
        &["--engine", "cdi", "--prefix", "/opt/cuslice 1"],
    ));
    let unit = env.get(UNIT);
    assert!(
        unit.contains(
            "ExecStart=\"/opt/cuslice 1/bin/cuslice\" agent --enforce stop $CUSLICE_AGENT_ARGS\n"
        ),
        "{unit}"
    );
    // The command as it lies under the scratch root, so that the check finds it.
    let here = env.path("/opt/cuslice 1/bin/cuslice").display().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("cuslice-agent.service");
    fs::write(
        &copy,
        unit.replace("\"/opt/cuslice 1/bin/cuslice\"", &format!("\"{here}\"")),
    )
    .expect("write");
    match Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
    {
        Err(e) => eprintln!("skipped: no systemd-analyze ({e})"),
        Ok(o) => {
            assert!(
                o.status.success() && o.stderr.is_empty(),
                "systemd-analyze verify: {}{}",
                stdout(&o),
                stderr(&o)
            );
        }
    }
}

/// What `--help` says matches what the commands do: the agent's default enforcement by hand and
/// the service install sets up; uninstall's engines are those it removes cuslice from.
#[test]
fn help_says_what_the_commands_do() {
    let help = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().expect("run cuslice");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let agent = help(&["agent", "--help"]);
    assert!(agent.contains("[default: report]"), "{agent}");
    assert!(
        agent.contains("the service `cuslice install` sets up runs `--enforce stop`"),
        "{agent}"
    );
    let install = help(&["install", "--help"]);
    assert!(
        install.contains("`cuslice agent --enforce stop`"),
        "{install}"
    );
    let uninstall = help(&["uninstall", "--help"]);
    assert!(
        uninstall.contains("uninstall removes it from them"),
        "{uninstall}"
    );
    assert!(
        !uninstall.contains("engine to register with"),
        "{uninstall}"
    );
}
