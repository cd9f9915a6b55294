//! Tests of reading the configuration from the environment: every variable, every spelling,
//! precedence, notices and errors. The hook file's and the live changes' tests sit beside their
//! modules and share the helpers here. One concern (reading the
//! environment), kept in one file.

use std::path::PathBuf;

use super::*;
use crate::echo::{cut, quoted};
use crate::priority::Priority;

pub(super) const GIB: u64 = 1 << 30;
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

pub(super) fn assert_well_formed(e: &ConfigError) {
    let message = e.to_string();
    assert!(!message.contains('\n'), "not one line: {message}");
    assert!(
        message.contains(&format!("{}={}", cut(&e.variable), quoted(&e.value))),
        "variable and value missing: {message}"
    );
    assert!(message.contains("; write e.g. "), "no example: {message}");
    assert!(!e.example.is_empty() && !e.problem.is_empty(), "{e:?}");
}

pub(super) fn limits(
    memory: Option<u64>,
    core_limit: Option<u32>,
    core_request: Option<u32>,
) -> Limits {
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
         CUSLICE_MEMORY_LIMIT=4GiB (binary units: KiB MiB GiB TiB PiB, or k m g t p; or plain \
         bytes)"
    );
    assert_eq!(e.line, None);
}

/// A percent that is not one says what a percent is once; one out of range says it in the example.
#[test]
fn a_bad_percent_says_what_a_percent_is_once() {
    for (value, problem) in [
        ("-5", "is negative"),
        ("5x", "is not"),
        ("150", "out of range"),
    ] {
        let line = error(&[("CUSLICE_CORE_LIMIT", value)]).to_string();
        assert!(line.contains(problem), "{line}");
        assert_eq!(
            line.matches("from 1 to 100").count(),
            1 + usize::from(value == "150"),
            "{line}"
        );
        assert!(line.contains("write e.g. CUSLICE_CORE_LIMIT=50"), "{line}");
    }
}

/// `1.5GB` is 1.5 * 10^9 bytes to some and 1.5 * 2^30 to others: refused, with the binary
/// spelling of the same number as the example.
#[test]
fn decimal_units_are_refused_with_the_binary_spelling() {
    let e = error(&[("CUSLICE_MEMORY_LIMIT", "1.5GB")]);
    assert_eq!(
        e.to_string(),
        "CUSLICE_MEMORY_LIMIT=\"1.5GB\" is ambiguous: GB is 10^9 bytes to some readers and 2^30 \
         to others; write e.g. CUSLICE_MEMORY_LIMIT=1.5GiB (binary units: KiB MiB GiB TiB PiB, \
         or k m g t p; or plain bytes)"
    );
    for (value, example) in [
        ("512MB", "CUSLICE_MEMORY_LIMIT_1=512MiB"),
        ("2 tb", "CUSLICE_MEMORY_LIMIT_1=2TiB"),
        ("64kB", "CUSLICE_MEMORY_LIMIT_1=64KiB"),
    ] {
        let e = error(&[("CUSLICE_MEMORY_LIMIT_1", value)]);
        assert!(e.problem.starts_with("is ambiguous"), "{e}");
        assert!(e.example.starts_with(example), "{e}");
    }
    let e = error(&[("CUSLICE_MEMORY_SPILL", "4GB")]);
    assert!(e.example.starts_with("CUSLICE_MEMORY_SPILL=4GiB"), "{e}");
}

/// A setting under another case or with `-` for `_`, or one letter off in the prefix, would do
/// nothing: refused, naming the setting it meant.
#[test]
fn near_misses_of_cuslice_names_are_refused_naming_the_one_meant() {
    for (name, example) in [
        ("cuslice_memory_limit", "CUSLICE_MEMORY_LIMIT=1GiB"),
        ("Cuslice_Memory_Limit_1", "CUSLICE_MEMORY_LIMIT_1=1GiB"),
        ("CUSLICE-MEMORY-LIMIT", "CUSLICE_MEMORY_LIMIT=1GiB"),
        ("CUSLCE_MEMORY_LIMIT", "CUSLICE_MEMORY_LIMIT=1GiB"),
        ("cuslice_memory_limt", "CUSLICE_MEMORY_LIMIT=1GiB"),
    ] {
        let e = error(&[(name, "1GiB")]);
        assert_eq!(e.example, example, "{e}");
        assert!(e.problem.starts_with("is not a cuslice variable"), "{e}");
    }
    assert_eq!(
        error(&[("cuslice_memory_limit", "1GiB")]).to_string(),
        "cuslice_memory_limit=\"1GiB\" is not a cuslice variable, so it would do nothing; \
         CUSLICE_MEMORY_LIMIT is (names are upper case, with underscores); write e.g. \
         CUSLICE_MEMORY_LIMIT=1GiB"
    );
    let e = error(&[("cuslice_whatever", "1")]);
    assert_eq!(e.example, "CUSLICE_MEMORY_LIMIT=4GiB", "{e}");
    assert!(e.problem.contains("(known: "), "{e}");
}

