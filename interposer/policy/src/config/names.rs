//! Variable names: which names are cuslice's (its own `CUSLICE_*`, HAMi-core's and Alibaba
//! cGPU's), the quantity and family each sets, per-device suffixes, and the suggestion for a
//! misspelt `CUSLICE_` name. Pure.

/// The highest device ordinal a per-device variable (`..._<i>`) may name.
pub const MAX_ORDINAL: u32 = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quantity {
    Memory,
    CoreLimit,
    CoreRequest,
}

pub(super) const QUANTITIES: [Quantity; 3] =
    [Quantity::Memory, Quantity::CoreLimit, Quantity::CoreRequest];

/// The families of variables, in precedence order (earlier wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Family {
    Cuslice,
    Hami,
    Aliyun,
}

pub(super) const FAMILIES: [Family; 3] = [Family::Cuslice, Family::Hami, Family::Aliyun];

/// How a limit variable's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Syntax {
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
pub(super) const LIMIT_BASES: [(&str, Family, Quantity, Syntax); 5] = [
    ("CUSLICE_MEMORY_LIMIT", Family::Cuslice, Quantity::Memory, Syntax::Size),
    ("CUSLICE_CORE_LIMIT", Family::Cuslice, Quantity::CoreLimit, Syntax::Percent),
    ("CUSLICE_CORE_REQUEST", Family::Cuslice, Quantity::CoreRequest, Syntax::Percent),
    ("CUDA_DEVICE_MEMORY_LIMIT", Family::Hami, Quantity::Memory, Syntax::HamiSize),
    ("CUDA_DEVICE_SM_LIMIT", Family::Hami, Quantity::CoreLimit, Syntax::HamiPercent),
];

pub(super) const STATE_DIR: &str = "CUSLICE_STATE_DIR";
pub(super) const NODE_DIR: &str = "CUSLICE_NODE_DIR";
pub(super) const LOG: &str = "CUSLICE_LOG";
pub(super) const PRIORITY: &str = "CUSLICE_PRIORITY";
pub(super) const MEMORY_WAIT: &str = "CUSLICE_MEMORY_WAIT";
pub(super) const MEMORY_SPILL: &str = "CUSLICE_MEMORY_SPILL";
pub(super) const MEMORY_FREEZE_IDLE: &str = "CUSLICE_MEMORY_FREEZE_IDLE";
/// The container's GPUs as its engine gave them: written by the hook ([`super::gpus`]).
pub(super) const DEVICE_NODES: &str = "CUSLICE_DEVICE_NODES";
pub(super) const NVIDIA_VISIBLE: &str = "CUSLICE_NVIDIA_VISIBLE_DEVICES";
pub(super) const CUDA_VISIBLE: &str = "CUSLICE_CUDA_VISIBLE_DEVICES";
/// A setting of an earlier release that this one no longer reads: refused, with why.
pub(super) const CORE_METER: &str = "CUSLICE_CORE_METER";
pub(super) const ALIYUN_CONTAINER: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
pub(super) const ALIYUN_UNIT: &str = "ALIYUN_COM_GPU_MEM_UNIT";

/// `CUSLICE_` names that belong to other parts of the project (build and test tooling), not to
/// the interposer, so they are neither settings nor typos.
pub(super) const OTHER_CUSLICE_NAMES: [&str; 1] = ["CUSLICE_CUDA_HEADERS"];

pub(super) const KNOWN_CUSLICE: &str = "CUSLICE_MEMORY_LIMIT[_<i>], CUSLICE_CORE_LIMIT[_<i>], \
                             CUSLICE_CORE_REQUEST[_<i>], CUSLICE_PRIORITY, CUSLICE_MEMORY_WAIT, \
                             CUSLICE_MEMORY_SPILL, CUSLICE_MEMORY_FREEZE_IDLE, CUSLICE_STATE_DIR, \
                             CUSLICE_NODE_DIR, CUSLICE_LOG";

