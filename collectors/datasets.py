"""Framework-neutral training data for the collectors: numpy images, never downloaded.

``load_images`` returns uint8 NHWC images (N×32×32×3), int64 labels and the class count, from
one of:

* ``synthetic-cifar10`` (default): generated, deterministic for a seed, 10 classes. Each class
  has its own base colour and its own sinusoidal grating (orientation and frequency), drawn
  with a random phase, contrast and brightness per image, plus pixel noise — so the data has
  real class structure without any file on disk.
* ``cifar10`` / ``cifar100``: the standard CIFAR "python batches" folders
  (``cifar-10-batches-py``, ``cifar-100-python``) under ``$OPPROF_DATA``
  (default ``~/.cache/opprof/data``).
* a PATH: a folder in either of those formats (or a folder holding one of them).

opprof never downloads anything; a missing folder is an :class:`OpprofError`.

The synthetic images are learnable: a LeNet-5 passes 50% test accuracy (on the held-out
draws, ``train=False``) within a few hundred steps (``benchmarks/bench_converge.py``).
``synthetic_tokens`` is the sequence models' counterpart: text from a fixed random Markov
chain, so a language model's next-token loss falls from ``ln(vocab)`` towards the chain's
entropy.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from opprof.errors import ErrorKind, OpprofError

SYNTHETIC = "synthetic-cifar10"
DATASETS = (SYNTHETIC, "cifar10", "cifar100")
_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
_CIFAR10_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_CIFAR10_TEST = ["test_batch"]
_SIZE = 32
_PROTOTYPE_SEED = 20240917  # class prototypes are fixed; ``seed`` only changes the draws


def data_root() -> Path:
    """Where ``cifar10``/``cifar100`` are looked for: ``$OPPROF_DATA`` or ~/.cache/opprof/data."""
    env = os.environ.get("OPPROF_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "opprof" / "data"


def load_images(
    dataset: str, *, n: int, seed: int = 0, train: bool = True
) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` images (uint8 N×32×32×3, NHWC), their int64 labels, and the number of classes.

    Real data sets give their first ``n`` images (repeated in order when they hold fewer).
    """
    if n <= 0:
        raise OpprofError(f"need at least one image, got n={n}")
    if dataset == SYNTHETIC:
        return synthetic_cifar10(n, seed=seed, train=train)
    if dataset in _FOLDERS:
        folder = data_root() / _FOLDERS[dataset]
        if not folder.is_dir():
            raise OpprofError(
                f"{dataset} not found: looked for {folder} (set OPPROF_DATA or pass a folder); "
                f"opprof never downloads data — use --dataset {SYNTHETIC}"
            )
        fmt = _detect(folder)
        if fmt is None:
            raise OpprofError(f"{folder} is not a CIFAR python-batches folder ({dataset})")
        return _read(folder, fmt, n, train)
    folder = Path(dataset).expanduser()
    if not folder.is_dir():
        raise OpprofError(
            f"unknown dataset {dataset!r}: not one of {', '.join(DATASETS)} and no folder "
            f"{folder}; opprof never downloads data — use --dataset {SYNTHETIC}"
        )
    fmt = _detect(folder)
    if fmt is None:
        for fmt_name, sub in _FOLDERS.items():
            if _detect(folder / sub) == fmt_name:
                folder, fmt = folder / sub, fmt_name
                break
    if fmt is None:
        raise OpprofError(
            f"{folder} is not a CIFAR python-batches folder: expected data_batch_1..5 and "
            f"test_batch (CIFAR-10) or train and test (CIFAR-100)"
        )
    return _read(folder, fmt, n, train)


def synthetic_cifar10(n: int, *, seed: int = 0, train: bool = True) -> tuple[
    np.ndarray, np.ndarray, int
]:
    """Deterministic CIFAR-10-shaped data with class-dependent colour and texture."""
    classes = 10
    proto = np.random.default_rng(_PROTOTYPE_SEED)
    colours = proto.uniform(0.2, 0.8, size=(classes, 3))  # base RGB per class, in [0, 1]
    angles = np.arange(classes) * (np.pi / classes) + proto.uniform(0, 0.1, classes)
    freqs = proto.uniform(0.15, 0.6, size=classes)  # radians per pixel
    tints = proto.uniform(-1.0, 1.0, size=(classes, 3))  # how the grating colours each channel

    rng = np.random.default_rng([seed, 1 if train else 2])
    labels = rng.permutation(np.arange(n) % classes).astype(np.int64)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
    contrast = rng.uniform(0.10, 0.25, size=(n, 1, 1, 1))
    brightness = rng.uniform(-0.1, 0.1, size=(n, 1, 1, 1))

    yy, xx = np.mgrid[0:_SIZE, 0:_SIZE].astype(np.float64)
    a, f = angles[labels][:, None, None], freqs[labels][:, None, None]
    wave = np.sin(f * (xx * np.cos(a) + yy * np.sin(a)) + phase)  # N×H×W
    img = colours[labels][:, None, None, :] + brightness
    img = img + contrast * wave[..., None] * tints[labels][:, None, None, :]
    img = img + rng.normal(0.0, 0.06, size=(n, _SIZE, _SIZE, 3))
    images = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
    return images, labels, classes


