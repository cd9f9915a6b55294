//! What to tell the user once an engine's registration is written: how to make the engine use
//! it, and how to use it.

use super::{Cmd, DOCKER_CONFIG, HOOKS_DIR, Options};
use crate::transform::owned;

pub(super) fn docker_notes(o: &Options, target: &str) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => {
            let mut v = vec![
                "docker: make dockerd read the runtime (it reloads runtimes on SIGHUP): kill -HUP $(pidof dockerd)".to_owned(),
                format!("docker: use it: docker run --runtime={n} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."),
            ];
            if o.default_runtime {
                v.push(format!(
                    "docker: default-runtime is {n}: every container runs through it, --runtime=runc opts out"
                ));
            }
            if target != DOCKER_CONFIG {
                v.push(format!(
                    "docker: dockerd reads {target} only when started with --config-file {target}"
                ));
            }
            v
        }
        Cmd::Uninstall => vec![format!(
            "docker: restart dockerd to drop the runtime: systemctl restart docker (on SIGHUP dockerd keeps a runtime or default-runtime that is no longer in daemon.json; containers running with --runtime={n} keep it until they stop)"
        )],
    }
}

pub(super) fn containerd_notes(o: &Options, _version: i64) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => vec![
            "containerd: restart it to load the drop-in: systemctl restart containerd".to_owned(),
            format!(
                "containerd: Kubernetes: a RuntimeClass with handler {n} (install/kubernetes/runtimeclass.yaml), then runtimeClassName: {n} and env CUSLICE_MEMORY_LIMIT in the pod"
            ),
            format!(
                "containerd: ctr: ctr run --runc-binary {} --env CUSLICE_MEMORY_LIMIT=8GiB IMAGE ID",
                o.layout.runtime_path()
            ),
        ],
        Cmd::Uninstall => {
            vec![
                "containerd: restart it to drop the runtime: systemctl restart containerd"
                    .to_owned(),
            ]
        }
    }
}

pub(super) fn podman_notes(o: &Options, dir: &str) -> Vec<String> {
    match o.cmd {
        Cmd::Install => {
            let mut v = vec![
                "podman: nothing to restart: podman reads hooks.d at every run".to_owned(),
                "podman: use it: podman run -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ...".to_owned(),
            ];
            if dir != HOOKS_DIR {
                v.push(format!(
                    "podman: {dir} is not a default hooks directory: pass --hooks-dir {dir} (or set hooks_dir in containers.conf)"
                ));
            }
            v
        }
        Cmd::Uninstall => Vec::new(),
    }
}

pub(super) fn crio_notes(o: &Options) -> Vec<String> {
    let n = o.layout.name();
    match o.cmd {
        Cmd::Install => vec![
            "crio: restart it to load the handler: systemctl restart crio".to_owned(),
            format!(
                "crio: Kubernetes: a RuntimeClass with handler {n}, then runtimeClassName: {n} and env CUSLICE_MEMORY_LIMIT in the pod"
            ),
        ],
        Cmd::Uninstall => {
            vec!["crio: restart it to drop the handler: systemctl restart crio".to_owned()]
        }
    }
}

pub(super) fn cdi_notes(o: &Options) -> Vec<String> {
    let device = format!("{}={}", owned::CDI_KIND, owned::cdi_device(o.layout.name()));
    match o.cmd {
        Cmd::Install => vec![
            format!("cdi: podman run --device {device} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."),
            format!(
                "cdi: Docker >= 25 with the cdi feature (\"features\": {{\"cdi\": true}} in daemon.json): docker run --device {device} -e CUSLICE_MEMORY_LIMIT=8GiB IMAGE ..."
            ),
            format!(
                "cdi: containerd >= 1.7 with enable_cdi = true in its CRI config: the device {device} is requested through a device plugin or the annotation cdi.k8s.io/..."
            ),
        ],
        Cmd::Uninstall => Vec::new(),
    }
}
