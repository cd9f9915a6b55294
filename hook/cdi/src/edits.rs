//! [`apply_edits`]: a resolved device's container edits applied to an OCI config.json, as CDI's
//! Go implementation applies them (Ref: container-device-interface pkg/cdi/container-edits.go).

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::spec::ContainerEdits;

/// What the host says about a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostNode {
    /// `c`, `b` or `p`.
    pub kind: char,
    pub major: i64,
    pub minor: i64,
    /// Permission bits.
    pub mode: u32,
}

/// `stat(2)` of a device node on the host (following symlinks, as CDI does).
pub fn host_node(path: &Path) -> Result<HostNode, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    let t = m.file_type();
    let kind = if t.is_char_device() {
        'c'
    } else if t.is_block_device() {
        'b'
    } else if t.is_fifo() {
        'p'
    } else {
        return Err(format!("{} is not a device node", path.display()));
    };
    Ok(HostNode {
        kind,
        major: i64::from(libc::major(m.rdev())),
        minor: i64::from(libc::minor(m.rdev())),
        mode: m.mode() & 0o777,
    })
}

fn obj<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Map<String, Value>, String> {
    v.as_object_mut()
        .ok_or_else(|| format!("config.json: {what} is not an object"))
}

/// `parent[key]` as an object, made if missing.
fn child_obj<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Map<String, Value>, String> {
    obj(parent.entry(key).or_insert_with(|| json!({})), what)
}

/// `parent[key]` as an array, made if missing.
fn child_arr<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Vec<Value>, String> {
    parent
        .entry(key)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| format!("config.json: {what} is not an array"))
}

