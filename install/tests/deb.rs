//! The Debian package (install/deb/build, from the release build) installed on this machine with
//! `dpkg -i`, used, and removed with `dpkg -r` and `dpkg -P`:
//!
//! - installed, `cuslice --help` runs from /usr/bin, `dpkg --verify` finds every file as shipped,
//!   and the agent's unit is the one `cuslice install` writes, for /usr/bin/cuslice;
//! - `cuslice install --prefix /usr --no-agent --engine cdi` (what postinst tells the user)
//!   rewrites none of the package's files and registers /etc/cdi/cuslice.json;
//! - where the build has the SPANK plugin, the package holds it, `cuslice install --prefix /usr
//!   --no-agent --engine slurm` registers it without rewriting it, doctor finds it good, and
//!   `dpkg -r` takes the plugstack line out again;
//! - `cuslice doctor`, where the command has it, runs from the package;
//! - removed and purged: every path the package listed is gone (directories too, except those
//!   that were there before), the registration is undone, and dpkg knows nothing of it.
//!
//! Needs root, dpkg and the release build; skipped with one line otherwise, except under `CI`,
//! where it fails. It leaves the machine as it was; it refuses to run where a cuslice package is
//! already installed.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn missing() -> Option<&'static str> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    if !root {
        return Some("needs root (it installs the package with dpkg -i)");
    }
    if !have("dpkg") || !have("dpkg-deb") {
        return Some("needs dpkg (a Debian machine)");
    }
    if !have("objcopy") {
        return Some("needs objcopy (binutils) to strip the package's files");
    }
    None
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn sh(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd).args(args).output().expect(cmd)
}

fn installed() -> bool {
    sh("dpkg-query", &["-W", "-f", "${Status}", "cuslice"])
        .stdout
        .ends_with(b"installed")
}

/// Purges the package if a failed check left it installed.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        if installed() {
            let _ = sh("dpkg", &["--purge", "cuslice"]);
        }
    }
}

