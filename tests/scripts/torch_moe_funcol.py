"""A user's expert-parallel script written as TorchTitan writes its MoE dispatch: top-1
routing to ``--experts-per-rank`` experts on each rank; the tokens per expert are exchanged
first (``dist.all_to_all_single``), then the tokens go to their experts' ranks and come back
with the functional collective ``all_to_all_single_autograd``
(``torch.distributed._functional_collectives``: its backward is an all-to-all too, and its
result an ``AsyncCollectiveTensor`` waited on by the first operator that reads it). The router
and the rest are replicated, their gradients all-reduced by hand. Launched with torchrun
(gloo on CPU), AdamW on random data."""

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--tokens", type=int, default=256)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--experts-per-rank", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = args.experts_per_rank
torch.manual_seed(0)
router = nn.Linear(args.width, local * world)
experts = nn.ModuleList(
    nn.Sequential(nn.Linear(args.width, 2 * args.width), nn.SiLU(),
                  nn.Linear(2 * args.width, args.width)) for _ in range(local))
head = nn.Linear(args.width, 1)
shared = [*router.parameters(), *head.parameters()]
opt = torch.optim.AdamW([*shared, *experts.parameters()], lr=1e-3)
torch.manual_seed(1 + rank)

for _ in range(args.steps):
    x = torch.randn(args.tokens, args.width)
    scores = torch.softmax(router(x), dim=-1)
    weight, expert = scores.max(dim=-1)
    order = torch.argsort(expert)
    per_expert = torch.bincount(expert, minlength=local * world)
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert)  # how many tokens each peer sends each expert
    send = per_expert.view(world, local).sum(1).tolist()
    recv = got.view(world, local).sum(1).tolist()
    tokens = funcol.all_to_all_single_autograd(x[order], recv, send, group=dist.group.WORLD)
    outs, at = [], 0
    for n in got.view(world, local).tolist():  # each peer's block, ordered by expert
        for e, k in enumerate(n):
            outs.append(experts[e](tokens[at:at + k]))
            at += k
    back = funcol.all_to_all_single_autograd(torch.cat(outs), send, recv,
                                             group=dist.group.WORLD)
    y = torch.empty_like(back)
    y[order] = back
    loss = head(y * weight.unsqueeze(-1)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in shared:  # replicated: the ranks' gradients averaged
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()

dist.destroy_process_group()