/// Applies `edits` to an OCI config.json: env entries replace earlier ones of the same name (or
/// are appended); device nodes go into `linux.devices` (replacing one at the same path), with
/// type, major and minor read from the host node (`stat` of hostPath, else path) where the edit
/// leaves them out, and an allow rule in `linux.resources.devices`; mounts go into `mounts`
/// (replacing one at the same destination; then sorted by depth, stably, as CDI does); hooks are
/// appended to `hooks.<hookName>`; additional gids to `process.user.additionalGids`. Applying
/// the same edits twice gives the same config (an identical hook or allow rule is not added
/// again).
pub fn apply_edits(
    config: &mut Value,
    edits: &ContainerEdits,
    stat: &dyn Fn(&Path) -> Result<HostNode, String>,
) -> Result<(), String> {
    edits.validate()?;
    let root = obj(config, "the spec")?;

    if !edits.env.is_empty() || !edits.additional_gids.is_empty() {
        let process = child_obj(root, "process", "process")?;
        for e in &edits.env {
            let env = child_arr(process, "env", "process.env")?;
            let name = &e[..=e.find('=').unwrap_or(0)];
            env.retain(|x| !x.as_str().is_some_and(|x| x.starts_with(name)));
            env.push(Value::from(e.as_str()));
        }
        if !edits.additional_gids.is_empty() {
            let user = child_obj(process, "user", "process.user")?;
            let gids = child_arr(user, "additionalGids", "process.user.additionalGids")?;
            for g in edits.additional_gids.iter().filter(|g| **g != 0) {
                if !gids.iter().any(|x| x.as_u64() == Some(u64::from(*g))) {
                    gids.push(Value::from(*g));
                }
            }
        }
    }

    if !edits.device_nodes.is_empty() {
        let uid = root
            .get("process")
            .and_then(|p| p.pointer("/user/uid"))
            .and_then(Value::as_u64)
            .filter(|u| *u > 0);
        let gid = root
            .get("process")
            .and_then(|p| p.pointer("/user/gid"))
            .and_then(Value::as_u64)
            .filter(|g| *g > 0);
        let linux = child_obj(root, "linux", "linux")?;
        let mut rules = Vec::new();
        {
            let devices = child_arr(linux, "devices", "linux.devices")?;
            for d in &edits.device_nodes {
                let host = d.host_path.as_deref().unwrap_or(&d.path);
                let mut kind = d.kind.clone().filter(|t| !t.is_empty());
                let (mut major, mut minor, mut mode) = (d.major, d.minor, d.file_mode);
                let complete = match kind.as_deref() {
                    Some("p") => true,
                    Some(_) => major.is_some() && minor.is_some(),
                    None => false,
                };
                if !complete {
                    let n = stat(Path::new(host))
                        .map_err(|e| format!("device node {}: {e}", d.path))?;
                    let host_kind = n.kind.to_string();
                    match kind.as_deref() {
                        None => kind = Some(host_kind),
                        // `u` (unbuffered character device) is what stat calls `c`.
                        Some(t) if t == host_kind || (t == "u" && n.kind == 'c') => {}
                        Some(t) => {
                            return Err(format!(
                                "device node {}: type {t:?} but {host} is of type {:?}",
                                d.path, n.kind
                            ));
                        }
                    }
                    if n.kind != 'p' {
                        major = major.or(Some(n.major));
                        minor = minor.or(Some(n.minor));
                    }
                    mode = mode.or(Some(n.mode));
                }
                let kind = kind.unwrap_or_default();
                let mut entry = Map::new();
                entry.insert("path".into(), Value::from(d.path.as_str()));
                entry.insert("type".into(), Value::from(kind.as_str()));
                if let (Some(ma), Some(mi)) = (major, minor) {
                    entry.insert("major".into(), Value::from(ma));
                    entry.insert("minor".into(), Value::from(mi));
                }
                if let Some(m) = mode {
                    entry.insert("fileMode".into(), Value::from(m));
                }
                if let Some(u) = d.uid.map(u64::from).or(uid) {
                    entry.insert("uid".into(), Value::from(u));
                }
                if let Some(g) = d.gid.map(u64::from).or(gid) {
                    entry.insert("gid".into(), Value::from(g));
                }
                devices.retain(|x| x.get("path").and_then(Value::as_str) != Some(&d.path));
                devices.push(Value::Object(entry));
                if matches!(kind.as_str(), "b" | "c" | "u") {
                    let access = match d.permissions.as_deref() {
                        None | Some("") => "rwm",
                        Some("none") => "",
                        Some(p) => p,
                    };
                    rules.push(json!({
                        "allow": true,
                        "type": if kind == "b" { "b" } else { "c" },
                        "major": major,
                        "minor": minor,
                        "access": access,
                    }));
                }
            }
        }
        let resources = child_obj(linux, "resources", "linux.resources")?;
        let existing = child_arr(resources, "devices", "linux.resources.devices")?;
        for r in rules {
            if !existing.contains(&r) {
                existing.push(r);
            }
        }
    }

    if !edits.mounts.is_empty() {
        let mounts = child_arr(root, "mounts", "mounts")?;
        for m in &edits.mounts {
            mounts.retain(|x| {
                x.get("destination").and_then(Value::as_str) != Some(&m.container_path)
            });
            let mut entry = Map::new();
            entry.insert("destination".into(), Value::from(m.container_path.as_str()));
            if let Some(t) = &m.kind {
                entry.insert("type".into(), Value::from(t.as_str()));
            }
            entry.insert("source".into(), Value::from(m.host_path.as_str()));
            if !m.options.is_empty() {
                entry.insert("options".into(), json!(m.options));
            }
            mounts.push(Value::Object(entry));
        }
        // Parents before what is mounted inside them.
        let depth = |m: &Value| {
            let d = m.get("destination").and_then(Value::as_str).unwrap_or("");
            Path::new(d).components().count()
        };
        mounts.sort_by_key(depth);
    }

    if !edits.hooks.is_empty() {
        let hooks = child_obj(root, "hooks", "hooks")?;
        for h in &edits.hooks {
            let list = child_arr(hooks, &h.hook_name, &format!("hooks.{}", h.hook_name))?;
            let mut entry = Map::new();
            entry.insert("path".into(), Value::from(h.path.as_str()));
            if !h.args.is_empty() {
                entry.insert("args".into(), json!(h.args));
            }
            if !h.env.is_empty() {
                entry.insert("env".into(), json!(h.env));
            }
            if let Some(t) = h.timeout {
                entry.insert("timeout".into(), Value::from(t));
            }
            // The same hook twice would run twice: applying edits again (a retried `create`
            // on the same bundle) changes nothing.
            let entry = Value::Object(entry);
            if !list.contains(&entry) {
                list.push(entry);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::claim::example as claim;
    use crate::spec::DeviceNode;

    fn null_node(_: &Path) -> Result<HostNode, String> {
        Ok(HostNode {
            kind: 'c',
            major: 1,
            minor: 3,
            mode: 0o666,
        })
    }

    #[test]
    fn edits_applied_to_config() {
        let mut config = json!({
            "process": {"env": ["PATH=/bin", "CUSLICE_CORE_LIMIT=10"], "user": {"uid": 0, "gid": 0}},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "source": "/old"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}
            ],
            "hooks": {"poststop": [{"path": "/other"}]},
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}
        });
        let mut edits = claim().container_edits;
        edits.append(&claim().devices[0].container_edits);
        let asked = std::cell::RefCell::new(Vec::new());
        let stat = |p: &Path| {
            asked.borrow_mut().push(p.to_path_buf());
            null_node(p)
        };
        apply_edits(&mut config, &edits, &stat).unwrap();
        assert_eq!(
            config["process"]["env"],
            json!([
                "PATH=/bin",
                "CUSLICE_MEMORY_LIMIT=1073741824",
                "CUSLICE_CORE_REQUEST=30",
                "CUSLICE_CORE_LIMIT=60"
            ])
        );
        assert_eq!(
            *asked.borrow(),
            [
                PathBuf::from("/dev/nvidia0"),
                PathBuf::from("/dev/nvidiactl")
            ]
        );
        assert_eq!(
            config["linux"]["devices"][0],
            json!({"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666})
        );
        assert_eq!(
            config["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
            ])
        );
        let dests: Vec<&str> = config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            dests,
            ["/proc", "/dev", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        );
        assert_eq!(
            config["mounts"][2],
            json!({
                "destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "type": "bind",
                "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"]
            })
        );
        assert_eq!(config["hooks"]["poststop"][0], json!({"path": "/other"}));
        assert_eq!(
            config["hooks"]["poststop"][1]["args"],
            json!([
                "cuslice-hook",
                "poststop",
                "--library",
                "/usr/local/lib/cuslice/libcuslice.so"
            ])
        );
        assert_eq!(
            config["hooks"]["createRuntime"][0]["path"],
            "/usr/local/bin/cuslice-hook"
        );
        // Twice is once: no second hook, rule, env entry, node or mount.
        let once = config.clone();
        apply_edits(&mut config, &edits, &stat).unwrap();
        assert_eq!(config, once);
    }

    #[test]
    fn device_node_details() {
        let node = |d: DeviceNode| ContainerEdits {
            device_nodes: vec![d],
            ..ContainerEdits::default()
        };
        // Complete nodes are not looked up; permissions reach the cgroup rule; a non-root
        // process owns its nodes; a node at the same path is replaced.
        let mut config = json!({
            "process": {"user": {"uid": 1000, "gid": 100}},
            "linux": {"devices": [{"path": "/dev/x", "type": "c", "major": 9, "minor": 9}]}
        });
        let never = |p: &Path| -> Result<HostNode, String> { panic!("stat {}", p.display()) };
        let d = DeviceNode {
            path: "/dev/x".into(),
            kind: Some("b".into()),
            major: Some(8),
            minor: Some(0),
            permissions: Some("rw".into()),
            ..DeviceNode::default()
        };
        apply_edits(&mut config, &node(d), &never).unwrap();
        assert_eq!(
            config["linux"]["devices"],
            json!([{"path": "/dev/x", "type": "b", "major": 8, "minor": 0, "uid": 1000, "gid": 100}])
        );
        assert_eq!(
            config["linux"]["resources"]["devices"],
            json!([{"allow": true, "type": "b", "major": 8, "minor": 0, "access": "rw"}])
        );
        // A type that disagrees with the host node; a host node that is missing.
        let d = DeviceNode {
            path: "/dev/y".into(),
            host_path: Some("/host/y".into()),
            kind: Some("b".into()),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!({}), &node(d), &null_node).unwrap_err();
        assert!(e.contains("/host/y is of type 'c'"), "{e}");
        let d = DeviceNode {
            path: "/dev/z".into(),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!({}), &node(d), &|p: &Path| host_node(p)).unwrap_err();
        assert_eq!(
            e,
            "device node /dev/z: cannot stat /dev/z: No such file or directory (os error 2)"
        );
        // The real host: /dev/null is character device 1:3.
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().kind, 'c');
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().major, 1);
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().minor, 3);
        assert!(
            host_node(Path::new("/"))
                .unwrap_err()
                .contains("not a device node")
        );
        // Not an object.
        let d = DeviceNode {
            path: "/dev/a".into(),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!([]), &node(d), &null_node).unwrap_err();
        assert_eq!(e, "config.json: the spec is not an object");
        assert!(
            apply_edits(
                &mut json!({"mounts": {}}),
                &claim().devices[0].container_edits,
                &null_node
            )
            .unwrap_err()
            .contains("is not an array")
        );
    }
}
