//! A plan shown (`--dry-run`: diffs and what would be installed) or written (each file
//! atomically, systemctl before and after).

use std::fmt::Write as _;

use cuslice_state::fsio::Durability;

use super::{Change, Cmd, Failure, Options, Plan};
use crate::fsio;
use crate::strip;

/// The unified diff of one text change.
pub fn diff(c: &Change) -> String {
    let name = c.path.display().to_string();
    let old = String::from_utf8_lossy(c.old.as_deref().unwrap_or_default()).into_owned();
    let new = String::from_utf8_lossy(c.new.as_deref().unwrap_or_default()).into_owned();
    let a = if c.old.is_some() {
        name.clone()
    } else {
        "/dev/null".to_owned()
    };
    let b = if c.new.is_some() {
        name
    } else {
        "/dev/null".to_owned()
    };
    similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

/// What `--dry-run` prints.
pub fn render_dry_run(plan: &Plan) -> String {
    let mut out = String::new();
    for args in &plan.before {
        let _ = writeln!(out, "would run: systemctl {}", args.join(" "));
    }
    for c in &plan.changes {
        let p = c.path.display();
        if c.is_noop() {
            let _ = writeln!(out, "{p}: no change");
        } else if c.text {
            out.push_str(&diff(c));
        } else {
            match (&c.new, &c.source) {
                (Some(bytes), src) => {
                    let verb = if c.old.is_some() {
                        "replace"
                    } else {
                        "install"
                    };
                    let from = src
                        .as_ref()
                        .map(|s| format!(" from {}", s.display()))
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "{p}: would {verb}{from} ({} bytes, mode {:04o})",
                        bytes.len(),
                        c.mode
                    );
                }
                (None, _) => {
                    let _ = writeln!(out, "{p}: would remove");
                }
            }
        }
    }
    for args in &plan.after {
        let _ = writeln!(out, "would run: systemctl {}", args.join(" "));
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "{w}");
    }
    out.push_str("dry run: nothing written\n");
    out
}

/// Writes the plan; returns the lines to print.
pub fn apply(o: &Options, plan: &Plan) -> Result<String, Failure> {
    let mut out = String::new();
    let mut changed = 0;
    for args in &plan.before {
        systemctl(o, args)?;
        let _ = writeln!(out, "systemctl {}: done", args.join(" "));
    }
    for c in &plan.changes {
        let p = c.path.display();
        if c.is_noop() {
            let what = match o.cmd {
                Cmd::Install => "already installed, no change",
                Cmd::Uninstall => "no change",
            };
            if c.old.is_some() || c.new.is_some() {
                let _ = writeln!(out, "{p}: {what}");
            }
            continue;
        }
        changed += 1;
        match &c.new {
            Some(bytes) => {
                let mode = if c.force_mode {
                    c.mode
                } else {
                    c.old_mode.unwrap_or(c.mode)
                };
                let written = fsio::make_parent(&c.path).and_then(|()| {
                    cuslice_state::fsio::write_atomic(&c.path, bytes, mode, Durability::Full)
                });
                written.map_err(|e| {
                    Failure::Failed(format!(
                        "cuslice {}: {p}: cannot write it: {e}; {} (files listed above were \
                         already written; running the command again is safe)",
                        o.cmd.word(),
                        "check the permissions (run as root for system paths, or use --root DIR)"
                    ))
                })?;
                let verb = match (&c.old, &c.source) {
                    (_, Some(src)) => format!("installed (from {})", src.display()),
                    (None, None) => "created".to_owned(),
                    (Some(_), None) => "updated".to_owned(),
                };
                let _ = writeln!(out, "{p}: {verb}");
            }
            None => {
                fsio::remove(&c.path).map_err(|e| {
                    Failure::Failed(format!(
                        "cuslice {}: {p}: cannot remove it: {e}; check the permissions (files \
                         listed above were already changed; running the command again is safe)",
                        o.cmd.word()
                    ))
                })?;
                let _ = writeln!(out, "{p}: removed");
                // The debug info's directory goes with its last file.
                if let Some(dir) = c.path.parent().filter(|d| d.ends_with(strip::DEBUG_DIR)) {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }
    for args in &plan.after {
        // Failing here leaves the files written; the message says what to run.
        if let Err(e) = systemctl(o, args) {
            print!("{out}");
            return Err(e);
        }
        let _ = writeln!(out, "systemctl {}: done", args.join(" "));
    }
    let engines: Vec<&str> = o.engines.iter().map(|e| e.name()).collect();
    if changed == 0 {
        let _ = writeln!(
            out,
            "{}: nothing to do for {}",
            match o.cmd {
                Cmd::Install => "already installed",
                Cmd::Uninstall => "not installed",
            },
            engines.join(", ")
        );
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "{w}");
    }
    Ok(out)
}

/// Runs `systemctl ARGS`; Err: one line saying what failed.
fn systemctl(o: &Options, args: &[String]) -> Result<(), Failure> {
    let shown = format!("systemctl {}", args.join(" "));
    let fail = |why: String| {
        Failure::Failed(format!(
            "cuslice {}: `{shown}` failed: {why}; the files listed above were written; fix that and run `{shown}` yourself, or run the command again",
            o.cmd.word()
        ))
    };
    let out = std::process::Command::new("systemctl")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot run it ({e})")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{} ({})",
            crate::problem::one_line(&String::from_utf8_lossy(&out.stderr)),
            out.status
        )))
    }
}
