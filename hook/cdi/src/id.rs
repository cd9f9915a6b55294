//! Fully-qualified device ids (`VENDOR/CLASS=NAME`) and the container annotations that name
//! them (`cdi.k8s.io/*`). Pure.

use cuslice_policy::echo::{cut, quoted};
use serde_json::Value;

use crate::claim::CLAIM_KIND;

/// Container annotations whose values are comma-separated CDI device ids (Ref:
/// container-device-interface pkg/cdi/producer/annotations/annotations.go, `Prefix`).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

fn letter(c: char) -> bool {
    c.is_ascii_alphabetic()
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// A vendor or class: a letter first, a letter or digit last, letters, digits, `_`, `-`, `.`
/// between (Ref: container-device-interface pkg/parser/parser.go).
fn check_vendor_or_class(what: &str, s: &str) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err(format!("the {what} is empty")),
        Some(c) if !letter(c) => {
            return Err(format!(
                "the {what} {} does not start with a letter",
                quoted(s)
            ));
        }
        _ => {}
    }
    if !s.chars().last().is_some_and(alnum) {
        return Err(format!(
            "the {what} {} does not end with a letter or digit",
            quoted(s)
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(alnum(*c) || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!("the {what} {} holds {c:?}", quoted(s)));
    }
    Ok(())
}

/// A kind: `VENDOR/CLASS`.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(format!(
            "kind {} is not VENDOR/CLASS (e.g. {CLAIM_KIND})",
            quoted(kind)
        ));
    };
    check_vendor_or_class("vendor", vendor)
        .and_then(|()| check_vendor_or_class("class", class))
        .map_err(|e| format!("kind {}: {e}", quoted(kind)))
}

/// A device name: a letter or digit first and last, letters, digits, `_`, `-`, `.`, `:`
/// between.
pub fn check_device_name(name: &str) -> Result<(), String> {
    let ok_ends = name.chars().next().is_some_and(alnum) && name.chars().last().is_some_and(alnum);
    let bad = name
        .chars()
        .find(|c| !(alnum(*c) || matches!(c, '_' | '-' | '.' | ':')));
    match (name.is_empty(), ok_ends, bad) {
        (true, _, _) => Err("the device name is empty".into()),
        (_, false, _) => Err(format!(
            "device name {} does not start and end with a letter or digit",
            quoted(name)
        )),
        (_, _, Some(c)) => Err(format!("device name {} holds {c:?}", quoted(name))),
        _ => Ok(()),
    }
}

/// Splits a fully-qualified device id `VENDOR/CLASS=NAME` into kind and name.
pub fn parse_qualified(id: &str) -> Result<(&str, &str), String> {
    let example = format!("{CLAIM_KIND}=5d1f0c1e-gpu-0");
    let Some((kind, name)) = id.split_once('=') else {
        return Err(format!(
            "{} is not a fully-qualified CDI device id VENDOR/CLASS=NAME (e.g. {example})",
            quoted(id)
        ));
    };
    check_kind(kind)
        .and_then(|()| check_device_name(name))
        .map_err(|e| {
            format!(
                "{} is not a fully-qualified CDI device id ({e}); e.g. {example}",
                quoted(id)
            )
        })?;
    Ok((kind, name))
}

/// The CDI device ids a config.json's annotations ask for: (annotation key, id) for every
/// `cdi.k8s.io/*` annotation (keys in order) and every comma-separated id in its value. Fails,
/// naming the annotation, on a value that is not a list of fully-qualified ids.
pub fn annotated_devices(config: &Value) -> Result<Vec<(String, String)>, String> {
    let Some(annotations) = config.get("annotations").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let Some(value) = annotations[key].as_str() else {
            return Err(format!(
                "annotation {}: the value is not a string",
                cut(key)
            ));
        };
        for id in value.split(',') {
            parse_qualified(id).map_err(|e| format!("annotation {}: {e}", cut(key)))?;
            out.push((key.clone(), id.to_owned()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids() {
        assert_eq!(
            parse_qualified("gpu.cuslice.io/claim=5d1f-gpu-0"),
            Ok(("gpu.cuslice.io/claim", "5d1f-gpu-0"))
        );
        assert_eq!(
            parse_qualified("vendor.com/class=a:b"),
            Ok(("vendor.com/class", "a:b"))
        );
        for bad in [
            "",
            "gpu-0",
            "/dev/nvidia0",
            "gpu.cuslice.io=x",
            "gpu.cuslice.io/claim=",
            "=x",
            "1vendor/class=x",
            "vendor/class-=x",
            "vendor/cl ass=x",
            "vendor/class=-x",
            "vendor/class=x/y",
            "vendor/class=x,y",
        ] {
            let e = parse_qualified(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("VENDOR/CLASS=NAME") || e.contains("e.g."), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn annotations() {
        let config = json!({"annotations": {
            "cdi.k8s.io/gpu.cuslice.io_uid2": "gpu.cuslice.io/claim=b",
            "cdi.k8s.io/gpu.cuslice.io_uid1": "gpu.cuslice.io/claim=a,vendor.com/x=y",
            "other": "z",
        }});
        assert_eq!(
            annotated_devices(&config).unwrap(),
            [
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid1".into(),
                    "gpu.cuslice.io/claim=a".into()
                ),
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid1".into(),
                    "vendor.com/x=y".into()
                ),
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid2".into(),
                    "gpu.cuslice.io/claim=b".into()
                ),
            ]
        );
        assert_eq!(annotated_devices(&json!({})).unwrap(), []);
        assert_eq!(
            annotated_devices(&json!({"annotations": {"a": "b"}})).unwrap(),
            []
        );
        let e =
            annotated_devices(&json!({"annotations": {"cdi.k8s.io/k": "v.com/c=a,,v.com/c=b"}}))
                .unwrap_err();
        assert!(e.starts_with("annotation cdi.k8s.io/k: \"\" is not"), "{e}");

        // A megabyte in an annotation's value, in a vendor, in a device name, or in its key: the
        // refusal shows 64 characters of each and the length.
        let mb = "x".repeat(1 << 20);
        for (k, v) in [
            ("cdi.k8s.io/k".to_owned(), mb.clone()),
            ("cdi.k8s.io/k".to_owned(), format!("{mb}!.com/c=d")),
            ("cdi.k8s.io/k".to_owned(), format!("v.com/c={mb}!")),
            (format!("cdi.k8s.io/{mb}"), "bad".to_owned()),
        ] {
            let Err(e) = annotated_devices(&json!({"annotations": {k: v}})) else {
                panic!("a megabyte in an annotation was taken");
            };
            assert!(
                e.len() < 1000 && e.contains("(1048"),
                "{} bytes: {}",
                e.len(),
                &e[..200]
            );
        }
    }
}
