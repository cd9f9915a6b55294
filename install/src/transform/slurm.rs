//! Slurm: cuslice's SPANK plugin as one line of Slurm's plugstack configuration, and the checks
//! of slurm.conf, gres.conf and the plugin's release that install makes before writing. Pure:
//! text in, text out.

use crate::problem::Problem;

/// slurm.conf on the target system, unless `SLURM_CONF` names another (as for Slurm's own
/// commands).
pub const SLURM_CONF: &str = "/etc/slurm/slurm.conf";
/// The plugstack file Slurm reads when slurm.conf has no `PlugStackConfig`: beside slurm.conf.
pub const PLUGSTACK_FILE: &str = "plugstack.conf";
/// The GRES configuration, beside slurm.conf.
pub const GRES_FILE: &str = "gres.conf";

/// The comment install puts just above its line in an existing plugstack file.
pub const ADDED: &str =
    "# Added by `cuslice install --engine slurm`; `cuslice uninstall --engine slurm` removes it.";
/// The first line of a plugstack file install creates (uninstall removes such a file whole).
pub const CREATED: &str = "# Created by `cuslice install --engine slurm`; \
                           `cuslice uninstall --engine slurm` removes this file.";

/// The plugstack line's parts, as paths on the target system.
#[derive(Debug, Clone, Copy)]
pub struct Spank<'a> {
    /// PREFIX/lib/cuslice/cuslice_spank.so
    pub plugin: &'a str,
    /// PREFIX/bin/cuslice-hook
    pub hook: &'a str,
}

impl Spank<'_> {
    /// The line that loads the plugin: `required PLUGIN hook=HOOK`.
    pub fn line(&self) -> String {
        format!("required {} hook={}", self.plugin, self.hook)
    }

    /// The plugstack file install creates where there is none.
    pub fn created(&self) -> String {
        format!("{CREATED}\n{}\n", self.line())
    }
}

/// The `Key=Value` settings of a slurm.conf-style file, in order: (key, value, line number from
/// 1). `#` starts a comment; a line may hold several settings (`NodeName=a Gres=gpu:1`); a value
/// may be double-quoted. Keys keep their case (Slurm compares them case-insensitively).
pub fn settings(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        for token in tokens(line) {
            if let Some((k, v)) = token.split_once('=') {
                let v = v.trim_matches('"');
                out.push((k.trim().to_owned(), v.to_owned(), i + 1));
            }
        }
    }
    out
}

/// Whitespace-separated words, a double-quoted part kept whole.
fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The last setting of `key` (case-insensitive): (value, line).
pub fn setting(text: &str, key: &str) -> Option<(String, usize)> {
    settings(text)
        .into_iter()
        .rev()
        .find(|(k, _, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v, n)| (v, n))
}

fn dir_of(path: &str) -> &str {
    match path.trim_end_matches('/').rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

fn join(dir: &str, file: &str) -> String {
    format!("{}/{file}", dir.trim_end_matches('/'))
}

/// The plugstack file Slurm reads, as a target path: slurm.conf's `PlugStackConfig` (a relative
/// one taken from slurm.conf's directory), else `plugstack.conf` beside slurm.conf. Also whether
/// slurm.conf named it.
pub fn plugstack_path(slurm_conf: &str, text: Option<&str>) -> (String, bool) {
    match text.and_then(|t| setting(t, "PlugStackConfig")) {
        Some((v, _)) if !v.is_empty() => {
            if v.starts_with('/') {
                (v, true)
            } else {
                (join(dir_of(slurm_conf), &v), true)
            }
        }
        _ => (join(dir_of(slurm_conf), PLUGSTACK_FILE), false),
    }
}

/// gres.conf beside slurm.conf, as a target path.
pub fn gres_path(slurm_conf: &str) -> String {
    join(dir_of(slurm_conf), GRES_FILE)
}

/// slurm.conf's `GresTypes` against gres.conf: a gres.conf that declares `Name=shard` needs
/// `shard` in GresTypes, or slurmd does not start. The problem is slurm.conf's.
pub fn gres_problem(slurm_conf: &str, gres_conf: &str) -> Option<Problem> {
    let shard_line = settings(gres_conf)
        .into_iter()
        .find(|(k, v, _)| k.eq_ignore_ascii_case("Name") && v.eq_ignore_ascii_case("shard"))
        .map(|(_, _, n)| n)?;
    match setting(slurm_conf, "GresTypes") {
        Some((types, _))
            if types
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("shard")) =>
        {
            None
        }
        Some((types, n)) => Some(Problem::new(
            format!(
                "GresTypes={types} (line {n}) does not name shard, but gres.conf beside it \
                 declares Name=shard (line {shard_line}), so slurmd would not start"
            ),
            format!(
                "add it (GresTypes={},shard) on every node and the controller, then run again",
                types.trim_end_matches(',')
            ),
        )),
        None => Some(Problem::new(
            format!(
                "has no GresTypes, but gres.conf beside it declares Name=shard (line \
                 {shard_line}), so slurmd would not start"
            ),
            "add GresTypes=gpu,shard on every node and the controller, then run again",
        )),
    }
}

