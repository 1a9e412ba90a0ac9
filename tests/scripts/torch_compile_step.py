"""A user's whole training step under one ``torch.compile``: forward, ``loss.backward()``,
AdamW's ``step()`` and ``zero_grad()`` in one compiled function (Dynamo breaks the graph at
``backward()`` and around the optimizer's step itself)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.SiLU(), nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.compile
def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


for _ in range(args.steps):
    loss = train_step(torch.randn(64, 20), torch.randn(64, 1))
print(f"trained {args.steps} steps, last loss {loss.item():.4f}")
