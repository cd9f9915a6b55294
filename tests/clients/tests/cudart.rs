//! NVIDIA's real runtime, libcudart 12.9.79 and 13.5.37 (the wheels tests/frameworks/install
//! unpacks into target/frameworks/cudart), on simgpu, with and without libcuslice.so preloaded.
//! tests/frameworks/cudart_check.c, built here with `cc` against each, registers a fatbin the way
//! nvcc's code does and calls the runtime; what it prints is judged by the simulator's ground
//! truth (`simgpu show`).
//!
//! Without `cc` or the runtimes the tests print one skip line and pass, except under `CI`, where
//! they fail (tests/frameworks/install fetches the runtimes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cuslice_client_tests::{Slice, command, run_to_end};
use cuslice_test_harness::*;
use serde_json::Value;

const VERSIONS: [&str; 2] = ["12.9", "13.5"];
const CAP: u64 = GIB;
/// simgpu's default hidden memory per context.
const CTX: u64 = 300 * MIB;
/// Kernel launches of `cudart_check all`, 100 blocks each; one more in the graph and one after
/// cudaDeviceReset.
const LAUNCHES: u64 = 20;
/// simgpu's allocation unit: what the runtime's one small fatbin takes once loaded.
const GRANULE: u64 = 2 * MIB;
/// simgpu's default cost of a block of a kernel from a fatbin.
const NS_PER_BLOCK: u64 = 1_000;

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../frameworks/cudart_check.c")
}

/// The runtime's folder for `version` (lib/libcudart.so.*).
fn runtime_lib(version: &str) -> Option<PathBuf> {
    let lib = bin_dir()
        .parent()?
        .join("frameworks/cudart")
        .join(version)
        .join("lib");
    let so = std::fs::read_dir(&lib).ok()?.flatten().find(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        n.starts_with("libcudart.so.") && !n.ends_with(".a")
    })?;
    Some(so.path())
}

