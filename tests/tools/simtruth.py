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