/// What is at the plugstack path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    File,
    Directory,
    /// It is there but cannot be read: why.
    Unreadable(String),
}

/// Whether the plugstack path is usable: a file or nothing. `named_by` says who named it:
/// `Some(line)` for slurm.conf's `PlugStackConfig` at that line, None for `--config` or the
/// default.
pub fn plugstack_problem(found: &Found, named_by: Option<usize>) -> Option<Problem> {
    let by = match named_by {
        Some(n) => format!(" (slurm.conf's PlugStackConfig, line {n}, names it)"),
        None => String::new(),
    };
    match found {
        Found::Missing | Found::File => None,
        Found::Directory => Some(Problem::new(
            format!("is a directory, not a plugstack file{by}"),
            match named_by {
                Some(_) => {
                    "point PlugStackConfig at a file such as /etc/slurm/plugstack.conf (slurmd \
                     does not read a directory), or give the file with --config"
                }
                None => "give the plugstack file with --config, or move the directory away",
            },
        )),
        Found::Unreadable(why) => Some(Problem::new(
            format!("cannot be read ({why}){by}"),
            "run as root, or fix its permissions (slurmd and srun read it too), then run again",
        )),
    }
}

/// A plugstack line that loads a plugin: (`required`/`optional`, the plugin's path).
fn plugin_of(line: &str) -> Option<(&str, &str)> {
    let content = line.split('#').next().unwrap_or_default();
    let mut words = content.split_whitespace();
    let kind = words.next()?;
    if kind != "required" && kind != "optional" {
        return None;
    }
    Some((kind, words.next()?))
}

/// The file name of the installed plugin.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The lines of `text`, each with its byte offset and its terminator (if any).
fn lines_at(text: &str) -> Vec<(usize, &str)> {
    let mut at = 0;
    text.split_inclusive('\n')
        .map(|l| {
            let start = at;
            at += l.len();
            (start, l)
        })
        .collect()
}

/// The line without its terminator.
fn bare(line: &str) -> &str {
    line.trim_end_matches(['\n', '\r'])
}

/// Install: the plugstack file with cuslice's line in it. Already there: unchanged; there with
/// other arguments: that line replaced; another cuslice plugin (another PREFIX): refused.
/// Appended to an existing file (with the `ADDED` comment above it) in the file's line endings;
/// to a file whose last line has no newline, without one, so uninstall gives the bytes back.
pub fn install(old: Option<&str>, s: &Spank<'_>) -> Result<String, Problem> {
    let Some(text) = old else {
        return Ok(s.created());
    };
    let want = s.line();
    let plugin_file = file_name(s.plugin);
    for (n, (at, line)) in lines_at(text).into_iter().enumerate() {
        let Some((_, plugin)) = plugin_of(line) else {
            continue;
        };
        if plugin == s.plugin {
            if bare(line).trim() == want {
                return Ok(text.to_owned());
            }
            let end = at + bare(line).len();
            return Ok(format!("{}{want}{}", &text[..at], &text[end..]));
        }
        if file_name(plugin) == plugin_file {
            let fix = match plugin.strip_suffix(&format!("/lib/cuslice/{plugin_file}")) {
                Some(prefix) if !prefix.is_empty() => format!(
                    "run `cuslice uninstall --engine slurm --prefix {prefix}` first, or remove \
                     that line"
                ),
                _ => {
                    "remove that line (one cuslice plugin serves a node), then run again".to_owned()
                }
            };
            return Err(Problem::new(
                format!("already loads {plugin} (line {}), not {}", n + 1, s.plugin),
                fix,
            ));
        }
    }
    let nl = if text.contains("\r\n") { "\r\n" } else { "\n" };
    Ok(if text.is_empty() || text.ends_with('\n') {
        format!("{text}{ADDED}{nl}{want}{nl}")
    } else {
        format!("{text}{nl}{ADDED}{nl}{want}")
    })
}

