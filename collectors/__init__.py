"""Collectors: build a model and data, train under a framework's native profiler, write native
traces. A collector never analyzes: it returns the native files and the run's metadata, and
the matching normalizer turns them into a Trace.

Every collector module offers ``record(config, workdir, progress) -> Recording`` and follows
one protocol: ``config.warmup`` unprofiled warm-up steps, then ``config.timing_steps``
unprofiled timed steps (their mean is ``meta["unprofiled_step_ns"]``, so the profiler's own
overhead is known), then ``config.steps`` profiled steps with phase markers around load /
forward / backward / update.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opprof.errors import OpprofError

FRAMEWORKS = ("torch", "tf", "mxnet")
MODELS = ("lenet5", "alexnet", "resnet18", "resnet50")
MODES = ("single", "allreduce", "ps-sync", "ps-async")

#: progress(stage, done, total): called as the run advances ("warmup", "timing", "profile").
Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """A Progress that shows nothing."""


@dataclass
class RecordConfig:
    """What to record: one framework, model, data set and cluster shape."""

    fw: str
    model: str
    dataset: str = "synthetic-cifar10"
    batch_size: int = 32
    steps: int = 5
    warmup: int = 2
    timing_steps: int = 3
    workers: int = 1
    servers: int = 1
    mode: str = "single"
    device: str = "cpu"
    seed: int = 0
    command: str = ""
    timeout_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Compute threads per worker (torch/OpenMP threads, TF intra- and inter-op threads);
    #: None: each collector's default.
    threads: int | None = None


@dataclass
class Recording:
    """What a collector produced: native trace files (or folders) and the run's metadata."""

    native: list[Path]
    meta: dict[str, Any]


def collector(fw: str) -> Any:
    """The collector module for a framework, with a clear error when it is not installed."""
    if fw not in FRAMEWORKS:
        raise OpprofError(f"unknown framework {fw!r}; choose from {', '.join(FRAMEWORKS)}")
    module = {"torch": "torch", "tf": "tf", "mxnet": "mxnet"}[fw]
    try:
        return importlib.import_module(f"opprof.collectors.{module}")
    except ModuleNotFoundError as exc:
        raise OpprofError(
            f"--fw {fw} needs {exc.name}, which is not installed: "
            f"pip install -e '.[{fw}]' -c constraints.txt"
        ) from None


@contextmanager
def native_stderr_to(log: Path) -> Iterator[None]:
    """Send what native libraries write to file descriptor 2 (profiler start/stop banners,
    runtime logs) to ``log`` instead of the user's terminal, for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
