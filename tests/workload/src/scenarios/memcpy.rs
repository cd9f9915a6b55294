//! memcpy: copies a reproducible pattern to the device and back, and checks it; keep: a notebook's
//! kernel, which keeps a pattern on the device and reads it back after each idle spell.

use super::*;

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::raw(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn memcpy(s: &Session, a: &MemcpyArgs) -> Result<(), Failure> {
    let d = s.d;
    let n = a.bytes as usize;
    let first = pattern(n, 0x9e37_79b9_7f4a_7c15);
    let second: Vec<u8> = first.iter().map(|b| !b).collect();
    let mut back = vec![0u8; n];
    let (mut x, mut y): (CUdeviceptr, CUdeviceptr) = (0, 0);
    // SAFETY: out-pointer to a local.
    unsafe { d.cuMemAlloc_v2(&mut x, n) }?;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuMemAlloc_v2(&mut y, n) }?;
    // x <- first; read x back.
    // SAFETY: `first` holds n bytes, `x` n device bytes.
    unsafe { d.cuMemcpyHtoD_v2(x, first.as_ptr().cast(), n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let host_round_trip = back == first;
    // y <- x; overwrite x; x <- y; read x back: must be `first` again.
    // SAFETY: both allocations hold n bytes.
    unsafe { d.cuMemcpyDtoD_v2(y, x, n) }?;
    // SAFETY: `second` holds n bytes.
    unsafe { d.cuMemcpyHtoD_v2(x, second.as_ptr().cast(), n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let overwritten = back == second;
    // SAFETY: both allocations hold n bytes.
    unsafe { d.cuMemcpyDtoD_v2(x, y, n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let device_round_trip = back == first;
    // SAFETY: allocated above, freed once.
    unsafe { d.cuMemFree_v2(x) }?;
    // SAFETY: allocated above, freed once.
    unsafe { d.cuMemFree_v2(y) }?;
    let ok = host_round_trip && overwritten && device_round_trip;
    emit(
        "memcpy",
        json!({"bytes": a.bytes, "ok": ok, "htod_dtoh": host_round_trip,
               "overwrite": overwritten, "dtod": device_round_trip}),
    );
    if ok { Ok(()) } else { Err(Failure::Check) }
}

/// A notebook's kernel: allocates `--bytes`, writes a pattern over its first and last MiB, then
/// `--cells` times idles `--idle-secs` (no CUDA call) and reads both back (the first call after
/// an idle spell: where the process was frozen meanwhile, the thaw). One `holding` line (pid,
/// bytes), one `checked` line per cell (cell, intact, read_ms: the read's wall time), then the
/// allocation is freed; exit 1 if any cell found its bytes changed.
pub fn keep(s: &Session, a: &KeepArgs) -> Result<(), Failure> {
    let d = s.d;
    let n = a.bytes as usize;
    let piece = n.min(1 << 20) / 2;
    let head = pattern(piece, 0x5eed_0001 ^ u64::from(std::process::id()));
    let tail = pattern(piece, 0x5eed_0002 ^ u64::from(std::process::id()));
    let mut p: CUdeviceptr = 0;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuMemAlloc_v2(&mut p, n) }?;
    let end = p + (n - piece) as CUdeviceptr;
    // SAFETY: `head` and `tail` hold `piece` bytes each, within the n device bytes at `p`.
    unsafe { d.cuMemcpyHtoD_v2(p, head.as_ptr().cast(), piece) }?;
    // SAFETY: as above.
    unsafe { d.cuMemcpyHtoD_v2(end, tail.as_ptr().cast(), piece) }?;
    emit(
        "holding",
        json!({"pid": std::process::id(), "bytes": a.bytes}),
    );
    let mut all = true;
    let mut back = vec![0u8; piece];
    for cell in 0..a.cells {
        std::thread::sleep(Duration::from_secs_f64(a.idle_secs));
        let t = Instant::now();
        // SAFETY: `back` holds `piece` bytes.
        unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, piece) }?;
        let head_ok = back == head;
        // SAFETY: as above.
        unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), end, piece) }?;
        let intact = head_ok && back == tail;
        all &= intact;
        emit(
            "checked",
            json!({"cell": cell, "intact": intact, "read_ms": t.elapsed().as_secs_f64() * 1e3}),
        );
    }
    // SAFETY: allocated above, freed once.
    unsafe { d.cuMemFree_v2(p) }?;
    if all { Ok(()) } else { Err(Failure::Check) }
}
