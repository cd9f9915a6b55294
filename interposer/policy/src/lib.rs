//! cuslice policy that needs no FFI: parsing and formatting of sizes, the interposer's
//! configuration (limits, aliases, precedence), what memory queries report under a cap, which
//! entry of NVML's process list is this process (and, as they arrive, ledgers and token
//! buckets). Everything here is ordinary Rust with ordinary unit tests.

pub mod config;
pub mod duration;
pub mod echo;
pub mod grant;
pub mod managed;
pub mod meminfo;
pub mod overhead;
pub mod priority;
pub mod room;
pub mod share;
pub mod size;
pub mod turn;

pub use config::{Config, ConfigError, Limits, LogLevel};
pub use meminfo::virtual_mem_info;
pub use priority::Priority;
pub use size::{SizeError, format_size, parse_size};
