//! The release mark: each installed file that cannot answer `--version` (the two libraries and
//! `cuslice-runtime`, which hands its arguments to runc) holds `RELEASE_MARK`, its release and a
//! NUL, so that `cuslice doctor` can say of every installed file which release it is, and
//! whether they match (`release_in`).

/// What begins the mark.
pub const RELEASE_MARK: &str = "cuslice-release ";

/// Defines a `static RELEASE` holding the calling crate's release mark, kept in the built file
/// (`#[used]`). The loader, which depends on nothing, spells the same out itself.
#[macro_export]
macro_rules! release_mark {
    () => {
        /// This file's release, as `cuslice doctor` reads it (`cuslice_state::release`).
        #[used]
        static RELEASE: [u8; RELEASE_TEXT.len()] = $crate::release::bytes_of(RELEASE_TEXT);
        const RELEASE_TEXT: &str = concat!("cuslice-release ", env!("CARGO_PKG_VERSION"), "\0");
    };
}

/// `text` as an array of its bytes (N must be its length).
pub const fn bytes_of<const N: usize>(text: &str) -> [u8; N] {
    let (b, mut a, mut i) = (text.as_bytes(), [0u8; N], 0);
    while i < N {
        a[i] = b[i];
        i += 1;
    }
    a
}

/// The release marked in `bytes` (a file's contents): None where there is no mark, or none
/// followed by a NUL within 64 bytes.
pub fn release_in(bytes: &[u8]) -> Option<String> {
    let mark = RELEASE_MARK.as_bytes();
    let at = bytes.windows(mark.len()).position(|w| w == mark)? + mark.len();
    let rest = &bytes[at..bytes.len().min(at + 64)];
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::release_mark!();

    #[test]
    fn the_mark_is_found_with_its_release_and_nothing_else_is() {
        let mut file = b"\x7fELF....".to_vec();
        file.extend_from_slice(&RELEASE);
        file.extend_from_slice(b"more");
        assert_eq!(
            release_in(&file).as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(release_in(b"no mark here"), None);
        assert_eq!(release_in(b"cuslice-release 0.1.0 without its end"), None);
    }
}
