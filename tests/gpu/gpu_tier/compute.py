"""Compute: slices running real kernels (the workload's PTX spin kernel, and PyTorch matmul loops)
at core limits and requests, each slice's achieved share judged by NVML's per-process samples.
The spin scenarios are tests/tools/share.py's, so the tier and the benchmark mean the same thing.

A real driver gives one utilisation sample a period, naming one process, with the device's
utilisation (docs/compute.md, "The meter"): there NVML cannot say what each of several processes
running at once used. Slices that ran at the same time in the window are then judged on the
simulator by its own count of each process's device time (`simgpu show`, over the same window),
on a real GPU by throughput (device time their launches asked for over their whole run, settling
included)."""
import importlib.util
import json
import os
import subprocess
import threading
import time

from .common import FAIL, INFO, NOT_RUN, Check, Spec, failed, judged
from . import nvml

GROUP = "compute"
TOLERANCE = 2.0  # points, by NVML over the settled window
SPIN_SCENARIOS = ["30/70", "alone 30", "graph alone 30", "req 30/lim 100 + req 70/lim 70",
                  "req 30/lim 100, other idle", "best-effort + 30", "best-effort + req 60"]
TORCH = "PyTorch bf16 matmul loops at 30/70"
# The same with the driver's samples ignored on purpose (CUSLICE_CORE_METER=self-timing): how
# limits hold where the driver gives none (MIG instances, some virtual GPUs; docs/compute.md).
SELF_TIMING = " (self-timing)"
TIMED_SCENARIOS = ["30/70", "best-effort + 30"]


def _share_py():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "share.py")
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
    for name in TIMED_SCENARIOS:
        if not tier.wanted(name + SELF_TIMING):
            continue
        slices, expected = scenarios[name]
        timed = [dict(s, env=dict(s["env"], CUSLICE_CORE_METER="self-timing")) for s in slices]
        checks.extend(spin(tier, name + SELF_TIMING, timed, expected, secs, settle))
    if tier.wanted(TORCH):
        checks.extend(torch_pair(tier, secs, settle))
    if tier.wanted(TORCH + SELF_TIMING):
        checks.extend(torch_pair(tier, secs, settle, timed=True))
    return checks


def one_per_period(util):
    """Whether NVML gave at most one process a sample at each stamp (what real drivers do)."""
    stamps = {}
    for pid, ts, _ in util:
        stamps.setdefault(ts, set()).add(pid)
    return all(len(p) <= 1 for p in stamps.values())


