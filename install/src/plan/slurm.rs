//! The slurm engine's reading of the node: slurm.conf (`SLURM_CONF`, else
//! /etc/slurm/slurm.conf), gres.conf beside it, the plugstack file slurm.conf names, and the
//! SPANK plugin's release against `slurmd -V`. The text itself is `transform::slurm`'s.

use std::path::{Path, PathBuf};

use super::{Change, Cmd, Ctx, Failure, Options, Plan};
use crate::elfsym;
use crate::fsio;
use crate::layout::{SPANK_BUILT, SPANK_PLUGIN};
use crate::problem::Problem;
use crate::transform::slurm::{self, Found, Release, Spank};

/// slurm.conf as a target path: `SLURM_CONF` where it is set (to an absolute path), as Slurm's
/// own commands read it, else /etc/slurm/slurm.conf.
pub fn slurm_conf() -> String {
    std::env::var("SLURM_CONF")
        .ok()
        .filter(|c| c.starts_with('/'))
        .unwrap_or_else(|| slurm::SLURM_CONF.to_owned())
}

/// What is at `path` (on this machine), and its bytes when it is a readable file.
fn look(path: &Path) -> (Found, Option<(Vec<u8>, u32)>) {
    if path.is_dir() {
        return (Found::Directory, None);
    }
    match fsio::read(path) {
        Ok(None) => (Found::Missing, None),
        Ok(Some(b)) => (Found::File, Some(b)),
        Err(e) => (Found::Unreadable(e.to_string()), None),
    }
}

/// slurm.conf's text (None: there is none). Refused: a directory, or a file that cannot be read.
fn read_slurm_conf(cx: &Ctx<'_>, target: &str) -> Result<Option<String>, Failure> {
    let path = fsio::resolve(&cx.o.root, target);
    match look(&path) {
        (Found::File, Some((b, _))) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        (Found::Directory, _) => Err(cx.refuse(
            &path,
            Problem::new(
                "is a directory, not slurm.conf",
                "set SLURM_CONF to slurm.conf's path, or give the plugstack file with --config",
            ),
        )),
        (Found::Unreadable(why), _) => Err(cx.refuse(
            &path,
            Problem::new(
                format!("cannot be read ({why})"),
                "run as root, or give the plugstack file with --config",
            ),
        )),
        _ => Ok(None),
    }
}

/// The plugstack file as a target path, and the line of slurm.conf's `PlugStackConfig` when
/// slurm.conf names it.
fn plugstack(o: &Options, conf: &str, conf_text: Option<&str>) -> (String, Option<usize>) {
    if let Some(c) = &o.config {
        return (c.clone(), None);
    }
    let (path, named) = slurm::plugstack_path(conf, conf_text);
    let line = conf_text
        .filter(|_| named)
        .and_then(|t| slurm::setting(t, "PlugStackConfig"))
        .map(|(_, n)| n);
    (path, line)
}

/// The slurm engine's registration: cuslice's line in the plugstack file (created if missing,
/// removed again if install created it). Install first checks slurm.conf against gres.conf.
pub(super) fn registration(cx: &Ctx<'_>, plan: &mut Plan) -> Result<Change, Failure> {
    let o = cx.o;
    let l = &o.layout;
    let conf = slurm_conf();
    let conf_text = if o.cmd == Cmd::Install || o.config.is_none() {
        read_slurm_conf(cx, &conf)?
    } else {
        None
    };
    if o.cmd == Cmd::Install
        && let Some(text) = &conf_text
    {
        let gres = fsio::resolve(&o.root, &slurm::gres_path(&conf));
        if let (Found::File, Some((g, _))) = look(&gres)
            && let Some(p) = slurm::gres_problem(text, &String::from_utf8_lossy(&g))
        {
            return Err(cx.refuse(&fsio::resolve(&o.root, &conf), p));
        }
    }
    let (target, named_by) = plugstack(o, &conf, conf_text.as_deref());
    let path = fsio::resolve(&o.root, &target);
    if let Some(p) = slurm::plugstack_problem(&look(&path).0, named_by) {
        return Err(cx.refuse(&path, p));
    }
    let (path, old, mode) = cx.read_text(&target)?;
    let (plugin, hook) = (l.spank_path(), l.hook_path());
    let spank = Spank {
        plugin: &plugin,
        hook: &hook,
    };
    let new = match o.cmd {
        Cmd::Install => {
            Some(slurm::install(old.as_deref(), &spank).map_err(|p| cx.refuse(&path, p))?)
        }
        Cmd::Uninstall => slurm::uninstall(old.as_deref(), &spank),
    };
    // Nothing to restart slurmd for where the plugstack file stays as it was (None: the file
    // install created goes).
    let changed = new != old;
    plan.notes
        .extend(notes(o, &target, named_by.is_some(), changed));
    Ok(Ctx::text_change(path, old, mode, new))
}

