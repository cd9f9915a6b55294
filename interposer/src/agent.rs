//! This process's host pid: NVML names processes by host pid, which a process in a container's
//! pid namespace cannot learn; measuring the slice's first context by its own entry in NVML's
//! process list needs it, and the agent's checks of the slice against the driver's count name
//! it. In a container (the slice config came from the hook) the process looks for itself in the
//! hook's `init` file (the container's first process finds its host pid there, with or without
//! the agent) and asks the node agent once when it joins the slice (docs/agent.md); a forked
//! child asks again when it joins (it has a pid of its own). A standalone process never asks:
//! its pid is the host's.
//!
//! The agent may not be running: then one warning (the agent, once it runs, tells the process its
//! host pid through the ledger anyway), and caps and shares hold as they do with it. Asking never
//! takes more than `TIMEOUT`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuslice_state::agent::{self, CONTAINER_SOCKET};
use cuslice_state::init;

use crate::log::{debug, warning};
use crate::membership::Slice;

/// The most one question may take, connect and answer together.
const TIMEOUT: Duration = Duration::from_millis(100);

/// Said once per program (a forked child inherits it: a shell's children do not repeat it).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Records this process's host pid in its slot: the hook's word where this is the container's
/// first process, and the agent's.
pub fn tell_slot(s: &Slice) {
    if let Some(pid) = std::fs::read_to_string(init::CONTAINER_FILE)
        .ok()
        .as_deref()
        .and_then(init::own_host_pid)
    {
        s.ledger.set_host_pid(s.slot, pid);
        debug!("the hook says this process is host pid {pid}");
    }
    match agent::ask(Path::new(CONTAINER_SOCKET), TIMEOUT) {
        Ok(pid) => {
            s.ledger.set_host_pid(s.slot, pid);
            debug!("the node agent says this process is host pid {pid}");
        }
        Err(e) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                warning!(
                    "{e}: nothing checks this container's slice against the driver's count until \
                     the agent runs (caps and core limits hold); start it on the host with \
                     `cuslice agent` or `systemctl start cuslice-agent.service`"
                );
            }
        }
    }
}
