use super::agent::agent_commands;
use super::apply::diff;
use super::*;

#[test]
fn containerd_dropin_sits_next_to_the_config() {
    assert_eq!(
        containerd_paths("/etc/containerd/config.toml", "cuslice"),
        (
            "/etc/containerd/config.toml".to_owned(),
            "/etc/containerd/conf.d/cuslice.toml".to_owned()
        )
    );
    assert_eq!(
        containerd_paths("/config.toml", "x").1,
        "/conf.d/x.toml".to_owned()
    );
}

#[test]
fn noop_detection() {
    let mut c = Change {
        path: "/x".into(),
        old: Some(b"a".to_vec()),
        old_mode: Some(0o644),
        new: Some(b"a".to_vec()),
        mode: 0o755,
        force_mode: true,
        text: false,
        source: None,
    };
    assert!(!c.is_noop(), "mode differs");
    c.old_mode = Some(0o755);
    assert!(c.is_noop());
    c.new = None;
    assert!(!c.is_noop());
    c.old = None;
    assert!(c.is_noop());
}

#[test]
fn diffs_name_the_file() {
    let c = Change {
        path: "/etc/f".into(),
        old: None,
        old_mode: None,
        new: Some(b"a\n".to_vec()),
        mode: 0o644,
        force_mode: false,
        text: true,
        source: None,
    };
    let d = diff(&c);
    assert!(d.starts_with("--- /dev/null\n+++ /etc/f\n"), "{d}");
    assert!(d.contains("+a\n"));
}

#[test]
fn agent_systemctl_commands() {
    let run = |cmd, existed, changed, cli| {
        let (before, after) = agent_commands(cmd, "a.service", existed, changed, cli);
        let show = |v: Vec<Vec<String>>| v.iter().map(|a| a.join(" ")).collect::<Vec<_>>();
        (show(before), show(after))
    };
    let none: Vec<String> = Vec::new();
    // First install: load the unit, enable and start it.
    assert_eq!(
        run(Cmd::Install, false, true, false),
        (
            none.clone(),
            vec!["daemon-reload".into(), "enable --now a.service".into()]
        )
    );
    // Nothing changed: enable --now only (a no-op if it is enabled and running).
    assert_eq!(
        run(Cmd::Install, true, false, false),
        (none.clone(), vec!["enable --now a.service".into()])
    );
    // A new binary: the running agent restarts onto it.
    assert_eq!(
        run(Cmd::Install, true, false, true),
        (
            none.clone(),
            vec!["enable --now a.service".into(), "restart a.service".into()]
        )
    );
    // A changed unit: reloaded, then restarted.
    assert_eq!(
        run(Cmd::Install, true, true, false),
        (
            none.clone(),
            vec![
                "daemon-reload".into(),
                "enable --now a.service".into(),
                "restart a.service".into()
            ]
        )
    );
    // Uninstall: stopped and disabled while its file is there, reloaded once it is gone.
    assert_eq!(
        run(Cmd::Uninstall, true, true, false),
        (
            vec!["disable --now a.service".into()],
            vec!["daemon-reload".into()]
        )
    );
    assert_eq!(
        run(Cmd::Uninstall, false, false, false),
        (none.clone(), none)
    );
}
