//! The workload's PTX spin kernel is valid PTX: NVIDIA's own assembler (CUDA 13.0's ptxas, the
//! compiler the driver's JIT is built from) takes it for every GPU generation cuslice targets.
//! A real driver JIT-compiles the same text at `cuModuleLoadData`; this catches a kernel the
//! driver would refuse without needing a GPU.

use std::process::Command;

#[test]
fn the_spin_kernel_assembles_for_turing_to_blackwell() {
    let Some(h) = abi_check::ptxas_or_skip("the spin kernel's PTX") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("spin.ptx");
    let text = cuda_workload::kernels::SPIN_PTX.trim_end_matches('\0');
    std::fs::write(&src, text).unwrap();
    for arch in [
        "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120",
    ] {
        let cubin = dir.path().join(format!("spin-{arch}.cubin"));
        let out = Command::new(h.ptxas())
            .arg(format!("-arch={arch}"))
            .arg("--warn-on-spills")
            .arg(&src)
            .arg("-o")
            .arg(&cubin)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas -arch={arch}: {stderr}");
        assert!(
            stderr.trim().is_empty(),
            "ptxas -arch={arch} warned: {stderr}"
        );
        let elf = std::fs::read(&cubin).unwrap();
        assert!(elf.starts_with(b"\x7fELF"), "{arch}: ptxas wrote no cubin");
        assert!(
            elf.windows(b"cuslice_spin".len())
                .any(|w| w == b"cuslice_spin"),
            "{arch}: the cubin has no cuslice_spin kernel"
        );
    }
}
