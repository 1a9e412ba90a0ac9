"""A user's FSDP2 script (``fully_shard`` on every block, then the root), launched with torchrun
(gloo on CPU): a small transformer-ish MLP stack trained with AdamW on random data.
``--replicate N``: hybrid sharding (HSDP) on a 2-D mesh, ``("replicate", "shard")``: the
parameters sharded within each group of world/N ranks, the gradients averaged over the N
replicas."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--blocks", type=int, default=4)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--replicate", type=int, default=0, help="HSDP: replicas of the shards")
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


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, args.width), *[Block(args.width) for _ in range(args.blocks)],
                      nn.Linear(args.width, 10))
mesh = None
if args.replicate:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (args.replicate, world // args.replicate),
                            mesh_dim_names=("replicate", "shard"))
for block in model[1:-1]:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(rank)

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_fsdp2.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, 32, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps "
      f"(LOCAL_RANK={os.environ.get('LOCAL_RANK')})")
