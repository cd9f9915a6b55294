//! Processes: registration, liveness, sweeping the slots of dead ones, and the PIDs NVML
//! reports for them.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;

use super::{State, StateError};
use crate::clock;
use crate::layout::*;
use cuslice_shm::liveness;

/// Inode number of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel).
const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;

impl State {
    pub fn my_slot(&self) -> Option<u32> {
        let s = self.my_slot.load(Ordering::Relaxed);
        (s != NONE).then_some(s)
    }

    /// Whether the process in slot `s` is alive: its liveness lock is held (the kernel drops it
    /// when the process dies, however it dies).
    pub fn slot_alive(&self, s: u32) -> bool {
        let slot = &self.header().procs[s as usize];
        if slot.state.load(Ordering::Acquire) != SLOT_LIVE {
            return false;
        }
        if self.my_slot() == Some(s) {
            return true; // our own lock does not conflict with our own query
        }
        liveness::held_by_other(self.file.as_raw_fd(), LIVENESS_LOCK_BASE + s as i64)
    }

    /// Registers this process (once); returns its slot.
    pub fn register(&self) -> Result<u32, StateError> {
        if let Some(s) = self.my_slot() {
            return Ok(s);
        }
        let _g = self.lock_procs();
        self.sweep_locked();
        let (pidns, ns_pid) = (own_pidns(), std::process::id() as i32);
        for s in 0..MAX_PROCS as u32 {
            let slot = &self.header().procs[s as usize];
            if slot.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            if liveness::hold(self.file.as_raw_fd(), LIVENESS_LOCK_BASE + s as i64).is_err() {
                continue;
            }
            slot.generation.fetch_add(1, Ordering::Relaxed);
            slot.ns_pid.store(ns_pid, Ordering::Relaxed);
            slot.host_pid.store(
                if pidns == INIT_PIDNS_INO { ns_pid } else { 0 },
                Ordering::Relaxed,
            );
            slot.pidns.store(pidns, Ordering::Relaxed);
            slot.started_ns.store(clock::now_ns(), Ordering::Relaxed);
            slot.ckpt_state.store(CKPT_RUNNING, Ordering::Relaxed);
            slot.ckpt_req.store(0, Ordering::Relaxed);
            slot.ckpt_tid.store(0, Ordering::Relaxed);
            slot.ckpt_stuck.store(0, Ordering::Relaxed);
            slot.ckpt_host_bytes.store(0, Ordering::Relaxed);
            // SAFETY: `comm` is written only under the process-table lock, which we hold.
            unsafe { *slot.comm.get() = cstr_field(&own_comm()) };
            slot.state.store(SLOT_LIVE, Ordering::Release);
            self.my_slot.store(s, Ordering::Relaxed);
            return Ok(s);
        }
        Err(StateError::TooManyProcesses {
            path: self.path.clone(),
        })
    }

    /// In a forked child: the slot and its liveness lock belong to the parent.
    pub fn forget_registration(&self) {
        self.my_slot.store(NONE, Ordering::Relaxed);
    }

    pub(super) fn exited_record(&self, s: u32) -> ExitedProc {
        let slot = &self.header().procs[s as usize];
        ExitedProc {
            ns_pid: slot.ns_pid.load(Ordering::Relaxed),
            host_pid: slot.host_pid.load(Ordering::Relaxed),
            peak: 0,
            device_time_ns: 0,
            exited_ns: clock::now_ns(),
            // SAFETY: comm changes only at registration, under the process-table lock; a racing
            // read yields at worst a mixed name, never invalid memory.
            comm: unsafe { *slot.comm.get() },
        }
    }

    /// Reclaims everything dead processes held, on every device, and frees their slots.
    pub fn sweep(&self) {
        let _g = self.lock_procs();
        self.sweep_locked();
    }

    fn sweep_locked(&self) {
        for s in 0..MAX_PROCS as u32 {
            let slot = &self.header().procs[s as usize];
            if slot.state.load(Ordering::Acquire) == SLOT_LIVE && !self.slot_alive(s) {
                let who = self.exited_record(s);
                for d in 0..self.ndev() {
                    self.lock_device(d).dev().reclaim_owner(s, &who);
                }
                slot.state.store(SLOT_FREE, Ordering::Release);
            }
        }
    }

