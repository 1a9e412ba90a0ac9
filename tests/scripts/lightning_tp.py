"""A user's Lightning script for tensor parallelism: ``ModelParallelStrategy`` on a 2-D mesh
(``--data-parallel`` × ``--tensor-parallel`` processes, CPU and gloo; Lightning starts the
processes itself), the model's MLP split in ``configure_model`` with DTensor's
``ColwiseParallel`` / ``RowwiseParallel``, ``Trainer.fit`` with automatic optimization (forward
and backward inside the optimizer's closure), AdamW on random data.

    python lightning_tp.py --steps 14                       # tp 2, data_parallel_size 1
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=14, help="optimizer steps (max_steps)")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--width", type=int, default=128)
parser.add_argument("--data-parallel", type=int, default=1)
parser.add_argument("--tensor-parallel", type=int, default=2)
args = parser.parse_args()


class MLP(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, 10)

    def configure_model(self) -> None:
        parallelize_module(self, self.device_mesh["tensor_parallel"],
                           {"up": ColwiseParallel(), "down": RowwiseParallel()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    torch.manual_seed(0)
    n = args.batch_size * 16
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    strategy = ModelParallelStrategy(data_parallel_size=args.data_parallel,
                                     tensor_parallel_size=args.tensor_parallel)
    trainer = L.Trainer(accelerator="cpu", devices=args.data_parallel * args.tensor_parallel,
                        strategy=strategy, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(MLP(args.width), DataLoader(data, batch_size=args.batch_size))
