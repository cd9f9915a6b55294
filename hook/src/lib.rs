//! cuslice's OCI hook (`cuslice-hook`) and wrapper runtime (`cuslice-runtime`): what the two
//! binaries do, and nothing other crates use (they are leaves; no crate depends on this one).
//!
//! [`settings`] reads and validates what a container asks for (pure); [`rootfs`] resolves paths
//! inside the container's root filesystem safely; [`inject`] mounts the slice, the interposer and
//! `/etc/ld.so.preload` into the container; [`names`] finds the name Docker or Podman gave the
//! container, which they keep beside the bundle; [`hook`] runs the stages; [`wrapper`] is the runtime
//! that adds the hook for engines without hook configuration, and applies the CDI devices a
//! container's annotations name. What the hook shares with other programs lives in their
//! crates: the host state root it writes (`cuslice_state::host`, read by the node tools and the
//! agent), the paths inside the container (`cuslice_state::paths`), and CDI specs and the DRA
//! plugin's container index (`cuslice_cdi`). See docs/hook.md.

pub mod hook;
pub mod inject;
pub mod names;
pub mod rootfs;
pub mod settings;
pub mod slurm;
pub mod wrapper;
