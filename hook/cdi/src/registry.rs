//! [`Registry`]: the specs of a list of directories (`/etc/cdi`, `/var/run/cdi` by default;
//! `.json`, `.yaml` and `.yml`), resolving fully-qualified device ids `VENDOR/CLASS=NAME` to the
//! container edits they stand for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cuslice_policy::echo::cut;

use crate::id::parse_qualified;
use crate::spec::{ContainerEdits, Spec, parse_spec};

/// Where runtimes look for specs, lowest priority first (a device defined in a later directory
/// overrides one in an earlier directory).
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Where a device is defined.
#[derive(Debug, Clone)]
struct Defined {
    spec: usize,
    device: usize,
}

/// The specs found in a list of directories, and their devices by fully-qualified id.
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    /// (file, priority: the index of its directory, spec).
    specs: Vec<(PathBuf, usize, Spec)>,
    devices: BTreeMap<String, Defined>,
    /// Ids defined differently by two files of the same directory.
    conflicts: BTreeMap<String, (PathBuf, PathBuf)>,
    /// Files that could not be read or are not valid specs: (file, why).
    broken: Vec<(PathBuf, String)>,
}

impl Registry {
    /// Reads every `*.json`, `*.yaml` and `*.yml` in `dirs` (lowest priority first; missing
    /// directories are skipped). A device defined in a later directory overrides one in an
    /// earlier one; the same device defined differently by two files of one directory is a
    /// conflict (as the same definition twice is not). Files that are not valid specs are noted
    /// and skipped; they only matter to ids they might have defined.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut r = Registry {
            dirs: dirs.to_vec(),
            ..Registry::default()
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    r.broken.push((dir.clone(), e.to_string()));
                    continue;
                }
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let hidden = p
                        .file_name()
                        .and_then(|f| f.to_str())
                        .is_none_or(|f| f.starts_with('.'));
                    let ext = p.extension().and_then(|e| e.to_str());
                    !hidden && matches!(ext, Some("json" | "yaml" | "yml")) && p.is_file()
                })
                .collect();
            files.sort();
            for file in files {
                let spec = std::fs::read_to_string(&file)
                    .map_err(|e| e.to_string())
                    .and_then(|t| parse_spec(&file, &t));
                match spec {
                    Ok(spec) => r.add(file, priority, spec),
                    Err(e) => r.broken.push((file, e)),
                }
            }
        }
        r
    }

    fn add(&mut self, file: PathBuf, priority: usize, spec: Spec) {
        let index = self.specs.len();
        for (i, d) in spec.devices.iter().enumerate() {
            let id = spec.qualified(&d.name);
            let new = Defined {
                spec: index,
                device: i,
            };
            match self.devices.get(&id) {
                Some(old) if self.specs[old.spec].1 == priority => {
                    let (old_file, _, old_spec) = &self.specs[old.spec];
                    let same = old_spec.devices[old.device] == *d
                        && old_spec.container_edits == spec.container_edits;
                    if !same {
                        self.conflicts
                            .entry(id)
                            .or_insert_with(|| (old_file.clone(), file.clone()));
                    }
                }
                _ => {
                    self.conflicts.remove(&id);
                    self.devices.insert(id, new);
                }
            }
        }
        self.specs.push((file, priority, spec));
    }

    /// The directories searched, for messages: `/etc/cdi, /var/run/cdi`.
    pub fn searched(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The spec file that defines `id`, if one does.
    pub fn file_of(&self, id: &str) -> Option<&Path> {
        self.devices.get(id).map(|d| self.specs[d.spec].0.as_path())
    }

    /// The edits for a container that gets `ids`: for each spec, its spec-level edits once
    /// (where its first device is named), then each device's edits, in the order given.
    /// Fails on the first id that is malformed, not defined, defined in conflict, or whose
    /// edits cuslice cannot apply.
    pub fn resolve<S: AsRef<str>>(&self, ids: &[S]) -> Result<ContainerEdits, Unresolved> {
        let mut edits = ContainerEdits::default();
        let mut specs_done = Vec::new();
        for id in ids {
            let id = id.as_ref();
            let fail = |why: String| Unresolved {
                id: id.to_owned(),
                why,
            };
            parse_qualified(id).map_err(fail)?;
            if let Some((a, b)) = self.conflicts.get(id) {
                return Err(fail(format!(
                    "CDI device {} is defined differently in {} and {}; remove one",
                    cut(id),
                    a.display(),
                    b.display()
                )));
            }
            let Some(d) = self.devices.get(id) else {
                let mut why = format!(
                    "CDI device {} is not defined in any spec under {}",
                    cut(id),
                    self.searched()
                );
                if !self.broken.is_empty() {
                    let broken: Vec<String> = self
                        .broken
                        .iter()
                        .map(|(f, e)| format!("{}: {e}", f.display()))
                        .collect();
                    why.push_str(&format!(
                        " (specs that could not be read: {})",
                        broken.join("; ").replace('\n', " ")
                    ));
                }
                return Err(fail(why));
            };
            let (file, _, spec) = &self.specs[d.spec];
            let device = &spec.devices[d.device];
            if !specs_done.contains(&d.spec) {
                specs_done.push(d.spec);
                edits.append(&spec.container_edits);
            }
            edits.append(&device.container_edits);
            if let Some(k) = spec
                .container_edits
                .other
                .keys()
                .chain(device.container_edits.other.keys())
                .next()
            {
                return Err(fail(format!(
                    "CDI device {id} ({}) asks for containerEdits.{k}, which cuslice-runtime does \
                     not apply; use a runtime with CDI support (containerd >= 1.7, CRI-O, Podman)",
                    file.display()
                )));
            }
        }
        Ok(edits)
    }
}

