"""The benchmark models in PyTorch, in their CIFAR forms (the reference for all frameworks).

The MXNet and TensorFlow collectors build the same networks and must match the layer counts
and parameter counts below (see :func:`layer_counts`). Notation: ``conv(in→out, k, s, p)`` is a
2-D convolution with a k×k kernel, stride s and symmetric zero padding p on each side;
``pool(k, s)`` is max pooling with no padding and floor rounding ("valid"); ``fc(in→out)`` is a
dense layer with bias. Input is NCHW float, 3 channels, ``INPUT_SIZE[name]`` pixels square.
Parameter counts are for 10 classes (CIFAR-10) and for 100 classes (CIFAR-100).

**LeNet-5** (32×32): ReLU activations and max pooling (not the original tanh/avg-pool).
conv(3→6, 5, 1, 0)+bias, ReLU, pool(2, 2) → 6×14×14; conv(6→16, 5, 1, 0)+bias, ReLU,
pool(2, 2) → 16×5×5; flatten (400); fc(400→120), ReLU; fc(120→84), ReLU; fc(84→classes).
2 conv, 3 fc, 0 batchnorm; 62,006 parameters (10 classes) / 69,656 (100 classes).

**AlexNet** (64×64, no BatchNorm, every conv has a bias):
conv(3→64, 5, 2, 2), ReLU → 64×32×32; pool(3, 2) → 64×15×15;
conv(64→192, 5, 1, 2), ReLU; pool(3, 2) → 192×7×7;
conv(192→384, 3, 1, 1), ReLU; conv(384→256, 3, 1, 1), ReLU; conv(256→256, 3, 1, 1), ReLU;
pool(3, 2) → 256×3×3; flatten (2304); dropout(0.5), fc(2304→1024), ReLU;
dropout(0.5), fc(1024→1024), ReLU; fc(1024→classes).
5 conv, 3 fc, 0 batchnorm; 5,871,434 parameters (10 classes) / 5,963,684 (100 classes).

**ResNet-18** and **ResNet-50** (32×32, the common CIFAR variant; every conv has NO bias
and is followed by BatchNorm (eps 1e-5, affine); running statistics are buffers, not counted):
stem conv(3→64, 3, 1, 1), BN, ReLU (no max pool); four stages of widths 64, 128, 256, 512
with strides 1, 2, 2, 2 (the stride is on each stage's first block); global average pool;
fc(final channels→classes).

* BasicBlock (ResNet-18, [2, 2, 2, 2] blocks, expansion 1): conv(in→w, 3, s, 1), BN, ReLU,
  conv(w→w, 3, 1, 1), BN; plus shortcut; ReLU. The shortcut is conv(in→w, 1, s, 0) + BN when
  s ≠ 1 or in ≠ w (stages 2–4), else identity. Final channels 512.
  20 conv (1 + 16 + 3 shortcut), 1 fc, 20 batchnorm;
  11,173,962 parameters (10 classes) / 11,220,132 (100 classes).
* Bottleneck (ResNet-50, [3, 4, 6, 3] blocks, expansion 4, stride on the 3×3 conv as in
  "ResNet v1.5"): conv(in→w, 1, 1, 0), BN, ReLU, conv(w→w, 3, s, 1), BN, ReLU,
  conv(w→4w, 1, 1, 0), BN; plus shortcut; ReLU. The shortcut is conv(in→4w, 1, s, 0) + BN when
  s ≠ 1 or in ≠ 4w (the first block of every stage, stage 1 included), else identity.
  Final channels 2048. 53 conv (1 + 48 + 4 shortcut), 1 fc, 53 batchnorm;
  23,520,842 parameters (10 classes) / 23,705,252 (100 classes).

**FCN** (32×32, fully connected: the shape of the GPU framework comparisons' FCN-S, three
hidden ReLU layers, at width 1024 for a CPU): flatten (3072); fc(3072→1024), ReLU;
fc(1024→1024), ReLU; fc(1024→1024), ReLU; fc(1024→classes).
0 conv, 4 fc, 0 batchnorm; 5,256,202 parameters (10 classes) / 5,348,452 (100 classes).

The two **language models** read 32 tokens of the 64-token synthetic vocabulary
(``datasets.synthetic_tokens``; their "classes" are the vocabulary) and give next-token logits
at every position (batch × 32 × vocab), trained with cross-entropy averaged over the tokens.

**LSTM**: embedding(vocab→64); LSTM(64→128) of 2 layers (each gate's input and recurrent
weights, two biases per layer as torch and cuDNN keep them); fc(128→vocab).
2 recurrent layers, 1 fc; 243,776 parameters (vocab 64).

**Transformer** (encoder, causal self-attention so that position t sees tokens ≤ t):
embedding(vocab→64) + a learned position embedding(32→64); 2 post-norm encoder layers of
multi-head self-attention (4 heads of 16; q, k, v and output projections with bias) then
feed-forward fc(64→128), ReLU, fc(128→64), each with a residual and LayerNorm (eps 1e-5),
no dropout; fc(64→vocab). 2 attention, 5 fc (the projections inside attention not counted),
4 layernorm; 77,248 parameters (vocab 64).
"""


from __future__ import annotations

import torch
from torch import nn

