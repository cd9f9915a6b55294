"""Overhead with no limits set: the same programs with and without the library, interleaved in one
run (without, with, without, with, ...), medians compared. On the simulated GPU the figures are
reported but not judged (timings there say nothing about a real driver; tests/bench measures the
library against the simulator)."""
import importlib.util
import statistics

from .common import FAIL, INFO, NOT_RUN, Check, Spec, failed, judged

GROUP = "overhead"
TORCH_CHECKS = ["PyTorch launch-bound loop (tiny adds)", "PyTorch large bf16 matmul (8192^3)",
                "PyTorch start-up to first kernel"]


def run(tier):
    rounds = 2 if tier.quick else 3
    checks = [f(tier, rounds) for name, f in ((ALLOC, bench_alloc), (LAUNCH, bench_launch)) if tier.wanted(name)]
    if tier.sim or importlib.util.find_spec("torch") is None:
        why = "needs a real GPU (PyTorch)" if tier.sim else "PyTorch is not installed"
        return checks + [Check(GROUP, n, why, "", NOT_RUN) for n in TORCH_CHECKS if tier.wanted(n)]
    if tier.wanted(TORCH_CHECKS[0]) or tier.wanted(TORCH_CHECKS[1]):
        checks += [c for c in torch_overhead(tier, rounds) if tier.wanted(c.name)]
    if tier.wanted(TORCH_CHECKS[2]):
        checks.append(torch_start(tier, rounds + 2))
    return checks


def interleaved(tier, title, argv, rounds, pick, timeout=300):
    """Runs `argv` `rounds` times without and with the library, alternating; `pick(proc)` reads a
    figure from each run. Returns ({without: [...], with: [...]}, why-not) ."""
    got = {"without": [], "with": []}
    for r in range(rounds):
        for side in ("without", "with"):
            env = tier.cuslice(tier.scratch(title)) if side == "with" else {}
            (p,) = tier.run(GROUP, f"{title}: round {r + 1}, {side} the library", [Spec(argv, env, side)],
                            timeout=timeout)
            v = pick(p) if p.rc == 0 else None
            if v is None:
                return got, failed([p]) or "no result"
            got[side].append(v)
    return got, None


def compare(tier, name, got, unit, goal, limit, higher_is_better=False, relative=False):
    """A check from interleaved figures: medians and the added cost, judged against `limit` (in
    `unit`, or percent when `relative`) on a real GPU."""
    a, b = statistics.median(got["without"]), statistics.median(got["with"])
    added = (a - b) if higher_is_better else (b - a)
    shown = f"{100 * added / a:+.2f}%" if relative else f"{added:+.1f} {unit}"
    value = 100 * added / a if relative else added
    figure = f"{b:.4g} {unit} with, {a:.4g} without (medians of {len(got['with'])}): {shown}"
    status = INFO if tier.sim else judged(value <= limit)
    return Check(GROUP, name, figure, goal + (" (not judged on the simulator)" if tier.sim else ""),
                 status, {"without": got["without"], "with": got["with"], "added": value,
                          "unit": "%" if relative else unit})


ALLOC = "cuMemAlloc_v2 + cuMemFree_v2 pair (bench-alloc)"
LAUNCH = "cuLaunchKernel of a 1 us spin kernel (bench-launch)"


def bench_alloc(tier, rounds):
    iters = "20000" if tier.sim else "100000"
    return workload_bench(tier, ALLOC, ["bench-alloc", "--iters", iters], "ns_per_pair", rounds,
                          "<= +60 ns per pair", 60)


def bench_launch(tier, rounds):
    batches = "300" if tier.sim else "1000"
    return workload_bench(tier, LAUNCH, ["bench-launch", "--batches", batches], "ns_per_launch_median",
                          rounds, "<= +3 ns per launch", 3)


def workload_bench(tier, name, args, field, rounds, goal, limit):
    """A `cuda-workload` benchmark's `field` (ns), with and without the library."""
    got, why = interleaved(tier, name, [tier.workload, *args], rounds,
                           lambda p: (p.event("bench") or {}).get(field))
    if why:
        return Check(GROUP, name, why, "", FAIL)
    return compare(tier, name, got, "ns", goal, limit)


def torch_overhead(tier, rounds):
    argv = [tier.python, tier.probe, "torch-overhead"]
    got, why = interleaved(tier, "PyTorch loop and matmul", argv, rounds, lambda p: p.event("result"))
    if why:
        return [Check(GROUP, n, why, "", FAIL) for n in TORCH_CHECKS[:2]]
    loop = {k: [r["us_per_add"] for r in v] for k, v in got.items()}
    mm = {k: [r["tflops"] for r in v] for k, v in got.items()}
    return [compare(tier, TORCH_CHECKS[0], loop, "us", "<= +2%", 2.0, relative=True),
            compare(tier, TORCH_CHECKS[1], mm, "TFLOP/s", "<= 1% slower", 1.0, higher_is_better=True,
                    relative=True)]


def torch_start(tier, rounds):
    name = TORCH_CHECKS[2]
    argv = [tier.python, tier.probe, "torch-start"]

    def pick(p):
        r = p.event("result")
        return None if r is None else (r["first_kernel_done"] - p.t0) * 1000.0

    got, why = interleaved(tier, name, argv, rounds, pick)
    if why:
        return Check(GROUP, name, why, "", FAIL)
    return compare(tier, name, got, "ms", "<= +100 ms", 100)
