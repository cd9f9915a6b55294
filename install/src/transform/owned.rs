//! Files cuslice owns outright (it writes them whole and uninstall deletes them): Podman's OCI
//! hook descriptors, CRI-O's drop-in, the CDI spec and the agent's systemd unit. Each is a pure
//! function of the layout.

use cuslice_cdi as cdi;
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

/// The CDI spec: one device whose container edits are cuslice-hook at its stages (the shared
/// types and hook convention of `cuslice_cdi`, which the DRA plugin's claim specs use too).
pub fn cdi_spec(l: &Layout) -> String {
    let spec = cdi::Spec {
        cdi_version: cdi::CDI_VERSION.to_owned(),
        kind: CDI_KIND.to_owned(),
        annotations: Default::default(),
        devices: vec![cdi::Device {
            name: cdi_device(l.name()),
            annotations: Default::default(),
            container_edits: cdi::ContainerEdits {
                hooks: cdi::stage_hooks(&l.hook_path(), &l.library_path()),
                ..Default::default()
            },
        }],
        container_edits: Default::default(),
    };
    json_file(&serde_json::to_value(&spec).unwrap_or_default())
}

/// The engines' units the agent starts before (and stops after), so containers an engine starts
/// at boot find the agent serving. Units a node lacks are ignored by systemd.
pub const AGENT_BEFORE: &str = "containerd.service docker.service crio.service podman.service";

/// The agent's systemd unit. It runs as root with the hardening that leaves it what it needs:
/// every process's /proc entries (pids, cgroups), write access to /sys/fs/cgroup (freezing a
/// slice's cgroup), signals to any process, the GPU's device nodes (NVML) and /run (its socket
/// under the hook's state root). So no PrivateDevices (it would hide /dev/nvidia*),
/// ProtectControlGroups (read-only cgroups), ProtectProc/PrivatePIDs, PrivateTmp (standalone
/// slices' state directories may be under /tmp), ProtectClock or DeviceAllow (any device rule
/// closes the device policy), and no RuntimeDirectory (systemd would delete /run/cuslice, the
/// hook's state, when the agent stops). It is restarted 2 s after it exits, however it exits
/// and however often (no start limit): the next agent thaws what a killed one left frozen.
pub fn agent_unit(l: &Layout) -> String {
    format!(
        "# Written by `cuslice install`; `cuslice uninstall` removes it. The agent's options go in\n\
         # {defaults} (CUSLICE_AGENT_ARGS=\"--listen :9400\"; \"--enforce report\" to report only),\n\
         # then: systemctl restart {unit}\n\
         [Unit]\n\
         Description=cuslice node agent (host pids for containers, slices checked against the driver)\n\
         After=nvidia-persistenced.service\n\
         Before={before}\n\
         StartLimitIntervalSec=0\n\
         \n\
         [Service]\n\
         Type=simple\n\
         EnvironmentFile=-{defaults}\n\
         ExecStart={cli} agent --enforce stop $CUSLICE_AGENT_ARGS\n\
         Restart=always\n\
         RestartSec=2\n\
         NoNewPrivileges=yes\n\
         ProtectSystem=full\n\
         ProtectHome=read-only\n\
         ProtectKernelModules=yes\n\
         ProtectHostname=yes\n\
         RestrictRealtime=yes\n\
         RestrictSUIDSGID=yes\n\
         RestrictNamespaces=yes\n\
         LockPersonality=yes\n\
         SystemCallArchitectures=native\n\
         CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_CHOWN\n\
         \n\
         [Install]\n\
         WantedBy={wanted}\n",
        defaults = l.agent_defaults_path(),
        unit = l.agent_unit(),
        before = AGENT_BEFORE,
        cli = systemd_word(&l.cli_path()),
        wanted = crate::layout::AGENT_WANTED_BY,
    )
}

/// A path as one word of a unit's command line: `%` and `$` doubled (systemd expands specifiers
/// and variables there), quoted when it holds white space or quotes.
pub fn systemd_word(path: &str) -> String {
    let escaped = path.replace('%', "%%").replace('$', "$$");
    if escaped.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '\\') {
        format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        escaped
    }
}