/// What a variable name means to cuslice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Name<'a> {
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
    MemoryWait,
    MemorySpill,
    MemoryFreezeIdle,
    /// One of the three lines of the container's GPUs ([`super::gpus::Gpus`]).
    Gpus(&'static str),
    /// `CUSLICE_CORE_METER`, which an earlier release read.
    Retired,
    AliyunContainer,
    AliyunUnit,
    UnknownCuslice,
    /// Not one of cuslice's names as written, but one in another case, with `-` or `.` for `_`,
    /// or one edit away from a known name (`cuslice_memory_limit`, `CUSLCE_CORE_LIMIT`): a
    /// setting that would otherwise do nothing. [`near_miss`] says which name it meant.
    NearMiss,
    /// Not ours.
    Other,
}

pub(super) fn classify(name: &str) -> Name<'_> {
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
        MEMORY_WAIT => Name::MemoryWait,
        MEMORY_SPILL => Name::MemorySpill,
        MEMORY_FREEZE_IDLE => Name::MemoryFreezeIdle,
        DEVICE_NODES => Name::Gpus(DEVICE_NODES),
        NVIDIA_VISIBLE => Name::Gpus(NVIDIA_VISIBLE),
        CUDA_VISIBLE => Name::Gpus(CUDA_VISIBLE),
        CORE_METER => Name::Retired,
        ALIYUN_CONTAINER => Name::AliyunContainer,
        ALIYUN_UNIT => Name::AliyunUnit,
        _ if OTHER_CUSLICE_NAMES.contains(&name) => Name::Other,
        _ if name.starts_with("CUSLICE_") => Name::UnknownCuslice,
        _ if near_miss(name).is_some() => Name::NearMiss,
        _ => Name::Other,
    }
}

/// cuslice's own names, all devices and (for the limits) device `ordinal`.
fn cuslice_names(ordinal: Option<u32>) -> impl Iterator<Item = String> {
    let limits = LIMIT_BASES
        .iter()
        .filter(|(base, ..)| base.starts_with("CUSLICE_"))
        .map(|(base, ..)| *base);
    let per_device = limits
        .clone()
        .filter_map(move |base| ordinal.map(|o| format!("{base}_{o}")));
    limits
        .chain([
            STATE_DIR,
            NODE_DIR,
            LOG,
            PRIORITY,
            MEMORY_WAIT,
            MEMORY_SPILL,
            MEMORY_FREEZE_IDLE,
        ])
        .map(String::from)
        .chain(per_device)
}

/// The cuslice name that `name`, which is not one as written, stands for: the same in upper case
/// with `_` for `-` and `.` (`cuslice_memory_limit`, `Cuslice-Core-Limit`), or one edit away
/// from a known name outside the `CUSLICE_` prefix's exact spelling (`CUSLCE_MEMORY_LIMIT`,
/// `CU_SLICE_LOG`), but not a whole name with a character put in front
/// (`XCUSLICE_MEMORY_LIMIT`, a setting switched off by hand). A misspelling after an exact `CUSLICE_` is [`Name::UnknownCuslice`], with
/// its own suggestion ([`suggest`]). Cheap for the names every environment holds: most are
/// passed over by their length.
pub fn near_miss(name: &str) -> Option<String> {
    // "CUSLICE_LOG" is the shortest name, "CUSLICE_CORE_REQUEST_63" the longest.
    if !(10..=25).contains(&name.len()) || !name.is_ascii() {
        return None;
    }
    let upper: String = name
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    if upper == name {
        // As written: only a misspelt prefix is left to find.
        if name.starts_with("CUSLICE_") {
            return None;
        }
    } else if upper.starts_with("CUSLICE_") {
        return Some(match classify(&upper) {
            Name::UnknownCuslice => suggest(&upper).unwrap_or(upper),
            _ => upper,
        });
    }
    let ordinal = upper.rsplit_once('_').and_then(|(_, s)| parse_ordinal(s));
    // A name with something put in front of a whole one (`XCUSLICE_MEMORY_LIMIT`, a setting
    // switched off by hand) is someone else's.
    cuslice_names(ordinal)
        .filter(|c| c.len().abs_diff(upper.len()) <= 1 && !upper.ends_with(c.as_str()))
        .find(|c| levenshtein(&upper, c) <= 1)
}

