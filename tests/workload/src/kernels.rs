//! The kernels the launching scenarios use, and how the workload picks their image.
//!
//! Two kernels (`--kernel`):
//! - **spin** (`spin.ptx`): every block busy-waits on the device's global timer for the
//!   nanoseconds its one parameter says. It ends on time whatever else ran on the device in
//!   between, so beside other processes it may use less device time than it asked for: a measure
//!   of a slice alone only.
//! - **work** (`work.ptx`): every thread runs a chain of `iters` dependent multiply-adds and
//!   stores the result, a fixed amount of work. Preempted, it resumes where it stopped, so the
//!   number a process completes measures the device time it got, beside others too. Its length
//!   on a real GPU is `iters` over the GPU's rate (`calibrate-work` measures it); its second
//!   parameter, which the real driver ignores, gives the simulated GPU its length.
//!
//! Each has two images:
//! - **PTX**: real code. A real driver JIT-compiles it; the simulated one reads its cost from an
//!   annotation.
//! - **text**: the simulated GPU's own format (`kernel spin NS_PER_BLOCK wait`, `kernel work
//!   NS_PER_BLOCK`), which only it loads.
//!
//! `--image auto` (the default) loads the PTX and falls back to the text image only when the
//! driver refuses the PTX (a driver without a JIT compiler, say). Which image ran, and what was
//! refused, goes into the scenario's output.
//!
//! A scenario asks for kernels of `blocks` blocks of `ns_per_block` each, i.e. `ns_per_block x
//! blocks` ns of device time per launch. The text image's blocks run one after another, so it is
//! launched as asked. The PTX image's blocks run side by side, so it is launched with
//! `min(blocks, SMs)` blocks that each spin (or work) for the whole time: the kernel keeps the
//! device busy for the same `ns_per_block x blocks` ns on a real GPU and on the simulated one.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;

use clap::ValueEnum;
use cuda_abi::*;
use serde_json::{Value, json};

use crate::driver::{CuError, Driver};

/// The spin kernel's PTX image, NUL-terminated as `cuModuleLoadData` wants text.
pub const SPIN_PTX: &str = concat!(include_str!("spin.ptx"), "\0");
/// The work kernel's PTX image, NUL-terminated.
pub const WORK_PTX: &str = concat!(include_str!("work.ptx"), "\0");

/// Threads per block of every launch.
pub const BLOCK_DIM: u32 = 128;

/// Iterations of the work kernel's chain per microsecond when `--work-iters` is not given: a
/// guess for a Hopper GPU (one dependent multiply-add every 4 cycles at about 1.8 GHz). On a real
/// GPU, `calibrate-work` measures the rate; the simulated GPU ignores it.
pub const DEFAULT_WORK_ITERS_PER_US: u64 = 450;

/// `--kernel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KernelArg {
    /// spin on the device's global timer for the kernel's length (ends on time, whatever else
    /// ran): a measure of a slice alone only
    Spin,
    /// a fixed amount of arithmetic (--work-iters on a real GPU): completed kernels measure the
    /// device time a slice got, beside others too
    Work,
}

impl KernelArg {
    pub fn name(self) -> &'static str {
        match self {
            KernelArg::Spin => "spin",
            KernelArg::Work => "work",
        }
    }
}

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

/// The simulator's text image of `kernel` at `ns_per_block` per block, NUL-terminated.
pub fn text_image(kernel: KernelArg, ns_per_block: u64) -> Vec<u8> {
    match kernel {
        KernelArg::Spin => format!("kernel spin {ns_per_block} wait\n\0"),
        KernelArg::Work => format!("kernel work {ns_per_block}\n\0"),
    }
    .into_bytes()
}

/// The work kernel's iterations for a kernel of `kernel_ns` at the default rate (at least 1).
pub fn default_work_iters(kernel_ns: u64) -> u64 {
    (kernel_ns.saturating_mul(DEFAULT_WORK_ITERS_PER_US) / 1000).max(1)
}

