"""torch.distributed's Gloo process group: all-reduce of float32 sums on local ranks, the peer
of dm_bench in the 8-rank comparison (bench/results/compare-h100.md).
   torchrun --nproc-per-node 8 bench/torch_gloo_bench.py ITERS WARMUP BYTES...
Prints one line per size from rank 0: torch_gloo ranks=N bytes=B us=T (mean, slowest rank)."""
import sys
import time

import torch
import torch.distributed as dist


def main():
    iters, warmup = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in (int(b) for b in sys.argv[3:]):
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        us = torch.tensor([(time.perf_counter() - t0) / iters * 1e6], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"torch_gloo ranks={world} bytes={x.numel() * 4} us={us.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
