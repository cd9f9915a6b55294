"""The report: results.json (machine-readable) and REPORT.md (one table per group, each check's
measured figure, expectation and result), and merging the results of several runs (the tier on a
device is run in parts that each fit one command's time limit)."""
import json

from .common import FAIL, INFO, NOT_RUN, PASS

GROUPS = {
    "memory": "Memory, driver level (4 GiB cap; NVML's per-process count)",
    "frameworks": "Memory, frameworks (8 GiB cap)",
    "compute": "Compute (core limits and requests; NVML's per-process samples alone, fixed-work throughput at once)",
    "overhead": "Overhead, no limits (with and without the library, interleaved)",
}
ENV_ROWS = [
    ("date", "date"), ("mode", "mode"), ("GPU", "gpu"), ("driver", "driver"), ("CUDA driver API", "cuda"),
    ("PyTorch", "torch"), ("JAX", "jax"), ("CuPy", "cupy"), ("nvidia-ml-py", "nvidia-ml-py"),
    ("python", "python"), ("libcuslice.so", "library"), ("NVML", "nvml"), ("parts", "parts"),
]


def merge(results):
    """One result from several runs' results.json: the environment of the first, every check (a
    later run's check replaces an earlier one of the same group and name), and the parts listed."""
    if not results:
        raise ValueError("nothing to merge")
    machines = {(r["env"].get("gpu"), r["env"].get("driver"), r["env"].get("mode")) for r in results}
    if len(machines) > 1:
        names = "; ".join(sorted(f"{g or '?'} (driver {d or '?'})" for g, d, _ in machines))
        raise ValueError(f"these runs were on different machines ({names}): publish each machine's runs "
                         "with a --merge of their own")
    env = dict(results[0]["env"])
    checks, order = {}, []
    parts = []
    for r in results:
        parts.append(r["env"].get("parts", "?"))
        for c in r["checks"]:
            key = (c["group"], c["name"])
            if key not in checks:
                order.append(key)
            checks[key] = c
    env["parts"] = "; ".join(parts)
    return {"env": env, "checks": [checks[k] for k in order]}


def counts(checks):
    out = {PASS: 0, FAIL: 0, NOT_RUN: 0, INFO: 0}
    for c in checks:
        out[c["status"]] += 1
    return out


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(result, logs=()):
    env, checks = result["env"], result["checks"]
    n = counts(checks)
    lines = [f"# cuslice real-GPU tier: {env.get('date', '?')[:10]}", ""]
    lines += [f"{n[PASS]} passed, {n[FAIL]} failed, {n[NOT_RUN]} not run, {n[INFO]} reported only "
              f"({len(checks)} checks).", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {label} | {cell(env[key])} |" for label, key in ENV_ROWS if env.get(key) not in (None, "")]
    lines.append("")
    for group, title in GROUPS.items():
        rows = [c for c in checks if c["group"] == group]
        if not rows:
            continue
        lines += [f"## {title}", "", "| check | measured | expected | result |", "|---|---|---|---|"]
        for c in rows:
            status = c["status"].upper() if c["status"] == FAIL else c["status"]
            lines.append(f"| {cell(c['name'])} | {cell(c['figure'])} | {cell(c['expected'])} | {status} |")
        lines.append("")
    if logs:
        lines += ["## Raw logs", "", "Every process's command, environment, output and what NVML saw while it ran:", ""]
        lines += [f"- [{name}]({name})" for name in logs]
        lines.append("")
    return "\n".join(lines)


def load(path):
    with open(path) as f:
        r = json.load(f)
    if not isinstance(r, dict) or "env" not in r or "checks" not in r:
        raise ValueError(f"{path} is not a results.json of the real-GPU tier (no env/checks)")
    return r
