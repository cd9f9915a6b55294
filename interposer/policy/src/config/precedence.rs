//! Precedence: for each device and quantity, cuslice per-device > cuslice all-devices > HAMi
//! per-device > HAMi all-devices > cGPU. Which setting wins, the core request checked against
//! the winning core limit, and a notice for each losing family that says something else.

use super::names::{FAMILIES, Family, QUANTITIES, Quantity};
use super::{Config, ConfigError};

/// One limit set by one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Setting {
    pub(super) quantity: Quantity,
    pub(super) family: Family,
    /// `Some(i)` for a per-device variable, `None` for all devices.
    pub(super) ordinal: Option<u32>,
    /// Bytes for memory, percent for the core quantities.
    pub(super) value: u64,
    /// The variable's name, for messages.
    pub(super) variable: String,
    /// The value as written (trimmed), for errors.
    pub(super) written: String,
    /// `NAME=VALUE` as written, for notices.
    pub(super) shown: String,
    /// The hook-file line, for errors.
    pub(super) line: Option<usize>,
}

impl Setting {
    /// Lower wins: the family first, then per-device before all-devices.
    pub(super) fn rank(&self) -> (Family, bool) {
        (self.family, self.ordinal.is_none())
    }

    pub(super) fn applies_to(&self, quantity: Quantity, scope: Option<u32>) -> bool {
        self.quantity == quantity && (self.ordinal.is_none() || self.ordinal == scope)
    }
}

impl Config {
    /// The device ordinals that some per-device variable names, ascending, preceded by `None`
    /// (every other device).
    pub(super) fn scopes(&self) -> Vec<Option<u32>> {
        let mut ordinals: Vec<u32> = self.settings.iter().filter_map(|s| s.ordinal).collect();
        ordinals.sort_unstable();
        ordinals.dedup();
        std::iter::once(None)
            .chain(ordinals.into_iter().map(Some))
            .collect()
    }

    /// The setting that wins for `quantity` on the device `scope` (`None`: a device no
    /// per-device variable names).
    pub(super) fn winner(&self, quantity: Quantity, scope: Option<u32>) -> Option<&Setting> {
        self.settings
            .iter()
            .filter(|s| s.applies_to(quantity, scope))
            .min_by_key(|s| s.rank())
    }

    pub(super) fn check_requests(&self) -> Result<(), ConfigError> {
        for scope in self.scopes() {
            let limit = self.winner(Quantity::CoreLimit, scope);
            let request = self.winner(Quantity::CoreRequest, scope);
            let Some((limit, request)) = limit.zip(request) else {
                continue;
            };
            if request.value > limit.value {
                let device = scope.map_or(String::new(), |i| format!(" for device {i}"));
                return Err(ConfigError {
                    line: request.line,
                    variable: request.variable.clone(),
                    value: request.written.clone(),
                    problem: format!(
                        "is more than the core limit {}{device}; a request cannot exceed its \
                         limit",
                        limit.shown
                    ),
                    example: format!("{}={}", request.variable, limit.value),
                });
            }
        }
        Ok(())
    }

    pub(super) fn push_conflict_notices(&mut self) {
        let mut notices = Vec::new();
        for quantity in QUANTITIES {
            for scope in self.scopes() {
                let Some(winner) = self.winner(quantity, scope) else {
                    continue;
                };
                for family in FAMILIES.into_iter().filter(|&f| f != winner.family) {
                    let loser = self
                        .settings
                        .iter()
                        .filter(|s| s.family == family && s.applies_to(quantity, scope))
                        .min_by_key(|s| s.rank());
                    let Some(loser) = loser.filter(|l| l.value != winner.value) else {
                        continue;
                    };
                    let notice = format!(
                        "{} conflicts with {}; using {}",
                        loser.shown, winner.shown, winner.variable
                    );
                    if !notices.contains(&notice) {
                        notices.push(notice);
                    }
                }
            }
        }
        self.notices.extend(notices);
    }
}
