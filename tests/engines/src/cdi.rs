//! Claims as CDI devices, the way the DRA plugin prepares them: a spec per claim built by
//! `cuslice_cdi::claim_spec` and written by `write_spec`, naming simgpu's libraries where
//! the driver's go, stand-in device nodes and cuslice-hook; the engine gets the hook from the
//! spec alone. Podman resolves `--device` ids itself; containerd 1.6 has no CDI, so there
//! cuslice-runtime applies the ids in the container's `cdi.k8s.io/*` annotations.
//!
//! simgpu has no device nodes, so the claims' nodes are character devices made with mknod in a
//! temporary directory, with /dev/null's numbers (1:3), given as each node's hostPath.

use std::path::{Path, PathBuf};
use std::process::Output;

use cuslice_cdi as cdi;
use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::Value;

use super::{Container, Spec, held_by, lines_until, name, slice_dir, wait_for};

/// The container paths of the stand-in device nodes.
pub const NODES: [&str; 2] = ["/dev/nvidia0", "/dev/nvidiactl"];

/// One prepared claim.
pub struct Claim {
    pub uid: String,
    /// Its CDI device id, `gpu.cuslice.io/claim=<uid>-gpu-0`.
    pub id: String,
}

impl Claim {
    /// The annotation the kubelet (before 1.31) sets for a claim's CDI devices:
    /// `cdi.k8s.io/<driver>_<claim uid>`.
    pub fn annotation(&self) -> (String, String) {
        (
            format!(
                "{}{}_{}",
                cdi::ANNOTATION_PREFIX,
                cdi::CLAIM_VENDOR,
                self.uid
            ),
            self.id.clone(),
        )
    }
}

/// Claim specs in a spec directory (removed when dropped), and the stand-in device nodes.
pub struct ClaimSpecs {
    pub dir: PathBuf,
    made_dir: bool,
    files: Vec<String>,
    nodes: tempfile::TempDir,
}

impl ClaimSpecs {
    pub fn new(dir: &Path) -> ClaimSpecs {
        let made_dir = !dir.exists();
        let nodes = tempfile::tempdir().unwrap();
        for n in NODES {
            let host = nodes.path().join(Path::new(n).file_name().unwrap());
            nix::sys::stat::mknod(
                &host,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(1, 3),
            )
            .unwrap_or_else(|e| panic!("mknod {}: {e}", host.display()));
        }
        ClaimSpecs {
            dir: dir.to_path_buf(),
            made_dir,
            files: Vec::new(),
            nodes,
        }
    }

    /// Prepares a claim of `memory` bytes and `request` cores, core limit `limit`: writes its
    /// spec.
    pub fn claim(&mut self, memory: u64, request: u32, limit: u32) -> Claim {
        let uid = name("claim");
        let device = cdi::ClaimDevice {
            name: cdi::claim_device_name(&uid, "gpu-0"),
            env: vec![
                ("CUSLICE_MEMORY_LIMIT".into(), memory.to_string()),
                ("CUSLICE_CORE_REQUEST".into(), request.to_string()),
                ("CUSLICE_CORE_LIMIT".into(), limit.to_string()),
            ],
            device_nodes: NODES
                .iter()
                .map(|n| {
                    let host = self.nodes.path().join(Path::new(n).file_name().unwrap());
                    (n.to_string(), host.display().to_string())
                })
                .collect(),
            library_mounts: [
                ("libsimgpu_cuda.so", "libcuda.so.1"),
                ("libsimgpu_nvml.so", "libnvidia-ml.so.1"),
            ]
            .iter()
            .map(|(host, lib)| {
                (
                    bin_dir().join(host).display().to_string(),
                    format!("/usr/lib/x86_64-linux-gnu/{lib}"),
                )
            })
            .collect(),
        };
        let spec = cdi::claim_spec(
            std::slice::from_ref(&device),
            &bin_dir().join("cuslice-hook").display().to_string(),
            &bin_dir().join("libcuslice.so").display().to_string(),
        );
        let file = cdi::claim_spec_file(&uid);
        cdi::write_spec(&self.dir, &file, &spec).unwrap();
        self.files.push(file);
        Claim {
            id: spec.qualified(&device.name),
            uid,
        }
    }
}

