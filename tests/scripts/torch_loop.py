"""A user's PyTorch training loop: small CNN on random images, DataLoader, SGD."""

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--sleep-ms", type=float, default=0.0,
                    help="a slower version of the same job: sleep this long in every step")
parser.add_argument("--abort-at-end", action="store_true",
                    help="die of SIGABRT once trained, as a C++ library at exit can")
args = parser.parse_args()

torch.manual_seed(0)
images = torch.randn(args.batch_size * 8, 3, 32, 32)
labels = torch.randint(0, 10, (args.batch_size * 8,))
loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
                    drop_last=True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

step = 0
while step < args.steps:
    for x, y in loader:
        if step == args.fail_at:
            raise RuntimeError(f"torch_loop.py: failing at step {step} as asked")
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
        step += 1
        if step >= args.steps:
            break
print(f"trained {step} steps, last loss {loss.item():.4f}")
if args.abort_at_end:
    os.abort()