#: The token data set's vocabulary and the number of likely successors of each token.
TOKEN_VOCAB = 64
TOKEN_BRANCHING = 4
_CHAIN_SEED = 20251125  # the Markov chain is fixed; ``seed`` only changes the draws


def token_chain(vocab: int = TOKEN_VOCAB, branching: int = TOKEN_BRANCHING) -> np.ndarray:
    """The fixed transition matrix (vocab×vocab, rows sum to 1): each token is followed by one
    of ``branching`` tokens of its own (weights 0.55/0.25/…), plus a little mass on all."""
    rng = np.random.default_rng(_CHAIN_SEED)
    weights = np.array([0.55, 0.25, 0.12, 0.05, 0.03][:branching], dtype=np.float64)
    chain = np.full((vocab, vocab), 0.02 / vocab)
    for t in range(vocab):
        chain[t, rng.choice(vocab, size=branching, replace=False)] += 0.98 * weights / weights.sum()
    return chain / chain.sum(axis=1, keepdims=True)


def synthetic_tokens(n: int, seq_len: int, *, seed: int = 0, train: bool = True,
                     vocab: int = TOKEN_VOCAB) -> np.ndarray:
    """``n`` int64 sequences of ``seq_len + 1`` tokens from the fixed Markov chain (inputs are
    ``[:, :-1]``, next-token targets ``[:, 1:]``), deterministic for a seed; ``train=False``
    gives held-out draws."""
    if n <= 0 or seq_len <= 0:
        raise OpprofError(f"need at least one sequence of one token, got n={n}, "
                          f"seq_len={seq_len}")
    cumulative = np.cumsum(token_chain(vocab), axis=1)
    rng = np.random.default_rng([seed, 3 if train else 4])
    out = np.empty((n, seq_len + 1), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, size=n)
    draws = rng.random((n, seq_len))
    for i in range(seq_len):  # vectorized over the sequences
        row = cumulative[out[:, i]]
        out[:, i + 1] = np.minimum((row < draws[:, i:i + 1]).sum(axis=1), vocab - 1)
    return out


def chain_entropy(vocab: int = TOKEN_VOCAB) -> float:
    """The chain's mean next-token entropy (nats), the loss a perfect model approaches."""
    chain = token_chain(vocab)
    return float(-(chain * np.log(chain)).sum(axis=1).mean())


def resize_nearest(images: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of (..., H, W, C) images to (..., size, size, C)."""
    h, w = images.shape[-3], images.shape[-2]
    if h == size and w == size:
        return images
    rows = (np.arange(size) * h) // size
    cols = (np.arange(size) * w) // size
    return images[..., rows[:, None], cols[None, :], :]


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 NHWC images, scaled to [0, 1] (for normalizing)."""
    x = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    std = x.std(axis=0)
    return x.mean(axis=0).astype(np.float32), np.where(std > 0, std, 1.0).astype(np.float32)


def _detect(folder: Path) -> str | None:
    if (folder / "data_batch_1").is_file() or (folder / "test_batch").is_file():
        return "cifar10"
    if (folder / "train").is_file() or (folder / "test").is_file():
        return "cifar100"
    return None


def _read(folder: Path, fmt: str, n: int, train: bool) -> tuple[np.ndarray, np.ndarray, int]:
    if fmt == "cifar10":
        names, label_key, classes = (_CIFAR10_TRAIN if train else _CIFAR10_TEST), "labels", 10
    else:
        names, label_key, classes = (["train"] if train else ["test"]), "fine_labels", 100
    images, labels, have = [], [], 0
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        batch = _unpickle(path)
        data, lab = _field(batch, "data", path), _field(batch, label_key, path)
        data = np.asarray(data, dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * _SIZE * _SIZE:
            raise OpprofError(f"expected N×3072 uint8 data, got shape {data.shape}",
                              path=path, kind=ErrorKind.DAMAGED)
        images.append(data.reshape(-1, 3, _SIZE, _SIZE).transpose(0, 2, 3, 1))
        labels.append(np.asarray(lab, dtype=np.int64))
        have += len(data)
        if have >= n:
            break
    if have == 0:
        split = "train" if train else "test"
        raise OpprofError(f"{folder} holds no {split} images ({', '.join(names)} missing)")
    all_images, all_labels = np.concatenate(images), np.concatenate(labels)
    idx = np.arange(n) % len(all_images)
    return np.ascontiguousarray(all_images[idx]), all_labels[idx], classes


def _unpickle(path: Path) -> dict[Any, Any]:
    try:
        with open(path, "rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
    except Exception as exc:  # any unreadable file is one clear error
        raise OpprofError(f"{path} is not a CIFAR python batch: {exc}") from None
    if not isinstance(batch, dict):
        raise OpprofError(f"{path} is not a CIFAR python batch (not a dict)")
    return batch


def _field(batch: dict[Any, Any], key: str, path: Path) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise OpprofError(f"{path} has no {key!r} entry")
