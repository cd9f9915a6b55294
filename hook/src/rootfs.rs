//! Paths inside a container's root filesystem, resolved the way the container will resolve them:
//! every lookup is `openat2(RESOLVE_IN_ROOT)` from the rootfs, so a symlink in the image (say
//! `/etc/ld.so.preload -> /etc/shadow`, or `/run -> /`) can never send the hook onto a host path.
//! Needs Linux 5.6 or later (openat2).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

pub struct Rootfs {
    fd: OwnedFd,
    pub path: PathBuf,
}

/// Why [`Rootfs::read_at_most`] gave no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// The path is not a regular file; what it is (`a FIFO`).
    NotRegular(&'static str),
    /// The file is larger than the bound: its size in bytes.
    TooLarge(u64),
    Io(io::Error),
}

fn io(e: Errno) -> io::Error {
    if e == Errno::ENOSYS {
        return io::Error::other(
            "openat2 is not available (cuslice-hook needs Linux 5.6 or later to resolve paths safely inside a container)",
        );
    }
    io::Error::from(e)
}

impl Rootfs {
    pub fn open(path: &Path) -> io::Result<Rootfs> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)?;
        Ok(Rootfs {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn resolve(&self, rel: &str, flags: OFlag) -> Result<OwnedFd, Errno> {
        openat2(
            self.fd.as_fd(),
            rel,
            OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
        )
    }

    /// An `O_PATH` handle on `rel`, for mounting onto through `/proc/self/fd/N`.
    pub fn target(&self, rel: &str) -> io::Result<OwnedFd> {
        self.resolve(rel, OFlag::O_PATH).map_err(io)
    }

    /// The bytes of the regular file `rel`, or `None` when there is none (nothing at that
    /// path, or a path through something that is not a directory). Reads at most `max` bytes:
    /// a larger file is [`ReadError::TooLarge`], whatever its size, without reading it. What is
    /// not a regular file (a FIFO, a device, a socket, a directory) is [`ReadError::NotRegular`]
    /// and is never opened for reading: its type is checked on an `O_PATH` handle, and only a
    /// regular file is then opened, through that handle (the same inode, whatever happens to the
    /// path meanwhile).
    pub fn read_at_most(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let at = match self.resolve(rel, OFlag::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(ReadError::Io(io(e))),
        };
        let st = nix::sys::stat::fstat(at.as_fd()).map_err(|e| ReadError::Io(io(e)))?;
        let kind = st.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG {
            return Err(ReadError::NotRegular(match kind {
                libc::S_IFIFO => "a FIFO",
                libc::S_IFCHR => "a character device",
                libc::S_IFBLK => "a block device",
                libc::S_IFSOCK => "a socket",
                libc::S_IFDIR => "a directory",
                _ => "not a regular file",
            }));
        }
        let size = st.st_size as u64;
        if size > max {
            return Err(ReadError::TooLarge(size));
        }
        let f = File::open(fd_path(&at)).map_err(ReadError::Io)?;
        let mut bytes = Vec::with_capacity(size as usize);
        // A file that grew since: still no more than `max` + 1 bytes read.
        f.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(ReadError::Io)?;
        if bytes.len() as u64 > max {
            return Err(ReadError::TooLarge(bytes.len() as u64));
        }
        Ok(Some(bytes))
    }

    fn split(rel: &str) -> (&str, &str) {
        rel.rsplit_once('/').unwrap_or((".", rel))
    }

    /// Makes the directory `rel` (and its missing parents). Returns the ones it made, outermost
    /// first.
    pub fn ensure_dir(&self, rel: &str) -> io::Result<Vec<String>> {
        let mut made = Vec::new();
        let mut at = String::new();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            match self.resolve(&at, OFlag::O_PATH | OFlag::O_DIRECTORY) {
                Ok(_) => continue,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(io(e)),
            }
            let (parent, name) = Self::split(&at);
            let dir = self
                .resolve(parent, OFlag::O_PATH | OFlag::O_DIRECTORY)
                .map_err(io)?;
            match nix::sys::stat::mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                Ok(()) => made.push(at.clone()),
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(io(e)),
            }
        }
        Ok(made)
    }

    /// Makes `rel` an empty regular file if nothing is there (its directory must exist).
    /// Returns whether it made it.
    pub fn ensure_file(&self, rel: &str) -> io::Result<bool> {
        let (parent, name) = Self::split(rel);
        let dir = self
            .resolve(parent, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(io)?;
        match nix::fcntl::openat(
            dir.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        ) {
            Ok(_) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(io(e)),
        }
    }

    /// Removes what [`Rootfs::ensure_dir`] / [`Rootfs::ensure_file`] made, if it is still an
    /// empty file or an empty directory; anything else is left alone.
    pub fn remove_if_empty(&self, rel: &str) {
        let (parent, name) = Self::split(rel);
        let Ok(dir) = self.resolve(parent, OFlag::O_PATH | OFlag::O_DIRECTORY) else {
            return;
        };
        let Ok(st) =
            nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        else {
            return;
        };
        let kind = st.st_mode & libc::S_IFMT;
        let flag = if kind == libc::S_IFREG && st.st_size == 0 {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        } else if kind == libc::S_IFDIR {
            // rmdir refuses a directory that is not empty.
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            return;
        };
        let _ = nix::unistd::unlinkat(dir.as_fd(), name, flag);
    }
}