/// A per-device setting for a device the process (or container) does not have is refused,
/// naming the variable, the devices there are and an example for them.
#[test]
fn a_device_index_beyond_the_devices_there_are_is_refused() {
    let c = config(&[("CUSLICE_MEMORY_LIMIT_1", "1GiB")]);
    let e = c.check_device_count(1, "this process sees").unwrap_err();
    assert_well_formed(&e);
    assert_eq!(
        e.to_string(),
        "CUSLICE_MEMORY_LIMIT_1=\"1GiB\" names device 1, but this process sees 1 CUDA device \
         (device 0), so it would apply to none; write e.g. CUSLICE_MEMORY_LIMIT_0=1GiB (device 0) \
         or CUSLICE_MEMORY_LIMIT=1GiB (every device)"
    );
    assert_eq!(c.check_device_count(2, "this process sees"), Ok(()));
    let c = config(&[
        ("CUSLICE_MEMORY_LIMIT_0", "1GiB"),
        ("CUSLICE_CORE_LIMIT_5", "30"),
        ("CUDA_DEVICE_SM_LIMIT_7", "20"),
    ]);
    let e = c.check_device_count(4, "the container has").unwrap_err();
    assert_eq!(e.variable, "CUSLICE_CORE_LIMIT_5", "{e}");
    assert!(e.problem.contains("4 CUDA devices (0 to 3)"), "{e}");
    assert!(
        e.example.starts_with("CUSLICE_CORE_LIMIT_3=30 (device 3)"),
        "{e}"
    );
    assert_eq!(c.check_device_count(8, "the container has"), Ok(()));
    // Settings for every device name none in particular.
    let c = config(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    assert_eq!(c.check_device_count(0, "this process sees"), Ok(()));
    assert_eq!(c.memory_setting(0), Some("CUSLICE_MEMORY_LIMIT=1GiB"));
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
    let c = Config::from_hook_file("FOO\rBAR=1", [("CUSLICE_X\nY", "1")]).unwrap();
    assert_eq!(c.notices.len(), 2);
    assert!(
        c.notices.iter().all(|n| !n.contains(['\n', '\r'])),
        "{:?}",
        c.notices
    );
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
    let line = Config::from_hook_file(&text, std::iter::empty::<(&str, &str)>())
        .unwrap_err()
        .to_string();
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
}

#[test]
fn memory_wait_and_spill_are_read_for_every_device() {
    let c = config(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_WAIT", "5s"),
        ("CUSLICE_MEMORY_SPILL", "1GiB"),
    ]);
    assert_eq!(c.memory_wait, Some(std::time::Duration::from_secs(5)));
    assert_eq!(c.memory_spill, Some(GIB));
    let c = config(&[("CUSLICE_MEMORY_WAIT", "250ms")]);
    assert_eq!(c.memory_wait, Some(std::time::Duration::from_millis(250)));
    assert_eq!(c.memory_spill, None);
    let none = config(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    assert_eq!((none.memory_wait, none.memory_spill), (None, None));
}

#[test]
fn bad_memory_waits_and_spills_are_refused_in_one_line() {
    let cases: [(&str, &str, &str); 8] = [
        (
            "CUSLICE_MEMORY_WAIT",
            "5",
            "is not a duration (it has no unit)",
        ),
        (
            "CUSLICE_MEMORY_WAIT",
            "5 fortnights",
            "is not a duration (unknown unit)",
        ),
        (
            "CUSLICE_MEMORY_WAIT",
            "-1s",
            "is not a duration (durations cannot be negative)",
        ),
        (
            "CUSLICE_MEMORY_WAIT",
            "0s",
            "is 0; a wait must be more than 0",
        ),
        ("CUSLICE_MEMORY_WAIT", "", "is empty"),
        (
            "CUSLICE_MEMORY_SPILL",
            "12XB",
            "is not a size (unknown unit)",
        ),
        (
            "CUSLICE_MEMORY_SPILL",
            "0",
            "is 0; a spill must be more than 0",
        ),
        ("CUSLICE_MEMORY_SPILL", "2PiB", "is too large"),
    ];
    for (name, value, problem) in cases {
        let e = error(&[(name, value)]);
        assert_eq!(e.variable, name);
        assert!(e.to_string().contains(problem), "{e}");
        assert!(e.example.starts_with(name), "{e}");
    }
    let e = error(&[("CUSLICE_MEMORY_WAT", "5s")]);
    assert!(e.to_string().contains("CUSLICE_MEMORY_WAIT=5s"), "{e}");
}

#[test]
fn a_freeze_idle_time_is_read_and_a_bad_one_refused_in_one_line() {
    let c = config(&[("CUSLICE_MEMORY_FREEZE_IDLE", "5m")]);
    assert_eq!(
        c.memory_freeze_idle,
        Some(std::time::Duration::from_secs(300))
    );
    assert_eq!(config(&[]).memory_freeze_idle, None);
    for (value, problem) in [
        ("500ms", "is less than a second"),
        ("5", "is not a duration (it has no unit)"),
        ("-1s", "durations cannot be negative"),
        ("", "is empty"),
    ] {
        let e = error(&[("CUSLICE_MEMORY_FREEZE_IDLE", value)]);
        assert_eq!(e.variable, "CUSLICE_MEMORY_FREEZE_IDLE");
        assert!(e.to_string().contains(problem), "{e}");
        assert!(
            e.example.starts_with("CUSLICE_MEMORY_FREEZE_IDLE=5m"),
            "{e}"
        );
    }
    let e = error(&[("CUSLICE_MEMORY_FREEZE_IDEL", "5m")]);
    assert!(e.to_string().contains("CUSLICE_MEMORY_FREEZE_IDLE"), "{e}");
}

#[test]
fn the_core_meter_of_an_earlier_release_is_refused_with_why() {
    for value in ["auto", "self-timing"] {
        let e = error(&[("CUSLICE_CORE_METER", value)]);
        assert_eq!(e.variable, "CUSLICE_CORE_METER");
        assert!(e.to_string().contains("is no longer read"), "{e}");
        assert!(e.to_string().contains("turns"), "{e}");
    }
}
