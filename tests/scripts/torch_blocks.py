"""A user's one-process training loop of the models the model-parallel scripts split
(``torch_tp.py``, ``torch_pp.py``), unsplit: ``--kind blocks`` is ``torch_tp.py``'s stack of
MLP blocks (LayerNorm, a two-layer MLP with GELU, a residual connection) and its head, AdamW;
``--kind mlp`` is ``torch_pp.py``'s linear layers with ReLU (``--layers`` per stage times
``--stages``) and its head, SGD. Random data from a seeded generator, as those scripts draw
it; the base a user records before splitting the model."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--kind", choices=["blocks", "mlp"], default="blocks")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--blocks", type=int, default=2)
parser.add_argument("--layers", type=int, default=2, help="mlp: layers per stage")
parser.add_argument("--stages", type=int, default=2, help="mlp: the stages they would make")
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()


class Block(nn.Module):
    """LayerNorm, a two-layer MLP with GELU, and a residual connection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


torch.manual_seed(0)
if args.kind == "blocks":
    model = nn.Sequential(*(Block(args.width) for _ in range(args.blocks)),
                          nn.Linear(args.width, 10))
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
else:
    layers: list[nn.Module] = []
    for _ in range(args.layers * args.stages):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(0)
for step in range(args.steps):
    if step == args.fail_at:
        raise RuntimeError(f"torch_blocks.py: failing at step {step} as asked")
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"trained {args.steps} steps ({args.kind})")
