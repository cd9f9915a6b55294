//! What is prepared on this node, and preparing and unpreparing it: the state type the gRPC
//! surface (`service`) calls, after kubernetes-sigs/dra-example-driver's `DeviceState`
//! (Ref: dra-example-driver cmd/dra-example-kubeletplugin/state.go). It owns the checkpoint, the
//! claims' CDI specs and their container index entries; it reads nothing from the API server
//! (the caller passes the claim's allotments and the pods it is reserved for), so it runs with
//! no socket and no server.
//!
//! Prepare: CDI specs, then container index entries, then the checkpoint; a claim is prepared
//! when its checkpoint entry is saved, and a step that fails undoes the ones before it.
//! Unprepare: index entries (a container starting meanwhile finds no entry rather than one whose
//! spec is gone), specs, then the checkpoint. Both are idempotent: a claim prepared before (by
//! this run or an earlier one) gets the same answer, and one not prepared has nothing to undo.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::checkpoint::{self, Checkpoint, Prepared, PreparedDevice};
use crate::claim::{Allotted, ClaimRef};
use crate::discover::Roots;
use crate::resource_slice::Gpu;
use crate::{Options, cdi, log};

/// Where the state lives and what its specs name.
#[derive(Debug, Clone)]
pub struct Places {
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// Where CDI specs are written for the container runtime.
    pub cdi_dir: PathBuf,
    /// The container index for cuslice-runtime on containerd 1.6 (None: not kept).
    pub container_index: Option<PathBuf>,
    /// The node's pool, in each prepared device.
    pub pool: String,
    pub roots: Roots,
    /// cuslice-hook and libcuslice.so, as paths on the host.
    pub hook: String,
    pub library: String,
}

impl Places {
    pub fn of(opts: &Options) -> Places {
        Places {
            checkpoint: opts.checkpoint(),
            cdi_dir: opts.cdi_dir.clone(),
            container_index: opts.container_index.clone(),
            pool: opts.node_name.clone(),
            roots: opts.roots.clone(),
            hook: opts.hook.clone(),
            library: opts.library.clone(),
        }
    }
}

/// The claims prepared on this node.
pub struct DeviceState {
    places: Places,
    checkpoint: Checkpoint,
}

impl DeviceState {
    /// The state a checkpoint left (none: nothing prepared). Err: a checkpoint that cannot be
    /// read, named; it is left as it is.
    pub fn load(places: Places) -> Result<DeviceState, String> {
        let checkpoint = checkpoint::load(&places.checkpoint)?;
        Ok(DeviceState { places, checkpoint })
    }

    /// Whether prepare wants the pods a claim is reserved for (the container index is kept).
    pub fn keeps_index(&self) -> bool {
        self.places.container_index.is_some()
    }

    /// The claim `c` as prepared before (by this run or an earlier one), with any spec file
    /// that went missing written again; None when it is not prepared.
    pub fn prepared(&self, c: &ClaimRef) -> Result<Option<&Prepared>, String> {
        let Some(p) = self.checkpoint.claims.get(&c.uid) else {
            return Ok(None);
        };
        for d in &p.devices {
            if !d.spec_file.exists() {
                write_spec(&d.spec_file, &d.spec).map_err(|e| format!("{c}: {e}"))?;
            }
        }
        Ok(Some(p))
    }

