//! `cuGetExportTable`: the private function tables NVIDIA's runtime (libcudart, and every library
//! that carries a copy of it) asks the driver for at start-up. Which tables, which slots the
//! runtime calls and what they do are described in docs/simgpu.md ("NVIDIA's runtime on simgpu").
//!
//! Every slot simgpu does not implement holds a function that logs its table and slot to stderr
//! and returns CUDA_ERROR_NOT_SUPPORTED, never a null pointer. `SIMGPU_TRACE_EXPORTS=1` also logs
//! every table asked for and every implemented slot called. `SIMGPU_CORRUPT_INTEGRITY=1` (tests
//! only) flips one bit of the integrity answer, which the runtime must refuse.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::io::Write;
use std::sync::OnceLock;

use cuda_abi::{CUcontext, CUdevice, CUmodule, CUresult, CUuuid};
use parking_lot::Mutex;

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::integrity;

type Slot = *const c_void;

/// A table as the runtime reads it: an array of pointers at a fixed address.
#[repr(transparent)]
pub struct Table<const N: usize>([Slot; N]);

// SAFETY: the tables are immutable after compilation; they hold function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

/// The tables simgpu knows, by UUID (bytes in order), with their names for logs.
const TABLES: [(&str, [u8; 16]); 8] = [
    (
        "CUDART_INTERFACE",
        uuid(0x6bd5fb6c_5bf4e74a_8987d939_12fd9df9),
    ),
    (
        "TOOLS_RUNTIME_CALLBACK_HOOKS",
        uuid(0xa094798c_2e742e74_93f20800_200c0a66),
    ),
    ("TOOLS_TLS", uuid(0x42d85a81_23f6cb47_8298f6e7_8a3aecdc)),
    (
        "CONTEXT_LOCAL_STORAGE_V0301",
        uuid(0xc693336e_1121df11_a8c368f3_55d89593),
    ),
    (
        "CONTEXT_CHECKS",
        uuid(0x263e8860_7cd26143_92f6bbd5_006dfa7e),
    ),
    (
        "INTEGRITY_CHECK",
        uuid(0xd4082055_bde6704b_8d34ba12_3c66e1f2),
    ),
    (
        "UNNAMED_21318C60",
        uuid(0x21318c60_97143248_8ca641ff_7324c8f2),
    ),
    // Asked for before cuInit; refused, which the runtime accepts.
    (
        "UNNAMED_F8CFF951",
        uuid(0xf8cff951_21468b4e_b9e2fb46_9e7c0dd9),
    ),
];
const CUDART: usize = 0;
const HOOKS: usize = 1;
const TOOLS_TLS: usize = 2;
const CLS: usize = 3;
const CHECKS: usize = 4;
const INTEGRITY: usize = 5;
const UNNAMED: usize = 6;

const fn uuid(v: u128) -> [u8; 16] {
    v.to_be_bytes()
}

