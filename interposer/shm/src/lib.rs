//! State shared between processes through a mapped file must survive any of them being killed at
//! any instruction, and must hold between processes of different pid namespaces (containers that
//! share a file: their thread and process ids collide). The building blocks, used by cuslice's
//! ledger and by the simulated GPU alike:
//!
//! - [`liveness`]: a byte-range OFD lock per process slot, which the kernel drops when the process
//!   dies however it dies, whatever its pid namespace; "is the lock still held?" is "is the
//!   process alive?".
//! - [`OwnerLock`]: a lock word naming its holder by a token (slot and generation) that means the
//!   same in every process; a waiter that finds the holder dead (through its liveness lock) takes
//!   the lock over, flagged, and repairs what the holder may have half-written. One
//!   compare-and-swap to take, a plain store to give back.
//! - [`ByteLock`]: an OFD lock on a byte of the file plus a mutex of the process, for what is
//!   taken before a process has a token.
//! - [`futex`]: sleeping on a word of a shared mapping until another process changes it.
//!
//! No glibc robust mutex: its owner is a thread id as the owner's pid namespace numbers it, the
//! kernel compares it with the dying thread's own id, and each thread's robust list points into
//! its own address space; between pid namespaces a killed waiter marks a live holder's lock dead,
//! two processes hold it, and one follows the other's pointers.

pub mod file;
pub mod futex;
pub mod liveness;
pub mod lock;

pub use lock::{ByteLock, Locked, OwnerLock, OwnerTokens};
