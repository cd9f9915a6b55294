//! `cuslice install` installs the real build stripped, with the debug info beside each file in
//! `.debug/NAME.debug` where gdb and binutils find it through the file's `.gnu_debuglink`; the
//! stripped library still loads. Needs the release build (`cargo build --release --workspace`:
//! libcuslice.so, libcuslice_core.so, cuslice-hook and cuslice-runtime beside the cuslice under
//! test) and binutils.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

fn build_dir() -> PathBuf {
    let dir = Path::new(BIN).parent().expect("bin dir").to_path_buf();
    for f in [
        "libcuslice.so",
        "libcuslice_core.so",
        "cuslice-hook",
        "cuslice-runtime",
    ] {
        assert!(
            dir.join(f).is_file(),
            "{}: missing; run `cargo build --release --workspace` first",
            dir.join(f).display()
        );
    }
    dir
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `readelf -S`: the section names of `file`.
fn sections(file: &Path) -> Vec<String> {
    let out = text(&run(Command::new("readelf").args(["-S", "-W"]).arg(file)));
    out.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?.split_once(']')?.1;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

fn cuslice(root: &Path, from: &Path, cmd: &str) -> String {
    let mut c = Command::new(BIN);
    c.args([cmd, "--engine", "cdi", "--root"]).arg(root);
    if cmd == "install" {
        c.arg("--no-agent").arg("--from").arg(from);
    }
    text(&run(&mut c))
}

#[test]
fn installed_files_are_stripped_with_debug_info_beside_them() {
    if !have("objcopy") || !have("readelf") {
        eprintln!("SKIPPED: needs binutils (objcopy, readelf) on PATH");
        return;
    }
    let from = build_dir();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
    cuslice(root, &from, "install");

    let lib_dir = root.join("usr/local/lib/cuslice");
    for (installed, built) in [
        (lib_dir.join("libcuslice.so"), from.join("libcuslice.so")),
        (
            lib_dir.join("libcuslice_core.so"),
            from.join("libcuslice_core.so"),
        ),
        (
            root.join("usr/local/bin/cuslice-hook"),
            from.join("cuslice-hook"),
        ),
        (
            root.join("usr/local/bin/cuslice-runtime"),
            from.join("cuslice-runtime"),
        ),
        (root.join("usr/local/bin/cuslice"), PathBuf::from(BIN)),
    ] {
        let name = installed
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let built_sections = sections(&built);
        assert!(
            built_sections.iter().any(|s| s == ".debug_line"),
            "{}: the build has no line tables: {built_sections:?}",
            built.display()
        );
        let s = sections(&installed);
        assert!(
            // .debug_gdb_scripts is loaded data (gdb's pretty-printer list), not debug info.
            !s.iter()
                .any(|s| s.starts_with(".debug_") && s != ".debug_gdb_scripts"),
            "{name}: debug sections left: {s:?}"
        );
        assert!(s.iter().any(|s| s == ".gnu_debuglink"), "{name}: {s:?}");
        let link = text(&run(Command::new("readelf")
            .args(["-p", ".gnu_debuglink"])
            .arg(&installed)));
        assert!(link.contains(&format!("{name}.debug")), "{name}: {link}");
        let debug = installed
            .parent()
            .expect("dir")
            .join(".debug")
            .join(format!("{name}.debug"));
        let d = sections(&debug);
        assert!(
            d.iter().any(|s| s == ".debug_line"),
            "{}: {d:?}",
            debug.display()
        );
        let (small, big) = (
            std::fs::metadata(&installed).expect("installed").len(),
            std::fs::metadata(&built).expect("built").len(),
        );
        assert!(
            small * 2 < big,
            "{name}: {small} bytes installed, {big} built"
        );
    }

    // binutils follow the link to the line tables (of the core: the interposer's sources).
    let lib = lib_dir.join("libcuslice_core.so");
    let lines = run(Command::new("readelf")
        .args(["--debug-dump=follow-links", "--debug-dump=decodedline"])
        .arg(&lib));
    assert!(
        text(&lines).contains("interposer/src/"),
        "no line table of the interposer's sources through the debug link"
    );
    // So does gdb, where there is one: a line of an export's source.
    if have("gdb") {
        let out = run(Command::new("gdb")
            .args(["-batch", "-nx", "-ex", "info line cuInit"])
            .arg(&lib));
        assert!(text(&out).contains("interposer/src/"), "{}", text(&out));
    }

    // The stripped loader and core still load into a process: mapped, and nothing said.
    for lib in [lib_dir.join("libcuslice.so"), lib] {
        let maps = run(Command::new("cat")
            .arg("/proc/self/maps")
            .env("LD_PRELOAD", &lib)
            .env_remove("CUSLICE_LOG"));
        assert!(
            text(&maps).contains(&lib.display().to_string()),
            "{} not mapped",
            lib.display()
        );
        assert_eq!(String::from_utf8_lossy(&maps.stderr), "");
    }
    // And the stripped binaries run.
    run(Command::new(root.join("usr/local/bin/cuslice-hook")).arg("--version"));

    // Again: nothing to do (stripping gives the same bytes).
    assert!(
        cuslice(root, &from, "install").contains("already installed"),
        "a second install changed something"
    );
    // Uninstall removes the debug info too.
    cuslice(root, &from, "uninstall");
    assert!(!lib_dir.join(".debug").exists());
    assert!(!root.join("usr/local/bin/.debug").exists());
}
