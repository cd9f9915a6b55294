//! The CDI spec of a prepared claim, built on the claim spec's shape in `cuslice_cdi` (the same
//! types, hook stages and arguments `cuslice install --engine cdi` and `cuslice-runtime` use):
//! one CDI device per device of the claim, `gpu.cuslice.io/claim=<claim uid>-<device>`. What goes into it (which GPU's
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

/// The spec: one CDI device per device of the claim (`allotted`, each with its GPU, in the
/// order `claim::allotments` gives), each with its GPU's device nodes, the driver's libraries
/// and its settings; the hooks once.
pub fn build(
    claim: &ClaimRef,
    allotted: &[(Allotted, &Gpu)],
    roots: &Roots,
    hook: &str,
    library: &str,
) -> Spec {
    let all: Vec<Allotted> = allotted.iter().map(|(a, _)| a.clone()).collect();
    let devices: Vec<ClaimDevice> = allotted
        .iter()
        .enumerate()
        .map(|(i, (a, gpu))| ClaimDevice {
            name: spec::claim_device_name(&claim.uid, &a.device),
            env: settings(&all, i),
            device_nodes: discover::device_nodes(roots, gpu.description.minor),
            library_mounts: discover::libraries(roots),
        })
        .collect();
    spec::claim_spec(&devices, hook, library)
}
