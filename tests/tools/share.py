#!/usr/bin/env python3
"""Compute time-share scenarios on the simulated GPU: configured vs achieved share per slice.

Each scenario starts its slices at once, each slice one process (or two sharing a slice: the same
CUSLICE_STATE_DIR) launching the fixed-work kernel (`cuda-workload launch --kernel work`) through
the library. A slice is judged by its **throughput**: the work its kernels completed in the
settled window (from SETTLE s to the end), read from the workload's `progress` lines (every
250 ms), against its rate alone: the same loop measured alone first, on a simulator of its own,
without the library (once per kind of loop; SHARE_ALONE_CACHE names a file that keeps the rates
between runs). On the simulator a work kernel takes the device time it is launched with, so a
rate is the device time its completed kernels asked for over wall time; a loop that keeps the
device busy alone has a rate alone near 100%, one whose launches cost the CPU more than its
kernels take, or that synchronises every few launches, less ("rate alone" in the table). Beside
it, the simulator's own count of each process's device time over the same window (`simgpu show` every 250 ms; a slice of two processes: their sum).
Fixed work is what makes throughput a measure of the device time a slice got when slices run at
once; the spin kernel waits for the clock and ends on time whatever ran in between (as on
hardware, docs/gpu.md), so it may judge a slice alone only: "alone 30 (spin)" is judged by the
simulator's count.

Printed per slice: the configured share, the throughput, the simulator's count, the worst 1 s
window of the judged figure after SETTLE, and when the slice's 1 s figure first came within 2
points of its configured share and stayed there. `tests/tools/share.py [NAME...]` runs some scenarios.

    --check POINTS         fail (exit 1) when a slice's judged figure is more than POINTS from its
                           configured share, or any 1 s window after SETTLE more than the
                           window limit (tests/run: --check 2), in each of RUNS runs of the
                           scenario running (one that misses is run again; every run is
                           printed). Where the configured shares add up to the device, or every
                           slice's loop is one the host holds back, a run may hold in proportion
                           instead: each slice's part of what the slices got together, and of
                           each 1 s window, within the same limits, the slices together at
                           TOGETHER% or more of what they were configured (host-held loops
                           whose shares leave the device idle: within HELD_TOGETHER; a host
                           that leaves the device idle takes from every slice, and runs a
                           host-held loop at its own speed)
    --window-check POINTS  the window limit (default 5)
    --aggregate            instead: two busy loops' throughput together at 30/70 against the same
                           two without the library (tests/bench; goal >= 97%)

    --rates-alone          instead: measure the rate alone of each named scenario's loops (all
                           scenarios' by default) into SHARE_ALONE_CACHE, and run nothing else

SHARE_SAMPLES picks how the simulator's NVML gives per-process samples: one-per-period (default),
per-process, or none. SHARE_SECS (default 8) and SHARE_SETTLE (default 3) set the run and the
settling time. SHARE_LOCK names a lock file that runs side by side share (tests/run runs the
three sample modes at once): a scenario whose loops the host holds back (the launch-bound and
reported-only ones, and any loop below 99.5% of the device alone) runs holding it alone, and a
rate alone is measured holding it alone; the other scenarios, whose processes use a fifth of a
core or less on the 2-core machine (docs/testing.md), hold it shared. Used by tests/bench
(section 5) and tests/run.
"""
import contextlib, fcntl, json, os, shutil, subprocess, sys, tempfile, time

