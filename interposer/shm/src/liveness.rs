//! Liveness by open-file-description (OFD) locks: a process holds a write lock on one byte of a
//! shared file for as long as it is registered in the slot that byte stands for. The kernel drops
//! the lock when the last descriptor of that open file goes away, so a process killed by SIGKILL
//! looks dead to everyone at once, and a process that is merely slow never does.
//!
//! OFD locks belong to the open file description, not the process: a forked child inherits the
//! parent's. A child must therefore close its inherited descriptor (and open its own) before it
//! registers, or the parent would look alive while the child lives.

use std::io;
use std::os::fd::RawFd;

fn ofd(fd: RawFd, byte: i64, cmd: i32, kind: i32) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value to start from.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = byte;
    fl.l_len = 1;
    // SAFETY: fcntl with an OFD lock command and a pointer to a valid, initialised flock.
    let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

/// Takes the liveness lock on `byte` without waiting. Fails if anyone else holds it.
pub fn hold(fd: RawFd, byte: i64) -> io::Result<()> {
    ofd(fd, byte, libc::F_OFD_SETLK, libc::F_WRLCK).map(|_| ())
}

/// Takes the lock on `byte`, waiting in the kernel for as long as another open file description
/// holds it (F_OFD_SETLKW). Interrupted waits go on.
pub fn wait_hold(fd: RawFd, byte: i64) -> io::Result<()> {
    loop {
        match ofd(fd, byte, libc::F_OFD_SETLKW, libc::F_WRLCK) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// Gives up the liveness lock on `byte` held through `fd`.
pub fn release(fd: RawFd, byte: i64) -> io::Result<()> {
    ofd(fd, byte, libc::F_OFD_SETLK, libc::F_UNLCK).map(|_| ())
}

/// Whether some other open file description holds the lock on `byte`. A lock held through `fd`
/// itself does not count (OFD locks never conflict with their own description). When the kernel
/// cannot tell, the answer is "held": never treat as dead what may be alive.
pub fn held_by_other(fd: RawFd, byte: i64) -> bool {
    match ofd(fd, byte, libc::F_OFD_GETLK, libc::F_WRLCK) {
        Ok(fl) => fl.l_type != libc::F_UNLCK as i16,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_lock_is_seen_by_other_descriptions_and_released() {
        let dir = std::env::temp_dir().join(format!("cuslice-shm-{}", std::process::id()));
        std::fs::write(&dir, b"x").unwrap();
        let a = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dir)
            .unwrap();
        let b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dir)
            .unwrap();
        assert!(!held_by_other(b.as_raw_fd(), 7));
        hold(a.as_raw_fd(), 7).unwrap();
        assert!(held_by_other(b.as_raw_fd(), 7));
        assert!(!held_by_other(a.as_raw_fd(), 7), "own lock never conflicts");
        assert!(hold(b.as_raw_fd(), 7).is_err());
        release(a.as_raw_fd(), 7).unwrap();
        assert!(!held_by_other(b.as_raw_fd(), 7));
        drop(a);
        hold(b.as_raw_fd(), 7).unwrap();
        drop(b);
        std::fs::remove_file(&dir).unwrap();
    }
}
