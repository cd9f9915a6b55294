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
//! `CUSLICE_MEMORY_WAIT` (a duration, see [`crate::duration`]) and `CUSLICE_MEMORY_SPILL` (a
//! size): what an allocation does at the cap, on every device, `CUSLICE_MEMORY_FREEZE_IDLE` (a
//! duration of at least 1s: an idle process's device memory goes to the host), `CUSLICE_STATE_DIR`, `CUSLICE_LOG`; HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` (`4g`, `512m`,
//! bytes) and `CUDA_DEVICE_SM_LIMIT[_<i>]` (percent, 0 = no limit); Alibaba cGPU's
//! `ALIYUN_COM_GPU_MEM_CONTAINER` (in `ALIYUN_COM_GPU_MEM_UNIT`, default GiB). `<i>` is a device
//! ordinal as the process sees it (after `CUDA_VISIBLE_DEVICES`), 0 to 63, written without
//! leading zeros. Anything else is ignored, except an unknown name starting with `CUSLICE_` and a
//! near miss of one of cuslice's names (`cuslice_memory_limit`, `CUSLICE-CORE-LIMIT`,
//! `CUSLCE_MEMORY_LIMIT`; [`names::near_miss`]): those are errors, because a typo would otherwise
//! mean "no limit". Sizes take binary units only: a decimal one (`1.5GB`) is an error that
//! shows the binary spelling ([`crate::size`]).
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
//!
//! **Modules.** [`names`]: which names are cuslice's, per-device suffixes, typo suggestions;
//! `parse`: one parser per variable family and the assembly of a [`Config`] from `NAME=VALUE`
//! pairs; `precedence`: which setting wins for a device and quantity, and the notices and
//! errors that follow; [`hook_file`]: the hook file's format (writing, reading, rewriting);
//! [`live`]: values for limits changed while a slice runs.

use std::fmt;
use std::path::PathBuf;

use crate::echo::{cut, one_line, quoted};
use crate::priority::Priority;

pub mod gpus;
pub mod hook_file;
pub mod live;
pub mod names;
mod parse;
mod precedence;
#[cfg(test)]
mod tests;

pub use names::{MAX_ORDINAL, is_placement, is_setting};
pub use parse::MAX_MEMORY_LIMIT;

use names::{Name, Quantity, classify};
use parse::{Entry, dedupe};
use precedence::Setting;

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
    /// `CUSLICE_MEMORY_WAIT`: how long an allocation that would pass the cap waits for the
    /// slice's own frees before it is refused (None: refused at once).
    pub memory_wait: Option<std::time::Duration>,
    /// `CUSLICE_MEMORY_SPILL`: bytes per device the slice may hold past its cap in host memory
    /// (managed memory that prefers the host), charged apart from device memory.
    pub memory_spill: Option<u64>,
    /// `CUSLICE_MEMORY_FREEZE_IDLE`: how long a process goes without a CUDA call before its
    /// device memory is frozen to the host (None: never).
    pub memory_freeze_idle: Option<std::time::Duration>,
    /// The container's GPUs as the hook recorded them ([`gpus`]): where set, per-device
    /// settings number the container's GPUs, not the process's.
    gpus: Option<gpus::Gpus>,
    /// One-line messages worth reporting: conflicting aliases, ignored settings.
    pub notices: Vec<String>,
    /// Every limit that some variable sets, winners and losers alike.
    settings: Vec<Setting>,
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

    /// The variable that sets device `ordinal`'s memory cap, as written (`NAME=VALUE`), for
    /// messages about the cap.
    pub fn memory_setting(&self, ordinal: u32) -> Option<&str> {
        self.winner(Quantity::Memory, Some(ordinal))
            .map(|s| s.shown.as_str())
    }

    /// Checks that every per-device variable names a device there is: `count` devices, ordinals
    /// 0 to `count - 1`, as `seen` says (`"this process sees"`, `"the container has"`). A
    /// setting for a device that is not there would apply to nothing, and the device the user
    /// meant would run without it; so it is an error, naming the variable and an example.
    pub fn check_device_count(&self, count: u32, seen: &str) -> Result<(), ConfigError> {
        let Some(s) = self
            .settings
            .iter()
            .filter(|s| s.ordinal.is_some_and(|o| o >= count))
            .min_by_key(|s| (s.ordinal, s.line, s.variable.clone()))
        else {
            return Ok(());
        };
        let ordinal = s.ordinal.unwrap_or_default();
        let base = s
            .variable
            .strip_suffix(&format!("_{ordinal}"))
            .unwrap_or(&s.variable);
        let (there, example) = match count {
            0 => (
                "no CUDA device".to_string(),
                format!("{base}={}", cut(&s.written)),
            ),
            1 => (
                "1 CUDA device (device 0)".to_string(),
                format!(
                    "{base}_0={v} (device 0) or {base}={v} (every device)",
                    v = cut(&s.written)
                ),
            ),
            n => (
                format!("{n} CUDA devices (0 to {})", n - 1),
                format!(
                    "{base}_{}={v} (device {}) or {base}={v} (every device)",
                    n - 1,
                    n - 1,
                    v = cut(&s.written)
                ),
            ),
        };
        Err(ConfigError {
            line: s.line,
            variable: s.variable.clone(),
            value: s.written.clone(),
            problem: format!(
                "names device {ordinal}, but {seen} {there}, so it would apply to none"
            ),
            example,
        })
    }

    /// Device ordinals that per-device variables name, ascending, each once.
    pub fn mentioned_ordinals(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.settings.iter().filter_map(|s| s.ordinal).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}