/// The program an agent unit's last `ExecStart=` runs (its first word, unescaped), if any.
pub fn unit_exec(unit: &str) -> Option<String> {
    let cmd = unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ExecStart="))
        .next_back()?
        .trim_start_matches(['-', '@', ':', '+', '!']);
    let mut word = String::new();
    let mut chars = cmd.chars();
    match cmd.chars().next()? {
        '"' => {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => word.extend(chars.next()),
                    c => word.push(c),
                }
            }
        }
        _ => word.extend(chars.take_while(|c| !c.is_whitespace())),
    }
    Some(word.replace("%%", "%").replace("$$", "$"))
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
        let text = cdi_spec(&layout());
        assert_eq!(
            text,
            r#"{
  "cdiVersion": "0.5.0",
  "kind": "cuslice.io/slice",
  "devices": [
    {
      "name": "default",
      "containerEdits": {
        "hooks": [
          {
            "hookName": "createRuntime",
            "path": "/usr/local/bin/cuslice-hook",
            "args": [
              "cuslice-hook",
              "createRuntime",
              "--library",
              "/usr/local/lib/cuslice/libcuslice.so"
            ]
          },
          {
            "hookName": "poststop",
            "path": "/usr/local/bin/cuslice-hook",
            "args": [
              "cuslice-hook",
              "poststop",
              "--library",
              "/usr/local/lib/cuslice/libcuslice.so"
            ]
          }
        ]
      }
    }
  ]
}
"#
        );
        let parsed = cdi::parse_spec(std::path::Path::new("cuslice.json"), &text).expect("spec");
        assert_eq!(parsed.container_edits, cdi::ContainerEdits::default());
        let v: Value = serde_json::from_str(&text).expect("json");
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

    #[test]
    fn agent_unit_runs_the_installed_command() {
        let unit = agent_unit(&layout());
        for line in [
            "[Unit]\n",
            "\nBefore=containerd.service docker.service crio.service podman.service\n",
            "\n[Service]\nType=simple\n",
            "\nEnvironmentFile=-/etc/default/cuslice-agent\n",
            "\nExecStart=/usr/local/bin/cuslice agent --enforce stop $CUSLICE_AGENT_ARGS\n",
            "\nRestart=always\nRestartSec=2\n",
            "\nStartLimitIntervalSec=0\n",
            "\nCapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE ",
            "\n[Install]\nWantedBy=multi-user.target\n",
        ] {
            assert!(unit.contains(line), "{line:?} in\n{unit}");
        }
        // What would take away what it needs: /proc, cgroups, signals, the GPU's device nodes,
        // the hook's state under /run.
        for absent in [
            "PrivateDevices",
            "ProtectControlGroups",
            "ProtectProc",
            "PrivatePIDs",
            "DeviceAllow",
            "ProtectClock",
            "RuntimeDirectory",
            "PrivateTmp",
            "User=",
        ] {
            assert!(!unit.contains(absent), "{absent} in\n{unit}");
        }
        assert_eq!(unit_exec(&unit).as_deref(), Some("/usr/local/bin/cuslice"));
    }

    #[test]
    fn unit_words_are_escaped_and_read_back() {
        assert_eq!(
            systemd_word("/usr/local/bin/cuslice"),
            "/usr/local/bin/cuslice"
        );
        assert_eq!(systemd_word("/opt/100%/bin/x"), "/opt/100%%/bin/x");
        assert_eq!(systemd_word("/opt/my dir/x"), "\"/opt/my dir/x\"");
        for prefix in ["/opt/my dir", "/opt/a$b%c", "/opt/q\"uote", "/opt/b\\s"] {
            let l = Layout::new(prefix, "cuslice").expect("layout");
            assert_eq!(unit_exec(&agent_unit(&l)), Some(l.cli_path()), "{prefix:?}");
        }
        assert_eq!(unit_exec("[Service]\n"), None);
        assert_eq!(
            unit_exec("ExecStart=/a x\nExecStart=-/b y\n").as_deref(),
            Some("/b")
        );
    }
}
