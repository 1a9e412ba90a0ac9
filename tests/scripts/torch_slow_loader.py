"""A user's input-bound PyTorch loop: a Dataset whose ``__getitem__`` decodes and augments each
sample slowly (a sleep standing in for JPEG decoding / disk reads), a DataLoader with the
default ``num_workers=0``, a small CNN, SGD."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--num-workers", type=int, default=0)
parser.add_argument("--decode-ms", type=float, default=2.0,
                    help="time each sample takes to 'decode' in __getitem__")
args = parser.parse_args()


class SlowImages(Dataset):
    """Random images that take ``decode_ms`` each to produce."""

    def __init__(self, n: int, decode_s: float) -> None:
        self.n, self.decode_s = n, decode_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.decode_s)  # reading and decoding the file
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 32, 32, generator=g)
        x = (x - 0.5) / 0.25  # normalize
        return x, i % 10


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(SlowImages(args.batch_size * 16, args.decode_ms / 1000),
                        batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=args.num_workers)
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
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step >= args.steps:
                break
    print(f"trained {step} steps, last loss {loss.item():.4f}")
