"""A user's expert-parallel script in the capacity style: top-1 routing, one expert per rank,
each expert taking at most ``--capacity`` tokens from each rank (the rest dropped, a short
bucket padded with zeros), the buckets exchanged with the list form ``dist.all_to_all`` (one
tensor per peer: gloo needs them all of one shape). No data parallel: the router and the head
stay on each rank's own batch. With ``--agree-capacity`` the capacity is each step's largest
bucket on any rank, agreed by an all-reduce (``op=MAX``) of one element in the forward pass.
Launched with torchrun (gloo on CPU), Adam on random data."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--capacity", type=int, default=40)
parser.add_argument("--agree-capacity", action="store_true")
args = parser.parse_args()


class AllToAll(torch.autograd.Function):
    """One bucket of ``cap`` rows to each peer, and the gradients back."""

    @staticmethod
    def forward(ctx, x, cap):
        ctx.cap = cap
        out = [x.new_empty(cap, x.shape[1]) for _ in range(dist.get_world_size())]
        dist.all_to_all(out, list(x.split(cap)))
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad):
        out = [grad.new_empty(ctx.cap, grad.shape[1]) for _ in range(dist.get_world_size())]
        dist.all_to_all(out, list(grad.contiguous().split(ctx.cap)))
        return torch.cat(out), None


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
d, cap = args.width, args.capacity
router = nn.Linear(d, world)
expert = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
head = nn.Linear(d, 10)
optimizer = torch.optim.Adam([*router.parameters(), *expert.parameters(),
                              *head.parameters()], lr=1e-3)

for _ in range(args.steps):
    x = torch.randn(args.batch_size, d)
    y = torch.randint(0, 10, (args.batch_size,))
    scores = router(x).softmax(-1)
    choice = scores.argmax(-1)
    if args.agree_capacity:
        need = torch.bincount(choice, minlength=world).max()
        dist.all_reduce(need, op=dist.ReduceOp.MAX)
        cap = int(need)
    kept, buckets = [], []
    for e in range(world):
        idx = (choice == e).nonzero().flatten()[:cap]
        bucket = x.new_zeros(cap, d)
        bucket[:len(idx)] = x[idx] * scores[idx, e:e + 1]  # the router learns through this
        kept.append(idx)
        buckets.append(bucket)
    back = AllToAll.apply(expert(AllToAll.apply(torch.cat(buckets), cap)), cap).split(cap)
    out = torch.zeros_like(x)
    for idx, piece in zip(kept, back, strict=True):
        out = out.index_add(0, idx, piece[:len(idx)])
    loss = nn.functional.cross_entropy(head(out + x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
