//! CDI (Container Device Interface) specs as cuslice writes and reads them, for the hook side
//! (cuslice-runtime applies the devices a container asks for; `cuslice install --engine cdi`
//! writes the hook's spec) and the DRA side (cuslice-dra writes each prepared claim's spec and
//! its container index entries). One concern per module:
//!
//! - [`spec`]: the spec file's schema ([`Spec`] and its parts), its validation, reading a file.
//! - [`id`]: fully-qualified device ids `VENDOR/CLASS=NAME` and the `cdi.k8s.io/*` annotations.
//! - [`file`](mod@file): [`write_spec`] and [`remove_spec`], atomic and durable (`cuslice_state::fsio`).
//! - [`registry`]: [`Registry`], the specs of a list of directories (`/etc/cdi`, `/var/run/cdi`
//!   by default), resolving ids to container edits.
//! - [`edits`]: [`apply_edits`], a resolved device's container edits applied to a config.json.
//! - [`hooks`]: the one definition of how cuslice-hook is named in hooks (stages and argv).
//! - [`claim`]: the CDI shape of a prepared DRA claim's spec ([`claim_spec`], kind
//!   [`CLAIM_KIND`]).
//! - [`index`]: the format of the DRA plugin's container index ([`IndexEntry`]) and its readers,
//!   which tell cuslice-runtime a Kubernetes container's CDI devices where the runtime
//!   (containerd 1.6) is not told them.
//!
//! Who owns what between the two sides: the formats both read or write (the spec schema, the
//! claim spec's shape, the index entry and file names, the index's default directory) are here,
//! so that the hook needs no DRA code; the DRA plugin's own constants and builders (its driver
//! name, what goes into a claim's devices, when entries are written and removed) are in
//! cuslice-dra.
//!
//! Ref: the CDI specification (cncf-tags/container-device-interface SPEC.md) and its Go
//! implementation (pkg/cdi/container-edits.go, pkg/parser/parser.go), whose behaviour the
//! resolution and the edits follow: spec-level edits once per spec, then each device's; an
//! environment variable replaces an earlier one of the same name; a device node or mount
//! replaces one at the same container path; device nodes get an allow rule in the device cgroup.

pub mod claim;
pub mod edits;
pub mod file;
pub mod hooks;
pub mod id;
pub mod index;
pub mod registry;
pub mod spec;

pub use claim::{
    CLAIM_KIND, CLAIM_VENDOR, ClaimDevice, claim_device_name, claim_spec, claim_spec_file,
};
pub use edits::{HostNode, apply_edits, host_node};
pub use file::{remove_spec, write_spec};
pub use hooks::{HOOK_BIN, HOOK_NAMES, HOOK_STAGES, hook_args, is_cuslice_hook, stage_hooks};
pub use id::{
    ANNOTATION_PREFIX, annotated_devices, check_device_name, check_kind, parse_qualified,
};
pub use index::{
    CRI_CONTAINER, CRI_CONTAINER_TYPE, CRI_NAMESPACE, CRI_POD, CRI_POD_UID,
    DEFAULT_CONTAINER_INDEX, DEFAULT_PLUGIN_DIR, IndexEntry, index_file, indexed_claims,
    indexed_devices,
};
pub use registry::{DEFAULT_SPEC_DIRS, Registry, Unresolved};
pub use spec::{CDI_VERSION, ContainerEdits, Device, DeviceNode, Hook, Mount, Spec, parse_spec};
