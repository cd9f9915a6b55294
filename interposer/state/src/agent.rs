//! The node agent's socket protocol (docs/agent.md), both sides of it: the greeting the agent
//! writes and the client that reads it (the interposer in a container, `cuslice status`).
//!
//! A client connects to `<state root>/agent/agent.sock` (in a container: `CONTAINER_SOCKET`)
//! and sends nothing. The agent reads the client's credentials from the kernel (SO_PEERCRED,
//! which gives the pid as the agent's pid namespace sees it: the host pid), writes one line and
//! closes:
//!
//! ```text
//! cuslice-agent 1 host-pid 12345
//! cuslice-agent 1 error pid-not-visible
//! ```
//!
//! The words are `cuslice-agent`, the protocol version, then `key value` pairs. Clients ignore
//! keys they do not know, so later agents may add pairs under the same version; a change that
//! old clients would misread gets a new version, which they refuse by name.

use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The socket's file name in the agent's directory (`<state root>/agent/`).
pub const SOCKET_NAME: &str = "agent.sock";
/// Where the OCI hook mounts the agent's directory in every slice's container.
pub const CONTAINER_DIR: &str = crate::paths::CONTAINER_AGENT_DIR;
pub const CONTAINER_SOCKET: &str = crate::paths::CONTAINER_AGENT_SOCKET;
/// The protocol version this side speaks.
pub const VERSION: u32 = 1;
const MAGIC: &str = "cuslice-agent";
/// The longest greeting a client reads; anything longer is not an agent.
const MAX_LINE: usize = 512;

/// The line the agent writes to a client whose pid (in the agent's pid namespace) is `pid`:
/// None or 0 when the kernel could not map the client's pid into the agent's namespace (the
/// client is in a pid namespace the agent does not contain).
pub fn greeting(pid: Option<i32>) -> String {
    match pid {
        Some(p) if p > 0 => format!("{MAGIC} {VERSION} host-pid {p}\n"),
        _ => format!("{MAGIC} {VERSION} error pid-not-visible\n"),
    }
}

/// Reads a greeting: the host pid, or one line saying what was wrong with it.
pub fn parse(line: &str) -> Result<i32, String> {
    let line = line.trim_end_matches('\n');
    let mut words = line.split(' ');
    if words.next() != Some(MAGIC) {
        return Err(format!("{line:?} is not a cuslice agent's greeting"));
    }
    match words.next().map(str::parse::<u32>) {
        Some(Ok(VERSION)) => {}
        Some(Ok(v)) => {
            return Err(format!(
                "the agent speaks protocol {v}, this cuslice speaks {VERSION}; run the same \
                 cuslice version for the agent and in containers"
            ));
        }
        _ => return Err(format!("{line:?} has no protocol version")),
    }
    let rest: Vec<&str> = words.collect();
    let mut host_pid = None;
    let mut error = None;
    for pair in rest.chunks(2) {
        match pair {
            ["host-pid", v] => host_pid = v.parse::<i32>().ok().filter(|&p| p > 0),
            ["error", v] => error = Some(*v),
            _ => {}
        }
    }
    match (host_pid, error) {
        (Some(p), _) => Ok(p),
        (None, Some("pid-not-visible")) => Err(
            "the agent cannot see this process's pid (it runs in a pid namespace that does not \
             contain this one; run it in the host's)"
                .into(),
        ),
        (None, Some(e)) => Err(format!("the agent answered: {e}")),
        (None, None) => Err(format!("{line:?} names no host pid")),
    }
}

/// Why `ask` got no host pid.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Nothing listens there: no socket file, or one a dead agent left.
    #[error("no cuslice agent at {path} ({err})")]
    NotRunning { path: String, err: io::Error },
    /// Something is there, but it did not answer as an agent does in time.
    #[error("the cuslice agent at {path} did not answer: {why}")]
    NoAnswer { path: String, why: String },
}

/// Connects to the agent's socket at `path` and reads its greeting: this process's host pid.
/// Never takes longer than `timeout` (connecting does not wait for a busy agent).
pub fn ask(path: &Path, timeout: Duration) -> Result<i32, AskError> {
    let deadline = Instant::now() + timeout;
    let shown = || path.display().to_string();
    let no_answer = |why: String| AskError::NoAnswer { path: shown(), why };
    let stream = connect(path).map_err(|err| match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) | Some(libc::ENOTDIR) => {
            AskError::NotRunning { path: shown(), err }
        }
        Some(libc::EAGAIN) => no_answer("it is busy (its queue of connections is full)".into()),
        _ => no_answer(err.to_string()),
    })?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| no_answer(e.to_string()))?;
    let mut buf = [0u8; MAX_LINE];
    let mut n = 0;
    let mut s = &stream;
    while n < buf.len() && !buf[..n].contains(&b'\n') {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(no_answer(format!(
                    "no greeting within {} ms",
                    timeout.as_millis()
                )));
            }
            Err(e) => return Err(no_answer(e.to_string())),
        }
        if Instant::now() > deadline {
            return Err(no_answer(format!(
                "no greeting within {} ms",
                timeout.as_millis()
            )));
        }
    }
    let line = String::from_utf8_lossy(&buf[..n]);
    parse(&line).map_err(no_answer)
}

/// A connected stream socket, or the connect error. The connect itself never blocks: a
/// non-blocking AF_UNIX connect either succeeds at once or fails (EAGAIN when the listener's
/// queue is full); the socket is made blocking again afterwards, for reads with a timeout.
fn connect(path: &Path) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket path is too long for a unix socket",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un whose first `len` bytes hold the family and the
    // NUL-terminated path; `fd` is an open socket.
    let r = unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&raw const addr).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    #[test]
    fn greeting_and_parse_agree() {
        assert_eq!(greeting(Some(4242)), "cuslice-agent 1 host-pid 4242\n");
        assert_eq!(parse(&greeting(Some(4242))), Ok(4242));
        let e = parse(&greeting(None)).unwrap_err();
        assert!(e.contains("pid namespace"), "{e}");
        assert_eq!(parse(&greeting(Some(0))), Err(e));
    }

    #[test]
    fn later_pairs_are_ignored_and_other_versions_refused() {
        assert_eq!(
            parse("cuslice-agent 1 node gpu-7 host-pid 99 slots 3\n"),
            Ok(99)
        );
        let e = parse("cuslice-agent 2 host-pid 99\n").unwrap_err();
        assert!(e.contains("protocol 2"), "{e}");
        for bad in [
            "",
            "hello\n",
            "cuslice-agent\n",
            "cuslice-agent x host-pid 1\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse("cuslice-agent 1 host-pid -3\n").is_err());
        assert!(
            parse("cuslice-agent 1\n")
                .unwrap_err()
                .contains("no host pid")
        );
    }

    #[test]
    fn ask_reads_a_greeting_and_says_when_nobody_listens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SOCKET_NAME);
        let e = ask(&path, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, AskError::NotRunning { .. }), "{e}");
        let l = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"cuslice-agent 1 host-pid 77\n").unwrap();
            l
        });
        assert_eq!(ask(&path, Duration::from_secs(5)).unwrap(), 77);
        // A socket file nobody listens on any more: not running.
        drop(server.join().unwrap());
        let e = ask(&path, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, AskError::NotRunning { .. }), "{e}");
    }

    #[test]
    fn a_silent_listener_costs_the_timeout_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SOCKET_NAME);
        let _l = UnixListener::bind(&path).unwrap();
        // The listener never accepts: the connection waits in its queue, and nothing is read.
        let e = ask(&path, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("no greeting within 50 ms"), "{e}");
    }
}
