//! `cuda-workload`: obtains the driver's entry points at run time (dlsym, cuGetProcAddress, or a
//! replay of libcudart's requests); it has no DT_NEEDED on libcuda.

use std::process::ExitCode;

use cuda_workload::cli::{Binary, RouteArg, main_with};

fn main() -> ExitCode {
    main_with(Binary {
        name: "cuda-workload",
        default_route: RouteArg::Dlsym,
        direct: None,
    })
}