/// cudart_check built against each runtime, or why not.
fn programs() -> &'static Result<HashMap<&'static str, PathBuf>, String> {
    static P: OnceLock<Result<HashMap<&'static str, PathBuf>, String>> = OnceLock::new();
    P.get_or_init(|| {
        let out_dir = bin_dir()
            .parent()
            .ok_or("no target folder")?
            .join("cudart-check");
        std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
        let mut built = HashMap::new();
        for v in VERSIONS {
            let so =
                runtime_lib(v).ok_or(format!("no libcudart {v} under target/frameworks/cudart"))?;
            let exe = out_dir.join(format!("cudart_check-{v}"));
            let rpath = so.parent().unwrap().display().to_string();
            let out = Command::new("cc")
                .args(["-O1", "-Wall", "-Werror", "-o"])
                .arg(&exe)
                .arg(source())
                .arg(&so)
                .arg("-ldl")
                .arg(format!("-Wl,-rpath,{rpath}"))
                .output()
                .map_err(|e| format!("no cc ({e})"))?;
            if !out.status.success() {
                return Err(format!(
                    "cc failed for {v}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            built.insert(v, exe);
        }
        Ok(built)
    })
}

/// The program for `version`; outside CI a missing prerequisite skips (one line).
fn program(version: &str) -> Option<PathBuf> {
    match programs() {
        Ok(p) => Some(p[version].clone()),
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{why}; tests/frameworks/install fetches the runtimes"
            );
            eprintln!("skipped: {why}; tests/frameworks/install fetches the runtimes");
            None
        }
    }
}

/// A finished process as the simulator remembers it.
fn exited(sim: &Sim, pid: u64) -> Value {
    let d = sim.device(0);
    d["exited"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("pid {pid} not among the exited: {d}"))
}

/// Runs `cudart_check all` and checks every answer against the simulator; `cap`: the slice's.
fn check_all(sim: &Sim, v: &str, exe: &Path, slice: Option<&Slice>, cap: Option<u64>) {
    let place = format!(
        "cudart {v}, {}",
        if slice.is_some() {
            "in a slice"
        } else {
            "bare"
        }
    );
    let n = run_to_end(
        &mut command(sim, exe, slice, &["all", &LAUNCHES.to_string()]),
        &place,
    );
    let device_total = u(&sim.device(0)["total"]);
    let total = cap.unwrap_or(device_total);

    let d = event(&n, "devices");
    assert_eq!(
        (d["error"].clone(), d["count"].clone()),
        (0.into(), 1.into()),
        "{place}: {d}"
    );
    assert_eq!(d["props_error"], 0, "{place}: {d}");
    assert_eq!(d["name"], "SimGPU (simulated)", "{place}: {d}");
    assert_eq!(u(&d["totalGlobalMem"]), total, "{place}: {d}");
    assert_eq!(
        (d["sms"].clone(), d["major"].clone()),
        (132.into(), 9.into()),
        "{place}: {d}"
    );
    let pid = u(&d["pid"]);

    let m = event(&n, "meminfo");
    assert_eq!(m["error"], 0, "{place}: {m}");
    assert_eq!(u(&m["total"]), total, "{place}: {m}");
    assert_eq!(u(&m["free"]), total - CTX, "{place}: {m}");

    let a = event(&n, "malloc");
    assert_eq!(
        a["over_free_error"], 2,
        "{place}: cudaMalloc beyond free: {a}"
    );
    assert_eq!(a["piece_error"], 2, "{place}: cudaMalloc when full: {a}");
    let pieces = u(&a["pieces"]);
    assert_eq!(pieces, (total - CTX) / (128 * MIB), "{place}: {a}");

    let l = event(&n, "launch");
    assert_eq!(
        (l["error"].clone(), l["sync_error"].clone()),
        (0.into(), 0.into()),
        "{place}: {l}"
    );
    let a = event(&n, "async");
    for k in ["malloc_error", "free_error", "sync_error"] {
        assert_eq!(a[k], 0, "{place}: {k}: {a}");
    }
    assert_eq!(
        a["over_free_error"], 2,
        "{place}: cudaMallocAsync beyond free: {a}"
    );
    let g = event(&n, "graph");
    for k in [
        "capture_error",
        "launch_in_capture",
        "end_error",
        "instantiate_error",
        "launch_error",
        "sync_error",
    ] {
        assert_eq!(g[k], 0, "{place}: {k}: {g}");
    }
    // After cudaDeviceReset the runtime starts afresh in the same primary context; its library
    // (one granule of code) stays loaded, and nothing else is left charged.
    let r = event(&n, "reset");
    for k in [
        "reset_error",
        "malloc_error",
        "launch_error",
        "sync_error",
        "meminfo_error",
    ] {
        assert_eq!(r[k], 0, "{place}: after cudaDeviceReset: {k}: {r}");
    }
    assert_eq!(u(&r["total"]), total, "{place}: after reset: {r}");
    assert_eq!(
        u(&r["free"]),
        total - CTX - GRANULE,
        "{place}: after reset: {r}"
    );
    assert_eq!(u(&r["pieces"]), pieces, "{place}: after reset: {r}");
    assert_eq!(r["piece_error"], 2, "{place}: after reset: {r}");
    event(&n, "done");

    let p = exited(sim, pid);
    let peak = u(&p["peak"]);
    let want_ns = (LAUNCHES + 2) * 100 * NS_PER_BLOCK;
    eprintln!(
        "{place}: total {total}, free {}, {pieces} x 128 MiB, peak {peak}, device time {} ns",
        u(&m["free"]),
        u(&p["device_time_ns"])
    );
    assert_eq!(
        u(&p["device_time_ns"]),
        want_ns,
        "{place}: the launches as simgpu metered them: {p}"
    );
    assert!(peak <= total, "{place}: peak {peak} beyond {total}: {p}");
    assert!(peak >= CTX + pieces * 128 * MIB, "{place}: {p}");
}

#[test]
fn the_runtime_starts_and_works_on_simgpu() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let sim = Sim::new(&["--memory", "8GiB"]);
        check_all(&sim, v, &exe, None, None);
    }
}

