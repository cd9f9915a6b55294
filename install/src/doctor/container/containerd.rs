//! Through containerd: the runtime handler NAME that `cuslice install --engine containerd`
//! declares for the CRI plugin (Kubernetes' `runtimeClassName: NAME`), run through `ctr`. ctr
//! does not read CRI handlers, so the test does what the CRI plugin does with one: it takes the
//! handler's `runtime_type` and `BinaryName` from the configuration of the containerd that
//! answers (`CONTAINERD_ADDRESS`, else /run/containerd/containerd.sock; its `--config`, with
//! its imports, as `containerd config dump` merges them) and runs `ctr run --runtime TYPE
//! --runc-binary BINARY --rootfs DIR`. containerd reads its configuration at start only, so a
//! configuration changed since it started is a problem of its own.

use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Bench, CMD, ENV, Outcome, Places, install_command, output, seen, timed};
use crate::transform::containerd::cri_plugin;

const DEFAULT_ADDRESS: &str = "/run/containerd/containerd.sock";
const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
const DEFAULT_NAMESPACE: &str = "default";

/// A runtime handler as the CRI plugin runs it.
#[derive(Debug, PartialEq)]
struct Handler {
    runtime_type: String,
    binary: Option<String>,
}

pub fn run(p: &Places, b: &Bench) -> Outcome {
    let name = p.layout.name();
    let address =
        std::env::var("CONTAINERD_ADDRESS").unwrap_or_else(|_| DEFAULT_ADDRESS.to_owned());
    let restart = "restart containerd (systemctl restart containerd)";
    let pid = match UnixStream::connect(&address) {
        Ok(s) => super::super::peer_pid(&s),
        Err(e) => {
            return Outcome::Problem(
                format!("no containerd answers on {address} ({e})"),
                "start containerd (systemctl start containerd), or set CONTAINERD_ADDRESS to \
                 where it listens"
                    .into(),
            );
        }
    };
    let Some(pid) = pid.filter(|&p| p > 0) else {
        return Outcome::NotRun(format!(
            "the process behind {address} cannot be told (run as root)"
        ));
    };
    let config = config_of(pid);
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let dump = match output(
        Command::new(&exe)
            .arg("--config")
            .arg(&config)
            .args(["config", "dump"]),
    ) {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            return Outcome::Problem(
                format!(
                    "containerd (pid {pid}) cannot read its configuration {}: {}",
                    config.display(),
                    crate::problem::one_line(&String::from_utf8_lossy(&o.stderr))
                ),
                "fix the file, then restart containerd".into(),
            );
        }
        Err(e) => {
            return Outcome::NotRun(format!("{} config dump: {e} (run as root)", exe.display()));
        }
    };
    let mut fix = install_command(p, "containerd");
    if config != Path::new(DEFAULT_CONFIG) {
        fix.push_str(&format!(" --config {}", config.display()));
    }
    let Some(handler) = handler(&dump, name) else {
        let disabled = if cri_disabled(&dump) {
            " (its CRI plugin, which holds runtime handlers, is in disabled_plugins)"
        } else {
            ""
        };
        return Outcome::Problem(
            format!(
                "containerd (pid {pid}, config {}) has no runtime handler {name}{disabled}",
                config.display()
            ),
            format!("{fix}, then {restart}"),
        );
    };
    if let Some(file) = changed_since_start(pid, &config, &dump) {
        return Outcome::Problem(
            format!(
                "containerd (pid {pid}) started before {} last changed: it runs with the \
                 configuration it read then",
                file.display()
            ),
            restart.into(),
        );
    }
    let ctr = |args: &[&str]| {
        let mut c = Command::new("ctr");
        c.arg("--address").arg(&address).args(args);
        output(&mut c)
    };
    let namespace =
        std::env::var("CONTAINERD_NAMESPACE").unwrap_or_else(|_| DEFAULT_NAMESPACE.to_owned());
    let had_namespace = match ctr(&["namespaces", "ls", "-q"]) {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l == namespace),
        Err(e) => return Outcome::NotRun(format!("ctr: {e} (apt-get install containerd)")),
    };
    let mut a: Vec<OsString> = vec!["--address".into(), address.clone().into()];
    a.extend(["run", "--rm", "--runtime"].map(OsString::from));
    a.push(handler.runtime_type.clone().into());
    if let Some(binary) = &handler.binary {
        a.push("--runc-binary".into());
        a.push(binary.into());
    }
    for e in ENV {
        a.push("--env".into());
        a.push(e.into());
    }
    for (src, dst, rw) in &b.mounts {
        a.push("--mount".into());
        a.push(
            format!(
                "type=bind,src={},dst={dst},options=rbind:{}",
                src.display(),
                if *rw { "rw" } else { "ro" }
            )
            .into(),
        );
    }
    a.push("--rootfs".into());
    a.push(b.rootfs.clone().into());
    a.push(b.name.clone().into());
    a.extend(CMD.map(OsString::from));
    let run = timed("ctr", &a).stdin(std::process::Stdio::null()).output();
    // Gone with --rm, unless ctr was killed first; and the namespace if ctr made it.
    let _ = ctr(&["task", "kill", "-s", "SIGKILL", &b.name]);
    let _ = ctr(&["task", "rm", "-f", &b.name]);
    let _ = ctr(&["container", "rm", &b.name]);
    if !had_namespace {
        let _ = ctr(&["namespaces", "rm", &namespace]);
    }
    let how = match &handler.binary {
        Some(bin) => format!(
            "ctr run --runtime {} --runc-binary {bin}",
            handler.runtime_type
        ),
        None => format!("ctr run --runtime {}", handler.runtime_type),
    };
    match run {
        Ok(out) => seen(&out, &how),
        Err(e) => Outcome::NotRun(format!("timeout: {e}")),
    }
}

