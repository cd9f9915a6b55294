#!/usr/bin/env python3
"""A CUDA client written as users write them: NVIDIA's own driver bindings (`cuda-bindings`,
`from cuda.bindings import driver`) and NVML bindings (`nvidia-ml-py`, `import pynvml`).
tests/clients/tests/clients.rs runs it on simgpu, with and without cuslice, and checks what it
prints (one JSON object a line) against the simulator's ground truth.

    cuda_client.py fill FAMILY CHUNK_MIB     allocate CHUNK_MIB chunks of FAMILY (mem, async,
                                             vmm, managed) until refused, then free them all
    cuda_client.py async-free MIB            cuMemAllocAsync MIB, cuMemFreeAsync, synchronise;
                                             then hold the context until stdin closes
    cuda_client.py hold MIB [FAMILY]         allocate MIB of FAMILY (mem: cuMemAlloc, the default;
                                             async, vmm, array, managed) and hold it until stdin
                                             closes
    cuda_client.py nvml                      NVML's view of device 0: memory, processes, and the
                                             other queries tools make (gpustat, nvitop)
    cuda_client.py launch PTX NS SECS        load the PTX spin kernel (cuModuleLoadData) and
                                             launch 1-block kernels of NS ns for SECS seconds
    cuda_client.py null-outs                 cuMemGetInfo_v2(NULL, &total) and (&free, NULL)
    cuda_client.py keep MIB [managed]        cuMemAlloc MIB (and 2 MiB of managed memory), write
                                             random bytes at its start and end, then answer stdin
                                             lines: "check" reads them back and compares, "count"
                                             asks cuDeviceGetCount
    cuda_client.py busy MIB PTX SECS         as keep, then launch 1 ms spin kernels for SECS
                                             seconds, then read the bytes back ("checked")
    cuda_client.py scribble MIB              cuMemAlloc MIB, write 0xAB over all of it, free it
    cuda_client.py churn MIB SECS            for SECS seconds: cuMemAlloc MIB and free it at once,
                                             over and over; counts what was got and refused
    cuda_client.py checkpoint PID OP...      the checkpoint API on PID: lock[:MS], checkpoint,
                                             restore, unlock, one JSON line each with the code
                                             and the state after it
"""
import ctypes
import json
import os
import sys
import time

MIB = 1 << 20


def out(**kv):
    print(json.dumps(kv), flush=True)


def cuda():
    from cuda.bindings import driver as cu
    return cu


def ok(r):
    """The value(s) of a binding call; exits with a JSON line on an error."""
    cu = cuda()
    err, rest = r[0], r[1:]
    if err != cu.CUresult.CUDA_SUCCESS:
        out(event="error", code=int(err), name=err.name)
        sys.exit(3)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def code(r):
    return int(r[0])


def setup():
    cu = cuda()
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    free, total = ok(cu.cuMemGetInfo())
    out(event="start", pid=os.getpid(), free=int(free), total=int(total))
    return cu, dev, ctx


def mem_info(cu):
    free, total = ok(cu.cuMemGetInfo())
    return int(free), int(total)


