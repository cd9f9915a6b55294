//! Which entry of NVML's process list is this process once it has made its first context on a
//! device: plain lists in, a figure out. A slice's first context on a device is measured by what
//! NVML says the creating process holds there (interposer/src/context.rs takes the lists; docs/interposer.md, "Hidden memory").
//! The lists are (pid, bytes) as NVML gives them: host pids, which a process in a container
//! knows only when the node agent told it, and which a driver that cannot see a process's pid
//! namespace may give as that namespace's pids (two containers' processes then share a pid).
//!
//! The figure must never be smaller than what the context takes (a slice charged too little
//! holds more than its cap), so where the lists cannot say which entry is this process, every
//! entry that could be is kept, later lists drop the ones that change (this process holds still
//! while it measures), and what is left is charged at its largest.

/// NVML's figure for a process whose memory it cannot tell (`NVML_VALUE_NOT_AVAILABLE`).
pub const NOT_AVAILABLE: u64 = u64::MAX;

/// What the lists before and after the creation say about this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Listed under its own pid: what it holds now less what it held before.
    Own(u64),
    /// One of these entries (pid, bytes) is this process; more lists narrow them.
    Among(Vec<(u32, u64)>),
    /// The lists do not show it (no figures, or not listed).
    Unlisted,
}

/// Finds this process in the lists taken before (`was`) and after (`now`) it made its first
/// context on the device. `me`: NVML's pid for it, where known for sure (its host pid); `alias`:
/// its pid in its own namespace, which a driver that cannot see the host's may list it under.
///
/// - Listed once under `me`: its own figure, whatever the others did meanwhile.
/// - Otherwise, the entries of `now` that `was` does not hold with the same pid and bytes (this
///   process, others that made first contexts at the same moment, neighbours that allocated or
///   freed meanwhile), less those under a pid `was` listed already: this process had no context
///   on the device, so it was not listed, unless under `me` or `alias` (processes of different
///   pid namespaces share pids, and a driver that names a process by its namespace's pid until
///   it learns the host's renames it). If that leaves none, all of them.
pub fn identify(was: &[(u32, u64)], now: &[(u32, u64)], me: Option<u32>, alias: u32) -> Found {
    let mine = |l: &[(u32, u64)]| -> Vec<u64> {
        me.map_or(Vec::new(), |p| {
            l.iter().filter(|e| e.0 == p).map(|e| e.1).collect()
        })
    };
    match (mine(now).as_slice(), mine(was).as_slice()) {
        ([held], _) if *held == NOT_AVAILABLE => return Found::Unlisted,
        ([held], []) => return Found::Own(*held),
        ([held], [before]) if *before != NOT_AVAILABLE => {
            return Found::Own(held.saturating_sub(*before));
        }
        _ => {}
    }
    // A figure NVML cannot give may be this process's: nothing below can be trusted.
    if now.iter().any(|e| e.1 == NOT_AVAILABLE) {
        return Found::Unlisted;
    }
    let mut left = was.to_vec();
    let mut changed = Vec::new();
    for e in now {
        match left.iter().position(|o| o == e) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => changed.push(*e),
        }
    }
    let could: Vec<(u32, u64)> = changed
        .iter()
        .filter(|e| Some(e.0) == me || e.0 == alias || !was.iter().any(|o| o.0 == e.0))
        .copied()
        .collect();
    match (could.is_empty(), changed.is_empty()) {
        (false, _) => Found::Among(could),
        (true, false) => Found::Among(changed),
        (true, true) => Found::Unlisted,
    }
}

/// Of `among`, the entries whose bytes a later list still shows (this process's own figure does
/// not change while it measures; its pid may, see [`identify`]). If none is left, `among` as it
/// was: the later list did not show this process, so it says nothing.
pub fn narrow(among: Vec<(u32, u64)>, later: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut left: Vec<u64> = later.iter().map(|e| e.1).collect();
    let kept: Vec<(u32, u64)> = among
        .iter()
        .filter(|e| match left.iter().position(|b| *b == e.1) {
            Some(i) => {
                left.swap_remove(i);
                true
            }
            None => false,
        })
        .copied()
        .collect();
    if kept.is_empty() { among } else { kept }
}

/// The figure `among` says for sure: the bytes every entry holds, if they all hold the same.
pub fn settled(among: &[(u32, u64)]) -> Option<u64> {
    let (first, rest) = among.split_first()?;
    rest.iter().all(|e| e.1 == first.1).then_some(first.1)
}

