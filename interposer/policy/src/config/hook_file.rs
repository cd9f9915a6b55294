//! The hook file: the slice configuration `cuslice-hook` writes into a container
//! (`/run/cuslice/slice/config`), the only source of limits for the processes inside. This module
//! owns its format: [`write`] makes it, [`Config::from_hook_file`] reads it, [`rewrite`] changes
//! limits in it (`cuslice set`). Pure: callers do the I/O.
//!
//! **Format.** Lines of `NAME=VALUE`; blank lines and `#` comments ignored; whitespace around
//! name and value trimmed; a value may contain `=`. Names and values follow the same rules as
//! the environment (see [`super`]).

use super::live::LiveLimit;
use super::names::{LOG, NODE_DIR, Name, classify};
use super::parse::{Entry, dedupe};
use super::{Config, ConfigError};
use crate::echo::{cut, one_line};

/// The hook file for `container`: a comment naming it, `entries` (`NAME=VALUE`, values
/// trimmed) in the order given, then `CUSLICE_NODE_DIR=node_dir` (where the node's compute
/// board appears inside the container).
pub fn write<'a>(
    container: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    node_dir: &str,
) -> String {
    let mut text = format!(
        "# cuslice slice configuration for container {container}, written by cuslice-hook.\n\
         # The processes in the container read their limits from here, not from their environment.\n"
    );
    for (name, value) in entries {
        text.push_str(&format!("{name}={}\n", value.trim()));
    }
    text.push_str(&format!("{NODE_DIR}={node_dir}\n"));
    text
}

impl Config {
    /// Reads the configuration from the hook file's text. The file is the only source: of `env`
    /// only `CUSLICE_LOG` is used, and only when the file does not set it. Settings in `env` that
    /// the file does not repeat with the same value are reported in [`Config::notices`].
    pub fn from_hook_file<I, K, V>(text: &str, env: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut entries = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let bad_line = |problem: &str| ConfigError {
                line: Some(line),
                variable: String::new(),
                value: trimmed.to_string(),
                problem: problem.to_string(),
                example: "CUSLICE_MEMORY_LIMIT=4GiB".to_string(),
            };
            let Some((name, value)) = trimmed.split_once('=') else {
                return Err(bad_line("is not NAME=VALUE"));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(bad_line("has no name before \"=\""));
            }
            entries.push(Entry {
                name: name.to_string(),
                value: value.trim().to_string(),
                line: Some(line),
            });
        }
        let entries = dedupe(entries)?;
        let file_sets_log = entries.iter().any(|e| e.name == LOG);

        let mut all = entries.clone();
        let mut ignored = Vec::new();
        for (name, value) in env {
            let (name, value) = (name.as_ref(), value.as_ref());
            if name == LOG {
                if !file_sets_log {
                    all.push(Entry {
                        name: name.to_string(),
                        value: value.to_string(),
                        line: None,
                    });
                }
            } else if classify(name) != Name::Other
                && !entries
                    .iter()
                    .any(|e| e.name == name && e.value == value.trim())
            {
                ignored.push(cut(name).into_owned());
            }
        }
        let mut config = Config::build(dedupe(all)?)?;
        if !ignored.is_empty() {
            ignored.sort();
            ignored.dedup();
            config.notices.push(one_line(&format!(
                "the hook file is the only source of settings; ignoring {} from the environment",
                ignored.join(", ")
            )));
        }
        Ok(config)
    }
}

/// The hook file `text` with `changes` made: every line that sets one of the changed limits (for
/// any device, under any family's name) gives way to one `CUSLICE_*` line for all devices with
/// the new value. The result is checked as the interposer will read it (a core request above the
/// core limit is refused here). Pure: the caller writes the file.
pub fn rewrite(text: &str, changes: &[(LiveLimit, String)]) -> Result<String, ConfigError> {
    let sets_changed = |name: &str| match classify(name) {
        Name::Limit { quantity, .. } => changes.iter().any(|(w, _)| w.quantity() == Some(quantity)),
        Name::Priority => changes.iter().any(|(w, _)| *w == LiveLimit::Priority),
        Name::AliyunContainer | Name::AliyunUnit => {
            changes.iter().any(|(w, _)| *w == LiveLimit::Memory)
        }
        _ => false,
    };
    let mut out = String::new();
    for raw in text.lines() {
        let name = raw.trim().split_once('=').map(|(n, _)| n.trim());
        if name.is_some_and(|n| !raw.trim().starts_with('#') && sets_changed(n)) {
            continue;
        }
        out.push_str(raw);
        out.push('\n');
    }
    for (what, value) in changes {
        out.push_str(&format!("{}={}\n", what.variable(), value.trim()));
    }
    Config::from_hook_file(&out, std::iter::empty::<(&str, &str)>())?;
    Ok(out)
}

