//! Makes the core's wrapper registry (src/registry.rs) from src/wrapped.txt, the one list of the
//! entry points cuslice wraps (the loader's build script reads the same list).

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
}