/// The figure to charge when `among` did not settle: the largest (this process is one of them,
/// so never less than what its context takes).
pub fn largest(among: &[(u32, u64)]) -> u64 {
    among.iter().map(|e| e.1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const CTX: u64 = 300 * MIB;

    #[test]
    fn own_pid_gives_own_figure_whatever_the_others_do() {
        // Neighbour 10 freed 1 GiB, 11 appeared at the same moment: this process is 12.
        let was = [(10, 2048 * MIB)];
        let now = [(10, 1024 * MIB), (11, 900 * MIB), (12, CTX)];
        assert_eq!(identify(&was, &now, Some(12), 12), Found::Own(CTX));
        // Listed before (a context it had already): what it holds more.
        let was = [(12, CTX), (10, 5 * MIB)];
        let now = [(12, 2 * CTX), (10, MIB)];
        assert_eq!(identify(&was, &now, Some(12), 12), Found::Own(CTX));
        // NVML cannot give its figure: unlisted, whatever the others say.
        let now = [(12, NOT_AVAILABLE), (10, MIB)];
        assert_eq!(identify(&[], &now, Some(12), 12), Found::Unlisted);
    }

    #[test]
    fn otherwise_the_new_entries() {
        let was = [(10, 2048 * MIB), (20, 700 * MIB), (30, 5 * MIB)];
        // The one that appeared while neighbour 10 freed and 20 allocated: it alone, never the
        // device's rise (which the free makes smaller).
        let now = [(10, 1024 * MIB), (20, 900 * MIB), (30, 5 * MIB), (31, CTX)];
        assert_eq!(identify(&was, &now, None, 7), Found::Among(vec![(31, CTX)]));
        // Own pid known but listed under another (its namespace's): the same.
        assert_eq!(
            identify(&was, &now, Some(5031), 7),
            Found::Among(vec![(31, CTX)])
        );
        // Another appeared at the same moment: both.
        let now = [(10, 1024 * MIB), (31, CTX), (32, CTX + 64 * MIB)];
        assert_eq!(
            identify(&was, &now, None, 7),
            Found::Among(vec![(31, CTX), (32, CTX + 64 * MIB)])
        );
    }

    #[test]
    fn under_a_shared_pid_the_entries_that_changed() {
        // Three containers' processes listed as pid 1 (its own, `alias`), one neighbour freed;
        // neighbour 20 (a host pid) allocated.
        let was = [(1, 900 * MIB), (1, 500 * MIB), (20, 700 * MIB)];
        let now = [(1, 700 * MIB), (1, 500 * MIB), (1, CTX), (20, 800 * MIB)];
        let Found::Among(among) = identify(&was, &now, None, 1) else {
            panic!()
        };
        assert_eq!(among, vec![(1, 700 * MIB), (1, CTX)]);
        // The neighbour changes again; this process holds still.
        let among = narrow(among, &[(1, 650 * MIB), (1, 500 * MIB), (1, CTX)]);
        assert_eq!(settled(&among), Some(CTX));
        // Two equal entries in `now`, one in `was`: one of them is new.
        assert_eq!(
            identify(&[(1, CTX)], &[(1, CTX), (1, CTX)], None, 1),
            Found::Among(vec![(1, CTX)])
        );
        // A neighbour renamed from its namespace's pid (1, as this process's) to its host pid:
        // either could be this process as far as the lists say.
        let was = [(1, 396 * MIB)];
        let now = [(4242, 396 * MIB), (1, CTX)];
        assert_eq!(
            identify(&was, &now, None, 1),
            Found::Among(vec![(4242, 396 * MIB), (1, CTX)])
        );
        // Listed under a pid `was` had, neither its own nor an alias: only changed entries are
        // left to go by, so all of them.
        let was = [(9, 396 * MIB)];
        let now = [(9, CTX)];
        assert_eq!(identify(&was, &now, None, 1), Found::Among(vec![(9, CTX)]));
    }

    #[test]
    fn nothing_to_go_by_is_unlisted() {
        assert_eq!(identify(&[], &[], None, 1), Found::Unlisted);
        let l = [(10, MIB)];
        assert_eq!(identify(&l, &l, None, 1), Found::Unlisted);
        // A figure NVML cannot give could be this process's.
        let now = [(10, MIB), (11, NOT_AVAILABLE)];
        assert_eq!(identify(&l, &now, None, 1), Found::Unlisted);
    }

    #[test]
    fn narrowing_keeps_the_figures_that_hold_still_and_the_largest_is_safe() {
        let among = vec![(1, CTX), (1, 700 * MIB), (2, 900 * MIB)];
        // A list without any of them says nothing.
        assert_eq!(narrow(among.clone(), &[(3, MIB)]), among);
        assert_eq!(settled(&among), None);
        assert_eq!(largest(&among), 900 * MIB);
        // The neighbour at 700 MiB changed; this process was renamed to its host pid.
        let among = narrow(among, &[(4001, CTX), (2, 900 * MIB), (1, 710 * MIB)]);
        assert_eq!(among, vec![(1, CTX), (2, 900 * MIB)]);
        assert_eq!(settled(&among), None);
        assert_eq!(largest(&among), 900 * MIB);
        let among = narrow(among, &[(4001, CTX), (2, 800 * MIB)]);
        assert_eq!(settled(&among), Some(CTX));
        assert_eq!(settled(&[]), None);
        assert_eq!(largest(&[]), 0);
    }
}
