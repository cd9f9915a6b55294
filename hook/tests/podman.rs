//! The hook with Podman: `cuslice install --engine podman --prefix TMP/prefix --config TMP/hooks.d`
//! writes two OCI hook descriptors (createRuntime and poststop), given with `podman --hooks-dir
//! TMP/hooks.d`. Podman runs createRuntime through runc, and poststop itself after it deleted the
//! container. Each container's root filesystem is a fresh `make_rootfs` directory (`podman run
//! --rootfs`), so no image is stored; the storage driver is vfs, which mounts nothing. Podman
//! has no daemon: its root, runroot, tmpdir and network configuration live under one temporary
//! directory per test binary, removed (after every container left in it) when the test process
//! exits.
//!
//! CDI (`cdi_*` tests): claim specs as the DRA plugin writes them, given with `podman run
//! --device gpu.cuslice.io/claim=NAME`; these containers get no hooks.d descriptors (an empty
//! `--hooks-dir`), so cuslice-hook comes from the spec alone. Podman 4.3 has no
//! `--cdi-spec-dir` and no `cdi_spec_dirs` setting: it reads /etc/cdi and /var/run/cdi, so the
//! specs go to /var/run/cdi under unique names and are removed after each test.

use cuslice_test_engines as engines;
use cuslice_test_engines::podman::engine;
use cuslice_test_engines::*;

engine_scenarios!(engine());
hostile_scenarios!(engine());

/// Long kernels queued by a bypass are held by the driver's count (the agent's own tests run
/// it with runc).
#[test]
fn hostile_queued_kernels_are_held_by_the_drivers_count() {
    root_required();
    engines::hostile::queued_kernels_are_held_by_the_drivers_count(engine());
}

/// A grace bounds the total time over the cap, not each episode (the agent's own tests run it
/// with runc).
#[test]
fn hostile_a_grace_bounds_the_total_time_over_the_cap() {
    root_required();
    engines::hostile::a_grace_bounds_the_total_time_over(engine());
}

/// A tenant filling every file it can write fills only its own space (runc's own tests run it
/// with the state root on a small tmpfs).
#[test]
fn hostile_a_tenant_filling_its_state_fills_only_its_own() {
    root_required();
    engines::hostile::a_tenant_filling_its_state_fills_only_its_own(engine());
}

/// Two claims' CDI devices on one simulated device, each container held to its claim's cap.
#[test]
fn cdi_two_claims_on_one_device() {
    root_required();
    engines::cdi::two_claims(engine());
}

/// `--device` naming a claim no spec defines: Podman's one line, no container.
#[test]
fn cdi_unknown_device_is_refused() {
    root_required();
    let line = engines::cdi::unknown_device(engine(), "unused");
    assert!(line.contains("unresolvable CDI devices"), "{line}");
}

/// The demo's three containers, with the node agent: shares hold (checked against the simulator).
#[test]
fn demo_shares_hold_with_the_agent() {
    root_required();
    engines::shares::shares_hold(engine());
}

/// An image whose /etc/ld.so.preload is one NUL byte still gets the interposer loaded.
#[test]
fn a_nul_byte_in_the_image_preload_does_not_drop_the_library() {
    root_required();
    engines::preload::nul_byte(engine());
}

/// An image's 4 GiB (sparse) /etc/ld.so.preload: refused at once in one line, no copy left.
#[test]
fn a_huge_image_preload_is_refused_at_once() {
    root_required();
    engines::preload::huge(engine(), 4 << 30);
}

/// A cap of 2^64-1 bytes and a 100 kB value: refused in one short line.
#[test]
fn a_cap_no_device_holds_and_a_long_value_are_refused_in_one_short_line() {
    root_required();
    engines::too_large_or_too_long(engine());
}

/// NVIDIA's container toolkit in CDI mode (a spec shaped like `nvidia-ctk cdi generate`'s) with
/// cuslice's hooks.d registration: capped where the container asks, untouched where not.
#[test]
fn cdi_nvidia_toolkit_spec_with_cuslice() {
    root_required();
    engines::nvidia::toolkit_spec_with_cuslice(engine());
}
