"""A user's DistributedDataParallel script, launched with torchrun (gloo on CPU).

``--accumulate N``: N micro-batches per optimizer step, DDP's all-reduce skipped on the first
N − 1 (``model.no_sync()``); ``--by-hand``: no DDP, the gradients averaged with
``dist.all_reduce`` after backward, as scripts written before DDP do."""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
parser.add_argument("--by-hand", action="store_true", help="all-reduce by hand, no DDP")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
images = torch.randn(args.batch_size * 8 * world, 3, 32, 32)
labels = torch.randint(0, 10, (args.batch_size * 8 * world,))
dataset = TensorDataset(images, labels)
sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, drop_last=True)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
)
if not args.by_hand:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

step, epoch, micro = 0, 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        if step == args.fail_at and rank == world - 1:
            raise RuntimeError(f"torch_ddp.py rank {rank}: failing at step {step} as asked")
        if micro % args.accumulate == 0:  # the step's first micro-batch
            optimizer.zero_grad()
        micro += 1
        last = micro % args.accumulate == 0
        skip = model.no_sync() if not (last or args.by_hand) else contextlib.nullcontext()
        with skip:
            loss = loss_fn(model(x), y) / args.accumulate
            loss.backward()
        if not last:
            continue
        if args.by_hand:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        step += 1
        if step >= args.steps:
            break
    epoch += 1
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {step} steps (LOCAL_RANK={os.environ.get('LOCAL_RANK')})")