class Families:
    """Allocation and free of one family through the official bindings."""

    def __init__(self, cu, dev, family):
        self.cu, self.dev, self.family = cu, dev, family
        self.stream = ok(cu.cuStreamCreate(0)) if family == "async" else None
        if family == "vmm":
            prop = cu.CUmemAllocationProp()
            prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = int(dev)
            self.prop = prop
            self.gran = int(ok(cu.cuMemGetAllocationGranularity(
                prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))

    def alloc(self, size):
        """(result code, handle) of one allocation."""
        cu = self.cu
        if self.family == "mem":
            r = cu.cuMemAlloc(size)
        elif self.family == "managed":
            r = cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)
        elif self.family == "async":
            r = cu.cuMemAllocAsync(size, self.stream)
            if code(r) == 0:
                ok(cu.cuStreamSynchronize(self.stream))
        elif self.family == "array":
            # A 2D array of 4-byte floats, 64 Ki elements wide: as many rows as the size holds.
            desc = cu.CUDA_ARRAY_DESCRIPTOR()
            desc.Format = cu.CUarray_format.CU_AD_FORMAT_FLOAT
            desc.NumChannels = 1
            desc.Width = 65536
            desc.Height = max(1, size // (65536 * 4))
            r = cu.cuArrayCreate(desc)
        elif self.family == "vmm":
            size = -(-size // self.gran) * self.gran
            r = cu.cuMemCreate(size, self.prop, 0)
            if code(r) != 0:
                return code(r), None
            handle = r[1]
            va = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
            ok(cu.cuMemMap(va, size, 0, handle, 0))
            access = cu.CUmemAccessDesc()
            access.location = self.prop.location
            access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            ok(cu.cuMemSetAccess(va, size, [access], 1))
            return 0, (va, size, handle)
        else:
            raise SystemExit(f"unknown family {self.family}; use mem, async, vmm, array or managed")
        return code(r), (r[1] if code(r) == 0 else None)

    def free(self, h):
        cu = self.cu
        if self.family == "vmm":
            va, size, handle = h
            ok(cu.cuMemUnmap(va, size))
            ok(cu.cuMemRelease(handle))
            ok(cu.cuMemAddressFree(va, size))
        elif self.family == "async":
            ok(cu.cuMemFreeAsync(h, self.stream))
        elif self.family == "array":
            ok(cu.cuArrayDestroy(h))
        else:
            ok(cu.cuMemFree(h))

    def sync(self):
        if self.stream is not None:
            ok(self.cu.cuStreamSynchronize(self.stream))


def fill(family, chunk_mib):
    cu, dev, _ = setup()
    fam = Families(cu, dev, family)
    chunk = int(chunk_mib) * MIB
    held = []
    while True:
        c, h = fam.alloc(chunk)
        if c != 0:
            free, _ = mem_info(cu)
            out(event="refused", code=c, allocated=len(held) * chunk, chunk=chunk, free=free)
            break
        held.append(h)
        if len(held) * chunk > (64 << 30):
            out(event="never_refused")
            sys.exit(4)
    for h in held:
        fam.free(h)
    fam.sync()
    free, _ = mem_info(cu)
    out(event="freed", free=free)


def wait_stdin():
    sys.stdin.read()


def async_free(mib):
    cu, _, _ = setup()
    stream = ok(cu.cuStreamCreate(0))
    size = int(mib) * MIB
    p = ok(cu.cuMemAllocAsync(size, stream))
    ok(cu.cuStreamSynchronize(stream))
    during, _ = mem_info(cu)
    ok(cu.cuMemFreeAsync(p, stream))
    ok(cu.cuStreamSynchronize(stream))
    after, _ = mem_info(cu)
    out(event="holding", pid=os.getpid(), free_allocated=during, free_after=after)
    wait_stdin()


def hold(mib, family="mem"):
    cu, dev, _ = setup()
    size = int(mib) * MIB
    fam = Families(cu, dev, family)
    h = None
    if size:
        c, h = fam.alloc(size)
        if c != 0:
            out(event="error", code=c, name=cu.CUresult(c).name)
            sys.exit(3)
    free, _ = mem_info(cu)
    out(event="holding", pid=os.getpid(), free=free)
    wait_stdin()
    if h is not None:
        fam.free(h)
        fam.sync()


def nvml():
    import pynvml as N
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    m = N.nvmlDeviceGetMemoryInfo(h)
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    procs = [{"pid": p.pid, "used": p.usedGpuMemory}
             for p in N.nvmlDeviceGetComputeRunningProcesses(h)]
    out(event="nvml", total=m.total, free=m.free, used=m.used,
        v2_total=m2.total, v2_free=m2.free, v2_used=m2.used, v2_reserved=m2.reserved,
        processes=procs)
    # What monitoring tools ask besides (gpustat 1.1.1, nvitop): every answer or its NVML error.
    def ask(name, f):
        try:
            v = f()
        except N.NVMLError as e:
            return {"error": int(e.value), "text": str(e)}
        except Exception as e:  # pynvml's own errors (a library mismatch): what the tool sees
            return {"error": type(e).__name__, "text": str(e)}
        if isinstance(v, bytes):
            v = v.decode()
        if hasattr(v, "_fields_"):
            v = {k: getattr(v, k) for k, _ in v._fields_}
        if isinstance(v, list) and v and hasattr(v[0], "pid"):
            v = [{"pid": p.pid, "used": p.usedGpuMemory} for p in v]
        return v
    tools = {
        "nvml_version": ask("nvml_version", N.nvmlSystemGetNVMLVersion),
        "driver_version": ask("driver_version", N.nvmlSystemGetDriverVersion),
        "cuda_driver_version": ask("cuda", N.nvmlSystemGetCudaDriverVersion),
        "name": ask("name", lambda: N.nvmlDeviceGetName(h)),
        "bar1": ask("bar1", lambda: N.nvmlDeviceGetBAR1MemoryInfo(h)),
        "graphics_v3": ask("graphics_v3", lambda: N.nvmlDeviceGetGraphicsRunningProcesses_v3(h)),
        "graphics_v2": ask("graphics_v2", lambda: N.nvmlDeviceGetGraphicsRunningProcesses_v2(h)),
        "graphics": ask("graphics", lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "temperature": ask("temperature",
                           lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
        "fan_speed": ask("fan_speed", lambda: N.nvmlDeviceGetFanSpeed(h)),
        "num_fans": ask("num_fans", lambda: N.nvmlDeviceGetNumFans(h)),
        "power_usage": ask("power_usage", lambda: N.nvmlDeviceGetPowerUsage(h)),
        "power_limit": ask("power_limit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)),
        "encoder": ask("encoder", lambda: list(N.nvmlDeviceGetEncoderUtilization(h))),
        "decoder": ask("decoder", lambda: list(N.nvmlDeviceGetDecoderUtilization(h))),
        "performance_state": ask("pstate", lambda: N.nvmlDeviceGetPerformanceState(h)),
        "persistence_mode": ask("persistence", lambda: N.nvmlDeviceGetPersistenceMode(h)),
        "compute_mode": ask("compute_mode", lambda: N.nvmlDeviceGetComputeMode(h)),
        "power_management_limit": ask("pml", lambda: N.nvmlDeviceGetPowerManagementLimit(h)),
        "display_active": ask("display_active", lambda: N.nvmlDeviceGetDisplayActive(h)),
        "display_mode": ask("display_mode", lambda: N.nvmlDeviceGetDisplayMode(h)),
        "ecc_mode": ask("ecc_mode", lambda: list(N.nvmlDeviceGetEccMode(h))),
        "ecc_errors": ask("ecc_errors", lambda: N.nvmlDeviceGetTotalEccErrors(
            h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC)),
        "driver_model": ask("driver_model", lambda: N.nvmlDeviceGetCurrentDriverModel(h)),
        "utilization": ask("utilization",
                           lambda: {"gpu": N.nvmlDeviceGetUtilizationRates(h).gpu}),
    }
    out(event="tools", **tools)
    N.nvmlShutdown()


def topology():
    """What NVML says of peers and links, as NCCL and vLLM ask it: for each pair of devices each
    peer status (read, write, NVLink, atomics, prop) and for each device each NVLink's state and
    the PCI bus id it reaches; every answer or its NVML error."""
    import pynvml as N
    N.nvmlInit()
    n = N.nvmlDeviceGetCount()
    hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(n)]

    def ask(f):
        try:
            v = f()
        except N.NVMLError as e:
            return {"error": int(e.value)}
        return v.decode() if isinstance(v, bytes) else v
    # nvml.h's nvmlGpuP2PCapsIndex_t (pynvml's NVML_P2P_CAPS_INDEX_READ is a tuple, not 0).
    indexes = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "prop": 4}
    pairs = []
    for a in range(n):
        for b in range(n):
            if a != b:
                pairs.append({"from": a, "to": b, **{
                    k: ask(lambda i=i: N.nvmlDeviceGetP2PStatus(hs[a], hs[b], i))
                    for k, i in indexes.items()}})
    links = []
    for d in range(n):
        for link in range(max(n, 2)):
            links.append({"device": d, "link": link,
                          "state": ask(lambda: N.nvmlDeviceGetNvLinkState(hs[d], link)),
                          "remote": ask(lambda: N.nvmlDeviceGetNvLinkRemotePciInfo(
                              hs[d], link).busId)})
    out(event="topology", devices=n, pairs=pairs, links=links,
        bus_ids=[ask(lambda h=h: N.nvmlDeviceGetPciInfo(h).busId) for h in hs])
    N.nvmlShutdown()


def launch(ptx_path, ns, secs):
    cu, _, _ = setup()
    with open(ptx_path, "rb") as f:
        image = f.read() + b"\0"
    module = ok(cu.cuModuleLoadData(image))
    fn = ok(cu.cuModuleGetFunction(module, b"cuslice_spin"))
    stream = ok(cu.cuStreamCreate(0))
    args = ((int(ns),), (ctypes.c_uint64,))
    end = time.monotonic() + float(secs)
    n = 0
    while time.monotonic() < end:
        ok(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, 0))
        n += 1
        if n % 8 == 0:
            # Keep a few kernels queued, as a training loop does between synchronisations.
            ok(cu.cuStreamSynchronize(stream))
    ok(cu.cuStreamSynchronize(stream))
    out(event="launched", kernels=n)


def null_outs():
    """cuMemGetInfo_v2 with one NULL out-parameter, through ctypes as C clients (HAMi-core's
    driver tests) call it; the bindings set up the context."""
    cu, _, _ = setup()
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuMemGetInfo_v2
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    rc_total = f(None, ctypes.byref(total))
    rc_free = f(ctypes.byref(free), None)
    out(event="null_outs", rc_total_only=rc_total, total=total.value,
        rc_free_only=rc_free, free=free.value)


def patterned(cu, mib, managed=False):
    """cuMemAlloc MIB (and 2 MiB of managed memory), random bytes written at its start and end,
    then "holding"; returns the pointer and a function that reads both back and compares."""
    size = int(mib) * MIB
    p = ok(cu.cuMemAlloc(size))
    if managed:
        ok(cu.cuMemAllocManaged(2 * MIB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))
    piece = min(MIB, size // 2)
    head, tail = os.urandom(piece), os.urandom(piece)
    ok(cu.cuMemcpyHtoD(p, head, piece))
    ok(cu.cuMemcpyHtoD(int(p) + size - piece, tail, piece))
    out(event="holding", pid=os.getpid(), ptr=int(p))

    def intact():
        got_head, got_tail = bytearray(piece), bytearray(piece)
        ok(cu.cuMemcpyDtoH(got_head, p, piece))
        ok(cu.cuMemcpyDtoH(got_tail, int(p) + size - piece, piece))
        return bytes(got_head) == head and bytes(got_tail) == tail

    return p, intact


def keep(mib, *flags):
    """A notebook's kernel between cells: memory on the device, idle until asked."""
    cu, _, _ = setup()
    _, intact = patterned(cu, mib, "managed" in flags)
    for line in sys.stdin:
        if line.strip() == "check":
            out(event="checked", intact=intact(), at=time.time())
        elif line.strip() == "count":
            out(event="counted", devices=ok(cu.cuDeviceGetCount()), at=time.time())


def busy(mib, ptx_path, secs):
    """A training step's process: memory on the device, and kernels queued all the while."""
    cu, _, _ = setup()
    _, intact = patterned(cu, mib)
    with open(ptx_path, "rb") as f:
        module = ok(cu.cuModuleLoadData(f.read() + b"\0"))
    fn = ok(cu.cuModuleGetFunction(module, b"cuslice_spin"))
    stream = ok(cu.cuStreamCreate(0))
    args = ((1_000_000,), (ctypes.c_uint64,))
    end = time.monotonic() + float(secs)
    while time.monotonic() < end:
        for _ in range(4):
            ok(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, 0))
        ok(cu.cuStreamSynchronize(stream))
    out(event="checked", intact=intact())


def scribble(mib):
    """Another tenant writing over whatever device memory it gets."""
    cu, _, _ = setup()
    size = int(mib) * MIB
    p = ok(cu.cuMemAlloc(size))
    chunk = b"\xab" * (4 * MIB)
    for off in range(0, size, len(chunk)):
        n = min(len(chunk), size - off)
        ok(cu.cuMemcpyHtoD(int(p) + off, chunk, n))
    ok(cu.cuMemFree(p))
    out(event="scribbled", bytes=size)


def churn(mib, secs):
    """Another tenant that takes room and gives it back again as fast as it can, for `secs`:
    an allocation of `mib`, freed at once, over and over (an allocator growing and trimming its
    cache). What the driver refused is counted, not fatal."""
    cu, _, _ = setup()
    size = int(mib) * MIB
    out(event="holding", pid=os.getpid())
    got = refused = 0
    end = time.monotonic() + float(secs)
    while time.monotonic() < end:
        r = cu.cuMemAlloc(size)
        if code(r) == 0:
            got += 1
            ok(cu.cuMemFree(r[1]))
        else:
            refused += 1
    out(event="churned", got=got, refused=refused)


def checkpoint(pid, *ops):
    cu = cuda()
    ok(cu.cuInit(0))
    pid = int(pid)
    for op in ops:
        name, _, ms = op.partition(":")
        if name == "lock":
            args = cu.CUcheckpointLockArgs()
            args.timeoutMs = int(ms or 0)
            r = cu.cuCheckpointProcessLock(pid, args)
        elif name == "checkpoint":
            r = cu.cuCheckpointProcessCheckpoint(pid, None)
        elif name == "restore":
            r = cu.cuCheckpointProcessRestore(pid, None)
        elif name == "unlock":
            r = cu.cuCheckpointProcessUnlock(pid, None)
        else:
            raise SystemExit(f"unknown checkpoint step {op!r}; use lock[:MS], checkpoint, "
                             "restore or unlock")
        err, state = cu.cuCheckpointProcessGetState(pid)
        out(event=name, code=int(r[0]), name=r[0].name,
            state=state.name if int(err) == 0 else None)


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    cmd, args = argv[1], argv[2:]
    table = {"fill": fill, "async-free": async_free, "hold": hold, "nvml": nvml,
             "topology": topology, "launch": launch, "null-outs": null_outs, "keep": keep, "busy": busy,
             "scribble": scribble, "churn": churn, "checkpoint": checkpoint}
    if cmd not in table:
        raise SystemExit(f"unknown command {cmd!r}; use one of {', '.join(table)}")
    table[cmd](*args)


if __name__ == "__main__":
    main(sys.argv)
