"""PyTorch on the simulated GPU: each subcommand exercises one part of torch.cuda and prints one
JSON object per line on stdout, for tests/clients/tests/torch.rs to judge against the simulator's
own count (`simgpu show`). Kernels on simgpu are timed, never run, so nothing here reads back a
number a kernel computed.

Usage: torch_check.py info | fill CHUNK_MIB | hold MIB | spin SECONDS | graph REPLAYS
       | size-cache FRACTION
"""

import json
import os
import sys
import time

import torch

MIB = 1 << 20


def say(event, **kw):
    print(json.dumps({"event": event, "pid": os.getpid(), **kw}), flush=True)


def reserved():
    return torch.cuda.memory_stats().get("reserved_bytes.all.current", 0)


def info():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    say(
        "info",
        available=torch.cuda.is_available(),
        count=torch.cuda.device_count(),
        name=p.name,
        total_memory=p.total_memory,
        sm_count=p.multi_processor_count,
        major=p.major,
        minor=p.minor,
        free=free,
        total=total,
        backend=torch.cuda.get_allocator_backend(),
    )


def fill(chunk_mib):
    """Takes chunk_mib tensors until the caching allocator refuses; reports the refusal."""
    free, total = torch.cuda.mem_get_info()
    say("start", free=free, total=total, backend=torch.cuda.get_allocator_backend())
    held = []
    try:
        while True:
            held.append(torch.empty(chunk_mib * MIB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        say(
            "refused",
            allocated=len(held) * chunk_mib * MIB,
            reserved=reserved(),
            message=str(e),
        )
    held.clear()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    say("freed", free=free, total=total, reserved=reserved())


def hold(mib):
    """Takes mib MiB in one tensor, reports, and holds it until stdin closes."""
    x = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda") if mib else None
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    say(
        "holding",
        free=free,
        total=total,
        reserved=stats.get("reserved_bytes.all.current", 0),
        allocated=stats.get("allocated_bytes.all.current", 0),
    )
    sys.stdin.read()
    del x


def spin(seconds):
    """Elementwise kernels from libtorch's fatbins, back to back, for `seconds` of wall time."""
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    say("ready")
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(64):
            x.add_(1)
        n += 64
        torch.cuda.synchronize()
    say("spun", launches=n)


def graph(replays):
    """Captures elementwise kernels in a CUDA graph, one of them writing a tensor the capture
    allocates (from the graph's private pool: cudaMalloc in relaxed capture mode), and replays
    it."""
    x = torch.zeros(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up, as PyTorch's documentation asks
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(8):
            x.add_(1)
        y = x * 2
    torch.cuda.synchronize()
    say("captured", allocated_in_capture=y.numel() * y.element_size())
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    say("replayed", replays=replays, kernels_per_replay=9, reserved=reserved())


def figures(d):
    """Device d's memory as CUDA (through PyTorch) and NVML (nvidia-ml-py) tell this process."""
    import pynvml as N

    free, total = torch.cuda.mem_get_info(d)
    h = N.nvmlDeviceGetHandleByIndex(d)
    mem = N.nvmlDeviceGetMemoryInfo(h)
    mine = [p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == os.getpid()]
    return {
        "cuda_free": free,
        "cuda_total": total,
        "cuda_used": total - free,
        "nvml_total": mem.total,
        "nvml_used": mem.used,
        "nvml_process_used": mine[0] if mine else None,
    }


def size_cache(fraction):
    """Sizes a KV cache the way vLLM does with gpu_memory_utilization: on every device, after the
    model's weights (a 64 MiB stand-in) and a CUDA graph capture, a cache of `fraction` of the free
    memory cudaMemGetInfo reports. Reports CUDA's and NVML's figures before the capture, after it
    and after the cache, and holds everything until stdin closes."""
    import pynvml as N

    N.nvmlInit()
    devices, held = [], []
    for d in range(torch.cuda.device_count()):
        torch.cuda.set_device(d)
        weights = torch.zeros(64 * MIB, dtype=torch.uint8, device=d)
        torch.cuda.synchronize(d)
        before = figures(d)
        x = torch.zeros(1 << 20, device=d)
        s = torch.cuda.Stream(d)
        s.wait_stream(torch.cuda.current_stream(d))
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream(d).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        # A capture stream of this device's own: PyTorch's default one is made once, on the
        # first device it captured on, and a capture there records nothing of this device's.
        with torch.cuda.graph(g, stream=s):
            y = x * 2
        g.replay()
        torch.cuda.synchronize(d)
        captured = figures(d)
        cache_bytes = int(fraction * captured["cuda_free"]) // (2 * MIB) * (2 * MIB)
        cache = torch.empty(cache_bytes, dtype=torch.uint8, device=d)
        torch.cuda.synchronize(d)
        sized = figures(d)
        devices.append({"device": d, "cache": cache_bytes, "before_capture": before,
                        "after_capture": captured, "after_cache": sized})
        held += [weights, x, y, g, cache]
    say("sized", fraction=fraction, devices=devices)
    sys.stdin.read()
    del held


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "info":
        info()
    elif cmd == "fill":
        fill(int(args[0]))
    elif cmd == "hold":
        hold(int(args[0]))
    elif cmd == "spin":
        spin(float(args[0]))
    elif cmd == "graph":
        graph(int(args[0]))
    elif cmd == "size-cache":
        size_cache(float(args[0]))
    else:
        sys.exit(f"torch_check.py: unknown subcommand {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
