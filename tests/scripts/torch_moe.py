"""A user's expert-parallel script: a mixture-of-experts layer with top-1 routing and one
expert per rank; each rank sends every token to the rank of its expert with
``dist.all_to_all_single`` (the split sizes exchanged first), runs its expert on what it
received and sends the results back; the router and the rest are replicated and their
gradients all-reduced by hand. Launched with torchrun (gloo on CPU), Adam on random data."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--skew", type=float, default=1.0,
                    help="router bias towards expert 0 (the tokens' imbalance)")
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()


class AllToAll(torch.autograd.Function):
    """Tokens to the ranks of their experts (and the gradients back the same way)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits):
        ctx.splits = (send_splits, recv_splits)
        out = x.new_empty(sum(recv_splits), x.shape[1])
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        out = grad.new_empty(sum(send_splits), grad.shape[1])
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits)
        return out, None, None


class MoE(nn.Module):
    def __init__(self, width: int, world: int) -> None:
        super().__init__()
        self.world = world
        self.router = nn.Linear(width, world)
        self.expert = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                    nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        logits[:, 0] += args.skew
        gate, choice = logits.softmax(-1).max(-1)
        order = choice.argsort()
        send = torch.bincount(choice, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        tokens = AllToAll.apply(x[order], send_splits, recv_splits)
        done = AllToAll.apply(self.expert(tokens), recv_splits, send_splits)
        out = torch.empty_like(done)
        out[order] = done
        return x + gate.unsqueeze(1) * out


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
embed, head = nn.Linear(16, args.width), nn.Linear(args.width, 10)
torch.manual_seed(rank)  # every rank its own expert
moe = MoE(args.width, world)
shared = [*embed.parameters(), *moe.router.parameters(), *head.parameters()]
optimizer = torch.optim.Adam([*shared, *moe.expert.parameters()], lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(rank)

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_moe.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, 16, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    loss = loss_fn(head(moe(embed(x))), y)
    loss.backward()
    for p in shared:  # the replicated parameters: their gradients averaged over the ranks
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