/// Whether `name` is a variable cuslice reads (its own `CUSLICE_*` names, known or not, and the
/// HAMi-core and Alibaba cGPU aliases): what the OCI hook looks for in a container's environment.
pub fn is_setting(name: &str) -> bool {
    classify(name) != Name::Other
}

/// Whether `name` is chosen by whoever runs the process rather than by the slice's owner
/// (`CUSLICE_STATE_DIR`, `CUSLICE_NODE_DIR`, the container's GPUs): in a container the hook
/// decides these.
pub fn is_placement(name: &str) -> bool {
    matches!(
        classify(name),
        Name::StateDir | Name::NodeDir | Name::Gpus(_)
    )
}

/// A device ordinal as a per-device suffix: decimal, 0 to 63, no sign, no leading zero (so that
/// `_1` and `_01` cannot both name device 1).
pub(super) fn parse_ordinal(suffix: &str) -> Option<u32> {
    if suffix.is_empty()
        || suffix.len() > 2
        || !suffix.bytes().all(|b| b.is_ascii_digit())
        || (suffix.len() > 1 && suffix.starts_with('0'))
    {
        return None;
    }
    suffix.parse().ok().filter(|&i| i <= MAX_ORDINAL)
}

/// Edit distance, for suggesting the variable a typo meant.
pub(super) fn levenshtein(a: &str, b: &str) -> usize {
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
pub(super) fn suggest(name: &str) -> Option<String> {
    // A typo in a per-device name keeps its ordinal: CUSLICE_MEMORY_LIMT_1 suggests
    // CUSLICE_MEMORY_LIMIT_1.
    let ordinal = name.rsplit_once('_').and_then(|(_, s)| parse_ordinal(s));
    // Close enough: up to a third of the part after `CUSLICE_`, at least 1 and at most 3 edits
    // (so `CUSLICE_LOGS` suggests `CUSLICE_LOG`, but `CUSLICE_FOO` suggests nothing).
    cuslice_names(ordinal)
        .map(|c| (levenshtein(name, &c), c))
        .filter(|(distance, c)| *distance <= ((c.len() - "CUSLICE_".len()) / 3).clamp(1, 3))
        .min()
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinal_suffixes() {
        assert_eq!(parse_ordinal("0"), Some(0));
        assert_eq!(parse_ordinal("63"), Some(63));
        for bad in ["", "64", "01", "-1", "+1", "x", "1 ", "999", "٣"] {
            assert_eq!(parse_ordinal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn near_misses_name_the_setting_they_meant() {
        for (name, meant) in [
            ("cuslice_memory_limit", "CUSLICE_MEMORY_LIMIT"),
            ("Cuslice_Core_Limit_1", "CUSLICE_CORE_LIMIT_1"),
            ("CUSLICE-MEMORY-LIMIT", "CUSLICE_MEMORY_LIMIT"),
            ("cuslice.priority", "CUSLICE_PRIORITY"),
            ("cuslice_memory_limt", "CUSLICE_MEMORY_LIMIT"),
            ("CUSLCE_MEMORY_LIMIT", "CUSLICE_MEMORY_LIMIT"),
            ("CU_SLICE_LOG", "CUSLICE_LOG"),
            ("XUSLICE_CORE_REQUEST_3", "CUSLICE_CORE_REQUEST_3"),
        ] {
            assert_eq!(classify(name), Name::NearMiss, "{name}");
            assert_eq!(near_miss(name).as_deref(), Some(meant), "{name}");
        }
        // Other programs' names, and cuslice's own as written, are none.
        for name in [
            "CUSLICE_MEMORY_LIMIT",
            "CUSLICE_MEMORY_LIMT",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "SLICE_LOG",
            "XCUSLICE_MEMORY_LIMIT",
            "PATH",
            "LD_LIBRARY_PATH",
            "NVIDIA_VISIBLE_DEVICES",
            "cuda_device_memory_limit",
        ] {
            assert_eq!(near_miss(name), None, "{name}");
            assert_ne!(classify(name), Name::NearMiss, "{name}");
        }
        // A lower-case name that is not one either is still reported, with the closest name.
        assert_eq!(classify("cuslice_foo"), Name::NearMiss);
        assert_eq!(near_miss("cuslice_foo").as_deref(), Some("CUSLICE_FOO"));
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
}
