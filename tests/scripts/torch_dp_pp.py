"""A user's 2-D job: pipelines of 2 stages (``torch.distributed.pipelining``, GPipe, 4
micro-batches) replicated over 2 data-parallel ranks on a ``(dp, pp)`` device mesh of 4
processes; each stage's gradients averaged over its data-parallel group by hand before the
optimizer step. Launched with torchrun (gloo on CPU), SGD on random data."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--width", type=int, default=128)
args = parser.parse_args()

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
stage_index = mesh["pp"].get_local_rank()
dp_group = mesh["dp"].get_group()
torch.manual_seed(0)
w = args.width
blocks = [nn.Sequential(nn.Linear(w, 2 * w), nn.ReLU(), nn.Linear(2 * w, w)) for _ in range(4)]
part = nn.Sequential(*blocks[2 * stage_index: 2 * stage_index + 2])
if stage_index == 1:
    part.append(nn.Linear(w, 10))
stage = PipelineStage(part, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy)
optimizer = torch.optim.SGD(part.parameters(), lr=0.01)
data = torch.Generator().manual_seed(mesh["dp"].get_local_rank())  # one batch per replica

for _ in range(args.steps):
    x = torch.randn(args.batch_size, w, generator=data)
    y = torch.randint(0, 10, (args.batch_size,), generator=data)
    optimizer.zero_grad()
    if stage_index == 0:
        schedule.step(x)
    else:
        schedule.step(target=y)
    for p in part.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= dist.get_world_size(dp_group)
    optimizer.step()
dist.destroy_process_group()
print(f"trained {args.steps} steps")
