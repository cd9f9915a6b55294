//! Results as JSON lines on stdout: one object per line, `event` and `pid` first, flushed at once.

use std::io::Write;

use serde_json::{Value, json};

use crate::driver::CuError;

/// Formats one line (without the newline): `{"event":..,"pid":..,<fields>}`.
pub fn line(event: &str, fields: Value) -> String {
    let mut s = format!(
        "{{\"event\":{},\"pid\":{}",
        json!(event),
        std::process::id()
    );
    if let Value::Object(map) = fields {
        for (k, v) in map {
            if k == "event" || k == "pid" {
                continue;
            }
            s.push(',');
            s.push_str(&json!(k).to_string());
            s.push(':');
            s.push_str(&v.to_string());
        }
    }
    s.push('}');
    s
}

/// Prints one event line and flushes. A closed stdout is ignored (the run still completes).
pub fn emit(event: &str, fields: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line(event, fields));
    let _ = out.flush();
}

/// The `error` event of an unexpected driver failure.
pub fn cu_error(e: &CuError) {
    eprintln!("cuda-workload: {e}");
    if e.missing {
        emit(
            "error",
            json!({ "call": e.call, "code": -1, "missing": true }),
        );
    } else {
        emit(
            "error",
            json!({ "call": e.call, "code": e.code.0, "name": e.name() }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_and_pid_come_first() {
        let l = line(
            "start",
            json!({"total": 1, "event": "ignored", "route": "dlsym"}),
        );
        assert!(
            l.starts_with(&format!(
                "{{\"event\":\"start\",\"pid\":{},",
                std::process::id()
            )),
            "{l}"
        );
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["event"], "start");
        assert_eq!(v["total"], 1);
        assert_eq!(v["route"], "dlsym");
        assert!(!l.contains('\n'));
        assert_eq!(
            line("x", json!({})),
            format!("{{\"event\":\"x\",\"pid\":{}}}", std::process::id())
        );
    }
}