    /// Prepares claim `c`, allotted `allotted` of `gpus` (the GPUs NVML describes now), reserved
    /// for `pods` (name, pod): a CDI spec per device, an index entry per container that uses
    /// the claim (when the index is kept), then the checkpoint. Err: one line naming the claim;
    /// nothing is left of it.
    pub fn prepare(
        &mut self,
        c: &ClaimRef,
        allotted: Vec<Allotted>,
        gpus: &[Gpu],
        pods: &[(String, Pod)],
    ) -> Result<&Prepared, String> {
        let p = &self.places;
        let with_gpus: Vec<(Allotted, &Gpu)> = allotted
            .into_iter()
            .map(|a| {
                let gpu = gpus
                    .iter()
                    .find(|g| g.name() == a.device)
                    .expect("allotments are of usable GPUs");
                (a, gpu)
            })
            .collect();
        // One spec for the claim, with a CDI device per GPU.
        let spec = cdi::build(c, &with_gpus, &p.roots, &p.hook, &p.library);
        let spec_file = p.cdi_dir.join(cdi::file_name(c));
        if !with_gpus.is_empty() {
            write_spec(&spec_file, &spec).map_err(|e| format!("{c}: {e}"))?;
        }
        let devices: Vec<PreparedDevice> = with_gpus
            .into_iter()
            .map(|(a, _)| PreparedDevice {
                cdi_ids: vec![cdi::id(c, &a)],
                allotted: a,
                pool: p.pool.clone(),
                spec_file: spec_file.clone(),
                spec: spec.clone(),
            })
            .collect();
        let index_files = match &self.places.container_index {
            Some(dir) => match write_index(dir, c, pods, &devices) {
                Ok(files) => files,
                Err(e) => {
                    for d in &devices {
                        let _ = std::fs::remove_file(&d.spec_file);
                    }
                    return Err(format!("{c}: {e}"));
                }
            },
            None => Vec::new(),
        };
        let p = Prepared {
            claim: c.clone(),
            devices,
            index_files,
        };
        self.checkpoint.claims.insert(c.uid.clone(), p.clone());
        if let Err(e) = checkpoint::save(&self.places.checkpoint, &self.checkpoint) {
            self.checkpoint.claims.remove(&c.uid);
            for f in p.devices.iter().map(|d| &d.spec_file).chain(&p.index_files) {
                let _ = std::fs::remove_file(f);
            }
            return Err(format!("{c}: {e}"));
        }
        for d in &p.devices {
            let a = &d.allotted;
            log(&format!(
                "prepared {c}: {} ({}) memory {} cores {} limit {} as {}",
                a.device,
                a.uuid,
                a.memory,
                a.core_request,
                a.core_limit,
                d.cdi_ids.join(",")
            ));
        }
        Ok(&self.checkpoint.claims[&c.uid])
    }

    /// Unprepares claim `c`: its index entries, its specs, then its checkpoint entry. A claim
    /// not prepared here (or unprepared already) has nothing to undo. Err: one line naming the
    /// claim; the checkpoint keeps it, so that the kubelet's next call tries again.
    pub fn unprepare(&mut self, c: &ClaimRef) -> Result<(), String> {
        let Some(p) = self.checkpoint.claims.get(&c.uid).cloned() else {
            return Ok(());
        };
        for f in &p.index_files {
            match std::fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{c}: {}: {e}", f.display())),
            }
        }
        for d in &p.devices {
            let (dir, name) = (
                d.spec_file.parent().unwrap_or(Path::new(".")),
                d.spec_file
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy(),
            );
            cuslice_cdi::remove_spec(dir, &name).map_err(|e| format!("{c}: {e}"))?;
        }
        self.checkpoint.claims.remove(&c.uid);
        if let Err(e) = checkpoint::save(&self.places.checkpoint, &self.checkpoint) {
            self.checkpoint.claims.insert(c.uid.clone(), p);
            return Err(format!("{c}: {e}"));
        }
        log(&format!("unprepared {c}"));
        Ok(())
    }
}

fn write_spec(path: &Path, spec: &cuslice_cdi::Spec) -> Result<(), String> {
    let (dir, name) = (
        path.parent().unwrap_or(Path::new(".")),
        path.file_name().unwrap_or_default().to_string_lossy(),
    );
    cuslice_cdi::write_spec(dir, &name, spec).map(|_| ())
}

