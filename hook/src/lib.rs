//! cuslice's OCI hook (`cuslice-hook`) and wrapper runtime (`cuslice-runtime`).
//!
//! [`settings`] reads and validates what a container asks for (pure); [`state`] keeps each
//! container's slice on the host under `/run/cuslice`; [`rootfs`] resolves paths inside the
//! container's root filesystem safely; [`inject`] mounts the slice, the interposer and
//! `/etc/ld.so.preload` into the container; [`hook`] runs the stages; [`wrapper`] is the runtime
//! that adds the hook for engines without hook configuration, and applies the CDI devices a
//! container's annotations name; [`cdi`] reads, writes and applies CDI specs. See docs/hook.md.

pub mod cdi;
pub mod hook;
pub mod inject;
pub mod rootfs;
pub mod settings;
pub mod state;
pub mod wrapper;
