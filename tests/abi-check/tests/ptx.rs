//! The workload's PTX kernels (spin and work) are valid PTX: NVIDIA's own assembler (CUDA 13.0's
//! ptxas, the compiler the driver's JIT is built from) takes them for every GPU generation cuslice
//! targets. A real driver JIT-compiles the same text at `cuModuleLoadData`; this catches a kernel
//! the driver would refuse without needing a GPU.

use std::process::Command;

use cuda_workload::kernels::{SPIN_PTX, WORK_PTX};

#[test]
fn the_workload_s_kernels_assemble_for_turing_to_blackwell() {
    let Some(h) = abi_check::ptxas_or_skip("the workload's PTX kernels") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, ptx) in [("cuslice_spin", SPIN_PTX), ("cuslice_work", WORK_PTX)] {
        let src = dir.path().join(format!("{name}.ptx"));
        std::fs::write(&src, ptx.trim_end_matches('\0')).unwrap();
        for arch in [
            "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120",
        ] {
            let cubin = dir.path().join(format!("{name}-{arch}.cubin"));
            let out = Command::new(h.ptxas())
                .arg(format!("-arch={arch}"))
                .arg("--warn-on-spills")
                .arg(&src)
                .arg("-o")
                .arg(&cubin)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name}: ptxas -arch={arch}: {stderr}");
            assert!(
                stderr.trim().is_empty(),
                "{name}: ptxas -arch={arch} warned: {stderr}"
            );
            let elf = std::fs::read(&cubin).unwrap();
            assert!(
                elf.starts_with(b"\x7fELF"),
                "{name} {arch}: ptxas wrote no cubin"
            );
            assert!(
                elf.windows(name.len()).any(|w| w == name.as_bytes()),
                "{name} {arch}: the cubin has no {name} kernel"
            );
        }
    }
}