#[test]
fn in_a_slice_the_runtime_sees_the_cap_and_is_held_to_it() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let sim = Sim::new(&["--memory", "8GiB"]);
        check_all(&sim, v, &exe, Some(&Slice::capped()), Some(CAP));
    }
}

/// The integrity answer covers every visible device: the runtime accepts it on three devices,
/// and on two of them picked (and reordered) by CUDA_VISIBLE_DEVICES.
#[test]
fn the_integrity_answer_covers_every_visible_device() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let sim = Sim::new(&["--devices", "3"]);
        for (visible, count) in [(None, 3), (Some("2,0"), 2)] {
            let mut c = command(&sim, &exe, None, &["init"]);
            if let Some(list) = visible {
                c.env("CUDA_VISIBLE_DEVICES", list);
            }
            let n = run_to_end(&mut c, "init");
            let i = event(&n, "init");
            assert_eq!(i["error"], 0, "cudart {v}, visible {visible:?}: {i}");
            assert_eq!(i["count"], count, "cudart {v}, visible {visible:?}: {i}");
            assert_eq!(i["malloc_error"], 0, "cudart {v}, visible {visible:?}: {i}");
        }
    }
}

/// With SIMGPU_TRACE_EXPORTS the simulator names, on stderr, every table the runtime asks for and
/// every implemented slot it calls, each table with its UUID; without it, nothing of the sort.
#[test]
fn the_export_tables_asked_for_and_the_slots_called_are_traced_on_request() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let sim = Sim::new(&[]);
        let mut c = command(&sim, &exe, None, &["init"]);
        let quiet = c.output().unwrap();
        assert!(quiet.status.success(), "cudart {v}: {quiet:?}");
        let quiet = String::from_utf8_lossy(&quiet.stderr);
        assert!(!quiet.contains("export table"), "cudart {v}: {quiet}");
        c.env("SIMGPU_TRACE_EXPORTS", "1");
        let traced = c.output().unwrap();
        assert!(traced.status.success(), "cudart {v}: {traced:?}");
        let traced = String::from_utf8_lossy(&traced.stderr);
        for line in [
            "simgpu: export table CUDART_INTERFACE asked for",
            "simgpu: export table INTEGRITY_CHECK asked for",
            // The integrity check, slot 1, as named with its table's UUID.
            "simgpu: export table INTEGRITY_CHECK (",
        ] {
            assert!(
                traced.contains(line),
                "cudart {v}: no {line:?} in:\n{traced}"
            );
        }
        assert!(
            traced
                .lines()
                .any(|l| l.starts_with("simgpu: export table INTEGRITY_CHECK (")
                    && l.ends_with(")[1] called")),
            "cudart {v}: the integrity check's call is not traced:\n{traced}"
        );
    }
}

/// A one-bit error in the driver's integrity answer must make the runtime refuse to work.
#[test]
fn a_corrupted_integrity_answer_fails_every_runtime_call_with_103() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let sim = Sim::new(&[]);
        let slice = Slice::capped();
        for s in [None, Some(&slice)] {
            let mut c = command(&sim, &exe, s, &["init"]);
            let ok = run_to_end(&mut c, "init");
            assert_eq!(event(&ok, "init")["error"], 0, "cudart {v}: {ok:?}");
            c.env("SIMGPU_CORRUPT_INTEGRITY", "1");
            let n = run_to_end(&mut c, "init, corrupted");
            let i = event(&n, "init");
            assert_eq!(i["error"], 103, "cudart {v}: cudaGetDeviceCount: {i}");
            assert_eq!(i["malloc_error"], 103, "cudart {v}: cudaMalloc: {i}");
        }
    }
}

