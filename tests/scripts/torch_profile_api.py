"""A PyTorch training loop that marks its own steps with opprof.profile() (explicit control)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opprof

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--output", default="mine.trace")
args = parser.parse_args()

torch.manual_seed(0)
images = torch.randn(args.batch_size * 8, 3, 32, 32)
labels = torch.randint(0, 10, (args.batch_size * 8,))
loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
                    drop_last=True)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

step = 0
with opprof.profile(steps=5, warmup=2, output=args.output) as prof:
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            prof.step()
            step += 1
            if step >= args.steps:
                break
print(f"trained {step} steps")
