//! What memory queries (`cuMemGetInfo`, NVML's memory info) report for a device under a cap: the
//! cap as the total and what is left of it as free, never more than the device really has free.

/// What `cuMemGetInfo` / NVML should report for a device with `cap` (`None` = uncapped), given
/// what the driver reports (`real_free`, `real_total`) and what the slice already uses on the
/// device (`slice_used`). Returns `(free, total)`.
///
/// Uncapped, the driver's numbers pass through untouched. Capped, `total = min(cap, real_total)`
/// and `free = min(real_free, total - slice_used)`, saturating at 0, so free never exceeds total
/// and nothing underflows when the slice is over its cap.
pub fn virtual_mem_info(
    real_free: u64,
    real_total: u64,
    cap: Option<u64>,
    slice_used: u64,
) -> (u64, u64) {
    match cap {
        None => (real_free, real_total),
        Some(cap) => {
            let total = cap.min(real_total);
            let free = real_free.min(total.saturating_sub(slice_used));
            (free, total)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn cases() {
        // (real_free, real_total, cap, slice_used) -> (free, total)
        let table = [
            // Uncapped: untouched, even if the driver's numbers are odd.
            ((70 * GIB, 80 * GIB, None, 5 * GIB), (70 * GIB, 80 * GIB)),
            ((90 * GIB, 80 * GIB, None, 0), (90 * GIB, 80 * GIB)),
            ((0, 0, None, u64::MAX), (0, 0)),
            // Capped, plenty free on the device: cap minus what the slice uses.
            ((70 * GIB, 80 * GIB, Some(4 * GIB), GIB), (3 * GIB, 4 * GIB)),
            ((70 * GIB, 80 * GIB, Some(4 * GIB), 0), (4 * GIB, 4 * GIB)),
            // Others hold most of the device: free is what the device really has.
            ((GIB, 80 * GIB, Some(4 * GIB), 0), (GIB, 4 * GIB)),
            ((0, 80 * GIB, Some(4 * GIB), 0), (0, 4 * GIB)),
            // Slice at or over its cap: free is 0, no underflow.
            ((70 * GIB, 80 * GIB, Some(4 * GIB), 4 * GIB), (0, 4 * GIB)),
            ((70 * GIB, 80 * GIB, Some(4 * GIB), 9 * GIB), (0, 4 * GIB)),
            ((70 * GIB, 80 * GIB, Some(4 * GIB), u64::MAX), (0, 4 * GIB)),
            // Cap larger than the device: the device's total.
            (
                (70 * GIB, 80 * GIB, Some(100 * GIB), 5 * GIB),
                (70 * GIB, 80 * GIB),
            ),
            (
                (80 * GIB, 80 * GIB, Some(u64::MAX), 5 * GIB),
                (75 * GIB, 80 * GIB),
            ),
            // The driver reporting more free than total: free still fits in total.
            (
                (90 * GIB, 80 * GIB, Some(100 * GIB), 0),
                (80 * GIB, 80 * GIB),
            ),
            ((90 * GIB, 80 * GIB, Some(4 * GIB), 0), (4 * GIB, 4 * GIB)),
            // Degenerate devices and caps.
            ((0, 0, Some(4 * GIB), 0), (0, 0)),
            ((5, 10, Some(1), 0), (1, 1)),
            (
                (u64::MAX, u64::MAX, Some(u64::MAX), 0),
                (u64::MAX, u64::MAX),
            ),
        ];
        for ((real_free, real_total, cap, used), expected) in table {
            let (free, total) = virtual_mem_info(real_free, real_total, cap, used);
            assert_eq!(
                (free, total),
                expected,
                "free {real_free} total {real_total} cap {cap:?} used {used}"
            );
            if cap.is_some() {
                assert!(free <= total);
                assert!(total <= real_total);
            }
        }
    }
}
