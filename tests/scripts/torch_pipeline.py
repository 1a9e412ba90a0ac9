"""A user's pipeline-parallel PyTorch job: an MLP split in two stages with
``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe``), micro-batches, SGD;
launched with ``torchrun --nproc-per-node 2`` (gloo on CPU)."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
parser.add_argument("--width", type=int, default=512)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers_per_stage = 4


def stage_module(index: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(layers_per_stage):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    if index == world - 1:
        layers.append(nn.Linear(args.width, 10))
    return nn.Sequential(*layers)


module = stage_module(rank)
micro = args.batch_size // args.microbatches
out_width = 10 if rank == world - 1 else args.width
stage = PipelineStage(module, rank, world, torch.device("cpu"),
                      input_args=(torch.empty(micro, args.width),),
                      output_args=(torch.empty(micro, out_width),))
loss_fn = nn.CrossEntropyLoss()
schedule_cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
schedule = schedule_cls(stage, n_microbatches=args.microbatches,
                        loss_fn=loss_fn if rank == world - 1 else None)
optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)

x = torch.randn(args.batch_size, args.width)
y = torch.randint(0, 10, (args.batch_size,))
for _ in range(args.steps):
    optimizer.zero_grad()
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        losses: list[torch.Tensor] = []
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    optimizer.step()
dist.destroy_process_group()
print(f"rank {rank} of {world}: trained {args.steps} steps")
