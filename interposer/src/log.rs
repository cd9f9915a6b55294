//! A logger that cannot allocate, lock or reach stdout: one `write(2)` to stderr per line.
//! Quiet by default (errors only); `CUSLICE_LOG` raises the level once the configuration is read.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

pub use cuslice_policy::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(0);

fn rank(l: LogLevel) -> u8 {
    match l {
        LogLevel::Error => 0,
        LogLevel::Warn => 1,
        LogLevel::Info => 2,
        LogLevel::Debug => 3,
    }
}

pub fn set_level(l: LogLevel) {
    LEVEL.store(rank(l), Ordering::Relaxed);
}

pub fn enabled(l: LogLevel) -> bool {
    rank(l) <= LEVEL.load(Ordering::Relaxed)
}

/// A line buffer on the stack; text past its end is cut, never allocated for.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        if let (Some(dst), Some(src)) = (
            self.buf.get_mut(self.len..self.len + n),
            s.as_bytes().get(..n),
        ) {
            dst.copy_from_slice(src);
            self.len += n;
        }
        Ok(())
    }
}

/// Writes `cuslice: <message>\n` to stderr if `level` is enabled.
pub fn emit(level: LogLevel, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut line = Line {
        buf: [0; 512],
        len: 0,
    };
    let _ = line.write_str("cuslice: ");
    let _ = line.write_fmt(args);
    if let Some(b) = line.buf.get_mut(line.len) {
        *b = b'\n';
        line.len += 1;
    }
    // SAFETY: writes `len` initialised bytes from a live stack buffer to fd 2.
    unsafe { libc::write(2, line.buf.as_ptr().cast(), line.len) };
}

macro_rules! error { ($($t:tt)*) => { $crate::log::emit($crate::log::LogLevel::Error, format_args!($($t)*)) } }
macro_rules! warning { ($($t:tt)*) => { $crate::log::emit($crate::log::LogLevel::Warn, format_args!($($t)*)) } }
macro_rules! info { ($($t:tt)*) => { $crate::log::emit($crate::log::LogLevel::Info, format_args!($($t)*)) } }
macro_rules! debug { ($($t:tt)*) => { if $crate::log::enabled($crate::log::LogLevel::Debug) { $crate::log::emit($crate::log::LogLevel::Debug, format_args!($($t)*)) } } }
pub(crate) use {debug, error, info, warning};
