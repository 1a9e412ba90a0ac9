"""A user's pipeline written by hand: two (or more) stages of an MLP, one per rank; each
micro-batch's activations go forward with ``dist.send`` / ``dist.recv`` and its gradients come
back the same way (all forwards, then all backwards: GPipe's order), launched with torchrun
(gloo on CPU), SGD on random data. No ``torch.distributed.pipelining``."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--width", type=int, default=128)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
first, last = rank == 0, rank == world - 1
torch.manual_seed(rank)
stage = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(),
                      nn.Linear(args.width, args.width), nn.Tanh())
head = nn.Linear(args.width, 10) if last else None
params = [*stage.parameters(), *(head.parameters() if head else [])]
optimizer = torch.optim.SGD(params, lr=0.01)
generator = torch.Generator().manual_seed(0)
mb = args.batch_size // args.microbatches

for step in range(args.steps):
    if step == args.fail_at and last:
        raise RuntimeError(f"torch_pp_manual.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    optimizer.zero_grad()
    inputs, outputs = [], []
    for i in range(args.microbatches):
        if first:
            a = x[i * mb:(i + 1) * mb]
        else:
            a = torch.empty(mb, args.width)
            dist.recv(a, src=rank - 1)
            a.requires_grad_(True)
        out = stage(a)
        if last:
            out = nn.functional.cross_entropy(head(out), y[i * mb:(i + 1) * mb])
        else:
            dist.send(out.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(out)
    for i in range(args.microbatches):
        if last:
            outputs[i].backward()
        else:
            grad = torch.empty(mb, args.width)
            dist.recv(grad, src=rank + 1)
            outputs[i].backward(grad)
        if not first:
            dist.send(inputs[i].grad, dst=rank - 1)
    optimizer.step()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
