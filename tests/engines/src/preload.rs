//! Images that turn their own `/etc/ld.so.preload` against the hook: a file that stops the
//! dynamic loader before the interposer, and one too large to read. Judged by what a user
//! sees: the engine's output and exit status, what the container's processes see, what the
//! simulator says they held, and what is left on the host.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use cuslice_test_harness::{GIB, MIB, Sim};

use super::*;

/// An engine that runs a container in a root filesystem the test has changed first.
pub trait Prepared {
    fn run_prepared(&self, sim: &Sim, spec: &Spec<'_>, prepare: &dyn Fn(&Path)) -> Output;
    fn spawn_prepared(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        prepare: &dyn Fn(&Path),
    ) -> Box<dyn Container + '_>;
}

/// The first line of `/etc/ld.so.preload` in every sliced container.
pub const LIBRARY_LINE: &str = "/run/cuslice/lib/libcuslice.so";

/// Writes the image's `/etc/ld.so.preload`.
pub fn image_preload(rootfs: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc/ld.so.preload"), bytes).unwrap();
}

/// Makes the image's `/etc/ld.so.preload` a sparse file of `len` bytes (all holes: it takes no
/// disk, and reads as NUL bytes).
pub fn sparse_preload(rootfs: &Path, len: u64) {
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::File::create(rootfs.join("etc/ld.so.preload"))
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// The line cuslice-hook wrote into the engine's output, from `cuslice-hook: ` to its end.
pub fn hook_line(all: &str) -> &str {
    let at = all
        .find("cuslice-hook: ")
        .unwrap_or_else(|| panic!("no line of cuslice-hook in: {all}"));
    let line = &all[at..];
    // Engines quote the hook's stderr in a line of their own, its newline kept or escaped.
    let end = line.find(['\n', '\\']).unwrap_or(line.len());
    line[..end].trim_end()
}

/// The largest file under `dir` (bytes, path), recursively; `(0, dir)` for none.
pub fn largest_file(dir: &Path) -> (u64, std::path::PathBuf) {
    let mut best = (0, dir.to_path_buf());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.len() > best.0 {
                best = (m.len(), e.path());
            }
        }
    }
    best
}

/// An image whose `/etc/ld.so.preload` is one NUL byte, where the dynamic loader stops reading:
/// the container's processes still load the interposer (the cap holds, by the simulator's
/// count), and the file they see names it first.
pub fn nul_byte(engine: &dyn Prepared) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("nul");
    let mut c = engine.spawn_prepared(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "sh",
                "-c",
                "cat /etc/ld.so.preload; \
                 exec cuda-workload fill --family mem --chunk 64MiB --hold 60",
            ],
            read_only: false,
        },
        &|rootfs| image_preload(rootfs, b"\0"),
    );
    let (said, start) = lines_until(&mut *c, "start");
    assert_eq!(
        start["total"], GIB,
        "the interposer is not loaded: the device as the container sees it: {start}"
    );
    assert_eq!(
        said.first().map(String::as_str),
        Some(LIBRARY_LINE),
        "the container's /etc/ld.so.preload does not start with the interposer: {said:?}"
    );
    let refused = wait_for(&mut *c, "refused");
    assert_eq!(refused["code"], 2, "{refused}");
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(
        peak <= GIB && used <= GIB,
        "held {used}, peak {peak} > 1 GiB"
    );
    c.remove();
}

/// An image whose `/etc/ld.so.preload` is a sparse file of `len` bytes: the container is refused
/// at once, in one line naming the file, its size and the bound, and the state root holds no
/// copy of it. Returns the hook's line.
pub fn huge(engine: &dyn Prepared, len: u64) -> String {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("huge");
    let started = Instant::now();
    let out = engine.run_prepared(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
        &|rootfs| sparse_preload(rootfs, len),
    );
    let took = started.elapsed();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    let line = hook_line(&all).to_string();
    for says in [
        "/etc/ld.so.preload",
        &format!("{len} bytes"),
        "65536 bytes",
        "the container is not started",
    ] {
        assert!(line.contains(says), "{line:?} does not say {says:?}");
    }
    assert!(
        took < Duration::from_secs(10),
        "refused after {took:?}: {line}"
    );
    let (size, path) = largest_file(Path::new(STATE_ROOT));
    assert!(
        size < MIB,
        "{} is {size} bytes: a copy of the image's file?",
        path.display()
    );
    line
}
