//! PTX images: which kernels they define, each kernel's parameter layout, and how long a launch
//! keeps the engine busy.
//!
//! The real driver JIT-compiles PTX; simgpu cannot run the code, so it takes each kernel's cost
//! from an annotation in a PTX comment, which the real driver ignores:
//!
//! ```text
//! // simgpu-kernel NAME block-ns=param0      each block works for the value of parameter 0, in ns
//! // simgpu-kernel NAME block-ns=250000      each block works for 250 us
//! // simgpu-kernel NAME wait-ns=param0       each block waits until parameter 0's ns have passed
//! // simgpu-kernel NAME wait-ns=250000       each block waits until 250 us have passed
//! ```
//!
//! `block-ns` is fixed work (an arithmetic loop): the engine time it needs, however long it is
//! preempted for. `wait-ns` is a kernel that spins on the GPU's global timer (`%globaltimer`)
//! until that long after it started: its deadline is set when it first runs, it keeps the engine
//! busy only while scheduled, and it ends at the first moment it is on the engine at or after the
//! deadline, so beside another context it may use less engine time than it waited for
//! (`ITEM_WAIT` in the engine).
//!
//! Blocks run side by side, one per SM, as they do on a GPU: a launch of B blocks takes
//! `ns x ceil(B / SMs)`, a waiting kernel as one wait of that length. A kernel without an
//! annotation works for 1 us per block the same way. A name the image does not declare with
//! `.entry` is not found, as with the real driver.

use std::collections::HashMap;

/// Engine nanoseconds of one block of a PTX kernel without a `simgpu-kernel` annotation.
pub const DEFAULT_BLOCK_NS: u64 = 1_000;

/// Where the time one block takes comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockNs {
    Fixed(u64),
    /// The value of this parameter (a 32- or 64-bit integer) at launch.
    Param(usize),
}

/// How a kernel spends its time: `block-ns` or `wait-ns` in its annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Fixed work: the engine time it needs, however long it is preempted for.
    Work,
    /// A wait for the clock: it ends once that long has passed since it started.
    Wait,
}

/// One kernel parameter: where it sits in the packed argument buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub offset: usize,
    pub size: usize,
}

/// A kernel an image defines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub params: Vec<Param>,
    pub block_ns: BlockNs,
    pub timing: Timing,
}

/// Whether `text` is a PTX module (it has a `.version` directive outside comments).
pub fn is_ptx(text: &str) -> bool {
    strip_comments(text)
        .split_whitespace()
        .any(|w| w == ".version")
}

/// The kernels of a PTX module, or why the real driver would refuse it (a message for stderr).
pub fn parse(text: &str) -> Result<HashMap<String, Entry>, String> {
    let code = strip_comments(text);
    let mut kernels = HashMap::new();
    let mut rest = code.as_str();
    while let Some(at) = find_word(rest, ".entry") {
        let t = rest[at + ".entry".len()..].trim_start();
        let end = t
            .find(|c: char| c == '(' || c == '{' || c.is_whitespace())
            .unwrap_or(t.len());
        let name = &t[..end];
        rest = &t[end..];
        if name.is_empty() {
            return Err("an .entry directive without a name".into());
        }
        let after = rest.trim_start();
        let params = if let Some(list) = after.strip_prefix('(') {
            let close = list
                .find(')')
                .ok_or_else(|| format!(".entry {name}: its parameter list is not closed"))?;
            rest = &list[close + 1..];
            parse_params(name, &list[..close])?
        } else {
            Vec::new()
        };
        kernels.insert(
            name.to_string(),
            Entry {
                params,
                block_ns: BlockNs::Fixed(DEFAULT_BLOCK_NS),
                timing: Timing::Work,
            },
        );
    }
    for (name, timing, block_ns) in annotations(text)? {
        let e = kernels.get_mut(&name).ok_or_else(|| {
            format!("simgpu-kernel annotation for {name}, which no .entry declares")
        })?;
        let key = key(timing);
        if let BlockNs::Param(i) = block_ns {
            match e.params.get(i) {
                Some(p) if p.size == 4 || p.size == 8 => {}
                Some(p) => {
                    return Err(format!(
                        "simgpu-kernel {name}: parameter {i} is {} bytes; {key} needs a 32- or 64-bit integer",
                        p.size
                    ));
                }
                None => {
                    return Err(format!(
                        "simgpu-kernel {name}: {key}=param{i}, but the kernel has {} parameters",
                        e.params.len()
                    ));
                }
            }
        }
        e.block_ns = block_ns;
        e.timing = timing;
    }
    Ok(kernels)
}

