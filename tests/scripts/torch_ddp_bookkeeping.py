"""A user's DDP loop that does what training loops do beside the model (the Hugging Face
``Trainer`` gathers the batch's token count across ranks before the forward pass; scripts
average the loss across ranks for their log before ``backward``): collectives in the forward
pass that are data-parallel bookkeeping, not tensor parallelism. torchrun, gloo on CPU."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
generator = torch.Generator().manual_seed(rank)

for step in range(args.steps):
    x = torch.randn(args.batch_size, 32, generator=generator)
    y = torch.randint(-1, 4, (args.batch_size,), generator=generator).clamp(min=0)
    # the Trainer's num_items_in_batch: labels counted on every rank, gathered
    items = (y != -100).sum().reshape(1)
    gathered = [torch.zeros_like(items) for _ in range(world)]
    dist.all_gather(gathered, items)
    num_items = torch.cat(gathered).sum()
    loss = loss_fn(model(x), y) * world * args.batch_size / num_items
    logged = loss.detach().clone()
    dist.all_reduce(logged)  # the loss averaged across ranks, for the log
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {logged.item() / world:.4f}")
dist.destroy_process_group()
