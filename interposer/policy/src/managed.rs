//! What the driver holds on a device for a process's managed memory there.
//!
//! The driver backs managed memory with device memory as it is touched, in steps: on an NVIDIA
//! H100 with driver 580, one 64 MiB managed allocation set to zero raised the device's used
//! memory by 128 MiB, ten of them by 640 MiB, while an ordinary 64 MiB allocation raised it by
//! 64 MiB. So a process's managed memory on a device may hold up to a step more than its
//! allocations add up to, and a slice charged only the allocations could hold more than its cap
//! (55 x 64 MiB under a 4 GiB cap took 4110 MiB of the device). The library charges the
//! allocations, and beside them what this rounding may add: `slack`.

/// The step in which the driver backs a process's managed memory on a device.
pub const STEP: u64 = 128 << 20;

/// What the driver may hold beyond `bytes` of a process's managed allocations on one device:
/// their sum rounded up to the next `STEP`, less the sum.
pub fn slack(bytes: u64) -> u64 {
    bytes
        .checked_next_multiple_of(STEP)
        .map_or(0, |backed| backed - bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn managed_memory_is_charged_up_to_the_drivers_step() {
        // None held: nothing added.
        assert_eq!(slack(0), 0);
        // One 64 MiB allocation: the driver took 128 MiB.
        assert_eq!(64 * MIB + slack(64 * MIB), 128 * MIB);
        // Ten: 640 MiB, a whole number of steps.
        assert_eq!(slack(640 * MIB), 0);
        // 55 x 64 MiB: backed as 3584 MiB, which with a 518 MiB context leaves a 4 GiB cap
        // unmet by 6 MiB: the 55th is refused.
        assert_eq!(55 * 64 * MIB + slack(55 * 64 * MIB), 3584 * MIB);
        // A small one still counts a whole step.
        assert_eq!(2 * MIB + slack(2 * MIB), STEP);
        // Never overflows (nothing that large can be held).
        assert_eq!(slack(u64::MAX), 0);
    }
}
