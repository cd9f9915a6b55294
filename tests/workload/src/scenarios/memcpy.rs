//! memcpy: copies a reproducible pattern to the device and back, and checks it.

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
