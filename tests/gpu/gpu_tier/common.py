"""What every group of checks shares: the result of a check, the run's context, and running
processes under the library while NVML watches them."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field

from .nvml import changes

# The checkout this tier runs from (tests/gpu/gpu_tier/ is three levels down).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

GIB = 1 << 30
MIB = 1 << 20

PASS, FAIL, NOT_RUN, INFO = "pass", "fail", "not run", "info"


@dataclass
class Check:
    group: str
    name: str
    figure: str  # what was measured, for people
    expected: str
    status: str  # PASS, FAIL, NOT_RUN (with the reason as figure) or INFO (reported, not judged)
    data: dict = field(default_factory=dict)  # the numbers behind the figure

    def to_json(self):
        return asdict(self)


def judged(ok):
    return PASS if ok else FAIL


def mib(b):
    return "n/a" if b is None else f"{b / MIB:.0f} MiB"


@dataclass
class Spec:
    """One process of a check: its command line and the variables it adds to a clean environment."""
    argv: list
    env: dict = field(default_factory=dict)
    label: str = ""


@dataclass
class Proc:
    spec: Spec
    pid: int = 0
    rc: object = None  # exit code, or "timeout"
    stdout: str = ""
    stderr: str = ""
    t0: float = 0.0
    t1: float = 0.0

    def events(self, name=None):
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if name is None or ev.get("event") == name:
                    out.append(ev)
        return out

    def event(self, name):
        ev = self.events(name)
        return ev[-1] if ev else None


# Variables the tier sets itself; a caller's own are removed so that nothing leaks into a check.
OWN = ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_PREALLOCATE",
       "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
ALIASES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "ALIYUN_COM_GPU_MEM")


class Tier:
    """The run: where the binaries are, where results go, the NVML sampler, raw logs."""

    def __init__(self, bin_dir, out_dir, sim, sampler, quick=False, python=None, match=""):
        self.bin = bin_dir
        self.out = out_dir
        self.sim = sim
        self.nvml = sampler
        self.quick = quick
        self.match = match
        self.python = python or shutil.which("python3") or "python3"
        self.lib = os.path.join(bin_dir, "libcuslice.so")
        self.workload = os.path.join(bin_dir, "cuda-workload")
        self.linked = os.path.join(bin_dir, "cuda-workload-linked")
        self.probe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probe.py")
        self.work = tempfile.mkdtemp(prefix="cuslice-gpu-tier-")
        self.node_dir = os.path.join(self.work, "node")

    def wanted(self, name):
        """Whether the check `name` is to run (`--match`)."""
        return self.match in name

    def scratch(self, name):
        d = tempfile.mkdtemp(prefix=name.replace("/", "-").replace(" ", "-") + "-", dir=self.work)
        return d

    def env(self, extra):
        """A clean environment: the caller's, without any cuslice or allocator setting, plus `extra`."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CUSLICE_") and k not in OWN and not k.startswith(ALIASES)}
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def cuslice(self, state_dir=None, **limits):
        """Variables that load the library with `limits` (CUSLICE_MEMORY_LIMIT="4GiB", ...); every
        process of the tier shares one node directory, and names its slice's state directory."""
        env = {"LD_PRELOAD": self.lib, "CUSLICE_NODE_DIR": self.node_dir}
        if state_dir:
            env["CUSLICE_STATE_DIR"] = state_dir
        env.update({"CUSLICE_" + k.upper(): v for k, v in limits.items()})
        return env

    def log(self, group, text):
        with open(os.path.join(self.out, f"{group}.log"), "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def run(self, group, title, specs, timeout=120, stdin_close_after=None):
        """Starts every spec at once, waits for all (killing any past `timeout` s), logs them with
        what NVML saw, and returns the `Proc`s."""
        procs = []
        base = self.nvml_used()
        for s in specs:
            p = Proc(spec=s, t0=time.time())
            p.popen = subprocess.Popen(s.argv, env=self.env(s.env), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                       start_new_session=True)
            p.pid = p.popen.pid
            procs.append(p)
        deadline = time.time() + timeout
        for p in procs:
            try:
                p.stdout, p.stderr = p.popen.communicate(timeout=max(1.0, deadline - time.time()))
                p.rc = p.popen.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.stdout, p.stderr = p.popen.communicate()
                p.rc = "timeout"
            p.t1 = time.time()
        for p in procs:
            del p.popen
        self._log_run(group, title, procs, base)
        return procs

    def nvml_used(self):
        return self.nvml.device_used()

    def _log_run(self, group, title, procs, base):
        lines = [f"=== {title}"]
        t0, t1 = min(p.t0 for p in procs), max(p.t1 for p in procs)
        for p in procs:
            shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.spec.env.items()))
            lines.append(f"--- pid {p.pid}{' (' + p.spec.label + ')' if p.spec.label else ''}: "
                         f"exit {p.rc} after {p.t1 - p.t0:.2f} s")
            command = f"$ {shown} {' '.join(shlex.quote(a) for a in p.spec.argv)}"
            # Paths inside the checkout relative to it: a log says nothing of one machine's paths.
            lines.append(command.replace(CHECKOUT + os.sep, ""))
            if p.stdout.strip():
                lines.append("stdout:\n" + p.stdout.rstrip())
            if p.stderr.strip():
                lines.append("stderr:\n" + _clip(p.stderr.rstrip()))
        samples = self.nvml.memory(t0, t1)
        lines.append(f"--- NVML: {len(samples)} memory samples, device used before: {mib(base)}")
        rows = []
        for t, dev, used in samples:
            mine = {pid: v for pid, v in used.items() if any(pid == p.pid for p in procs)} or used
            rows.append((t, (dev, tuple(sorted(mine.items())))))
        for t, (dev, mine) in changes(rows):
            lines.append(f"  {t - t0:7.3f} s device {mib(dev)}  " +
                         " ".join(f"{pid}:{mib(v)}" for pid, v in mine))
        util = self.nvml.utilisation(t0, t1)
        if util:
            lines.append("--- NVML utilisation samples (pid, s, smUtil): " +
                         " ".join(f"{pid}@{ts / 1e6 - t0:.2f}:{sm}" for pid, ts, sm in util))
        # The device's own figure beside them: the per-process samples do not say what
        # nvmlDeviceGetUtilizationRates reads (over which window, and whether it counts what
        # smUtil counts), which a meter comparing the two depends on.
        device = changes(self.nvml.device_utilisation(t0, t1))
        if device:
            lines.append("--- NVML device utilisation when it changed (s, gpu %): " +
                         " ".join(f"{t - t0:.2f}:{g}" for t, g in device))
        self.log(group, "\n".join(lines) + "\n")


def _clip(text, keep=4000):
    """Long stderr (a framework's traceback, say) keeps its head and tail."""
    if len(text) <= 2 * keep:
        return text
    return text[:keep] + f"\n[... {len(text) - 2 * keep} characters ...]\n" + text[-keep:]


def failed(procs):
    """Why a run did not complete, or None."""
    bad = [p for p in procs if p.rc != 0]
    if not bad:
        return None
    p = bad[0]
    tail = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return f"pid {p.pid} exit {p.rc}: {tail[:200]}"
