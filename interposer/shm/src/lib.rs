//! State shared between processes through a mapped file must survive any of them being killed at
//! any instruction. Two building blocks make that possible, used by cuslice's ledger and by the
//! simulated GPU alike:
//!
//! - [`RobustMutex`]: a process-shared pthread mutex that the next locker gets back, flagged, when
//!   its owner dies while holding it (the caller then repairs what the owner may have half-written).
//! - [`liveness`]: a byte-range OFD lock per process slot, which the kernel drops when the process
//!   dies however it dies; "is the lock still held?" is "is the process alive?".

pub mod file;
pub mod liveness;
pub mod lock;
pub mod robust;

pub use lock::{Locked, OwnerLock, OwnerTokens};
pub use robust::RobustMutex;