# The real-GPU tier loads this file by its path, not as a script: simtruth.py beside it is found
# by path either way.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from simtruth import carried, device_times

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "release")
SIMGPU, WORKLOAD, LIB = (os.path.join(BIN, n) for n in ("simgpu", "cuda-workload", "libcuslice.so"))
SECS = float(os.environ.get("SHARE_SECS", "8"))
SETTLE = float(os.environ.get("SHARE_SETTLE", "3"))
# "one-per-period" (the simulator's default, as real drivers give them), "per-process", or "none"
# (no per-process samples, as on MIG); turns read none of them, so the shares should not change
SAMPLES = os.environ.get("SHARE_SAMPLES", "one-per-period")
WINDOW_CHECK = 5.0  # points: every 1 s window after SETTLE, with --check
# A launch-bound loop's rate is the host's: in its turns it ran 0.9 to 1.14 times as fast as alone
# (measured minutes apart on the 2-core machine, other work on it). A loop of 50 us kernels kept 4
# deep (as the real-GPU tier runs it) is nearly so there: its launching thread, held up 200 us by
# the other threads on 2 cores, lets the queue run dry and the turn pass on (CI's 2-core machine:
# 67.6% for 70, one 1 s window at 64.1%; here it runs deeper, `depth` below). These are judged
# within (points, points in a 1 s window) instead of --check's and the window limit when those
# are tighter (docs/compute.md, Known limits): the two named, and any loop the host held below
# HOST_BOUND percent of the device alone in this run (a slower host holds back longer kernels
# too: 100 us kernels kept 4 deep ran at 91.9% alone on one).
HOST_BOUND_CHECK = (3.0, 7.0)
LAUNCH_BOUND_CHECK = {"10us 10/20": HOST_BOUND_CHECK, "50us 30/70": HOST_BOUND_CHECK}
HOST_BOUND = 97.0
# A loop below this percent of the device alone is one the host holds back: its rate alone is
# printed beside its row, measured again before a run again, and (with SHARE_LOCK) it runs alone.
HOST_HELD = 99.5
# Run and printed, never failed by --check (docs/compute.md, Known limits): 100 us kernels at 30/70,
# 20 deep, on the 2-core machine: the 70% slice's 1 s windows fell to 53.7 and 59.5% in two runs
# running (65.3 and 66.0% over each), while the 50 us and 10 ms loops held within 2 points there.
REPORTED_ONLY = {"100us 30/70"}
SETTLED = 2.0  # points: a slice has settled once its 1 s windows stay this close to its share
# A scenario that misses is run again, up to this many runs in all: a 2-core host that stalls a
# launching thread for a while, or a shared machine its neighbours slow down, can put one run past
# the check (CI's machine once kept a pair of 50 us loops at 65% of their rate alone together for
# one run, where they got 96% in the run before).
RUNS = 3
# Slices whose shares add up to the device hold in proportion only where they kept it at least this
# busy together (percent of their rates alone): turns that lose more than a fifth of the device fail
# however they split the rest. (interposer/tests/compute.rs and the real-GPU tier judge alike.)
TOGETHER = 80.0
# Slices of loops the host holds back, whose shares leave part of the device idle, hold in
# proportion only where they got together between these percents of what they were configured
# (`split`): such a loop runs in its turns as fast as the host lets it, which is not its rate
# alone. The 10 us loop at limits 10/20 ran 0.74 to 1.14
# times as fast in its turns as alone (docs/compute.md, Known limits): 0.78 and 0.79 in CI's
# three runs of each sample mode, its rate alone 81 to 83%, each run split 1:2. Fewer than
# HELD_TOGETHER[0] percent would be turns that lost the device, not the host's speed.
HELD_TOGETHER = (60.0, 125.0)


# name -> (slices, expected share per slice); expected None: reported, not configured.
# A slice: its environment, kernel length, how it launches, how long it runs (None: SECS), how
# many processes share it. via "probe": one kernel every `period_ms`, each waited for (a light
# slice), not back to back.
def slice_(limit=None, request=None, kernel_us=1000, via="kernel", streams=1, delay=0.0, secs=None, period_ms=10,
           kernel="work", procs=1, sync_every=None, depth=None):
    env = {}
    if limit is not None:
        env["CUSLICE_CORE_LIMIT"] = str(limit)
    if request is not None:
        env["CUSLICE_CORE_REQUEST"] = str(request)
    if not env:
        env["CUSLICE_MEMORY_LIMIT"] = "4GiB"  # a slice with no core setting: best-effort
    # The light probe asks for what it asks for (its share is its kernels over its period), and
    # the spin kernel is judged by the simulator's count: neither against a rate alone.
    alone = via != "probe" and kernel == "work"
    return dict(env=env, kernel_us=kernel_us, via=via, streams=streams, delay=delay, secs=secs,
                period_ms=period_ms, kernel=kernel, procs=procs, sync_every=sync_every, depth=depth, alone=alone)