/// `8-4-4-4-12` text of a UUID's bytes in order.
pub fn uuid_text(b: &[u8; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("SIMGPU_TRACE_EXPORTS").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

fn log(line: std::fmt::Arguments) {
    // A failed write to stderr is ignored: nothing may unwind out of a driver call.
    let _ = writeln!(std::io::stderr(), "simgpu: {line}");
}

/// Traces a call of an implemented slot (with `SIMGPU_TRACE_EXPORTS`).
fn trace(table: usize, slot: usize) {
    if tracing() {
        log(format_args!(
            "export table {} ({})[{slot}] called",
            TABLES[table].0,
            uuid_text(&TABLES[table].1)
        ));
    }
}

/// What every slot without an implementation holds: one function per table and slot.
extern "C" fn unimplemented<const T: usize, const S: usize>() -> CUresult {
    log(format_args!(
        "export table {} ({})[{S}] called: not implemented by simgpu",
        TABLES[T].0,
        uuid_text(&TABLES[T].1)
    ));
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

macro_rules! stubs {
    ($t:ident; $($s:literal)*) => {
        [$(unimplemented::<$t, $s> as Slot),*]
    };
}

/// 64 unimplemented slots for table `T`.
const fn stubs<const T: usize>() -> [Slot; 64] {
    stubs!(T;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63)
}

/// Table `T` of `N` slots: stubs, slot 0 the size in bytes when `sized`, then `set`.
const fn table<const T: usize, const N: usize>(sized: bool, set: &[(usize, Slot)]) -> Table<N> {
    let all = stubs::<T>();
    let mut t = [std::ptr::null(); N];
    let mut i = 0;
    while i < N {
        t[i] = all[i];
        i += 1;
    }
    if sized {
        t[0] = (N * std::mem::size_of::<Slot>()) as Slot;
    }
    let mut j = 0;
    while j < set.len() {
        t[set[j].0] = set[j].1;
        j += 1;
    }
    Table(t)
}

static CUDART_TABLE: Table<13> = table::<CUDART, 13>(
    true,
    &[
        (1, module_from_wrapper as Slot),
        (2, primary_context as Slot),
        (6, module_from_wrapper_ext as Slot),
        (8, module_from_fatbin_ext as Slot),
        (12, load_compilers as Slot),
    ],
);
static HOOKS_TABLE: Table<7> = table::<HOOKS, 7>(
    true,
    &[(2, hook_buffer_2 as Slot), (6, hook_buffer_6 as Slot)],
);
static TOOLS_TLS_TABLE: Table<4> = table::<TOOLS_TLS, 4>(true, &[]);
static CLS_TABLE: Table<3> = table::<CLS, 3>(
    false,
    &[
        (0, cls_put as Slot),
        (1, cls_delete as Slot),
        (2, cls_get as Slot),
    ],
);
static CHECKS_TABLE: Table<17> =
    table::<CHECKS, 17>(true, &[(2, context_check as Slot), (3, check_3 as Slot)]);
static INTEGRITY_TABLE: Table<3> = table::<INTEGRITY, 3>(true, &[(1, integrity_check as Slot)]);
static UNNAMED_TABLE: Table<64> = table::<UNNAMED, 64>(true, &[]);

/// The address of table `i` of [`TABLES`], or None for one simgpu refuses.
fn table_address(i: usize) -> Option<*const c_void> {
    Some(match i {
        CUDART => &CUDART_TABLE as *const _ as *const c_void,
        HOOKS => &HOOKS_TABLE as *const _ as *const c_void,
        TOOLS_TLS => &TOOLS_TLS_TABLE as *const _ as *const c_void,
        CLS => &CLS_TABLE as *const _ as *const c_void,
        CHECKS => &CHECKS_TABLE as *const _ as *const c_void,
        INTEGRITY => &INTEGRITY_TABLE as *const _ as *const c_void,
        UNNAMED => &UNNAMED_TABLE as *const _ as *const c_void,
        _ => return None,
    })
}

/// cuGetExportTable.
pub fn get(out: *mut *const c_void, id: *const CUuuid) -> CUresult {
    if out.is_null() || id.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL; the caller passes a CUuuid.
    let id = unsafe { (*id).bytes };
    let found = TABLES.iter().position(|(_, u)| *u == id);
    let addr = found.and_then(table_address);
    match (found, addr) {
        (Some(i), Some(_)) if tracing() => {
            log(format_args!("export table {} asked for", TABLES[i].0))
        }
        (Some(i), None) if tracing() => log(format_args!(
            "export table {} asked for: refused",
            TABLES[i].0
        )),
        (None, _) => log(format_args!(
            "cuGetExportTable: unknown table {}: refused",
            uuid_text(&id)
        )),
        _ => {}
    }
    // SAFETY: checked non-NULL; the caller provides space for a pointer.
    unsafe { out.write(addr.unwrap_or(std::ptr::null())) };
    match (found, addr) {
        (_, Some(_)) => CUresult::CUDA_SUCCESS,
        (Some(_), None) => CUresult::CUDA_ERROR_NOT_SUPPORTED,
        (None, _) => CUresult::CUDA_ERROR_NOT_FOUND,
    }
}

// ---- CUDART_INTERFACE -----------------------------------------------------------------------

/// [1]: a module from a fatbin wrapper, loaded in the current context.
extern "C" fn module_from_wrapper(out: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    trace(CUDART, 1);
    // SAFETY: the runtime passes a module out-pointer and a fatbin wrapper.
    unsafe { crate::module::cuModuleLoadFatBinary(out, wrapper) }
}

/// [6]: as [1], with options simgpu ignores.
extern "C" fn module_from_wrapper_ext(
    out: *mut CUmodule,
    wrapper: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _n: c_uint,
) -> CUresult {
    trace(CUDART, 6);
    // SAFETY: as in `module_from_wrapper`.
    unsafe { crate::module::cuModuleLoadFatBinary(out, wrapper) }
}

/// [8]: a module from a fatbin (header first), with options simgpu ignores.
extern "C" fn module_from_fatbin_ext(
    fatbin: *const c_void,
    out: *mut CUmodule,
    _a: *mut c_void,
    _b: *mut c_void,
    _n: c_uint,
) -> CUresult {
    trace(CUDART, 8);
    // SAFETY: the runtime passes a fatbin and a module out-pointer.
    unsafe { crate::module::cuModuleLoadFatBinary(out, fatbin) }
}

/// [2]: the primary context of `dev`, made (and retained once) if it is not active.
extern "C" fn primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    trace(CUDART, 2);
    status((|| {
        if pctx.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let d = drv()?;
        d.physical(dev)?;
        let active = {
            let inner = d.inner.lock();
            let (h, refs, _) = inner.primary[dev as usize];
            (refs > 0 && inner.ctxs.get(h).is_some()).then_some(h)
        };
        match active {
            // SAFETY: checked non-NULL.
            Some(h) => unsafe { put(pctx, to_ptr(h)) },
            // SAFETY: as above; cuDevicePrimaryCtxRetain writes the handle.
            None => match unsafe { crate::context::cuDevicePrimaryCtxRetain(pctx, dev) } {
                CUresult::CUDA_SUCCESS => Ok(()),
                e => Err(e),
            },
        }
    })())
}

/// [12] (CUDA 13): loads the JIT compilers; simgpu has none to load.
extern "C" fn load_compilers() -> CUresult {
    trace(CUDART, 12);
    CUresult::CUDA_SUCCESS
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS -----------------------------------------------------------

const HOOK_BUFFER: usize = 4096;

/// A zeroed buffer of HOOK_BUFFER bytes for slot `i`, made once and never freed.
fn hook_buffer(i: usize, ptr: *mut *mut c_void, size: *mut usize) {
    static BUFS: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];
    let addr = *BUFS[i].get_or_init(|| {
        Box::leak(vec![0u64; HOOK_BUFFER / 8].into_boxed_slice()).as_mut_ptr() as usize
    });
    // SAFETY: out-pointers from the runtime (NULL skipped).
    unsafe {
        if !ptr.is_null() {
            ptr.write(addr as *mut c_void);
        }
        if !size.is_null() {
            size.write(HOOK_BUFFER);
        }
    }
}

extern "C" fn hook_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    trace(HOOKS, 2);
    hook_buffer(0, ptr, size);
}

extern "C" fn hook_buffer_6(ptr: *mut *mut c_void, size: *mut usize) {
    trace(HOOKS, 6);
    hook_buffer(1, ptr, size);
}

// ---- CONTEXT_LOCAL_STORAGE_V0301 ------------------------------------------------------------

type Destructor = extern "C" fn(CUcontext, *mut c_void, *mut c_void);

/// A value and its destructor.
type Entry = (usize, Option<Destructor>);

/// (context, key) -> entry.
type Storage = HashMap<(u64, usize), Entry>;

fn storage() -> &'static Mutex<Storage> {
    static S: OnceLock<Mutex<Storage>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `ctx`, or the current context for NULL; it must exist.
fn live_ctx(ctx: CUcontext) -> Res<u64> {
    let d = drv()?;
    let inner = d.inner.lock();
    let h = match from_ptr(ctx) {
        0 => inner.cur()?.0,
        h => h,
    };
    inner.ctx(h)?;
    Ok(h)
}

extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<Destructor>,
) -> CUresult {
    trace(CLS, 0);
    status(live_ctx(ctx).map(|h| {
        storage()
            .lock()
            .insert((h, key as usize), (value as usize, dtor));
    }))
}

extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    trace(CLS, 1);
    status(live_ctx(ctx).and_then(|h| {
        storage()
            .lock()
            .remove(&(h, key as usize))
            .map(|_| ())
            .ok_or(E_INVALID_HANDLE)
    }))
}

/// A miss, for a context that has no such key or no longer exists, is CUDA_ERROR_INVALID_HANDLE:
/// the runtime takes that to mean "make the state afresh".
extern "C" fn cls_get(out: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CUresult {
    trace(CLS, 2);
    let h = match from_ptr(ctx) {
        0 => current_ctx().unwrap_or(0),
        h => h,
    };
    let v = storage().lock().get(&(h, key as usize)).map(|e| e.0);
    match v {
        // SAFETY: out-pointer from the runtime (NULL refused by `put`).
        Some(v) => status(unsafe { put(out, v as *mut c_void) }),
        None => E_INVALID_HANDLE,
    }
}

/// Runs (and forgets) the destructors stored for context `h`, which is about to be destroyed.
/// Call with no driver lock held: a destructor calls back into the driver.
pub fn context_ending(h: u64) {
    let mine: Vec<((u64, usize), Entry)> = {
        let mut s = storage().lock();
        let keys: Vec<(u64, usize)> = s.keys().filter(|k| k.0 == h).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|v| (k, v)))
            .collect()
    };
    if tracing() && !mine.is_empty() {
        log(format_args!(
            "context-local storage: {} entries of context {h:#x} destroyed",
            mine.len()
        ));
    }
    for ((_, key), (value, dtor)) in mine {
        if let Some(f) = dtor {
            f(to_ptr(h), key as *mut c_void, value as *mut c_void);
        }
    }
}

