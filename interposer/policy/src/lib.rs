//! cuslice policy that needs no FFI: parsing and formatting of sizes (and, as they arrive, limits,
//! ledgers and token buckets). Everything here is ordinary Rust with ordinary unit tests.

pub mod size;

pub use size::{SizeError, format_size, parse_size};
