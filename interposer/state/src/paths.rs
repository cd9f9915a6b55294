//! Where cuslice's files are, defined once: inside a slice's container (what the hook mounts and
//! the interposer reads), on the host (the state root, the node's compute board) and where
//! `cuslice install` puts the interposer. The host state root and the container's directory are
//! both `/run/cuslice`; they are different directories (the first is laid out in `host`).

/// The defining literals, for `concat!`: a path below is built from these, never spelled again.
macro_rules! container_dir {
    () => {
        "/run/cuslice"
    };
}
macro_rules! library_file {
    () => {
        "libcuslice.so"
    };
}
macro_rules! core_file {
    () => {
        "libcuslice_core.so"
    };
}
macro_rules! prefix {
    () => {
        "/usr/local"
    };
}
macro_rules! library_dir {
    () => {
        "lib/cuslice"
    };
}

// ---- file names ---------------------------------------------------------------------------

/// The interposer's loader, the library every process in a slice's container preloads.
pub const LIBRARY_FILE: &str = library_file!();
/// The interposer's core, which the loader opens from its own directory when a process first
/// reaches CUDA: it must sit beside the loader, on the host and in the container.
pub const CORE_FILE: &str = core_file!();
/// The dynamic loader's preload list, in `/etc`.
pub const PRELOAD_FILE: &str = "ld.so.preload";

// ---- inside the container -----------------------------------------------------------------

/// The directory the hook mounts (read-only) in every slice's container.
pub const CONTAINER_DIR: &str = container_dir!();
/// The slice's own directory: its limits and its ledger.
pub const CONTAINER_SLICE_DIR: &str = concat!(container_dir!(), "/slice");
/// The slice's limits, which the hook writes (`CUSLICE_*=VALUE` lines).
pub const CONTAINER_CONFIG: &str = concat!(container_dir!(), "/slice/config");
/// The container's first process as the hook saw it from the host (`init`).
pub const CONTAINER_INIT: &str = concat!(container_dir!(), "/slice/init");
/// The slice's memory ledger, the one file under [`CONTAINER_DIR`] its processes write.
pub const CONTAINER_LEDGER: &str = concat!(container_dir!(), "/slice/ledger");
/// The node's compute board.
pub const CONTAINER_NODE_DIR: &str = concat!(container_dir!(), "/node");
/// The node agent's directory and its socket.
pub const CONTAINER_AGENT_DIR: &str = concat!(container_dir!(), "/agent");
pub const CONTAINER_AGENT_SOCKET: &str = concat!(container_dir!(), "/agent/agent.sock");
/// The interposer's directory, and its loader and core in it.
pub const CONTAINER_LIB_DIR: &str = concat!(container_dir!(), "/lib");
pub const CONTAINER_LIBRARY: &str = concat!(container_dir!(), "/lib/", library_file!());
pub const CONTAINER_CORE: &str = concat!(container_dir!(), "/lib/", core_file!());
/// The preload list the hook mounts over the image's (the interposer first, then the image's
/// own entries).
pub const CONTAINER_PRELOAD: &str = "/etc/ld.so.preload";

/// A container path relative to the container's root, as the hook resolves it in the rootfs:
/// `/run/cuslice/node` -> `run/cuslice/node`.
pub const fn in_rootfs(container_path: &str) -> &str {
    match container_path.as_bytes().split_first() {
        // SAFETY: `rest` is a valid UTF-8 string less its first byte, an ASCII '/': still valid
        // UTF-8, starting on a character boundary.
        Some((b'/', rest)) => unsafe { std::str::from_utf8_unchecked(rest) },
        _ => container_path,
    }
}

// ---- on the host --------------------------------------------------------------------------

/// The hook's state root (`--state-root`), laid out in `host` (feature `host`).
pub const DEFAULT_STATE_ROOT: &str = "/run/cuslice";
/// The node's compute board (`--node-dir`): see [`crate::board`].
pub const DEFAULT_NODE_DIR: &str = crate::board::DEFAULT_DIR;

// ---- where `cuslice install` puts the interposer ------------------------------------------

/// The default install prefix.
pub const DEFAULT_PREFIX: &str = prefix!();
/// The interposer's directory under a prefix: `PREFIX/lib/cuslice`.
pub const LIBRARY_DIR: &str = library_dir!();
/// The loader where `cuslice install` puts it under the default prefix.
pub const INSTALLED_LIBRARY: &str = concat!(prefix!(), "/", library_dir!(), "/", library_file!());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_built_from_one_definition() {
        assert_eq!(CONTAINER_LIBRARY, "/run/cuslice/lib/libcuslice.so");
        assert_eq!(CONTAINER_CORE, "/run/cuslice/lib/libcuslice_core.so");
        assert_eq!(
            CONTAINER_AGENT_SOCKET,
            format!("{CONTAINER_AGENT_DIR}/{}", crate::agent::SOCKET_NAME)
        );
        assert_eq!(CONTAINER_PRELOAD, format!("/etc/{PRELOAD_FILE}"));
        assert_eq!(INSTALLED_LIBRARY, "/usr/local/lib/cuslice/libcuslice.so");
        assert_eq!(in_rootfs(CONTAINER_NODE_DIR), "run/cuslice/node");
    }
}
