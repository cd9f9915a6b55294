//! The CDI spec of a prepared claim, built on the claim spec's shape in `cuslice_cdi` (the same
//! types, hook stages and arguments `cuslice install --engine cdi` and `cuslice-runtime` use):
//! one CDI device, `gpu.cuslice.io/claim=<claim uid>-<device>`. What goes into it (which GPU's
//! nodes and libraries, which settings) is decided here.

use cuslice_cdi::{self as spec, ClaimDevice, Spec};

use crate::claim::{Allotted, ClaimRef, settings};
use crate::discover::{self, Roots};
use crate::resource_slice::Gpu;

/// The spec file of a claim, in the CDI directory.
pub fn file_name(claim: &ClaimRef) -> String {
    spec::claim_spec_file(&claim.uid)
}

/// The fully qualified CDI id the kubelet passes on.
pub fn id(claim: &ClaimRef, a: &Allotted) -> String {
    format!(
        "{}={}",
        spec::CLAIM_KIND,
        spec::claim_device_name(&claim.uid, &a.device)
    )
}

/// The spec: the GPU's device nodes and driver libraries, the slice's settings, the hooks.
pub fn build(
    claim: &ClaimRef,
    a: &Allotted,
    gpu: &Gpu,
    roots: &Roots,
    hook: &str,
    library: &str,
) -> Spec {
    spec::claim_spec(
        &[ClaimDevice {
            name: spec::claim_device_name(&claim.uid, &a.device),
            env: settings(a),
            device_nodes: discover::device_nodes(roots, gpu.description.minor),
            library_mounts: discover::libraries(roots),
        }],
        hook,
        library,
    )
}
