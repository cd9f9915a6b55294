//! Every period: the driver's own per-process memory and utilisation (NVML), mapped to slices,
//! checked against each slice's cap and limit from the hook's records. (To be built.)

use crate::Config;

pub struct Verifier {}

impl Verifier {
    pub fn new(_cfg: &Config) -> Verifier {
        Verifier {}
    }

    /// One period's check (and, under `Enforce::Stop`, its enforcement).
    pub fn tick(&mut self) {}
}
