"""The simulator's ground truth, for the scripts beside this one: device time per pid."""
import json, subprocess


def device_times(simgpu, state, device=0):
    """Device time (ns) per pid on `device`, from `simgpu show --json`: the live processes and the
    exited records (oldest first), a live process's own figure over any exited record of the same
    pid."""
    out = subprocess.run([simgpu, "show", "--state", state, "--json"], check=True,
                         capture_output=True, text=True).stdout
    dev = json.loads(out)["devices"][device]
    return {p["pid"]: p["device_time_ns"] for p in dev["exited"] + dev["processes"]}


def carried(samples):
    """`samples`, [(t, device_times)], with each pid's figure carried on to the samples after it
    where it is missing or lower: device time never goes down, yet a process that has given up
    its last context and has not been reaped yet is in neither list of `simgpu show`."""
    out, last = [], {}
    for t, times in samples:
        last = {**last, **{pid: max(ns, last.get(pid, 0)) for pid, ns in times.items()}}
        out.append((t, dict(last)))
    return out
