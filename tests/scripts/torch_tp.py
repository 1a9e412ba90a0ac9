"""A user's tensor-parallel script: an MLP-block transformer-ish stack whose linear layers are
split across the ranks with DTensor's ``parallelize_module`` (``ColwiseParallel`` then
``RowwiseParallel``) on a 1-D ``init_device_mesh``, launched with torchrun (gloo on CPU), AdamW
on random data."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--blocks", type=int, default=3)
parser.add_argument("--width", type=int, default=128)
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


world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
rank = dist.get_rank()
torch.manual_seed(0)
blocks = nn.ModuleList(Block(args.width) for _ in range(args.blocks))
for block in blocks:
    parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
head = nn.Linear(args.width, 10)
params = [*blocks.parameters(), *head.parameters()]
optimizer = torch.optim.AdamW(params, lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(0)  # every TP rank sees the same batch

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_tp.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    h = x
    for block in blocks:
        h = block(h)
    loss = loss_fn(head(h), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
