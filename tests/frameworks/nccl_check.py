"""NCCL on the simulated GPU, as PyTorch's distributed package drives it: one process per rank,
rank r on device r. Initialises a communicator (ncclCommInitRank, eagerly), all-reduces a tensor
a few times, prints one JSON line per step on stdout and holds what it made until stdin closes,
for tests/clients/tests/nccl.rs to judge against the simulator's own count (`simgpu show`).
Kernels on simgpu are timed, never run, so nothing here reads the reduced values.

With SECS, it then all-reduces back to back for SECS seconds and prints a `spun` line with the
count, for the core-limit test to judge each rank's device time over that window.

Usage: nccl_check.py RANK WORLD PORT [SECS]
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

MIB = 1 << 20


def say(event, **kw):
    print(json.dumps({"event": event, "pid": os.getpid(), **kw}), flush=True)


def main(rank, world, port, secs=None):
    torch.cuda.set_device(rank)
    t = time.monotonic()
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=torch.device(f"cuda:{rank}"),
    )
    say("initialised", rank=rank, secs=time.monotonic() - t)
    x = torch.ones(16 * MIB // 4, device=rank)
    t = time.monotonic()
    for _ in range(4):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    say("reduced", rank=rank, secs=time.monotonic() - t, free=free, total=total)
    if secs is not None:
        n, end = 0, time.monotonic() + secs
        while time.monotonic() < end:
            for _ in range(8):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            n += 8
        say("spun", rank=rank, all_reduces=n)
    sys.stdin.read()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3],
        float(sys.argv[4]) if len(sys.argv) > 4 else None,
    )