impl Drop for ClaimSpecs {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = cdi::remove_spec(&self.dir, f);
        }
        if self.made_dir {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// An engine that gives containers CDI devices.
pub trait CdiEngine {
    /// The spec directory the engine (or its runtime) reads.
    fn spec_dir(&self) -> PathBuf;
    /// Starts a container with the claims' devices; the simulator's state is mounted and named
    /// by the engine (the stand-in for the GPU itself), everything else comes from the specs.
    fn spawn_with(&self, sim: &Sim, spec: &Spec<'_>, claims: &[&Claim]) -> Box<dyn Container + '_>;
    /// Runs a container to completion with the devices `ids`: (annotation key, device id).
    fn run_with(&self, sim: &Sim, spec: &Spec<'_>, ids: &[(String, String)]) -> Output;
    /// Starts a container with the CDI devices `ids` (from specs in [`CdiEngine::spec_dir`]),
    /// cuslice registered the engine's usual way (Podman: its hooks.d descriptors; containerd
    /// 1.6: cuslice-runtime, which applies the devices `cdi.k8s.io/*` annotations name).
    fn spawn_registered(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        ids: &[String],
    ) -> Box<dyn Container + '_>;
    /// The same, run to completion.
    fn run_registered(&self, sim: &Sim, spec: &Spec<'_>, ids: &[String]) -> Output;
    /// The config.json the runtime ran the container with.
    fn bundle_config(&self, c: &dyn Container) -> Value;
    /// Whether the engine still knows a container named `name`.
    fn knows(&self, name: &str) -> bool;
}

const SCRIPT: &str = "ls -l /dev/nvidia0 /dev/nvidiactl 2>&1; \
                      exec cuda-workload fill --family mem --chunk 64MiB --hold 60";

/// Two claims on one simulated device, 1 GiB with cores 30/60 and 2 GiB with 40/40: each
/// container sees its cap and the simulator says it held no more; its device nodes are there,
/// with an allow rule; the hook ran once per stage (from the spec); `cuslice status` shows each
/// slice's cap, core request and limit; both slices are gone after the containers.
pub fn two_claims(engine: &dyn CdiEngine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut specs = ClaimSpecs::new(&engine.spec_dir());
    let a = specs.claim(GIB, 30, 60);
    let b = specs.claim(2 * GIB, 40, 40);
    held_to_claims(
        engine,
        &sim,
        &[(&a, GIB, 30.0, 60.0), (&b, 2 * GIB, 40.0, 40.0)],
    );
}

/// Containers with the claims' devices (claim, memory cap, core request, core limit), one each,
/// on simulated device 0: each container sees its cap and the simulator says it held no more;
/// its device nodes are there, with an allow rule; the hook ran once per stage (from the spec);
/// `cuslice status` shows each slice's cap, core request and limit; every slice is gone after
/// its container.
pub fn held_to_claims(engine: &dyn CdiEngine, sim: &Sim, claims: &[(&Claim, u64, f64, f64)]) {
    let mut started = Vec::new();
    // One after the other, as a kubelet starts containers.
    for (claim, cap, request, limit) in claims {
        let n = name("cdi");
        let mut c = engine.spawn_with(
            sim,
            &Spec {
                name: &n,
                env: &[],
                cmd: &["sh", "-c", SCRIPT],
                read_only: false,
            },
            &[claim],
        );
        let first = lines_until(c.as_mut(), "start");
        started.push((c, first, *cap, *request, *limit));
    }
    let mut ids = Vec::new();
    for (c, (said, start), cap, request, limit) in started.iter_mut() {
        let (cap, request, limit) = (*cap, *request, *limit);
        assert_eq!(
            start["total"], cap,
            "the device as the container sees it: {start}"
        );
        for n in NODES {
            assert!(
                said.iter()
                    .any(|l| l.starts_with("crw") && l.contains("1,   3") && l.ends_with(n)),
                "{n} is not character device 1:3 in the container: {said:?}"
            );
        }
        wait_for(c.as_mut(), "holding");
        let (used, peak) = held_by(sim, c.host_pid());
        assert!(
            peak <= cap && used >= cap - 128 * MIB,
            "cap {cap}: held {used}, peak {peak}"
        );
        let config = engine.bundle_config(c.as_ref());
        for stage in cdi::HOOK_STAGES {
            let hooks: Vec<&Value> = config["hooks"][stage]
                .as_array()
                .map(|a| a.iter().filter(|h| cdi::is_cuslice_hook(h)).collect())
                .unwrap_or_default();
            assert_eq!(hooks.len(), 1, "{stage}: {}", config["hooks"]);
            assert_eq!(
                hooks[0]["path"],
                bin_dir().join("cuslice-hook").display().to_string()
            );
        }
        let rules = config["linux"]["resources"]["devices"].as_array().unwrap();
        assert!(
            rules.iter().any(|r| r["allow"] == true
                && r["type"] == "c"
                && r["major"] == 1
                && r["minor"] == 3
                && r["access"] == "rwm"),
            "no allow rule for the nodes: {rules:?}"
        );
        ids.push((c.id(), cap, request, limit));
    }
    let view = super::status_json(sim);
    for (id, cap, request, limit) in &ids {
        let slice = super::slice_in(&view, id);
        assert_eq!(slice["memory"]["limit"], *cap, "{slice}");
        assert_eq!(slice["compute"]["request_pct"], *request, "{slice}");
        assert_eq!(slice["compute"]["limit_pct"], *limit, "{slice}");
    }
    for (c, ..) in started {
        c.remove();
    }
    for (id, ..) in &ids {
        assert!(!slice_dir(id).exists(), "state of {id} left after removal");
    }
}

/// A container naming a device no spec defines (under the annotation key `annotation`, where
/// the engine uses annotations) is not created; the engine's output names the device id in one
/// line, which comes back for the engine's own checks.
pub fn unknown_device(engine: &dyn CdiEngine, annotation: &str) -> String {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut specs = ClaimSpecs::new(&engine.spec_dir());
    let real = specs.claim(GIB, 30, 60);
    let n = name("cdi-unknown");
    let id = format!("{}=nope-gpu-0", cdi::CLAIM_KIND);
    let out = engine.run_with(
        &sim,
        &Spec {
            name: &n,
            env: &[],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
        // With a device that does resolve, so the one that does not is what stops it.
        &[real.annotation(), (annotation.to_string(), id.clone())],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    let line = all
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("no line names {id}: {all}"));
    assert!(!engine.knows(&n), "the engine kept container {n}: {line}");
    assert!(!slice_dir(&n).exists(), "state left behind");
    line.to_string()
}
