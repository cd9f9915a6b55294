//! One parser per variable family (cuslice's sizes and percents, HAMi-core's, cGPU's, the
//! priority and the log level), each returning a [`ConfigError`] that names the variable, its
//! value and an example; and the assembly of a [`Config`] from checked `NAME=VALUE` pairs.

use std::path::PathBuf;

use super::names::{
    ALIYUN_CONTAINER, ALIYUN_UNIT, DEVICE_NODES, Family, KNOWN_CUSLICE, LOG, MAX_ORDINAL,
    MEMORY_FREEZE_IDLE, MEMORY_SPILL, MEMORY_WAIT, NODE_DIR, NVIDIA_VISIBLE, Name, PRIORITY,
    Quantity, STATE_DIR, Syntax, classify, near_miss, suggest,
};
use super::precedence::Setting;
use super::{Config, ConfigError, LogLevel};
use crate::duration::{DurationError, parse_duration};
use crate::echo::{cut, one_line, quoted};
use crate::priority::Priority;
use crate::size::{Reason, parse_size};

/// The largest memory limit: 1 PiB, more than any device holds. A limit above it (say
/// 18446744073709551615 bytes) would be no limit at all, so it is refused like any other bad
/// value.
pub const MAX_MEMORY_LIMIT: u64 = 1 << 50;

const TOO_LARGE: &str = "is too large: a memory limit is at most 1 PiB (1125899906842624 bytes), more than any device holds";

/// One `NAME=VALUE` pair and where it came from.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) value: String,
    pub(super) line: Option<usize>,
}

impl Entry {
    pub(super) fn error(
        &self,
        problem: impl Into<String>,
        example: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            line: self.line,
            variable: self.name.clone(),
            value: self.value.clone(),
            problem: problem.into(),
            example: example.into(),
        }
    }
}

/// Empty values. An empty limit (`CUSLICE_MEMORY_LIMIT=`) is an error, not "unset": it is almost
/// always a template or script whose variable expanded to nothing, and reading it as "no limit"
/// would silently run the workload uncapped. The same holds for every variable here, so that the
/// rule has no exceptions; to set no limit, leave the variable out.
pub(super) const EMPTY: &str = "is empty (to set no limit, leave the variable out)";

pub(super) const SIZE_UNITS: &str =
    "binary units: KiB MiB GiB TiB PiB, or k m g t p; or plain bytes";

/// What a size written with a decimal unit (`1.5GB`) is refused with: what the unit means to
/// each kind of reader, and the same number with the binary unit as the example.
fn decimal_unit(entry: &Entry) -> ConfigError {
    let written = entry.value.trim();
    let unit_at = written
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(written.len());
    let (number, unit) = written.split_at(unit_at);
    let (binary, power) = match unit.trim().to_ascii_lowercase().as_str() {
        "kb" => ("KiB", 1),
        "mb" => ("MiB", 2),
        "gb" => ("GiB", 3),
        "tb" => ("TiB", 4),
        _ => ("PiB", 5),
    };
    entry.error(
        format!(
            "is ambiguous: {} is 10^{} bytes to some readers and 2^{} to others",
            unit.trim(),
            3 * power,
            10 * power
        ),
        format!(
            "{}={}{binary} ({SIZE_UNITS})",
            cut(&entry.name),
            cut(number.trim())
        ),
    )
}

pub(super) fn parse_cuslice_memory(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!("{}=4GiB ({SIZE_UNITS})", entry.name);
    match parse_size(&entry.value) {
        Ok(0) => Err(entry.error("is 0; a memory limit must be more than 0", example)),
        Ok(bytes) if bytes > MAX_MEMORY_LIMIT => Err(entry.error(TOO_LARGE, example)),
        Ok(bytes) => Ok(bytes),
        Err(e) if e.reason == Reason::Empty => Err(entry.error(EMPTY, example)),
        Err(e) if e.reason == Reason::TooLarge => Err(entry.error(TOO_LARGE, example)),
        Err(e) if e.reason == Reason::DecimalUnit => Err(decimal_unit(entry)),
        Err(e) => Err(entry.error(format!("is not a size ({})", e.reason), example)),
    }
}

/// A whole number, as written after trimming; `Err` carries the problem.
pub(super) fn parse_whole(s: &str, what: &str) -> Result<u64, String> {
    if s.is_empty() {
        return Err(EMPTY.to_string());
    }
    if s.starts_with('-') {
        return Err(format!("is negative; it must be {what}"));
    }
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("is not {what}"));
    }
    digits
        .parse()
        .map_err(|_| format!("is too large; it must be {what}"))
}

