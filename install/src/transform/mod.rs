//! Pure transforms: configuration text in, configuration text out, no I/O. The file-system side
//! (`plan`) reads the files, calls these, shows or writes the result.

pub mod containerd;
pub mod docker;
pub mod glob;
pub mod jsonedit;
pub mod owned;
pub mod slurm;