SCENARIOS = {
    "30/70": ([slice_(30), slice_(70)], [30, 70]),
    "20/30/50": ([slice_(20), slice_(30), slice_(50)], [20, 30, 50]),
    "25x4": ([slice_(25) for _ in range(4)], [25, 25, 25, 25]),
    "alone 30": ([slice_(30)], [30]),
    # The spin kernel waits for the clock: a measure of a slice alone only, judged by the
    # simulator's count.
    "alone 30 (spin)": ([slice_(30, kernel="spin")], [30]),
    # The 30% slice is two processes sharing one slice: judged by their summed throughput.
    "two processes 30/70": ([slice_(30, procs=2), slice_(70)], [30, 70]),
    "req 30/lim 100 + req 70/lim 70": ([slice_(100, 30), slice_(70, 70)], [30, 70]),
    "req 30/lim 100, other idle": ([slice_(100, 30), slice_(70, 70, secs=0.5)], [100, 0]),
    "best-effort + 30": ([slice_(30), slice_()], [30, 70]),
    "best-effort + req 60": ([slice_(None, 60), slice_()], [99, 1]),
    # a light best-effort slice (a 2 ms kernel every 10 ms) beside a busy one: the light one gets
    # what it asks; the busy one's share is reported, not configured (None)
    "light best-effort + busy": ([slice_(kernel_us=2000, via="probe"), slice_()], [20, None]),
    # A process launching 10 us kernels back to back keeps the simulator's device about 40% busy
    # on the 2-core machine (the launch costs the CPU more than the kernel runs): judged against
    # its rate alone, within LAUNCH_BOUND_CHECK points (above), as is the 50 us loop.
    "10us 10/20": ([slice_(10, kernel_us=10, depth=4), slice_(20, kernel_us=10, depth=4)], [10, 20]),
    "50us 30/70": ([slice_(30, kernel_us=50), slice_(70, kernel_us=50)], [30, 70]),
    "100us 30/70": ([slice_(30, kernel_us=100), slice_(70, kernel_us=100)], [30, 70]),
    "10ms 30/70": ([slice_(30, kernel_us=10000), slice_(70, kernel_us=10000)], [30, 70]),
    # tests/gpu/probe.py's PyTorch loop on an H200: 10 bf16 matmuls of about 210 us, then
    # torch.cuda.synchronize(), over and over
    "matmul loop 30/70": ([slice_(30, kernel_us=210, sync_every=10), slice_(70, kernel_us=210, sync_every=10)],
                          [30, 70]),
    "graph 30/70": ([slice_(30, via="graph"), slice_(70, via="graph")], [30, 70]),
    "4 streams 30/70": ([slice_(30, streams=4), slice_(70, streams=4)], [30, 70]),
    "graph alone 30": ([slice_(30, via="graph")], [30]),
}


def command(s, secs):
    """The workload's command line for slice `s`, running `secs`."""
    if s["via"] == "probe":
        return [WORKLOAD, "probe", "--kernel", s["kernel"], "--kernel-us", str(s["kernel_us"]),
                "--period-ms", str(s["period_ms"]), "--secs", str(secs), "--progress-ms", "250"]
    cmd = [WORKLOAD, "launch", "--kernel", s["kernel"], "--ns-per-block", "1000", "--blocks", str(s["kernel_us"]),
           "--secs", str(secs), "--via", s["via"], "--streams", str(s["streams"]), "--progress-ms", "250"]
    if s["sync_every"]:
        cmd += ["--sync-every", str(s["sync_every"])]
    else:
        cmd += ["--depth", str(depth(s))]
    return cmd


# A loop keeps about this much work in flight per stream, as a framework's queue does (and at
# least 4 kernels): a launching thread that the host holds up for less than that leaves its turn
# with work to run. Kept 4 deep, 50 and 100 us kernels ran dry whenever the 2-core host held the
# thread up for 150 to 300 us, and the turn passed on each time: on CI's machine 100 us loops got
# 23.9/58.1% at 30/70, 82% of their rate alone together. The 10 us loop stays 4 deep: the one
# loop whose rate is the host's.
QUEUED_US = 2000


