"""A user's pipeline-parallel script: an MLP stack cut into one stage per rank with
``torch.distributed.pipelining`` (``PipelineStage`` on each rank's part of the layers, then
``ScheduleGPipe`` or ``Schedule1F1B``: ``--schedule gpipe|1f1b``; or two stages per rank,
stage r and r + world, with ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS`` or
``ScheduleInterleavedZeroBubble``: ``--schedule interleaved|looped|zero-bubble``; or two stages
per rank placed in a V, stage r and 2·world − 1 − r, with ``ScheduleZBVZeroBubble`` or
``ScheduleDualPipeV``: ``--schedule zbv|dualpipev``), the batch split into ``--microbatches``
micro-batches, launched with torchrun (gloo on CPU), SGD on random data."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--layers", type=int, default=4, help="layers per stage")
parser.add_argument("--width", type=int, default=128)
MULTI = {"interleaved": ScheduleInterleaved1F1B, "looped": ScheduleLoopedBFS,
         "zero-bubble": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble,
         "dualpipev": ScheduleDualPipeV}
parser.add_argument("--schedule", choices=["gpipe", "1f1b", *MULTI], default="gpipe")
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
looped = args.schedule in MULTI
v_shape = args.schedule in ("zbv", "dualpipev")
n_stages = 2 * world if looped else world


def part_of(index: int) -> nn.Module:
    """Stage ``index`` of the model: ``--layers`` linear layers (and the head on the last)."""
    torch.manual_seed(index)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    if index == n_stages - 1:
        layers.append(nn.Linear(args.width, 10))
    return nn.Sequential(*layers)


indices = ([rank, n_stages - 1 - rank] if v_shape else [rank, rank + world] if looped
           else [rank])
parts = [part_of(i) for i in indices]
stages = [PipelineStage(p, i, n_stages, torch.device("cpu"))
          for p, i in zip(parts, indices, strict=True)]
loss_fn = nn.CrossEntropyLoss()
if looped:
    schedule = MULTI[args.schedule](stages, n_microbatches=args.microbatches, loss_fn=loss_fn)
else:
    single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
    schedule = single(stages[0], n_microbatches=args.microbatches, loss_fn=loss_fn)
optimizer = torch.optim.SGD([q for p in parts for q in p.parameters()], lr=0.01)
generator = torch.Generator().manual_seed(0)

for step in range(args.steps):
    if step == args.fail_at and rank == world - 1:
        raise RuntimeError(f"torch_pp.py rank {rank}: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    optimizer.zero_grad()
    # the first stage takes the batch, the last the targets (one rank may hold both)
    kwargs = {"target": y} if n_stages - 1 in indices else {}
    if 0 in indices:
        schedule.step(x, **kwargs)
    else:
        schedule.step(**kwargs)
    optimizer.step()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps ({args.schedule}, "
      f"LOCAL_RANK={os.environ.get('LOCAL_RANK')})")