/// The hook file `text` with `changes` made on one device alone, `ordinal` (the device's ordinal
/// as the container's processes see it, as `CUSLICE_MEMORY_LIMIT_<i>` counts): every line that
/// sets one of the changed limits for that device by its ordinal (under any family's name) gives
/// way to one `CUSLICE_*_<ordinal>` line, which wins over every all-devices line; the other
/// devices keep what they had. Checked as [`rewrite`] is. The priority is the slice's, not a
/// device's: a change of it is the caller's to refuse.
pub fn rewrite_device(
    text: &str,
    ordinal: u32,
    changes: &[(LiveLimit, String)],
) -> Result<String, ConfigError> {
    let sets_changed = |name: &str| match classify(name) {
        Name::Limit {
            quantity,
            ordinal: Some(o),
            ..
        } => o == ordinal && changes.iter().any(|(w, _)| w.quantity() == Some(quantity)),
        _ => false,
    };
    let mut out = String::new();
    for raw in text.lines() {
        let name = raw.trim().split_once('=').map(|(n, _)| n.trim());
        if name.is_some_and(|n| !raw.trim().starts_with('#') && sets_changed(n)) {
            continue;
        }
        out.push_str(raw);
        out.push('\n');
    }
    for (what, value) in changes {
        out.push_str(&format!("{}_{ordinal}={}\n", what.variable(), value.trim()));
    }
    Config::from_hook_file(&out, std::iter::empty::<(&str, &str)>())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::tests::{GIB, assert_well_formed, limits};
    use super::*;
    use crate::config::LogLevel;
    use crate::priority::Priority;

    const NO_ENV: [(&str, &str); 0] = [];

    fn hook(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_hook_file(text, env.iter().copied())
    }

    #[test]
    fn hook_file_lines() {
        let text = "# written by cuslice-hook\n\
                    \n\
                    CUSLICE_MEMORY_LIMIT=4GiB\n\
                    \t  # an indented comment\n\
                    \x20 CUSLICE_CORE_LIMIT = 50 \r\n\
                    CUSLICE_STATE_DIR=/run/cuslice/abc\n\
                    CUSLICE_MEMORY_LIMIT_1=1GiB";
        let c = Config::from_hook_file(text, NO_ENV).unwrap();
        assert_eq!(c.limits(0), limits(Some(4 * GIB), Some(50), None));
        assert_eq!(c.limits(1), limits(Some(GIB), Some(50), None));
        assert_eq!(c.state_dir, Some(PathBuf::from("/run/cuslice/abc")));
        assert_eq!(c.log, LogLevel::Error);
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        assert_eq!(
            Config::from_hook_file("", NO_ENV).unwrap(),
            Config::default()
        );
        assert_eq!(
            Config::from_hook_file("# nothing\n\n", NO_ENV).unwrap(),
            Config::default()
        );
        // A value may itself contain '='.
        let c = Config::from_hook_file("CUSLICE_STATE_DIR=/a=b", NO_ENV).unwrap();
        assert_eq!(c.state_dir, Some(PathBuf::from("/a=b")));
    }

    #[test]
    fn hook_file_bad_lines_name_their_line() {
        for (text, line, problem) in [
            (
                "CUSLICE_MEMORY_LIMIT=4GiB\nnonsense\n",
                2,
                "is not NAME=VALUE",
            ),
            ("# c\n\n  =4GiB\n", 3, "has no name"),
            (
                "CUSLICE_LOG=info\nCUSLICE_MEMORY_LIMIT 4GiB",
                2,
                "is not NAME=VALUE",
            ),
        ] {
            let e = hook(text, &[]).unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert!(e.problem.contains(problem), "{e}");
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("hook file line {line}: \"")),
                "{message}"
            );
            assert!(
                message.contains("; write e.g. CUSLICE_MEMORY_LIMIT=4GiB"),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message}");
        }
        let e = hook("CUSLICE_CORE_LIMIT=50\n\nCUSLICE_MEMORY_LIMIT=12XB\n", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "hook file line 3: CUSLICE_MEMORY_LIMIT=\"12XB\" is not a size (unknown unit); write \
             e.g. CUSLICE_MEMORY_LIMIT=4GiB (binary units: KiB MiB GiB TiB PiB, or k m g t p; or \
             plain bytes)"
        );
        let e = hook("CUSLICE_MEMORY_LIMT=1GiB", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.variable.as_str()),
            (Some(1), "CUSLICE_MEMORY_LIMT")
        );
        let e = hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_REQUEST=30", &[]).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.problem.contains("CUSLICE_CORE_LIMIT=20"), "{e}");
        let e = hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_LIMIT=30", &[]).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.problem.contains("on line 1"), "{e}");
        assert_well_formed(&e);
        assert!(hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_LIMIT=20", &[]).is_ok());
    }

    #[test]
    fn hook_file_is_the_only_source_but_for_cuslice_log() {
        let text = "CUSLICE_MEMORY_LIMIT=4GiB\n";
        let env = [
            ("CUSLICE_MEMORY_LIMIT", "1GiB"),
            ("CUSLICE_CORE_LIMIT", "10"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUSLICE_MEMORY_LIMT", "oops"),
            ("CUSLICE_MEMORY_LIMIT_x", "1GiB"),
            ("CUSLICE_STATE_DIR", ""),
            ("PATH", "/usr/bin"),
            ("CUSLICE_LOG", "debug"),
        ];
        let c = hook(text, &env).unwrap();
        assert_eq!(c.limits(0), limits(Some(4 * GIB), None, None));
        assert_eq!(c.state_dir, None);
        assert_eq!(c.log, LogLevel::Debug);
        assert_eq!(
            c.notices,
            [
                "the hook file is the only source of settings; ignoring CUDA_DEVICE_MEMORY_LIMIT, \
                 CUSLICE_CORE_LIMIT, CUSLICE_MEMORY_LIMIT, CUSLICE_MEMORY_LIMIT_x, \
                 CUSLICE_MEMORY_LIMT, CUSLICE_STATE_DIR from the environment"
            ]
        );

        // The file's CUSLICE_LOG wins; the environment's is then not even parsed.
        let c = hook("CUSLICE_LOG=warn", &[("CUSLICE_LOG", "nonsense")]).unwrap();
        assert_eq!(c.log, LogLevel::Warn);
        assert!(c.notices.is_empty());
        // Without one in the file, a bad CUSLICE_LOG in the environment is an error.
        let e = hook(text, &[("CUSLICE_LOG", "loud")]).unwrap_err();
        assert_eq!((e.line, e.variable.as_str()), (None, "CUSLICE_LOG"));
        assert_well_formed(&e);

        // Environment settings the file repeats exactly are not worth a notice.
        let c = hook(
            "CUSLICE_MEMORY_LIMIT = 4GiB\nCUDA_DEVICE_MEMORY_LIMIT=4g",
            &[
                ("CUSLICE_MEMORY_LIMIT", "4GiB"),
                ("CUDA_DEVICE_MEMORY_LIMIT", " 4g"),
            ],
        )
        .unwrap();
        assert!(c.notices.is_empty(), "{:?}", c.notices);
    }

    #[test]
    fn hook_file_names_that_are_not_ours_are_noticed() {
        let c = hook(
            "FOO=bar\nCUSLICE_CORE_LIMIT=50\nCUSLICE_CUDA_HEADERS=/x",
            &[],
        )
        .unwrap();
        assert_eq!(c.limits(0).core_limit, Some(50));
        assert_eq!(
            c.notices,
            [
                "hook file line 1: FOO is not a cuslice setting; ignored",
                "hook file line 3: CUSLICE_CUDA_HEADERS is not a cuslice setting; ignored",
            ]
        );
    }

    #[test]
    fn hook_file_uses_the_same_rules_as_the_environment() {
        let text = "CUSLICE_MEMORY_LIMIT=1GiB\nCUDA_DEVICE_MEMORY_LIMIT=2g\n\
                    CUDA_DEVICE_SM_LIMIT_1=30\nALIYUN_COM_GPU_MEM_CONTAINER=1";
        let c = Config::from_hook_file(text, NO_ENV).unwrap();
        assert_eq!(c.limits(1), limits(Some(GIB), Some(30), None));
        assert_eq!(
            c.notices,
            [
                "CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT"
            ]
        );
    }

    #[test]
    fn a_rewritten_hook_file_sets_each_changed_limit_once_for_every_device() {
        let text = "CUSLICE_MEMORY_LIMIT_0=1GiB\nCUDA_DEVICE_MEMORY_LIMIT=2g\n\
                    CUSLICE_CORE_LIMIT=30\nCUSLICE_STATE_DIR=/x\n# note\n";
        let new = rewrite(text, &[(LiveLimit::Memory, "3GiB".into())]).unwrap();
        assert_eq!(
            new,
            "CUSLICE_CORE_LIMIT=30\nCUSLICE_STATE_DIR=/x\n# note\nCUSLICE_MEMORY_LIMIT=3GiB\n"
        );
        let c = Config::from_hook_file(&new, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.limits(0).memory, Some(3 * GIB));
        assert_eq!(c.limits(5).memory, Some(3 * GIB));
        // A request above the limit is refused, naming the line it would make.
        let e = rewrite(text, &[(LiveLimit::CoreRequest, "40".into())]).unwrap_err();
        assert_eq!(e.variable, "CUSLICE_CORE_REQUEST", "{e}");
        let ok = rewrite(
            text,
            &[
                (LiveLimit::CoreLimit, "60".into()),
                (LiveLimit::CoreRequest, "40".into()),
            ],
        )
        .unwrap();
        let c = Config::from_hook_file(&ok, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(
            (c.limits(0).core_limit, c.limits(0).core_request),
            (Some(60), Some(40))
        );
    }

    #[test]
    fn a_limit_rewritten_for_one_device_changes_that_device_alone() {
        let text = "CUSLICE_MEMORY_LIMIT=1GiB\nCUDA_DEVICE_MEMORY_LIMIT_1=2g\n\
                    CUSLICE_MEMORY_LIMIT_2=3GiB\nCUSLICE_CORE_LIMIT=30\n# CUSLICE_MEMORY_LIMIT_1=9g\n";
        let new = rewrite_device(text, 1, &[(LiveLimit::Memory, "4GiB".into())]).unwrap();
        assert_eq!(
            new,
            "CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_MEMORY_LIMIT_2=3GiB\nCUSLICE_CORE_LIMIT=30\n\
             # CUSLICE_MEMORY_LIMIT_1=9g\nCUSLICE_MEMORY_LIMIT_1=4GiB\n"
        );
        let c = Config::from_hook_file(&new, std::iter::empty::<(&str, &str)>()).unwrap();
        let memory = |o| c.limits(o).memory;
        assert_eq!(
            (memory(0), memory(1), memory(2), memory(3)),
            (Some(GIB), Some(4 * GIB), Some(3 * GIB), Some(GIB))
        );
        assert_eq!(c.limits(1).core_limit, Some(30));
        // Again on the same device: one line for it, the latest.
        let again = rewrite_device(&new, 1, &[(LiveLimit::Memory, "512MiB".into())]).unwrap();
        assert_eq!(
            again.matches("CUSLICE_MEMORY_LIMIT_1=").count(),
            2,
            "{again}"
        );
        assert!(
            again.ends_with("CUSLICE_MEMORY_LIMIT_1=512MiB\n"),
            "{again}"
        );
        // A request above that device's limit is refused; within it, taken.
        let e = rewrite_device(text, 2, &[(LiveLimit::CoreRequest, "40".into())]).unwrap_err();
        assert_eq!(e.variable, "CUSLICE_CORE_REQUEST_2", "{e}");
        let ok = rewrite_device(
            text,
            2,
            &[
                (LiveLimit::CoreLimit, "60".into()),
                (LiveLimit::CoreRequest, "40".into()),
            ],
        )
        .unwrap();
        let c = Config::from_hook_file(&ok, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(
            (c.limits(2).core_limit, c.limits(2).core_request),
            (Some(60), Some(40))
        );
        assert_eq!(
            (c.limits(0).core_limit, c.limits(0).core_request),
            (Some(30), None)
        );
    }

    #[test]
    fn a_priority_set_live_replaces_the_hook_files_and_is_checked() {
        let text = "CUSLICE_PRIORITY=low\nCUSLICE_MEMORY_LIMIT=1GiB\n";
        let new = rewrite(text, &[(LiveLimit::Priority, "high".into())]).unwrap();
        assert_eq!(new, "CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_PRIORITY=high\n");
        let c = Config::from_hook_file(&new, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.priority, Priority::High);
        let e = rewrite(text, &[(LiveLimit::Priority, "urgent".into())]).unwrap_err();
        assert_eq!(e.variable, "CUSLICE_PRIORITY", "{e}");
    }

    #[test]
    fn a_written_hook_file_reads_back_as_its_entries() {
        let text = write(
            "abc",
            [
                ("CUSLICE_MEMORY_LIMIT", " 1GiB "),
                ("CUSLICE_CORE_LIMIT", "50"),
            ],
            "/run/cuslice/node",
        );
        assert_eq!(
            text,
            "# cuslice slice configuration for container abc, written by cuslice-hook.\n\
             # The processes in the container read their limits from here, not from their \
             environment.\n\
             CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_CORE_LIMIT=50\nCUSLICE_NODE_DIR=/run/cuslice/node\n"
        );
        let c = hook(&text, &[]).unwrap();
        assert_eq!(c.limits(3), limits(Some(GIB), Some(50), None));
        assert_eq!(c.node_dir, Some(PathBuf::from("/run/cuslice/node")));
        assert!(c.notices.is_empty(), "{:?}", c.notices);
    }
}
