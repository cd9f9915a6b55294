"""Compute: slices running real kernels (the workload's PTX spin kernel, and PyTorch matmul loops)
at core limits and requests, each slice's achieved share judged by NVML's per-process samples, or
by throughput where NVML names one process per sample (see `judge_shares`).
The spin scenarios are tests/share.py's, so the tier and the benchmark mean the same thing."""
import importlib.util
import os

from .common import FAIL, INFO, NOT_RUN, Check, Spec, failed, judged
from . import nvml

GROUP = "compute"
TOLERANCE = 2.0  # points, over the settled window by NVML, or by throughput
SPIN_SCENARIOS = ["30/70", "alone 30", "graph alone 30", "req 30/lim 100 + req 70/lim 70",
                  "req 30/lim 100, other idle", "best-effort + 30", "best-effort + req 60"]
TORCH = "PyTorch bf16 matmul loops at 30/70"


def _share_py():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "share.py")
    spec = importlib.util.spec_from_file_location("share", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(tier):
    secs, settle = (6.0, 2.5) if tier.quick else (10.0, 3.0)
    scenarios = _share_py().SCENARIOS
    checks = []
    for name in SPIN_SCENARIOS:
        if not tier.wanted(name):
            continue
        slices, expected = scenarios[name]
        checks.extend(spin(tier, name, slices, expected, secs, settle))
    if tier.wanted(TORCH):
        checks.extend(torch_pair(tier, secs, settle))
    return checks


def judge_shares(name, labels, pids, expected, util, t0, t1, through=None):
    """One check per slice: its share over [t0, t1] against the configured share.

    By NVML's per-process samples, unless the driver named one process per sample while several
    ran (a real driver does when processes time-slice the device): then a sample's figure is the
    device's, not the process's, and the slice is judged by its throughput (the work it got done
    against the work asked for, or against the same work alone), with NVML's figure beside it."""
    period = nvml.sample_period_us(util)
    by_throughput = through is not None and None not in through and nvml.one_process_per_stamp(util, pids, t0, t1)
    out = []
    for k, (label, pid, want) in enumerate(zip(labels, pids, expected)):
        got = nvml.share(util, pid, t0, t1, period)
        worst = nvml.worst_window(util, pid, t0, t1, want, period_us=period)
        facts = {"achieved": got, "expected": want, "worst_1s": worst,
                 "throughput": None if through is None else through[k],
                 "sample_period_us": period, "window_s": t1 - t0, "judged_by": "nvml"}
        if by_throughput:
            nv = "n/a" if got is None else f"{got:.1f}%"
            figure = (f"{through[k]:.1f}% by throughput (NVML names one process per sample, so its "
                      f"per-process figure, {nv}, is the device's)")
            facts.update(achieved=through[k], judged_by="throughput")
            out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {TOLERANCE:g} points",
                             judged(abs(through[k] - want) <= TOLERANCE), facts))
            continue
        extra = "" if through is None or through[k] is None else f"; by throughput {through[k]:.1f}%"
        if got is None:
            out.append(Check(GROUP, f"{name}: {label}", "no NVML per-process utilisation samples in the window",
                             f"{want}% +- {TOLERANCE:g}", FAIL, {"pid": pid}))
            continue
        figure = (f"{got:.1f}% by NVML over {t1 - t0:.1f} s (worst 1 s window "
                  f"{'n/a' if worst is None else f'{worst:.1f}%'}){extra}")
        out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {TOLERANCE:g} points",
                         judged(abs(got - want) <= TOLERANCE), facts))
    return out


def slice_label(s):
    env = s["env"]
    parts = []
    if "CUSLICE_CORE_REQUEST" in env:
        parts.append(f"request {env['CUSLICE_CORE_REQUEST']}")
    if "CUSLICE_CORE_LIMIT" in env:
        parts.append(f"limit {env['CUSLICE_CORE_LIMIT']}")
    return " ".join(parts) or "best-effort"


def spin(tier, name, slices, expected, secs, settle):
    specs = []
    for k, s in enumerate(slices):
        run_secs = s["secs"] if s["secs"] is not None else secs
        argv = [tier.workload, "launch", "--ns-per-block", "1000", "--blocks", str(s["kernel_us"]),
                "--secs", str(run_secs), "--via", s["via"], "--streams", str(s["streams"])]
        env = tier.cuslice(tier.scratch(f"{name}-{k}"))
        env.update(s["env"])
        specs.append(Spec(argv, env, f"slice {k}: {slice_label(s)}"))
    procs = tier.run(GROUP, f"spin kernels: {name}", specs, timeout=secs + 60)
    why = failed(procs)
    labels = [f"slice {k} ({slice_label(s)}, {s['kernel_us']} us kernels via {s['via']})"
              for k, s in enumerate(slices)]
    if why:
        return [Check(GROUP, f"{name}: {label}", why, f"{want}%", FAIL) for label, want in zip(labels, expected)]
    start = max(p.t0 for p in procs)
    t0, t1 = start + settle, start + secs
    through = []
    for p in procs:
        ev = p.event("launched")
        through.append(100.0 * ev["engine_ns_requested"] / ev["wall_ns"] if ev and ev["wall_ns"] else None)
    util = tier.nvml.utilisation(start - 1, start + secs + 1)
    return judge_shares(name, labels, [p.pid for p in procs], expected, util, t0, t1, through)


def torch_pair(tier, secs, settle):
    """bf16 matmul loops: alone without limits for the reference rate, then two at 30 and 70."""
    if tier.sim:
        return [Check(GROUP, TORCH, "needs a real GPU (PyTorch)", "", NOT_RUN)]
    if importlib.util.find_spec("torch") is None:
        return [Check(GROUP, TORCH, "PyTorch is not installed", "", NOT_RUN)]
    alone_argv = [tier.python, tier.probe, "torch-matmul", str(secs / 2)]
    (alone,) = tier.run(GROUP, f"{TORCH}: alone, without the library", [Spec(alone_argv, {})], timeout=300)
    base = alone.event("result")
    if base is None:
        return [Check(GROUP, TORCH, failed([alone]) or "no result alone", "", FAIL)]
    specs = [Spec([tier.python, tier.probe, "torch-matmul", str(secs)],
                  tier.cuslice(tier.scratch(f"torch-{lim}"), core_limit=str(lim)), f"limit {lim}")
             for lim in (30, 70)]
    procs = tier.run(GROUP, TORCH, specs, timeout=300)
    results = [p.event("result") for p in procs]
    started = [p.event("started") for p in procs]
    if failed(procs) or not all(results) or not all(started):
        return [Check(GROUP, TORCH, failed(procs) or "no result", "", FAIL)]
    # Both running their timed loops: from the later start (plus settling) to the earlier end.
    t0 = max(s["t"] for s in started) + settle
    t1 = min(s["t"] + r["secs"] for s, r in zip(started, results))
    through = [100.0 * r["per_sec"] / base["per_sec"] for r in results]
    util = tier.nvml.utilisation(t0 - 1, t1 + 1)
    checks = judge_shares(TORCH, ["limit 30", "limit 70"], [p.pid for p in procs], [30, 70], util, t0, t1, through)
    checks.append(Check(GROUP, f"{TORCH}: alone", f"{base['tflops']:.0f} TFLOP/s ({base['per_sec']:.1f} matmuls/s, "
                        f"n={base['n']})", "reference for the throughput shares", INFO, base))
    return checks
