"""The floor torch.distributed puts under any backend's small all-reduce: dist.all_reduce of 8
bytes into torch's own C++ FakeProcessGroup, which does nothing (torch 2.x: the dispatcher, the
Python wrapper, a Work and its wait; no Python backend, no peer). The issue's 1.5 us for the
distmesh backend's cost over the C call sits below it (docs/python.md).
   <torch 2.x python> bench/torch_dispatch_floor.py [CALLS]
Prints the median of 5 timings of CALLS calls (default 20000), after 2000 untimed, in us per
call: through dist.all_reduce, and through the group's allreduce([t]).wait()."""
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore  # also registers "fake"


def per_call_us(fn, calls):
    for _ in range(2000):
        fn()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    t = torch.zeros(2)
    pg = dist.group.WORLD
    print(f"torch {torch.__version__}")
    print(f"dist.all_reduce, 8 B, torch's C++ FakeProcessGroup: {per_call_us(lambda: dist.all_reduce(t), calls):.2f} us")
    print(f"pg.allreduce([t]).wait(), the same group: {per_call_us(lambda: pg.allreduce([t]).wait(), calls):.2f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
