//! A slice's grant: the most it may claim on any device in the node's compute arbitration (its
//! core request and limit, in parts per million of device time, and its priority), and who made
//! its place there. The node writes it (the OCI hook and `cuslice set` for a container; a
//! standalone slice's first process for itself), and every other slice reads it to bound what
//! the slice says it claims: a tenant can write its own claims, never its grant. Plain text,
//! parsed leniently: a line that is not understood is left out, and what is missing is the least
//! a slice may claim (no request, normal priority).

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::config::Config;
use crate::priority::Priority;
use crate::share::FULL;

/// Who made the slice's place on the board, for whoever sweeps what is left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The OCI hook, for container `id`, under its state root.
    Hook { id: String, root: PathBuf },
    /// A standalone slice's process on the host.
    Standalone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The largest core request (ppm) the slice may claim on a device.
    pub request: u32,
    /// The largest core limit (ppm).
    pub limit: u32,
    /// The highest priority.
    pub priority: Priority,
    /// The largest memory cap (bytes) it has on any device, `None` where some device it may
    /// use has none (or, for a grant that does not say, it is not known): another slice's want
    /// of memory is believed up to this (`Board::memory_wanted`), since an honest process never
    /// waits for more than its cap lets it allocate.
    pub memory: Option<u64>,
    /// Whether its processes may be frozen when idle (`CUSLICE_MEMORY_FREEZE_IDLE`): only
    /// then do other slices count the thaws it says it has under way (`crate::room`).
    pub freezes: bool,
    pub origin: Origin,
}

/// The largest memory cap of configuration `c` on any device its processes may use: the
/// devices its recorded device nodes count where the hook recorded them, else those its
/// per-device variables name and every other (the all-devices value). `None` if one of them
/// has no cap.
fn memory_cap(c: &Config) -> Option<u64> {
    let ordinals: Vec<u32> = match c.gpus().and_then(|g| g.nodes.as_ref()) {
        Some(nodes) if !nodes.is_empty() => (0..nodes.len() as u32).collect(),
        _ => c
            .mentioned_ordinals()
            .into_iter()
            .chain([u32::MAX])
            .collect(),
    };
    ordinals
        .into_iter()
        .map(|o| c.limits(o).memory)
        .try_fold(0, |most, cap| Some(most.max(cap?)))
}

/// The larger of two memory caps, `None` being none at all.
pub fn larger_cap(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.max(b?))
}

fn ppm(percent: Option<u32>, none: u32) -> u32 {
    percent.map_or(none, |p| p.min(100) * (FULL / 100))
}

impl Grant {
    /// What a slice of configuration `c` may claim on any device: the largest request and limit
    /// it sets for any device, and its priority.
    pub fn from_config(c: &Config, origin: Origin) -> Grant {
        // The ordinals per-device variables name, and one no variable names (the all-devices
        // values).
        let ordinals = c.mentioned_ordinals().into_iter().chain([u32::MAX]);
        let (mut request, mut limit) = (0, 0);
        for o in ordinals {
            let l = c.limits(o);
            request = request.max(ppm(l.core_request, 0));
            limit = limit.max(ppm(l.core_limit, FULL));
        }
        Grant {
            request,
            limit,
            priority: c.priority,
            memory: memory_cap(c),
            freezes: c.memory_freeze_idle.is_some(),
            origin,
        }
    }

