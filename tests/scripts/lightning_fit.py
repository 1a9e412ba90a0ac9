"""A user's Lightning script: a LightningModule (small CNN) trained by `Trainer.fit` with
automatic optimization — Lightning runs `training_step` and `backward()` inside the
optimizer's closure (`optimizer.step(closure)`) — AdamW with a per-step LR scheduler, on CPU.

    python lightning_fit.py --steps 20
    python lightning_fit.py --accumulate 2 --clip 1.0          # accumulate_grad_batches, clipping
    python lightning_fit.py --devices 2 --strategy ddp         # Lightning's own DDP (gloo)
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="optimizer steps (max_steps)")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
parser.add_argument("--clip", type=float, default=None, help="gradient_clip_val")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--strategy", default="auto", help="auto, ddp, ddp_spawn …")
args = parser.parse_args()


class Classifier(L.LightningModule):
    def __init__(self, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
        )
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.global_step == args.fail_at:
            raise RuntimeError(f"lightning_fit.py: failing at step {self.global_step} as asked")
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


if __name__ == "__main__":  # ddp_spawn starts its processes by importing this file
    torch.manual_seed(0)
    n = args.batch_size * 8
    data = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=args.devices,
                        strategy=args.strategy, accumulate_grad_batches=args.accumulate,
                        gradient_clip_val=args.clip, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader)
    print(f"rank {trainer.global_rank}: trained {trainer.global_step} steps")
