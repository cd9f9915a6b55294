//! The host-pid service: a unix stream socket at `<state root>/agent/agent.sock`, which the OCI
//! hook mounts read-only at `/run/cuslice/agent` in every slice's container. A process that
//! connects is told its pid as the agent's pid namespace sees it (the host's), read from the
//! kernel's record of who connected (SO_PEERCRED), then the connection is closed. The client
//! sends nothing and the agent never reads: a slow or silent client cannot hold the accept loop
//! up. Protocol: `cuslice_state::agent` and docs/agent.md.

use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cuslice_state::agent::{self, AskError, SOCKET_NAME};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// How long one reply may take to write before the client is dropped. The reply is a few dozen
/// bytes into an empty socket buffer, so this is only ever reached by something odd.
const WRITE_TIMEOUT: Duration = Duration::from_millis(100);

pub struct Server {
    listener: UnixListener,
    path: PathBuf,
}

impl Server {
    /// Makes `dir` (0755) and listens on `dir/agent.sock` (0666: any user in any container may
    /// connect). A socket file a dead agent left is replaced; a live agent's is not.
    pub fn bind(dir: &Path) -> Result<Server, String> {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("cannot make the socket directory {}: {e}", dir.display()))?;
        let path = dir.join(SOCKET_NAME);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot look at {}: {e}", path.display())),
            Ok(m) if !m.file_type().is_socket() => {
                return Err(format!(
                    "{} exists and is not a socket; move it away and start the agent again",
                    path.display()
                ));
            }
            Ok(_) => match agent::ask(&path, Duration::from_secs(1)) {
                Err(AskError::NotRunning { .. }) => {
                    // A dead agent's socket: nobody listens on it any more.
                    std::fs::remove_file(&path).map_err(|e| {
                        format!("cannot remove the stale socket {}: {e}", path.display())
                    })?;
                }
                _ => {
                    return Err(format!(
                        "another cuslice agent is listening on {}; stop it first (one agent per \
                         node), or give this one another --state-root",
                        path.display()
                    ));
                }
            },
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("cannot open {} to every user: {e}", path.display()))?;
        Ok(Server { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers connections until the process ends.
    pub fn serve(&self) {
        let mut failing = false;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    failing = false;
                    answer(&s);
                }
                Err(e) => {
                    // Out of descriptors or memory: say so once, wait a little, go on.
                    if !failing {
                        eprintln!(
                            "cuslice agent: cannot accept on {}: {e}",
                            self.path.display()
                        );
                    }
                    failing = true;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// Tells the peer its pid in this process's pid namespace and closes.
fn answer(s: &UnixStream) {
    // The kernel recorded the peer's process at connect and translates its pid into the reader's
    // pid namespace: 0 when the peer's process is not visible from here.
    let pid = getsockopt(s, PeerCredentials).ok().map(|c| c.pid());
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut w = s;
    // A client that left before reading is its own business.
    let _ = w.write_all(agent::greeting(pid).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_told_its_own_pid() {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::bind(&dir.path().join("agent")).unwrap();
        let path = server.path().to_path_buf();
        std::thread::spawn(move || server.serve());
        let pid = agent::ask(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666, "{mode:o}");
        let mode = std::fs::metadata(dir.path().join("agent"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{mode:o}");
    }

    #[test]
    fn not_a_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SOCKET_NAME), "x").unwrap();
        let e = Server::bind(dir.path()).err().unwrap();
        assert!(e.contains("is not a socket"), "{e}");
    }
}