/// A device id that could not be resolved, and why (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub id: String,
    pub why: String,
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{claim_spec_file, example as claim};
    use crate::file::write_spec;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn registry_resolves_json_and_yaml() {
        let root = tempfile::tempdir().unwrap();
        let (etc, run) = (root.path().join("etc"), root.path().join("run"));
        write_spec(&run, &claim_spec_file("5d1f"), &claim()).unwrap();
        write(
            &etc,
            "vendor.yaml",
            "cdiVersion: 0.6.0\nkind: vendor.com/dev\ncontainerEdits:\n  env: [SPEC=1]\n\
             devices:\n- name: a\n  containerEdits:\n    env: [A=1]\n\
             - name: b\n  containerEdits:\n    env: [B=1]\n",
        );
        // Not specs: skipped, only mentioned when an id is not found.
        write(&etc, "broken.json", "{");
        write(&etc, "notes.txt", "x");
        write(&etc, ".hidden.json", "{");
        let missing = root.path().join("missing");
        let r = Registry::load(&[etc.clone(), run.clone(), missing.clone()]);
        let edits = r
            .resolve(&[
                "vendor.com/dev=a",
                "gpu.cuslice.io/claim=5d1f-gpu-0",
                "vendor.com/dev=b",
            ])
            .unwrap();
        // Spec-level edits once per spec, before its first device's.
        assert_eq!(edits.env[..2], ["SPEC=1", "A=1"]);
        assert_eq!(edits.env[2], "CUSLICE_MEMORY_LIMIT=1073741824");
        assert_eq!(edits.env.last().unwrap(), "B=1");
        assert_eq!(edits.hooks.len(), 2);
        assert_eq!(
            r.file_of("gpu.cuslice.io/claim=5d1f-gpu-0"),
            Some(run.join("gpu.cuslice.io-5d1f.json").as_path())
        );

        let e = r.resolve(&["gpu.cuslice.io/claim=nope"]).unwrap_err();
        assert_eq!(e.id, "gpu.cuslice.io/claim=nope");
        let searched = format!(
            "{}, {}, {}",
            etc.display(),
            run.display(),
            missing.display()
        );
        assert!(
            e.why.starts_with(&format!(
                "CDI device gpu.cuslice.io/claim=nope is not defined in any spec under {searched} \
                 (specs that could not be read: {}",
                etc.join("broken.json").display()
            )),
            "{e}"
        );
        assert!(!e.why.contains('\n'), "{e}");
        let e = r.resolve(&["nope"]).unwrap_err();
        assert!(e.why.contains("VENDOR/CLASS=NAME"), "{e}");
    }

    #[test]
    fn registry_priorities_and_conflicts() {
        let root = tempfile::tempdir().unwrap();
        let (etc, run) = (root.path().join("etc"), root.path().join("run"));
        let spec = |env: &str| {
            format!(
                r#"{{"cdiVersion":"0.5.0","kind":"v.com/c","devices":[{{"name":"d","containerEdits":{{"env":["{env}"]}}}}]}}"#
            )
        };
        write(&etc, "a.json", &spec("X=etc"));
        write(&run, "a.json", &spec("X=run"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        // The later directory wins.
        assert_eq!(r.resolve(&["v.com/c=d"]).unwrap().env, ["X=run"]);
        // The same definition twice in one directory is fine; a different one is a conflict.
        write(&run, "b.json", &spec("X=run"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        assert_eq!(r.resolve(&["v.com/c=d"]).unwrap().env, ["X=run"]);
        write(&run, "c.json", &spec("X=other"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        let e = r.resolve(&["v.com/c=d"]).unwrap_err();
        assert_eq!(
            e.why,
            format!(
                "CDI device v.com/c=d is defined differently in {} and {}; remove one",
                run.join("a.json").display(),
                run.join("c.json").display()
            )
        );
        // Edits cuslice-runtime does not apply are refused, not dropped.
        write(
            &etc,
            "rdt.json",
            r#"{"cdiVersion":"0.6.0","kind":"v.com/r","devices":[{"name":"d","containerEdits":{"intelRdt":{"closID":"x"}}}]}"#,
        );
        let r = Registry::load(&[etc]);
        let e = r.resolve(&["v.com/r=d"]).unwrap_err();
        assert!(e.why.contains("containerEdits.intelRdt"), "{e}");
    }
}
