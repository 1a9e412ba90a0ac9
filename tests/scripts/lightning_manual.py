"""A user's Lightning script with manual optimization, imported as `pytorch_lightning`: a tiny
GAN (generator and discriminator MLPs) whose `training_step` steps two optimizers itself —
`self.manual_backward(loss)`, `opt.step()`, `opt.zero_grad()` — and its two LR schedulers.

    python lightning_manual.py --steps 20      # 20 batches: 20 steps of each optimizer

Lightning counts every optimizer's step in `global_step` (two per batch here), so
`max_steps` is twice the batches.
"""

import argparse

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="batches (training steps)")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

LATENT, DATA = 16, 64


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(LATENT, 128), nn.ReLU(), nn.Linear(128, DATA))
        self.discriminator = nn.Sequential(nn.Linear(DATA, 128), nn.LeakyReLU(0.2),
                                           nn.Linear(128, 1))
        self.bce = nn.BCEWithLogitsLoss()

    def training_step(self, batch, batch_idx):
        if self.global_step // 2 == args.fail_at:
            raise RuntimeError(f"lightning_manual.py: failing at step {self.global_step // 2} "
                               "as asked")
        (real,) = batch
        g_opt, d_opt = self.optimizers()
        g_sched, d_sched = self.lr_schedulers()
        ones = torch.ones(real.size(0), 1)
        zeros = torch.zeros(real.size(0), 1)

        # the discriminator: real against generated
        fake = self.generator(torch.randn(real.size(0), LATENT)).detach()
        d_loss = (self.bce(self.discriminator(real), ones)
                  + self.bce(self.discriminator(fake), zeros)) / 2
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()

        # the generator: fool the discriminator
        fake = self.generator(torch.randn(real.size(0), LATENT))
        g_loss = self.bce(self.discriminator(fake), ones)
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(g_opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        g_opt.step()

        g_sched.step()
        d_sched.step()
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def configure_optimizers(self):
        g_opt = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        g_sched = torch.optim.lr_scheduler.ExponentialLR(g_opt, gamma=0.99)
        d_sched = torch.optim.lr_scheduler.ExponentialLR(d_opt, gamma=0.99)
        return [g_opt, d_opt], [g_sched, d_sched]


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.batch_size * 8, DATA))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    trainer = pl.Trainer(max_steps=2 * args.steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(GAN(), loader)
    print(f"trained {trainer.global_step // 2} batches ({trainer.global_step} optimizer steps)")
