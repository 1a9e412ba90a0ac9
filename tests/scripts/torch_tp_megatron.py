"""A user's tensor parallelism written by hand the Megatron way: column- and row-parallel
linear layers whose autograd Functions call ``dist.all_reduce`` themselves (the row-parallel
output's sum in the forward pass, the column-parallel input's gradient in the backward pass),
no DTensor, no functional collectives; torchrun, gloo on CPU."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--width", type=int, default=64)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class CopyToTensorParallelRegion(torch.autograd.Function):
    """Identity forward; the gradient summed across the tensor-parallel ranks."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """The partial outputs summed across the ranks; identity backward."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad


class ParallelMLP(nn.Module):
    """A residual MLP whose hidden layer is split across the ranks."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width // world)
        self.down = nn.Linear(4 * width // world, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(CopyToTensorParallelRegion.apply(x)))
        return x + ReduceFromTensorParallelRegion.apply(self.down(h))


torch.manual_seed(0)
embed, head = nn.Linear(16, args.width), nn.Linear(args.width, 5)  # replicated
torch.manual_seed(1 + rank)
blocks = nn.Sequential(*(ParallelMLP(args.width) for _ in range(3)))  # this rank's shards
params = [*embed.parameters(), *blocks.parameters(), *head.parameters()]
optimizer = torch.optim.Adam(params, lr=1e-3)
generator = torch.Generator().manual_seed(0)  # every rank sees the same batch

for step in range(args.steps):
    x = torch.randn(args.batch_size, 16, generator=generator)
    y = torch.randint(0, 5, (args.batch_size,), generator=generator)
    loss = nn.functional.cross_entropy(head(blocks(embed(x))), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
