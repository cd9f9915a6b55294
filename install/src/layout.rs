//! Where things live on the target system: the installed files under PREFIX, the runtime name,
//! and the hook command every registration names. Paths here are the ones written INTO
//! configuration files, so they never carry the `--root` prefix.

/// The hook stages cuslice registers, in the order they run (one definition, in `cuslice_cdi`).
pub const STAGES: [&str; 2] = cuslice_cdi::HOOK_STAGES;

/// The installed file names.
pub const HOOK_BIN: &str = cuslice_cdi::HOOK_BIN;
pub const RUNTIME_BIN: &str = "cuslice-runtime";
pub const CLI_BIN: &str = "cuslice";
pub const LIBRARY: &str = cuslice_state::paths::LIBRARY_FILE;
/// The interposer's core, which the library (a small loader) opens from its own directory.
pub const CORE_LIBRARY: &str = cuslice_state::paths::CORE_FILE;
/// Every library installed into PREFIX/lib/cuslice (the one list: a library added here is
/// installed, stripped and removed like the others).
pub const LIBRARIES: &[&str] = &[LIBRARY, CORE_LIBRARY];
/// Every executable installed into PREFIX/bin.
pub const BINARIES: &[&str] = &[HOOK_BIN, RUNTIME_BIN, CLI_BIN];
/// The SPANK plugin (Slurm), installed with the slurm engine: its name in a build
/// (target/release) and in PREFIX/lib/cuslice, where slurmd's plugstack line names it.
pub const SPANK_BUILT: &str = "libcuslice_spank.so";
pub const SPANK_PLUGIN: &str = "cuslice_spank.so";

/// Where units the administrator installs live (systemd reads it before /usr/lib/systemd).
pub const SYSTEMD_UNIT_DIR: &str = "/etc/systemd/system";
/// The target that starts the agent at boot.
pub const AGENT_WANTED_BY: &str = "multi-user.target";
/// What tells that systemd runs a system (sd_booted(3)), under `--root`.
pub const SYSTEMD_RUNNING: &str = "/run/systemd/system";

/// PREFIX and the runtime name, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
    name: String,
}

impl Layout {
    /// `prefix` must be absolute (it is written into configuration files); `name` must be a
    /// runtime name every engine accepts, also as a file name.
    pub fn new(prefix: &str, name: &str) -> Result<Layout, String> {
        if !prefix.starts_with('/') {
            return Err(format!(
                "--prefix {prefix:?} is not an absolute path; it is written into the engines' \
                 configuration, so give e.g. --prefix /usr/local"
            ));
        }
        if prefix.chars().any(|c| c.is_control()) {
            return Err(format!(
                "--prefix {prefix:?} holds control characters; give e.g. --prefix /usr/local"
            ));
        }
        check_name(name)?;
        let trimmed = prefix.trim_end_matches('/');
        Ok(Layout {
            prefix: trimmed.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The runtime name (`--name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PREFIX without a trailing slash (empty for `/`).
    pub fn prefix(&self) -> &str {
        if self.prefix.is_empty() {
            "/"
        } else {
            &self.prefix
        }
    }

    pub fn bin(&self, file: &str) -> String {
        format!("{}/bin/{file}", self.prefix)
    }

    pub fn hook_path(&self) -> String {
        self.bin(HOOK_BIN)
    }

    pub fn runtime_path(&self) -> String {
        self.bin(RUNTIME_BIN)
    }

    pub fn cli_path(&self) -> String {
        self.bin(CLI_BIN)
    }

    /// The interposer the hook mounts into containers.
    pub fn library_path(&self) -> String {
        self.lib(LIBRARY)
    }

    /// A library's path: PREFIX/lib/cuslice/FILE.
    pub fn lib(&self, file: &str) -> String {
        format!(
            "{}/{}/{file}",
            self.prefix,
            cuslice_state::paths::LIBRARY_DIR
        )
    }

    /// The SPANK plugin: PREFIX/lib/cuslice/cuslice_spank.so.
    pub fn spank_path(&self) -> String {
        self.lib(SPANK_PLUGIN)
    }

    /// The agent's systemd unit: `NAME-agent.service` (`cuslice-agent.service`).
    pub fn agent_unit(&self) -> String {
        format!("{}-agent.service", self.name)
    }

    /// Where the agent's unit goes on the target system.
    pub fn agent_unit_path(&self) -> String {
        format!("{SYSTEMD_UNIT_DIR}/{}", self.agent_unit())
    }

    /// The link `systemctl enable` makes for the unit's `WantedBy=`.
    pub fn agent_wants_link(&self) -> String {
        format!(
            "{SYSTEMD_UNIT_DIR}/{AGENT_WANTED_BY}.wants/{}",
            self.agent_unit()
        )
    }

    /// The administrator's settings for the agent, read by the unit if present (install never
    /// writes it): `/etc/default/NAME-agent`.
    pub fn agent_defaults_path(&self) -> String {
        format!("/etc/default/{}-agent", self.name)
    }

    /// The hook's argv for one stage (OCI hook `args` include argv\[0\]).
    pub fn hook_args(&self, stage: &str) -> Vec<String> {
        cuslice_cdi::hook_args(stage, &self.library_path())
    }
}

/// A runtime name: letters, digits, `_`, `-`, `.`, starting with a letter or digit, at most 63
/// characters (a Kubernetes RuntimeClass handler must be a DNS label; the name also names files).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--name {name:?} is not a usable runtime name; use letters, digits, '-', '_' or '.', \
             starting with a letter or digit, at most 63 characters (e.g. --name cuslice)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_prefix() {
        let l = Layout::new("/usr/local/", "cuslice").expect("layout");
        assert_eq!(l.hook_path(), "/usr/local/bin/cuslice-hook");
        assert_eq!(l.runtime_path(), "/usr/local/bin/cuslice-runtime");
        assert_eq!(l.cli_path(), "/usr/local/bin/cuslice");
        assert_eq!(l.library_path(), "/usr/local/lib/cuslice/libcuslice.so");
        assert_eq!(l.spank_path(), "/usr/local/lib/cuslice/cuslice_spank.so");
        assert_eq!(
            l.hook_args("poststop"),
            [
                "cuslice-hook",
                "poststop",
                "--library",
                "/usr/local/lib/cuslice/libcuslice.so"
            ]
        );
        assert_eq!(
            l.agent_unit_path(),
            "/etc/systemd/system/cuslice-agent.service"
        );
        assert_eq!(
            l.agent_wants_link(),
            "/etc/systemd/system/multi-user.target.wants/cuslice-agent.service"
        );
        assert_eq!(l.agent_defaults_path(), "/etc/default/cuslice-agent");
        let root = Layout::new("/", "x").expect("layout");
        assert_eq!(root.hook_path(), "/bin/cuslice-hook");
        assert_eq!(root.prefix(), "/");
    }

    #[test]
    fn refuses_relative_prefix_and_odd_names() {
        assert!(Layout::new("usr/local", "cuslice").is_err());
        for bad in ["", "-x", "a b", "a/b", "ä", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["cuslice", "cuslice-test", "c.s_1"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }
}
