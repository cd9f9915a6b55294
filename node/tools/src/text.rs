//! `cuslice status` for people: one table per GPU, one row per slice.

use std::fmt::Write;

use cuslice_policy::format_size;

use crate::view::{Compute, Node, Slice};

fn pct(p: Option<f64>) -> String {
    p.map_or_else(|| "-".into(), |p| format!("{p:.1}%"))
}

fn short(slice: &Slice) -> String {
    if slice.kind == "container" {
        slice.slice.chars().take(12).collect()
    } else {
        slice.slice.clone()
    }
}

pub fn render(node: &Node) -> String {
    let mut out = String::new();
    if node.devices.is_empty() {
        out.push_str("no GPU and no slice found\n");
    }
    for d in &node.devices {
        let name = d.name.as_deref().unwrap_or("(name unknown)");
        let mem = match (d.memory_total, d.memory_used) {
            (Some(t), Some(u)) => format!("{} total, {} used", format_size(t), format_size(u)),
            _ => "memory unknown".into(),
        };
        let _ = writeln!(out, "{}  {name}  {mem}", d.uuid);
        if d.slices.is_empty() {
            out.push_str("  no slices\n");
            continue;
        }
        // SPILLED only where some slice of the GPU spills (`CUSLICE_MEMORY_SPILL`): what it holds
        // in host memory past its cap, of the most it may.
        let spills = d.slices.iter().any(|s| s.memory.spill_limit.is_some());
        // FROZEN only where some slice of the GPU has processes frozen to the host: what they
        // hold there, still counted against the cap.
        let freezes = d.slices.iter().any(|s| s.memory.frozen > 0);
        let mut header = vec![
            "SLICE",
            "NAME",
            "MEMORY",
            "CAP",
            "PEAK",
            "REFUSED",
            "SHARE 1s",
            "SHARE 10s",
            "REQUEST",
            "LIMIT",
            "PRIORITY",
            "ALLOTTED",
            "THROTTLED",
            "PROCESSES",
        ];
        if spills {
            header.insert(6, "SPILLED");
        }
        if freezes {
            header.insert(3, "FROZEN");
        }
        let rows: Vec<Vec<String>> = d
            .slices
            .iter()
            .map(|s| {
                let c = &s.compute;
                let live = s.processes.iter().filter(|p| p.alive).count();
                let mut row = vec![
                    short(s),
                    s.name.clone().unwrap_or_else(|| "-".into()),
                    format_size(s.memory.used),
                    format!(
                        "{}{}",
                        s.memory.limit.map_or_else(|| "none".into(), format_size),
                        star(s.memory.set_live)
                    ),
                    format_size(s.memory.peak),
                    s.memory.refusals.to_string(),
                    format!("{}{}", pct(c.share_1s_pct), meter_mark(c)),
                    pct(c.share_10s_pct),
                    format!("{}{}", pct(c.request_pct), star(c.set_live)),
                    format!("{}{}", pct(c.limit_pct), star(c.set_live)),
                    format!("{}{}", c.priority, star(c.priority_set_live)),
                    pct(Some(c.allotted_pct)),
                    format!("{:.1} s", c.throttled_seconds),
                    pids(s, live),
                ];
                if spills {
                    let spilled = match s.memory.spill_limit {
                        Some(l) => {
                            format!("{} of {}", format_size(s.memory.spilled), format_size(l))
                        }
                        None => "-".into(),
                    };
                    row.insert(6, spilled);
                }
                if freezes {
                    row.insert(3, format_size(s.memory.frozen));
                }
                row
            })
            .collect();
        let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, cell) in width.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut l = String::from(" ");
            for (cell, w) in cells.zip(&width) {
                let _ = write!(l, " {cell:<w$}");
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(&mut header.iter().copied()));
        for r in &rows {
            out.push_str(&line(&mut r.iter().map(String::as_str)));
        }
    }
    let mut slices = node.devices.iter().flat_map(|d| &d.slices);
    if slices.any(|s| s.memory.set_live || s.compute.set_live || s.compute.priority_set_live) {
        let _ = writeln!(out, "* changed while the slice ran (cuslice set)");
    }
    for (mark, means) in MARKS {
        let mut slices = node.devices.iter().flat_map(|d| &d.slices);
        if slices.any(|s| meter_mark(&s.compute).trim_start() == mark) {
            let _ = writeln!(out, "{mark} {means}");
        }
    }
    let mut older: Vec<&str> = node
        .devices
        .iter()
        .flat_map(|d| &d.slices)
        .filter(|s| s.ledger_version != cuslice_state::ledger::VERSION)
        .map(|s| s.name.as_deref().unwrap_or(&s.slice))
        .collect();
    older.dedup();
    if !older.is_empty() {
        let _ = writeln!(
            out,
            "note: {} started before the upgrade and run(s) the previous release's library \
             (ledger version {}): shown and changed as any other; a restart moves them to this \
             release",
            older.join(", "),
            cuslice_state::ledger::PREVIOUS
        );
    }
    if let Some(f) = &node.findings {
        for x in &f.findings {
            let _ = writeln!(out, "agent: {} ({})", x.message, x.action);
        }
    }
    for p in &node.problems {
        let _ = writeln!(out, "note: {p}");
    }
    if node.agent.running {
        let _ = writeln!(out, "agent: running ({})", node.agent.socket);
    } else if let Some(n) = &node.agent.note {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// The marks after SHARE 1s of a slice of the previous release whose device time is not the
/// driver's per-process samples, each explained in a line under the tables where it is shown (a
/// slice of this release is metered by its turns: no mark).
const MARKS: [(&str, &str); 2] = [
    (
        "(timed)",
        "device time measured by the library timing launches itself (CUDA events), not by the \
         driver's samples",
    ),
    (
        "(est.)",
        "device time from launch estimates alone: NVML does not report the process",
    ),
];

/// " (timed)" for self-timing, " (est.)" for launch estimates, nothing for turns or the driver's
/// samples (or before the slice launched any work).
fn meter_mark(c: &Compute) -> &'static str {
    match c.metered_by.as_deref() {
        Some("self-timing") => " (timed)",
        Some("estimates") => " (est.)",
        _ => "",
    }
}