/// cuslice's percent: 1 to 100, optionally followed by `%`.
pub(super) fn parse_cuslice_percent(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!("{}=50 (a whole percent from 1 to 100)", entry.name);
    let trimmed = entry.value.trim();
    let number = trimmed.strip_suffix('%').map_or(trimmed, |s| s.trim_end());
    if number.is_empty() && !trimmed.is_empty() {
        return Err(entry.error("is not a whole percent from 1 to 100", example));
    }
    match parse_whole(number, "a whole percent from 1 to 100") {
        Ok(p @ 1..=100) => Ok(p),
        Ok(_) => Err(entry.error("is out of range; it must be from 1 to 100", example)),
        // The problem says what a percent is already, except for an empty value.
        Err(problem) if problem != EMPTY => Err(entry.error(problem, format!("{}=50", entry.name))),
        Err(problem) => Err(entry.error(problem, example)),
    }
}

/// HAMi-core's memory limit: digits with an optional `k`, `m` or `g` (either case, 1024-based).
pub(super) fn parse_hami_memory(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!(
        "{}=4g (a whole number with suffix k, m or g, or plain bytes)",
        entry.name
    );
    let s = entry.value.trim();
    let (number, shift) = match s.as_bytes().last() {
        Some(b'g' | b'G') => (&s[..s.len() - 1], 30),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 20),
        Some(b'k' | b'K') => (&s[..s.len() - 1], 10),
        _ => (s, 0),
    };
    if !s.is_empty() && number.is_empty() {
        return Err(entry.error("has no number", example));
    }
    let n = parse_whole(
        number,
        "a whole number with an optional k, m or g (e.g. 4g, 512m)",
    )
    .map_err(|problem| entry.error(problem, example.clone()))?;
    if n == 0 {
        return Err(entry.error("is 0; a memory limit must be more than 0", example));
    }
    n.checked_mul(1 << shift)
        .filter(|&bytes| bytes <= MAX_MEMORY_LIMIT)
        .ok_or_else(|| entry.error(TOO_LARGE, example))
}

/// HAMi-core's SM limit: 0 to 100. HAMi-core treats 0 as "no limit" (it logs that and applies
/// none), so 0 is accepted here and means "not set"; 1 to 100 is a core limit.
pub(super) fn parse_hami_sm(entry: &Entry) -> Result<Option<u64>, ConfigError> {
    let example = format!(
        "{}=50 (a whole percent from 0 to 100; 0 means no limit)",
        entry.name
    );
    match parse_whole(entry.value.trim(), "a whole percent from 0 to 100") {
        Ok(0) => Ok(None),
        Ok(p @ 1..=100) => Ok(Some(p)),
        Ok(_) => Err(entry.error("is out of range; it must be from 0 to 100", example)),
        Err(problem) => Err(entry.error(problem, example)),
    }
}

/// `ALIYUN_COM_GPU_MEM_UNIT`: `GiB`/`G` or `MiB`/`M`, case-insensitive; returns the shift.
pub(super) fn parse_aliyun_unit(entry: &Entry) -> Result<u32, ConfigError> {
    let example = format!("{ALIYUN_UNIT}=GiB (GiB, G, MiB or M)");
    match entry.value.trim().to_ascii_lowercase().as_str() {
        "gib" | "g" => Ok(30),
        "mib" | "m" => Ok(20),
        "" => Err(entry.error(EMPTY, example)),
        _ => Err(entry.error("is not a unit cGPU knows", example)),
    }
}

pub(super) fn parse_aliyun_container(
    entry: &Entry,
    shift: u32,
    unit: &str,
) -> Result<u64, ConfigError> {
    let example = format!("{ALIYUN_CONTAINER}=4 (a whole number of {unit})");
    let what = format!("a whole number of {unit}");
    let n = parse_whole(entry.value.trim(), &what)
        .map_err(|problem| entry.error(problem, example.clone()))?;
    if n == 0 {
        return Err(entry.error("is 0; a memory limit must be more than 0", example));
    }
    n.checked_mul(1 << shift)
        .filter(|&bytes| bytes <= MAX_MEMORY_LIMIT)
        .ok_or_else(|| entry.error(TOO_LARGE, example))
}

pub(super) fn parse_priority(entry: &Entry) -> Result<Priority, ConfigError> {
    Priority::parse(&entry.value).ok_or_else(|| {
        entry.error(
            "is not a priority (high, normal or low)",
            format!("{PRIORITY}=high"),
        )
    })
}

/// `CUSLICE_MEMORY_WAIT`: how long an allocation at the cap waits for the slice's own frees; a
/// duration more than 0 (`5s`, `500ms`, `2m`), at most a day.
pub(super) fn parse_memory_wait(entry: &Entry) -> Result<std::time::Duration, ConfigError> {
    let example = format!("{MEMORY_WAIT}=5s (units: ms, s, m, h; to not wait, leave it out)");
    match parse_duration(&entry.value) {
        Ok(d) if d.is_zero() => Err(entry.error(
            "is 0; a wait must be more than 0 (to not wait, leave the variable out)",
            example,
        )),
        Ok(d) => Ok(d),
        Err(DurationError::Empty) => Err(entry.error(EMPTY, example)),
        Err(e) => Err(entry.error(format!("is not a duration ({e})"), example)),
    }
}

