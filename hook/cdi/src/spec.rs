//! The spec file's schema (cdiVersion, kind, devices, containerEdits), its validation (what a
//! runtime would refuse), and reading a spec file (JSON or YAML).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::hooks::HOOK_NAMES;
use crate::id::{check_device_name, check_kind};

/// The CDI version cuslice writes.
pub const CDI_VERSION: &str = "0.5.0";

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    /// `VENDOR/CLASS`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    /// Edits for every container that gets at least one of this spec's devices.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    /// Edits of later CDI versions that cuslice does not apply (intelRdt, netDevices): kept so a
    /// spec reads back whole, refused when a container asks for a device that has them.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// The path in the container.
    pub path: String,
    /// The node on the host (default: `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`; read from the host node when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access, a subset of `rwm` (default `rwm`), or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The OCI hook list: one of [`HOOK_NAMES`].
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
            && self.other.is_empty()
    }

    /// Appends `o`'s edits after these.
    pub fn append(&mut self, o: &ContainerEdits) {
        self.env.extend(o.env.iter().cloned());
        self.device_nodes.extend(o.device_nodes.iter().cloned());
        self.hooks.extend(o.hooks.iter().cloned());
        self.mounts.extend(o.mounts.iter().cloned());
        self.additional_gids
            .extend(o.additional_gids.iter().copied());
        for (k, v) in &o.other {
            self.other.insert(k.clone(), v.clone());
        }
    }

    /// Checks what a runtime would refuse: env without `NAME=`, device nodes without a path or
    /// with an unknown type or permissions, unknown hook names, hooks or mounts without paths.
    pub fn validate(&self) -> Result<(), String> {
        for e in &self.env {
            check_env(e)?;
        }
        for d in &self.device_nodes {
            if d.path.is_empty() {
                return Err("a device node has an empty path".into());
            }
            if let Some(t) = &d.kind
                && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
            {
                return Err(format!(
                    "device node {}: type {t:?} is not b, c, u or p",
                    d.path
                ));
            }
            if d.major.is_some_and(|m| m < 0) || d.minor.is_some_and(|m| m < 0) {
                return Err(format!("device node {}: negative device number", d.path));
            }
            if let Some(p) = &d.permissions
                && p != "none"
                && !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
            {
                return Err(format!(
                    "device node {}: permissions {p:?} are not a subset of \"rwm\" or \"none\"",
                    d.path
                ));
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(format!(
                    "hook name {:?} is not one of {}",
                    h.hook_name,
                    HOOK_NAMES.join(", ")
                ));
            }
            if h.path.is_empty() {
                return Err(format!("a {} hook has an empty path", h.hook_name));
            }
            for e in &h.env {
                check_env(e)?;
            }
        }
        for m in &self.mounts {
            if m.host_path.is_empty() || m.container_path.is_empty() {
                return Err(format!(
                    "a mount has an empty path (hostPath {:?}, containerPath {:?})",
                    m.host_path, m.container_path
                ));
            }
        }
        Ok(())
    }
}

fn check_env(e: &str) -> Result<(), String> {
    match e.find('=') {
        Some(i) if i > 0 => Ok(()),
        _ => Err(format!(
            "environment entry {e:?} is not NAME=VALUE (e.g. CUSLICE_CORE_LIMIT=60)"
        )),
    }
}

impl Spec {
    /// The spec's device `name` as a fully-qualified id: `KIND=NAME`.
    pub fn qualified(&self, name: &str) -> String {
        format!("{}={name}", self.kind)
    }

    /// The checks a runtime makes when it loads the spec: a valid kind, valid and distinct
    /// device names, valid edits.
    pub fn validate(&self) -> Result<(), String> {
        if self.cdi_version.is_empty() {
            return Err("cdiVersion is missing".into());
        }
        check_kind(&self.kind)?;
        if self.devices.is_empty() {
            return Err("the spec defines no devices".into());
        }
        self.container_edits.validate()?;
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            check_device_name(&d.name)?;
            if !seen.insert(d.name.as_str()) {
                return Err(format!("device {:?} is defined twice", d.name));
            }
            if d.container_edits.is_empty() {
                return Err(format!("device {:?} has no containerEdits", d.name));
            }
            d.container_edits
                .validate()
                .map_err(|e| format!("device {:?}: {e}", d.name))?;
        }
        Ok(())
    }

    /// The spec as a file: two-space JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// Parses a spec file's text: JSON for `.json`, YAML otherwise.
pub fn parse_spec(path: &Path, text: &str) -> Result<Spec, String> {
    let json = path.extension().is_some_and(|e| e == "json");
    let spec: Spec = if json {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_norway::from_str(text).map_err(|e| e.to_string())?
    };
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use crate::claim::example as claim;
    use crate::spec::ContainerEdits;

    #[test]
    fn spec_validation() {
        let mut s = claim();
        s.kind = "gpu.cuslice.io".into();
        assert!(s.validate().unwrap_err().contains("VENDOR/CLASS"));
        let mut s = claim();
        s.devices.push(s.devices[0].clone());
        assert!(s.validate().unwrap_err().contains("defined twice"));
        let mut s = claim();
        s.devices[0].container_edits.env.push("=x".into());
        assert!(s.validate().unwrap_err().contains("NAME=VALUE"));
        let mut s = claim();
        s.container_edits.hooks[0].hook_name = "prestop".into();
        assert!(s.validate().unwrap_err().contains("\"prestop\""));
        let mut s = claim();
        s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into());
        assert!(s.validate().unwrap_err().contains("permissions"));
        let mut s = claim();
        s.devices[0].container_edits = ContainerEdits::default();
        assert!(s.validate().unwrap_err().contains("no containerEdits"));
    }
}
