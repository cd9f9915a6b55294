//! The node agent's systemd unit in a plan: installed and started with the first engine's
//! registration, stopped and removed with the last, never one that another installation owns.

use std::path::Path;

use super::{Change, Cmd, Ctx, Failure, Plan, still_registered};
use crate::fsio;
use crate::layout::SYSTEMD_RUNNING;
use crate::problem::Problem;
use crate::transform::owned;

/// What systemctl runs for the agent's unit, on a live system that runs systemd: (before the
/// files are written, after). `existed`: the unit was there before; `changed`: its text changes;
/// `cli_changed`: the `cuslice` binary it runs is replaced.
pub fn agent_commands(
    cmd: Cmd,
    unit: &str,
    existed: bool,
    changed: bool,
    cli_changed: bool,
) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    match cmd {
        Cmd::Install => {
            let mut after = Vec::new();
            if changed {
                after.push(v(&["daemon-reload"]));
            }
            after.push(v(&["enable", "--now", unit]));
            // A running agent keeps the old binary and unit until it restarts.
            if existed && (changed || cli_changed) {
                after.push(v(&["restart", unit]));
            }
            (Vec::new(), after)
        }
        Cmd::Uninstall if existed => (
            vec![v(&["disable", "--now", unit])],
            vec![v(&["daemon-reload"])],
        ),
        Cmd::Uninstall => (Vec::new(), Vec::new()),
    }
}

/// The node agent's systemd unit (`cuslice install` installs and starts it unless
/// `--no-agent`; uninstall stops and removes it with the last engine's registration).
pub(super) fn agent(
    cx: &Ctx<'_>,
    files: &[Change],
    plan: &mut Plan,
) -> Result<Vec<Change>, Failure> {
    let o = cx.o;
    let l = &o.layout;
    if o.cmd == Cmd::Install && !o.agent {
        return Ok(Vec::new());
    }
    let unit = l.agent_unit();
    let cli = l.cli_path();
    let systemd = fsio::host(&o.root, SYSTEMD_RUNNING).is_dir();
    let live = o.root.canonicalize().is_ok_and(|r| r == Path::new("/"));
    let (path, old, mode) = cx.read_text_lenient(&l.agent_unit_path())?;
    let runs = old
        .as_deref()
        .and_then(|b| owned::unit_exec(&String::from_utf8_lossy(b)));
    let foreign = runs.filter(|p| *p != cli);
    let under_root = if live {
        String::new()
    } else {
        format!(" under --root {}", o.root.display())
    };
    let mut changes = Vec::new();
    match o.cmd {
        Cmd::Install => {
            if let Some(other) = foreign {
                return Err(cx.refuse(
                    &path,
                    Problem::new(
                        format!("the agent's unit already runs {other}, not {cli}"),
                        "one agent serves a node: uninstall the other installation first (with its --prefix), or add --no-agent",
                    ),
                ));
            }
            if !systemd && old.is_none() {
                plan.warnings.push(format!(
                    "agent: systemd does not run this system (no {SYSTEMD_RUNNING}{under_root}), so no unit was installed: start `{cli} agent --enforce stop` as root at boot with the init system you use, and restart it when it exits (docs/agent.md, \"Installing it as a service\")"
                ));
                return Ok(changes);
            }
            let change = Change {
                path,
                old,
                old_mode: mode,
                new: Some(owned::agent_unit(l).into_bytes()),
                mode: 0o644,
                force_mode: false,
                text: true,
                source: None,
            };
            let cli_target = fsio::host(&o.root, &cli);
            let cli_changed = files
                .iter()
                .any(|c| c.path == cli_target && c.old.is_some() && !c.is_noop());
            if live && systemd {
                let (before, after) = agent_commands(
                    o.cmd,
                    &unit,
                    change.old.is_some(),
                    !change.is_noop(),
                    cli_changed,
                );
                plan.before.extend(before);
                plan.after.extend(after);
            } else if systemd {
                plan.warnings.push(format!(
                    "agent: systemctl not run{under_root}; on the target system run: systemctl daemon-reload && systemctl enable --now {unit}"
                ));
            } else {
                plan.warnings.push(format!(
                    "agent: systemd does not run this system (no {SYSTEMD_RUNNING}{under_root}): {unit} is up to date, but nothing starts it"
                ));
            }
            changes.push(change);
        }
        Cmd::Uninstall => {
            if old.is_none() {
                return Ok(changes);
            }
            if let Some(other) = foreign {
                plan.warnings.push(format!(
                    "kept {}: it runs {other}, not {cli}; uninstall with the --prefix it was installed with",
                    path.display()
                ));
                return Ok(changes);
            }
            let elsewhere = still_registered(o);
            if !elsewhere.is_empty() {
                plan.warnings.push(format!(
                    "kept the agent ({unit}): cuslice is still registered with {}",
                    elsewhere.join(", ")
                ));
                return Ok(changes);
            }
            if live && systemd {
                let (before, after) = agent_commands(o.cmd, &unit, true, true, false);
                plan.before.extend(before);
                plan.after.extend(after);
            } else {
                // What `systemctl disable` would remove: the link that starts it at boot.
                let link = fsio::host(&o.root, &l.agent_wants_link());
                if let Ok(target) = std::fs::read_link(&link) {
                    changes.push(Change {
                        path: link,
                        old: Some(target.as_os_str().as_encoded_bytes().to_vec()),
                        old_mode: None,
                        new: None,
                        mode: 0o777,
                        force_mode: false,
                        text: false,
                        source: None,
                    });
                }
                if systemd {
                    plan.warnings.push(format!(
                        "agent: systemctl not run{under_root}; on the target system run: systemctl stop {unit} && systemctl daemon-reload"
                    ));
                }
            }
            changes.push(Change {
                path,
                old,
                old_mode: mode,
                new: None,
                mode: 0o644,
                force_mode: false,
                text: true,
                source: None,
            });
        }
    }
    Ok(changes)
}
