//! The interposer's configuration: memory and core limits per device, the state directory and the
//! log level, read once per process.
//!
//! **Sources.** Exactly one of:
//! - the hook file written by `cuslice-hook`, lines of `NAME=VALUE` (blank lines and `#` comments
//!   ignored, whitespace around name and value trimmed). When it exists it is the only source; the
//!   one exception is `CUSLICE_LOG` from the environment, used when the file does not set it, so
//!   that a user can turn logging up inside a hooked container;
//! - the process environment.
//!
//! **Variables.** `CUSLICE_MEMORY_LIMIT[_<i>]` (a size, see [`crate::size`]),
//! `CUSLICE_CORE_LIMIT[_<i>]` and `CUSLICE_CORE_REQUEST[_<i>]` (percent, 1 to 100),
//! `CUSLICE_PRIORITY` (`high`, `normal` or `low`, all devices; see [`crate::priority`]),
//! `CUSLICE_STATE_DIR`, `CUSLICE_LOG`; HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` (`4g`, `512m`,
//! bytes) and `CUDA_DEVICE_SM_LIMIT[_<i>]` (percent, 0 = no limit); Alibaba cGPU's
//! `ALIYUN_COM_GPU_MEM_CONTAINER` (in `ALIYUN_COM_GPU_MEM_UNIT`, default GiB). `<i>` is a device
//! ordinal as the process sees it (after `CUDA_VISIBLE_DEVICES`), 0 to 63, written without
//! leading zeros. Anything else is ignored, except an unknown name starting with `CUSLICE_`: that
//! is an error, because a typo such as `CUSLICE_MEMORY_LIMT` would otherwise mean "no limit".
//!
//! **Precedence**, for each device and each quantity (memory, core limit, core request):
//! cuslice per-device > cuslice all-devices > HAMi per-device > HAMi all-devices > cGPU (memory
//! only). A lower-precedence family that sets a different value for the same device and quantity
//! yields a [`Config::notices`] line; it is never silently merged. Every variable is validated,
//! including ones that lose.
//!
//! **Notices** ([`Config::notices`], one line each) also report settings that are ignored: a
//! hook-file line whose name is not cuslice's, environment settings shadowed by the hook file,
//! `ALIYUN_COM_GPU_MEM_UNIT` without `ALIYUN_COM_GPU_MEM_CONTAINER`.
//!
//! **Errors** are [`ConfigError`]s: one line naming the variable, its value, what is wrong and an
//! example that works. An empty value is an error, not "unset" (a template that expanded to
//! nothing must not mean "no limit"); so is a name set twice with different values, and a core
//! request above the core limit of the same device.

use std::fmt;
use std::path::PathBuf;

use crate::echo::{cut, quoted};
use crate::priority::Priority;
use crate::size::{Reason, parse_size};

/// The highest device ordinal a per-device variable (`..._<i>`) may name.
pub const MAX_ORDINAL: u32 = 63;

/// The largest memory limit: 1 PiB, more than any device holds. A limit above it (say
/// 18446744073709551615 bytes) would be no limit at all, so it is refused like any other bad
/// value.
pub const MAX_MEMORY_LIMIT: u64 = 1 << 50;

const TOO_LARGE: &str = "is too large: a memory limit is at most 1 PiB (1125899906842624 bytes), more than any device holds";

/// How much the interposer writes to stderr. Ordered: `Error < Warn < Info < Debug`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    #[default]
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    /// `error`, `warn`, `info` or `debug`, case-insensitive, surrounding whitespace ignored.
    pub fn parse(s: &str) -> Option<LogLevel> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "error" => LogLevel::Error,
            "warn" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The effective limits for one device. `None` means not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes, more than 0.
    pub memory: Option<u64>,
    /// Percent of device time, 1 to 100.
    pub core_limit: Option<u32>,
    /// Guaranteed percent under contention, 1 to 100, never more than `core_limit`.
    pub core_request: Option<u32>,
}

/// A configuration value that cannot be used. `Display` is one line: the variable, its value, what
/// is wrong and an example that would work (the caller prefixes `cuslice: `), e.g.
/// `CUSLICE_MEMORY_LIMIT="12XB" is not a size (unknown unit); write e.g.
/// CUSLICE_MEMORY_LIMIT=4GiB (...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The hook-file line (1-based) the value came from; `None` for the environment.
    pub line: Option<usize>,
    /// The variable's name; empty for a hook-file line that has no usable name.
    pub variable: String,
    /// The value as written (for a malformed hook-file line, the whole line).
    pub value: String,
    /// What is wrong, starting with a verb: `is not a size (unknown unit)`.
    pub problem: String,
    /// A `NAME=VALUE` that would work, possibly with a short parenthesised explanation.
    pub example: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "hook file line {line}: ")?;
        }
        if !self.variable.is_empty() {
            write!(f, "{}=", one_line(&cut(&self.variable)))?;
        }
        // `quoted` escapes any newline or control character in the value, and cuts a long one
        // short; values the problem and the example show are cut where they are made.
        write!(
            f,
            "{} {}; write e.g. {}",
            quoted(&self.value),
            one_line(&self.problem),
            one_line(&self.example)
        )
    }
}

impl std::error::Error for ConfigError {}

/// Escapes control characters so that a message stays on one line whatever a name contains.
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The interposer's configuration. Build it with [`Config::from_vars`] or
/// [`Config::from_hook_file`]; `Config::default()` is "no limits, log errors only".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub log: LogLevel,
    /// `CUSLICE_STATE_DIR` as given (standalone mode); never empty.
    pub state_dir: Option<PathBuf>,
    /// `CUSLICE_NODE_DIR`: where the node's compute board (one place per slice) lives,
    /// when not the default.
    pub node_dir: Option<PathBuf>,
    /// `CUSLICE_PRIORITY`: the slice's priority on its devices (default normal).
    pub priority: Priority,
    /// One-line messages worth reporting: conflicting aliases, ignored settings.
    pub notices: Vec<String>,
    /// Every limit that some variable sets, winners and losers alike.
    settings: Vec<Setting>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantity {
    Memory,
    CoreLimit,
    CoreRequest,
}

const QUANTITIES: [Quantity; 3] = [Quantity::Memory, Quantity::CoreLimit, Quantity::CoreRequest];

/// The families of variables, in precedence order (earlier wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    Cuslice,
    Hami,
    Aliyun,
}

const FAMILIES: [Family; 3] = [Family::Cuslice, Family::Hami, Family::Aliyun];

/// One limit set by one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    quantity: Quantity,
    family: Family,
    /// `Some(i)` for a per-device variable, `None` for all devices.
    ordinal: Option<u32>,
    /// Bytes for memory, percent for the core quantities.
    value: u64,
    /// The variable's name, for messages.
    variable: String,
    /// The value as written (trimmed), for errors.
    written: String,
    /// `NAME=VALUE` as written, for notices.
    shown: String,
    /// The hook-file line, for errors.
    line: Option<usize>,
}

impl Setting {
    /// Lower wins: the family first, then per-device before all-devices.
    fn rank(&self) -> (Family, bool) {
        (self.family, self.ordinal.is_none())
    }

    fn applies_to(&self, quantity: Quantity, scope: Option<u32>) -> bool {
        self.quantity == quantity && (self.ordinal.is_none() || self.ordinal == scope)
    }
}

/// How a limit variable's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// [`parse_size`], more than 0.
    Size,
    /// 1 to 100, optionally followed by `%`.
    Percent,
    /// HAMi-core: digits with an optional `k`, `m` or `g`, more than 0.
    HamiSize,
    /// HAMi-core: 0 to 100, 0 meaning no limit.
    HamiPercent,
}

/// Limit variables that take an optional `_<i>` suffix.
#[rustfmt::skip]
const LIMIT_BASES: [(&str, Family, Quantity, Syntax); 5] = [
    ("CUSLICE_MEMORY_LIMIT", Family::Cuslice, Quantity::Memory, Syntax::Size),
    ("CUSLICE_CORE_LIMIT", Family::Cuslice, Quantity::CoreLimit, Syntax::Percent),
    ("CUSLICE_CORE_REQUEST", Family::Cuslice, Quantity::CoreRequest, Syntax::Percent),
    ("CUDA_DEVICE_MEMORY_LIMIT", Family::Hami, Quantity::Memory, Syntax::HamiSize),
    ("CUDA_DEVICE_SM_LIMIT", Family::Hami, Quantity::CoreLimit, Syntax::HamiPercent),
];

const STATE_DIR: &str = "CUSLICE_STATE_DIR";
const NODE_DIR: &str = "CUSLICE_NODE_DIR";
const LOG: &str = "CUSLICE_LOG";
const PRIORITY: &str = "CUSLICE_PRIORITY";
const ALIYUN_CONTAINER: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
const ALIYUN_UNIT: &str = "ALIYUN_COM_GPU_MEM_UNIT";

/// `CUSLICE_` names that belong to other parts of the project (build and test tooling), not to
/// the interposer, so they are neither settings nor typos.
const OTHER_CUSLICE_NAMES: [&str; 1] = ["CUSLICE_CUDA_HEADERS"];

