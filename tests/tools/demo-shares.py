#!/usr/bin/env python3
"""Each slice's compute share over a window: `cuslice status` beside the simulator's ground truth.

Usage: python3 tests/tools/demo-shares.py BIN STATE [--secs 10] [--json OUT]

BIN is target/release, STATE the simulated GPU's state file. It reads every process's device
time from `simgpu show` (the simulator's count), waits SECS, reads it again and runs
`cuslice status --json` (under the simulator, so it reads the simulated NVML). Per slice of
device 0 it prints the request and limit, the configured share, the share over the last 10 s
that `cuslice status` reports (from the slice's own meter) and the share the simulator gave the
slice's processes over the window.

The configured share assumes every slice is busy the whole window (as in tests/demo), and follows
the allotment's stages (docs/compute.md): in the demo, notebook 50% (its request 40 comes first
and it is lent up to its limit), trainer and batch 25% each (equal parts of what is left; the
trainer's limit is 30). --json writes the rows to OUT, for
tests/bench-demo.
"""
import argparse
import json
import subprocess
import sys
import time


def sim(bin_dir, state):
    at = time.monotonic()
    out = subprocess.check_output([f"{bin_dir}/simgpu", "show", "--json", "--state", state])
    dev = json.loads(out)["devices"][0]
    times = {p["pid"]: p["device_time_ns"] for p in dev["processes"]}
    times.update({p["pid"]: p["device_time_ns"] for p in dev.get("exited", [])})
    return at, times


def configured(slices):
    """Configured share per slice when every slice is busy, by the stages docs/compute.md gives:
    requests first; 1% for each slice without a request; time nobody is guaranteed to slices with
    a request, in proportion to their requests, up to their limits; what is left in equal parts to
    slices without a request, up to their limits; then to anyone, up to limits."""
    req = [s["compute"]["request_pct"] or 0.0 for s in slices]
    lim = [s["compute"]["limit_pct"] or 100.0 for s in slices]
    got = list(req)
    for i, r in enumerate(req):
        if r == 0:
            got[i] = min(1.0, lim[i], max(0.0, 100.0 - sum(got)))

    def fill(weights):
        while True:
            left = 100.0 - sum(got)
            open_ = [i for i, w in enumerate(weights) if w > 0 and got[i] < lim[i] - 1e-9]
            total = sum(weights[i] for i in open_)
            if left <= 1e-9 or not open_:
                return
            for i in open_:
                got[i] = min(lim[i], got[i] + left * weights[i] / total)

    fill(req)
    fill([1.0 if r == 0 else 0.0 for r in req])
    fill([1.0] * len(req))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin")
    ap.add_argument("state")
    ap.add_argument("--secs", type=float, default=10.0)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()

    def listed():
        status = json.loads(subprocess.check_output(
            [f"{a.bin}/simgpu", "run", "--state", a.state, "--", f"{a.bin}/cuslice", "status", "--json"]))
        return status["devices"][0]["slices"] if status["devices"] else []

    at_start = listed()
    t0, before = sim(a.bin, a.state)
    time.sleep(a.secs)
    t1, after = sim(a.bin, a.state)
    slices = listed()
    # A slice that ended inside the window has no share over it to show: said, never left out
    # (the configured shares of the others would be wrong without it).
    name = lambda s: s["name"] or s["slice"][:12]
    gone = sorted({name(s) for s in at_start} - {name(s) for s in slices})
    if gone:
        print(f"  {', '.join(gone)} ended within the {a.secs:g} s window: no share over it to show "
              "(the window must end while every container runs)")
        return 1
    # A stable order: by name.
    slices.sort(key=lambda s: s["name"] or s["slice"])
    rows = []
    for s, want in zip(slices, configured(slices)):
        pids = [p["pid"] for p in s["processes"]]
        used = sum(after.get(p, 0) - before.get(p, 0) for p in pids)
        c = s["compute"]
        rows.append({
            "name": name(s),
            "request_pct": c["request_pct"],
            "limit_pct": c["limit_pct"],
            "configured_pct": want,
            "status_pct": c["share_10s_pct"],
            "estimated": bool(c["estimated"]),
            "simulator_pct": 100 * used / ((t1 - t0) * 1e9),
        })

    pct = lambda v: f"{v:.0f}%" if v is not None else "none"
    print(f"  {'container':<10} {'request':>7} {'limit':>6} {'configured':>10} {'cuslice status':>15} "
          f"{'simulator':>10}")
    for r in rows:
        share = f"{r['status_pct']:.1f}%" if r["status_pct"] is not None else "-"
        if r["estimated"]:
            share = "(est.) " + share
        print(f"  {r['name']:<10} {pct(r['request_pct']):>7} {pct(r['limit_pct']):>6} "
              f"{r['configured_pct']:>9.0f}% {share:>15} {r['simulator_pct']:>9.1f}%")
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump({"window_s": t1 - t0, "slices": rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
