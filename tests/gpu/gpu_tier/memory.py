"""Memory, driver level: every allocation family of `cuda-workload fill` through every route under a
4 GiB cap, and four processes sharing one cap. Judged by NVML's count of what each process held.

Managed memory is the exception: the driver backs it with device memory only where it is touched
(the workload sets each allocation on the device), and NVML lists those pages under no process, so
a managed fill is judged by the device's used memory above what it was before the check."""
from .common import GIB, FAIL, Check, Spec, failed, judged, mib
from .nvml import peak_device, peak_held

GROUP = "memory"
CAP = 4 * GIB
CHUNK = "64MiB"
ROUTES = ["dlsym", "proc-v1", "proc-v2", "cudart-12.9", "cudart-13.0", "direct"]
FAMILIES = ["mem", "pitch", "managed", "array", "array3d", "mipmap", "async", "pool", "vmm"]


def judge_fill(name, proc, peak, source, cap, own=None):
    """One fill under `cap`: refused with CUDA_ERROR_OUT_OF_MEMORY, never above the cap by NVML's
    count (`source`: "process", or "device" for the device's used memory above its level before;
    `own`: the process's own entry beside a device figure, shown only), and cuMemGetInfo reported
    the cap as the total."""
    start, refused = proc.event("start"), proc.event("refused")
    why = failed([proc])
    if why or not start or not refused:
        return Check(GROUP, name, why or "no start/refused event", "refused at the cap", FAIL)
    reported = refused["total"]
    usable = cap - 128 * (1 << 20)  # refused no earlier than two chunks short of the cap
    ok = (refused["code"] == 2 and peak is not None and usable <= peak <= cap and reported == cap
          and start["reported_total"] == cap and refused["free"] <= cap)
    shown = "" if source == "process" else f" ({source}{'' if own is None else ', its own entry ' + mib(own)})"
    figure = (f"peak {mib(peak)} by NVML{shown}; "
              f"cuMemGetInfo total {mib(reported)}, free {mib(start['free'])} at start, "
              f"{mib(refused['free'])} at refusal; {refused['call']} -> {refused['code']} "
              f"after {refused['count']} x {CHUNK}")
    data = {"peak": peak, "peak_source": source, "cap": cap, "reported_total": reported,
            "free_start": start["free"], "free_at_refusal": refused["free"], "code": refused["code"],
            "call": refused["call"], "count": refused["count"], "allocated": refused["allocated"]}
    return Check(GROUP, name, figure, f"peak in [{mib(usable)}, {mib(cap)}], total = cap, code 2",
                 judged(ok), data)


def run(tier):
    hold = "0.3"
    checks = []
    for route in ROUTES:
        for family in FAMILIES:
            name = f"{family} via {route}"
            if not tier.wanted(name):
                continue
            binary = tier.linked if route == "direct" else tier.workload
            argv = [binary, "--route", route, "fill", "--family", family, "--chunk", CHUNK, "--hold", hold]
            base = tier.nvml_used()
            (p,) = tier.run(GROUP, name, [Spec(argv, tier.cuslice(tier.scratch(name), memory_limit="4GiB"))])
            samples = tier.nvml.memory(p.t0, p.t1)
            if family == "managed":
                own, _ = peak_held(samples, [p.pid])
                checks.append(judge_fill(name, p, peak_device(samples, base), "device", CAP, own))
            else:
                peak, source = peak_held(samples, [p.pid], base)
                checks.append(judge_fill(name, p, peak, source, CAP))
    if tier.wanted("4 processes on one 4 GiB cap"):
        checks.append(four_processes(tier))
    return checks


def four_processes(tier):
    """Four processes fill one 4 GiB slice at once: together they never hold more than the cap."""
    name = "4 processes on one 4 GiB cap"
    state = tier.scratch("four")
    argv = [tier.workload, "fill", "--family", "mem", "--chunk", CHUNK, "--hold", "1"]
    base = tier.nvml_used()
    procs = tier.run(GROUP, name, [Spec(argv, tier.cuslice(state, memory_limit="4GiB"), f"#{i}")
                                   for i in range(4)])
    t0, t1 = min(p.t0 for p in procs), max(p.t1 for p in procs)
    peak, source = peak_held(tier.nvml.memory(t0, t1), [p.pid for p in procs], base)
    # Each process is refused with CUDA_ERROR_OUT_OF_MEMORY: at an allocation, or already when
    # it creates its context if the others filled the slice first (it then exits 1).
    outcomes = [p.event("refused") or p.event("error") for p in procs]
    if not all(outcomes):
        return Check(GROUP, name, failed(procs) or "a process printed no refusal", "all refused at the cap", FAIL)
    allocated = sum(o.get("allocated", 0) for o in outcomes)
    codes = sorted({o["code"] for o in outcomes})
    at = sorted({o["call"] for o in outcomes})
    usable = CAP - 4 * 64 * (1 << 20)
    ok = peak is not None and usable <= peak <= CAP and codes == [2]
    figure = (f"peak together {mib(peak)} by NVML; allocated {mib(allocated)} in all; refused with "
              f"codes {codes} at {', '.join(at)}")
    return Check(GROUP, name, figure, f"together in [{mib(usable)}, {mib(CAP)}], every refusal code 2",
                 judged(ok), {"peak": peak, "peak_source": source, "allocated": allocated, "codes": codes})


