//! The name an operator gave a container, where the engine keeps it beside the bundle rather
//! than in config.json: what `cuslice status` shows and `cuslice set NAME` takes.
//!
//! - Docker passes no name to the runtime (20.10, as tested); it keeps each container's
//!   configuration in `DATA_ROOT/containers/ID/config.v2.json` (`"Name": "/web"`), the
//!   directory whose `hostname` file config.json mounts at `/etc/hostname`.
//! - Podman (containers/storage) keeps the names in `GRAPHROOT/DRIVER-containers/
//!   containers.json`, two directories above the bundle (`.../DRIVER-containers/ID/userdata`):
//!   `[{"id": ID, "names": ["web"], ...}]`.
//!
//! Kubernetes (containerd's CRI and CRI-O) and nerdctl pass names as annotations, read by
//! [`crate::settings::display_name`]; `ctr run` and runc take the name as the container's id.
//! Each file is read only for a container that asks for cuslice, bounded, and believed only
//! where it names the container's own id. Pure where it can be: the parsers take text.

use std::io::Read;
use std::path::Path;

/// The most of an engine's file read: a node's containers.json with thousands of containers
/// is a few MiB.
const MAX_FILE: u64 = 16 << 20;

/// The container's name as its engine keeps it, where one of the engines above does: `None`
/// where none of them ran it, or a file does not name the container `id`.
pub fn engine_name(spec: &serde_json::Value, bundle: &Path, id: &str) -> Option<String> {
    docker_name(spec, id).or_else(|| storage_name(bundle, id))
}

fn read_bounded(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Docker's: `config.v2.json` beside the `/etc/hostname` mount's source.
fn docker_name(spec: &serde_json::Value, id: &str) -> Option<String> {
    let source = spec
        .get("mounts")?
        .as_array()?
        .iter()
        .find(|m| m.get("destination").and_then(|d| d.as_str()) == Some("/etc/hostname"))?
        .get("source")?
        .as_str()?;
    let dir = Path::new(source).parent()?;
    if dir.file_name()? != id {
        return None;
    }
    docker_config_name(&read_bounded(&dir.join("config.v2.json"))?, id)
}

/// The name in Docker's `config.v2.json` text, if it is the configuration of container `id`.
pub fn docker_config_name(text: &str, id: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v.get("ID")?.as_str()? != id {
        return None;
    }
    let name = v.get("Name")?.as_str()?;
    Some(name.strip_prefix('/').unwrap_or(name).to_string()).filter(|n| !n.is_empty())
}

/// containers/storage's: `containers.json` two directories above a bundle named
/// `.../ID/userdata`.
fn storage_name(bundle: &Path, id: &str) -> Option<String> {
    if bundle.file_name()? != "userdata" {
        return None;
    }
    let dir = bundle.parent()?;
    if dir.file_name()? != id {
        return None;
    }
    let store = dir.parent()?;
    if !store.file_name()?.to_str()?.ends_with("-containers") {
        return None;
    }
    storage_names_name(&read_bounded(&store.join("containers.json"))?, id)
}

/// The first name containers/storage's `containers.json` text gives container `id`.
pub fn storage_names_name(text: &str, id: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.as_array()?
        .iter()
        .find(|c| c.get("id").and_then(|i| i.as_str()) == Some(id))?
        .get("names")?
        .as_array()?
        .first()?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "400d5cb2cbe7b79e1c0b73f2fe5d6f5d9f76177f404d69fb440f6dd2ff82ee6a";

    #[test]
    fn docker_names_come_from_the_containers_own_configuration() {
        let text = format!(r#"{{"ID":"{ID}","Name":"/web","State":{{}}}}"#);
        assert_eq!(docker_config_name(&text, ID).as_deref(), Some("web"));
        // Another container's file, or no name, or not JSON: none.
        assert_eq!(docker_config_name(&text, "abc"), None);
        assert_eq!(
            docker_config_name(&format!(r#"{{"ID":"{ID}","Name":"/"}}"#), ID),
            None
        );
        assert_eq!(docker_config_name("{", ID), None);
    }

    #[test]
    fn podman_names_come_from_containers_json() {
        let text = format!(
            r#"[{{"id":"other","names":["db"]}},{{"id":"{ID}","names":["web","alias"],"layer":"x"}}]"#
        );
        assert_eq!(storage_names_name(&text, ID).as_deref(), Some("web"));
        assert_eq!(storage_names_name(&text, "nope"), None);
        assert_eq!(storage_names_name(r#"[{"id":"a","names":[]}]"#, "a"), None);
    }

    #[test]
    fn files_are_found_only_where_the_engines_keep_them() {
        let dir = tempfile::tempdir().unwrap();
        // Docker: DATA_ROOT/containers/ID/{hostname,config.v2.json}.
        let c = dir.path().join("containers").join(ID);
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(
            c.join("config.v2.json"),
            format!(r#"{{"ID":"{ID}","Name":"/web"}}"#),
        )
        .unwrap();
        let spec = serde_json::json!({"mounts": [
            {"destination": "/etc/hostname", "source": c.join("hostname")}
        ]});
        assert_eq!(
            engine_name(&spec, Path::new("/nowhere"), ID).as_deref(),
            Some("web")
        );
        assert_eq!(engine_name(&spec, Path::new("/nowhere"), "other"), None);
        // containers/storage: GRAPHROOT/vfs-containers/{containers.json,ID/userdata}.
        let store = dir.path().join("vfs-containers");
        let bundle = store.join(ID).join("userdata");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(
            store.join("containers.json"),
            format!(r#"[{{"id":"{ID}","names":["db"]}}]"#),
        )
        .unwrap();
        let none = serde_json::json!({});
        assert_eq!(engine_name(&none, &bundle, ID).as_deref(), Some("db"));
        assert_eq!(engine_name(&none, &store.join(ID), ID), None);
    }
}
