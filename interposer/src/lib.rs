//! libcuslice_core.so: the interposer between CUDA applications and `libcuda.so.1` /
//! `libnvidia-ml.so.1`. It holds every process of a slice to the slice's memory cap per device,
//! counting every allocation family and the memory no call reveals, and reports the capped
//! figures back to CUDA and NVML readers.
//!
//! Routes in (all reach the same wrappers): the exported symbols (programs linked with -lcuda),
//! the `dlsym` override ([`dlsym`]), and `cuGetProcAddress` v1/_v2 ([`registry`]). The accounting
//! is [`membership`] over the shared ledger (`cuslice-state`); the policy arithmetic and the
//! configuration live in the pure `cuslice-policy` crate. See docs/interposer.md.
//!
//! # Modules, from the bottom up
//!
//! Each uses only modules of the layers below its own (and `log`, anywhere), so the module graph
//! has no cycle; the test `tests::each_module_uses_only_the_layers_below_it` holds the table.
//!
//! 0. Leaves, using nothing else of the crate:
//!    - [`real`]: the real entry points: the table of driver and NVML functions with their C
//!      prototypes, `real::cuXxx()` for each, the lookups by name and address, glibc's `dlsym`.
//!    - `log` (stderr lines, no allocation), [`alloc_table`] (one
//!      shard of the allocation table, pure).
//!    - [`gate`]: the stubs every driver function is handed out behind, which hold the calls of
//!      a frozen process until it is thawed.
//! 1. Over [`real`]: [`nvml_query`] (cuslice's own NVML queries: process and device memory,
//!    whether a pid is listed), [`dlmopen`] (the core of the `dlmopen` override) and [`stream`]
//!    (whether an application's stream is being captured).
//! 2. [`membership`]: whether and which slice this process joined, its devices, the one
//!    reservation step, the process-local tables, the pools' charges; [`turns`] (this process's
//!    part in its slice's exclusive turns on a device: the gate's slow path, taking, leading,
//!    draining and settling a turn); [`wants`] (memory the slice waits for on a full device, and
//!    what other slices wait for, on the node's board).
//! 3. Over [`membership`], never each other, the registry or start-up: the API areas, each with
//!    its wrappers ([`memory`], [`array`](mod@array), [`vmm`], [`pool`], [`context`], [`info`],
//!    [`compute`]), and [`agent`] (asks the node agent for this process's host pid).
//!    [`freeze`] (freezes an idle process's device memory to the host and thaws it at its
//!    next call, through `gate`).
//! 4. [`startup`] (uses `membership`, `agent`, `compute`, `freeze`): joining the slice at cuInit (the
//!    `cuInit` wrapper) and the fork handlers.
//! 5. [`nvml`]: the NVML wrappers; an NVML-only process (nvidia-smi) joins its slice at its first
//!    call through `startup`.
//! 6. [`registry`]: names every wrapper (src/wrapped.txt, which the loader's exports are made
//!    from too) and hands them out by name and by real address, with `cuGetProcAddress`.
//! 7. [`dlsym`] (uses `registry`): the core's half of the `dlsym` override and the loader/core
//!    handshake.
//!
//! Every export returns an error code rather than panicking: the FFI layer uses no
//! `unwrap`/`expect`/`panic!` (denied below), and the release profile aborts rather than
//! unwinding into C should anything panic all the same.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod log;

cuslice_state::release_mark!();

pub mod agent;
pub mod alloc_table;
pub mod array;
pub mod compute;
pub mod context;
pub mod dlmopen;
pub mod dlsym;
pub mod freeze;
pub mod gate;
pub mod info;
pub mod membership;
pub mod memory;
pub mod nvml;
pub mod nvml_query;
pub mod pool;
pub mod real;
pub mod registry;
pub mod startup;
pub mod stream;
pub mod turns;
pub mod vmm;
pub mod wants;

/// Runs when the process exits (and if the library were ever unloaded): what a slice's last
/// process leaves behind on the node goes with it. Nothing here may unwind into the C runtime.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(compute::at_exit);
}

#[used]
#[cfg_attr(not(test), unsafe(link_section = ".fini_array"))]
static AT_EXIT: extern "C" fn() = at_exit;

#[cfg(test)]
mod tests {
    /// Each module of src/ and its layer (see the crate's doc): a module may use only modules of
    /// lower layers, and `log`.
    const LAYERS: &[(&str, u32)] = &[
        ("real", 0),
        ("log", 0),
        ("alloc_table", 0),
        ("gate", 0),
        ("nvml_query", 1),
        ("stream", 1),
        ("turns", 2),
        ("wants", 2),
        ("dlmopen", 1),
        ("membership", 2),
        ("agent", 3),
        ("memory", 3),
        ("array", 3),
        ("vmm", 3),
        ("pool", 3),
        ("context", 3),
        ("info", 3),
        ("compute", 3),
        ("freeze", 3),
        ("startup", 4),
        ("nvml", 5),
        ("registry", 6),
        ("dlsym", 7),
    ];

    /// The modules of the crate that `code` names (`crate::NAME`, `use crate::{NAME, ...}`).
    fn uses(code: &str) -> Vec<String> {
        let code: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut found = Vec::new();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or(""),
                None => rest,
            };
            for name in names.split(',') {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                found.push(name);
                if !rest.starts_with('{') {
                    break;
                }
            }
        }
        found
    }

    #[test]
    fn uses_finds_paths_and_groups_outside_comments() {
        let code = "use crate::{a, b::c};\nfn f() { crate::d::e(); } // crate::f\n";
        assert_eq!(uses(code), ["a", "b", "d"]);
    }

    #[test]
    fn each_module_uses_only_the_layers_below_it() {
        let layer = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let Some(module) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.extension().is_none_or(|e| e != "rs") || module == "lib" {
                continue;
            }
            let own = layer(module)
                .unwrap_or_else(|| panic!("src/{module}.rs: give it a layer in LAYERS"));
            seen += 1;
            for used in uses(&std::fs::read_to_string(&path).unwrap()) {
                let Some(l) = layer(&used) else {
                    continue;
                };
                assert!(
                    used == module || used == "log" || l < own,
                    "src/{module}.rs (layer {own}) uses {used} (layer {l})"
                );
            }
        }
        assert_eq!(seen, LAYERS.len());
        // The registry names the modules of src/wrapped.txt through a generated list.
        for line in include_str!("wrapped.txt").lines() {
            let line = line.trim();
            if let Some(module) = line.split_whitespace().nth(1)
                && !line.starts_with('#')
            {
                assert!(
                    module == "registry" || layer(module) < layer("registry"),
                    "{line}"
                );
            }
        }
    }
}
