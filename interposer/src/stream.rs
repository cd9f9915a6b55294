//! What the library asks the driver about an application's stream, for more than one area.

use cuda_abi::*;

use crate::real;

/// Whether `stream` is being captured into a graph (`ptsz`: the call came through a `_ptsz`
/// entry point); None when the driver cannot say (no such call, or it refused the stream). What
/// each caller does then is its own: a pool allocation takes it as not captured, a timed launch
/// and a yielding one as captured.
pub(crate) fn capturing(stream: CUstream, ptsz: bool) -> Option<bool> {
    let f = if ptsz {
        real::cuStreamIsCapturing_ptsz()
    } else {
        real::cuStreamIsCapturing()
    }?;
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; `stream` is the caller's stream.
    let r = unsafe { f(stream, &mut status) };
    r.is_ok().then_some(status != CU_STREAM_CAPTURE_STATUS_NONE)
}
