//! Through Docker: the test's root filesystem imported as an image (`docker import`), then
//! `docker run --rm --runtime=NAME -e CUSLICE_MEMORY_LIMIT=1GiB`, the runtime that `cuslice
//! install --engine docker` adds to daemon.json; the image is removed afterwards. The daemon is
//! the one the `docker` command talks to (`DOCKER_HOST`, else /var/run/docker.sock); it is
//! asked first whether it knows the runtime (`docker info`), since it reads daemon.json at start
//! and on SIGHUP only.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{Bench, CMD, ENV, Outcome, Places, install_command, output, seen, timed};

pub fn run(p: &Places, b: &Bench) -> Outcome {
    let name = p.layout.name();
    let version =
        match output(Command::new("docker").args(["version", "--format", "{{.Server.Version}}"])) {
            Ok(o) => o,
            Err(e) => {
                return Outcome::NotRun(format!("docker: {e} (apt-get install docker.io)"));
            }
        };
    if !version.status.success() {
        return Outcome::Problem(
            format!(
                "dockerd does not answer ({})",
                crate::problem::one_line(&String::from_utf8_lossy(&version.stderr))
            ),
            "start dockerd (systemctl start docker), or set DOCKER_HOST to where it listens".into(),
        );
    }
    let info = output(Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]))
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    match runtime(&info, name) {
        Err(known) => {
            return Outcome::Problem(
                format!("dockerd has no runtime {name} (it has {known})"),
                format!(
                    "{}, then kill -HUP $(pidof dockerd)",
                    install_command(p, "docker")
                ),
            );
        }
        Ok(path) if path.starts_with('/') && !Path::new(&path).is_file() => {
            return Outcome::Problem(
                format!("dockerd's runtime {name} runs {path}, which is missing"),
                format!(
                    "{}, then restart dockerd (systemctl restart docker)",
                    install_command(p, "docker")
                ),
            );
        }
        Ok(_) => {}
    }
    let image = format!("{}:local", b.name);
    if let Err(why) = import(&b.rootfs, &image) {
        return Outcome::Problem(format!("docker import: {why}"), "read the message".into());
    }
    let mut a: Vec<OsString> = vec![
        "run".into(),
        "--rm".into(),
        "--name".into(),
        b.name.clone().into(),
        format!("--runtime={name}").into(),
        "--network=none".into(),
    ];
    for e in ENV {
        a.push("-e".into());
        a.push(e.into());
    }
    for (src, dst, rw) in &b.mounts {
        a.push("--mount".into());
        a.push(
            format!(
                "type=bind,source={},target={dst}{}",
                src.display(),
                if *rw { "" } else { ",readonly" }
            )
            .into(),
        );
    }
    a.push(image.clone().into());
    a.extend(CMD.map(OsString::from));
    let run = timed("docker", &a).stdin(Stdio::null()).output();
    // Gone with --rm, unless docker was killed first; then the image.
    let _ = output(Command::new("docker").args(["rm", "--force", &b.name]));
    let _ = output(Command::new("docker").args(["rmi", &image]));
    match run {
        Ok(out) => seen(&out, &format!("docker run --runtime={name}")),
        Err(e) => Outcome::NotRun(format!("timeout: {e}")),
    }
}

/// `tar -C ROOTFS -c . | docker import - IMAGE`.
fn import(rootfs: &Path, image: &str) -> Result<(), String> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tar: {e}"))?;
    let stdout = tar.stdout.take().ok_or("tar: no output")?;
    let out = Command::new("docker")
        .args(["import", "-", image])
        .stdin(stdout)
        .output()
        .map_err(|e| e.to_string());
    let _ = tar.wait();
    let out = out?;
    if !out.status.success() {
        return Err(crate::problem::one_line(&String::from_utf8_lossy(
            &out.stderr,
        )));
    }
    Ok(())
}

/// From `docker info --format '{{json .Runtimes}}'`: the path the runtime `name` runs; Err:
/// the runtimes dockerd has instead.
fn runtime(info: &str, name: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(info.trim()).unwrap_or_default();
    let Some(runtimes) = v.as_object() else {
        return Err("none that `docker info` lists".into());
    };
    match runtimes.get(name) {
        Some(r) => Ok(r["path"].as_str().unwrap_or_default().to_owned()),
        None => Err(runtimes.keys().cloned().collect::<Vec<_>>().join(", ")),
    }
}

/// Why the container ran uncapped under the runtime, and what to do.
pub fn uncapped(p: &Places) -> (String, String) {
    (
        format!(
            "dockerd's runtime {} did not add cuslice's hook",
            p.layout.name()
        ),
        format!(
            "{}, then restart dockerd (systemctl restart docker)",
            install_command(p, "docker")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::runtime;

    #[test]
    fn runtimes_from_docker_info() {
        let info =
            r#"{"cuslice":{"path":"/usr/local/bin/cuslice-runtime"},"runc":{"path":"runc"}}"#;
        assert_eq!(
            runtime(info, "cuslice"),
            Ok("/usr/local/bin/cuslice-runtime".into())
        );
        assert_eq!(runtime(info, "other"), Err("cuslice, runc".into()));
        assert_eq!(
            runtime("", "cuslice"),
            Err("none that `docker info` lists".into())
        );
    }
}