const KNOWN_CUSLICE: &str = "CUSLICE_MEMORY_LIMIT[_<i>], CUSLICE_CORE_LIMIT[_<i>], \
                             CUSLICE_CORE_REQUEST[_<i>], CUSLICE_PRIORITY, CUSLICE_STATE_DIR, \
                             CUSLICE_NODE_DIR, CUSLICE_LOG";

/// What a variable name means to cuslice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name<'a> {
    Limit {
        family: Family,
        quantity: Quantity,
        syntax: Syntax,
        ordinal: Option<u32>,
    },
    /// `<base>_<suffix>` where the suffix is not an ordinal 0..=63.
    BadOrdinal {
        base: &'static str,
        suffix: &'a str,
    },
    StateDir,
    NodeDir,
    Log,
    Priority,
    AliyunContainer,
    AliyunUnit,
    UnknownCuslice,
    /// Not ours.
    Other,
}

fn classify(name: &str) -> Name<'_> {
    for (base, family, quantity, syntax) in LIMIT_BASES {
        let Some(rest) = name.strip_prefix(base) else {
            continue;
        };
        if rest.is_empty() {
            return Name::Limit {
                family,
                quantity,
                syntax,
                ordinal: None,
            };
        }
        if let Some(suffix) = rest.strip_prefix('_') {
            return match parse_ordinal(suffix) {
                Some(ordinal) => Name::Limit {
                    family,
                    quantity,
                    syntax,
                    ordinal: Some(ordinal),
                },
                None => Name::BadOrdinal { base, suffix },
            };
        }
    }
    match name {
        STATE_DIR => Name::StateDir,
        NODE_DIR => Name::NodeDir,
        LOG => Name::Log,
        PRIORITY => Name::Priority,
        ALIYUN_CONTAINER => Name::AliyunContainer,
        ALIYUN_UNIT => Name::AliyunUnit,
        _ if OTHER_CUSLICE_NAMES.contains(&name) => Name::Other,
        _ if name.starts_with("CUSLICE_") => Name::UnknownCuslice,
        _ => Name::Other,
    }
}

/// Whether `name` is a variable cuslice reads (its own `CUSLICE_*` names, known or not, and the
/// HAMi-core and Alibaba cGPU aliases): what the OCI hook looks for in a container's environment.
pub fn is_setting(name: &str) -> bool {
    classify(name) != Name::Other
}

/// Whether `name` is chosen by whoever runs the process rather than by the slice's owner
/// (`CUSLICE_STATE_DIR`, `CUSLICE_NODE_DIR`): in a container the hook decides these.
pub fn is_placement(name: &str) -> bool {
    matches!(classify(name), Name::StateDir | Name::NodeDir)
}

/// A device ordinal as a per-device suffix: decimal, 0 to 63, no sign, no leading zero (so that
/// `_1` and `_01` cannot both name device 1).
fn parse_ordinal(suffix: &str) -> Option<u32> {
    if suffix.is_empty()
        || suffix.len() > 2
        || !suffix.bytes().all(|b| b.is_ascii_digit())
        || (suffix.len() > 1 && suffix.starts_with('0'))
    {
        return None;
    }
    suffix.parse().ok().filter(|&i| i <= MAX_ORDINAL)
}

/// One `NAME=VALUE` pair and where it came from.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    value: String,
    line: Option<usize>,
}

