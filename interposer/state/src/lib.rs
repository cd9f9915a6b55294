//! The files a slice's processes share, apart from any FFI: the memory ledger (one per slice:
//! caps, holdings, peaks and refusals per device, the processes that belong to it) and the
//! node's compute board (one place per slice: what it was granted, what it claims and uses on
//! each device). The interposer maps its own slice's on every CUDA process's behalf and reads the
//! other slices' claims; the OCI hook creates a container's ledger and place on the board; the
//! node tools read both. `agent` is the node agent's socket protocol, which tells container
//! processes their host pids, and `init` the hook's word on the container's first process;
//! `seen` is what the agent saw each slice use, which bounds the claims on the board.
//!
//! Around those files: [`paths`] defines once where cuslice's files are (inside a container, on
//! the host, where `cuslice install` puts the interposer); `host` (feature `host`) is the
//! hook's state root, its layout and its per-container records, which the hook writes and the
//! node tools and agent read; [`fsio`] is the one atomic file write, with the durability each
//! caller needs.

pub mod agent;
pub mod board;
pub mod formats;
pub mod fsio;
#[cfg(feature = "host")]
pub mod host;
pub mod init;
pub mod ledger;
pub mod paths;
pub mod release;
pub mod seen;
pub mod snapshot;

/// A device UUID as NVML and `nvidia-smi` print it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
