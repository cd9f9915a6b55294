//! Makes the core's wrapper registry (src/registry.rs) from src/wrapped.txt, the one list of the
//! entry points cuslice wraps (the loader's build script reads the same list), and the gate's
//! stubs (src/gate.rs), one per driver function handed out.

use std::fmt::Write as _;

fn main() {
    let list = "src/wrapped.txt";
    println!("cargo:rerun-if-changed={list}");
    let text = std::fs::read_to_string(list).expect("reading interposer/src/wrapped.txt");
    let mut names: Vec<&str> = Vec::new();
    let mut out = String::from("wrapped! {\n");
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let ident = |s: &str| {
            s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        };
        let [name, module] = fields[..] else {
            panic!("{list}:{}: want `NAME MODULE`, got {line:?}", n + 1);
        };
        assert!(
            ident(name) && ident(module),
            "{list}:{}: not a name and a module: {line:?}",
            n + 1
        );
        assert!(
            !names.contains(&name),
            "{list}:{}: {name} is listed twice",
            n + 1
        );
        names.push(name);
        writeln!(out, "    {module} {name};").unwrap();
    }
    out.push_str("}\n");
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("wrapped.rs");
    std::fs::write(dest, out).unwrap();
    gate_stubs();
}

/// How many gate stubs there are; src/gate.rs reads the same number (`gate::STUBS`).
const STUBS: usize = 2048;

/// Writes `gate_stubs.s`: `STUBS` stubs for the target architecture and the table of their
/// addresses (`cuslice_gate_table`). Stub `i` jumps through `TARGETS[i]` while the gate byte is
/// 0 (open); otherwise (armed or shut) it jumps to the slow path with `i` in r11 (x86-64) or x17
/// (aarch64). `{gate}`, `{targets}` and `{slow}` are the `global_asm!` operands of src/gate.rs.
fn gate_stubs() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut s = String::new();
    let (progbits, quad) = match arch.as_str() {
        "x86_64" => ("@progbits", ".quad"),
        "aarch64" => ("%progbits", ".xword"),
        other => panic!("cuslice: no gate stubs for {other}"),
    };
    writeln!(s, ".pushsection .text.cuslice_gate,\"ax\",{progbits}").unwrap();
    for i in 0..STUBS {
        writeln!(s, ".p2align 4").unwrap();
        writeln!(s, ".Lcuslice_gate_{i}:").unwrap();
        if arch == "x86_64" {
            writeln!(s, "cmp byte ptr [rip + {{gate}}], 0").unwrap();
            writeln!(s, "jne .Lcuslice_gate_slow_{i}").unwrap();
            writeln!(s, "jmp qword ptr [rip + {{targets}} + {}]", i * 8).unwrap();
            writeln!(s, ".Lcuslice_gate_slow_{i}:").unwrap();
            writeln!(s, "mov r11d, {i}").unwrap();
            writeln!(s, "jmp {{slow}}").unwrap();
        } else {
            writeln!(s, "adrp x16, {{gate}}").unwrap();
            writeln!(s, "ldrb w17, [x16, :lo12:{{gate}}]").unwrap();
            writeln!(s, "cbnz w17, .Lcuslice_gate_slow_{i}").unwrap();
            writeln!(s, "adrp x16, {{targets}}").unwrap();
            writeln!(s, "add x16, x16, :lo12:{{targets}}").unwrap();
            writeln!(s, "ldr x16, [x16, #{}]", i * 8).unwrap();
            writeln!(s, "br x16").unwrap();
            writeln!(s, ".Lcuslice_gate_slow_{i}:").unwrap();
            writeln!(s, "mov x17, #{i}").unwrap();
            writeln!(s, "b {{slow}}").unwrap();
        }
    }
    writeln!(s, ".popsection").unwrap();
    writeln!(
        s,
        ".pushsection .data.rel.ro.cuslice_gate,\"aw\",{progbits}"
    )
    .unwrap();
    writeln!(s, ".p2align 3").unwrap();
    writeln!(s, ".globl cuslice_gate_table").unwrap();
    writeln!(s, ".hidden cuslice_gate_table").unwrap();
    writeln!(s, "cuslice_gate_table:").unwrap();
    for i in 0..STUBS {
        writeln!(s, "{quad} .Lcuslice_gate_{i}").unwrap();
    }
    // How many, for src/gate.rs's test to hold against its own count.
    writeln!(s, ".globl cuslice_gate_count").unwrap();
    writeln!(s, ".hidden cuslice_gate_count").unwrap();
    writeln!(s, "cuslice_gate_count:").unwrap();
    writeln!(s, "{quad} {STUBS}").unwrap();
    writeln!(s, ".popsection").unwrap();
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("gate_stubs.s");
    std::fs::write(dest, s).unwrap();
}
