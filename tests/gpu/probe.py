#!/usr/bin/env python3
"""Framework probes the real-GPU tier runs under the library: each is a small, ordinary PyTorch,
JAX or CuPy program that prints what it saw as JSON lines on stdout (one `result` line at the end)
and nothing about cuslice. The tier judges them against NVML, sampled from outside.

    probe.py NAME [ARGS...]
"""
import json
import os
import sys
import time

GIB = 1 << 30
MIB = 1 << 20


def emit(event, **fields):
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def torch_info():
    import torch

    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    emit("result", free=free, total=total, properties_total=props.total_memory, name=props.name,
         torch=torch.__version__, cuda=torch.version.cuda)


def attempt(f):
    """A figure that may not exist in this version or back end: its value, or why not."""
    try:
        return f()
    except Exception as e:
        return f"unavailable: {type(e).__name__}: {e}"[:200]


def hold(secs):
    """Stay at the peak a while, so that NVML's sampler sees it."""
    time.sleep(secs)


def torch_fill(chunk_mib=256):
    """Allocate until PyTorch refuses; report what refused it and what PyTorch held."""
    import torch

    free0, total = torch.cuda.mem_get_info()
    blocks, error = [], None
    while True:
        try:
            blocks.append(torch.empty(chunk_mib * MIB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            error = ("torch.cuda.OutOfMemoryError", str(e).splitlines()[0][:300])
            break
        except Exception as e:  # anything else is a finding, reported as such
            error = (type(e).__module__ + "." + type(e).__name__, str(e).splitlines()[0][:300])
            break
        if len(blocks) * chunk_mib * MIB > 4 * total:
            break
    free1, _ = torch.cuda.mem_get_info()
    hold(0.5)
    emit("result", total=total, free_start=free0, free_at_refusal=free1, count=len(blocks),
         allocated=len(blocks) * chunk_mib * MIB, error=error and error[0], message=error and error[1],
         reserved=attempt(torch.cuda.memory_reserved), backend=attempt(torch.cuda.get_allocator_backend),
         conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    # After freeing, the same amount fits again.
    del blocks
    torch.cuda.empty_cache()
    again = torch.empty(chunk_mib * MIB, dtype=torch.uint8, device="cuda")
    emit("reuse", ok=again.numel() == chunk_mib * MIB)


def torch_graph():
    """Capture a small step into a CUDA graph, replay it, compare with running it eagerly."""
    import torch

    torch.manual_seed(0)
    w = torch.randn(1024, 1024, device="cuda")
    x = torch.randn(64, 1024, device="cuda")
    def step(inp):
        return torch.relu(inp @ w) + 1.0
    static_in = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(static_in)  # warm-up on a side stream, as PyTorch's docs do
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = step(static_in)
    worst = 0.0
    for i in range(100):
        new = torch.randn(64, 1024, device="cuda")
        static_in.copy_(new)
        g.replay()
        if i % 10 == 0:
            worst = max(worst, (static_out - step(new)).abs().max().item())
    torch.cuda.synchronize()
    emit("result", replays=100, max_abs_err=worst, ok=worst < 1e-3)


def jax_prealloc():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1024, 1024))
    (x @ x).block_until_ready()
    stats = jax.devices()[0].memory_stats() or {}
    hold(1.0)
    emit("result", jax=jax.__version__, device=str(jax.devices()[0]),
         bytes_limit=stats.get("bytes_limit"), bytes_reserved=stats.get("bytes_reserved"),
         prealloc=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default"))


def cupy_fill(chunk_mib=256):
    import cupy

    pool = cupy.get_default_memory_pool()
    free0, total = cupy.cuda.runtime.memGetInfo()
    blocks, error = [], None
    while True:
        try:
            blocks.append(cupy.empty(chunk_mib * MIB, dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError as e:
            error = ("cupy.cuda.memory.OutOfMemoryError", str(e)[:300])
            break
        except Exception as e:
            error = (type(e).__module__ + "." + type(e).__name__, str(e)[:300])
            break
        if len(blocks) * chunk_mib * MIB > 4 * total:
            break
    hold(0.5)
    emit("result", cupy=cupy.__version__, total=total, free_start=free0, count=len(blocks),
         allocated=len(blocks) * chunk_mib * MIB, pool_total=pool.total_bytes(),
         error=error and error[0], message=error and error[1])


def matmuls(n):
    """A function that runs n x n bf16 matmuls back to back for `t` s: (count, seconds)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def run_for(t):
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < t:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            k += 10
        return k, time.perf_counter() - t0
    return run_for


def torch_matmul(secs=10.0, n=4096, warmup=1.0):
    """bf16 matmuls back to back for `secs`: iterations per second after a warm-up."""
    run_for = matmuls(n)
    run_for(warmup)
    emit("started", t=time.time())
    k, dt = run_for(secs)
    emit("result", iterations=k, secs=dt, per_sec=k / dt, tflops=2 * n ** 3 * k / dt / 1e12, n=n)


def torch_overhead(secs=3.0, n=8192):
    """A launch-bound loop (tiny adds) and a large bf16 matmul: time per add, matmul TFLOP/s."""
    import torch

    x = torch.zeros(1, device="cuda")
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < secs:
        for _ in range(1000):
            x.add_(1)
        k += 1000
    torch.cuda.synchronize()
    us_per_add = (time.perf_counter() - t0) / k * 1e6
    run_for = matmuls(n)
    run_for(0.2)
    k, dt = run_for(secs)
    emit("result", us_per_add=us_per_add, tflops=2 * n ** 3 * k / dt / 1e12)


def torch_start():
    """Prints the wall time at which the first kernel has finished (the tier started us)."""
    import torch

    torch.ones(1, device="cuda").sum().item()
    emit("result", first_kernel_done=time.time())


def torch_keep(mib):
    """A notebook between cells: a tensor of random bytes on the device, a copy on the host; each
    "check" line on stdin reads the tensor back and compares."""
    import torch

    host = torch.randint(0, 256, (int(mib) * MIB,), dtype=torch.uint8)
    dev = host.to("cuda")
    torch.cuda.synchronize()
    emit("holding", bytes=host.numel())
    for line in sys.stdin:
        if line.strip() == "check":
            t = time.perf_counter()
            back = dev.cpu()
            emit("checked", intact=bool(torch.equal(back, host)), read_back_s=time.perf_counter() - t)


def keeper(mib):
    """Starts torch-keep MIB as a child (this process's environment); returns it, a reader of its
    events, and its "holding" line (None, with a result line said, if it ended before)."""
    import subprocess

    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "torch-keep", str(mib)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(event):
        for line in child.stdout:
            if line.startswith("{") and json.loads(line).get("event") == event:
                return json.loads(line)
        return None

    held = read("holding")
    if held is None:
        emit("result", error=f"torch-keep exited {child.wait()} before holding its tensor")
    return child, read, held


def torch_checkpoint(mib=512, frozen_s=1.5):
    """The driver's checkpoint API on a PyTorch process (torch-keep, a child of this one): lock,
    checkpoint, stay frozen `frozen_s`, restore, unlock; then the child reads its tensor back. This
    process only calls the driver through ctypes (no framework, no context)."""
    import ctypes

    class Args(ctypes.Structure):
        _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                    ("reserved1", ctypes.c_uint64 * 7)]

    child, read, held = keeper(mib)
    if held is None:
        return
    cu = ctypes.CDLL("libcuda.so.1")
    if not hasattr(cu, "cuCheckpointProcessLock"):
        child.kill()
        emit("result", error="this driver has no checkpoint API (cuCheckpointProcessLock: driver "
                             "550 or later)")
        return
    steps, times, frozen_at, thawed_at = [], {}, None, None
    init = cu.cuInit(0)

    def state():
        s = ctypes.c_int(-1)
        rc = cu.cuCheckpointProcessGetState(child.pid, ctypes.byref(s))
        return s.value if rc == 0 else f"GetState {rc}"

    def step(name, call):
        t = time.perf_counter()
        rc = call()
        times[name] = time.perf_counter() - t
        steps.append({"step": name, "rc": rc, "state": state()})
        return rc == 0

    ok = (init == 0
          and step("lock", lambda: cu.cuCheckpointProcessLock(child.pid, ctypes.byref(Args(10000))))
          and step("checkpoint", lambda: cu.cuCheckpointProcessCheckpoint(child.pid, None)))
    if ok:
        frozen_at = time.time()
        time.sleep(frozen_s)
        thawed_at = time.time()
        ok = step("restore", lambda: cu.cuCheckpointProcessRestore(child.pid, None))
    # Whatever happened, the child is let go if it can be; one that cannot (a failed restore
    # leaves it checkpointed, its calls waiting for good) is killed rather than asked.
    checked = None
    if step("unlock", lambda: cu.cuCheckpointProcessUnlock(child.pid, None)):
        child.stdin.write("check\n")
        child.stdin.flush()
        checked = read("checked")
        child.stdin.close()
    else:
        child.kill()
    rc = child.wait()
    emit("result", init=init, child=child.pid, bytes=held["bytes"], steps=steps,
         checkpoint_s=times.get("checkpoint"), restore_s=times.get("restore"),
         frozen_at=frozen_at, thawed_at=thawed_at,
         intact=checked["intact"] if checked else None, child_exit=rc)


def torch_freeze(mib=512, frozen_s=1.5):
    """A PyTorch process (torch-keep, a child of this one, under the same environment: the
    library and CUSLICE_MEMORY_FREEZE_IDLE) left idle until cuslice freezes it; this process
    watches its state through the driver's checkpoint API (ctypes, no context), leaves it frozen
    `frozen_s`, then asks it to read its tensor back, which thaws it, and once more running."""
    import ctypes

    child, read, held = keeper(mib)
    if held is None:
        return
    held_at = time.time()
    cu = ctypes.CDLL("libcuda.so.1")
    if not hasattr(cu, "cuCheckpointProcessGetState") or cu.cuInit(0) != 0:
        child.kill()
        emit("result", error="this driver has no checkpoint API (cuCheckpointProcessGetState: "
                             "driver 550 or later)")
        return

    def state():
        s = ctypes.c_int(-1)
        rc = cu.cuCheckpointProcessGetState(child.pid, ctypes.byref(s))
        return s.value if rc == 0 else f"GetState {rc}"

    frozen_at = thawed_at = None
    deadline = time.time() + 60
    while time.time() < deadline and child.poll() is None:
        if state() == 2:
            frozen_at = time.time()
            break
        time.sleep(0.05)
    checks = []
    if frozen_at:
        time.sleep(frozen_s)
        thawed_at = time.time()
        for _ in range(2):
            child.stdin.write("check\n")
            child.stdin.flush()
            checks.append(read("checked"))
    after = state()
    if frozen_at:
        child.stdin.close()
        rc = child.wait()
    else:
        child.kill()
        rc = child.wait()
    emit("result", child=child.pid, bytes=held["bytes"], held_at=held_at, frozen_at=frozen_at,
         thawed_at=thawed_at, state_after=after, child_exit=rc,
         intact=all(c and c["intact"] for c in checks) if checks else None,
         thaw_call_s=checks[0]["read_back_s"] if checks and checks[0] else None,
         running_call_s=checks[1]["read_back_s"] if len(checks) > 1 and checks[1] else None)


PROBES = {
    "torch-info": torch_info,
    "torch-fill": torch_fill,
    "torch-graph": torch_graph,
    "jax-prealloc": jax_prealloc,
    "cupy-fill": cupy_fill,
    "torch-matmul": torch_matmul,
    "torch-overhead": torch_overhead,
    "torch-start": torch_start,
    "torch-keep": torch_keep,
    "torch-checkpoint": torch_checkpoint,
    "torch-freeze": torch_freeze,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROBES:
        sys.exit(f"usage: probe.py {{{','.join(PROBES)}}} [ARGS...]")
    args = [float(a) if "." in a else int(a) for a in sys.argv[2:]]
    PROBES[sys.argv[1]](*args)
