//! The spin kernel every launching scenario uses, and how the workload picks its image.
//!
//! Two images define it:
//! - **PTX** (`spin.ptx`): real code. Every block busy-waits on the device's global timer for the
//!   nanoseconds its one parameter says. A real driver JIT-compiles it; the simulated one reads
//!   its cost from an annotation.
//! - **text**: the simulated GPU's own format (`kernel spin NS_PER_BLOCK`), which only it loads.
//!
//! `--image auto` (the default) loads the PTX and falls back to the text image only when the
//! driver refuses the PTX (a driver without a JIT compiler, say). Which image ran, and what was
//! refused, goes into the scenario's output.
//!
//! A scenario asks for kernels of `blocks` blocks of `ns_per_block` each, i.e. `ns_per_block x
//! blocks` ns of device time per launch. The text image's blocks run one after another, so it is
//! launched as asked. The PTX image's blocks run side by side, so it is launched with
//! `min(blocks, SMs)` blocks that each spin for the whole time: the kernel keeps the device busy
//! for the same `ns_per_block x blocks` ns on a real GPU and on the simulated one.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;

use clap::ValueEnum;
use cuda_abi::*;
use serde_json::{Value, json};

use crate::driver::{CuError, Driver};

/// The PTX image, NUL-terminated as `cuModuleLoadData` wants text.
pub const SPIN_PTX: &str = concat!(include_str!("spin.ptx"), "\0");

/// `--image`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ImageArg {
    /// PTX, falling back to the simulator's text image if the driver refuses it
    Auto,
    /// PTX only (JIT-compiled by the driver)
    Ptx,
    /// the simulated GPU's text image only
    Text,
}

/// The image a loaded kernel came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    Ptx,
    Text,
}

impl Image {
    pub fn name(self) -> &'static str {
        match self {
            Image::Ptx => "ptx",
            Image::Text => "text",
        }
    }
}

/// The simulator's text image of a spin kernel of `ns_per_block` per block, NUL-terminated.
pub fn text_image(ns_per_block: u64) -> Vec<u8> {
    format!("kernel spin {ns_per_block}\n\0").into_bytes()
}

/// A loaded spin kernel.
pub struct Spin {
    module: CUmodule,
    pub func: CUfunction,
    pub image: Image,
    /// Multiprocessors of the device (the PTX image's blocks run side by side on them).
    sms: u32,
    /// Images the driver refused before this one: (image, code).
    refused: Vec<(Image, CUresult)>,
}

/// How one launch is shaped: grid size and the kernel's argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: u32,
    pub arg: u64,
}

impl Spin {
    /// Loads the kernel into the current context. `ns_per_block` is what the text image defines
    /// (the PTX image takes its time as an argument).
    pub fn load(
        d: &Driver,
        dev: CUdevice,
        choice: ImageArg,
        ns_per_block: u64,
    ) -> Result<Spin, CuError> {
        let mut sms = 0;
        // SAFETY: out-pointer to a local.
        unsafe { d.cuDeviceGetAttribute(&mut sms, attr::MULTIPROCESSOR_COUNT, dev) }?;
        let order: &[Image] = match choice {
            ImageArg::Auto => &[Image::Ptx, Image::Text],
            ImageArg::Ptx => &[Image::Ptx],
            ImageArg::Text => &[Image::Text],
        };
        let mut refused = Vec::new();
        for (k, &image) in order.iter().enumerate() {
            let (bytes, name) = match image {
                Image::Ptx => (SPIN_PTX.as_bytes().to_vec(), c"cuslice_spin"),
                Image::Text => (text_image(ns_per_block), c"spin"),
            };
            match load_function(d, &bytes, name) {
                Ok((module, func)) => {
                    return Ok(Spin {
                        module,
                        func,
                        image,
                        sms: sms.max(1) as u32,
                        refused,
                    });
                }
                // A refused image: try the next one, if any.
                Err(e) if !e.missing && k + 1 < order.len() => refused.push((image, e.code)),
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last image's failure is returned")
    }

    /// The launch of a kernel of `blocks` blocks of `ns_per_block` each (see the module docs).
    pub fn shape(&self, ns_per_block: u64, blocks: u32) -> Shape {
        match self.image {
            Image::Text => Shape {
                grid: blocks,
                arg: ns_per_block,
            },
            Image::Ptx => Shape {
                grid: blocks.min(self.sms),
                arg: ns_per_block.saturating_mul(u64::from(blocks)),
            },
        }
    }

    /// Fields for a scenario's output: the image, and any refused before it.
    pub fn describe(&self) -> Value {
        let refused: Vec<Value> = self
            .refused
            .iter()
            .map(|(i, c)| json!({"image": i.name(), "code": c.0, "name": c.name()}))
            .collect();
        json!({"image": self.image.name(), "image_refused": refused})
    }

    pub fn unload(self, d: &Driver) -> Result<(), CuError> {
        // SAFETY: nothing of the module is in use any more; unloaded once.
        unsafe { d.cuModuleUnload(self.module) }
    }
}

fn load_function(d: &Driver, image: &[u8], name: &CStr) -> Result<(CUmodule, CUfunction), CuError> {
    let mut module: CUmodule = null_mut();
    // SAFETY: `image` is a NUL-terminated module image that outlives the call.
    unsafe { d.cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }?;
    let mut func: CUfunction = null_mut();
    // SAFETY: `module` is loaded; the name is NUL-terminated.
    if let Err(e) = unsafe { d.cuModuleGetFunction(&mut func, module, name.as_ptr()) } {
        // SAFETY: loaded just above, unused.
        let _ = unsafe { d.cuModuleUnload(module) };
        return Err(e);
    }
    Ok((module, func))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_and_shapes() {
        assert_eq!(text_image(5000), b"kernel spin 5000\n\0");
        assert!(SPIN_PTX.ends_with('\0') && SPIN_PTX.matches('\0').count() == 1);
        assert!(SPIN_PTX.contains(".entry cuslice_spin("));
        assert!(SPIN_PTX.contains("// simgpu-kernel cuslice_spin block-ns=param0"));
        let spin = |image| Spin {
            module: null_mut(),
            func: null_mut(),
            image,
            sms: 132,
            refused: vec![],
        };
        // 1 ms kernels either way.
        assert_eq!(
            spin(Image::Text).shape(1000, 1000),
            Shape {
                grid: 1000,
                arg: 1000
            }
        );
        assert_eq!(
            spin(Image::Ptx).shape(1000, 1000),
            Shape {
                grid: 132,
                arg: 1_000_000
            }
        );
        assert_eq!(
            spin(Image::Ptx).shape(50_000, 1),
            Shape {
                grid: 1,
                arg: 50_000
            }
        );
    }
}