// ---- CONTEXT_CHECKS -------------------------------------------------------------------------

/// [2]: (context, out u32, out pointer): nothing to report (0 and NULL).
extern "C" fn context_check(_ctx: CUcontext, flag: *mut u32, ptr: *mut *const c_void) -> CUresult {
    trace(CHECKS, 2);
    // SAFETY: out-pointers from the runtime (NULL skipped).
    unsafe {
        if !flag.is_null() {
            flag.write(0);
        }
        if !ptr.is_null() {
            ptr.write(std::ptr::null());
        }
    }
    CUresult::CUDA_SUCCESS
}

/// [3]: always 0.
extern "C" fn check_3() -> u32 {
    trace(CHECKS, 3);
    0
}

// ---- INTEGRITY_CHECK ------------------------------------------------------------------------

/// [1]: the answer the runtime checks to know it talks to a genuine driver.
extern "C" fn integrity_check(version: u32, seconds: u64, out: *mut [u64; 2]) -> CUresult {
    trace(INTEGRITY, 1);
    status((|| {
        let d = drv()?;
        let devices: Vec<integrity::DeviceRecord> = (0..d.visible.len() as i32)
            .map(|ordinal| {
                let info = d.state.device_info(d.visible[ordinal as usize]);
                integrity::DeviceRecord {
                    uuid: info.uuid,
                    pci_domain: 0,
                    pci_bus: info.pci_bus as i32,
                    pci_device: 0,
                }
            })
            .collect();
        let record = integrity::Record {
            driver_version: d.state.config().driver_version as u32,
            version,
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: &CUDART_TABLE as *const _ as u64,
            integrity_table: &INTEGRITY_TABLE as *const _ as u64,
            function: INTEGRITY_TABLE.0[1] as u64,
            seconds,
        };
        let mut answer = integrity::answer(&record, &devices);
        if version % 10 >= 2 && std::env::var("SIMGPU_CORRUPT_INTEGRITY").is_ok_and(|v| v == "1") {
            answer[0] ^= 1;
        }
        // SAFETY: out-pointer from the runtime (NULL refused by `put`).
        unsafe { put(out, answer) }
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_found_sized_and_has_no_null_slot() {
        let sizes = [13, 7, 4, 3, 17, 3, 64];
        for (i, n) in sizes.into_iter().enumerate() {
            let mut t = std::ptr::null();
            let id = CUuuid { bytes: TABLES[i].1 };
            assert_eq!(get(&mut t, &id), CUresult::CUDA_SUCCESS, "{}", TABLES[i].0);
            // SAFETY: the table has n slots.
            let slots = unsafe { std::slice::from_raw_parts(t as *const Slot, n) };
            assert!(slots.iter().all(|s| !s.is_null()), "{}", TABLES[i].0);
            if i != CLS {
                assert_eq!(slots[0] as usize, n * 8, "{}", TABLES[i].0);
            }
        }
    }

    #[test]
    fn unknown_and_refused_tables_say_so() {
        let mut t = std::ptr::dangling::<c_void>();
        let id = CUuuid { bytes: [9; 16] };
        assert_eq!(get(&mut t, &id), CUresult::CUDA_ERROR_NOT_FOUND);
        assert!(t.is_null());
        let id = CUuuid { bytes: TABLES[7].1 };
        assert_eq!(get(&mut t, &id), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(
            uuid_text(&[0xab; 16]),
            "abababab-abab-abab-abab-abababababab"
        );
    }

    #[test]
    fn stubs_are_distinct_per_slot_and_answer_an_error() {
        let t = stubs::<UNNAMED>();
        assert_ne!(t[5], t[6]);
        // SAFETY: every stub is an extern "C" fn() -> CUresult.
        let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(t[5]) };
        assert_eq!(f(), CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
}