/// The annotation's word for `timing`.
fn key(timing: Timing) -> &'static str {
    match timing {
        Timing::Work => "block-ns",
        Timing::Wait => "wait-ns",
    }
}

/// `// simgpu-kernel NAME block-ns=...` and `wait-ns=...` lines.
fn annotations(text: &str) -> Result<Vec<(String, Timing, BlockNs)>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(comment) = line.trim().strip_prefix("//") else {
            continue;
        };
        let mut w = comment.split_whitespace();
        if w.next() != Some("simgpu-kernel") {
            continue;
        }
        let bad = || {
            format!(
                "bad annotation {:?}: write `// simgpu-kernel NAME block-ns=param0` (fixed work) or \
                 `wait-ns=param0` (a wait for the clock), or a number of ns for param0",
                line.trim()
            )
        };
        let (Some(name), Some(cost), None) = (w.next(), w.next(), w.next()) else {
            return Err(bad());
        };
        let (timing, value) = [Timing::Work, Timing::Wait]
            .into_iter()
            .find_map(|t| Some((t, cost.strip_prefix(key(t))?.strip_prefix('=')?)))
            .ok_or_else(bad)?;
        let block_ns = match value.strip_prefix("param") {
            Some(i) => BlockNs::Param(i.parse().map_err(|_| bad())?),
            None => BlockNs::Fixed(value.parse().map_err(|_| bad())?),
        };
        out.push((name.to_string(), timing, block_ns));
    }
    Ok(out)
}

/// `.param [.align N] .TYPE [qualifiers] NAME[[COUNT]]`, comma-separated.
fn parse_params(kernel: &str, list: &str) -> Result<Vec<Param>, String> {
    let mut params = Vec::new();
    let mut offset = 0usize;
    for decl in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bad = |why: &str| format!(".entry {kernel}: parameter {decl:?}: {why}");
        let mut words = decl.split_whitespace().peekable();
        if words.next() != Some(".param") {
            return Err(bad("not a .param"));
        }
        let (mut align, mut elem, mut name) = (None, None, None);
        while let Some(w) = words.next() {
            if w == ".align" {
                let n = words.next().and_then(|n| n.parse::<usize>().ok());
                align = Some(
                    n.filter(|n| n.is_power_of_two())
                        .ok_or_else(|| bad(".align needs a power of two"))?,
                );
            } else if let Some(size) = type_size(w) {
                elem = Some(size);
            } else if w.starts_with('.') {
                // State-space and pointer qualifiers (.ptr .global ...) change no layout.
            } else {
                name = Some(w);
            }
        }
        let elem = elem.ok_or_else(|| bad("no type"))?;
        let name = name.ok_or_else(|| bad("no name"))?;
        let count = match name.split_once('[') {
            Some((_, n)) => n
                .trim_end_matches(']')
                .parse::<usize>()
                .map_err(|_| bad("bad array length"))?,
            None => 1,
        };
        let align = align.unwrap_or(elem);
        offset = offset.div_ceil(align) * align;
        params.push(Param {
            offset,
            size: elem * count,
        });
        offset += elem * count;
    }
    Ok(params)
}

