"""Every c10d collective once, on gloo, under torch.profiler (no opprof code): the fixture
fixtures/torch-collectives/ was recorded with
``torchrun --nproc-per-node 2 tests/scripts/torch_collectives.py OUT_DIR`` (gloo on loopback).
"""

import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1024)
    gathered = torch.empty(1024 * world)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x)
        dist.reduce_scatter_tensor(x, gathered)
        dist.broadcast(x, 0)
        dist.all_to_all_single(gathered, gathered.clone())
        if rank == 0:
            dist.send(x, 1)
        else:
            dist.recv(x, 0)
        dist.barrier()
    prof.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
