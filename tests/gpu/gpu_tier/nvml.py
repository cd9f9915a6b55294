"""The driver's own view, sampled while each check runs: NVML per-process memory and utilisation.

`Sampler` polls NVML (NVIDIA's Python bindings, nvidia-ml-py) in a thread of the tier's own
process, which never loads cuslice: per-process used memory every 20 ms, per-process utilisation
samples and the device's utilisation (nvmlDeviceGetUtilizationRates) every 50 ms, and the
device's used memory. The functions below it turn samples into
the figures the checks judge; they are pure and unit-tested (tests/gpu/test_tier.py).
"""
import statistics
import threading
import time


class Sampler(threading.Thread):
    """Samples NVML device 0 until `stop()`. Memory samples: (wall s, device used, {pid: used});
    utilisation samples: {(pid, timestamp us): smUtil}."""

    def __init__(self, mem_period=0.02, util_period=0.05):
        super().__init__(daemon=True, name="nvml-sampler")
        import pynvml  # nvidia-ml-py

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.mem_period, self.util_period = mem_period, util_period
        self.lock = threading.Lock()
        self.mem = []
        self.util = {}
        self.device_util = []  # (wall s, gpu %)
        self.errors = {}  # what NVML refused, once each: call -> message
        self._halt = threading.Event()

    def describe(self):
        n, h = self.nvml, self.handle
        mem = n.nvmlDeviceGetMemoryInfo(h)
        out = {
            "name": _text(n.nvmlDeviceGetName(h)),
            "uuid": _text(n.nvmlDeviceGetUUID(h)),
            "memory_total": mem.total,
            "driver": _text(n.nvmlSystemGetDriverVersion()),
            "cuda_driver_api": n.nvmlSystemGetCudaDriverVersion(),
            "device_count": n.nvmlDeviceGetCount(),
        }
        try:
            out["compute_capability"] = list(n.nvmlDeviceGetCudaComputeCapability(h))
        except n.NVMLError as e:
            out["compute_capability"] = f"unknown ({e})"
        return out

    def run(self):
        n, h = self.nvml, self.handle
        next_util = 0.0
        last_ts = 0
        while not self._halt.is_set():
            now = time.time()
            procs = self._call("nvmlDeviceGetComputeRunningProcesses", lambda: n.nvmlDeviceGetComputeRunningProcesses(h), [])
            used = {p.pid: p.usedGpuMemory for p in procs if isinstance(p.usedGpuMemory, int)}
            info = self._call("nvmlDeviceGetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(h), None)
            with self.lock:
                self.mem.append((now, info.used if info else None, used))
            if now >= next_util:
                next_util = now + self.util_period
                samples = self._call("nvmlDeviceGetProcessUtilization",
                                     lambda: n.nvmlDeviceGetProcessUtilization(h, last_ts), [])
                rates = self._call("nvmlDeviceGetUtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(h), None)
                with self.lock:
                    for s in samples:
                        self.util[(s.pid, s.timeStamp)] = s.smUtil
                        last_ts = max(last_ts, s.timeStamp)
                    if rates is not None:
                        self.device_util.append((now, rates.gpu))
            self._halt.wait(self.mem_period)

    def _call(self, name, f, default):
        try:
            return f()
        except self.nvml.NVMLError as e:
            # "Not Found" is how NVML says "no samples since that time" (and pynvml raises
            # "Success" when the driver returns no samples without asking for a buffer).
            if e.value not in (self.nvml.NVML_ERROR_NOT_FOUND, self.nvml.NVML_SUCCESS):
                self.errors.setdefault(name, str(e))
            return default

    def device_used(self):
        """The device's used memory now (None if NVML will not say)."""
        info = self._call("nvmlDeviceGetMemoryInfo", lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle), None)
        return info.used if info else None

    def stop(self):
        self._halt.set()
        self.join(timeout=2)

    def memory(self, t0, t1):
        with self.lock:
            return [s for s in self.mem if t0 <= s[0] <= t1]

    def utilisation(self, t0, t1):
        """[(pid, timestamp us, smUtil)] stamped in [t0, t1] (wall seconds)."""
        with self.lock:
            return sorted((pid, ts, sm) for (pid, ts), sm in self.util.items() if t0 * 1e6 <= ts <= t1 * 1e6)

    def device_utilisation(self, t0, t1):
        """[(wall s, gpu %)]: nvmlDeviceGetUtilizationRates's readings in [t0, t1]."""
        with self.lock:
            return [(t, g) for t, g in self.device_util if t0 <= t <= t1]


def changes(readings):
    """The (time, value) readings whose value differs from the reading before: what the logs
    show of readings taken every 20 or 50 ms (memory, the device's utilisation)."""
    out, last = [], object()
    for t, v in readings:
        if v != last:
            out.append((t, v))
            last = v
    return out


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def peak_held(samples, pids, baseline_used=None):
    """The most `pids` held together at one sample, by NVML's count.

    Returns (bytes, source): source "process" when NVML listed any of the pids; otherwise, when
    NVML gives no per-process figures (some virtualised GPUs), the device's used memory above
    `baseline_used`, source "device"; (None, None) when neither is available."""
    pids = set(pids)
    per_process = [sum(v for p, v in used.items() if p in pids) for _, _, used in samples
                   if pids & used.keys()]
    if per_process:
        return max(per_process), "process"
    device = peak_device(samples, baseline_used)
    return (device, "device") if device is not None else (None, None)


def peak_device(samples, baseline_used):
    """The device's used memory above `baseline_used` at its highest sample, by NVML's count;
    None when NVML gave no device figure or there is no baseline."""
    device = [d for _, d, _ in samples if d is not None]
    if not device or baseline_used is None:
        return None
    return max(0, max(device) - baseline_used)


def sample_period_us(util):
    """The driver's per-process sample period: the median gap between consecutive sample stamps,
    whichever processes they name (None with too few). A driver that names one process per stamp
    (the real one does) and one that names every process that ran give the same period."""
    stamps = sorted({ts for _, ts, _ in util})
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps) if gaps else None


def share(util, pid, t0, t1, period_us=None):
    """Percent of [t0, t1] (wall s) the device ran `pid`'s work, by NVML's per-process samples.

    Each sample gives the share of one sample period the process ran (a process that did not run
    gets no sample), so the share is the sum of smUtil x period over the window's length. NVML
    gives whole percents rounded down, so a reading k between 0 and 100 stands for k + 1/2."""
    period = period_us or sample_period_us(util)
    if not period or t1 <= t0:
        return None
    busy = sum(sm + 0.5 if 0 < sm < 100 else sm
               for p, ts, sm in util if p == pid and t0 * 1e6 < ts <= t1 * 1e6) / 100.0 * period
    return 100.0 * busy / ((t1 - t0) * 1e6)


def worst_window(util, pid, t0, t1, want, width=1.0, step=0.25, period_us=None):
    """The 1 s window share furthest from `want` within [t0, t1]."""
    worst = None
    t = t0
    while t + width <= t1 + 1e-9:
        s = share(util, pid, t, t + width, period_us)
        if s is not None and (worst is None or abs(s - want) > abs(worst - want)):
            worst = s
        t += step
    return worst