fn type_size(t: &str) -> Option<usize> {
    Some(match t {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        _ => return None,
    })
}

/// `word` as a whole token (not a prefix of a longer directive) in `s`.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = s[from..].find(word) {
        let at = from + i;
        let before = s[..at].chars().next_back();
        let after = s[at + word.len()..].chars().next();
        let boundary =
            |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '.'));
        if boundary(before) && boundary(after) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The text without `// ...` and `/* ... */` comments (each replaced by a space).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        let line_first = match (line, block) {
            (Some(l), Some(b)) => l < b,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                out.push_str(rest);
                return out;
            }
        };
        if line_first {
            let l = line.unwrap_or_default();
            out.push_str(&rest[..l]);
            out.push(' ');
            rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
        } else {
            let b = block.unwrap_or_default();
            out.push_str(&rest[..b]);
            out.push(' ');
            rest = rest[b + 2..]
                .find("*/")
                .map_or("", |e| &rest[b + 2 + e + 2..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: &str = "// a spin kernel\n\
        // simgpu-kernel spin wait-ns=param1\n\
        .version 6.4\n.target sm_75\n.address_size 64\n\
        .visible .entry spin(\n  .param .u32 spin_flags,\n  .param .u64 spin_ns, // the time\n  \
        .param .align 16 .b8 spin_blob[24]\n)\n{\n  ret;\n}\n\
        .entry bare\n{\n ret;\n}\n\
        /* .entry hidden( .param .u64 x ) */\n";

    #[test]
    fn entries_parameters_and_annotations() {
        assert!(is_ptx(SPIN));
        assert!(!is_ptx("kernel spin 1000\n// .version 7.0\n"));
        let k = parse(SPIN).unwrap();
        assert_eq!(k.len(), 2, "{k:?}");
        let spin = &k["spin"];
        assert_eq!(
            spin.params,
            [
                Param { offset: 0, size: 4 },
                Param { offset: 8, size: 8 },
                Param {
                    offset: 16,
                    size: 24
                }
            ]
        );
        assert_eq!(spin.block_ns, BlockNs::Param(1));
        assert_eq!(spin.timing, Timing::Wait);
        assert_eq!(k["bare"].params, []);
        assert_eq!(k["bare"].block_ns, BlockNs::Fixed(DEFAULT_BLOCK_NS));
        assert_eq!(k["bare"].timing, Timing::Work);
    }

    #[test]
    fn bad_annotations_are_refused_with_a_reason() {
        let base = ".version 7.0\n.target sm_80\n.entry k(.param .u64 a, .param .b8 b)\n{ ret; }\n";
        for (note, why) in [
            ("// simgpu-kernel k block-ns=param2", "has 2 parameters"),
            ("// simgpu-kernel k wait-ns=param2", "wait-ns=param2, but"),
            ("// simgpu-kernel k block-ns=param1", "1 bytes"),
            ("// simgpu-kernel k wait-ns=param1", "wait-ns needs"),
            ("// simgpu-kernel k wait-ns 5", "bad annotation"),
            ("// simgpu-kernel k block-nsx=5", "bad annotation"),
            ("// simgpu-kernel other block-ns=5", "no .entry declares"),
            ("// simgpu-kernel k ns=5", "bad annotation"),
            ("// simgpu-kernel k block-ns=fast", "bad annotation"),
        ] {
            let err = parse(&format!("{note}\n{base}")).unwrap_err();
            assert!(err.contains(why), "{note}: {err}");
        }
        let k = &parse(&format!("// simgpu-kernel k block-ns=7\n{base}")).unwrap()["k"];
        assert_eq!((k.block_ns, k.timing), (BlockNs::Fixed(7), Timing::Work));
        let k = &parse(&format!("// simgpu-kernel k wait-ns=param0\n{base}")).unwrap()["k"];
        assert_eq!((k.block_ns, k.timing), (BlockNs::Param(0), Timing::Wait));
    }
}