    /// Reads a grant file's text. Never fails: what is not understood is left at the least.
    pub fn parse(text: &str) -> Grant {
        let mut g = Grant {
            request: 0,
            limit: FULL,
            priority: Priority::Normal,
            memory: None,
            freezes: false,
            origin: Origin::Standalone,
        };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some("request"), Some(v)) => {
                    if let Ok(n) = v.parse::<u32>() {
                        g.request = n.min(FULL);
                    }
                }
                (Some("limit"), Some(v)) => {
                    if let Ok(n) = v.parse::<u32>() {
                        g.limit = n.min(FULL);
                    }
                }
                (Some("priority"), Some(v)) => {
                    if let Some(p) = Priority::parse(v) {
                        g.priority = p;
                    }
                }
                (Some("memory"), Some(v)) => g.memory = v.parse::<u64>().ok(),
                (Some("freezes"), Some("yes")) => g.freezes = true,
                (Some("origin"), Some("hook")) => {
                    // `origin hook ID ROOT`: the root is the rest of the line (it may hold
                    // spaces; an id never does).
                    let rest = line.trim_start()["origin".len()..].trim_start()["hook".len()..]
                        .trim_start();
                    if let Some((id, root)) = rest.split_once(char::is_whitespace)
                        && !root.trim().is_empty()
                    {
                        g.origin = Origin::Hook {
                            id: id.to_string(),
                            root: PathBuf::from(root.trim()),
                        };
                    }
                }
                _ => {}
            }
        }
        // A request above the limit is never granted.
        g.request = g.request.min(g.limit);
        g
    }

    /// The grant file's text (`parse` reads it back).
    pub fn format(&self) -> String {
        let mut s = String::from(
            "# What this slice may claim on any device (core request and limit in parts per \
             million of device time, priority): written by the node, read by every slice\n",
        );
        let _ = writeln!(s, "request {}", self.request);
        let _ = writeln!(s, "limit {}", self.limit);
        let _ = writeln!(s, "priority {}", self.priority);
        if let Some(m) = self.memory {
            let _ = writeln!(s, "memory {m}");
        }
        if self.freezes {
            s.push_str("freezes yes\n");
        }
        match &self.origin {
            Origin::Hook { id, root } => {
                let _ = writeln!(s, "origin hook {id} {}", root.display());
            }
            Origin::Standalone => s.push_str("origin standalone\n"),
        }
        s
    }

    /// What a slice under this grant is taken to claim when it says `request`, `limit` and
    /// `priority`: never more than granted.
    pub fn bound(&self, request: u32, limit: u32, priority: Priority) -> (u32, u32, Priority) {
        let limit = limit.min(self.limit);
        (
            request.min(self.request).min(limit),
            limit,
            priority.min(self.priority),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().copied()).unwrap()
    }

    #[test]
    fn a_configuration_grants_its_largest_request_and_limit_on_any_device() {
        let g = |vars: &[(&str, &str)]| {
            let g = Grant::from_config(&config(vars), Origin::Standalone);
            (g.request, g.limit, g.priority)
        };
        assert_eq!(g(&[]), (0, FULL, Priority::Normal));
        let freezes =
            |vars: &[(&str, &str)]| Grant::from_config(&config(vars), Origin::Standalone).freezes;
        assert!(!freezes(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]));
        assert!(freezes(&[("CUSLICE_MEMORY_FREEZE_IDLE", "10m")]));
        assert_eq!(
            g(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]),
            (0, FULL, Priority::Normal)
        );
        assert_eq!(
            g(&[("CUSLICE_CORE_LIMIT", "30")]),
            (0, 300_000, Priority::Normal)
        );
        assert_eq!(
            g(&[
                ("CUSLICE_CORE_REQUEST", "20"),
                ("CUSLICE_CORE_LIMIT", "50"),
                ("CUSLICE_PRIORITY", "high")
            ]),
            (200_000, 500_000, Priority::High)
        );
        // Per device: the largest of any device, and a device no variable names gets the
        // all-devices values (here: no limit).
        assert_eq!(
            g(&[
                ("CUSLICE_CORE_LIMIT_0", "30"),
                ("CUSLICE_CORE_REQUEST_1", "60"),
                ("CUSLICE_CORE_LIMIT_1", "70")
            ]),
            (600_000, FULL, Priority::Normal)
        );
        assert_eq!(
            g(&[("CUSLICE_CORE_LIMIT", "40"), ("CUSLICE_CORE_LIMIT_1", "70")]),
            (0, 700_000, Priority::Normal)
        );
    }

    #[test]
    fn the_memory_granted_is_the_largest_cap_of_any_device_it_may_use() {
        let m =
            |vars: &[(&str, &str)]| Grant::from_config(&config(vars), Origin::Standalone).memory;
        assert_eq!(m(&[]), None);
        assert_eq!(m(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]), Some(1 << 30));
        assert_eq!(
            m(&[
                ("CUSLICE_MEMORY_LIMIT", "1GiB"),
                ("CUSLICE_MEMORY_LIMIT_1", "3GiB")
            ]),
            Some(3 << 30)
        );
        // A device no variable names has no cap...
        assert_eq!(m(&[("CUSLICE_MEMORY_LIMIT_0", "2GiB")]), None);
        // ...unless the container's devices are known, and each of them has one.
        let nodes = |list: &str| {
            m(&[
                ("CUSLICE_MEMORY_LIMIT_0", "2GiB"),
                ("CUSLICE_MEMORY_LIMIT_1", "6GiB"),
                ("CUSLICE_DEVICE_NODES", list),
            ])
        };
        assert_eq!(nodes("3,1"), Some(6 << 30));
        assert_eq!(nodes("3"), Some(2 << 30));
        assert_eq!(nodes("3,1,2"), None);
        // Written and read back; a grant that does not say is read as no cap.
        let g = Grant::from_config(
            &config(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]),
            Origin::Standalone,
        );
        assert_eq!(Grant::parse(&g.format()), g);
        assert_eq!(Grant::parse("request 0\nlimit 1000000\n").memory, None);
        assert_eq!(Grant::parse("memory lots\n").memory, None);
    }

    #[test]
    fn the_text_reads_back_and_anything_else_reads_as_the_least() {
        for origin in [
            Origin::Standalone,
            Origin::Hook {
                id: "abc-1".into(),
                root: PathBuf::from("/run/cu slice"),
            },
        ] {
            let g = Grant {
                request: 250_000,
                limit: 600_000,
                priority: Priority::Low,
                memory: None,
                freezes: true,
                origin,
            };
            assert_eq!(Grant::parse(&g.format()), g);
        }
        let least = Grant {
            request: 0,
            limit: FULL,
            priority: Priority::Normal,
            memory: None,
            freezes: false,
            origin: Origin::Standalone,
        };
        for junk in [
            "",
            "\0\0\0",
            "freezes maybe\n",
            "request -5\nlimit x\npriority max\norigin hook\n",
            "origin hook onlyanid\n",
        ] {
            assert_eq!(Grant::parse(junk), least, "{junk:?}");
        }
        // Out of range: bounded; a request above the limit is cut to it.
        let g = Grant::parse("request 4000000000\nlimit 300000\n");
        assert_eq!((g.request, g.limit), (300_000, 300_000));
    }

    #[test]
    fn claims_are_bounded_by_the_grant() {
        let g = Grant {
            request: 200_000,
            limit: 500_000,
            priority: Priority::Normal,
            memory: None,
            freezes: false,
            origin: Origin::Standalone,
        };
        assert_eq!(
            g.bound(FULL, FULL, Priority::High),
            (200_000, 500_000, Priority::Normal)
        );
        assert_eq!(
            g.bound(100_000, 300_000, Priority::Low),
            (100_000, 300_000, Priority::Low)
        );
        // A request is never above the limit taken.
        assert_eq!(
            g.bound(200_000, 50_000, Priority::Normal),
            (50_000, 50_000, Priority::Normal)
        );
    }
}
