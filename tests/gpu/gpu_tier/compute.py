"""Compute: slices running real kernels (the workload's PTX kernels, and PyTorch matmul loops) at
core limits and requests, each slice's achieved share judged against its configured share.

The scenarios are tests/tools/share.py's, so the tier and the benchmark mean the same thing. They
run the workload's fixed-work kernel (`--kernel work`); "alone 30 (spin)" runs the spin kernel,
which waits for the clock and ends on time whatever ran in between, so it measures a slice alone
only.

A real driver gives one utilisation sample a period, naming one process, with the device's
utilisation (docs/compute.md, "Why turns"): NVML cannot say what each of several processes running
at once used. A slice alone in the settled window is judged by NVML's per-process samples, with
its throughput beside. Slices that ran at once are judged by **throughput**: the work their
kernels completed over the settled window (the workload's `progress` lines) against the same
kernel's rate alone, measured first in the same run without the library (`cuda-workload
calibrate-work` finds the iterations of a 1 ms kernel on this GPU, then one process launches it
back to back). On the simulator the simulator's own count of each process's device time over the
window is printed beside."""
import importlib.util
import json
import os
import subprocess
import threading
import time

from .common import FAIL, INFO, NOT_RUN, PASS, Check, Spec, failed, judged
from . import nvml

GROUP = "compute"
TOLERANCE = 2.0  # points, over the settled window
# share.py's scenarios whose loops keep the device busy alone (so the rate alone of the 1 ms work
# kernel back to back is theirs too): the light probe, the 10 us loop and the synchronised matmul
# loop are left to the simulator; the PyTorch pair below is the real synchronised loop.
SCENARIOS = ["30/70", "20/30/50", "25x4", "alone 30", "alone 30 (spin)", "two processes 30/70", "graph alone 30",
             "req 30/lim 100 + req 70/lim 70", "req 30/lim 100, other idle", "best-effort + 30",
             "best-effort + req 60", "50us 30/70", "10ms 30/70", "graph 30/70", "4 streams 30/70"]
TORCH = "PyTorch bf16 matmul loops at 30/70"
# The work kernel's length in every scenario here, and what the rate alone is measured with.
KERNEL_US = 1000
REFERENCE = "work kernel alone, without the library"


