"""A user's own training script that counts its step's FLOPs with torch's FlopCounterMode.

Trains one of a few small models (plain PyTorch, no opprof) for ``--steps`` steps; with
``--count-flops`` it instead prints, as JSON, the FLOPs ``torch.utils.flop_counter.FlopCounterMode``
counts for one training step (forward, loss, backward, optimizer step). The tests compare that
with what `opprof run` counts from the trace of the same script.

FlopCounterMode has no formula for the CPU kernels of ``scaled_dot_product_attention``
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward): the script gives it torch's
own SDPA formulas for them, as a user of the CPU would (``custom_mapping``).

    python tests/scripts/torch_flops.py --model transformer --count-flops
    opprof run -o t.trace -- python tests/scripts/torch_flops.py --model transformer --steps 8
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """A small CNN: convolutions (strided, padded, 1×1), batch norm, pooling, linear. (No
    grouped convolution: torch 2.13's FlopCounterMode counts its weight gradient `groups` times
    over, see tests/test_flops.py.)"""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Block(nn.Module):
    """A pre-norm transformer block with F.scaled_dot_product_attention (causal)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(64, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class Recurrent(nn.Module):
    """A language model: embedding, a 2-layer LSTM (or GRU), a linear head."""

    def __init__(self, cell: str, vocab: int = 128, d: int = 48, hidden: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(d, hidden, num_layers=2,
                                                            batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(idx))
        return self.head(out)


def build(name: str, batch: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if name == "convnet":
        return ConvNet(), torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    seq = 16
    if name == "transformer":
        model: nn.Module = Transformer()
    else:
        model = Recurrent(name)
    return model, torch.randint(0, 128, (batch, seq)), torch.randint(0, 128, (batch, seq))


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
         y: torch.Tensor) -> float:
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    return float(loss.detach())


def count_flops(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> int:
    from torch.utils.flop_counter import (
        FlopCounterMode,
        sdpa_backward_flop_count,
        sdpa_flop_count,
    )

    aten = torch.ops.aten

    def sdpa(q, k, v, *args, out_shape=None, **kwargs):  # noqa: ANN001, ANN202
        return sdpa_flop_count(q, k, v)

    def sdpa_backward(gy, q, k, v, *args, out_shape=None, **kwargs):  # noqa: ANN001, ANN202
        return sdpa_backward_flop_count(gy, q, k, v)

    mapping = {aten._scaled_dot_product_flash_attention_for_cpu: sdpa,
               aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        step(model, opt, x, y)
    return int(counter.get_total_flops())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["convnet", "transformer", "lstm", "gru"],
                   default="convnet")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--count-flops", action="store_true")
    p.add_argument("--no-mkldnn", action="store_true",
                   help="run without oneDNN (an LSTM then runs as the matmuls FlopCounterMode "
                        "sees, not as one mkldnn_rnn_layer it has no formula for)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    model, x, y = build(args.model, args.batch_size)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if args.count_flops:
        step(model, opt, x, y)  # the optimizer's state made, as in a training step
        print(json.dumps({"model": args.model, "flops_per_step": count_flops(model, opt, x, y)}))
        return
    for _ in range(args.steps):
        step(model, opt, x, y)


if __name__ == "__main__":
    main()
