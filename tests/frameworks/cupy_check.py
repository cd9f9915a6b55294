#!/usr/bin/env python3
"""CuPy used as its users use it, for the framework tests (tests/clients/tests/cupy.rs).

Runs under the virtual environments of tests/frameworks/install (cupy-cuda12x or cupy-cuda13x),
on simgpu, with or without libcuslice.so preloaded. Prints one JSON object per line on stdout,
each with an "event" key; the test judges them against the simulator's own count. Kernels on
simgpu are timed, never run, so nothing here reads back a number the device computed.

Subcommands:
  info                    runtime and driver versions, device count, cudaMemGetInfo
  fill POOL CHUNK_MIB     allocate CHUNK_MIB arrays through POOL (default: CuPy's memory pool;
                          async: cupy.cuda.MemoryAsyncPool; managed: a pool over cudaMallocManaged)
                          until OutOfMemoryError, free them all,
                          then allocate as many again
  kernels SECONDS N       an NVRTC-compiled elementwise kernel on N float32 elements, launched
                          back to back for SECONDS
  ops                     everyday operations beyond elementwise kernels (CUB's sort, device
                          properties and limits, peer access, events, graphs, pointer
                          attributes); what each raised
"""

import json
import os
import sys
import time

import cupy
import numpy
from cupy.cuda import runtime


def say(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


def mem_info():
    free, total = runtime.memGetInfo()
    return {"free": free, "total": total}


def info():
    say(
        "info",
        pid=os.getpid(),
        runtime=runtime.runtimeGetVersion(),
        driver=runtime.driverGetVersion(),
        devices=runtime.getDeviceCount(),
        **mem_info(),
    )


def fill(pool, chunk_mib):
    chunk = chunk_mib << 20
    if pool == "async":
        pool_obj = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool_obj.malloc)
    elif pool == "managed":
        pool_obj = cupy.cuda.MemoryPool(cupy.cuda.malloc_managed)
        cupy.cuda.set_allocator(pool_obj.malloc)
    elif pool == "default":
        pool_obj = cupy.get_default_memory_pool()
    else:
        raise SystemExit(f"unknown pool {pool!r}: default, async or managed")
    say("start", pid=os.getpid(), pool=pool, **mem_info())

    def allocate(limit=None):
        """Chunks until OutOfMemoryError (or `limit` of them): (arrays, the error or None)."""
        arrays = []
        while limit is None or len(arrays) < limit:
            try:
                arrays.append(cupy.empty(chunk, dtype=cupy.uint8))
            except cupy.cuda.memory.OutOfMemoryError as e:
                return arrays, e
        return arrays, None

    arrays, err = allocate()
    if err is None:
        raise SystemExit("allocation never failed")
    say(
        "refused",
        error=type(err).__module__ + "." + type(err).__name__,
        message=str(err),
        chunks=len(arrays),
        allocated=len(arrays) * chunk,
        **mem_info(),
    )
    n = len(arrays)
    del arrays, err
    cupy.cuda.Device().synchronize()
    pool_obj.free_all_blocks()
    say("freed", **mem_info())
    arrays, err = allocate(n)
    say(
        "again",
        chunks=len(arrays),
        allocated=len(arrays) * chunk,
        error=None if err is None else str(err),
    )
    del arrays
    cupy.cuda.Device().synchronize()
    pool_obj.free_all_blocks()


def kernels(seconds, n):
    # Compiled by NVRTC on the CPU into a cubin that the driver loads with cuModuleLoadData.
    k = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f + 1.0f", "cupy_check_axpb")
    x = cupy.empty(n, dtype=cupy.float32)
    y = cupy.empty_like(x)
    k(x, y)
    (x * 2 + 1).sum()
    cupy.cuda.Device().synchronize()
    say("start", pid=os.getpid())
    launched = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(16):
            k(x, y)
        launched += 16
    cupy.cuda.Device().synchronize()
    say("launched", kernels=launched)


def ops():
    x = cupy.arange(1 << 16, dtype=cupy.float32)
    dev = cupy.cuda.Device(0)

    def graph():
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            x * 3
            g = s.end_capture()
        g.launch(s)
        s.synchronize()

    def elapsed():
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        x * 2
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    checks = {
        # CUB's radix sort sizes its grid with the occupancy calculator.
        "sort": lambda: cupy.sort(x),
        "argsort": lambda: cupy.argsort(x),
        "cumsum": lambda: x.cumsum(),
        "reduction": lambda: x.sum(),
        "raw_kernel": lambda: cupy.RawKernel(
            'extern "C" __global__ void f(float* a) { a[threadIdx.x] = 1; }', "f"
        )((1,), (32,), (x,)),
        "device_properties": lambda: runtime.getDeviceProperties(0),
        "stack_limit": lambda: runtime.deviceGetLimit(runtime.cudaLimitStackSize),
        "peer": lambda: runtime.deviceCanAccessPeer(0, 0),
        "pci_bus_id": lambda: runtime.deviceGetByPCIBusId(dev.pci_bus_id),
        "event_elapsed": elapsed,
        "graph": graph,
        "asnumpy": lambda: cupy.asnumpy(x),
        "pinned": lambda: cupy.cuda.alloc_pinned_memory(1 << 20),
    }
    results = {}
    for name, f in checks.items():
        try:
            f()
            cupy.cuda.Device().synchronize()
            results[name] = "ok"
        except Exception as e:
            results[name] = f"{type(e).__name__}: {e}"
    # What cudaPointerGetAttributes says of each kind of memory: (cudaMemoryType, device).
    pinned = cupy.cuda.alloc_pinned_memory(4096)
    managed = cupy.cuda.malloc_managed(4096)
    host = numpy.empty(16)

    def attrs(p):
        a = runtime.pointerGetAttributes(p)
        return [a.type, a.device]

    pointers = {
        "device": attrs(x.data.ptr + 64),
        "pinned": attrs(pinned.ptr),
        "managed": attrs(managed.ptr),
        "host": attrs(host.ctypes.data),
        # CuPy finds the device of memory it did not allocate this way.
        "unowned_device": cupy.cuda.UnownedMemory(x.data.ptr, 64, None).device_id,
    }
    props = runtime.getDeviceProperties(0)
    say(
        "ops",
        results=results,
        pci_bus_id=dev.pci_bus_id,
        total_global_mem=props["totalGlobalMem"],
        multiprocessors=props["multiProcessorCount"],
        stack_limit=runtime.deviceGetLimit(runtime.cudaLimitStackSize),
        can_access_peer=runtime.deviceCanAccessPeer(0, 0),
        pointers=pointers,
    )


def main(argv):
    if not argv:
        raise SystemExit(__doc__)
    cmd, args = argv[0], argv[1:]
    if cmd == "info":
        info()
    elif cmd == "fill":
        fill(args[0], int(args[1]))
    elif cmd == "kernels":
        kernels(float(args[0]), int(args[1]))
    elif cmd == "ops":
        ops()
    else:
        raise SystemExit(f"unknown subcommand {cmd!r}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