def depth(s):
    return s["depth"] or max(4, -(-QUEUED_US // s["kernel_us"]))


def show(state):
    return device_times(SIMGPU, state)


def progress(stdout, t0):
    """A process's `progress` lines as [(s since t0, work ns completed)]."""
    out = []
    for line in stdout.splitlines():
        if '"progress"' in line:
            ev = json.loads(line)
            out.append((ev["mono_ns"] / 1e9 - t0, ev["work_ns"]))
    return out


def work_at(series, t):
    """Work completed by time `t`, linear between progress lines (the last after the end)."""
    if not series or t <= series[0][0]:
        return series[0][1] if series else 0
    for (ta, wa), (tb, wb) in zip(series, series[1:]):
        if t <= tb:
            return wb if tb <= ta else wa + (wb - wa) * (t - ta) / (tb - ta)
    return series[-1][1]


def throughput(series_list, a, b):
    """Percent of [a, b] the slice's processes' completed kernels asked for."""
    done = sum(work_at(s, b) - work_at(s, a) for s in series_list)
    return 100.0 * done / ((b - a) * 1e9)


def settled_at(windows, want):
    """When the 1 s figure came within SETTLED points of `want` and stayed there (window end)."""
    for k, (t, _) in enumerate(windows):
        if all(abs(x - want) <= SETTLED for _, x in windows[k:]):
            return t + 1.0
    return None


ALONE_SECS = 4.0
# A simulated H200: the time slicing, context switches and NVML sample period the hardware showed
# (docs/simgpu.md, "Calibration against hardware").
MODEL = ["--gpu", "h200"]
ALONE_CACHE = os.environ.get("SHARE_ALONE_CACHE")
RATES_ALONE = {}
if ALONE_CACHE and os.path.exists(ALONE_CACHE):
    with open(ALONE_CACHE) as f:
        RATES_ALONE = {tuple(json.loads(k)): v for k, v in json.load(f).items()}


LOCK = os.environ.get("SHARE_LOCK")


@contextlib.contextmanager
def machine(alone):
    """Holds SHARE_LOCK (when set) alone or shared while the block runs."""
    if not LOCK:
        yield
        return
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def measured_alone(slices):
    """Every alone-judged loop of `slices` has its rate alone (measured now, holding the lock
    alone, where it has none yet)."""
    missing = [s for s in slices if s["alone"] and loop_key(s) not in RATES_ALONE]
    if missing:
        with machine(alone=True):
            for s in missing:
                rate_alone(s)


def host_held(name, slices):
    """Whether the host holds back a loop of scenario `name`: it then runs with nothing beside it."""
    return (name in LAUNCH_BOUND_CHECK or name in REPORTED_ONLY
            or any(s["alone"] and rate_alone(s) < HOST_HELD for s in slices))


def loop_key(s):
    return (s["kernel"], s["kernel_us"], s["via"], s["streams"], s["sync_every"], s["procs"], depth(s))


def rate_alone(s):
    """Percent of wall time the kernels of slice `s`'s loop ask for when it runs alone, without
    the library, from 1 s to its end (measured once per kind of loop). A slice of several
    processes runs them all, as in the scenario: their contexts time-slice and pay the switches
    between them alone too, so the sum of their throughputs is the slice's rate alone."""
    key = loop_key(s)
    if key not in RATES_ALONE:
        # A loop that keeps the device busy alone has a rate near 100% every time. One the host
        # holds back (its launches or its synchronising) varies with the host from one run to the
        # next (93.0 to 95.8% for the matmul loop, minutes apart): the median of three runs.
        rates = [alone_once(s, key)]
        if rates[0] < 99.0:
            rates += [alone_once(s, key), alone_once(s, key)]
        RATES_ALONE[key] = sorted(rates)[len(rates) // 2]
        if ALONE_CACHE:
            # Whole or not at all, for runs side by side that read it.
            with open(ALONE_CACHE + ".new", "w") as f:
                json.dump({json.dumps(list(k)): v for k, v in RATES_ALONE.items()}, f)
            os.replace(ALONE_CACHE + ".new", ALONE_CACHE)
    return RATES_ALONE[key]


def remeasure(slices):
    """Before a missed scenario runs again: the rate alone of each loop the host held back is
    measured again (the host's speed may have changed since), and printed beside the old one."""
    seen = set()
    for s in slices:
        key = loop_key(s)
        if not s["alone"] or key in seen:
            continue
        seen.add(key)
        was = RATES_ALONE.get(key)
        if was is None or was >= HOST_HELD:
            continue
        del RATES_ALONE[key]
        print(f"   rate alone of its {s['kernel_us']} us loop measured again: {rate_alone(s):.1f}% "
              f"(was {was:.1f}%)", flush=True)


def alone_once(s, key):
    """One run of slice `s`'s loop alone, without the library: its rate from 1 s to its end."""
    work = tempfile.mkdtemp(prefix="cuslice-share-alone-")
    state = os.path.join(work, "state")
    subprocess.run([SIMGPU, "init", "--state", state, *MODEL], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUSLICE_")}
    t0 = time.monotonic()
    ps = [subprocess.Popen([SIMGPU, "run", "--state", state, "--", *command(s, ALONE_SECS)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(s["procs"])]
    series = []
    for p in ps:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"rate alone of {key}: exit {p.returncode}: {out} {err}")
        series.append(progress(out, t0))
    shutil.rmtree(work, ignore_errors=True)
    start = max(x[0][0] for x in series) + 1.0
    end = min(x[-1][0] for x in series)
    return throughput(series, start, end)


def run(name, slices, expected, bare=False):
    """One scenario's slices at once; `bare`: without the library and any cuslice setting."""
    work = tempfile.mkdtemp(prefix="cuslice-share-")
    state = os.path.join(work, "state")
    how = ["--no-process-samples"] if SAMPLES == "none" else ["--process-samples", SAMPLES]
    subprocess.run([SIMGPU, "init", "--state", state, *MODEL, *how], check=True, capture_output=True)
    procs = []  # (slice index, Popen)
    for i, s in enumerate(slices):
        env = dict(os.environ, LD_PRELOAD=LIB, CUSLICE_NODE_DIR=os.path.join(work, "node"), **s["env"])
        if bare:
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUSLICE_")}
        elif s["procs"] > 1:
            env["CUSLICE_STATE_DIR"] = os.path.join(work, f"slice-{i}")
        secs = s["secs"] if s["secs"] is not None else SECS
        for _ in range(s["procs"]):
            procs.append((i, subprocess.Popen([SIMGPU, "run", "--state", state, "--", *command(s, secs)], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    pids = []
    for _, p in procs:
        line = p.stdout.readline()
        ev = json.loads(line)
        if ev.get("event") != "start":
            raise SystemExit(f"{name}: {line} {p.stderr.read()}")
        pids.append(ev["pid"])
    t0 = time.monotonic()
    samples = []
    while time.monotonic() - t0 < SECS:
        samples.append((time.monotonic() - t0, show(state)))
        time.sleep(0.25)
    series = []
    for _, p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{name}: exit {p.returncode}: {out} {err}")
        series.append(progress(out, t0))
        if not series[-1]:
            raise SystemExit(f"{name}: no progress lines: {out} {err}")
    samples.append((time.monotonic() - t0, show(state)))
    shutil.rmtree(work, ignore_errors=True)
    samples = carried(samples)
    # The window ends when the first process that ran the whole time stopped (each slice's
    # processes ran till then); 1 s windows start once every process has reported.
    full = [sr for (i, _), sr in zip(procs, series) if slices[i]["secs"] is None]
    end = min(sr[-1][0] for sr in full)
    first = max(sr[0][0] for sr in series)
    inside = [k for k, (t, _) in enumerate(samples) if SETTLE <= t <= end]
    rows = []
    for i, (s, want) in enumerate(zip(slices, expected)):
        mine = [sr for (k, _), sr in zip(procs, series) if k == i]
        my_pids = [pid for (k, _), pid in zip(procs, pids) if k == i]

        def sim(a, b):
            (ta, xa), (tb, xb) = samples[a], samples[b]
            return 100.0 * sum(xb.get(pid, 0) - xa.get(pid, 0) for pid in my_pids) / ((tb - ta) * 1e9)

        base = rate_alone(s) if s["alone"] else 100.0
        got = throughput(mine, SETTLE, end) * 100.0 / base
        counted = sim(inside[0], inside[-1]) if len(inside) > 1 else None
        by_sim = s["kernel"] == "spin"
        if by_sim:
            windows = [(samples[a][0], sim(a, b)) for a in range(len(samples)) for b in range(a + 1, len(samples))
                       if abs(samples[b][0] - samples[a][0] - 1.0) < 0.13 and samples[b][0] <= end]
        else:
            steps = int((end - 1.0 - first) / 0.25) + 1 if end - 1.0 >= first else 0
            windows = [(first + 0.25 * k,
                        throughput(mine, first + 0.25 * k, first + 0.25 * k + 1.0) * 100.0 / base)
                       for k in range(steps)]
        judged = counted if by_sim else got
        settled_windows = [(t, w) for t, w in windows if t >= SETTLE]
        if want is None:
            worst = min((w for _, w in settled_windows), default=judged)
            settle = None
        else:
            worst = max((w for _, w in settled_windows), key=lambda w: abs(w - want), default=judged)
            settle = settled_at(windows, want)
        rows.append(dict(expected=want, throughput=got, simulator=counted, judged=judged, by_sim=by_sim,
                         worst_1s=worst, settled_s=settle, windows=settled_windows,
                         alone=base if s["alone"] else None))
    return rows


SAMPLES_SAID = {
    "one-per-period": "NVML samples every 200 ms, one a period naming one process (as a real driver gives them)",
    "per-process": "NVML samples every 200 ms, one per process",
    "none": "no per-process NVML samples (as on MIG)",
}


def fmt(x):
    return "n/a" if x is None else f"{x:.1f}%"


def off(r):
    """How far row `r` is from its configured share: its judged figure (inf where there is none),
    and its worst 1 s window, in points."""
    err = abs(r["judged"] - r["expected"]) if r["judged"] is not None else float("inf")
    return err, max((abs(w - r["expected"]) for _, w in r["windows"]), default=0.0)


def held_alone(r):
    """Whether the host held a slice's loop below HOST_BOUND percent of the device alone."""
    return r["alone"] is not None and r["alone"] < HOST_BOUND


def host_bound(name, r):
    """Whether row `r` of scenario `name` is a loop the host bounds: one of the launch-bound
    scenarios, or one held below HOST_BOUND percent of the device alone."""
    return name in LAUNCH_BOUND_CHECK or held_alone(r)


def misses(name, label, rows, check, window_check):
    """What `rows` (one run of scenario `name`) missed: a slice's judged figure more than `check`
    points from its configured share, a 1 s window more than `window_check` (each wider for a
    loop the host bounds)."""
    out = []
    for k, r in enumerate(rows):
        if r["expected"] is None:
            continue
        judged = r["judged"]
        err, window_err = off(r)
        bound, bound_window = (0.0, 0.0)
        if host_bound(name, r):
            bound, bound_window = HOST_BOUND_CHECK
        if err > max(check, bound):
            out.append(f"{label} slice {k}: {fmt(judged)} for {r['expected']}%")
        if window_err > max(window_check, bound_window):
            t, w = max(r["windows"], key=lambda tw: abs(tw[1] - r["expected"]))
            out.append(f"{label} slice {k}: {w:.1f}% in the 1 s window from {t:.2f} s, for {r['expected']}%")
    return out


def split(rows):
    """Each slice's part of what the slices got together, scaled to what they were configured
    together: the rows with each judged figure and 1 s window scaled so. Where the configured shares
    add up to the whole device (every slice busy): a host that leaves the device idle (a launching
    thread waiting for a CPU, in its slice's turn) takes from every slice; how the device was split
    is the library's doing. Where every slice's loop is one the host holds back (below HOST_BOUND
    alone), whatever the shares: such a loop is charged its turns' time and runs in them as fast as
    the host lets it, which changes from one run to the next (in CI a pair at limits 10/20 got
    11.6/23.1, 8.2/16.8 and 10.6/22.1% of their rate alone in three runs running, the rate alone
    34.7 to 35.8% each time, and every run split 1:2). None where neither applies, or where the
    slices together got less than TOGETHER percent of what they were configured (loops the host
    holds back, shares that leave the device idle: outside HELD_TOGETHER; the host ran them that
    much slower or faster than alone)."""
    if len(rows) < 2 or any(r["expected"] is None for r in rows):
        return None
    configured = sum(r["expected"] for r in rows)
    all_held = all(held_alone(r) for r in rows)
    if configured != 100 and not all_held:
        return None
    total = sum(r["judged"] or 0.0 for r in rows)
    # Shares that add up to the device keep every slice busy: the host's idle is a turn's loss.
    low, high = (TOGETHER, 10000.0 / TOGETHER) if configured == 100 else HELD_TOGETHER
    if not low <= 100.0 * total / configured <= high:
        return None
    held = []
    for k, r in enumerate(rows):
        windows = []
        for i, (t, w) in enumerate(r["windows"]):
            together = sum(x["windows"][i][1] for x in rows if i < len(x["windows"]))
            windows.append((t, configured * w / together if together > 0.0 else 0.0))
        held.append(dict(r, judged=configured * (r["judged"] or 0.0) / total, windows=windows))
    return held


def main(names, check=None, window_check=WINDOW_CHECK):
    print(f"simulated H200 (1024 us slices, switches of 0-100 us); {SAMPLES_SAID[SAMPLES]}; {SECS:g} s per scenario, shares over {SETTLE:g} s "
          f"to the end; 1 ms fixed-work kernels unless named")
    print("judged: throughput (work completed over wall time, against the same loop's rate alone); the "
          "simulator's count of device time beside it (spin: judged by that count)")
    print(f"{'scenario':34} {'slice':>5} {'configured':>10} {'throughput':>10} {'simulator':>9} "
          f"{'worst 1 s':>9} {'settled':>8}")
    worst_err, worst_window, slowest, failed, again, in_proportion = 0.0, 0.0, 0.0, [], [], []
    # Loops the host holds back (`host_bound`) and those only reported are summed up apart,
    # against the bounds --check gives the former: their shares are the host's speed as much as
    # the split.
    bound_err, bound_window, bound_slowest, bound_names = 0.0, 0.0, 0.0, []
    for name in names or SCENARIOS:
        slices, expected = SCENARIOS[name]
        # A scenario that misses the check is run again, up to RUNS runs (every run printed): a
        # 2-core host that stalls a launching thread for a while can put one run past it. It
        # fails when every run misses, where a run whose slices' shares add up to the device may
        # hold in proportion instead: a host that leaves the device idle in a slice's turn takes
        # from every slice, and what the library decides is how the device is split (how much of
        # it a busy pair loses is measured in tests/bench, `--aggregate`).
        measured_alone(slices)
        for attempt in range(1, RUNS + 1):
            label = name if attempt == 1 else f"{name} (run {attempt})"
            with machine(alone=host_held(name, slices)):
                rows = run(name, slices, expected)
            for k, r in enumerate(rows):
                through = fmt(r["throughput"])
                cols = f"{label if k == 0 else '':34} {k:>5}"
                if r["expected"] is None:
                    print(f"{cols} {'-':>10} {through:>10} {fmt(r['simulator']):>9} {fmt(r['worst_1s']):>9} {'-':>8}",
                          flush=True)
                    continue
                settled = f"{r['settled_s']:.1f} s" if r["settled_s"] is not None else "never"
                note = f"  (rate alone {r['alone']:.1f}%)" if r["alone"] is not None and r["alone"] < HOST_HELD else ""
                print(f"{cols} {r['expected']:>9}% {through:>10} {fmt(r['simulator']):>9} {fmt(r['worst_1s']):>9} "
                      f"{settled:>8}{note}", flush=True)
                err, window_err = off(r)
                settled_s = r["settled_s"] if r["settled_s"] is not None else float("inf")
                if host_bound(name, r) or name in REPORTED_ONLY:
                    bound_err, bound_window = max(bound_err, err), max(bound_window, window_err)
                    bound_slowest = max(bound_slowest, settled_s)
                    if name not in bound_names:
                        bound_names.append(name)
                else:
                    worst_err, worst_window = max(worst_err, err), max(worst_window, window_err)
                    slowest = max(slowest, settled_s)
            missed = misses(name, label, rows, check, window_check) if check is not None else []
            if missed and name in REPORTED_ONLY:
                print(f"   reported, not judged (docs/compute.md, Known limits): {'; '.join(missed)}", flush=True)
                break
            if missed:
                held = split(rows)
                if held is not None and not misses(name, label, held, check, window_check):
                    used = sum(r["simulator"] or 0.0 for r in rows)
                    got = sum(r["judged"] or 0.0 for r in rows) / sum(r["expected"] for r in rows)
                    line = (f"{label}: the device ran {used:.1f}% of the time; the slices got {100 * got:.1f}% "
                            "of what they were configured together, split "
                            + " / ".join(f"{r['judged']:.1f}%" for r in held))
                    print(f"   {line}: held in proportion (the host's speed, not the split)", flush=True)
                    in_proportion.append(line)
                    missed = []
            if not missed:
                break
            if attempt < RUNS:
                again.append("; ".join(missed))
                print(f"   missed ({'; '.join(missed)}): run again", flush=True)
                with machine(alone=True):
                    remeasure(slices)
            else:
                failed += missed
    bound_ok = bound_err <= HOST_BOUND_CHECK[0] and bound_window <= HOST_BOUND_CHECK[1]
    if bound_names:
        print(f"loops the host holds back or only reported ({', '.join(bound_names)}; judged as --check judges "
              f"the former): largest "
              f"|achieved - configured|: {bound_err:.1f} points (target <= {HOST_BOUND_CHECK[0]:g}); worst 1 s "
              f"window: {bound_window:.1f} points off (target <= {HOST_BOUND_CHECK[1]:g}); slowest to settle: "
              f"{bound_slowest:.1f} s (reported): {'meets' if bound_ok else 'MISSES'}")
    ok = worst_err <= 2.0 and slowest <= 3.0 and bound_ok
    figures = (f"largest |achieved - configured|: {worst_err:.1f} points (target <= 2); worst 1 s window: "
               f"{worst_window:.1f} points off; slowest to settle: {slowest:.1f} s (target <= 3)"
               + (", those loops apart" if bound_names else ""))
    if check is None:
        print(f"{figures}: {'meets' if ok else 'MISSES'}")
    else:
        # The targets are the benchmark's (tests/bench, on a quiet machine). Here these figures
        # take in every run printed, those run again, held in proportion or reported only, so
        # the check below, not this line, is the verdict.
        print(f"over every run printed, {figures} (the check's verdict below)")
    if again:
        print(f"missed and run again: {len(again)} time(s): " + " | ".join(again))
    if in_proportion:
        print(f"held in proportion, the host's speed not the split: {len(in_proportion)} "
              "scenario(s): " + " | ".join(in_proportion))
    if check is not None:
        if failed:
            print(f"FAILED (within {check:g} points, every 1 s window within {window_check:g}): " + "; ".join(failed))
            return False
        print(f"every scenario within {check:g} points, every 1 s window within {window_check:g}")
        return True
    return ok


def aggregate():
    """Two busy loops of 1 ms kernels at once: their throughput together (percent of one loop's rate
    alone) at limits 30 and 70, against the same two loops without the library."""
    slices, expected = SCENARIOS["30/70"]
    with_ = sum(r["throughput"] for r in run("30/70", slices, expected))
    without = sum(r["throughput"] for r in run("30/70 without the library", slices, expected, bare=True))
    ratio = 100.0 * with_ / without
    print(f"aggregate throughput of two 1 ms loops: at 30/70 with cuslice {with_:.1f}%, without the library "
          f"{without:.1f}% (of one loop's rate alone): {ratio:.1f}% (target >= 97%): "
          f"{'meets' if ratio >= 97.0 else 'MISSES'}")
    return ratio >= 97.0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--rates-alone"]:
        unknown = [a for a in args[1:] if a not in SCENARIOS]
        if unknown or not ALONE_CACHE:
            sys.exit(f"share.py --rates-alone: {'SHARE_ALONE_CACHE is not set' if not ALONE_CACHE else 'no scenario ' + ', '.join(map(repr, unknown))}")
        for name in args[1:] or SCENARIOS:
            measured_alone(SCENARIOS[name][0])
        print("rates alone, without the library: " + "; ".join(
            f"{k[1]} us {k[0]} via {k[2]}{f', {k[3]} streams' if k[3] > 1 else ''}"
            f"{f', {k[5]} processes' if k[5] > 1 else ''}{f', synchronising every {k[4]}' if k[4] else ''}: {v:.1f}%"
            for k, v in RATES_ALONE.items()), flush=True)
        sys.exit(0)
    if args == ["--aggregate"]:
        # tests/bench: what sharing costs the two loops together
        sys.exit(0 if aggregate() else 1)
    check, window_check = None, WINDOW_CHECK
    while args[:1] in (["--check"], ["--window-check"]):
        if args[0] == "--check":
            # tests/run: every scenario within this many points
            check = float(args[1])
        else:
            window_check = float(args[1])
        args = args[2:]
    unknown = [a for a in args if a not in SCENARIOS]
    if unknown:
        sys.exit(f"share.py: no scenario {', '.join(map(repr, unknown))}; scenarios: {', '.join(SCENARIOS)}")
    sys.exit(0 if main(args, check, window_check) else 1)
