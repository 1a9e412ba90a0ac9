"""A user's torch.compile training loop: a tiny conv/linear/norm/GELU model compiled with
inductor (the default backend; C++ kernels on the CPU), trained with AdamW; ``--ddp`` (under
torchrun) wraps it in DistributedDataParallel first and compiles that (gloo)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--reshape-at", type=int, default=-1,
                    help="change the batch size at this step (a recompilation)")
parser.add_argument("--ddp", action="store_true", help="DDP over gloo (launch with torchrun)")
args = parser.parse_args()

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8 * 8 * 8)
        self.fc1 = nn.Linear(8 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(nn.functional.gelu(self.conv(x)), 2)
        x = self.norm(x.flatten(1))
        return self.fc2(nn.functional.gelu(self.fc1(x)))


model = Net()
if args.ddp:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    compiled = torch.compile(DistributedDataParallel(model))
else:
    compiled = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

for step in range(args.steps):
    batch = args.batch_size + (1 if 0 <= args.reshape_at <= step else 0)
    x = torch.randn(batch, 3, 16, 16)
    y = torch.randint(0, 10, (batch,))
    optimizer.zero_grad()
    loss = loss_fn(compiled(x), y)
    loss.backward()
    optimizer.step()
print(f"trained {args.steps} steps, last loss {loss.item():.4f}")