/// A loaded kernel.
pub struct Kernel {
    module: CUmodule,
    pub func: CUfunction,
    pub kind: KernelArg,
    pub image: Image,
    /// Multiprocessors of the device (the PTX image's blocks run side by side on them).
    sms: u32,
    /// The work kernel's iterations per launch; None: the default rate for the kernel's length.
    work_iters: Option<u64>,
    /// The work kernel's output: one float per thread of a launch of `sms` blocks (0 for spin).
    out: CUdeviceptr,
    /// Images the driver refused before this one: (image, code).
    refused: Vec<(Image, CUresult)>,
}

/// How one launch is shaped: grid size and the kernel's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: u32,
    /// Nanoseconds each block spins or works for (the spin kernel's argument; the work
    /// kernel's length on the simulated GPU).
    pub arg: u64,
    /// The work kernel's iterations per thread (0 for spin).
    pub iters: u64,
}

/// A launch's kernel arguments, in the order the kernel declares them; `kernelParams` points
/// into it, so it must outlive the launch call.
pub struct Params {
    values: [u64; 3],
    count: usize,
    pointers: [*mut c_void; 3],
}

impl Params {
    /// `kernelParams` for the launch: one pointer per parameter.
    pub fn as_kernel_params(&mut self) -> *mut *mut c_void {
        for i in 0..self.count {
            self.pointers[i] = &mut self.values[i] as *mut u64 as *mut c_void;
        }
        self.pointers.as_mut_ptr()
    }
}

