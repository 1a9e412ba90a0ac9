"""A user's tensor + sequence parallel script (Megatron-style sequence parallelism with
DTensor): each rank holds its share of the sequence; in every block the LayerNorm runs on it
(``SequenceParallel``), the MLP gathers the whole sequence (``PrepareModuleInput``: all-gather),
its first linear layer is ``ColwiseParallel`` and its second ``RowwiseParallel`` with its output
reduce-scattered back to the sequence shards. torchrun (gloo on CPU), AdamW on random data.
``--loss-parallel``: the head is split over the classes too (``ColwiseParallel`` kept sharded
on them) and the loss is computed inside ``loss_parallel()``, as TorchTitan does: the loss is
then a DTensor."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--blocks", type=int, default=2)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--loss-parallel", action="store_true")
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.add_module("up", nn.Linear(width, 4 * width))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("down", nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
blocks = nn.Sequential(*[Block(args.width) for _ in range(args.blocks)])
for block in blocks:
    parallelize_module(block, mesh, {
        "norm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    })
head = nn.Linear(args.width, 10)
if args.loss_parallel:
    parallelize_module(head, mesh, ColwiseParallel(input_layouts=Shard(1),
                                                   output_layouts=Shard(-1),
                                                   use_local_output=False))
optimizer = torch.optim.AdamW([*blocks.parameters(), *head.parameters()], lr=1e-3)
generator = torch.Generator().manual_seed(0)
share = args.seq // world
for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_tp_sp.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.seq, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size, args.seq), generator=generator)
    mine = slice(rank * share, (rank + 1) * share)  # this rank's part of the sequence
    out = head(blocks(x[:, mine]))
    if args.loss_parallel:  # the logits of the whole sequence, sharded over the classes
        with loss_parallel():
            loss = nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
            loss.backward()
    else:
        loss = nn.functional.cross_entropy(out.flatten(0, 1), y[:, mine].flatten())
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
