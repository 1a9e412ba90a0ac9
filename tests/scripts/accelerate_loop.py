"""A user's Accelerate loop: `Accelerator()`, `accelerator.prepare(model, optimizer, loader,
scheduler)`, `accelerator.backward(loss)`, `optimizer.step()`; a small CNN on random images,
AdamW with a linear-warmup scheduler, gradients clipped by `accelerator.clip_grad_norm_`.

    python accelerate_loop.py --steps 20
    python accelerate_loop.py --accumulate 2          # accelerator.accumulate(model)
    accelerate launch --multi_gpu … accelerate_loop.py --plain   # two independent replicas
    accelerate launch --cpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no accelerate_loop.py        # two processes (gloo)

`--steps` counts optimizer steps, each of `--accumulate` micro-batches.
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
parser.add_argument("--plain", action="store_true",
                    help="Accelerator() without cpu=True: on a host without a GPU each "
                         "process then trains alone (DistributedType.NO)")
args = parser.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=not args.plain)
torch.manual_seed(0)
n = args.batch_size * args.accumulate * 8 * accelerator.num_processes
data = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
loss_fn = nn.CrossEntropyLoss()

step = 0
while step < args.steps:
    for x, y in loader:
        with accelerator.accumulate(model):
            if step == args.fail_at:
                raise RuntimeError(f"accelerate_loop.py: failing at step {step} as asked")
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            if step >= args.steps:
                break
accelerator.wait_for_everyone()
accelerator.print(f"trained {step} steps on {accelerator.num_processes} process(es), "
                  f"last loss {loss.item():.4f}")
accelerator.end_training()
