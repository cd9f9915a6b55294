//! `cuda-workload-linked`: the same workload, linked with `-lcuda` like a program built with
//! `nvcc ... -lcuda` against the toolkit's `lib64/stubs/libcuda.so`. Its only route is `direct`:
//! the entry points are the addresses of the versioned symbols it is linked against, resolved by
//! the dynamic loader from whatever `libcuda.so.1` it finds (LD_LIBRARY_PATH) at start-up.

use std::ffi::{c_char, c_void};
use std::process::ExitCode;

use cuda_abi::*;
use cuda_workload::cli::{Binary, RouteArg, main_with};
use cuda_workload::driver::Driver;

macro_rules! linked {
    ($( { $name:ident, $base:literal, $since:literal, [$($ptds:literal),*], ($($arg:ident : $t:ty),* $(,)?) } )*) => {
        #[link(name = "cuda")]
        #[allow(non_snake_case)]
        unsafe extern "C" {
            $( fn $name($($arg: $t),*) -> CUresult; )*
        }

        /// The linked symbols as a `Driver`.
        fn linked_driver() -> Driver {
            Driver { $( $name: Some($name), )* }
        }
    };
}

cuda_workload::cuda_functions!(linked);

fn main() -> ExitCode {
    main_with(Binary {
        name: "cuda-workload-linked",
        default_route: RouteArg::Direct,
        direct: Some(linked_driver),
    })
}