def _share_py():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "share.py")
    spec = importlib.util.spec_from_file_location("share", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(tier):
    secs, settle = (6.0, 2.5) if tier.quick else (10.0, 3.0)
    share = _share_py()
    checks = []
    wanted = [n for n in SCENARIOS if tier.wanted(n)]
    ref = None
    if any(share.SCENARIOS[n][0][0]["kernel"] == "work" for n in wanted):
        ref, ref_checks = reference(tier, share, secs)
        checks.extend(ref_checks)
    for name in wanted:
        slices, expected = share.SCENARIOS[name]
        # As share.py does: a scenario that misses is run again, each missed run reported. On
        # the simulated GPU, whose speed is the host's, up to share.py's RUNS runs, and a run may
        # hold in proportion; on a GPU, twice (each run is device time).
        runs, missed = share.RUNS if tier.sim else 2, []
        for attempt in range(1, runs + 1):
            got = shares(tier, share, name, slices, expected, secs, settle, ref)
            if tier.sim:
                got = in_proportion(got, share.TOGETHER)
            if attempt == runs or not any(c.status == FAIL for c in got):
                break
            missed += [Check(c.group, f"{c.name} (missed, run again)", c.figure, c.expected, INFO, c.data)
                       for c in got]
        checks.extend(missed + got)
    if tier.wanted(TORCH):
        checks.extend(torch_pair(tier, secs, settle))
    return checks


def reference(tier, share, secs):
    """The work kernel's iterations for KERNEL_US and its rate alone (device time its kernels ask
    for per second of wall time, a fraction), without the library: (ref, checks). ref is None
    when either run failed. `ref["rates"]` keeps each loop's rate alone by its kernel length
    (`loop_rate` adds the others)."""
    cal_argv = [tier.workload, "calibrate-work", "--us", str(KERNEL_US)]
    (cal,) = tier.run(GROUP, f"{REFERENCE}: calibrate-work", [Spec(cal_argv, {})], timeout=120)
    calibrated = cal.event("calibrated")
    if calibrated is None:
        return None, [Check(GROUP, REFERENCE, failed([cal]) or "no `calibrated` line", "", FAIL)]
    ref = {"iters": calibrated["iters"], "kernel_ns": calibrated["kernel_ns"], "rates": {}}
    rate, why = loop_rate(tier, share, ref, KERNEL_US, secs)
    if rate is None:
        return None, [Check(GROUP, REFERENCE, why, "", FAIL)]
    ref["rate"] = rate
    ref["kernels_per_sec"] = 1e9 * rate / (KERNEL_US * 1000)
    figure = (f"{ref['iters']} iterations for {KERNEL_US} us (calibrate-work: {calibrated['kernel_ns'] / 1000:.0f} us "
              f"measured); alone {ref['kernels_per_sec']:.1f} kernels/s, {100 * rate:.1f}% of the time its kernels "
              f"ask for")
    info = {k: v for k, v in ref.items() if k != "rates"}
    return ref, [Check(GROUP, REFERENCE, figure, "reference for the throughput shares", INFO, info)]


def loop_rate(tier, share, ref, kernel_us, secs):
    """The rate alone (a fraction) of one process launching work kernels of `kernel_us` back to
    back without the library, measured once per length: (rate, None), or (None, why). A loop of
    short kernels may keep the device less than busy alone (its launches cost the host more than
    its kernels run), and a slice's throughput is judged against its own loop's rate."""
    if kernel_us in ref["rates"]:
        return ref["rates"][kernel_us], None
    alone_secs = max(2.0, secs / 2)
    argv = [tier.workload, "launch", "--kernel", "work", "--work-iters",
            str(max(1, ref["iters"] * kernel_us // KERNEL_US)), "--ns-per-block", "1000",
            "--blocks", str(kernel_us), "--secs", str(alone_secs), "--progress-ms", "250"]
    (alone,) = tier.run(GROUP, f"{REFERENCE}: {kernel_us} us kernels, {alone_secs:g} s back to back",
                        [Spec(argv, {})], timeout=120)
    series = share.progress(alone.stdout, 0.0)
    if failed([alone]) or len(series) < 3:
        return None, failed([alone]) or "too few `progress` lines"
    # From the first progress line (past the start) to the last (the end, after the last sync).
    rate = share.throughput([series], series[0][0], series[-1][0]) / 100.0
    ref["rates"][kernel_us] = rate
    return rate, None


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
                # A live process's own figure over any exited record of the same pid.
                t = {p["pid"]: p["device_time_ns"] for p in dev["exited"] + dev["processes"]}
                # Device time never goes down, yet a process that has given up its last
                # context and has not been reaped yet is in neither list: it keeps its figure.
                for pid, ns in (self.samples[-1][1] if self.samples else {}).items():
                    t[pid] = max(ns, t.get(pid, 0))
                self.samples.append((time.time(), t))
            except (subprocess.CalledProcessError, ValueError, KeyError, IndexError):
                pass
            self._halt.wait(0.25)

    def stop(self):
        self._halt.set()
        self.join()

    def share(self, pids, t0, t1):
        """Percent of [t0, t1] (nearest samples) the simulator ran the work of `pids`."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        (a, xa), (b, xb) = inside[0], inside[-1]
        return 100.0 * sum(xb.get(pid, 0) - xa.get(pid, 0) for pid in pids) / ((b - a) * 1e9)


def judge_shares(name, labels, pids, expected, util, t0, t1, through=None, together=False,
                 truth=None, worst=None, through_over=None, tolerance=TOLERANCE):
    """One check per slice against its configured share over [t0, t1]. Slices that ran `together`
    are judged by their throughput (`through`: percent of the rate alone, None where there is
    none; over [t0, t1] unless `through_over` says over what), the simulator's count (`truth`)
    beside it; a slice alone by NVML's per-process samples, its throughput beside; each within
    `tolerance` points. `pids[k]` is a slice's list of processes (or one pid); `worst[k]` its
    throughput's worst 1 s window."""
    over = through_over or f"over {t1 - t0:.1f} s"
    period = nvml.sample_period_us(util)
    out = []
    for k, (label, want) in enumerate(zip(labels, expected)):
        mine = pids[k] if isinstance(pids[k], list) else [pids[k]]
        counted = truth.share(mine, t0, t1) if truth is not None else None
        by_sim = "" if counted is None else f"; the simulator's count {counted:.1f}%"
        got = None if through is None else through[k]
        window = None if worst is None else worst[k]
        if together:
            if got is None:
                out.append(Check(GROUP, f"{name}: {label}",
                                 "no throughput figure (slices at once are judged by fixed-work throughput)",
                                 f"{want}% +- {tolerance:g}", FAIL, {"pid": mine[0]}))
                continue
            figure = (f"{got:.1f}% by throughput {over} against the rate alone"
                      f"{'' if window is None else f' (worst 1 s window {window:.1f}%)'}{by_sim}")
            out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {tolerance:g} points",
                             judged(abs(got - want) <= tolerance),
                             {"achieved": got, "expected": want, "tolerance": tolerance, "by": "throughput",
                              "worst_1s": window,
                              "simulator": counted, "one_per_period": one_per_period(util),
                              "sample_period_us": period, "window_s": t1 - t0}))
            continue
        share = nvml.share(util, mine[0], t0, t1, period)
        worst_nvml = nvml.worst_window(util, mine[0], t0, t1, want, period_us=period)
        extra = ("" if got is None else f"; by throughput {got:.1f}%") + by_sim
        if share is None:
            out.append(Check(GROUP, f"{name}: {label}", "no NVML per-process utilisation samples in the window",
                             f"{want}% +- {tolerance:g}", FAIL, {"pid": mine[0]}))
            continue
        figure = (f"{share:.1f}% by NVML over {t1 - t0:.1f} s (worst 1 s window "
                  f"{'n/a' if worst_nvml is None else f'{worst_nvml:.1f}%'}){extra}")
        out.append(Check(GROUP, f"{name}: {label}", figure, f"{want}% +- {tolerance:g} points",
                         judged(abs(share - want) <= tolerance),
                         {"achieved": share, "expected": want, "by": "nvml", "worst_1s": worst_nvml,
                          "throughput": got, "simulator": counted, "sample_period_us": period,
                          "window_s": t1 - t0}))
    return out


def in_proportion(checks, least):
    """On the simulated GPU, whose speed is the host's: where the slices judged by throughput
    together are configured the whole device and a run missed, each slice's part of what they got
    together, judged within the same points, as share.py judges a run that missed: a host that leaves
    the device idle in a slice's turn (a launching or draining thread waiting for a CPU) takes
    from every slice, and how the device was split is the library's doing. The slices together
    must have got at least `least` percent of their rate alone. `checks` is returned unchanged
    where that does not apply or does not hold."""
    held = [c for c in checks if c.data.get("by") == "throughput"]
    if (len(held) < 2 or len(held) != len([c for c in checks if c.status != INFO])
            or not any(c.status == FAIL for c in held)
            or abs(sum(c.data["expected"] for c in held) - 100.0) > 0.01):
        return checks
    together = sum(c.data["achieved"] for c in held)
    if together < least:
        return checks
    parts = [100.0 * c.data["achieved"] / together for c in held]
    if any(abs(p - c.data["expected"]) > c.data["tolerance"] for p, c in zip(parts, held)):
        return checks
    return [c for c in checks if c.status == INFO] + [
        Check(c.group, c.name, f"{c.figure}; {p:.1f}% of what the slices got together ({together:.1f}% of "
              "their rate alone): held in proportion (the host left the device idle)", c.expected, PASS,
              dict(c.data, in_proportion=p, together=together))
        for p, c in zip(parts, held)]


def slice_label(s):
    env = s["env"]
    parts = []
    if "CUSLICE_CORE_REQUEST" in env:
        parts.append(f"request {env['CUSLICE_CORE_REQUEST']}")
    if "CUSLICE_CORE_LIMIT" in env:
        parts.append(f"limit {env['CUSLICE_CORE_LIMIT']}")
    return " ".join(parts) or "best-effort"


def shares(tier, share, name, slices, expected, secs, settle, ref):
    """One scenario: its slices at once, each judged as `judge_shares` says."""
    specs, owner = [], []
    for k, s in enumerate(slices):
        run_secs = s["secs"] if s["secs"] is not None else secs
        argv = share.command(s, run_secs)
        argv[0] = tier.workload
        if s["kernel"] == "work":
            if ref is None:
                return [Check(GROUP, name, f"no rate alone ({REFERENCE} failed)", "", FAIL)]
            argv += ["--work-iters", str(max(1, ref["iters"] * s["kernel_us"] // KERNEL_US))]
        state = tier.scratch(f"{name}-{k}")
        for _ in range(s["procs"]):
            env = tier.cuslice(state)
            env.update(s["env"])
            specs.append(Spec(argv, env, f"slice {k}: {slice_label(s)}"))
            owner.append(k)
    truth = None
    if tier.sim and os.environ.get("SIMGPU_STATE"):
        truth = SimTruth(os.path.join(tier.bin, "simgpu"), os.environ["SIMGPU_STATE"])
        truth.start()
    # Wall clock (the tier's and NVML's) less the monotonic clock (the workload's progress lines).
    offset = time.time() - time.monotonic()
    procs = tier.run(GROUP, f"{slices[0]['kernel']} kernels: {name}", specs, timeout=secs + 60)
    if truth is not None:
        truth.stop()
    why = failed(procs)
    labels = [f"slice {k} ({slice_label(s)}, {s['kernel_us']} us {s['kernel']} kernels via {s['via']}"
              + ("" if s["procs"] == 1 else f", {s['procs']} processes") + ")" for k, s in enumerate(slices)]
    if why:
        return [Check(GROUP, f"{name}: {label}", why, f"{want}%", FAIL) for label, want in zip(labels, expected)]
    start = max(p.t0 for p in procs)
    t0, t1 = start + settle, start + secs
    # Each process's progress, in the tier's wall-clock seconds.
    series = [[(t + offset, w) for t, w in share.progress(p.stdout, 0.0)] for p in procs]
    full = [sr for sr, k in zip(series, owner) if slices[k]["secs"] is None and sr]
    if full:
        t1 = min(t1, min(sr[-1][0] for sr in full))
    rate, rate_checks = 1.0, []
    if ref is not None and slices[0]["kernel"] == "work":
        kernel_us = slices[0]["kernel_us"]
        rate, why = loop_rate(tier, share, ref, kernel_us, secs)
        if rate is None:
            return [Check(GROUP, name, f"no rate alone of its {kernel_us} us loop ({why})", "", FAIL)]
        if kernel_us != KERNEL_US:
            rate_checks.append(Check(GROUP, f"{name}: rate alone", f"{100 * rate:.1f}% for {kernel_us} us kernels "
                                     "back to back without the library", "reference for its throughput shares",
                                     INFO, {"kernel_us": kernel_us, "rate": rate}))
    through, worst = [], []
    for k, want in enumerate(expected):
        mine = [sr for sr, o in zip(series, owner) if o == k]
        if not all(mine) or t1 - t0 < 1.0:
            through.append(None)
            worst.append(None)
            continue
        through.append(share.throughput(mine, t0, t1) / rate)
        windows = [share.throughput(mine, a, a + 1.0) / rate
                   for a in (t0 + 0.25 * i for i in range(int((t1 - 1.0 - t0) / 0.25) + 1))]
        worst.append(max(windows, key=lambda w: abs(w - want)) if windows else None)
    util = tier.nvml.utilisation(start - 1, start + secs + 1)
    pids = [[p.pid for p, o in zip(procs, owner) if o == k] for k in range(len(slices))]
    # Slices that ran in the window at the same time (one that ran only before it does not count).
    together = sum(1 for s in slices if (s["secs"] if s["secs"] is not None else secs) > settle) > 1
    if together and slices[0]["kernel"] == "spin":
        return [Check(GROUP, f"{name}: {label}", "spin kernels measure a slice alone only", "", FAIL)
                for label in labels]
    # Loops bound by the host's launches are judged as share.py judges them (its LAUNCH_BOUND_CHECK).
    tolerance = max(TOLERANCE, share.LAUNCH_BOUND_CHECK.get(name, (0.0, 0.0))[0])
    return rate_checks + judge_shares(name, labels, pids, expected, util, t0, t1, through, together, truth,
                                      worst, tolerance=tolerance)


def torch_pair(tier, secs, settle):
    """bf16 matmul loops: alone without limits for the reference rate, then two at 30 and 70."""
    name = TORCH
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
                  tier.cuslice(tier.scratch(f"torch-{lim}"), core_limit=str(lim)),
                  f"limit {lim}")
             for lim in (30, 70)]
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
                          together=True, through_over="over its timed loop")
    checks.append(Check(GROUP, f"{name}: alone", f"{base['tflops']:.0f} TFLOP/s ({base['per_sec']:.1f} matmuls/s, "
                        f"n={base['n']})", "reference for the throughput shares", INFO, base))
    return checks