/// Uninstall: the plugstack file without cuslice's line (whatever its arguments) and the
/// `ADDED` comment just above it; None: remove the file (it is exactly as install created it).
/// A file without the line is unchanged.
pub fn uninstall(old: Option<&str>, s: &Spank<'_>) -> Option<String> {
    let text = old?;
    if text == s.created() {
        return None;
    }
    let lines = lines_at(text);
    let Some(i) = lines
        .iter()
        .position(|(_, l)| plugin_of(l).is_some_and(|(_, p)| p == s.plugin))
    else {
        return Some(text.to_owned());
    };
    let (at, line) = lines[i];
    let mut start = at;
    if i > 0 && bare(lines[i - 1].1).trim_end() == ADDED {
        start = lines[i - 1].0;
    }
    let end = at + line.len();
    // The last line, with no newline after it: install put the newline before its lines.
    if !line.ends_with('\n') && start > 0 {
        start -= 1;
        if start > 0 && text.as_bytes()[start - 1] == b'\r' {
            start -= 1;
        }
    }
    Some(format!("{}{}", &text[..start], &text[end..]))
}

/// Whether the plugstack text loads the plugin at `plugin` (whatever its arguments).
pub fn loads(text: &str, plugin: &str) -> bool {
    text.lines()
        .any(|l| plugin_of(l).is_some_and(|(_, p)| p == plugin))
}

/// A Slurm release, major.minor (22.05).
pub type Release = (u32, u32);

/// The release a plugin's `plugin_version` (SLURM_VERSION_NUMBER) was built for.
pub fn release_of(plugin_version: u32) -> Release {
    (plugin_version >> 16, (plugin_version >> 8) & 0xff)
}

pub fn show(r: Release) -> String {
    format!("{}.{:02}", r.0, r.1)
}