/// Whether the plugstack file slurm.conf names (or the default one) loads this PREFIX's plugin.
pub fn registered(o: &Options) -> bool {
    let conf = slurm_conf();
    let conf_text = std::fs::read(fsio::resolve(&o.root, &conf))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let (target, _) = slurm::plugstack_path(&conf, conf_text.as_deref());
    std::fs::read(fsio::resolve(&o.root, &target))
        .is_ok_and(|b| slurm::loads(&String::from_utf8_lossy(&b), &o.layout.spank_path()))
}

fn notes(o: &Options, target: &str, named: bool, changed: bool) -> Vec<String> {
    match o.cmd {
        Cmd::Install => {
            let mut v = Vec::new();
            if changed {
                v.push(
                    "slurm: restart slurmd to load the plugin: systemctl restart slurmd".to_owned(),
                );
            }
            v.push(format!(
                "slurm: the plugin is `required`: srun, salloc and sbatch read {target} too, \
                 so every host that reads it (login nodes included) needs {} installed",
                o.layout.spank_path()
            ));
            if o.config.is_some() && !named {
                v.push(format!(
                    "slurm: slurmd reads {target} only where slurm.conf's PlugStackConfig names it"
                ));
            }
            v
        }
        Cmd::Uninstall if changed => {
            vec!["slurm: restart slurmd to unload the plugin: systemctl restart slurmd".to_owned()]
        }
        Cmd::Uninstall => Vec::new(),
    }
}

/// Where `slurmd` is: on PATH, else in the usual sbin directories (which a user's PATH may lack).
fn slurmd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("slurmd"))
        .find(|p| p.is_file())
}

/// This node's Slurm release by `slurmd -V`: None: no slurmd; Err: what it said instead.
pub fn slurmd_release() -> Option<Result<Release, String>> {
    let exe = slurmd()?;
    Some(
        match std::process::Command::new(&exe)
            .arg("-V")
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                slurm::parse_slurmd_version(&text)
                    .filter(|_| out.status.success())
                    .ok_or_else(|| {
                        format!(
                            "`{} -V` said {:?} ({})",
                            exe.display(),
                            crate::problem::one_line(&format!(
                                "{text}{}",
                                String::from_utf8_lossy(&out.stderr)
                            )),
                            out.status
                        )
                    })
            }
            Err(e) => Err(format!("cannot run {}: {e}", exe.display())),
        },
    )
}

/// The SPANK plugin in `from` (`libcuslice_spank.so` in a build, `../lib/cuslice/cuslice_spank.so`
/// from an installed PREFIX/bin), checked against this node's slurmd; refused when missing, not
/// a SPANK plugin, or built for another Slurm release.
pub(super) fn plugin_source(
    cx: &Ctx<'_>,
    from: &Path,
    warnings: &mut Vec<String>,
) -> Result<PathBuf, Failure> {
    let built = from.join(SPANK_BUILT);
    let installed = from.join("../lib/cuslice").join(SPANK_PLUGIN);
    let src = if !built.is_file() && installed.is_file() {
        installed
    } else {
        built
    };
    let how = "build it with `cargo build --release -p cuslice-slurm` where the Slurm headers of \
               this node's release are installed (libslurm-dev)";
    let bytes = match std::fs::read(&src) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(cx.refuse(
                &src,
                Problem::new(
                    "missing (the slurm engine installs this SPANK plugin)",
                    format!("{how}, or pass --from DIR holding {SPANK_BUILT}"),
                ),
            ));
        }
        Err(e) => return Err(cx.failed(&src, "cannot read it", &e)),
    };
    let version = elfsym::exported_u32(&bytes, "plugin_version").map_err(|e| {
        cx.refuse(
            &src,
            Problem::new(
                format!("{e}, so it is not cuslice's SPANK plugin"),
                format!("{how}, or pass --from DIR holding it"),
            ),
        )
    })?;
    let built_for = slurm::show(slurm::release_of(version));
    let node = match slurmd_release() {
        Some(Ok(r)) => Some(r),
        None => {
            warnings.push(format!(
                "slurm: slurmd not found (on PATH, /usr/sbin, /usr/local/sbin), so {SPANK_PLUGIN} \
                 (built for Slurm {built_for}) was not checked against it: slurmd starts only \
                 with a SPANK plugin of its own release"
            ));
            None
        }
        Some(Err(why)) => {
            warnings.push(format!(
                "slurm: this node's Slurm release is unknown ({why}), so {SPANK_PLUGIN} (built \
                 for Slurm {built_for}) was not checked against it: slurmd starts only with a \
                 SPANK plugin of its own release"
            ));
            None
        }
    };
    slurm::version_problem(version, node).map_err(|p| cx.refuse(&src, p))?;
    Ok(src)
}
