//! The node tools: `cuslice status`, `cuslice top`, `cuslice exporter` and `cuslice set` (`set`). `collect` gathers
//! what each slice holds and gets from the ledgers (and the GPUs from NVML) into a `view::Node`;
//! `text` renders it for people, `metrics` for Prometheus, `exporter` serves that over HTTP.
//! See docs/status.md.

pub mod collect;
pub mod exporter;
pub mod findings;
pub mod metrics;
pub mod nvml;
pub mod requests;
pub mod set;
pub mod text;
pub mod view;
