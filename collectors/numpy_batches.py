"""Shuffled batches of one worker's shard prepared in numpy, for the collectors whose
framework takes numpy arrays (JAX, Chainer): images resized, normalized and flipped at
random (seeded), or token sequences for the language models."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from opprof.arrays import Array
from opprof.collectors.config import SEQUENCE_MODELS, RecordConfig, canonical_name
from opprof.collectors.convergence import token_data
from opprof.collectors.datasets import TOKEN_VOCAB, channel_stats, load_images, resize_nearest


class NumpyBatches:
    """Endless shuffled batches of worker ``rank``'s shard of ``world``; images ``size``
    pixels square, channels first (NCHW) when ``channels_first`` else last (NHWC)."""

    def __init__(self, config: RecordConfig, rank: int, world: int, size: int,
                 channels_first: bool) -> None:
        per_worker = max(config.batch_size * 8, 256)
        shard = slice(rank * per_worker, (rank + 1) * per_worker)
        self.batch = config.batch_size
        self.rng = np.random.default_rng(config.seed * 1000 + rank)
        self.channels_first = channels_first
        self.tokens: Array | None = None
        if canonical_name(config.model) in SEQUENCE_MODELS:
            self.tokens = token_data(config, per_worker * world)[shard]
            self.n, self.classes = len(self.tokens), TOKEN_VOCAB
            return
        images, labels, self.classes = load_images(config.dataset, n=per_worker * world,
                                                   seed=config.seed)
        self.images, self.labels = images[shard], labels[shard]
        mean, std = channel_stats(images)
        self.mean, self.std, self.size, self.n = mean, std, size, len(self.images)

    def __iter__(self) -> Iterator[tuple[Array, Array]]:
        while True:
            order = self.rng.permutation(self.n)
            for i in range(0, self.n - self.batch + 1, self.batch):
                yield self._make(order[i:i + self.batch])

    def _make(self, idx: Array) -> tuple[Array, Array]:
        if self.tokens is not None:
            t = self.tokens[idx]
            return t[:, :-1].astype(np.int32), t[:, 1:].astype(np.int32)
        xs = []
        for i in idx:
            img = resize_nearest(self.images[i], self.size).astype(np.float32) / 255.0
            img = (img - self.mean) / self.std
            if self.rng.random() < 0.5:
                img = img[:, ::-1]
            xs.append(img.transpose(2, 0, 1) if self.channels_first else img)
        return np.ascontiguousarray(np.stack(xs), np.float32), self.labels[idx].astype(np.int32)