/// `CUSLICE_MEMORY_FREEZE_IDLE`: how long a process of the slice goes without a CUDA call before
/// its device memory is frozen to the host; a duration of at least a second, at most a day.
pub(super) fn parse_memory_freeze_idle(entry: &Entry) -> Result<std::time::Duration, ConfigError> {
    let example =
        format!("{MEMORY_FREEZE_IDLE}=5m (units: ms, s, m, h; to never freeze, leave it out)");
    match parse_duration(&entry.value) {
        Ok(d) if d < std::time::Duration::from_secs(1) => Err(entry.error(
            "is less than a second; a process that idle is between two calls, not idle",
            example,
        )),
        Ok(d) => Ok(d),
        Err(DurationError::Empty) => Err(entry.error(EMPTY, example)),
        Err(e) => Err(entry.error(format!("is not a duration ({e})"), example)),
    }
}

/// `CUSLICE_MEMORY_SPILL`: how much more than the cap the slice may hold in host memory; a size
/// more than 0, at most 1 PiB.
pub(super) fn parse_memory_spill(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!("{MEMORY_SPILL}=4GiB ({SIZE_UNITS})");
    match parse_size(&entry.value) {
        Ok(0) => Err(entry.error(
            "is 0; a spill must be more than 0 (to not spill, leave the variable out)",
            example,
        )),
        Ok(bytes) if bytes > MAX_MEMORY_LIMIT => Err(entry.error(
            "is too large: a spill is at most 1 PiB (1125899906842624 bytes)",
            example,
        )),
        Ok(bytes) => Ok(bytes),
        Err(e) if e.reason == Reason::Empty => Err(entry.error(EMPTY, example)),
        Err(e) if e.reason == Reason::DecimalUnit => Err(decimal_unit(entry)),
        Err(e) => Err(entry.error(format!("is not a size ({})", e.reason), example)),
    }
}

pub(super) fn parse_log(entry: &Entry) -> Result<LogLevel, ConfigError> {
    LogLevel::parse(&entry.value).ok_or_else(|| {
        entry.error(
            "is not a log level (error, warn, info or debug)",
            format!("{LOG}=info"),
        )
    })
}

/// Checks that no name appears twice with different values and drops exact repeats.
pub(super) fn dedupe(entries: Vec<Entry>) -> Result<Vec<Entry>, ConfigError> {
    let mut kept: Vec<Entry> = Vec::with_capacity(entries.len());
    for entry in entries {
        match kept.iter().find(|k| k.name == entry.name) {
            Some(first) if first.value == entry.value => {}
            Some(first) => {
                let at = first
                    .line
                    .map_or(String::new(), |l| format!(" on line {l}"));
                return Err(entry.error(
                    format!("is set twice, also to {}{at}", quoted(&first.value)),
                    format!("{}={} (once)", cut(&first.name), cut(&first.value)),
                ));
            }
            None => kept.push(entry),
        }
    }
    Ok(kept)
}

