"""Overhead with no limits set: the same programs with and without the library, alternated in one
run, judged on the rounds' paired differences against the noise those rounds show. On the
simulated GPU the figures are reported but not judged (timings there say nothing about a real
driver; tests/bench measures the library against the simulator).

How a check is judged: each round runs the program once without and once with the library, the
order swapped every other round (without-with, with-without, ...), so that a drift over the run
(a warming GPU, a filling page cache) adds to as many rounds as it takes from. The added cost is
the median of the rounds' differences (with minus without); the noise is half the spread of those
differences (largest less smallest, halved): how far the rounds alone move the estimate. A check
passes when the added cost plus the noise is within the threshold and fails when the added cost
less the noise is beyond it. Anything else is `info`: a noise larger than the threshold itself,
or a difference within the noise of the threshold, cannot be judged by these rounds, and the
figure says so with both numbers.
"""
import importlib.util
import statistics

from .common import FAIL, INFO, NOT_RUN, PASS, Check, Spec, failed

GROUP = "overhead"
TORCH_CHECKS = ["PyTorch launch-bound loop (tiny adds)", "PyTorch large bf16 matmul (8192^3)",
                "PyTorch start-up to first kernel"]


def rounds_for(tier):
    """Rounds per check: 3 on the simulator (reported only), 4 with --quick, 6 otherwise."""
    return 3 if tier.sim else 4 if tier.quick else 6


def run(tier):
    rounds = rounds_for(tier)
    checks = [f(tier, rounds) for name, f in ((ALLOC, bench_alloc), (LAUNCH, bench_launch)) if tier.wanted(name)]
    if tier.sim or importlib.util.find_spec("torch") is None:
        why = "needs a real GPU (PyTorch)" if tier.sim else "PyTorch is not installed"
        return checks + [Check(GROUP, n, why, "", NOT_RUN) for n in TORCH_CHECKS if tier.wanted(n)]
    if tier.wanted(TORCH_CHECKS[0]) or tier.wanted(TORCH_CHECKS[1]):
        checks += [c for c in torch_overhead(tier, rounds) if tier.wanted(c.name)]
    if tier.wanted(TORCH_CHECKS[2]):
        checks.append(torch_start(tier, rounds + 2))
    return checks


def order(r):
    """The sides of round `r` (from 0) in the order they run: swapped every other round."""
    return ("without", "with") if r % 2 == 0 else ("with", "without")


def interleaved(tier, title, argv, rounds, pick, timeout=300):
    """Runs `argv` `rounds` times without and with the library, alternating (see `order`);
    `pick(proc)` reads a figure from each run. Returns ({without: [...], with: [...]}, why-not),
    the lists in round order."""
    got = {"without": [], "with": []}
    for r in range(rounds):
        for side in order(r):
            env = tier.cuslice(tier.scratch(title)) if side == "with" else {}
            (p,) = tier.run(GROUP, f"{title}: round {r + 1}, {side} the library", [Spec(argv, env, side)],
                            timeout=timeout)
            v = pick(p) if p.rc == 0 else None
            if v is None:
                return got, failed([p]) or "no result"
            got[side].append(v)
    return got, None


def added_cost(without, with_, higher_is_better=False, relative=False):
    """Each round's added cost (with against without, in the figure's unit, or percent of the
    round's own figure without the library when `relative`): positive is worse with the library."""
    out = []
    for a, b in zip(without, with_):
        d = (a - b) if higher_is_better else (b - a)
        out.append(100.0 * d / a if relative else d)
    return out


def judge(diffs, limit):
    """(status, added, noise) from the rounds' added costs against `limit`: their median and half
    their spread; PASS if added + noise <= limit, FAIL if added - noise > limit, INFO otherwise,
    and INFO whenever the noise is larger than the limit."""
    added = statistics.median(diffs)
    noise = (max(diffs) - min(diffs)) / 2
    if noise > limit:
        return INFO, added, noise
    if added + noise <= limit:
        return PASS, added, noise
    if added - noise > limit:
        return FAIL, added, noise
    return INFO, added, noise


def compare(tier, name, got, unit, goal, limit, higher_is_better=False, relative=False):
    """A check from alternated rounds: the medians of each side for people, the judgement on the
    rounds' paired differences against their noise (`judge`), on a real GPU only."""
    a, b = statistics.median(got["without"]), statistics.median(got["with"])
    diffs = added_cost(got["without"], got["with"], higher_is_better, relative)
    status, added, noise = judge(diffs, limit)
    u = "%" if relative else f" {unit}"
    n = len(diffs)
    figure = (f"{b:.4g} {unit} with, {a:.4g} without (medians of {n}); added {added:+.4g}{u} "
              f"+- {noise:.3g}{u} (median of the {n} rounds' differences +- half their spread)")
    if tier.sim:
        status = INFO
    elif status == INFO:
        figure += (f"; not judged: {'noise' if noise > limit else 'within the noise of the threshold:'} "
                   f"{noise:.3g}{u} against threshold {limit:g}{u}")
    data = {"without": got["without"], "with": got["with"], "differences": diffs, "added": added,
            "noise": noise, "limit": limit, "unit": "%" if relative else unit}
    return Check(GROUP, name, figure, goal + (" (not judged on the simulator)" if tier.sim else ""),
                 status, data)


ALLOC = "cuMemAlloc_v2 + cuMemFree_v2 pair (bench-alloc)"
LAUNCH = "cuLaunchKernel of a 1 us spin kernel (bench-launch)"


def bench_alloc(tier, rounds):
    iters = "20000"  # a real 1 MiB pair takes ~70 us: 1.4 s a run, so more rounds fit
    return workload_bench(tier, ALLOC, ["bench-alloc", "--iters", iters], "ns_per_pair", rounds,
                          "<= +60 ns per pair", 60)


def bench_launch(tier, rounds):
    batches = "300" if tier.sim else "1000"
    return workload_bench(tier, LAUNCH, ["bench-launch", "--batches", batches], "ns_per_launch",
                          rounds, "<= +3 ns per launch", 3)


def workload_bench(tier, name, args, stem, rounds, goal, limit):
    """A `cuda-workload` benchmark's figure (ns), with and without the library: each run's 10th
    percentile of its batches (`STEM_p10`; a stretch in which the host held the process back
    moves the median, not the low percentile), as tests/bench takes it. The runs' medians
    (`STEM_median`) are kept beside it in the check's data."""
    got, why = interleaved(tier, name, [tier.workload, *args], rounds,
                           lambda p: p.event("bench") or None)
    if why:
        return Check(GROUP, name, why, "", FAIL)
    fields = {side: [b.get(f"{stem}_p10") for b in runs] for side, runs in got.items()}
    if any(v is None for runs in fields.values() for v in runs):
        return Check(GROUP, name, f"no {stem}_p10 in the bench line", "", FAIL)
    check = compare(tier, name, fields, "ns", goal, limit)
    check.data["medians"] = {side: [b.get(f"{stem}_median") for b in runs] for side, runs in got.items()}
    return check


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