impl Entry {
    fn error(&self, problem: impl Into<String>, example: impl Into<String>) -> ConfigError {
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
const EMPTY: &str = "is empty (to set no limit, leave the variable out)";

const SIZE_UNITS: &str = "units: KiB MiB GiB TiB, or k m g, or plain bytes";

fn parse_cuslice_memory(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!("{}=4GiB ({SIZE_UNITS})", entry.name);
    match parse_size(&entry.value) {
        Ok(0) => Err(entry.error("is 0; a memory limit must be more than 0", example)),
        Ok(bytes) if bytes > MAX_MEMORY_LIMIT => Err(entry.error(TOO_LARGE, example)),
        Ok(bytes) => Ok(bytes),
        Err(e) if e.reason == Reason::Empty => Err(entry.error(EMPTY, example)),
        Err(e) if e.reason == Reason::TooLarge => Err(entry.error(TOO_LARGE, example)),
        Err(e) => Err(entry.error(format!("is not a size ({})", e.reason), example)),
    }
}

/// A whole number, as written after trimming; `Err` carries the problem.
fn parse_whole(s: &str, what: &str) -> Result<u64, String> {
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
fn parse_cuslice_percent(entry: &Entry) -> Result<u64, ConfigError> {
    let example = format!("{}=50 (a whole percent from 1 to 100)", entry.name);
    let trimmed = entry.value.trim();
    let number = trimmed.strip_suffix('%').map_or(trimmed, |s| s.trim_end());
    if number.is_empty() && !trimmed.is_empty() {
        return Err(entry.error("is not a whole percent from 1 to 100", example));
    }
    match parse_whole(number, "a whole percent from 1 to 100") {
        Ok(p @ 1..=100) => Ok(p),
        Ok(_) => Err(entry.error("is out of range; it must be from 1 to 100", example)),
        Err(problem) => Err(entry.error(problem, example)),
    }
}

/// HAMi-core's memory limit: digits with an optional `k`, `m` or `g` (either case, 1024-based).
fn parse_hami_memory(entry: &Entry) -> Result<u64, ConfigError> {
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
fn parse_hami_sm(entry: &Entry) -> Result<Option<u64>, ConfigError> {
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
fn parse_aliyun_unit(entry: &Entry) -> Result<u32, ConfigError> {
    let example = format!("{ALIYUN_UNIT}=GiB (GiB, G, MiB or M)");
    match entry.value.trim().to_ascii_lowercase().as_str() {
        "gib" | "g" => Ok(30),
        "mib" | "m" => Ok(20),
        "" => Err(entry.error(EMPTY, example)),
        _ => Err(entry.error("is not a unit cGPU knows", example)),
    }
}

fn parse_aliyun_container(entry: &Entry, shift: u32, unit: &str) -> Result<u64, ConfigError> {
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

fn parse_priority(entry: &Entry) -> Result<Priority, ConfigError> {
    Priority::parse(&entry.value).ok_or_else(|| {
        entry.error(
            "is not a priority (high, normal or low)",
            format!("{PRIORITY}=high"),
        )
    })
}

fn parse_log(entry: &Entry) -> Result<LogLevel, ConfigError> {
    LogLevel::parse(&entry.value).ok_or_else(|| {
        entry.error(
            "is not a log level (error, warn, info or debug)",
            format!("{LOG}=info"),
        )
    })
}

/// Edit distance, for suggesting the variable a typo meant.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// The known cuslice name closest to `name`, if it is close enough to be a typo of it.
fn suggest(name: &str) -> Option<String> {
    let mut candidates: Vec<String> = LIMIT_BASES
        .iter()
        .filter(|(base, ..)| base.starts_with("CUSLICE_"))
        .map(|(base, ..)| base.to_string())
        .chain([STATE_DIR, NODE_DIR, LOG, PRIORITY].map(String::from))
        .collect();
    // A typo in a per-device name keeps its ordinal: CUSLICE_MEMORY_LIMT_1 suggests
    // CUSLICE_MEMORY_LIMIT_1.
    let ordinal = name.rsplit_once('_').and_then(|(_, s)| parse_ordinal(s));
    if let Some(ordinal) = ordinal {
        let per_device: Vec<String> = LIMIT_BASES
            .iter()
            .filter(|(base, ..)| base.starts_with("CUSLICE_"))
            .map(|(base, ..)| format!("{base}_{ordinal}"))
            .collect();
        candidates.extend(per_device);
    }
    // Close enough: up to a third of the part after `CUSLICE_`, at least 1 and at most 3 edits
    // (so `CUSLICE_LOGS` suggests `CUSLICE_LOG`, but `CUSLICE_FOO` suggests nothing).
    candidates
        .into_iter()
        .map(|c| (levenshtein(name, &c), c))
        .filter(|(distance, c)| *distance <= ((c.len() - "CUSLICE_".len()) / 3).clamp(1, 3))
        .min()
        .map(|(_, c)| c)
}

/// Checks that no name appears twice with different values and drops exact repeats.
fn dedupe(entries: Vec<Entry>) -> Result<Vec<Entry>, ConfigError> {
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
    /// Reads the configuration from `NAME=VALUE` pairs, normally the process environment.
    /// Names that are not cuslice's are ignored; unknown `CUSLICE_` names are an error.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut entries: Vec<Entry> = vars
            .into_iter()
            .filter(|(k, _)| classify(k.as_ref()) != Name::Other)
            .map(|(k, v)| Entry {
                name: k.as_ref().to_string(),
                value: v.as_ref().to_string(),
                line: None,
            })
            .collect();
        // The environment has no meaningful order; sort so the same environment always reports
        // the same first error.
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Config::build(dedupe(entries)?)
    }

    /// Reads the configuration from the hook file's text. The file is the only source: of `env`
    /// only `CUSLICE_LOG` is used, and only when the file does not set it. Settings in `env` that
    /// the file does not repeat with the same value are reported in [`Config::notices`].
    pub fn from_hook_file<I, K, V>(text: &str, env: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut entries = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let bad_line = |problem: &str| ConfigError {
                line: Some(line),
                variable: String::new(),
                value: trimmed.to_string(),
                problem: problem.to_string(),
                example: "CUSLICE_MEMORY_LIMIT=4GiB".to_string(),
            };
            let Some((name, value)) = trimmed.split_once('=') else {
                return Err(bad_line("is not NAME=VALUE"));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(bad_line("has no name before \"=\""));
            }
            entries.push(Entry {
                name: name.to_string(),
                value: value.trim().to_string(),
                line: Some(line),
            });
        }
        let entries = dedupe(entries)?;
        let file_sets_log = entries.iter().any(|e| e.name == LOG);

        let mut all = entries.clone();
        let mut ignored = Vec::new();
        for (name, value) in env {
            let (name, value) = (name.as_ref(), value.as_ref());
            if name == LOG {
                if !file_sets_log {
                    all.push(Entry {
                        name: name.to_string(),
                        value: value.to_string(),
                        line: None,
                    });
                }
            } else if classify(name) != Name::Other
                && !entries
                    .iter()
                    .any(|e| e.name == name && e.value == value.trim())
            {
                ignored.push(cut(name).into_owned());
            }
        }
        let mut config = Config::build(dedupe(all)?)?;
        if !ignored.is_empty() {
            ignored.sort();
            ignored.dedup();
            config.notices.push(one_line(&format!(
                "the hook file is the only source of settings; ignoring {} from the environment",
                ignored.join(", ")
            )));
        }
        Ok(config)
    }

    fn build(entries: Vec<Entry>) -> Result<Config, ConfigError> {
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
                Name::Log => config.log = parse_log(entry)?,
                Name::Priority => config.priority = parse_priority(entry)?,
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

    /// The device ordinals that some per-device variable names, ascending, preceded by `None`
    /// (every other device).
    fn scopes(&self) -> Vec<Option<u32>> {
        let mut ordinals: Vec<u32> = self.settings.iter().filter_map(|s| s.ordinal).collect();
        ordinals.sort_unstable();
        ordinals.dedup();
        std::iter::once(None)
            .chain(ordinals.into_iter().map(Some))
            .collect()
    }

    /// The setting that wins for `quantity` on the device `scope` (`None`: a device no
    /// per-device variable names).
    fn winner(&self, quantity: Quantity, scope: Option<u32>) -> Option<&Setting> {
        self.settings
            .iter()
            .filter(|s| s.applies_to(quantity, scope))
            .min_by_key(|s| s.rank())
    }

    fn check_requests(&self) -> Result<(), ConfigError> {
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

    fn push_conflict_notices(&mut self) {
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

    /// The effective limits for device `ordinal`, as the process numbers its devices (after
    /// `CUDA_VISIBLE_DEVICES`).
    pub fn limits(&self, ordinal: u32) -> Limits {
        let get = |quantity| self.winner(quantity, Some(ordinal)).map(|s| s.value);
        let percent = |quantity| get(quantity).map(|p| p as u32);
        Limits {
            memory: get(Quantity::Memory),
            core_limit: percent(Quantity::CoreLimit),
            core_request: percent(Quantity::CoreRequest),
        }
    }

    /// Whether some memory or core limit (or core request) is set for some device, or a priority
    /// other than normal. (`CUDA_DEVICE_SM_LIMIT=0` sets none: HAMi-core reads it as "no
    /// limit".)
    pub fn any_limit(&self) -> bool {
        !self.settings.is_empty() || self.priority != Priority::Normal
    }

    /// Device ordinals that per-device variables name, ascending, each once.
    pub fn mentioned_ordinals(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.settings.iter().filter_map(|s| s.ordinal).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

// ---- limits changed while a slice runs (`cuslice set`) ------------------------------------------

/// Which limit `cuslice set` changes, with the flag that names it on its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveLimit {
    Memory,
    CoreLimit,
    CoreRequest,
    Priority,
}

impl LiveLimit {
    pub fn flag(self) -> &'static str {
        match self {
            LiveLimit::Memory => "--memory-limit",
            LiveLimit::CoreLimit => "--core-limit",
            LiveLimit::CoreRequest => "--core-request",
            LiveLimit::Priority => "--priority",
        }
    }

    /// The all-devices variable the hook file gets for it.
    pub fn variable(self) -> &'static str {
        match self {
            LiveLimit::Memory => "CUSLICE_MEMORY_LIMIT",
            LiveLimit::CoreLimit => "CUSLICE_CORE_LIMIT",
            LiveLimit::CoreRequest => "CUSLICE_CORE_REQUEST",
            LiveLimit::Priority => "CUSLICE_PRIORITY",
        }
    }

    fn quantity(self) -> Option<Quantity> {
        match self {
            LiveLimit::Memory => Some(Quantity::Memory),
            LiveLimit::CoreLimit => Some(Quantity::CoreLimit),
            LiveLimit::CoreRequest => Some(Quantity::CoreRequest),
            LiveLimit::Priority => None,
        }
    }
}

/// A value given to `cuslice set`, checked as the variable it stands for would be: bytes for
/// memory, percent (1-100) for the core limit and request, `Priority::code` for the priority.
/// Err: one line naming the flag, the value, what is wrong and a value that would work.
pub fn parse_live(what: LiveLimit, value: &str) -> Result<u64, String> {
    if what == LiveLimit::Priority {
        return Priority::parse(value)
            .map(|p| u64::from(p.code()))
            .ok_or_else(|| {
                format!(
                    "--priority {} is not a priority (high, normal or low); write e.g. \
                     --priority high",
                    quoted(value)
                )
            });
    }
    let var = what.variable();
    match Config::from_vars([(var, value)]) {
        Ok(c) => {
            let l = c.limits(0);
            Ok(match what {
                LiveLimit::Memory => l.memory,
                LiveLimit::CoreLimit => l.core_limit.map(u64::from),
                LiveLimit::CoreRequest => l.core_request.map(u64::from),
                LiveLimit::Priority => None,
            }
            .unwrap_or(0))
        }
        Err(e) => {
            let example = e
                .example
                .split_once('=')
                .map_or(e.example.as_str(), |(_, v)| v);
            Err(one_line(&format!(
                "{} {} {}; write e.g. {} {}",
                what.flag(),
                quoted(value),
                e.problem,
                what.flag(),
                example
            )))
        }
    }
}

/// The hook file `text` with `changes` made: every line that sets one of the changed limits (for
/// any device, under any family's name) gives way to one `CUSLICE_*` line for all devices with
/// the new value. The result is checked as the interposer will read it (a core request above the
/// core limit is refused here). Pure: the caller writes the file.
pub fn rewrite_hook_file(
    text: &str,
    changes: &[(LiveLimit, String)],
) -> Result<String, ConfigError> {
    let sets_changed = |name: &str| match classify(name) {
        Name::Limit { quantity, .. } => changes.iter().any(|(w, _)| w.quantity() == Some(quantity)),
        Name::Priority => changes.iter().any(|(w, _)| *w == LiveLimit::Priority),
        Name::AliyunContainer | Name::AliyunUnit => {
            changes.iter().any(|(w, _)| *w == LiveLimit::Memory)
        }
        _ => false,
    };
    let mut out = String::new();
    for raw in text.lines() {
        let name = raw.trim().split_once('=').map(|(n, _)| n.trim());
        if name.is_some_and(|n| !raw.trim().starts_with('#') && sets_changed(n)) {
            continue;
        }
        out.push_str(raw);
        out.push('\n');
    }
    for (what, value) in changes {
        out.push_str(&format!("{}={}\n", what.variable(), value.trim()));
    }
    Config::from_hook_file(&out, std::iter::empty::<(&str, &str)>())?;
    Ok(out)
}

/// A device's core request and limit (ppm) after `cuslice set` changes `request` and/or `limit`
/// (percent) from `current` (ppm). Err: one line when the request would exceed the limit.
pub fn live_core(
    current: (u32, u32),
    request: Option<u32>,
    limit: Option<u32>,
) -> Result<(u32, u32), String> {
    const FULL: u32 = crate::share::FULL;
    let r = request.map_or(current.0, |p| p.min(100) * (FULL / 100));
    let l = limit.map_or(current.1, |p| p.min(100) * (FULL / 100));
    if r > l {
        let pct = |ppm: u32| ppm.div_ceil(FULL / 100);
        return Err(format!(
            "a core request of {}% above a core limit of {}% cannot be met; give --core-request \
             at most {} (or raise --core-limit with it)",
            pct(r),
            pct(l),
            pct(l)
        ));
    }
    Ok((r, l))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;

    /// Variables as a test writes them.
    type Vars<'a> = &'a [(&'a str, &'a str)];

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().copied())
            .unwrap_or_else(|e| panic!("{vars:?} should be accepted, got: {e}"))
    }

    /// The error for `vars`, checked to be one line that names the variable and value and shows
    /// an example.
    fn error(vars: &[(&str, &str)]) -> ConfigError {
        let Err(e) = Config::from_vars(vars.iter().copied()) else {
            panic!("{vars:?} should be rejected");
        };
        assert_well_formed(&e);
        e
    }

    fn assert_well_formed(e: &ConfigError) {
        let message = e.to_string();
        assert!(!message.contains('\n'), "not one line: {message}");
        assert!(
            message.contains(&format!("{}={}", cut(&e.variable), quoted(&e.value))),
            "variable and value missing: {message}"
        );
        assert!(message.contains("; write e.g. "), "no example: {message}");
        assert!(!e.example.is_empty() && !e.problem.is_empty(), "{e:?}");
    }

    fn limits(memory: Option<u64>, core_limit: Option<u32>, core_request: Option<u32>) -> Limits {
        Limits {
            memory,
            core_limit,
            core_request,
        }
    }

    #[test]
    fn nothing_set_means_no_limits() {
        let c = config(&[]);
        assert_eq!(c, Config::default());
        assert_eq!(c.log, LogLevel::Error);
        assert_eq!(c.state_dir, None);
        assert!(!c.any_limit());
        assert_eq!(c.limits(0), Limits::default());
        assert!(c.notices.is_empty());
    }

    #[test]
    fn names_that_are_not_ours_are_ignored() {
        let c = config(&[
            ("PATH", "/usr/bin"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x"),
            ("CUDA_DEVICE_MEMORY_LIMITX", "nonsense"),
            ("CUDA_DEVICE_SM_LIMITS", "nonsense"),
            ("ALIYUN_COM_GPU_MEM_DEV", "16"),
            ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ("cuslice_memory_limit", "nonsense"),
            ("CUSLICE_CUDA_HEADERS", "/opt/headers"),
            ("XCUSLICE_MEMORY_LIMIT", "nonsense"),
        ]);
        assert_eq!(c, Config::default());
    }

    #[test]
    #[rustfmt::skip]
    fn every_variable_sets_its_quantity() {
        let table: &[(Vars, u32, Limits)] = &[
            (&[("CUSLICE_MEMORY_LIMIT", "4GiB")], 0, limits(Some(4 * GIB), None, None)),
            (&[("CUSLICE_MEMORY_LIMIT", "4GiB")], 63, limits(Some(4 * GIB), None, None)),
            (&[("CUSLICE_MEMORY_LIMIT_2", "1GiB")], 2, limits(Some(GIB), None, None)),
            (&[("CUSLICE_MEMORY_LIMIT_2", "1GiB")], 1, limits(None, None, None)),
            (&[("CUSLICE_CORE_LIMIT", "50")], 5, limits(None, Some(50), None)),
            (&[("CUSLICE_CORE_LIMIT_5", "30")], 5, limits(None, Some(30), None)),
            (&[("CUSLICE_CORE_REQUEST", "20")], 0, limits(None, None, Some(20))),
            (&[("CUSLICE_CORE_REQUEST_63", "20")], 63, limits(None, None, Some(20))),
            (&[("CUDA_DEVICE_MEMORY_LIMIT", "2g")], 3, limits(Some(2 * GIB), None, None)),
            (&[("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")], 0, limits(Some(512 * MIB), None, None)),
            (&[("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")], 1, limits(None, None, None)),
            (&[("CUDA_DEVICE_SM_LIMIT", "40")], 0, limits(None, Some(40), None)),
            (&[("CUDA_DEVICE_SM_LIMIT_1", "40")], 1, limits(None, Some(40), None)),
            (&[("ALIYUN_COM_GPU_MEM_CONTAINER", "3")], 7, limits(Some(3 * GIB), None, None)),
            (
                &[("CUSLICE_MEMORY_LIMIT", "8GiB"), ("CUSLICE_CORE_LIMIT", "60"), ("CUSLICE_CORE_REQUEST", "25")],
                0,
                limits(Some(8 * GIB), Some(60), Some(25)),
            ),
        ];
        for (vars, ordinal, expected) in table {
            let c = config(vars);
            assert_eq!(c.limits(*ordinal), *expected, "{vars:?} on device {ordinal}");
            assert!(c.any_limit(), "{vars:?}");
            assert!(c.notices.is_empty(), "{vars:?}: {:?}", c.notices);
        }
    }

    #[test]
    fn sizes_and_percents_in_every_accepted_spelling() {
        let memory = |var: &str, value: &str| config(&[(var, value)]).limits(0).memory;
        for (value, bytes) in [
            ("4GiB", 4 * GIB),
            ("1.5GiB", 3 * GIB / 2),
            ("4g", 4 * GIB),
            ("4096m", 4 * GIB),
            ("512MiB", 512 * MIB),
            ("1073741824", GIB),
            (" 2 GiB ", 2 * GIB),
            ("1", 1),
        ] {
            assert_eq!(
                memory("CUSLICE_MEMORY_LIMIT", value),
                Some(bytes),
                "{value:?}"
            );
        }
        for (value, bytes) in [
            ("4g", 4 * GIB),
            ("4G", 4 * GIB),
            ("512m", 512 * MIB),
            ("512M", 512 * MIB),
            ("1024k", 1024 * KIB),
            ("3K", 3 * KIB),
            ("1073741824", GIB),
            (" 1g ", GIB),
        ] {
            assert_eq!(
                memory("CUDA_DEVICE_MEMORY_LIMIT", value),
                Some(bytes),
                "{value:?}"
            );
        }
        for (unit, value, bytes) in [
            (None, "2", 2 * GIB),
            (Some("GiB"), "2", 2 * GIB),
            (Some("gib"), "2", 2 * GIB),
            (Some("G"), "2", 2 * GIB),
            (Some("g"), "2", 2 * GIB),
            (Some("MiB"), "2048", 2 * GIB),
            (Some("MIB"), "300", 300 * MIB),
            (Some("M"), "300", 300 * MIB),
            (Some(" m "), " 300 ", 300 * MIB),
        ] {
            let mut vars = vec![("ALIYUN_COM_GPU_MEM_CONTAINER", value)];
            vars.extend(unit.map(|u| ("ALIYUN_COM_GPU_MEM_UNIT", u)));
            assert_eq!(config(&vars).limits(0).memory, Some(bytes), "{vars:?}");
        }
        for var in ["CUSLICE_CORE_LIMIT", "CUSLICE_CORE_REQUEST_3"] {
            for (value, percent) in [
                ("50", 50),
                ("50%", 50),
                (" 50 % ", 50),
                ("+50", 50),
                ("1", 1),
                ("100", 100),
                ("100%", 100),
            ] {
                let l = config(&[(var, value)]).limits(3);
                let got = if var.contains("REQUEST") {
                    l.core_request
                } else {
                    l.core_limit
                };
                assert_eq!(got, Some(percent), "{var}={value:?}");
            }
        }
        for (value, percent) in [("1", Some(1)), ("40", Some(40)), ("100", Some(100))] {
            let c = config(&[("CUDA_DEVICE_SM_LIMIT", value)]);
            assert_eq!(c.limits(0).core_limit, percent, "{value:?}");
        }
    }

    #[test]
    fn hami_sm_limit_zero_means_no_limit() {
        for var in ["CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT_0"] {
            let c = config(&[(var, "0")]);
            assert_eq!(c.limits(0), Limits::default());
            assert!(!c.any_limit());
        }
        // 0 is "not set", so the all-devices value applies to device 1 and nothing conflicts.
        let c = config(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
        ]);
        assert_eq!(c.limits(1).core_limit, Some(40));
        assert!(c.notices.is_empty());
    }

    #[test]
    fn per_device_names_take_ordinals_0_to_63() {
        for (suffix, ordinal) in [("0", 0), ("1", 1), ("9", 9), ("10", 10), ("63", 63)] {
            let c = config(&[(format!("CUSLICE_MEMORY_LIMIT_{suffix}").as_str(), "1GiB")]);
            assert_eq!(c.limits(ordinal).memory, Some(GIB), "{suffix}");
            assert_eq!(c.limits(ordinal + 1).memory, None, "{suffix}");
        }
        // A device past 63 can only have all-devices limits.
        let c = config(&[
            ("CUSLICE_MEMORY_LIMIT", "1GiB"),
            ("CUSLICE_MEMORY_LIMIT_3", "2GiB"),
        ]);
        assert_eq!(c.limits(64).memory, Some(GIB));
        assert_eq!(c.limits(u32::MAX).memory, Some(GIB));
        assert_eq!(c.limits(3).memory, Some(2 * GIB));
    }

    #[test]
    fn bad_device_indices_are_errors_for_every_family() {
        let bases = [
            "CUSLICE_MEMORY_LIMIT",
            "CUSLICE_CORE_LIMIT",
            "CUSLICE_CORE_REQUEST",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_SM_LIMIT",
        ];
        for base in bases {
            for suffix in [
                "x", "-1", "+1", "01", "00", "64", "100", " 1", "1x", "", "0_1",
            ] {
                let name = format!("{base}_{suffix}");
                let e = error(&[(name.as_str(), "50")]);
                assert_eq!(e.variable, name);
                assert!(e.problem.contains("device index"), "{e}");
                assert!(e.example.contains(&format!("{base}_0=50")), "{e}");
            }
        }
    }

    #[test]
    fn the_documented_error_line() {
        let e = error(&[("CUSLICE_MEMORY_LIMIT", "12XB")]);
        assert_eq!(
            e.to_string(),
            "CUSLICE_MEMORY_LIMIT=\"12XB\" is not a size (unknown unit); write e.g. \
             CUSLICE_MEMORY_LIMIT=4GiB (units: KiB MiB GiB TiB, or k m g, or plain bytes)"
        );
        assert_eq!(e.line, None);
    }

    #[test]
    #[rustfmt::skip]
    fn every_bad_value_is_an_error_naming_variable_value_and_example() {
        // (variable, value, part of the problem, part of the example)
        let table: &[(&str, &str, &str, &str)] = &[
            ("CUSLICE_MEMORY_LIMIT", "12XB", "unknown unit", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "0", "more than 0", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "0GiB", "more than 0", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "-1GiB", "negative", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "GiB", "number", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "1.5", "whole number of bytes", "=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "", "is empty", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT", "  ", "is empty", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMIT_1", "lots", "not a size", "CUSLICE_MEMORY_LIMIT_1=4GiB"),
            ("CUSLICE_CORE_LIMIT", "0", "from 1 to 100", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "0%", "from 1 to 100", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "101", "from 1 to 100", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "-5", "negative", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "50.5", "whole percent", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "half", "whole percent", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "%", "whole percent", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "50%%", "whole percent", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "", "is empty", "CUSLICE_CORE_LIMIT=50"),
            ("CUSLICE_CORE_LIMIT", "99999999999999999999999", "too large", "=50"),
            ("CUSLICE_CORE_LIMIT_2", "0.5", "whole percent", "CUSLICE_CORE_LIMIT_2=50"),
            ("CUSLICE_CORE_REQUEST", "0", "from 1 to 100", "CUSLICE_CORE_REQUEST=50"),
            ("CUSLICE_CORE_REQUEST", "200%", "from 1 to 100", "CUSLICE_CORE_REQUEST=50"),
            ("CUSLICE_CORE_REQUEST_4", "x", "whole percent", "CUSLICE_CORE_REQUEST_4=50"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "0", "more than 0", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "0g", "more than 0", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4gb", "whole number", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4GiB", "whole number", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1.5g", "whole number", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "-1g", "negative", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "g", "no number", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4t", "whole number", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "", "is empty", "CUDA_DEVICE_MEMORY_LIMIT=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "99999999999g", "too large", "=4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_3", "x", "whole number", "CUDA_DEVICE_MEMORY_LIMIT_3=4g"),
            ("CUDA_DEVICE_SM_LIMIT", "101", "from 0 to 100", "CUDA_DEVICE_SM_LIMIT=50"),
            ("CUDA_DEVICE_SM_LIMIT", "-1", "negative", "CUDA_DEVICE_SM_LIMIT=50"),
            ("CUDA_DEVICE_SM_LIMIT", "50%", "whole percent", "CUDA_DEVICE_SM_LIMIT=50"),
            ("CUDA_DEVICE_SM_LIMIT", "2.5", "whole percent", "CUDA_DEVICE_SM_LIMIT=50"),
            ("CUDA_DEVICE_SM_LIMIT", "", "is empty", "CUDA_DEVICE_SM_LIMIT=50"),
            ("CUDA_DEVICE_SM_LIMIT_0", "abc", "whole percent", "CUDA_DEVICE_SM_LIMIT_0=50"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "0", "more than 0", "CONTAINER=4"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "-2", "negative", "CONTAINER=4"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "1.5", "whole number of GiB", "CONTAINER=4"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4GiB", "whole number of GiB", "CONTAINER=4"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "", "is empty", "CONTAINER=4"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "99999999999999", "too large", "CONTAINER=4"),
            ("CUSLICE_LOG", "verbose", "error, warn, info or debug", "CUSLICE_LOG=info"),
            ("CUSLICE_LOG", "", "error, warn, info or debug", "CUSLICE_LOG=info"),
            ("CUSLICE_LOG", "3", "error, warn, info or debug", "CUSLICE_LOG=info"),
            ("CUSLICE_PRIORITY", "urgent", "high, normal or low", "CUSLICE_PRIORITY=high"),
            ("CUSLICE_PRIORITY", "", "high, normal or low", "CUSLICE_PRIORITY=high"),
            ("CUSLICE_PRIORTY", "high", "unknown cuslice variable", "CUSLICE_PRIORITY=high"),
            ("CUSLICE_STATE_DIR", "", "is empty", "CUSLICE_STATE_DIR=/"),
            ("CUSLICE_STATE_DIR", " ", "is empty", "CUSLICE_STATE_DIR=/"),
            ("CUSLICE_MEMORY_LIMT", "4GiB", "unknown cuslice variable", "=4GiB"),
            ("CUSLICE_FOO", "1", "unknown cuslice variable", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_", "1", "unknown cuslice variable", "CUSLICE_MEMORY_LIMIT=4GiB"),
        ];
        for &(variable, value, problem, example) in table {
            let e = error(&[(variable, value)]);
            assert_eq!((e.variable.as_str(), e.value.as_str()), (variable, value));
            assert!(e.problem.contains(problem), "{variable}={value:?}: {e}");
            assert!(e.example.contains(example), "{variable}={value:?}: {e}");
            assert!(e.to_string().contains(example), "{e}");
        }
    }

    #[test]
    fn priority_is_read_and_alone_makes_a_slice() {
        assert_eq!(config(&[]).priority, Priority::Normal);
        for (value, want) in [
            ("high", Priority::High),
            ("Low", Priority::Low),
            (" normal ", Priority::Normal),
        ] {
            let c = config(&[("CUSLICE_PRIORITY", value)]);
            assert_eq!(c.priority, want, "{value:?}");
            // A priority other than normal is a setting of its own: the process joins a slice.
            assert_eq!(c.any_limit(), want != Priority::Normal, "{value:?}");
        }
        let e = error(&[("CUSLICE_PRIORITY", "urgent")]);
        assert_eq!(
            e.to_string(),
            "CUSLICE_PRIORITY=\"urgent\" is not a priority (high, normal or low); write e.g. \
             CUSLICE_PRIORITY=high"
        );
    }

    #[test]
    fn aliyun_unit_is_checked_and_ignored_alone() {
        for unit in ["KiB", "GB", "bytes", "", "1"] {
            let e = error(&[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
                ("ALIYUN_COM_GPU_MEM_UNIT", unit),
            ]);
            assert_eq!(e.variable, "ALIYUN_COM_GPU_MEM_UNIT");
            assert!(e.example.contains("ALIYUN_COM_GPU_MEM_UNIT=GiB"), "{e}");
        }
        let e = error(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "x"),
            ("ALIYUN_COM_GPU_MEM_UNIT", "MiB"),
        ]);
        assert!(e.problem.contains("MiB"), "{e}");
        let c = config(&[("ALIYUN_COM_GPU_MEM_UNIT", "MiB")]);
        assert!(!c.any_limit());
        assert_eq!(
            c.notices,
            ["ALIYUN_COM_GPU_MEM_UNIT=MiB is ignored without ALIYUN_COM_GPU_MEM_CONTAINER"]
        );
        // Alone it is not even parsed.
        assert!(Config::from_vars([("ALIYUN_COM_GPU_MEM_UNIT", "parsecs")]).is_ok());
    }

    #[test]
    fn unknown_cuslice_names_suggest_the_intended_one() {
        for (typo, meant) in [
            ("CUSLICE_MEMORY_LIMT", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMITS", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_MEMORY_LIMT_1", "CUSLICE_MEMORY_LIMIT_1=4GiB"),
            ("CUSLICE_MEM_LIMIT", "CUSLICE_MEMORY_LIMIT=4GiB"),
            ("CUSLICE_CORE_LIMT", "CUSLICE_CORE_LIMIT=4GiB"),
            ("CUSLICE_CORE_REQUST_2", "CUSLICE_CORE_REQUEST_2=4GiB"),
            ("CUSLICE_LOGS", "CUSLICE_LOG=4GiB"),
            ("CUSLICE_STATEDIR", "CUSLICE_STATE_DIR=4GiB"),
        ] {
            let e = error(&[(typo, "4GiB")]);
            assert_eq!(e.example, meant, "{e}");
            assert!(e.problem.contains("CUSLICE_MEMORY_LIMIT[_<i>]"), "{e}");
            assert!(e.problem.contains("CUSLICE_LOG"), "{e}");
        }
        let e = error(&[("CUSLICE_SOMETHING_ELSE_ENTIRELY", "1")]);
        assert_eq!(e.example, "CUSLICE_MEMORY_LIMIT=4GiB", "{e}");
        // The known names once, in the problem.
        assert_eq!(e.to_string().matches("(known: ").count(), 1, "{e}");
    }

    #[test]
    fn losing_values_are_still_checked() {
        for vars in [
            &[
                ("CUSLICE_MEMORY_LIMIT", "1GiB"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ][..],
            &[
                ("CUSLICE_MEMORY_LIMIT", "1GiB"),
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "0"),
            ],
            &[
                ("CUSLICE_MEMORY_LIMIT_0", "1GiB"),
                ("CUSLICE_MEMORY_LIMIT", "0"),
            ],
            &[
                ("CUSLICE_CORE_LIMIT", "50"),
                ("CUDA_DEVICE_SM_LIMIT", "150"),
            ],
            &[
                ("CUSLICE_CORE_LIMIT_1", "50"),
                ("CUDA_DEVICE_SM_LIMIT_1", "x"),
            ],
        ] {
            let e = error(vars);
            assert_eq!(e.variable, vars[1].0, "{e}");
        }
    }

    #[test]
    fn precedence_steps_for_memory() {
        let all = [
            ("CUSLICE_MEMORY_LIMIT_1", "1GiB", GIB),
            ("CUSLICE_MEMORY_LIMIT", "2GiB", 2 * GIB),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g", 3 * GIB),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g", 4 * GIB),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "5", 5 * GIB),
        ];
        // With the first k sources removed, the next one wins on device 1.
        for k in 0..all.len() {
            let vars: Vec<(&str, &str)> = all[k..].iter().map(|&(n, v, _)| (n, v)).collect();
            let c = config(&vars);
            assert_eq!(c.limits(1).memory, Some(all[k].2), "{vars:?}");
        }
        // Device 0 has no per-device variable: the best all-devices one wins.
        let vars: Vec<(&str, &str)> = all.iter().map(|&(n, v, _)| (n, v)).collect();
        let c = config(&vars);
        assert_eq!(c.limits(0).memory, Some(2 * GIB));
        // Per-device HAMi beats all-devices HAMi and cGPU, but not all-devices cuslice.
        let c = config(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "5"),
        ]);
        assert_eq!(c.limits(1).memory, Some(3 * GIB));
        assert_eq!(c.limits(0).memory, Some(4 * GIB));
        let c = config(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
            ("CUSLICE_MEMORY_LIMIT", "2GiB"),
        ]);
        assert_eq!(c.limits(1).memory, Some(2 * GIB));
    }

    #[test]
    fn precedence_steps_for_cores() {
        let all = [
            ("CUSLICE_CORE_LIMIT_2", "10", 10),
            ("CUSLICE_CORE_LIMIT", "20", 20),
            ("CUDA_DEVICE_SM_LIMIT_2", "30", 30),
            ("CUDA_DEVICE_SM_LIMIT", "40", 40),
        ];
        for k in 0..all.len() {
            let vars: Vec<(&str, &str)> = all[k..].iter().map(|&(n, v, _)| (n, v)).collect();
            assert_eq!(
                config(&vars).limits(2).core_limit,
                Some(all[k].2),
                "{vars:?}"
            );
        }
        let c = config(&[
            ("CUSLICE_CORE_REQUEST_2", "10"),
            ("CUSLICE_CORE_REQUEST", "20"),
        ]);
        assert_eq!(c.limits(2).core_request, Some(10));
        assert_eq!(c.limits(0).core_request, Some(20));
        // cGPU sets memory only.
        let c = config(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "5"),
            ("CUSLICE_CORE_LIMIT", "50"),
        ]);
        assert_eq!(c.limits(0), limits(Some(5 * GIB), Some(50), None));
        assert!(c.notices.is_empty());
    }

    #[test]
    #[rustfmt::skip]
    fn core_request_above_its_limit_is_an_error() {
        // (variables, the variable blamed, the limit it is blamed against)
        let table: &[(Vars, &str, &str)] = &[
            (&[("CUSLICE_CORE_LIMIT", "30"), ("CUSLICE_CORE_REQUEST", "50")], "CUSLICE_CORE_REQUEST", "CUSLICE_CORE_LIMIT=30"),
            (&[("CUSLICE_CORE_LIMIT", "30%"), ("CUSLICE_CORE_REQUEST", "31%")], "CUSLICE_CORE_REQUEST", "CUSLICE_CORE_LIMIT=30%"),
            (&[("CUSLICE_CORE_LIMIT_1", "30"), ("CUSLICE_CORE_REQUEST_1", "50")], "CUSLICE_CORE_REQUEST_1", "CUSLICE_CORE_LIMIT_1=30"),
            // The all-devices request exceeds device 1's own limit.
            (&[("CUSLICE_CORE_LIMIT_1", "30"), ("CUSLICE_CORE_REQUEST", "50")], "CUSLICE_CORE_REQUEST", "CUSLICE_CORE_LIMIT_1=30"),
            // Device 1's request exceeds the all-devices limit.
            (&[("CUSLICE_CORE_LIMIT", "30"), ("CUSLICE_CORE_REQUEST_1", "50")], "CUSLICE_CORE_REQUEST_1", "CUSLICE_CORE_LIMIT=30"),
            // A HAMi limit bounds a cuslice request.
            (&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUSLICE_CORE_REQUEST", "50")], "CUSLICE_CORE_REQUEST", "CUDA_DEVICE_SM_LIMIT=30"),
            (&[("CUDA_DEVICE_SM_LIMIT_2", "30"), ("CUSLICE_CORE_REQUEST_2", "50")], "CUSLICE_CORE_REQUEST_2", "CUDA_DEVICE_SM_LIMIT_2=30"),
        ];
        for &(vars, variable, limit) in table {
            let e = error(vars);
            assert_eq!(e.variable, variable, "{e}");
            assert!(e.problem.contains(limit), "{e}");
            assert!(e.example.ends_with("=30"), "{e}");
        }
        let e = error(&[("CUSLICE_CORE_LIMIT_1", "30"), ("CUSLICE_CORE_REQUEST_1", "50")]);
        assert!(e.problem.contains("for device 1"), "{e}");
        let e = error(&[("CUSLICE_CORE_LIMIT", "30"), ("CUSLICE_CORE_REQUEST", "50")]);
        assert!(!e.problem.contains("device"), "{e}");
        for vars in [
            &[("CUSLICE_CORE_LIMIT", "30"), ("CUSLICE_CORE_REQUEST", "30")][..],
            &[("CUSLICE_CORE_REQUEST", "30")],
            &[("CUSLICE_CORE_LIMIT", "30"), ("CUSLICE_CORE_REQUEST_1", "50"), ("CUSLICE_CORE_LIMIT_1", "60")],
            &[("CUDA_DEVICE_SM_LIMIT", "0"), ("CUSLICE_CORE_REQUEST", "50")],
            // The cuslice limit wins over HAMi's lower one, so the request fits.
            &[("CUSLICE_CORE_LIMIT", "60"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUSLICE_CORE_REQUEST", "50")],
        ] {
            config(vars);
        }
    }

    #[test]
    #[rustfmt::skip]
    fn conflicting_aliases_yield_one_notice_each() {
        let table: &[(Vars, &[&str])] = &[
            (
                &[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g")],
                &["CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT"],
            ),
            // Equal values, however written, do not conflict.
            (
                &[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "1024m"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "1")],
                &[],
            ),
            (&[("CUSLICE_CORE_LIMIT", "50%"), ("CUDA_DEVICE_SM_LIMIT", "50")], &[]),
            // Per-device and all-devices in one family are not a conflict.
            (&[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUSLICE_MEMORY_LIMIT_0", "2GiB")], &[]),
            (&[("CUDA_DEVICE_SM_LIMIT", "10"), ("CUDA_DEVICE_SM_LIMIT_3", "20")], &[]),
            (
                &[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "2048"), ("ALIYUN_COM_GPU_MEM_UNIT", "MiB")],
                &["ALIYUN_COM_GPU_MEM_CONTAINER=2048 (ALIYUN_COM_GPU_MEM_UNIT=MiB) conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT"],
            ),
            (
                &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "2")],
                &["ALIYUN_COM_GPU_MEM_CONTAINER=2 conflicts with CUDA_DEVICE_MEMORY_LIMIT=1g; using CUDA_DEVICE_MEMORY_LIMIT"],
            ),
            // Each losing family is reported against the winner.
            (
                &[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "3")],
                &[
                    "CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT",
                    "ALIYUN_COM_GPU_MEM_CONTAINER=3 conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT",
                ],
            ),
            // Conflicts depend on the device; an identical one is reported once.
            (
                &[("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"), ("CUSLICE_CORE_LIMIT_2", "10")],
                &[
                    "CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT",
                    "CUDA_DEVICE_MEMORY_LIMIT_1=3g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT",
                ],
            ),
            // Only device 1 conflicts: elsewhere HAMi is alone.
            (
                &[("CUSLICE_MEMORY_LIMIT_1", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g")],
                &["CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT_1=1GiB; using CUSLICE_MEMORY_LIMIT_1"],
            ),
            // Device 1's HAMi value equals cuslice's, device 2's does not.
            (
                &[("CUSLICE_CORE_LIMIT", "50"), ("CUDA_DEVICE_SM_LIMIT_1", "50"), ("CUDA_DEVICE_SM_LIMIT_2", "70")],
                &["CUDA_DEVICE_SM_LIMIT_2=70 conflicts with CUSLICE_CORE_LIMIT=50; using CUSLICE_CORE_LIMIT"],
            ),
            // Requests have no alias, so they never conflict; memory comes before cores.
            (
                &[("CUSLICE_CORE_LIMIT", "50"), ("CUDA_DEVICE_SM_LIMIT", "70"), ("CUSLICE_MEMORY_LIMIT", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "3g"), ("CUSLICE_CORE_REQUEST", "10")],
                &[
                    "CUDA_DEVICE_MEMORY_LIMIT=3g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT",
                    "CUDA_DEVICE_SM_LIMIT=70 conflicts with CUSLICE_CORE_LIMIT=50; using CUSLICE_CORE_LIMIT",
                ],
            ),
        ];
        for &(vars, expected) in table {
            let c = config(vars);
            assert_eq!(c.notices, expected, "{vars:?}");
            assert!(c.notices.iter().all(|n| !n.contains('\n')), "{:?}", c.notices);
        }
    }

    #[test]
    fn log_level_and_state_dir() {
        for (value, level) in [
            ("error", LogLevel::Error),
            ("warn", LogLevel::Warn),
            ("INFO", LogLevel::Info),
            (" Debug ", LogLevel::Debug),
        ] {
            let c = config(&[("CUSLICE_LOG", value)]);
            assert_eq!(c.log, level, "{value:?}");
            assert!(!c.any_limit());
            assert_eq!(LogLevel::parse(level.as_str()), Some(level));
            assert_eq!(level.to_string(), level.as_str());
        }
        assert!(LogLevel::Error < LogLevel::Warn);
        assert!(LogLevel::Warn < LogLevel::Info);
        assert!(LogLevel::Info < LogLevel::Debug);
        assert_eq!(LogLevel::default(), LogLevel::Error);

        for dir in ["/run/cuslice/a", "relative/dir", "/with space/x"] {
            let c = config(&[("CUSLICE_STATE_DIR", dir)]);
            assert_eq!(c.state_dir, Some(PathBuf::from(dir)));
            assert!(!c.any_limit());
        }
    }

    #[test]
    fn the_same_name_twice() {
        let c = config(&[("CUSLICE_CORE_LIMIT", "50"), ("CUSLICE_CORE_LIMIT", "50")]);
        assert_eq!(c.limits(0).core_limit, Some(50));
        let e = error(&[("CUSLICE_CORE_LIMIT", "50"), ("CUSLICE_CORE_LIMIT", "60")]);
        assert!(e.problem.contains("twice"), "{e}");
    }

    #[test]
    fn errors_stay_on_one_line_whatever_the_input() {
        for (name, value) in [
            ("CUSLICE_MEMORY_LIMIT", "4\nXiB"),
            ("CUSLICE_LOG", "in\r\nfo"),
            ("CUSLICE_BAD\nNAME", "1"),
            ("CUSLICE_MEMORY_LIMIT_\n", "1\n"),
        ] {
            let e = Config::from_vars([(name, value)]).unwrap_err();
            assert!(!e.to_string().contains(['\n', '\r']), "{e}");
        }
        // Notices too: parse_size takes "1\nGiB" (whitespace before a unit), so it gets this far.
        let c = config(&[
            ("CUSLICE_MEMORY_LIMIT", "1\nGiB"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
        ]);
        assert_eq!(
            c.notices,
            [
                "CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1\\nGiB; using CUSLICE_MEMORY_LIMIT"
            ]
        );
        let c = hook("FOO\rBAR=1", &[("CUSLICE_X\nY", "1")]).unwrap();
        assert_eq!(c.notices.len(), 2);
        assert!(
            c.notices.iter().all(|n| !n.contains(['\n', '\r'])),
            "{:?}",
            c.notices
        );
    }

    // --- the hook file ---

    const NO_ENV: [(&str, &str); 0] = [];

    fn hook(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_hook_file(text, env.iter().copied())
    }

    #[test]
    fn hook_file_lines() {
        let text = "# written by cuslice-hook\n\
                    \n\
                    CUSLICE_MEMORY_LIMIT=4GiB\n\
                    \t  # an indented comment\n\
                    \x20 CUSLICE_CORE_LIMIT = 50 \r\n\
                    CUSLICE_STATE_DIR=/run/cuslice/abc\n\
                    CUSLICE_MEMORY_LIMIT_1=1GiB";
        let c = Config::from_hook_file(text, NO_ENV).unwrap();
        assert_eq!(c.limits(0), limits(Some(4 * GIB), Some(50), None));
        assert_eq!(c.limits(1), limits(Some(GIB), Some(50), None));
        assert_eq!(c.state_dir, Some(PathBuf::from("/run/cuslice/abc")));
        assert_eq!(c.log, LogLevel::Error);
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        assert_eq!(
            Config::from_hook_file("", NO_ENV).unwrap(),
            Config::default()
        );
        assert_eq!(
            Config::from_hook_file("# nothing\n\n", NO_ENV).unwrap(),
            Config::default()
        );
        // A value may itself contain '='.
        let c = Config::from_hook_file("CUSLICE_STATE_DIR=/a=b", NO_ENV).unwrap();
        assert_eq!(c.state_dir, Some(PathBuf::from("/a=b")));
    }

    #[test]
    fn hook_file_bad_lines_name_their_line() {
        for (text, line, problem) in [
            (
                "CUSLICE_MEMORY_LIMIT=4GiB\nnonsense\n",
                2,
                "is not NAME=VALUE",
            ),
            ("# c\n\n  =4GiB\n", 3, "has no name"),
            (
                "CUSLICE_LOG=info\nCUSLICE_MEMORY_LIMIT 4GiB",
                2,
                "is not NAME=VALUE",
            ),
        ] {
            let e = hook(text, &[]).unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert!(e.problem.contains(problem), "{e}");
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("hook file line {line}: \"")),
                "{message}"
            );
            assert!(
                message.contains("; write e.g. CUSLICE_MEMORY_LIMIT=4GiB"),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message}");
        }
        let e = hook("CUSLICE_CORE_LIMIT=50\n\nCUSLICE_MEMORY_LIMIT=12XB\n", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "hook file line 3: CUSLICE_MEMORY_LIMIT=\"12XB\" is not a size (unknown unit); write \
             e.g. CUSLICE_MEMORY_LIMIT=4GiB (units: KiB MiB GiB TiB, or k m g, or plain bytes)"
        );
        let e = hook("CUSLICE_MEMORY_LIMT=1GiB", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.variable.as_str()),
            (Some(1), "CUSLICE_MEMORY_LIMT")
        );
        let e = hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_REQUEST=30", &[]).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.problem.contains("CUSLICE_CORE_LIMIT=20"), "{e}");
        let e = hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_LIMIT=30", &[]).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.problem.contains("on line 1"), "{e}");
        assert_well_formed(&e);
        assert!(hook("CUSLICE_CORE_LIMIT=20\nCUSLICE_CORE_LIMIT=20", &[]).is_ok());
    }

    #[test]
    fn hook_file_is_the_only_source_but_for_cuslice_log() {
        let text = "CUSLICE_MEMORY_LIMIT=4GiB\n";
        let env = [
            ("CUSLICE_MEMORY_LIMIT", "1GiB"),
            ("CUSLICE_CORE_LIMIT", "10"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUSLICE_MEMORY_LIMT", "oops"),
            ("CUSLICE_MEMORY_LIMIT_x", "1GiB"),
            ("CUSLICE_STATE_DIR", ""),
            ("PATH", "/usr/bin"),
            ("CUSLICE_LOG", "debug"),
        ];
        let c = hook(text, &env).unwrap();
        assert_eq!(c.limits(0), limits(Some(4 * GIB), None, None));
        assert_eq!(c.state_dir, None);
        assert_eq!(c.log, LogLevel::Debug);
        assert_eq!(
            c.notices,
            [
                "the hook file is the only source of settings; ignoring CUDA_DEVICE_MEMORY_LIMIT, \
                 CUSLICE_CORE_LIMIT, CUSLICE_MEMORY_LIMIT, CUSLICE_MEMORY_LIMIT_x, \
                 CUSLICE_MEMORY_LIMT, CUSLICE_STATE_DIR from the environment"
            ]
        );

        // The file's CUSLICE_LOG wins; the environment's is then not even parsed.
        let c = hook("CUSLICE_LOG=warn", &[("CUSLICE_LOG", "nonsense")]).unwrap();
        assert_eq!(c.log, LogLevel::Warn);
        assert!(c.notices.is_empty());
        // Without one in the file, a bad CUSLICE_LOG in the environment is an error.
        let e = hook(text, &[("CUSLICE_LOG", "loud")]).unwrap_err();
        assert_eq!((e.line, e.variable.as_str()), (None, "CUSLICE_LOG"));
        assert_well_formed(&e);

        // Environment settings the file repeats exactly are not worth a notice.
        let c = hook(
            "CUSLICE_MEMORY_LIMIT = 4GiB\nCUDA_DEVICE_MEMORY_LIMIT=4g",
            &[
                ("CUSLICE_MEMORY_LIMIT", "4GiB"),
                ("CUDA_DEVICE_MEMORY_LIMIT", " 4g"),
            ],
        )
        .unwrap();
        assert!(c.notices.is_empty(), "{:?}", c.notices);
    }

    #[test]
    fn hook_file_names_that_are_not_ours_are_noticed() {
        let c = hook(
            "FOO=bar\nCUSLICE_CORE_LIMIT=50\nCUSLICE_CUDA_HEADERS=/x",
            &[],
        )
        .unwrap();
        assert_eq!(c.limits(0).core_limit, Some(50));
        assert_eq!(
            c.notices,
            [
                "hook file line 1: FOO is not a cuslice setting; ignored",
                "hook file line 3: CUSLICE_CUDA_HEADERS is not a cuslice setting; ignored",
            ]
        );
    }

    #[test]
    fn hook_file_uses_the_same_rules_as_the_environment() {
        let text = "CUSLICE_MEMORY_LIMIT=1GiB\nCUDA_DEVICE_MEMORY_LIMIT=2g\n\
                    CUDA_DEVICE_SM_LIMIT_1=30\nALIYUN_COM_GPU_MEM_CONTAINER=1";
        let c = Config::from_hook_file(text, NO_ENV).unwrap();
        assert_eq!(c.limits(1), limits(Some(GIB), Some(30), None));
        assert_eq!(
            c.notices,
            [
                "CUDA_DEVICE_MEMORY_LIMIT=2g conflicts with CUSLICE_MEMORY_LIMIT=1GiB; using CUSLICE_MEMORY_LIMIT"
            ]
        );
    }

    #[test]
    fn ordinal_suffixes() {
        assert_eq!(parse_ordinal("0"), Some(0));
        assert_eq!(parse_ordinal("63"), Some(63));
        for bad in ["", "64", "01", "-1", "+1", "x", "1 ", "999", "٣"] {
            assert_eq!(parse_ordinal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn edit_distance() {
        assert_eq!(levenshtein("", ""), 0);
        assert_eq!(levenshtein("abc", ""), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(
            levenshtein("CUSLICE_MEMORY_LIMT", "CUSLICE_MEMORY_LIMIT"),
            1
        );
    }

    #[test]
    fn live_values_are_checked_like_their_variables_and_named_by_their_flags() {
        assert_eq!(parse_live(LiveLimit::Memory, "2GiB"), Ok(2 * GIB));
        assert_eq!(parse_live(LiveLimit::CoreLimit, "60"), Ok(60));
        assert_eq!(parse_live(LiveLimit::CoreRequest, "25%"), Ok(25));
        let e = parse_live(LiveLimit::Memory, "12XB").unwrap_err();
        assert!(
            e.starts_with("--memory-limit \"12XB\" is not a size"),
            "{e}"
        );
        assert!(e.contains("write e.g. --memory-limit 4GiB"), "{e}");
        for bad in ["0", "101", "", "x"] {
            let e = parse_live(LiveLimit::CoreLimit, bad).unwrap_err();
            assert!(e.starts_with(&format!("--core-limit {bad:?}")), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_rewritten_hook_file_sets_each_changed_limit_once_for_every_device() {
        let text = "CUSLICE_MEMORY_LIMIT_0=1GiB\nCUDA_DEVICE_MEMORY_LIMIT=2g\n\
                    CUSLICE_CORE_LIMIT=30\nCUSLICE_STATE_DIR=/x\n# note\n";
        let new = rewrite_hook_file(text, &[(LiveLimit::Memory, "3GiB".into())]).unwrap();
        assert_eq!(
            new,
            "CUSLICE_CORE_LIMIT=30\nCUSLICE_STATE_DIR=/x\n# note\nCUSLICE_MEMORY_LIMIT=3GiB\n"
        );
        let c = Config::from_hook_file(&new, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.limits(0).memory, Some(3 * GIB));
        assert_eq!(c.limits(5).memory, Some(3 * GIB));
        // A request above the limit is refused, naming the line it would make.
        let e = rewrite_hook_file(text, &[(LiveLimit::CoreRequest, "40".into())]).unwrap_err();
        assert_eq!(e.variable, "CUSLICE_CORE_REQUEST", "{e}");
        let ok = rewrite_hook_file(
            text,
            &[
                (LiveLimit::CoreLimit, "60".into()),
                (LiveLimit::CoreRequest, "40".into()),
            ],
        )
        .unwrap();
        let c = Config::from_hook_file(&ok, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(
            (c.limits(0).core_limit, c.limits(0).core_request),
            (Some(60), Some(40))
        );
    }

    #[test]
    fn a_priority_set_live_replaces_the_hook_files_and_is_checked() {
        let text = "CUSLICE_PRIORITY=low\nCUSLICE_MEMORY_LIMIT=1GiB\n";
        let new = rewrite_hook_file(text, &[(LiveLimit::Priority, "high".into())]).unwrap();
        assert_eq!(new, "CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_PRIORITY=high\n");
        let c = Config::from_hook_file(&new, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.priority, Priority::High);
        assert_eq!(
            parse_live(LiveLimit::Priority, " Normal "),
            Ok(u64::from(Priority::Normal.code()))
        );
        let e = parse_live(LiveLimit::Priority, "urgent").unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("write e.g. --priority high"), "{e}");
    }

    #[test]
    fn live_core_keeps_what_is_not_changed_and_refuses_a_request_above_the_limit() {
        const P: u32 = crate::share::FULL / 100;
        assert_eq!(live_core((0, 30 * P), None, Some(60)), Ok((0, 60 * P)));
        assert_eq!(
            live_core((10 * P, 30 * P), Some(20), None),
            Ok((20 * P, 30 * P))
        );
        let e = live_core((10 * P, 30 * P), Some(40), None).unwrap_err();
        assert!(e.contains("at most 30"), "{e}");
        assert!(live_core((20 * P, 30 * P), None, Some(10)).is_err());
    }

    #[test]
    fn memory_limits_above_1_pib_are_refused_naming_the_maximum() {
        const PIB: u64 = 1 << 50;
        for (variable, value) in [
            ("CUSLICE_MEMORY_LIMIT", "1PiB"),
            ("CUSLICE_MEMORY_LIMIT", "1125899906842624"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1048576g"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "1048576"),
        ] {
            assert_eq!(
                config(&[(variable, value)]).limits(0).memory,
                Some(PIB),
                "{variable}={value}"
            );
        }
        for (variable, value) in [
            ("CUSLICE_MEMORY_LIMIT", "18446744073709551615"),
            ("CUSLICE_MEMORY_LIMIT", "1125899906842625"),
            ("CUSLICE_MEMORY_LIMIT", "1.5PiB"),
            ("CUSLICE_MEMORY_LIMIT_3", "16384PiB"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "18446744073709551615"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1048577g"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "1048577"),
        ] {
            let line = error(&[(variable, value)]).to_string();
            assert!(
                line.starts_with(&format!("{variable}={value:?} is too large")),
                "{line}"
            );
            assert!(line.contains("at most 1 PiB"), "{line}");
        }
        let line = error(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "1073741825"),
            ("ALIYUN_COM_GPU_MEM_UNIT", "MiB"),
        ])
        .to_string();
        assert!(line.contains("at most 1 PiB"), "{line}");
        let e = parse_live(LiveLimit::Memory, "18446744073709551615").unwrap_err();
        assert!(
            e.starts_with("--memory-limit \"18446744073709551615\" is too large"),
            "{e}"
        );
        assert!(e.contains("at most 1 PiB"), "{e}");
    }

    #[test]
    fn a_long_value_or_name_is_echoed_cut_short() {
        let long = format!("{}XB", "9".repeat(1 << 20));
        let cut = format!("\"{}\"… ({} bytes)", &long[..64], long.len());
        for variable in [
            "CUSLICE_MEMORY_LIMIT",
            "CUSLICE_CORE_LIMIT",
            "CUSLICE_CORE_REQUEST_2",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_SM_LIMIT",
            "ALIYUN_COM_GPU_MEM_CONTAINER",
            "CUSLICE_PRIORITY",
            "CUSLICE_LOG",
            "CUSLICE_MEMORY_LIMT",
            "CUSLICE_MEMORY_LIMIT_99",
        ] {
            let line = Config::from_vars([(variable, long.as_str())])
                .unwrap_err()
                .to_string();
            assert!(line.len() < 600, "{variable}: {} bytes", line.len());
            assert!(
                line.starts_with(&format!("{variable}={cut}")),
                "{variable}: {line}"
            );
        }
        // A long name, a long value set twice, a long value beside a core limit.
        let name = format!("CUSLICE_{}", "X".repeat(1 << 20));
        let line = Config::from_vars([(name.as_str(), "1")])
            .unwrap_err()
            .to_string();
        assert!(line.len() < 600, "{} bytes", line.len());
        let text = format!("CUSLICE_LOG=info\nCUSLICE_LOG={long}\n");
        let line = hook(&text, &[]).unwrap_err().to_string();
        assert!(line.len() < 600, "{} bytes", line.len());
        let padded = format!("{}50", "0".repeat(1 << 20));
        let line = Config::from_vars([
            ("CUSLICE_CORE_REQUEST", padded.as_str()),
            ("CUSLICE_CORE_LIMIT", "40"),
        ])
        .unwrap_err()
        .to_string();
        assert!(line.len() < 600, "{} bytes", line.len());
        let c = config(&[
            ("CUSLICE_CORE_LIMIT", padded.as_str()),
            ("CUDA_DEVICE_SM_LIMIT", "40"),
        ]);
        assert!(c.notices.iter().all(|n| n.len() < 600), "{:?}", c.notices);
        let e = parse_live(LiveLimit::Memory, &long).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(e.starts_with(&format!("--memory-limit {cut}")), "{e}");
        let e = parse_live(LiveLimit::Priority, &long).unwrap_err();
        assert!(e.starts_with(&format!("--priority {cut}")), "{e}");
    }
}
