//! Checks the simulated driver's `cuGetProcAddress` table (tests/simgpu/cuda/src/symbols.rs)
//! against the `PFN_<base>_v<version>[_ptds|_ptsz]` typedefs of `cudaTypedefs.h` (12.9 and 13.0)
//! and the `#define base target` lines of 13.0's `cuda.h`.

use abi_check::headers_or_skip;
use simgpu_cuda::symbols::{self, Lookup, Stream, VARIANTS};
use std::collections::{BTreeMap, BTreeSet};

/// Variants the headers list that the simulator deliberately does not export: the CUDA 2.x/3.0
/// originals with the 32-bit `CUdeviceptr` ABI, superseded by `_v2` at 3020. (base, version)
const OMITTED: &[(&str, i32)] = &[
    ("cuMemGetAddressRange", 2000),
    ("cuMemcpyHtoD", 2000),
    ("cuMemcpyDtoH", 2000),
    ("cuMemcpyDtoD", 2000),
    ("cuMemcpyHtoDAsync", 2000),
    ("cuMemcpyDtoHAsync", 2000),
    ("cuMemcpyDtoDAsync", 3000),
    ("cuMemsetD8", 2000),
    ("cuMemsetD32", 2000),
];

/// A typedef's variant: version and `None` (ordinary) or `Some("ptds" | "ptsz")`.
type HeaderVariant = (i32, Option<&'static str>);

/// All `PFN_<base>_v<version>[_ptds|_ptsz]` typedef names (`(CUDAAPI *PFN_...)`) in `text`.
fn typedefs(text: &str, into: &mut BTreeMap<String, BTreeSet<HeaderVariant>>) {
    for (at, _) in text.match_indices("*PFN_") {
        let rest = &text[at + "*PFN_".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let mut name = &rest[..end];
        let mut suffix = None;
        for s in ["ptds", "ptsz"] {
            if let Some(stripped) = name.strip_suffix(&format!("_{s}")) {
                name = stripped;
                suffix = Some(s);
            }
        }
        // A few typedefs carry no version (13.0: PFN_cuModuleGetFunctionCount,
        // PFN_cuModuleEnumerateFunctions, PFN_cuLibraryGetKernelCount,
        // PFN_cuLibraryEnumerateKernels); none of them is in the table.
        let Some((base, Ok(version))) = name
            .rsplit_once("_v")
            .map(|(base, v)| (base, v.parse::<i32>()))
        else {
            continue;
        };
        into.entry(base.to_string())
            .or_default()
            .insert((version, suffix));
    }
}

/// The export name the driver's naming rule gives each header variant of one base: ordinary
/// variants are `base`, `base_v2`, `base_v3`... in version order; a per-thread variant at V is
/// the ordinary variant current at V plus `_ptds`/`_ptsz`.
fn rule_exports(base: &str, variants: &BTreeSet<HeaderVariant>) -> BTreeMap<HeaderVariant, String> {
    let ordinary: Vec<i32> = variants
        .iter()
        .filter(|(_, s)| s.is_none())
        .map(|&(v, _)| v)
        .collect();
    let name_of = |index: usize| match index {
        0 => base.to_string(),
        n => format!("{base}_v{}", n + 1),
    };
    let mut out = BTreeMap::new();
    for &(version, suffix) in variants {
        let current = ordinary.iter().rposition(|&v| v <= version);
        let export = match (suffix, current) {
            (None, Some(i)) => name_of(i),
            (Some(s), Some(i)) => format!("{}_{s}", name_of(i)),
            (_, None) => format!("<{base} per-thread v{version} with no ordinary variant>"),
        };
        out.insert((version, suffix), export);
    }
    out
}

#[test]
fn symbol_table_matches_cuda_typedefs() {
    let Some(headers) = headers_or_skip("symbol_table_matches_cuda_typedefs") else {
        return;
    };
    let mut header: BTreeMap<String, BTreeSet<HeaderVariant>> = BTreeMap::new();
    for version in abi_check::CUDA_VERSIONS {
        typedefs(&headers.read_cuda(version, "cudaTypedefs.h"), &mut header);
    }
    assert!(header.len() > 400, "only {} PFN bases parsed", header.len());

    let mut problems = Vec::new();
    let mut table: BTreeMap<&str, BTreeMap<(i32, bool), &str>> = BTreeMap::new();
    for var in VARIANTS {
        table
            .entry(var.base)
            .or_default()
            .insert((var.version, var.stream == Stream::PerThread), var.export);
    }

    for &(base, version) in OMITTED {
        let listed = header
            .get(base)
            .is_some_and(|h| h.contains(&(version, None)));
        if !listed {
            problems.push(format!(
                "allow-list: {base} v{version} is not in the headers"
            ));
        }
        if table
            .get(base)
            .is_some_and(|t| t.contains_key(&(version, false)))
        {
            problems.push(format!(
                "allow-list: {base} v{version} is in the table after all"
            ));
        }
    }

    for (&base, ours) in &table {
        let Some(theirs) = header.get(base) else {
            problems.push(format!("{base}: no PFN_{base}_v* typedef in either header"));
            continue;
        };
        let want: BTreeSet<(i32, bool)> = theirs
            .iter()
            .filter(|&&(v, s)| !(s.is_none() && OMITTED.contains(&(base, v))))
            .map(|&(v, s)| (v, s.is_some()))
            .collect();
        let have: BTreeSet<(i32, bool)> = ours.keys().copied().collect();
        for missing in want.difference(&have) {
            problems.push(format!(
                "{base}: header variant {missing:?} (version, per-thread) missing from the table"
            ));
        }
        for extra in have.difference(&want) {
            problems.push(format!(
                "{base}: table variant {extra:?} (version, per-thread) not in the headers"
            ));
        }
        for ((version, suffix), export) in rule_exports(base, theirs) {
            let key = (version, suffix.is_some());
            if let Some(&ours) = ours.get(&key).filter(|&&ours| ours != export) {
                problems.push(format!(
                    "{base} v{version}{}: table exports {ours}, the naming rule gives {export}",
                    suffix.map(|s| format!("_{s}")).unwrap_or_default()
                ));
            }
        }
    }

    // cuda.h (13.0): `#define base target` names the newest ordinary export;
    // `#define base __CUDA_API_PTDS(target)` also names the per-thread one (target_ptds).
    let cuda_h = headers.read_cuda("13.0", "cuda.h");
    let mut defines = 0;
    for line in cuda_h.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(target)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(ours) = table.get(name) else {
            continue;
        };
        // `#define cuGraphInstantiate cuGraphInstantiateWithFlags`: a rename to another API
        // (a base of its own in the table), not a variant of this one.
        if target != name && table.contains_key(target) {
            continue;
        }
        let (legacy, per_thread) = match target
            .strip_prefix("__CUDA_API_PTDS(")
            .map(|t| (t, "ptds"))
            .or_else(|| target.strip_prefix("__CUDA_API_PTSZ(").map(|t| (t, "ptsz")))
        {
            Some((inner, suffix)) => {
                let inner = inner.trim_end_matches(')');
                (inner.to_string(), Some(format!("{inner}_{suffix}")))
            }
            None => (target.to_string(), None),
        };
        defines += 1;
        let newest = |per: bool| {
            ours.iter()
                .filter(|((_, p), _)| *p == per)
                .max_by_key(|((v, _), _)| *v)
                .map(|(_, e)| *e)
        };
        if newest(false) != Some(legacy.as_str()) {
            problems.push(format!(
                "{name}: cuda.h maps it to {legacy}, the table's newest ordinary export is {:?}",
                newest(false)
            ));
        }
        if let Some(pt) = per_thread.filter(|pt| newest(true) != Some(pt.as_str())) {
            problems.push(format!(
                "{name}: cuda.h's per-thread mapping is {pt}, the table's newest per-thread export is {:?}",
                newest(true)
            ));
        }
    }
    eprintln!(
        "{} table variants, {} bases, {defines} cuda.h defines checked",
        VARIANTS.len(),
        table.len()
    );

    // lookup() at every header version answers the newest variant at or before it.
    for (&base, ours) in &table {
        for &(version, suffix) in &header[base] {
            for flags in [0, 2] {
                let want = ours
                    .iter()
                    .filter(|&(&(v, p), _)| v <= version && (p == (flags == 2)))
                    .max_by_key(|((v, _), _)| *v)
                    .or_else(|| {
                        ours.iter()
                            .filter(|&(&(v, p), _)| v <= version && !p)
                            .max_by_key(|((v, _), _)| *v)
                    })
                    .map(|(_, e)| Lookup::Found(e))
                    .unwrap_or(Lookup::VersionNotSufficient);
                let got = symbols::lookup(base, version, flags);
                if got != want {
                    problems.push(format!(
                        "lookup({base}, {version}, {flags}) = {got:?}, expected {want:?} (header variant {suffix:?})"
                    ));
                }
            }
        }
    }

    assert!(
        problems.is_empty(),
        "{} problem(s) in tests/simgpu/cuda/src/symbols.rs against {}:\n{}",
        problems.len(),
        headers.root.display(),
        problems.join("\n")
    );
}
