"""A user's pipeline-parallel script: an MLP stack cut into one stage per rank with
``torch.distributed.pipelining`` (``PipelineStage`` on each rank's part of the layers, then
``ScheduleGPipe`` or ``Schedule1F1B``: ``--schedule gpipe|1f1b``), the batch split into
``--microbatches`` micro-batches, launched with torchrun (gloo on CPU), SGD on random data."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--layers", type=int, default=4, help="layers per stage")
parser.add_argument("--width", type=int, default=128)
parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
layers: list[nn.Module] = []
for _ in range(args.layers):
    layers += [nn.Linear(args.width, args.width), nn.ReLU()]
if rank == world - 1:
    layers.append(nn.Linear(args.width, 10))
part = nn.Sequential(*layers)
stage = PipelineStage(part, rank, world, torch.device("cpu"))
schedule_of = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
schedule = schedule_of(stage, n_microbatches=args.microbatches, loss_fn=nn.CrossEntropyLoss())
optimizer = torch.optim.SGD(part.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(0)

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_pp.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    optimizer.zero_grad()
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps ({args.schedule}, "
      f"LOCAL_RANK={os.environ.get('LOCAL_RANK')})")
