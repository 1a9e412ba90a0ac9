"""A user's tensor parallelism written by hand with functional collectives: each rank holds
half of every MLP block's hidden units (the first linear layer split by columns, the second by
rows), the partial outputs summed with ``funcol.all_reduce`` in the forward pass and the
input's gradient in the backward pass (an autograd function), Megatron-style; launched with
torchrun (gloo on CPU), SGD on random data. No DTensor."""

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--blocks", type=int, default=3)
parser.add_argument("--width", type=int, default=128)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.new_group(list(range(world)))


class CopyToParallel(torch.autograd.Function):
    """Identity forward; the gradient summed over the ranks backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", group)


class ReduceFromParallel(torch.autograd.Function):
    """The partial outputs summed over the ranks forward; identity backward."""

    @staticmethod
    def forward(ctx, x):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, grad):
        return grad


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width // world)
        self.down = nn.Linear(4 * width // world, width, bias=False)

    def forward(self, x):
        h = nn.functional.gelu(self.up(CopyToParallel.apply(self.norm(x))))
        return x + ReduceFromParallel.apply(self.down(h))


torch.manual_seed(rank)
blocks = nn.Sequential(*[Block(args.width) for _ in range(args.blocks)])
head = nn.Linear(args.width, 10)
optimizer = torch.optim.SGD([*blocks.parameters(), *head.parameters()], lr=0.01)
generator = torch.Generator().manual_seed(0)
for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_tp_funcol.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    loss = nn.functional.cross_entropy(head(blocks(x)), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