impl Kernel {
    /// Loads `kind` into the current context. `ns_per_block` is what the text image defines
    /// (the PTX image takes its time as an argument); `work_iters` the work kernel's iterations
    /// per launch (None: the default rate).
    pub fn load(
        d: &Driver,
        dev: CUdevice,
        kind: KernelArg,
        choice: ImageArg,
        ns_per_block: u64,
        work_iters: Option<u64>,
    ) -> Result<Kernel, CuError> {
        let mut sms = 0;
        // SAFETY: out-pointer to a local.
        unsafe { d.cuDeviceGetAttribute(&mut sms, attr::MULTIPROCESSOR_COUNT, dev) }?;
        let sms = sms.max(1) as u32;
        let order: &[Image] = match choice {
            ImageArg::Auto => &[Image::Ptx, Image::Text],
            ImageArg::Ptx => &[Image::Ptx],
            ImageArg::Text => &[Image::Text],
        };
        let mut refused = Vec::new();
        for (k, &image) in order.iter().enumerate() {
            let (bytes, name) = match (image, kind) {
                (Image::Ptx, KernelArg::Spin) => (SPIN_PTX.as_bytes().to_vec(), c"cuslice_spin"),
                (Image::Ptx, KernelArg::Work) => (WORK_PTX.as_bytes().to_vec(), c"cuslice_work"),
                (Image::Text, KernelArg::Spin) => (text_image(kind, ns_per_block), c"spin"),
                (Image::Text, KernelArg::Work) => (text_image(kind, ns_per_block), c"work"),
            };
            match load_function(d, &bytes, name) {
                Ok((module, func)) => {
                    let mut kernel = Kernel {
                        module,
                        func,
                        kind,
                        image,
                        sms,
                        work_iters,
                        out: 0,
                        refused,
                    };
                    if kind == KernelArg::Work {
                        let bytes = sms as usize * BLOCK_DIM as usize * 4;
                        // SAFETY: out-pointer to a field.
                        if let Err(e) = unsafe { d.cuMemAlloc_v2(&mut kernel.out, bytes) } {
                            let _ = kernel.unload(d);
                            return Err(e);
                        }
                    }
                    return Ok(kernel);
                }
                // A refused image: try the next one, if any.
                Err(e) if !e.missing && k + 1 < order.len() => refused.push((image, e.code)),
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last image's failure is returned")
    }

    /// The work kernel's iterations per launch from now on.
    pub fn set_work_iters(&mut self, iters: u64) {
        self.work_iters = Some(iters);
    }

    /// The launch of a kernel of `blocks` blocks of `ns_per_block` each (see the module docs).
    pub fn shape(&self, ns_per_block: u64, blocks: u32) -> Shape {
        let kernel_ns = ns_per_block.saturating_mul(u64::from(blocks));
        let iters = match self.kind {
            KernelArg::Spin => 0,
            KernelArg::Work => self
                .work_iters
                .unwrap_or_else(|| default_work_iters(kernel_ns)),
        };
        match self.image {
            Image::Text => Shape {
                grid: blocks,
                arg: ns_per_block,
                iters,
            },
            Image::Ptx => Shape {
                grid: blocks.min(self.sms),
                arg: kernel_ns,
                iters,
            },
        }
    }

    /// The arguments of a launch shaped as `shape`: (ns) for spin, (iters, ns, out) for work.
    pub fn params(&self, shape: Shape) -> Params {
        let (values, count) = match self.kind {
            KernelArg::Spin => ([shape.arg, 0, 0], 1),
            KernelArg::Work => ([shape.iters, shape.arg, self.out], 3),
        };
        Params {
            values,
            count,
            pointers: [null_mut(); 3],
        }
    }

    /// Fields for a scenario's output: the kernel, its image, and any image refused before it.
    pub fn describe(&self) -> Value {
        let refused: Vec<Value> = self
            .refused
            .iter()
            .map(|(i, c)| json!({"image": i.name(), "code": c.0, "name": c.name()}))
            .collect();
        json!({"kernel": self.kind.name(), "image": self.image.name(), "image_refused": refused})
    }

    pub fn unload(self, d: &Driver) -> Result<(), CuError> {
        if self.out != 0 {
            // SAFETY: allocated by `load`; no kernel that writes it is in flight any more.
            unsafe { d.cuMemFree_v2(self.out) }?;
        }
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

    fn kernel(kind: KernelArg, image: Image, work_iters: Option<u64>) -> Kernel {
        Kernel {
            module: null_mut(),
            func: null_mut(),
            kind,
            image,
            sms: 132,
            work_iters,
            out: 0x7000,
            refused: vec![],
        }
    }

    #[test]
    fn images_and_shapes() {
        assert_eq!(
            text_image(KernelArg::Spin, 5000),
            b"kernel spin 5000 wait\n\0"
        );
        assert_eq!(text_image(KernelArg::Work, 5000), b"kernel work 5000\n\0");
        for ptx in [SPIN_PTX, WORK_PTX] {
            assert!(ptx.ends_with('\0') && ptx.matches('\0').count() == 1);
        }
        assert!(SPIN_PTX.contains(".entry cuslice_spin("));
        assert!(SPIN_PTX.contains("// simgpu-kernel cuslice_spin wait-ns=param0"));
        assert!(WORK_PTX.contains(".entry cuslice_work("));
        assert!(WORK_PTX.contains("// simgpu-kernel cuslice_work block-ns=param1"));
        let spin = |image| kernel(KernelArg::Spin, image, None);
        let shape = |grid, arg, iters| Shape { grid, arg, iters };
        // 1 ms kernels either way.
        assert_eq!(spin(Image::Text).shape(1000, 1000), shape(1000, 1000, 0));
        assert_eq!(spin(Image::Ptx).shape(1000, 1000), shape(132, 1_000_000, 0));
        assert_eq!(spin(Image::Ptx).shape(50_000, 1), shape(1, 50_000, 0));
        // The work kernel: as many iterations as the default rate gives, or as asked.
        let work = kernel(KernelArg::Work, Image::Ptx, None);
        assert_eq!(work.shape(1000, 1000), shape(132, 1_000_000, 450_000));
        let work = kernel(KernelArg::Work, Image::Ptx, Some(7));
        assert_eq!(work.shape(1000, 50), shape(50, 50_000, 7));
        assert_eq!(default_work_iters(1), 1);
    }

    #[test]
    fn parameters_are_laid_out_as_each_kernel_declares_them() {
        let s = Shape {
            grid: 132,
            arg: 1_000_000,
            iters: 450_000,
        };
        let mut p = kernel(KernelArg::Spin, Image::Ptx, None).params(s);
        let ptrs = p.as_kernel_params();
        // SAFETY: one pointer per parameter, each to a u64 inside `p`.
        assert_eq!(unsafe { *(*ptrs as *const u64) }, 1_000_000);
        let mut p = kernel(KernelArg::Work, Image::Ptx, None).params(s);
        let ptrs = p.as_kernel_params();
        // SAFETY: as above, three parameters.
        let read = |i| unsafe { *(*ptrs.add(i) as *const u64) };
        assert_eq!((read(0), read(1), read(2)), (450_000, 1_000_000, 0x7000));
    }
}
