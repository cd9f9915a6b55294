//! `cuslice install --engine slurm` under a `--root` in a temporary directory: the SPANK plugin
//! installed beside the library, one line added to Slurm's plugstack file (where slurm.conf says
//! it is), a second install that changes nothing, and an uninstall that gives back every file
//! byte for byte, whether the plugstack file was there before or not. Refusals (no plugin, a
//! plugin of another Slurm release or of none, GresTypes without shard, a plugstack path that
//! is a directory) write nothing.
//!
//! The plugin here is a stand-in built with the C compiler that exports what the real one does
//! (`plugin_name`, `plugin_type`, `plugin_version`), and `slurmd` is a script on PATH that says
//! which release it is, so the outcome is the same on any machine. One test uses the real
//! plugin and the real slurmd where both are there.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");
const LINE: &str =
    "required /usr/local/lib/cuslice/cuslice_spank.so hook=/usr/local/bin/cuslice-hook";
const PLUGIN: &str = "/usr/local/lib/cuslice/cuslice_spank.so";
/// Slurm 22.05.8's SLURM_VERSION_NUMBER.
const V22_05: u32 = 0x16_05_08;

struct Env {
    dir: tempfile::TempDir,
    root: PathBuf,
    from: PathBuf,
    /// Holds the stand-in `slurmd`, first on PATH.
    fake_bin: PathBuf,
}

/// Builds a shared object exporting a SPANK plugin's symbols with `plugin_version = version`.
fn stand_in_plugin(dir: &Path, out: &Path, version: &str) -> bool {
    let src = dir.join(format!("spank-{}.c", std::process::id()));
    fs::write(
        &src,
        format!(
            "const char plugin_name[] = \"cuslice\";\n\
             const char plugin_type[] = \"spank\";\n\
             const unsigned int plugin_version = {version};\n\
             extern int spank_get_item(void);\n\
             int slurm_spank_init(void) {{ return spank_get_item(); }}\n"
        ),
    )
    .expect("write");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&src)
        .status();
    built.is_ok_and(|s| s.success())
}

impl Env {
    /// None (after a skip line) where there is no C compiler to build the stand-in plugin.
    fn new() -> Option<Env> {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let from = dir.path().join("from");
        let fake_bin = dir.path().join("fake-bin");
        for d in [&root, &from, &fake_bin] {
            fs::create_dir_all(d).expect("mkdir");
        }
        for f in [
            "cuslice-hook",
            "cuslice-runtime",
            "cuslice",
            "libcuslice.so",
            "libcuslice_core.so",
        ] {
            fs::write(from.join(f), format!("fake {f}\n")).expect("write artefact");
        }
        if !stand_in_plugin(
            dir.path(),
            &from.join("libcuslice_spank.so"),
            &V22_05.to_string(),
        ) {
            let why = "skipped: no C compiler to build a stand-in SPANK plugin";
            // The test command installs one: there, a missing compiler is a failure.
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            return None;
        }
        let env = Env {
            dir,
            root,
            from,
            fake_bin,
        };
        env.slurmd("slurm 22.05.8");
        Some(env)
    }

