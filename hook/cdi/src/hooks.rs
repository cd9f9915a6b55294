//! How cuslice-hook is named in OCI and CDI hooks: its program name, the stages cuslice
//! registers and their argv. The one definition, shared by `cuslice install`, the claim specs
//! and cuslice-runtime.

use std::path::Path;

use serde_json::Value;

use crate::spec::Hook;

/// The hook's program name, `args[0]` of every hook entry that runs it.
pub const HOOK_BIN: &str = "cuslice-hook";
/// The hook stages cuslice registers, in the order they run.
pub const HOOK_STAGES: [&str; 2] = ["createRuntime", "poststop"];
/// The hook names a CDI spec may use (the OCI runtime spec's hook lists).
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The hook's argv for one stage (OCI hook `args` include argv\[0\]): `cuslice-hook STAGE
/// --library LIBRARY`.
pub fn hook_args(stage: &str, library: &str) -> Vec<String> {
    vec![
        HOOK_BIN.to_owned(),
        stage.to_owned(),
        "--library".to_owned(),
        library.to_owned(),
    ]
}

/// cuslice-hook at `hook` for every stage in [`HOOK_STAGES`], as CDI hooks.
pub fn stage_hooks(hook: &str, library: &str) -> Vec<Hook> {
    HOOK_STAGES
        .iter()
        .map(|s| Hook {
            hook_name: (*s).to_owned(),
            path: hook.to_owned(),
            args: hook_args(s, library),
            env: Vec::new(),
            timeout: None,
        })
        .collect()
}

/// Whether an OCI hook entry (`{"path": ..., "args": [...]}`) runs cuslice-hook: its argv\[0\]
/// or its program's file name is `cuslice-hook`.
pub fn is_cuslice_hook(entry: &Value) -> bool {
    let argv0 = entry.pointer("/args/0").and_then(Value::as_str);
    let file = entry
        .get("path")
        .and_then(Value::as_str)
        .and_then(|p| Path::new(p).file_name())
        .and_then(|f| f.to_str());
    argv0 == Some(HOOK_BIN) || file == Some(HOOK_BIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hook_convention() {
        assert_eq!(
            hook_args("poststop", "/l.so"),
            ["cuslice-hook", "poststop", "--library", "/l.so"]
        );
        let hooks = stage_hooks("/h", "/l.so");
        let names: Vec<&str> = hooks.iter().map(|h| h.hook_name.as_str()).collect();
        assert_eq!(names, HOOK_STAGES);
        assert_eq!(hooks[0].args, hook_args("createRuntime", "/l.so"));
        assert!(is_cuslice_hook(&json!({"path": "/opt/x/cuslice-hook"})));
        assert!(is_cuslice_hook(
            &json!({"path": "/wrap", "args": ["cuslice-hook", "poststop"]})
        ));
        assert!(!is_cuslice_hook(
            &json!({"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk"]})
        ));
    }
}