/// The `--config` (or `-c`) containerd `pid` was started with (a relative path taken from its
/// working directory), else containerd's default.
fn config_of(pid: i32) -> PathBuf {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    match config_arg(&args).map(PathBuf::from) {
        None => PathBuf::from(DEFAULT_CONFIG),
        Some(c) if c.is_relative() => std::fs::read_link(format!("/proc/{pid}/cwd"))
            .map(|cwd| cwd.join(&c))
            .unwrap_or(c),
        Some(c) => c,
    }
}

fn config_arg(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for flag in ["--config", "-config", "-c"] {
            if a == flag {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                return Some(v.to_owned());
            }
        }
    }
    None
}

/// The runtime handler `name` in `containerd config dump`'s output: where containerd 1.x
/// (version 2) or 2.x (version 3) declares CRI runtimes.
fn handler(dump: &str, name: &str) -> Option<Handler> {
    let doc: toml_edit::DocumentMut = dump.parse().ok()?;
    [2, 3].iter().find_map(|&v| {
        let r = doc
            .get("plugins")?
            .get(cri_plugin(v))?
            .get("containerd")?
            .get("runtimes")?
            .get(name)?;
        Some(Handler {
            runtime_type: r
                .get("runtime_type")
                .and_then(|t| t.as_str())
                .unwrap_or("io.containerd.runc.v2")
                .to_owned(),
            binary: r
                .get("options")
                .and_then(|o| o.get("BinaryName"))
                .and_then(|b| b.as_str())
                .filter(|b| !b.is_empty())
                .map(str::to_owned),
        })
    })
}

/// Whether `containerd config dump`'s output disables the CRI plugin.
fn cri_disabled(dump: &str) -> bool {
    let Ok(doc) = dump.parse::<toml_edit::DocumentMut>() else {
        return false;
    };
    doc.get("disabled_plugins")
        .and_then(|d| d.as_array())
        .is_some_and(|a| {
            a.iter()
                .any(|p| [cri_plugin(2), cri_plugin(3)].contains(&p.as_str().unwrap_or_default()))
        })
}

/// Of the main configuration and the files it imports, one changed after containerd `pid`
/// started (with two seconds' slack for the clock's granularity).
fn changed_since_start(pid: i32, config: &Path, dump: &str) -> Option<PathBuf> {
    let started = started_at(pid)?;
    let imports: Vec<PathBuf> = dump
        .parse::<toml_edit::DocumentMut>()
        .ok()
        .and_then(|d| {
            d.get("imports")?.as_array().map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .map(PathBuf::from)
                    .collect()
            })
        })
        .unwrap_or_default();
    std::iter::once(config.to_path_buf())
        .chain(imports)
        .find(|f| {
            std::fs::metadata(f)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .is_some_and(|t| t.as_secs_f64() > started + 2.0)
        })
}

/// When process `pid` started, in seconds since the epoch: the boot time (`btime` in
/// /proc/stat) plus its start in clock ticks after boot.
fn started_at(pid: i32) -> Option<f64> {
    let ticks = cuslice_state::host::start_time(pid)?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf reads a constant; no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| btime + ticks as f64 / hz as f64)
}

/// Why the container ran uncapped under the handler, and what to do.
pub fn uncapped(p: &Places) -> (String, String) {
    (
        format!(
            "containerd's runtime handler {} did not add cuslice's hook",
            p.layout.name()
        ),
        format!(
            "{}, then restart containerd (systemctl restart containerd)",
            install_command(p, "containerd")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handler_from_a_config_dump() {
        let v2 = r#"version = 2
imports = ["/etc/containerd/conf.d/cuslice.toml"]
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cuslice]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cuslice.options]
            BinaryName = "/usr/local/bin/cuslice-runtime"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
"#;
        let v3 = r#"version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpu]
  runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpu.options]
    BinaryName = '/opt/c/bin/cuslice-runtime'
"#;
        let h = |t: &str, b: Option<&str>| Handler {
            runtime_type: t.into(),
            binary: b.map(Into::into),
        };
        let runc = "io.containerd.runc.v2";
        for (dump, name, want) in [
            (
                v2,
                "cuslice",
                Some(h(runc, Some("/usr/local/bin/cuslice-runtime"))),
            ),
            (v2, "runc", Some(h(runc, None))),
            (v2, "gpu", None),
            (v3, "gpu", Some(h(runc, Some("/opt/c/bin/cuslice-runtime")))),
            (v3, "cuslice", None),
            ("version = 2\n", "cuslice", None),
            ("not toml [", "cuslice", None),
        ] {
            assert_eq!(handler(dump, name), want, "{name} in {dump}");
        }
        assert!(!cri_disabled(v2));
        assert!(cri_disabled(
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
        ));
    }

    #[test]
    fn the_config_flag_in_each_spelling() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (cmdline, want) in [
            (&["containerd"][..], None),
            (&["containerd", "--config", "/a.toml"], Some("/a.toml")),
            (
                &["containerd", "-c", "/b.toml", "--log-level", "debug"],
                Some("/b.toml"),
            ),
            (
                &["/usr/bin/containerd", "--config=/c.toml"],
                Some("/c.toml"),
            ),
            (&["containerd", "--address", "/x.sock"], None),
        ] {
            assert_eq!(config_arg(&args(cmdline)).as_deref(), want, "{cmdline:?}");
        }
    }
}
