"""What a convergence run (`record --converge`) needs beside the framework: the evaluation
sets (a fixed slice of the training images and held-out test images, normalized like the
training data; for the language models a slice of the training sequences and held-out ones)
and the accuracy of a framework's ``predict`` on them (next-token accuracy for the language
models)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from opprof.collectors.config import SEQ_LEN, RecordConfig
from opprof.collectors.datasets import load_images, resize_nearest, synthetic_tokens
from opprof.collectors.runner import Convergence, Out

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from opprof.arrays import Array

#: Images of each evaluation set (train slice, test split).
EVAL_IMAGES = 512
EVAL_BATCH = 128
#: Test accuracies whose time-to-accuracy the reports give.
TARGETS = (0.5, 0.7, 0.9)


def normalized(images: Array, size: int, mean: Array, std: Array) -> Array:
    """uint8 NHWC images → float32 NHWC, resized and normalized as the training data is."""
    x = resize_nearest(images, size).astype(np.float32) / 255.0
    return ((x - mean) / std).astype(np.float32)


def image_convergence(config: RecordConfig, train_images: Array,
                      train_labels: Array, *, size: int, mean: Array,
                      std: Array, predict: Callable[[Array], ArrayLike],
                      loss: Callable[[Out], float]) -> Convergence[Out] | None:
    """The :class:`Convergence` of an image classifier (None without ``--converge``):
    ``predict`` maps a float32 NHWC batch to logits (anything ``np.asarray`` reads)."""
    if not config.converge:
        return None
    n = min(EVAL_IMAGES, len(train_images))
    test_images, test_labels, _ = load_images(config.dataset, n=EVAL_IMAGES, seed=config.seed,
                                              train=False)
    sets = [(normalized(train_images[:n], size, mean, std), train_labels[:n]),
            (normalized(test_images, size, mean, std), test_labels)]

    def accuracy() -> tuple[float, float]:
        out = []
        for x, y in sets:
            right = 0
            for i in range(0, len(x), EVAL_BATCH):
                logits = np.asarray(predict(x[i:i + EVAL_BATCH]))
                right += int((logits.argmax(axis=1) == y[i:i + EVAL_BATCH]).sum())
            out.append(right / len(x))
        return out[0], out[1]

    return Convergence(config.converge, config.eval_every, loss, accuracy)


def token_data(config: RecordConfig, n: int, *, train: bool = True) -> Array:
    """The language models' data: ``n`` sequences of SEQ_LEN + 1 synthetic tokens (inputs
    ``[:, :-1]``, next-token targets ``[:, 1:]``)."""
    return synthetic_tokens(n, SEQ_LEN, seed=config.seed, train=train)


def token_convergence(config: RecordConfig, train_tokens: Array, *,
                      predict: Callable[[Array], ArrayLike],
                      loss: Callable[[Out], float]) -> Convergence[Out] | None:
    """The :class:`Convergence` of a language model (None without ``--converge``):
    ``predict`` maps int64 N×T tokens to N×T×vocab logits; accuracy is next-token accuracy
    over every position."""
    if not config.converge:
        return None
    n = min(EVAL_IMAGES, len(train_tokens))
    sets = [train_tokens[:n], token_data(config, EVAL_IMAGES, train=False)]

    def accuracy() -> tuple[float, float]:
        out = []
        for tokens in sets:
            right = 0
            for i in range(0, len(tokens), EVAL_BATCH):
                batch = tokens[i:i + EVAL_BATCH]
                logits = np.asarray(predict(batch[:, :-1]))
                right += int((logits.argmax(axis=-1) == batch[:, 1:]).sum())
            out.append(right / tokens[:, 1:].size)
        return out[0], out[1]

    return Convergence(config.converge, config.eval_every, loss, accuracy)