    /// Fills in host PIDs of processes in other PID namespaces (containers) by looking them up in
    /// /proc; only meaningful when this process sees the initial PID namespace.
    pub fn resolve_host_pids(&self) {
        if own_pidns() != INIT_PIDNS_INO {
            return;
        }
        let wanted: Vec<u32> = (0..MAX_PROCS as u32)
            .filter(|&s| {
                let slot = &self.header().procs[s as usize];
                slot.state.load(Ordering::Acquire) == SLOT_LIVE
                    && slot.host_pid.load(Ordering::Relaxed) == 0
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino()) else {
                continue;
            };
            for &s in &wanted {
                let slot = &self.header().procs[s as usize];
                if slot.pidns.load(Ordering::Relaxed) == ns
                    && innermost_pid(pid) == Some(slot.ns_pid.load(Ordering::Relaxed))
                {
                    slot.host_pid.store(pid, Ordering::Relaxed);
                }
            }
        }
    }

    /// The PID NVML reports for slot `s`: the host PID when known, else the process's own.
    pub fn reported_pid(&self, s: u32) -> i32 {
        let slot = &self.header().procs[s as usize];
        match slot.host_pid.load(Ordering::Relaxed) {
            0 => slot.ns_pid.load(Ordering::Relaxed),
            p => p,
        }
    }

    /// The live process that `pid` names as this process sees pids (its own PID namespace;
    /// from the initial namespace, host pids name processes in containers too).
    pub fn slot_of_pid(&self, pid: i32) -> Option<u32> {
        if pid <= 0 {
            return None;
        }
        let own = own_pidns();
        let find = || {
            (0..MAX_PROCS as u32).find(|&s| {
                let slot = &self.header().procs[s as usize];
                slot.state.load(Ordering::Acquire) == SLOT_LIVE
                    && ((slot.pidns.load(Ordering::Relaxed) == own
                        && slot.ns_pid.load(Ordering::Relaxed) == pid)
                        || (own == INIT_PIDNS_INO && slot.host_pid.load(Ordering::Relaxed) == pid))
                    && self.slot_alive(s)
            })
        };
        find().or_else(|| {
            self.resolve_host_pids();
            find()
        })
    }

    /// Takes the turn of a caller of the checkpoint API on slot `s` (waiting for one under
    /// way); the turn ends when the guard is dropped, or when its holder dies.
    pub fn checkpoint_turn(&self, s: u32) -> std::io::Result<CheckpointTurn<'_>> {
        let byte = CKPT_LOCK_BASE + s as i64;
        liveness::wait_hold(self.file.as_raw_fd(), byte)?;
        Ok(CheckpointTurn { state: self, byte })
    }

    pub fn slot_comm(&self, s: u32) -> String {
        // SAFETY: see `exited_record`.
        field_str(unsafe { &*self.header().procs[s as usize].comm.get() })
    }

    pub fn slot_ns_pid(&self, s: u32) -> i32 {
        self.header().procs[s as usize]
            .ns_pid
            .load(Ordering::Relaxed)
    }
}

/// This process's pid namespace (its inode). Asked on every NVML call that lists processes, so
/// it is kept, with the pid it was read for: a process's own pid namespace never changes, but a
/// child forked after its parent's `unshare(CLONE_NEWPID)` is in another one, and reads again.
fn own_pidns() -> u64 {
    use std::sync::atomic::AtomicU64;
    static KEPT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id() as u64;
    let kept = KEPT.load(Ordering::Relaxed);
    // One word holds both: the pid in the high half, the namespace's inode in the low (proc's
    // inode numbers are 32-bit; a larger one is read every time).
    if kept >> 32 == pid && kept != 0 {
        return kept & 0xffff_ffff;
    }
    let ino = std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0);
    if ino <= 0xffff_ffff {
        KEPT.store((pid << 32) | ino, Ordering::Relaxed);
    }
    ino
}

fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The PID of host process `pid` inside its own (innermost) PID namespace.
fn innermost_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// A caller's turn at the checkpoint API of one process (see [`State::checkpoint_turn`]).
pub struct CheckpointTurn<'a> {
    state: &'a State,
    byte: i64,
}

impl Drop for CheckpointTurn<'_> {
    fn drop(&mut self) {
        let _ = liveness::release(self.state.file.as_raw_fd(), self.byte);
    }
}
