"""A user's 2-D parallel script: a 2-D ``init_device_mesh`` ("dp", "tp"), tensor parallelism
inside each block (``parallelize_module``: ``ColwiseParallel`` then ``RowwiseParallel``) on the
"tp" dimension and FSDP2 (``fully_shard``) over the "dp" dimension, launched with torchrun on 4
processes (``--tp 2``; gloo on CPU), AdamW on random data."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--blocks", type=int, default=2)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--tp", type=int, default=2)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()


class Block(nn.Module):
    """LayerNorm, a two-layer MLP with GELU, and a residual connection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
torch.manual_seed(0)
model = Net(args.width, args.blocks)
for block in model.blocks:
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
# the ranks of one TP group see the same batch; the DP groups different ones
generator = torch.Generator().manual_seed(mesh["dp"].get_local_rank())

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_fsdp_tp.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