class SimTruth(threading.Thread):
    """On the simulator: every process's device time by `simgpu show`, every 250 ms."""

    def __init__(self, simgpu, state):
        super().__init__(daemon=True)
        self.simgpu, self.state = simgpu, state
        self.samples = []
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            try:
                out = subprocess.run([self.simgpu, "show", "--state", self.state, "--json"],
                                     check=True, capture_output=True, text=True).stdout
                dev = json.loads(out)["devices"][0]
                t = {p["pid"]: p["device_time_ns"] for p in dev["processes"] + dev["exited"]}
                self.samples.append((time.time(), t))
            except (subprocess.CalledProcessError, ValueError, KeyError, IndexError):
                pass
            self._halt.wait(0.25)

    def stop(self):
        self._halt.set()
        self.join()

    def share(self, pid, t0, t1):
        """Percent of [t0, t1] (nearest samples) the simulator ran `pid`'s work."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        (a, xa), (b, xb) = inside[0], inside[-1]
        return 100.0 * (xb.get(pid, 0) - xa.get(pid, 0)) / ((b - a) * 1e9)


def judge_shares(name, labels, pids, expected, util, t0, t1, through=None, together=False,
                 truth=None):
    """One check per slice: its NVML share over [t0, t1] against the configured share; where NVML
    names one process a period and the slices ran `together`, by the simulator's count (`truth`)
    or by throughput."""
    period = nvml.sample_period_us(util)
    by_truth = together and truth is not None and one_per_period(util)
    by_throughput = not by_truth and together and through is not None \
        and all(t is not None for t in through) and one_per_period(util)
    out = []
    for k, (label, pid, want) in enumerate(zip(labels, pids, expected)):
        if by_truth or by_throughput:
            got = truth.share(pid, t0, t1) if by_truth else through[k]
            how = (f"by the simulator's count over {t1 - t0:.1f} s" if by_truth
                   else "by throughput over the run")
            if got is None:
                out.append(Check(GROUP, f"{name}: {label}", f"no figure {how}",
                                 f"{want}% +- {TOLERANCE:g}", FAIL, {"pid": pid}))
                continue
            figure = (f"{got:.1f}% {how} (NVML gives one sample a period, naming one process: it "
                      f"cannot tell the slices apart)")
            out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {TOLERANCE:g} points",
                             judged(abs(got - want) <= TOLERANCE),
                             {"achieved": got, "expected": want,
                              "by": "simulator" if by_truth else "throughput",
                              "sample_period_us": period, "window_s": t1 - t0}))
            continue
        got = nvml.share(util, pid, t0, t1, period)
        worst = nvml.worst_window(util, pid, t0, t1, want, period_us=period)
        extra = "" if through is None or through[k] is None else f"; by throughput {through[k]:.1f}%"
        if got is None:
            out.append(Check(GROUP, f"{name}: {label}", "no NVML per-process utilisation samples in the window",
                             f"{want}% +- {TOLERANCE:g}", FAIL, {"pid": pid}))
            continue
        figure = (f"{got:.1f}% by NVML over {t1 - t0:.1f} s (worst 1 s window "
                  f"{'n/a' if worst is None else f'{worst:.1f}%'}){extra}")
        out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {TOLERANCE:g} points",
                         judged(abs(got - want) <= TOLERANCE),
                         {"achieved": got, "expected": want, "worst_1s": worst,
                          "throughput": None if through is None else through[k],
                          "sample_period_us": period, "window_s": t1 - t0}))
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
    truth = None
    if tier.sim and os.environ.get("SIMGPU_STATE"):
        truth = SimTruth(os.path.join(tier.bin, "simgpu"), os.environ["SIMGPU_STATE"])
        truth.start()
    procs = tier.run(GROUP, f"spin kernels: {name}", specs, timeout=secs + 60)
    if truth is not None:
        truth.stop()
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
    # Slices that ran in the window at the same time (one that ran only before it does not count).
    together = sum(1 for s in slices if (s["secs"] if s["secs"] is not None else secs) > settle) > 1
    return judge_shares(name, labels, [p.pid for p in procs], expected, util, t0, t1, through, together,
                        truth)


def torch_pair(tier, secs, settle, timed=False):
    """bf16 matmul loops: alone without limits for the reference rate, then two at 30 and 70
    (`timed`: the library's own timing, the driver's samples ignored)."""
    name = TORCH + (SELF_TIMING if timed else "")
    if tier.sim:
        return [Check(GROUP, name, "needs a real GPU (PyTorch)", "", NOT_RUN)]
    if importlib.util.find_spec("torch") is None:
        return [Check(GROUP, name, "PyTorch is not installed", "", NOT_RUN)]
    alone_argv = [tier.python, tier.probe, "torch-matmul", str(secs / 2)]
    (alone,) = tier.run(GROUP, f"{name}: alone, without the library", [Spec(alone_argv, {})], timeout=300)
    base = alone.event("result")
    if base is None:
        return [Check(GROUP, name, failed([alone]) or "no result alone", "", FAIL)]
    specs = [Spec([tier.python, tier.probe, "torch-matmul", str(secs)],
                  tier.cuslice(tier.scratch(f"torch-{lim}{'-timed' if timed else ''}"), core_limit=str(lim)),
                  f"limit {lim}")
             for lim in (30, 70)]
    if timed:
        for sp in specs:
            sp.env["CUSLICE_CORE_METER"] = "self-timing"
    procs = tier.run(GROUP, name, specs, timeout=300)
    results = [p.event("result") for p in procs]
    started = [p.event("started") for p in procs]
    if failed(procs) or not all(results) or not all(started):
        return [Check(GROUP, name, failed(procs) or "no result", "", FAIL)]
    # Both running their timed loops: from the later start (plus settling) to the earlier end.
    t0 = max(s["t"] for s in started) + settle
    t1 = min(s["t"] + r["secs"] for s, r in zip(started, results))
    through = [100.0 * r["per_sec"] / base["per_sec"] for r in results]
    util = tier.nvml.utilisation(t0 - 1, t1 + 1)
    checks = judge_shares(name, ["limit 30", "limit 70"], [p.pid for p in procs], [30, 70], util, t0, t1, through,
                          together=True)
    checks.append(Check(GROUP, f"{name}: alone", f"{base['tflops']:.0f} TFLOP/s ({base['per_sec']:.1f} matmuls/s, "
                        f"n={base['n']})", "reference for the throughput shares", INFO, base))
    return checks
