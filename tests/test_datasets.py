"""Framework-neutral data: synthetic CIFAR-10 and local CIFAR python-batches folders."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from opprof.collectors.datasets import channel_stats, load_images, resize_nearest
from opprof.errors import OpprofError


def _chw_batch(count: int, start: int) -> np.ndarray:
    """``count`` CIFAR rows (N×3072, CHW row-major) where channel c of image i is c*50+start+i."""
    data = np.empty((count, 3, 32, 32), dtype=np.uint8)
    for i in range(count):
        for c in range(3):
            data[i, c] = c * 50 + start + i
    return data.reshape(count, 3072)


def _write(path: Path, data: np.ndarray, **labels: list[int]) -> None:
    batch = {b"data": data, **{k.encode(): v for k, v in labels.items()}}
    path.write_bytes(pickle.dumps(batch))


def _fake_cifar10(folder: Path) -> Path:
    folder.mkdir(parents=True)
    _write(folder / "data_batch_1", _chw_batch(4, 0), labels=[0, 1, 2, 3])
    _write(folder / "data_batch_2", _chw_batch(3, 4), labels=[4, 5, 6])
    _write(folder / "test_batch", _chw_batch(2, 20), labels=[9, 8])
    return folder


def _fake_cifar100(folder: Path) -> Path:
    folder.mkdir(parents=True)
    _write(folder / "train", _chw_batch(5, 0), fine_labels=[10, 20, 30, 40, 99],
           coarse_labels=[1, 2, 3, 4, 5])
    _write(folder / "test", _chw_batch(2, 30), fine_labels=[7, 77], coarse_labels=[0, 0])
    return folder


def test_synthetic_shape_dtype_labels() -> None:
    images, labels, classes = load_images("synthetic-cifar10", n=100)
    assert images.shape == (100, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (100,) and labels.dtype == np.int64
    assert classes == 10
    assert labels.min() >= 0 and labels.max() < 10
    assert np.bincount(labels, minlength=10).tolist() == [10] * 10


def test_synthetic_is_deterministic() -> None:
    a, la, _ = load_images("synthetic-cifar10", n=50, seed=3)
    b, lb, _ = load_images("synthetic-cifar10", n=50, seed=3)
    c, _, _ = load_images("synthetic-cifar10", n=50, seed=4)
    t, _, _ = load_images("synthetic-cifar10", n=50, seed=3, train=False)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, t)


def test_synthetic_has_class_structure() -> None:
    x, y, _ = load_images("synthetic-cifar10", n=500, seed=0)
    xt, yt, _ = load_images("synthetic-cifar10", n=200, seed=0, train=False)
    flat = x.reshape(len(x), -1).astype(np.float64)
    centroids = np.stack([flat[y == k].mean(0) for k in range(10)])
    d = ((xt.reshape(len(xt), 1, -1) - centroids[None]) ** 2).sum(-1)
    assert (d.argmin(1) == yt).mean() > 0.5  # far above chance (0.1): not pure noise


def test_cifar10_folder_as_path_and_cycling(tmp_path: Path) -> None:
    folder = _fake_cifar10(tmp_path / "cifar-10-batches-py")
    images, labels, classes = load_images(str(folder), n=9)
    assert classes == 10 and images.shape == (9, 32, 32, 3)
    assert labels.tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1]  # 7 images, then from the start
    for i, k in enumerate([0, 1, 2, 3, 4, 5, 6, 0, 1]):
        for c in range(3):  # CHW rows became HWC pixels
            assert (images[i, :, :, c] == c * 50 + k).all()
    test, test_labels, _ = load_images(str(folder), n=2, train=False)
    assert test_labels.tolist() == [9, 8] and test[0, 0, 0].tolist() == [20, 70, 120]


def test_cifar10_parent_folder_as_path(tmp_path: Path) -> None:
    _fake_cifar10(tmp_path / "cifar-10-batches-py")
    _, labels, classes = load_images(str(tmp_path), n=3)
    assert classes == 10 and labels.tolist() == [0, 1, 2]


def test_cifar10_and_cifar100_from_data_root(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPPROF_DATA", str(tmp_path))
    _fake_cifar10(tmp_path / "cifar-10-batches-py")
    _fake_cifar100(tmp_path / "cifar-100-python")
    _, labels, classes = load_images("cifar10", n=5)
    assert classes == 10 and labels.tolist() == [0, 1, 2, 3, 4]
    images, labels, classes = load_images("cifar100", n=6)
    assert classes == 100 and labels.tolist() == [10, 20, 30, 40, 99, 10]
    assert images[4, 5, 7].tolist() == [4, 54, 104]
    _, labels, _ = load_images("cifar100", n=2, train=False)
    assert labels.tolist() == [7, 77]


def test_cifar100_folder_as_path(tmp_path: Path) -> None:
    folder = _fake_cifar100(tmp_path / "mine")
    _, labels, classes = load_images(str(folder), n=2)
    assert classes == 100 and labels.tolist() == [10, 20]


def test_missing_cifar_names_the_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPPROF_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(OpprofError) as err:
        load_images("cifar10", n=4)
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in message
    assert "never downloads" in message and "synthetic-cifar10" in message
    assert "\n" not in message
    with pytest.raises(OpprofError, match="cifar-100-python"):
        load_images("cifar100", n=4)


def test_missing_or_wrong_path(tmp_path: Path) -> None:
    with pytest.raises(OpprofError, match="never downloads"):
        load_images(str(tmp_path / "absent"), n=4)
    (tmp_path / "junk").mkdir()
    with pytest.raises(OpprofError, match="not a CIFAR python-batches folder"):
        load_images(str(tmp_path / "junk"), n=4)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(OpprofError, match="not a CIFAR python batch"):
        load_images(str(tmp_path / "bad"), n=4)


def test_resize_nearest() -> None:
    images, _, _ = load_images("synthetic-cifar10", n=2)
    big = resize_nearest(images, 64)
    assert big.shape == (2, 64, 64, 3) and big.dtype == np.uint8
    assert np.array_equal(big, images.repeat(2, axis=1).repeat(2, axis=2))
    assert resize_nearest(images[0], 64).shape == (64, 64, 3)
    assert resize_nearest(images, 32) is images
    assert np.array_equal(resize_nearest(big, 32), images)


def test_channel_stats() -> None:
    images, _, _ = load_images("synthetic-cifar10", n=20)
    mean, std = channel_stats(images)
    assert mean.shape == std.shape == (3,)
    assert ((mean > 0) & (mean < 1)).all() and (std > 0).all()


def test_synthetic_tokens_follow_a_learnable_chain() -> None:
    from opprof.collectors.datasets import (
        TOKEN_VOCAB,
        chain_entropy,
        synthetic_tokens,
        token_chain,
    )

    train = synthetic_tokens(200, 32, seed=1)
    assert train.shape == (200, 33) and train.dtype == np.int64
    assert train.min() >= 0 and train.max() < TOKEN_VOCAB
    assert np.array_equal(train, synthetic_tokens(200, 32, seed=1))
    test = synthetic_tokens(200, 32, seed=1, train=False)
    assert not np.array_equal(train, test)
    # the transitions drawn are the chain's: its counts match the matrix, and knowing the
    # previous token beats the uniform guess by far (the loss a model can reach)
    chain = token_chain()
    counts = np.zeros_like(chain)
    np.add.at(counts, (train[:, :-1].ravel(), train[:, 1:].ravel()), 1)
    seen = counts.sum(axis=1) > 50
    empirical = counts[seen] / counts[seen].sum(axis=1, keepdims=True)
    assert np.abs(empirical - chain[seen]).max() < 0.2
    assert chain_entropy() < 0.5 * np.log(TOKEN_VOCAB)