from opprof.collectors.config import (
    D_MODEL,
    EMBED_DIM,
    ENCODER_LAYERS,
    FCN_HIDDEN,
    FCN_WIDTH,
    FF_DIM,
    HEADS,
    INPUT_SIZE,
    LSTM_HIDDEN,
    LSTM_LAYERS,
    SEQ_LEN,
    canonical_name,
)

__all__ = ["INPUT_SIZE", "build", "canonical_name", "layer_counts"]


class LeNet5(nn.Module):
    """LeNet-5 for 32×32×3 input, with ReLU and max pooling."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(inplace=True),
            nn.Linear(120, 84), nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class FCN(nn.Module):
    """A fully connected network on the flattened 32×32×3 image (see the module docstring)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 3 * 32 * 32
        for _ in range(FCN_HIDDEN):
            layers += [nn.Linear(width, FCN_WIDTH), nn.ReLU(inplace=True)]
            width = FCN_WIDTH
        self.classifier = nn.Sequential(*layers, nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(x, 1))


class LSTMLanguageModel(nn.Module):
    """Embedding → 2-layer LSTM → fc to the vocabulary, logits at every position."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, EMBED_DIM)
        self.lstm = nn.LSTM(EMBED_DIM, LSTM_HIDDEN, num_layers=LSTM_LAYERS, batch_first=True)
        self.head = nn.Linear(LSTM_HIDDEN, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0])


class TransformerLanguageModel(nn.Module):
    """Token + position embedding → causal encoder layers → fc to the vocabulary."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, D_MODEL)
        self.position = nn.Embedding(SEQ_LEN, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, FF_DIM, dropout=0.0, batch_first=True)
            for _ in range(ENCODER_LAYERS))
        self.head = nn.Linear(D_MODEL, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(x)


class TokenCrossEntropy(nn.Module):
    """Cross-entropy of next-token logits (batch × length × vocab), mean over every token."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class AlexNet(nn.Module):
    """CIFAR-style AlexNet for 64×64×3 input: 5 conv + 3 fc, no BatchNorm."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 5, stride=2, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 3 * 3, 1024), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(1024, 1024), nn.ReLU(inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 convs with BatchNorm, identity or 1×1-conv shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet bottleneck block (1×1, 3×3 with the stride, 1×1 ×4), BatchNorm after each."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Module:
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_planes),
    )


class ResNet(nn.Module):
    """CIFAR ResNet: 3×3 stem (stride 1, no max pool), four stages, global average pool, fc."""

    def __init__(
        self, block: type[BasicBlock] | type[Bottleneck], blocks: list[int], num_classes: int = 10
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        in_planes, stages = 64, []
        for planes, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2), strict=True):
            layers = []
            for i in range(count):
                layers.append(block(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes * block.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(torch.flatten(self.avgpool(out), 1))


def build(name: str, num_classes: int) -> nn.Module:
    """A freshly initialized model (torch's default initialization, seeded by the caller)."""
    key = canonical_name(name)
    if key == "lenet5":
        return LeNet5(num_classes)
    if key == "alexnet":
        return AlexNet(num_classes)
    if key == "fcn":
        return FCN(num_classes)
    if key == "lstm":
        return LSTMLanguageModel(num_classes)
    if key == "transformer":
        return TransformerLanguageModel(num_classes)
    if key == "resnet18":
        return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules `record --mode fsdp` shards one by one (``fully_shard`` each, then the
    root), in forward order: a ResNet's residual blocks, a transformer's encoder layers;
    otherwise every layer that holds parameters (LeNet-5's and AlexNet's convolutions and
    linear layers, the LSTM model's embedding, LSTM and linear layer)."""
    blocks: list[nn.Module] = [m for m in model.modules() if isinstance(
        m, BasicBlock | Bottleneck | nn.TransformerEncoderLayer)]
    if blocks:
        return blocks
    return [m for m in model.modules()
            if m is not model and any(True for _ in m.parameters(recurse=False))]


def unit_param_bytes(model: nn.Module) -> list[int]:
    """Bytes of the parameters each FSDP unit gathers, in the order of a step's forward
    all-gathers: the root's own (those in no unit of :func:`shard_units`) first, then each
    unit's."""
    units = shard_units(model)
    inside = {id(p) for u in units for p in u.parameters()}
    root = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in inside)
    return [int(root)] + [int(sum(p.numel() * p.element_size() for p in u.parameters()))
                          for u in units]


def layer_counts(model: nn.Module) -> dict[str, int]:
    """Number of conv, fc and batchnorm layers, and total parameters (buffers not counted);
    for the language models also their embedding, recurrent (LSTM layers), attention and
    layernorm layers (an attention's own projections are not counted as fc)."""
    modules = list(model.modules())
    attention = [m for m in modules if isinstance(m, nn.MultiheadAttention)]
    inside = {id(m) for a in attention for m in a.modules() if m is not a}
    counts = {
        "conv": sum(isinstance(m, nn.modules.conv._ConvNd) for m in modules),
        "fc": sum(isinstance(m, nn.Linear) and id(m) not in inside for m in modules),
        "batchnorm": sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules),
        "params": sum(p.numel() for p in model.parameters()),
    }
    embedding = sum(isinstance(m, nn.Embedding) for m in modules)
    if embedding:
        counts |= {
            "embedding": embedding,
            "recurrent": sum(m.num_layers for m in modules if isinstance(m, nn.LSTM)),
            "attention": len(attention),
            "layernorm": sum(isinstance(m, nn.LayerNorm) for m in modules),
        }
    return counts
