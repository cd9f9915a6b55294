//! The hook with containerd, through `ctr`. ctr does not read the CRI plugin's runtime entries,
//! so each container names the wrapper runtime itself: `ctr run --runc-binary
//! target/release/cuslice-runtime` (cuslice-hook and libcuslice.so lie beside it, where the
//! wrapper and the hook look first). The containers' root filesystems are directories
//! (`ctr run --rootfs`), one fresh per container; `ctr run --read-only` makes one read-only. One containerd serves every test of this
//! binary, with its own root, state, socket and runc root under a temporary directory; it is
//! stopped and the directory removed when the test process exits.
//!
//! CDI (`cdi_*` tests): containerd 1.6 has no CDI, so containers carry the kubelet's
//! annotations (`ctr run --annotation cdi.k8s.io/gpu.cuslice.io_<claim uid>=<device id>`) and
//! cuslice-runtime applies the devices: it runs as the runc binary through a two-line script
//! that adds `--cuslice-cdi-spec-dir=DIR`, the test's spec directory.

use cuslice_test_engines as engines;
use cuslice_test_engines::containerd::engine;
use cuslice_test_engines::*;

engine_scenarios!(engine());

/// Two claims' CDI devices on one simulated device, applied by cuslice-runtime from the
/// containers' annotations; each container held to its claim's cap.
#[test]
fn cdi_two_claims_on_one_device() {
    root_required();
    engines::cdi::two_claims(engine());
}

/// An annotation naming a device no spec defines: cuslice-runtime's one line (the annotation,
/// the id, the directory searched) reaches ctr through the shim; no task, no container.
#[test]
fn cdi_unknown_device_is_refused() {
    root_required();
    let e = engine();
    let key = "cdi.k8s.io/gpu.cuslice.io_nope";
    let line = engines::cdi::unknown_device(e, key);
    let dir = engines::cdi::CdiEngine::spec_dir(e);
    assert!(
        line.contains(&format!("annotation {key}: CDI device gpu.cuslice.io/claim=nope-gpu-0 is not defined in any spec under {}", dir.display())),
        "{line}"
    );
}

/// NVIDIA's container toolkit in CDI mode (a spec shaped like `nvidia-ctk cdi generate`'s),
/// its device named in a `cdi.k8s.io/*` annotation for cuslice-runtime to apply (containerd 1.6
/// has no CDI of its own): capped where the container asks, untouched where not.
#[test]
fn cdi_nvidia_toolkit_spec_with_cuslice() {
    root_required();
    engines::nvidia::toolkit_spec_with_cuslice(engine());
}