/// The release in `slurmd -V`'s output (`slurm 22.05.8`, Debian's `slurm-wlm 22.05.8`).
pub fn parse_slurmd_version(out: &str) -> Option<Release> {
    let word = out.split_whitespace().last()?;
    let mut parts = word.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The plugin's release against slurmd's: Ok when slurmd would load it (or slurmd's release is
/// not known: `slurmd` None, which the caller notes); Err: why not and what would work.
pub fn version_problem(plugin_version: u32, slurmd: Option<Release>) -> Result<(), Problem> {
    let headers = |r: Option<Release>| match r {
        Some(r) => format!("Slurm {}'s headers", show(r)),
        None => "the headers of the Slurm release this node runs".to_owned(),
    };
    if plugin_version == 0 {
        let node = match slurmd {
            Some(r) => format!(" (this node's is {}, slurmd -V)", show(r)),
            None => String::new(),
        };
        return Err(Problem::new(
            format!(
                "was built without Slurm's headers (its plugin_version is 0), but slurmd loads \
                 only a SPANK plugin built for its own release{node}"
            ),
            format!(
                "build cuslice where {} are installed (libslurm-dev) and install again",
                headers(slurmd)
            ),
        ));
    }
    let built = release_of(plugin_version);
    match slurmd {
        Some(r) if r != built => Err(Problem::new(
            format!(
                "was built for Slurm {} but this node's slurmd is {} (slurmd -V)",
                show(built),
                show(r)
            ),
            format!(
                "slurmd refuses to start with a SPANK plugin of another release: build cuslice \
                 where {} are installed (libslurm-dev) and install again",
                headers(Some(r))
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Spank<'static> = Spank {
        plugin: "/usr/local/lib/cuslice/cuslice_spank.so",
        hook: "/usr/local/bin/cuslice-hook",
    };
    const LINE: &str =
        "required /usr/local/lib/cuslice/cuslice_spank.so hook=/usr/local/bin/cuslice-hook";

    #[test]
    fn slurm_conf_settings() {
        let conf = "# comment PlugStackConfig=/no\nClusterName=c\n\
                    plugstackconfig=\"/etc/slurm/my plug.conf\" # trailing\n\
                    NodeName=a Gres=gpu:1 CPUs=4\n";
        assert_eq!(
            setting(conf, "PlugStackConfig"),
            Some(("/etc/slurm/my plug.conf".to_owned(), 3))
        );
        assert_eq!(setting(conf, "gres"), Some(("gpu:1".to_owned(), 4)));
        assert_eq!(setting(conf, "Nothing"), None);
    }

    #[test]
    fn plugstack_is_named_by_slurm_conf_or_beside_it() {
        let c = "/etc/slurm/slurm.conf";
        assert_eq!(
            plugstack_path(c, None),
            ("/etc/slurm/plugstack.conf".to_owned(), false)
        );
        assert_eq!(
            plugstack_path(c, Some("ClusterName=x\n")),
            ("/etc/slurm/plugstack.conf".to_owned(), false)
        );
        assert_eq!(
            plugstack_path(c, Some("PLUGSTACKCONFIG=/srv/p.conf\n")),
            ("/srv/p.conf".to_owned(), true)
        );
        assert_eq!(
            plugstack_path(
                "/opt/slurm/etc/slurm.conf",
                Some("PlugStackConfig=spank.conf")
            ),
            ("/opt/slurm/etc/spank.conf".to_owned(), true)
        );
        assert_eq!(gres_path(c), "/etc/slurm/gres.conf");
    }

    #[test]
    fn gres_types_must_name_shard_when_gres_conf_declares_it() {
        let gres = "AutoDetect=nvml\nName=gpu File=/dev/nvidia0\nName=shard Count=8\n";
        assert_eq!(gres_problem("GresTypes=gpu,shard\n", gres), None);
        assert_eq!(
            gres_problem("GresTypes=gpu\n", "Name=gpu File=/dev/nvidia0\n"),
            None
        );
        assert_eq!(gres_problem("", "AutoDetect=nvml\n"), None);
        let p = gres_problem("ClusterName=c\nGresTypes=gpu\n", gres).expect("problem");
        assert_eq!(
            p.to_string(),
            "GresTypes=gpu (line 2) does not name shard, but gres.conf beside it declares \
             Name=shard (line 3), so slurmd would not start; add it (GresTypes=gpu,shard) on \
             every node and the controller, then run again"
        );
        let p = gres_problem("ClusterName=c\n", "NodeName=a name=SHARD Count=4\n").expect("p");
        assert!(p.what.starts_with("has no GresTypes, but gres.conf"), "{p}");
    }

    #[test]
    fn plugstack_must_be_a_readable_file() {
        assert_eq!(plugstack_problem(&Found::Missing, None), None);
        assert_eq!(plugstack_problem(&Found::File, Some(3)), None);
        let p = plugstack_problem(&Found::Directory, Some(3)).expect("dir");
        assert_eq!(
            p.what,
            "is a directory, not a plugstack file (slurm.conf's PlugStackConfig, line 3, names it)"
        );
        assert!(p.fix.starts_with("point PlugStackConfig at a file"), "{p}");
        let p = plugstack_problem(&Found::Directory, None).expect("dir");
        assert!(p.fix.contains("--config"), "{p}");
        let p = plugstack_problem(&Found::Unreadable("permission denied".into()), None)
            .expect("unreadable");
        assert!(
            p.what.starts_with("cannot be read (permission denied)"),
            "{p}"
        );
    }

    #[test]
    fn the_line() {
        assert_eq!(S.line(), LINE);
        assert!(loads(&S.created(), S.plugin));
        assert!(!loads(
            "include /etc/slurm/plugstack.conf.d/*.conf\n",
            S.plugin
        ));
        assert!(!loads(&format!("# {LINE}\n"), S.plugin));
    }

    /// install then uninstall gives back the bytes, and install is idempotent.
    #[track_caller]
    fn round_trip(before: Option<&str>) -> String {
        let after = install(before, &S).expect("install");
        assert_eq!(
            install(Some(&after), &S).expect("again"),
            after,
            "idempotent"
        );
        assert!(loads(&after, S.plugin), "{after:?}");
        assert_eq!(uninstall(Some(&after), &S).as_deref(), before, "{after:?}");
        after
    }

    #[test]
    fn install_and_uninstall_give_back_the_bytes() {
        assert_eq!(round_trip(None), S.created());
        assert_eq!(round_trip(Some("")), format!("{ADDED}\n{LINE}\n"));
        let inc = "include /etc/slurm/plugstack.conf.d/*.conf\n";
        assert_eq!(round_trip(Some(inc)), format!("{inc}{ADDED}\n{LINE}\n"));
        assert_eq!(
            round_trip(Some("optional /x/other.so")),
            format!("optional /x/other.so\n{ADDED}\n{LINE}")
        );
        assert_eq!(
            round_trip(Some("a\r\nb\r\n")),
            format!("a\r\nb\r\n{ADDED}\r\n{LINE}\r\n")
        );
        assert_eq!(
            round_trip(Some("a\r\nb")),
            format!("a\r\nb\r\n{ADDED}\r\n{LINE}")
        );
        round_trip(Some("\n\n# only comments\n"));
        // A file that holds just install's lines, but that install did not create, stays.
        round_trip(Some(&format!("{CREATED}\n")));
    }

    #[test]
    fn uninstall_leaves_other_lines_and_other_files() {
        assert_eq!(uninstall(None, &S), None);
        let other = "required /opt/x/lib/cuslice/cuslice_spank.so hook=/opt/x/bin/cuslice-hook\n";
        assert_eq!(uninstall(Some(other), &S).as_deref(), Some(other));
        // A line added by hand, without the comment, goes alone.
        let text = format!("a\n{LINE}\nb\n");
        assert_eq!(uninstall(Some(&text), &S).as_deref(), Some("a\nb\n"));
        // An out-of-date line (other arguments) is still cuslice's.
        let text = format!("a\n{ADDED}\noptional {} hook=/old\n", S.plugin);
        assert_eq!(uninstall(Some(&text), &S).as_deref(), Some("a\n"));
    }

    #[test]
    fn install_updates_its_line_and_refuses_another_prefix() {
        let old = format!("a\n{ADDED}\noptional {} hook=/old # mine\nb\n", S.plugin);
        assert_eq!(
            install(Some(&old), &S).expect("update"),
            format!("a\n{ADDED}\n{LINE}\nb\n")
        );
        let other = "a\nrequired /opt/x/lib/cuslice/cuslice_spank.so hook=/opt/x/bin/h\n";
        let p = install(Some(other), &S).expect_err("another prefix");
        assert_eq!(
            p.to_string(),
            "already loads /opt/x/lib/cuslice/cuslice_spank.so (line 2), not \
             /usr/local/lib/cuslice/cuslice_spank.so; run `cuslice uninstall --engine slurm \
             --prefix /opt/x` first, or remove that line"
        );
        let p = install(Some("required cuslice_spank.so\n"), &S).expect_err("relative");
        assert!(p.fix.starts_with("remove that line"), "{p}");
    }

    #[test]
    fn slurmd_versions() {
        assert_eq!(parse_slurmd_version("slurm 22.05.8\n"), Some((22, 5)));
        assert_eq!(parse_slurmd_version("slurm-wlm 23.02.1\n"), Some((23, 2)));
        assert_eq!(parse_slurmd_version("slurm 24.11.0-0rc1"), Some((24, 11)));
        assert_eq!(parse_slurmd_version("nonsense"), None);
        assert_eq!(parse_slurmd_version(""), None);
        assert_eq!(release_of(0x160508), (22, 5));
        assert_eq!(show((23, 2)), "23.02");
    }

    #[test]
    fn the_plugin_must_match_slurmd() {
        assert_eq!(version_problem(0x160508, Some((22, 5))), Ok(()));
        assert_eq!(version_problem(0x160500, None), Ok(()));
        let p = version_problem(0x160508, Some((23, 2))).expect_err("mismatch");
        assert_eq!(
            p.to_string(),
            "was built for Slurm 22.05 but this node's slurmd is 23.02 (slurmd -V); slurmd \
             refuses to start with a SPANK plugin of another release: build cuslice where Slurm \
             23.02's headers are installed (libslurm-dev) and install again"
        );
        let p = version_problem(0, Some((22, 5))).expect_err("no headers");
        assert!(p.what.contains("plugin_version is 0"), "{p}");
        assert!(p.fix.contains("Slurm 22.05's headers"), "{p}");
        assert!(version_problem(0, None).is_err());
    }
}