/// The mark of a limit changed while the slice ran, explained under the tables.
fn star(live: bool) -> &'static str {
    if live { "*" } else { "" }
}

/// "3: 4123 4130 4131" (host pids of the running processes; a process that exited while the
/// device still holds its memory is marked "exited").
fn pids(s: &Slice, live: usize) -> String {
    let list: Vec<String> = s
        .processes
        .iter()
        .map(|p| {
            let pid = p
                .pid
                .or(p.container_pid)
                .map_or_else(|| "?".into(), |x| x.to_string());
            if p.alive {
                pid
            } else {
                format!("{pid}(exited)")
            }
        })
        .collect();
    format!("{live}: {}", list.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{Agent, Device, idle_slice};

    fn node(slices: Vec<Slice>) -> Node {
        Node {
            time: 0.0,
            devices: vec![Device {
                uuid: "GPU-1".into(),
                name: Some("SimGPU (simulated)".into()),
                memory_total: Some(8 << 30),
                memory_used: Some(0),
                slices,
            }],
            problems: Vec::new(),
            findings: None,
            agent: Agent {
                socket: "/run/cuslice/agent/agent.sock".into(),
                running: false,
                note: None,
            },
        }
    }

    fn metered(dir: &str, by: Option<&str>) -> Slice {
        let mut s = idle_slice(dir);
        s.compute.share_1s_pct = Some(30.0);
        s.compute.metered_by = by.map(str::to_owned);
        s.compute.estimated = by == Some("estimates");
        s
    }

    /// The row of slice `dir` and its SHARE 1s cell (the header's column).
    fn share_1s(text: &str, dir: &str) -> String {
        let header = text.lines().find(|l| l.contains("SHARE 1s")).unwrap();
        let at = header.find("SHARE 1s").unwrap();
        let end = header.find("SHARE 10s").unwrap();
        let row = text.lines().find(|l| l.contains(dir)).unwrap();
        row[at..end].trim().to_owned()
    }

    #[test]
    fn the_share_says_which_meter_measured_it() {
        let text = render(&node(vec![
            metered("/s/samples", Some("samples")),
            metered("/s/timed", Some("self-timing")),
            metered("/s/estimated", Some("estimates")),
            metered("/s/idle", None),
        ]));
        assert_eq!(share_1s(&text, "/s/samples"), "30.0%", "{text}");
        assert_eq!(share_1s(&text, "/s/timed"), "30.0% (timed)", "{text}");
        assert_eq!(share_1s(&text, "/s/estimated"), "30.0% (est.)", "{text}");
        assert_eq!(share_1s(&text, "/s/idle"), "30.0%", "{text}");
        assert!(
            text.contains("\n(timed) device time measured by the library timing launches itself"),
            "{text}"
        );
        assert!(
            text.contains("\n(est.) device time from launch estimates alone"),
            "{text}"
        );
    }

    #[test]
    fn driver_samples_need_no_mark_and_no_explanation() {
        let text = render(&node(vec![
            metered("/s/a", Some("samples")),
            metered("/s/b", None),
        ]));
        assert!(
            !text.contains("(timed)") && !text.contains("(est.)"),
            "{text}"
        );
        let text = render(&node(vec![metered("/s/a", Some("self-timing"))]));
        assert!(
            text.contains("(timed)") && !text.contains("(est.)"),
            "{text}"
        );
    }
}