/// A slice limited to 30% launches 1 ms kernels from a fatbin back to back through
/// cudaLaunchKernel; the simulator's device time gives its share.
#[test]
fn a_compute_limited_runtime_client_gets_30_percent_of_the_device() {
    for v in VERSIONS {
        let Some(exe) = program(v) else { return };
        let _turn = serial();
        let sim = Sim::new(&[]);
        let node = tempfile::tempdir().unwrap();
        let slice = Slice::new(&[
            ("CUSLICE_CORE_LIMIT", "30"),
            ("CUSLICE_NODE_DIR", &node.path().display().to_string()),
        ]);
        let (settle, window) = (Duration::from_secs(2), Duration::from_secs(4));
        let ms = (settle + window + Duration::from_millis(1500))
            .as_millis()
            .to_string();
        let mut r = Running::start({
            let mut c = command(&sim, &exe, Some(&slice), &["spin", &ms]);
            c.stdin(Stdio::null());
            c
        });
        let pid = u(&r.wait_for("start", Duration::from_secs(60))["pid"]);
        std::thread::sleep(settle);
        let time = |sim: &Sim| {
            let d = sim.device(0);
            let p = d["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == pid)
                .cloned()
                .unwrap_or_else(|| panic!("pid {pid} not on the device: {d}"));
            (Instant::now(), u(&p["device_time_ns"]))
        };
        let (t0, a) = time(&sim);
        std::thread::sleep(window);
        let (t1, b) = time(&sim);
        let share = 100.0 * (b - a) as f64 / (t1 - t0).as_nanos() as f64;
        eprintln!("cudart {v}: achieved {share:.2}% of the device");
        let done = r.wait_for("spin", Duration::from_secs(60));
        assert_eq!(done["error"], 0, "cudart {v}: {done}");
        assert!(
            (share - 30.0).abs() <= 3.0,
            "cudart {v}: a client limited to 30% had {share:.1}% of the device by the simulator's count"
        );
    }
}

/// libcuslice passes `cuGetExportTable` through untouched: by dlsym and through
/// cuGetProcAddress the program gets simgpu's function (with the library, behind cuslice's gate
/// stub, as every driver function) and simgpu's tables, at the same places in libcuda.so.1 with
/// and without the preload.
#[test]
fn libcuslice_passes_the_export_tables_through_untouched() {
    let Some(exe) = program("13.5") else { return };
    let sim = Sim::new(&[]);
    let slice = Slice::capped();
    let mut seen = Vec::new();
    for s in [None, Some(&slice)] {
        let n = run_to_end(&mut command(&sim, &exe, s, &["tables"]), "tables");
        let t = event(&n, "tables").clone();
        assert_eq!(
            (t["init_error"].clone(), t["proc_error"].clone()),
            (0.into(), 0.into()),
            "{t}"
        );
        for (k, v) in t.as_object().unwrap() {
            if let Some(lib) = v.get("lib") {
                // The function itself goes out behind its gate stub under the library.
                let want = if k.ends_with("_fn") && s.is_some() {
                    "libcuslice_core.so"
                } else {
                    "libcuda.so.1"
                };
                assert_eq!(lib, want, "{k}: {t}");
                assert_eq!(v["rc"], 0, "{k}: {t}");
            }
        }
        for i in 0..7 {
            assert_eq!(
                t[format!("direct_{i}")],
                t[format!("proc_{i}")],
                "table {i}: {t}"
            );
        }
        assert_eq!(t["direct_fn"], t["proc_fn"], "{t}");
        seen.push(t);
    }
    // The tables are the same with and without the library.
    for t in &mut seen {
        let t = t.as_object_mut().unwrap();
        t.remove("direct_fn");
        t.remove("proc_fn");
    }
    assert_eq!(seen[0], seen[1], "with and without libcuslice");
}
