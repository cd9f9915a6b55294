//! The shared helpers live in the `cuslice-test-harness` crate (tests/harness).
#![allow(unused_imports)]
pub use cuslice_test_harness::*;
