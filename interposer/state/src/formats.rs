//! The state formats this release speaks, in one place: `cuslice --version` prints them and
//! docs/upgrades.md declares what each release reads and writes. A change to any of them is a
//! format change: tests/upgrade/formats records the last ones, and `tests/run` runs the
//! mixed-version test when they differ (docs/testing.md).

/// The DRA plugin's checkpoint (`node/dra/src/checkpoint.rs`, whose tests check it agrees).
pub const DRA_CHECKPOINT: u32 = 1;

/// Each format with the version this release writes and the versions it reads, one per line
/// as `NAME WRITES READS` (READS: versions separated by commas), in the order of
/// docs/upgrades.md.
pub fn table() -> Vec<(&'static str, String, String)> {
    use crate::{agent, board, ledger, seen};
    vec![
        (
            "ledger",
            ledger::VERSION.to_string(),
            format!("{},{}", ledger::PREVIOUS, ledger::VERSION),
        ),
        (
            "board",
            board::VERSION.to_string(),
            board::VERSION.to_string(),
        ),
        (
            "turns",
            board::turns::VERSION.to_string(),
            board::turns::VERSION.to_string(),
        ),
        (
            "agent-protocol",
            agent::VERSION.to_string(),
            agent::VERSION.to_string(),
        ),
        (
            "agent-seen",
            seen::VERSION.to_string(),
            seen::VERSION.to_string(),
        ),
        (
            "dra-checkpoint",
            DRA_CHECKPOINT.to_string(),
            format!("unversioned,{DRA_CHECKPOINT}"),
        ),
    ]
}

/// What `cuslice --version` prints after the release: one line naming every format.
pub fn describe() -> String {
    let parts: Vec<String> = table()
        .into_iter()
        .map(|(name, writes, reads)| {
            if reads == writes {
                format!("{name} {writes}")
            } else {
                format!("{name} {writes} (reads {})", reads.replace(',', ", "))
            }
        })
        .collect();
    format!("state formats: {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ledger_line_names_both_versions_read() {
        let d = super::describe();
        assert!(d.contains("ledger 8 (reads 7, 8)"), "{d}");
        assert!(!d.contains('\n'), "{d}");
    }
}