impl Config {
    pub(super) fn build(entries: Vec<Entry>) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut aliyun_container = None;
        let mut aliyun_unit = None;
        for entry in &entries {
            let setting = |quantity, family, ordinal, value| Setting {
                quantity,
                family,
                ordinal,
                value,
                variable: entry.name.clone(),
                written: entry.value.trim().to_string(),
                shown: format!("{}={}", cut(&entry.name), cut(entry.value.trim())),
                line: entry.line,
            };
            match classify(&entry.name) {
                Name::Limit {
                    family,
                    quantity,
                    syntax,
                    ordinal,
                } => {
                    let value = match syntax {
                        Syntax::Size => Some(parse_cuslice_memory(entry)?),
                        Syntax::Percent => Some(parse_cuslice_percent(entry)?),
                        Syntax::HamiSize => Some(parse_hami_memory(entry)?),
                        Syntax::HamiPercent => parse_hami_sm(entry)?,
                    };
                    if let Some(value) = value {
                        config
                            .settings
                            .push(setting(quantity, family, ordinal, value));
                    }
                }
                Name::BadOrdinal { base, suffix } => {
                    let value = cut(entry.value.trim());
                    let value = if value.is_empty() {
                        "...".into()
                    } else {
                        value
                    };
                    return Err(entry.error(
                        format!(
                            "has device index {}, which is not a number from 0 to \
                             {MAX_ORDINAL} without leading zeros",
                            quoted(suffix)
                        ),
                        format!("{base}_0={value} (device 0) or {base}={value} (all devices)"),
                    ));
                }
                Name::StateDir => {
                    if entry.value.trim().is_empty() {
                        return Err(entry.error(
                            "is empty; it must name a directory",
                            format!("{STATE_DIR}=/run/cuslice/my-slice"),
                        ));
                    }
                    config.state_dir = Some(PathBuf::from(&entry.value));
                }
                Name::NodeDir => {
                    if entry.value.trim().is_empty() {
                        return Err(entry.error(
                            "is empty; it must name a directory",
                            format!("{NODE_DIR}=/dev/shm/cuslice"),
                        ));
                    }
                    config.node_dir = Some(PathBuf::from(&entry.value));
                }
                Name::Gpus(name) => {
                    let gpus = config.gpus.get_or_insert_with(Default::default);
                    let value = entry.value.trim().to_string();
                    match name {
                        DEVICE_NODES => gpus.nodes = Some(super::gpus::parse_nodes(entry)?),
                        NVIDIA_VISIBLE => gpus.nvidia_visible = Some(value),
                        _ => gpus.cuda_visible = Some(value),
                    }
                }
                Name::Log => config.log = parse_log(entry)?,
                Name::Priority => config.priority = parse_priority(entry)?,
                Name::MemoryWait => config.memory_wait = Some(parse_memory_wait(entry)?),
                Name::MemorySpill => config.memory_spill = Some(parse_memory_spill(entry)?),
                Name::MemoryFreezeIdle => {
                    config.memory_freeze_idle = Some(parse_memory_freeze_idle(entry)?)
                }
                Name::Retired => {
                    return Err(entry.error(
                        "is no longer read: every slice's device time is its turns' time, \
                         whatever the driver gives (docs/compute.md); remove it",
                        "CUSLICE_CORE_LIMIT=30",
                    ));
                }
                Name::AliyunContainer => aliyun_container = Some(entry),
                Name::AliyunUnit => aliyun_unit = Some(entry),
                Name::UnknownCuslice => {
                    let example = match suggest(&entry.name) {
                        Some(name) => format!("{name}={}", cut(entry.value.trim())),
                        // The problem already lists the known names.
                        None => "CUSLICE_MEMORY_LIMIT=4GiB".to_string(),
                    };
                    return Err(entry.error(
                        format!("is an unknown cuslice variable (known: {KNOWN_CUSLICE})"),
                        example,
                    ));
                }
                Name::NearMiss => {
                    let meant = near_miss(&entry.name).unwrap_or_default();
                    let (problem, example) = if classify(&meant) == Name::UnknownCuslice {
                        (
                            format!(
                                "is not a cuslice variable; cuslice's names are upper case, with \
                                 underscores (known: {KNOWN_CUSLICE})"
                            ),
                            "CUSLICE_MEMORY_LIMIT=4GiB".to_string(),
                        )
                    } else {
                        (
                            format!(
                                "is not a cuslice variable, so it would do nothing; {meant} is \
                                 (names are upper case, with underscores)"
                            ),
                            format!("{meant}={}", cut(entry.value.trim())),
                        )
                    };
                    return Err(entry.error(problem, example));
                }
                Name::Other => {
                    if let Some(line) = entry.line {
                        config.notices.push(format!(
                            "hook file line {line}: {} is not a cuslice setting; ignored",
                            cut(&entry.name)
                        ));
                    }
                }
            }
        }

        match (aliyun_container, aliyun_unit) {
            (Some(container), unit) => {
                let (shift, unit_name, shown) = match unit {
                    Some(unit) => {
                        let shift = parse_aliyun_unit(unit)?;
                        let name = if shift == 30 { "GiB" } else { "MiB" };
                        let shown = format!(" ({ALIYUN_UNIT}={})", cut(unit.value.trim()));
                        (shift, name, shown)
                    }
                    None => (30, "GiB", String::new()),
                };
                let bytes = parse_aliyun_container(container, shift, unit_name)?;
                config.settings.push(Setting {
                    quantity: Quantity::Memory,
                    family: Family::Aliyun,
                    ordinal: None,
                    value: bytes,
                    variable: container.name.clone(),
                    written: container.value.trim().to_string(),
                    shown: format!("{}={}{shown}", container.name, cut(container.value.trim())),
                    line: container.line,
                });
            }
            (None, Some(unit)) => config.notices.push(format!(
                "{}={} is ignored without {ALIYUN_CONTAINER}",
                unit.name,
                cut(unit.value.trim())
            )),
            (None, None) => {}
        }

        config.check_requests()?;
        config.push_conflict_notices();
        config.notices = config.notices.iter().map(|n| one_line(n)).collect();
        Ok(config)
    }
}