    /// The `slurmd` on PATH: `slurmd -V` prints `says`.
    fn slurmd(&self, says: &str) {
        let p = self.fake_bin.join("slurmd");
        fs::write(&p, format!("#!/bin/sh\necho '{says}'\n")).expect("write");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
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

    /// `cuslice CMD --root ROOT [--from FROM] ARGS`, with the stand-in slurmd first on PATH.
    fn run(&self, cmd: &str, args: &[&str]) -> Output {
        self.run_env(cmd, args, &[])
    }

    fn run_env(&self, cmd: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let path = format!(
            "{}:{}",
            self.fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new(BIN);
        c.arg(cmd).arg("--root").arg(&self.root);
        if cmd == "install" {
            c.arg("--from").arg(&self.from);
        }
        c.args(["--engine", "slurm"])
            .args(args)
            .env("PATH", path)
            .env_remove("SLURM_CONF")
            .envs(env.iter().copied());
        c.output().expect("run cuslice")
    }

    /// Every file under the root (path relative to it, bytes).
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            let Ok(rd) = fs::read_dir(dir) else { return };
            for e in rd {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    let rel = p.strip_prefix(base).expect("under root").to_path_buf();
                    out.insert(rel, fs::read(&p).expect("read"));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut out);
        out
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", text(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit code 2 and one line on stderr that starts with `cuslice CMD: FILE: `; returns the line.
#[track_caller]
fn refused(o: &Output, cmd: &str, file: &Path) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let want = format!("cuslice {cmd}: {}: ", file.display());
    assert!(err.starts_with(&want), "{err:?} should start with {want:?}");
    assert!(o.stdout.is_empty(), "{}", text(o));
    err
}

/// dry run, install, install again, uninstall: the plugstack file at `plugstack` (a target
/// path) gets LINE, and everything under the root is as before at the end.
fn round_trip(env: &Env, plugstack: &str, extra: &[&str], vars: &[(&str, &str)]) {
    let before = env.snapshot();
    let args: Vec<&str> = ["--no-agent"].iter().chain(extra).copied().collect();

    let dry = ok(&env.run_env("install", &[&args[..], &["--dry-run"]].concat(), vars));
    assert!(dry.contains(&format!("+{LINE}\n")), "{dry}");
    assert!(
        dry.contains(&format!(
            "{}: would install from {} (",
            env.path(PLUGIN).display(),
            env.from.join("libcuslice_spank.so").display()
        )),
        "{dry}"
    );
    assert!(dry.ends_with("dry run: nothing written\n"), "{dry}");
    assert_eq!(env.snapshot(), before, "a dry run writes nothing");

    let out = ok(&env.run_env("install", &args, vars));
    assert!(
        out.contains("slurm: restart slurmd to load the plugin"),
        "{out}"
    );
    let stack = env.get(plugstack);
    assert_eq!(
        stack.lines().filter(|l| *l == LINE).count(),
        1,
        "{plugstack}: {stack}"
    );
    let plugin = env.path(PLUGIN);
    let mode = fs::metadata(&plugin).expect("plugin").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644);
    assert_eq!(
        fs::read(&plugin).expect("read"),
        fs::read(env.from.join("libcuslice_spank.so")).expect("read"),
        "a plugin without debug info is installed as it is"
    );

    let installed = env.snapshot();
    let again = ok(&env.run_env("install", &args, vars));
    assert!(
        again.contains("already installed: nothing to do for slurm"),
        "{again}"
    );
    assert!(
        !again.contains("restart slurmd"),
        "nothing changed, nothing to restart: {again}"
    );
    assert_eq!(
        env.snapshot(),
        installed,
        "a second install changes nothing"
    );

    let dry = ok(&env.run_env("uninstall", &[extra, &["--dry-run"]].concat(), vars));
    assert!(dry.contains(&format!("-{LINE}\n")), "{dry}");
    assert_eq!(env.snapshot(), installed, "a dry run writes nothing");

    let out = ok(&env.run_env("uninstall", extra, vars));
    assert!(
        out.contains(&format!("{}: removed", plugin.display()))
            && out.contains("slurm: restart slurmd to unload the plugin"),
        "{out}"
    );
    assert_eq!(
        env.snapshot(),
        before,
        "uninstall gives back every file byte for byte"
    );
    let again = ok(&env.run_env("uninstall", extra, vars));
    assert!(
        again.contains("not installed: nothing to do for slurm"),
        "{again}"
    );
    assert!(
        !again.contains("restart slurmd"),
        "nothing changed, nothing to restart: {again}"
    );
}

#[test]
fn an_existing_plugstack_file_gets_one_line_and_gets_it_back() {
    let Some(env) = Env::new() else { return };
    env.put(
        "/etc/slurm/plugstack.conf",
        "# site plugins\ninclude /etc/slurm/plugstack.conf.d/*.conf\noptional /usr/lib/x.so a=1",
    );
    env.put(
        "/etc/slurm/slurm.conf",
        "ClusterName=c\nGresTypes=gpu,shard\nNodeName=n Gres=gpu:1,shard:8\n",
    );
    env.put(
        "/etc/slurm/gres.conf",
        "Name=gpu File=/dev/nvidia0\nName=shard Count=8\n",
    );
    round_trip(&env, "/etc/slurm/plugstack.conf", &[], &[]);
}

#[test]
fn a_missing_plugstack_file_is_created_and_removed_again() {
    let Some(env) = Env::new() else { return };
    // No slurm.conf at all: plugstack.conf beside where it would be.
    round_trip(&env, "/etc/slurm/plugstack.conf", &[], &[]);
    assert!(!env.path("/etc/slurm/plugstack.conf").exists());
    // slurm.conf without PlugStackConfig: the same.
    env.put("/etc/slurm/slurm.conf", "ClusterName=c\n");
    round_trip(&env, "/etc/slurm/plugstack.conf", &[], &[]);
}

#[test]
fn plugstack_config_slurm_conf_and_config_name_the_file() {
    let Some(env) = Env::new() else { return };
    // SLURM_CONF names slurm.conf; its PlugStackConfig (any case) names the plugstack file.
    env.put(
        "/opt/slurm/etc/slurm.conf",
        "ClusterName=c\nplugstackconfig=/opt/slurm/etc/spank.conf\n",
    );
    env.put(
        "/opt/slurm/etc/spank.conf",
        "include /opt/slurm/etc/spank.d/*\n",
    );
    let vars = [("SLURM_CONF", "/opt/slurm/etc/slurm.conf")];
    round_trip(&env, "/opt/slurm/etc/spank.conf", &[], &vars);
    // --config names it outright.
    round_trip(
        &env,
        "/srv/plugstack.conf",
        &["--config", "/srv/plugstack.conf"],
        &[],
    );
    // Another prefix: another line; uninstall of one leaves the other's.
    let o = env.run("install", &["--no-agent", "--prefix", "/opt/c"]);
    ok(&o);
    let first = env.get("/etc/slurm/plugstack.conf");
    let o = env.run("install", &["--no-agent"]);
    let err = refused(&o, "install", &env.path("/etc/slurm/plugstack.conf"));
    assert!(
        err.contains("already loads /opt/c/lib/cuslice/cuslice_spank.so (line 2)")
            && err.contains("`cuslice uninstall --engine slurm --prefix /opt/c`"),
        "{err}"
    );
    assert_eq!(env.get("/etc/slurm/plugstack.conf"), first);
    ok(&env.run("uninstall", &["--prefix", "/opt/c"]));
    assert!(!env.path("/etc/slurm/plugstack.conf").exists());
}

#[test]
fn refusals_write_nothing() {
    let Some(env) = Env::new() else { return };
    env.put(
        "/etc/slurm/plugstack.conf",
        "include /etc/slurm/plugstack.conf.d/*.conf\n",
    );
    let before = env.snapshot();
    let plugin = env.from.join("libcuslice_spank.so");

    // slurmd of another release.
    env.slurmd("slurm 23.02.1");
    let err = refused(&env.run("install", &[]), "install", &plugin);
    assert_eq!(
        err.trim_end(),
        format!(
            "cuslice install: {}: was built for Slurm 22.05 but this node's slurmd is 23.02 \
             (slurmd -V); slurmd refuses to start with a SPANK plugin of another release: build \
             cuslice where Slurm 23.02's headers are installed (libslurm-dev) and install again",
            plugin.display()
        )
    );
    // The dry run refuses what install would.
    refused(&env.run("install", &["--dry-run"]), "install", &plugin);
    env.slurmd("slurm-wlm 22.05.8");

    // A plugin built without Slurm's headers.
    assert!(stand_in_plugin(env.dir.path(), &plugin, "0"));
    let err = refused(&env.run("install", &[]), "install", &plugin);
    assert!(err.contains("its plugin_version is 0"), "{err}");
    assert!(err.contains("Slurm 22.05's headers"), "{err}");
    // Not a SPANK plugin at all.
    fs::write(&plugin, "fake libcuslice_spank.so\n").expect("write");
    let err = refused(&env.run("install", &[]), "install", &plugin);
    assert!(err.contains("not cuslice's SPANK plugin"), "{err}");
    // None.
    fs::remove_file(&plugin).expect("rm");
    let err = refused(&env.run("install", &[]), "install", &plugin);
    assert!(
        err.contains(": missing (the slurm engine installs"),
        "{err}"
    );
    assert!(stand_in_plugin(
        env.dir.path(),
        &plugin,
        &V22_05.to_string()
    ));

    // gres.conf declares shards that GresTypes does not name.
    env.put("/etc/slurm/slurm.conf", "ClusterName=c\nGresTypes=gpu\n");
    env.put("/etc/slurm/gres.conf", "Name=shard Count=4\n");
    let before_conf = env.snapshot();
    let err = refused(
        &env.run("install", &[]),
        "install",
        &env.path("/etc/slurm/slurm.conf"),
    );
    assert!(
        err.contains("GresTypes=gpu (line 2) does not name shard")
            && err.contains("add it (GresTypes=gpu,shard)"),
        "{err}"
    );
    assert_eq!(env.snapshot(), before_conf);

    // PlugStackConfig names a directory.
    env.put(
        "/etc/slurm/slurm.conf",
        "GresTypes=gpu,shard\nPlugStackConfig=/etc/slurm/spank.d\n",
    );
    fs::create_dir_all(env.path("/etc/slurm/spank.d")).expect("mkdir");
    let before_dir = env.snapshot();
    for cmd in ["install", "uninstall"] {
        let err = refused(&env.run(cmd, &[]), cmd, &env.path("/etc/slurm/spank.d"));
        assert!(
            err.contains("is a directory, not a plugstack file (slurm.conf's PlugStackConfig, line 2, names it)"),
            "{err}"
        );
    }
    assert_eq!(env.snapshot(), before_dir);
    fs::remove_file(env.path("/etc/slurm/slurm.conf")).expect("rm");
    fs::remove_file(env.path("/etc/slurm/gres.conf")).expect("rm");
    assert_eq!(env.snapshot(), before);
}

#[test]
fn the_plugin_goes_with_slurm_and_the_files_with_the_last_engine() {
    let Some(env) = Env::new() else { return };
    ok(&env.run("install", &["--no-agent"]));
    let o = Command::new(BIN)
        .arg("install")
        .arg("--root")
        .arg(&env.root)
        .arg("--from")
        .arg(&env.from)
        .args(["--engine", "cdi", "--no-agent"])
        .output()
        .expect("run");
    ok(&o);
    // Slurm goes: its plugin with it; the other files stay for CDI.
    let out = ok(&env.run("uninstall", &[]));
    assert!(!env.path(PLUGIN).exists(), "{out}");
    assert!(out.contains("kept the files under /usr/local"), "{out}");
    assert!(env.path("/usr/local/bin/cuslice-hook").exists());
    // Slurm again; CDI goes: everything stays for Slurm.
    ok(&env.run("install", &["--no-agent"]));
    let o = Command::new(BIN)
        .arg("uninstall")
        .arg("--root")
        .arg(&env.root)
        .args(["--engine", "cdi"])
        .output()
        .expect("run");
    let out = ok(&o);
    assert!(
        out.contains("cuslice is still registered with slurm"),
        "{out}"
    );
    assert!(env.path(PLUGIN).exists());
    ok(&env.run("uninstall", &[]));
    assert!(!env.path(PLUGIN).exists());
    assert!(!env.path("/usr/local/bin/cuslice-hook").exists());
}

/// The workspace's own plugin (target/release/libcuslice_spank.so) against this machine's
/// slurmd, where both are there: it installs, stripped with its debug info beside it.
#[test]
fn the_built_plugin_installs_against_this_slurmd() {
    let Some(env) = Env::new() else { return };
    let built = Path::new(BIN).with_file_name("libcuslice_spank.so");
    let slurmd = ["/usr/sbin/slurmd", "/usr/local/sbin/slurmd"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    let (true, Some(slurmd)) = (built.is_file(), slurmd) else {
        let why = format!(
            "skipped: needs {} (cargo build --release -p cuslice-slurm) and slurmd",
            built.display()
        );
        // The test command builds the plugin and installs slurmd: there, this is a failure.
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("{why}");
        return;
    };
    fs::copy(&built, env.from.join("libcuslice_spank.so")).expect("copy");
    fs::remove_file(env.fake_bin.join("slurmd")).expect("rm");
    std::os::unix::fs::symlink(slurmd, env.fake_bin.join("slurmd")).expect("link");
    let before = env.snapshot();
    let out = ok(&env.run("install", &["--no-agent"]));
    assert!(env.get("/etc/slurm/plugstack.conf").contains(LINE), "{out}");
    let debug = env.path("/usr/local/lib/cuslice/.debug/cuslice_spank.so.debug");
    let stripped = fs::metadata(env.path(PLUGIN)).expect("plugin").len();
    if Command::new("objcopy").arg("--version").output().is_ok() {
        assert!(debug.is_file(), "{out}");
        assert!(
            stripped < fs::metadata(&built).expect("built").len(),
            "{out}"
        );
    }
    ok(&env.run("uninstall", &[]));
    assert_eq!(env.snapshot(), before);
}

/// `cuslice doctor` names the registration and checks the installed plugin against slurmd.
#[test]
fn doctor_checks_the_plugin_against_slurmd() {
    let Some(env) = Env::new() else { return };
    let doctor = |env: &Env| -> Vec<String> {
        let path = format!(
            "{}:{}",
            env.fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = Command::new(BIN)
            .arg("doctor")
            .arg("--root")
            .arg(&env.root)
            .env("PATH", path)
            .env_remove("SLURM_CONF")
            .output()
            .expect("doctor");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("slurm"))
            .map(str::to_owned)
            .collect()
    };
    let lines = doctor(&env);
    assert!(
        lines.contains(
            &"note    engine slurm: not registered; command: cuslice install --engine slurm"
                .to_owned()
        ),
        "{lines:#?}"
    );
    ok(&env.run("install", &["--no-agent"]));
    let lines = doctor(&env);
    for want in [
        "ok      engine slurm: registered",
        "ok      slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: built for Slurm 22.05, \
         this node's slurmd's release",
    ] {
        assert!(lines.contains(&want.to_owned()), "{want}: {lines:#?}");
    }
    env.slurmd("slurm 23.02.1");
    let lines = doctor(&env);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "PROBLEM slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: was built for Slurm \
             22.05 but this node's slurmd is 23.02"
        )),
        "{lines:#?}"
    );
    fs::remove_file(env.path(PLUGIN)).expect("rm");
    let lines = doctor(&env);
    assert!(
        lines.iter().any(|l| l
            .starts_with("PROBLEM slurm plugin /usr/local/lib/cuslice/cuslice_spank.so: missing;")),
        "{lines:#?}"
    );
}
