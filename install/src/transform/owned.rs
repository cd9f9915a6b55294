//! Files cuslice owns outright (it writes them whole and uninstall deletes them): Podman's OCI
//! hook descriptors, CRI-O's drop-in and the CDI spec. Each is a pure function of the layout.

use serde_json::{Value, json};

use crate::layout::{Layout, STAGES};
use crate::transform::jsonedit::{Style, pretty};

/// JSON as cuslice writes it: two-space indentation, a trailing newline.
fn json_file(v: &Value) -> String {
    let style = Style {
        indent: "  ".into(),
        newline: "\n",
    };
    format!("{}\n", pretty(v, "", &style))
}

/// The hooks.d descriptor file name for one stage: `50-NAME-createruntime.json`.
pub fn podman_hook_file(name: &str, stage: &str) -> String {
    format!("50-{name}-{}.json", stage.to_ascii_lowercase())
}

/// One OCI hook descriptor (hooks.d schema 1.0.0): a descriptor's args are the same for every
/// stage it lists, so there is one per stage.
pub fn podman_hook(l: &Layout, stage: &str) -> String {
    json_file(&json!({
        "version": "1.0.0",
        "hook": {
            "path": l.hook_path(),
            "args": l.hook_args(stage),
        },
        "when": { "always": true },
        "stages": [stage],
    }))
}

/// All hooks.d descriptors: (file name, contents), one per stage.
pub fn podman_hooks(l: &Layout) -> Vec<(String, String)> {
    STAGES
        .iter()
        .map(|s| (podman_hook_file(l.name(), s), podman_hook(l, s)))
        .collect()
}

/// CRI-O's drop-in file name: `50-NAME.conf`.
pub fn crio_file(name: &str) -> String {
    format!("50-{name}.conf")
}

/// CRI-O's drop-in: a runtime handler that runs cuslice-runtime in place of runc.
pub fn crio_dropin(l: &Layout) -> String {
    format!(
        "# Written by `cuslice install --engine crio`; `cuslice uninstall --engine crio` removes it.\n\
         # Kubernetes selects this handler with a RuntimeClass whose handler is {name:?}.\n\
         [crio.runtime.runtimes.{key}]\n\
         runtime_path = {path}\n\
         runtime_type = \"oci\"\n",
        name = l.name(),
        key = toml_edit::Key::new(l.name()).display_repr(),
        path = toml_edit::Value::from(l.runtime_path()),
    )
}

/// The CDI kind cuslice's spec declares.
pub const CDI_KIND: &str = "cuslice.io/slice";

/// The CDI device name: `default` for the default runtime name, the name otherwise (so specs
/// installed under two names do not declare the same device).
pub fn cdi_device(name: &str) -> String {
    if name == "cuslice" {
        "default".to_owned()
    } else {
        name.to_owned()
    }
}

/// The CDI spec file name: `NAME.json`.
pub fn cdi_file(name: &str) -> String {
    format!("{name}.json")
}

/// The CDI spec: one device whose container edits are the two hooks.
pub fn cdi_spec(l: &Layout) -> String {
    let hooks: Vec<Value> = STAGES
        .iter()
        .map(|s| {
            json!({
                "hookName": s,
                "path": l.hook_path(),
                "args": l.hook_args(s),
            })
        })
        .collect();
    json_file(&json!({
        "cdiVersion": "0.5.0",
        "kind": CDI_KIND,
        "devices": [{
            "name": cdi_device(l.name()),
            "containerEdits": { "hooks": hooks },
        }],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new("/usr/local", "cuslice").expect("layout")
    }

    #[test]
    fn podman_descriptors() {
        let hooks = podman_hooks(&layout());
        let names: Vec<_> = hooks.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["50-cuslice-createruntime.json", "50-cuslice-poststop.json"]
        );
        assert_eq!(
            hooks[0].1,
            r#"{
  "version": "1.0.0",
  "hook": {
    "path": "/usr/local/bin/cuslice-hook",
    "args": [
      "cuslice-hook",
      "createRuntime",
      "--library",
      "/usr/local/lib/cuslice/libcuslice.so"
    ]
  },
  "when": {
    "always": true
  },
  "stages": [
    "createRuntime"
  ]
}
"#
        );
        let v: Value = serde_json::from_str(&hooks[1].1).expect("json");
        assert_eq!(v["stages"], json!(["poststop"]));
        assert_eq!(v["hook"]["args"][1], "poststop");
    }

    #[test]
    fn crio_handler() {
        assert_eq!(crio_file("cuslice"), "50-cuslice.conf");
        let text = crio_dropin(&layout());
        assert_eq!(
            text,
            "# Written by `cuslice install --engine crio`; `cuslice uninstall --engine crio` removes it.\n\
             # Kubernetes selects this handler with a RuntimeClass whose handler is \"cuslice\".\n\
             [crio.runtime.runtimes.cuslice]\n\
             runtime_path = \"/usr/local/bin/cuslice-runtime\"\n\
             runtime_type = \"oci\"\n"
        );
        let doc: toml_edit::DocumentMut = text.parse().expect("toml");
        assert_eq!(
            doc["crio"]["runtime"]["runtimes"]["cuslice"]["runtime_type"].as_str(),
            Some("oci")
        );
        let dotted = crio_dropin(&Layout::new("/opt", "a.b").expect("layout"));
        let doc: toml_edit::DocumentMut = dotted.parse().expect("toml");
        assert_eq!(
            doc["crio"]["runtime"]["runtimes"]["a.b"]["runtime_path"].as_str(),
            Some("/opt/bin/cuslice-runtime")
        );
    }

    #[test]
    fn cdi() {
        let v: Value = serde_json::from_str(&cdi_spec(&layout())).expect("json");
        assert_eq!(v["cdiVersion"], "0.5.0");
        assert_eq!(v["kind"], "cuslice.io/slice");
        assert_eq!(v["devices"][0]["name"], "default");
        let hooks = &v["devices"][0]["containerEdits"]["hooks"];
        assert_eq!(hooks[0]["hookName"], "createRuntime");
        assert_eq!(hooks[1]["hookName"], "poststop");
        assert_eq!(hooks[1]["path"], "/usr/local/bin/cuslice-hook");
        assert_eq!(
            hooks[1]["args"],
            json!([
                "cuslice-hook",
                "poststop",
                "--library",
                "/usr/local/lib/cuslice/libcuslice.so"
            ])
        );
        assert_eq!(cdi_device("other"), "other");
        assert_eq!(cdi_file("cuslice"), "cuslice.json");
    }
}