/// Writes the claim's container index entries: for each pod the claim is reserved for, each of
/// its containers that uses the claim gets the CDI ids of the devices it names. Every entry is
/// made before any file is written; a file that cannot be written removes those written.
fn write_index(
    dir: &Path,
    c: &ClaimRef,
    pods: &[(String, Pod)],
    devices: &[PreparedDevice],
) -> Result<Vec<PathBuf>, String> {
    let mut entries = Vec::new();
    for (pod_name, pod) in pods {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for (container, request) in crate::index::containers_using(pod, &c.name) {
            let ids: Vec<String> = devices
                .iter()
                .filter(|d| request.as_ref().is_none_or(|q| *q == d.allotted.request))
                .flat_map(|d| d.cdi_ids.clone())
                .collect();
            let name = cuslice_cdi::index_file(&c.namespace, pod_name, &container, &c.uid)?;
            let entry = cuslice_cdi::IndexEntry {
                pod_uid: uid.clone(),
                cdi_devices: ids,
                claim: Some(c.name.clone()),
            };
            entries.push((dir.join(name), entry));
        }
    }
    let mut files = Vec::new();
    for (path, entry) in entries {
        let written = std::fs::create_dir_all(dir).and_then(|()| {
            cuslice_state::fsio::write_atomic(
                &path,
                serde_json::to_string(&entry).expect("JSON").as_bytes(),
                0o644,
                cuslice_state::fsio::Durability::Full,
            )
        });
        if let Err(e) = written {
            for f in &files {
                let _ = std::fs::remove_file(f);
            }
            return Err(format!("{}: {e}", path.display()));
        }
        files.push(path);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use cuslice_node::nvml::Description;

    use super::*;

    fn gpu(index: u32) -> Gpu {
        Gpu {
            description: Description {
                index,
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                total: 80 << 30,
                minor: Some(index),
                compute_capability: Some((9, 0)),
            },
            driver_version: "580.95.05".into(),
            oversubscription: crate::resource_slice::NO_OVERSUBSCRIPTION,
        }
    }

    fn places(dir: &Path) -> Places {
        Places {
            checkpoint: dir.join("plugin/checkpoint.json"),
            cdi_dir: dir.join("cdi"),
            container_index: None,
            pool: "node-a".into(),
            roots: Roots {
                host: dir.join("host"),
                driver: "/".into(),
            },
            hook: "/h".into(),
            library: "/l".into(),
        }
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        }
    }

    fn allotted(device: &str) -> Allotted {
        Allotted {
            request: "gpu".into(),
            device: device.into(),
            uuid: "GPU-1".into(),
            memory: 1 << 30,
            core_request: 30,
            core_limit: 30,
            priority: None,
            memory_wait: None,
            memory_spill: None,
            memory_freeze_idle: None,
        }
    }

    #[test]
    fn prepare_writes_the_spec_then_the_checkpoint_and_unprepare_undoes_both() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("plugin")).unwrap();
        let mut st = DeviceState::load(places(d.path())).unwrap();
        assert!(st.prepared(&claim()).unwrap().is_none());
        let p = st
            .prepare(&claim(), vec![allotted("gpu-1")], &[gpu(0), gpu(1)], &[])
            .unwrap()
            .clone();
        assert_eq!(p.devices.len(), 1);
        assert_eq!(
            p.devices[0].cdi_ids,
            ["gpu.cuslice.io/claim=u1-gpu-1".to_owned()]
        );
        assert_eq!(p.devices[0].pool, "node-a");
        let spec = p.devices[0].spec_file.clone();
        assert!(spec.starts_with(d.path().join("cdi")) && spec.exists());
        // Read back by a restarted plugin: the same claim, and a spec that went missing is
        // written again.
        std::fs::remove_file(&spec).unwrap();
        let again = DeviceState::load(places(d.path())).unwrap();
        assert_eq!(again.prepared(&claim()).unwrap(), Some(&p));
        assert!(spec.exists());
        // Unprepared: nothing left, and unpreparing again has nothing to undo.
        st.unprepare(&claim()).unwrap();
        assert!(!spec.exists());
        assert!(st.prepared(&claim()).unwrap().is_none());
        let reloaded = DeviceState::load(places(d.path())).unwrap();
        assert!(reloaded.prepared(&claim()).unwrap().is_none());
        st.unprepare(&claim()).unwrap();
    }

    /// A claim of two GPUs is one spec with a CDI device per GPU, each with its own settings,
    /// and a container index entry that names both.
    #[test]
    fn a_claim_of_two_gpus_is_one_spec_with_a_device_each() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("plugin")).unwrap();
        let mut places = places(d.path());
        places.container_index = Some(d.path().join("index"));
        let mut st = DeviceState::load(places).unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "spec": {
                "resourceClaims": [{"name": "gpus", "resourceClaimName": "c"}],
                "containers": [{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}]
            }
        }))
        .unwrap();
        let mut second = allotted("gpu-1");
        second.memory = 2 << 30;
        let p = st
            .prepare(
                &claim(),
                vec![allotted("gpu-0"), second],
                &[gpu(0), gpu(1)],
                &[("p".into(), pod)],
            )
            .unwrap()
            .clone();
        assert_eq!(p.devices.len(), 2);
        let file = &p.devices[0].spec_file;
        assert_eq!(file, &p.devices[1].spec_file);
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let devices = spec["devices"].as_array().unwrap();
        let names: Vec<&str> = devices
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["u1-gpu-0", "u1-gpu-1"]);
        let env = |i: usize| -> Vec<&str> {
            devices[i]["containerEdits"]["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect()
        };
        assert!(
            env(0).contains(&"CUSLICE_MEMORY_LIMIT_0=1073741824"),
            "{:?}",
            env(0)
        );
        assert!(
            env(1).contains(&"CUSLICE_MEMORY_LIMIT_1=2147483648"),
            "{:?}",
            env(1)
        );
        let entry: cuslice_cdi::IndexEntry =
            serde_json::from_str(&std::fs::read_to_string(&p.index_files[0]).unwrap()).unwrap();
        assert_eq!(
            entry.cdi_devices,
            [
                "gpu.cuslice.io/claim=u1-gpu-0".to_owned(),
                "gpu.cuslice.io/claim=u1-gpu-1".to_owned()
            ]
        );
        st.unprepare(&claim()).unwrap();
        assert!(!file.exists() && !p.index_files[0].exists());
    }

    #[test]
    fn index_entries_name_each_container_that_uses_the_claim_and_go_with_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("plugin")).unwrap();
        let mut places = places(d.path());
        places.container_index = Some(d.path().join("index"));
        let mut st = DeviceState::load(places).unwrap();
        assert!(st.keeps_index());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
                "containers": [
                    {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "sidecar"}
                ]
            }
        }))
        .unwrap();
        let p = st
            .prepare(
                &claim(),
                vec![allotted("gpu-1")],
                &[gpu(1)],
                &[("p".into(), pod)],
            )
            .unwrap()
            .clone();
        assert_eq!(p.index_files.len(), 1);
        let entry: cuslice_cdi::IndexEntry =
            serde_json::from_str(&std::fs::read_to_string(&p.index_files[0]).unwrap()).unwrap();
        assert_eq!(entry.pod_uid, "pod-uid");
        assert_eq!(entry.cdi_devices, p.devices[0].cdi_ids);
        assert_eq!(entry.claim.as_deref(), Some("c"));
        st.unprepare(&claim()).unwrap();
        assert!(!p.index_files[0].exists());
    }

    #[test]
    fn a_checkpoint_that_cannot_be_written_leaves_nothing_prepared() {
        let d = tempfile::tempdir().unwrap();
        // The checkpoint's directory is missing: its write fails.
        let mut st = DeviceState::load(places(d.path())).unwrap();
        let e = st
            .prepare(&claim(), vec![allotted("gpu-1")], &[gpu(1)], &[])
            .unwrap_err();
        assert!(e.starts_with(&format!("{}: ", claim())), "{e}");
        assert!(st.prepared(&claim()).unwrap().is_none());
        let specs: Vec<_> = std::fs::read_dir(d.path().join("cdi"))
            .map(|r| r.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(specs.is_empty(), "{specs:?}");
    }
}
