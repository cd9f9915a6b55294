//! The `cuGetProcAddress_v2` request sequences libcudart makes, as recorded in
//! `tests/data/cudart-*-getprocaddress.txt`.
//!
//! Format: lines starting with `#` are comments; every other line is `symbol cudaVersion flags`,
//! separated by whitespace. The first request of each list asks for the empty symbol, so that line
//! has only the two numbers.

use std::fmt;

/// The list libcudart 12.9.79 replays during `cudaGetDeviceCount`.
pub const CUDART_12_9: &str = include_str!("../../data/cudart-12.9-getprocaddress.txt");
/// The list libcudart 13.0.96 replays during `cudaGetDeviceCount`.
pub const CUDART_13_0: &str = include_str!("../../data/cudart-13.0-getprocaddress.txt");

/// One `cuGetProcAddress_v2(symbol, &pfn, cuda_version, flags, &status)` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub symbol: &'a str,
    pub cuda_version: i32,
    pub flags: u64,
}

/// A line that is neither a comment nor a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}: {:?} is not `symbol cudaVersion flags`",
            self.line, self.text
        )
    }
}

impl std::error::Error for ParseError {}

/// Parses a request list, keeping the order.
pub fn parse(text: &str) -> Result<Vec<Request<'_>>, ParseError> {
    let mut out = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fail = || ParseError {
            line: index + 1,
            text: line.to_string(),
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (symbol, version, flags) = match fields.as_slice() {
            [symbol, version, flags] => (*symbol, *version, *flags),
            [version, flags] => ("", *version, *flags),
            _ => return Err(fail()),
        };
        out.push(Request {
            symbol,
            cuda_version: version.parse().map_err(|_| fail())?,
            flags: flags.parse().map_err(|_| fail())?,
        });
    }
    Ok(out)
}

/// A recorded runtime: its request list and the CUDA version it is (what it passes to
/// `cuGetProcAddress` for entry points it resolves later, outside the recorded list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runtime {
    pub name: &'static str,
    pub list: &'static str,
    pub cuda_version: i32,
}

pub const RUNTIME_12_9: Runtime = Runtime {
    name: "cudart-12.9",
    list: CUDART_12_9,
    cuda_version: 12090,
};
pub const RUNTIME_13_0: Runtime = Runtime {
    name: "cudart-13.0",
    list: CUDART_13_0,
    cuda_version: 13000,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_lists_parse_with_the_recorded_counts() {
        let v12 = parse(CUDART_12_9).unwrap();
        let v13 = parse(CUDART_13_0).unwrap();
        assert_eq!(v12.len(), 419);
        assert_eq!(v13.len(), 440);
        for list in [&v12, &v13] {
            assert_eq!(
                list[0],
                Request {
                    symbol: "",
                    cuda_version: 0,
                    flags: 0
                }
            );
            assert_eq!(
                list[1],
                Request {
                    symbol: "cuInit",
                    cuda_version: 2000,
                    flags: 0
                }
            );
            assert_eq!(
                list[2],
                Request {
                    symbol: "cuGetProcAddress",
                    cuda_version: 11030,
                    flags: 0
                }
            );
            assert_eq!(
                list[3],
                Request {
                    symbol: "cuGetProcAddress",
                    cuda_version: 12000,
                    flags: 0
                }
            );
            assert!(list[1..].iter().all(|r| r.symbol.starts_with("cu")));
            assert!(list.iter().all(|r| r.flags == 0 || r.flags == 2));
        }
    }

    #[test]
    fn runtime_versions_cover_their_lists() {
        for rt in [RUNTIME_12_9, RUNTIME_13_0] {
            let max = parse(rt.list)
                .unwrap()
                .iter()
                .map(|r| r.cuda_version)
                .max()
                .unwrap();
            assert!(
                max <= rt.cuda_version,
                "{}: {max} > {}",
                rt.name,
                rt.cuda_version
            );
        }
        assert_eq!(
            parse(CUDART_13_0)
                .unwrap()
                .iter()
                .map(|r| r.cuda_version)
                .max(),
            Some(13000)
        );
    }

    #[test]
    fn empty_symbol_with_leading_whitespace_and_bad_lines() {
        let list = parse("# c\n  0 0\ncuInit 2000 0\n").unwrap();
        assert_eq!(list[0].symbol, "");
        assert_eq!(list.len(), 2);
        assert_eq!(parse("cuInit x 0\n").unwrap_err().line, 1);
        assert_eq!(parse("# c\na b c d\n").unwrap_err().line, 2);
        assert!(parse("0\n").is_err());
    }
}
