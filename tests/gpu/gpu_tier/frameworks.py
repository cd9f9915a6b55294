"""Memory, frameworks: PyTorch (three allocator back ends), JAX, CuPy and nvidia-smi under an
8 GiB cap, and a PyTorch CUDA graph. On the simulated GPU the frameworks run too (NVIDIA's own
runtime inside, on simgpu's driver), with the environment tests/frameworks/install makes when this
python lacks them; what needs a real GPU is left out there: numbers a kernel computed (the graph's
replays against eager results) and nvidia-smi; JAX, which tests/frameworks/install does not install,
is not tried there."""
import importlib.util
import os
import shutil
import subprocess

from .common import FAIL, GIB, MIB, NOT_RUN, Check, Spec, failed, judged, mib
from .nvml import peak_held

GROUP = "frameworks"
CAP = 8 * GIB
CHUNK_MIB = 256

TORCH_FILLS = [
    ("PyTorch fill (caching allocator)", {}),
    ("PyTorch fill (expandable_segments:True)", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("PyTorch fill (backend:cudaMallocAsync)", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
]
CHECKS = (["PyTorch mem_get_info", *[n for n, _ in TORCH_FILLS], "JAX default preallocation",
           "CuPy memory pool", "PyTorch CUDA graph capture and replay", "nvidia-smi under the library",
           "PyTorch checkpoint and restore", "PyTorch frozen when idle"])
NEEDS = {"PyTorch": "torch", "JAX": "jax", "CuPy": "cupy"}
# What the simulated GPU cannot honour, and why.
SIM_NOT_RUN = {
    "JAX default preallocation": "not tried on the simulator (tests/frameworks/install does not "
                                 "install JAX; it runs on a real GPU, docs/gpu.md)",
    "PyTorch CUDA graph capture and replay": "needs a real GPU (compares the numbers kernels "
                                             "computed; the simulator times kernels, never runs them)",
    "nvidia-smi under the library": "needs a real GPU (NVIDIA's nvidia-smi)",
}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def framework_python(tier, module):
    """The python that runs a framework's probes: the tier's own where the framework is importable
    here, else the CUDA 13 environment tests/frameworks/install made ($CUSLICE_FRAMEWORKS, default
    target/frameworks) if it has the framework; None where neither has it."""
    if importlib.util.find_spec(module) is not None:
        return tier.python
    root = os.environ.get("CUSLICE_FRAMEWORKS") or os.path.join(ROOT, "target", "frameworks")
    python = os.path.join(root, "cu13", "bin", "python")
    if os.path.exists(python) and subprocess.run([python, "-c", f"import {module}"],
                                                 capture_output=True).returncode == 0:
        return python
    return None


def python_for(tier, name):
    """The python for check `name` (its framework's, or the tier's)."""
    for label, module in NEEDS.items():
        if name.startswith(label):
            return framework_python(tier, module)
    return tier.python


def missing(tier, name):
    """Why check `name` cannot run here, or None."""
    for label, module in NEEDS.items():
        if name.startswith(label) and python_for(tier, name) is None:
            return (f"{label} is not installed ({module} not importable here nor in "
                    "tests/frameworks/install's environment)")
    if name.startswith("nvidia-smi") and shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH"
    return None


def not_run(reason):
    return [Check(GROUP, n, reason, "", NOT_RUN) for n in CHECKS]


def probe(tier, name, probe_name, *args, extra_env=None, limits=None):
    env = tier.cuslice(tier.scratch(name), **(limits or {"memory_limit": "8GiB"}))
    env.update(extra_env or {})
    base = tier.nvml_used()
    (p,) = tier.run(GROUP, name, [Spec([python_for(tier, name), tier.probe, probe_name, *map(str, args)],
                                       env)], timeout=300)
    peak, source = peak_held(tier.nvml.memory(p.t0, p.t1), [p.pid], base)
    return p, p.event("result"), peak, source


def run(tier):
    checks = []
    for name, fn in [("PyTorch mem_get_info", info), *[(n, fill_with(env)) for n, env in TORCH_FILLS],
                     ("JAX default preallocation", jax_prealloc), ("CuPy memory pool", cupy_fill),
                     ("PyTorch CUDA graph capture and replay", torch_graph),
                     ("nvidia-smi under the library", nvidia_smi),
                     ("PyTorch checkpoint and restore", torch_checkpoint),
                     ("PyTorch frozen when idle", torch_freeze)]:
        if not tier.wanted(name):
            continue
        why = SIM_NOT_RUN.get(name) if tier.sim else None
        why = why or missing(tier, name)
        checks.append(Check(GROUP, name, why, "", NOT_RUN) if why else fn(tier, name))
    return checks


def info(tier, name):
    p, r, _, _ = probe(tier, name, "torch-info")
    if r is None:
        return Check(GROUP, name, failed([p]) or "no result", "8192 MiB total", FAIL)
    ok = r["total"] == CAP and r["properties_total"] == CAP and r["free"] <= CAP
    return Check(GROUP, name, f"total {mib(r['total'])}, free {mib(r['free'])}, "
                 f"get_device_properties {mib(r['properties_total'])}",
                 "total 8192 MiB (the cap) in both", judged(ok), r)


def judge_refusal(name, p, r, peak, source, error, expected_error):
    """A fill: refused with the framework's own OOM error, NVML never above the cap, most of the
    cap usable."""
    if r is None:
        return Check(GROUP, name, failed([p]) or "no result", f"{expected_error} at the cap", FAIL)
    usable = CAP - 2 * CHUNK_MIB * MIB
    ok = error == expected_error and peak is not None and usable <= peak <= CAP
    figure = (f"{error or 'no error'} after {mib(r['allocated'])} allocated; NVML peak {mib(peak)}"
              f"{'' if source == 'process' else ' (' + str(source) + ')'}")
    return Check(GROUP, name, figure, f"{expected_error}; NVML peak in [{mib(usable)}, {mib(CAP)}]",
                 judged(ok), {**r, "peak": peak, "peak_source": source})


def fill_with(env):
    def fill(tier, name):
        p, r, peak, source = probe(tier, name, "torch-fill", CHUNK_MIB, extra_env=env)
        c = judge_refusal(name, p, r, peak, source, r and r["error"], "torch.cuda.OutOfMemoryError")
        reuse = p.event("reuse")
        if c.status != FAIL and not (reuse and reuse["ok"]):
            c.status, c.figure = FAIL, c.figure + "; after freeing, allocating again failed"
        return c
    return fill


def jax_prealloc(tier, name):
    p, r, peak, source = probe(tier, name, "jax-prealloc")
    if r is None:
        return Check(GROUP, name, failed([p]) or "no result", "75% of the cap", FAIL)
    limit = r.get("bytes_limit")
    # 75% of the cap is 6 GiB; 75% of an 80 GiB GPU would be 60 GiB. XLA may size it from the
    # free memory rather than the total, so anything from 60% to 80% of the cap is the cap's 75%.
    ok = (limit is not None and 0.60 * CAP <= limit <= 0.80 * CAP and peak is not None
          and 0.60 * CAP <= peak <= CAP)
    return Check(GROUP, name, f"bytes_limit {mib(limit)} ({(limit or 0) / CAP:.1%} of the cap); "
                 f"NVML peak {mib(peak)}", "75% of the cap (60-80% of 8192 MiB), NVML peak <= cap",
                 judged(ok), {**r, "peak": peak, "peak_source": source})


def cupy_fill(tier, name):
    p, r, peak, source = probe(tier, name, "cupy-fill", CHUNK_MIB)
    return judge_refusal(name, p, r, peak, source, r and r["error"], "cupy.cuda.memory.OutOfMemoryError")


def torch_graph(tier, name):
    p, r, _, _ = probe(tier, name, "torch-graph", limits={"memory_limit": "8GiB", "core_limit": "50"})
    if r is None:
        return Check(GROUP, name, failed([p]) or "no result", "replays match eager", FAIL)
    return Check(GROUP, name, f"{r['replays']} replays, max |graph - eager| {r['max_abs_err']:.2e}",
                 "replays match eager (< 1e-3), under an 8 GiB cap and core limit 50",
                 judged(r["ok"]), r)


def nvidia_smi(tier, name):
    argv = ["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
    (p,) = tier.run(GROUP, name, [Spec(argv, tier.cuslice(tier.scratch(name), memory_limit="8GiB"))])
    try:
        total, used, free = (int(v) for v in p.stdout.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return Check(GROUP, name, failed([p]) or f"unreadable output {p.stdout[:100]!r}", "8192 MiB", FAIL)
    plain = subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    return Check(GROUP, name, f"memory.total {total} MiB, used {used}, free {free} (without the library: {plain})",
                 "memory.total 8192 MiB", judged(total == CAP // MIB and used + free <= total),
                 {"total_mib": total, "used_mib": used, "free_mib": free, "without": plain})


# CUprocessState
RUNNING, LOCKED, CHECKPOINTED = 0, 1, 2


def held_frozen(tier, r):
    """The child's memory as NVML lists it (0: not listed) in samples well inside its frozen
    spell; None without one."""
    if not (r["frozen_at"] and r["thawed_at"]):
        return None
    samples = tier.nvml.memory(r["frozen_at"] + 0.3, r["thawed_at"] - 0.1)
    return max(used.get(r["child"], 0) for _, _, used in samples) if samples else None


def torch_checkpoint(tier, name):
    """The driver's checkpoint API on a PyTorch process under the library (8 GiB cap): while
    checkpointed NVML lists it no more and the device holds none of it; restored, its tensor reads
    back the same. The figures are what freezing an idle slice costs: checkpoint and restore time
    per GiB (docs/oversubscription.md)."""
    size_mib = 512 if tier.sim else 4096
    p, r, _, _ = probe(tier, name, "torch-checkpoint", size_mib)
    expected = ("lock, checkpoint, restore, unlock succeed (LOCKED, CHECKPOINTED, LOCKED, RUNNING); "
                "while checkpointed NVML lists no memory of it; the tensor reads back the same")
    if r is None or "steps" not in r:
        return Check(GROUP, name, failed([p]) or (r or {}).get("error", "no result"), expected, FAIL)
    got = [(s["step"], s["rc"], s["state"]) for s in r["steps"]]
    want = [("lock", 0, LOCKED), ("checkpoint", 0, CHECKPOINTED), ("restore", 0, LOCKED),
            ("unlock", 0, RUNNING)]
    held_while_frozen = held_frozen(tier, r)
    gib = r["bytes"] / GIB
    rate = (f"; checkpoint {r['checkpoint_s']:.2f} s, restore {r['restore_s']:.2f} s for "
            f"{gib:.1f} GiB ({gib / r['restore_s']:.1f} GiB/s back)") if r["restore_s"] else ""
    figure = (f"{', '.join(f'{s} {rc}/{st}' for s, rc, st in got)}; NVML while frozen "
              f"{mib(held_while_frozen)}; intact {r['intact']}{rate}")
    ok = got == want and held_while_frozen == 0 and r["intact"] is True
    return Check(GROUP, name, figure, expected, judged(ok), r)


def torch_freeze(tier, name):
    """cuslice freezing an idle PyTorch process (`CUSLICE_MEMORY_FREEZE_IDLE=2s`, 8 GiB cap): it
    reaches CHECKPOINTED by itself, NVML lists none of its memory while it is frozen, its next call
    (reading its tensor back) thaws it and the tensor is the same; the figure is that call's time
    against the same call running (docs/oversubscription.md)."""
    size_mib = 512 if tier.sim else 4096
    p, r, _, _ = probe(tier, name, "torch-freeze", size_mib,
                       extra_env={"CUSLICE_MEMORY_FREEZE_IDLE": "2s", "CUSLICE_LOG": "info"})
    expected = ("frozen by cuslice within 60 s of going idle (CHECKPOINTED); NVML lists no memory of "
                "it while frozen; its next call thaws it (RUNNING) and the tensor reads back the same")
    if r is None or "frozen_at" not in r:
        return Check(GROUP, name, failed([p]) or (r or {}).get("error", "no result"), expected, FAIL)
    held_while_frozen = held_frozen(tier, r)
    gib = r["bytes"] / GIB
    after_idle = (f"frozen {r['frozen_at'] - r['held_at']:.1f} s after going idle"
                  if r["frozen_at"] else "never frozen")
    calls = (f"; next call {r['thaw_call_s']:.2f} s frozen ({gib:.1f} GiB back), "
             f"{r['running_call_s']:.2f} s running") if r["thaw_call_s"] is not None and \
        r["running_call_s"] is not None else ""
    figure = (f"{after_idle}; NVML while frozen {mib(held_while_frozen)}; state after "
              f"{r['state_after']}; intact {r['intact']}{calls}")
    ok = (r["frozen_at"] is not None and held_while_frozen == 0 and r["state_after"] == RUNNING
          and r["intact"] is True)
    return Check(GROUP, name, figure, expected, judged(ok), r)