#[test]
fn the_package_installs_runs_and_removes_without_a_trace() {
    if let Some(why) = missing() {
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    if sh("dpkg-query", &["-W", "cuslice"]).status.success() {
        assert!(
            std::env::var_os("CI").is_none(),
            "a cuslice package is installed here"
        );
        eprintln!("skipped: a cuslice package is installed here; not touching it");
        return;
    }
    let out_dir = tempfile::tempdir().expect("tempdir");
    let from = cuslice_test_harness::bin_dir();
    let built = ok(&Command::new(Path::new(REPO).join("install/deb/build"))
        .arg("--from")
        .arg(&from)
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .expect("install/deb/build"));
    let deb = built.lines().last().expect("the .deb's path").to_owned();
    println!(
        "{deb}: {} bytes",
        fs::metadata(&deb).expect("the .deb").len()
    );

    // What the package lists, and which of its directories the machine had before.
    let contents = ok(&sh("dpkg-deb", &["-c", &deb]));
    let paths: Vec<String> = contents
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').trim_end_matches('/').to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    let existed: Vec<bool> = paths.iter().map(|p| Path::new(p).exists()).collect();
    for (p, e) in paths.iter().zip(&existed) {
        assert!(
            !*e || Path::new(p).is_dir(),
            "{p} exists before the package is installed"
        );
    }
    let cdi = Path::new("/etc/cdi/cuslice.json");
    let cdi_dir_existed = Path::new("/etc/cdi").exists();
    let register = !cdi.exists();
    // Without systemd the package starts no agent, so an agent's files there are another's.
    let agent_dir = Path::new("/run/cuslice/agent");
    let agent_dir_existed = agent_dir.exists();

    let _purge = Purge;
    let setup = ok(&sh("dpkg", &["-i", &deb]));
    assert!(installed(), "{setup}");
    // postinst says how to register an engine.
    assert!(
        setup.contains("cuslice install --prefix /usr --no-agent --engine"),
        "{setup}"
    );
    let help = ok(&sh("/usr/bin/cuslice", &["--help"]));
    assert!(help.contains("install"), "{help}");
    ok(&sh("dpkg", &["--verify", "cuslice"]));
    let unit = fs::read_to_string("/usr/lib/systemd/system/cuslice-agent.service").expect("unit");
    assert!(
        unit.contains("\nExecStart=/usr/bin/cuslice agent --enforce stop $CUSLICE_AGENT_ARGS\n"),
        "{unit}"
    );
    if have("systemd-analyze") {
        let v = sh(
            "systemd-analyze",
            &["verify", "/usr/lib/systemd/system/cuslice-agent.service"],
        );
        assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    }

    if register {
        let out = ok(&sh(
            "/usr/bin/cuslice",
            &[
                "install",
                "--prefix",
                "/usr",
                "--no-agent",
                "--engine",
                "cdi",
            ],
        ));
        assert!(cdi.exists(), "{out}");
        // Installing onto the package's own files leaves them as shipped.
        assert!(
            out.contains("/usr/bin/cuslice: already installed, no change"),
            "{out}"
        );
        ok(&sh("dpkg", &["--verify", "cuslice"]));
    } else {
        println!("NOT RUN: the cdi registration ({} exists)", cdi.display());
    }

    // Slurm, where the build had the SPANK plugin: registered from the package's own plugin (no
    // file rewritten), in a plugstack file of the test's own (SLURM_CONF names its slurm.conf,
    // as for Slurm's own commands), and undone by dpkg -r.
    let spank = Path::new("/usr/lib/cuslice/cuslice_spank.so");
    let slurm_dir = tempfile::tempdir().expect("tempdir");
    let slurm_conf = slurm_dir.path().join("slurm.conf");
    let plugstack = slurm_dir.path().join("plugstack.conf");
    let slurm_env = [("SLURM_CONF", slurm_conf.as_os_str())];
    let with_slurm = paths.iter().any(|p| Path::new(p) == spank);
    assert_eq!(
        with_slurm,
        from.join("libcuslice_spank.so").is_file(),
        "the package holds the SPANK plugin exactly where the build has it"
    );
    if with_slurm {
        fs::write(
            &slurm_conf,
            format!("PlugStackConfig={}\n", plugstack.display()),
        )
        .unwrap();
        let out = ok(&Command::new("/usr/bin/cuslice")
            .args([
                "install",
                "--prefix",
                "/usr",
                "--no-agent",
                "--engine",
                "slurm",
            ])
            .envs(slurm_env)
            .output()
            .expect("cuslice install"));
        assert!(
            out.contains(&format!(
                "{}: already installed, no change",
                spank.display()
            )),
            "{out}"
        );
        let stack = fs::read_to_string(&plugstack).expect("the plugstack file");
        assert!(
            stack.contains("required /usr/lib/cuslice/cuslice_spank.so hook=/usr/bin/cuslice-hook"),
            "{stack}"
        );
        ok(&sh("dpkg", &["--verify", "cuslice"]));
    } else {
        println!("NOT RUN: the slurm registration (this build has no libcuslice_spank.so)");
    }

    if sh("/usr/bin/cuslice", &["doctor", "--help"])
        .status
        .success()
    {
        // No GPU and no agent here: it reports problems (exit 1), but none with the package's
        // files or the registration made from them.
        let d = Command::new("/usr/bin/cuslice")
            .args(["doctor", "--prefix", "/usr"])
            .envs(slurm_env)
            .output()
            .expect("cuslice doctor");
        let text = String::from_utf8_lossy(&d.stdout);
        println!("cuslice doctor --prefix /usr ({}):\n{text}", d.status);
        assert!(
            matches!(d.status.code(), Some(0 | 1)),
            "cuslice doctor: {}: {}",
            d.status,
            String::from_utf8_lossy(&d.stderr)
        );
        for l in text.lines().filter(|l| l.starts_with("PROBLEM")) {
            assert!(
                !(l.contains(" files:")
                    || l.contains(" file /")
                    || register && l.contains(" engine cdi:")
                    || with_slurm && l.contains("slurm")),
                "{l}"
            );
        }
        if with_slurm {
            let plugin = format!("slurm plugin {}:", spank.display());
            assert!(
                text.lines()
                    .any(|l| l.starts_with("ok ") && l.contains(&plugin)),
                "cuslice doctor does not find the package's plugin good:\n{text}"
            );
        }
        // Every file the package put under /usr is found, of this build's release (the hook
        // and the CLI by --version, the rest by the release mark in the file).
        let said = ok(&sh("/usr/bin/cuslice", &["--version"]));
        let version = said
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().last())
            .expect("cuslice --version names a version");
        let ours: Vec<&String> = paths
            .iter()
            .filter(|p| p.starts_with("/usr/bin/") || p.starts_with("/usr/lib/cuslice/"))
            .filter(|p| Path::new(p).is_file() && Path::new(p) != spank)
            .collect();
        assert_eq!(
            ours.len(),
            5,
            "the package's programs and libraries: {ours:?}"
        );
        for p in ours {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().nth(2) == Some(&format!("{p}:")))
                .unwrap_or_else(|| panic!("cuslice doctor says nothing of {p}:\n{text}"));
            assert!(
                line.starts_with("ok ") && line.ends_with(&format!(": {version}")),
                "{line}"
            );
        }
    } else {
        println!("NOT RUN: cuslice doctor (this cuslice has no such command)");
    }

    let removed = ok(&Command::new("dpkg")
        .args(["-r", "cuslice"])
        .envs(slurm_env)
        .output()
        .expect("dpkg -r"));
    if with_slurm {
        // prerm undid the registration: the plugstack file install made is gone.
        assert!(
            !plugstack.exists(),
            "prerm leaves the plugstack line: {removed}"
        );
    }
    if register {
        assert!(!cdi.exists(), "prerm leaves {}: {removed}", cdi.display());
        // `cuslice uninstall` keeps the directories install made (here /etc/cdi, left empty):
        // the machine is put back as it was.
        if !cdi_dir_existed {
            fs::remove_dir("/etc/cdi").expect("/etc/cdi is left with files in it");
        }
    }
    ok(&sh("dpkg", &["-P", "cuslice"]));
    assert!(
        !sh("dpkg-query", &["-W", "cuslice"]).status.success(),
        "dpkg still knows the package"
    );
    for (p, e) in paths.iter().zip(&existed) {
        assert!(
            *e || !Path::new(p).exists(),
            "{p} is left after dpkg -r and -P"
        );
    }
    assert_eq!(
        agent_dir.exists(),
        agent_dir_existed,
        "{} changed",
        agent_dir.display()
    );
    for p in [
        "/etc/default/cuslice-agent",
        "/etc/systemd/system/multi-user.target.wants/cuslice-agent.service",
        "/etc/systemd/system/cuslice-agent.service",
    ] {
        assert!(!Path::new(p).exists(), "{p} is left");
    }
    let info = fs::read_dir("/var/lib/dpkg/info")
        .expect("dpkg's info")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cuslice."))
        .count();
    assert_eq!(info, 0, "dpkg's maintainer scripts for cuslice are left");
}
