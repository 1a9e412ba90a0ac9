"""A user's expert- and data-parallel script on groups built by hand (as Megatron-LM and
DeepSpeed build theirs): ``--ep`` ranks per expert group, made with ``dist.new_group`` (no
device mesh), the data-parallel groups across them; each rank's expert takes its group's
tokens (``dist.all_to_all_single`` out and back in an autograd Function, the split sizes
exchanged first), the router's and expert's gradients averaged over the rank's data-parallel
group. ``--order dp-first`` makes the data-parallel groups first; ``--megatron-desc`` names
them as Megatron-LM does (``group_desc="EXPERT_MODEL_PARALLEL_GROUP"`` …). Launched with
torchrun (gloo on CPU), SGD on random data."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--tokens", type=int, default=128)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--ep", type=int, default=2, help="ranks per expert-parallel group")
parser.add_argument("--order", choices=["ep-first", "dp-first"], default="ep-first")
parser.add_argument("--megatron-desc", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ep_ranks = [list(range(i, i + args.ep)) for i in range(0, world, args.ep)]
dp_ranks = [list(range(i, world, args.ep)) for i in range(args.ep)]


def groups(kind: str, ranks: list[list[int]]) -> list[dist.ProcessGroup]:
    desc = {"ep": "EXPERT_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP"}[kind]
    extra = {"group_desc": desc} if args.megatron_desc else {}
    return [dist.new_group(r, **extra) for r in ranks]


made = {}
for kind in (("dp", "ep") if args.order == "dp-first" else ("ep", "dp")):
    made[kind] = groups(kind, ep_ranks if kind == "ep" else dp_ranks)
ep = made["ep"][rank // args.ep]
dp = made["dp"][rank % args.ep]


class AllToAll(torch.autograd.Function):
    """Tokens to the ranks of their experts in ``group`` (their gradients back the same way)."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.back = (send, recv, group)
        out = x.new_empty(sum(recv), x.shape[1])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv, group = ctx.back
        out = grad.new_empty(sum(send), grad.shape[1])
        dist.all_to_all_single(out, grad.contiguous(), send, recv, group=group)
        return out, None, None, None


torch.manual_seed(0)
router = nn.Linear(args.width, args.ep)
expert = nn.Sequential(nn.Linear(args.width, 2 * args.width), nn.GELU(),
                       nn.Linear(2 * args.width, args.width))
params = [*router.parameters(), *expert.parameters()]
opt = torch.optim.SGD(params, lr=0.01)
torch.manual_seed(1 + rank)
for _ in range(args.steps):
    x = torch.randn(args.tokens, args.width, requires_grad=True)
    scores = torch.softmax(router(x), dim=-1)
    weight, target = scores.max(dim=-1)
    order = torch.argsort(target)
    send_counts = torch.bincount(target, minlength=args.ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ep)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    back = AllToAll.apply(expert(AllToAll.apply(x[order], send, recv, ep)), recv, send, ep)
    y = torch.empty_like(back)
    y[order] = back
    loss = (y * weight.unsqueeze(-1)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad, group=dp)
        p.grad /= world // args.ep
    opt.step()
dist.destroy_process_group()