/// Removes, in the rootfs at `rootfs` (a host path), the mount points `created` (outermost
/// first, as [`Rootfs::ensure_dir`] and [`Rootfs::ensure_file`] made them) that are still empty,
/// innermost first: what the state root's removals (`cuslice_state::host::Unmake`) call.
pub fn unmake(rootfs: &Path, created: &[String]) {
    if let Ok(r) = Rootfs::open(rootfs) {
        for rel in created.iter().rev() {
            r.remove_if_empty(rel);
        }
    }
}

/// The path that names an open file descriptor, for mount(2).
pub fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_stay_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        // An absolute symlink to a host path: inside the root it names root/<that path>.
        std::os::unix::fs::symlink(
            outside.path().join("secret"),
            root.path().join("etc/ld.so.preload"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/", root.path().join("run")).unwrap();
        let r = Rootfs::open(root.path()).unwrap();
        assert_eq!(r.read_at_most("etc/ld.so.preload", 100).unwrap(), None);
        // `run -> /` resolves to the root itself, so run/cuslice is made inside it.
        assert_eq!(r.ensure_dir("run/cuslice").unwrap(), vec!["run/cuslice"]);
        assert!(root.path().join("cuslice").is_dir());
        assert!(!outside.path().join("cuslice").exists());
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "host"
        );
    }

    #[test]
    fn reads_are_bounded_and_only_of_regular_files() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        let r = Rootfs::open(root.path()).unwrap();
        let file = root.path().join("etc/f");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(r.read_at_most("etc/f", 10).unwrap().unwrap(), b"0123456789");
        assert!(matches!(
            r.read_at_most("etc/f", 9),
            Err(ReadError::TooLarge(10))
        ));
        // A sparse file of 1 TiB: refused by its size, in no time and no memory.
        std::fs::File::create(root.path().join("etc/huge"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let start = std::time::Instant::now();
        assert!(matches!(
            r.read_at_most("etc/huge", 1 << 16),
            Err(ReadError::TooLarge(n)) if n == 1 << 40
        ));
        assert!(start.elapsed() < std::time::Duration::from_millis(100));
        // A FIFO nobody writes to: refused at once, never opened for reading.
        nix::unistd::mkfifo(
            &root.path().join("etc/fifo"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        assert!(matches!(
            r.read_at_most("etc/fifo", 100),
            Err(ReadError::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            r.read_at_most("etc", 100),
            Err(ReadError::NotRegular("a directory"))
        ));
        // Through a file where a directory should be: nothing there.
        assert_eq!(r.read_at_most("etc/f/x", 100).unwrap(), None);
    }

    #[test]
    fn made_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let r = Rootfs::open(root.path()).unwrap();
        assert_eq!(r.ensure_dir("etc").unwrap(), vec!["etc"]);
        assert!(r.ensure_file("etc/ld.so.preload").unwrap());
        assert!(!r.ensure_file("etc/ld.so.preload").unwrap());
        assert_eq!(
            r.read_at_most("etc/ld.so.preload", 100).unwrap().as_deref(),
            Some(&b""[..])
        );
        std::fs::write(root.path().join("etc/other"), "x").unwrap();
        r.remove_if_empty("etc/ld.so.preload");
        r.remove_if_empty("etc");
        assert!(!root.path().join("etc/ld.so.preload").exists());
        assert!(
            root.path().join("etc/other").exists(),
            "a non-empty directory stays"
        );
    }
}
