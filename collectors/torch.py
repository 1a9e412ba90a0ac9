"""The PyTorch collector: trains a model under torch.profiler and writes a Kineto chrome trace.

One training step is four ``record_function`` markers, ``opprof.load`` (next batch from the
DataLoader, copy to the device), ``opprof.forward`` (model + loss), ``opprof.backward``
(``loss.backward()``) and ``opprof.update`` (``optimizer.step()`` + ``zero_grad()``); the
step markers are torch's own ``ProfilerStep#N`` from ``prof.step()``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset

from opprof.errors import OpprofError

from . import Progress, RecordConfig, Recording, native_stderr_to, no_progress
from .datasets import channel_stats, load_images, resize_nearest
from .torch_models import INPUT_SIZE, build, canonical_name, layer_counts

TRACE_NAME = "rank0.pt.trace.json"
KEY_AVERAGES_NAME = "rank0.key_averages.json"
PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")


class ImageDataset(Dataset):
    """uint8 NHWC images → normalized float CHW tensors, with a seeded random horizontal flip.

    The work is done per sample in ``__getitem__`` (resize, convert, normalize, flip), so data
    loading is real work that the profiler sees inside ``opprof.load``.
    """

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, *, size: int, seed: int = 0
    ) -> None:
        self.images, self.labels, self.size = images, labels, size
        mean, std = channel_stats(images)
        self.mean = torch.from_numpy(mean).view(3, 1, 1)
        self.std = torch.from_numpy(std).view(3, 1, 1)
        self.rng = np.random.default_rng(seed)  # flips: seeded, and no torch ops of their own

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img = resize_nearest(self.images[index], self.size)
        x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)
        x = x.sub_(self.mean).div_(self.std)
        if self.rng.random() < 0.5:
            x = x.flip(-1)
        return x, int(self.labels[index])


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Train ``config.model`` under torch.profiler; write the chrome trace into ``workdir``."""
    _check(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    device = torch.device(config.device)
    deadline = time.monotonic() + config.timeout_s

    torch.manual_seed(config.seed)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    images, labels, classes = load_images(
        config.dataset, n=max(config.batch_size * 8, 256), seed=config.seed
    )
    loader = DataLoader(
        ImageDataset(images, labels, size=size, seed=config.seed),
        batch_size=config.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=0,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.seed),
    )
    model = build(key, classes).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = _stepper(_cycle(loader), model, nn.CrossEntropyLoss(), optimizer, device)

    def check_time(stage: str, done: int) -> None:
        if time.monotonic() > deadline:
            raise OpprofError(
                f"torch recording ran past its {config.timeout_s:g}s limit during {stage} "
                f"(step {done}); use fewer --steps, a smaller --batch-size or model"
            )

    progress("warmup", 0, config.warmup)
    for i in range(config.warmup):
        step()
        progress("warmup", i + 1, config.warmup)
        check_time("warmup", i + 1)
    _sync(device)

    progress("timing", 0, config.timing_steps)
    times = []
    for i in range(config.timing_steps):
        t = time.perf_counter_ns()
        step()
        _sync(device)
        times.append(time.perf_counter_ns() - t)
        progress("timing", i + 1, config.timing_steps)
        check_time("timing", i + 1)
    step_ns = int(sum(times) / len(times)) if times else None

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # One profiler warm-up step, then config.steps recorded ones; repeat=1 matters: with the
    # default repeat=0 the schedule starts a new cycle after the last prof.step() and the
    # exported trace comes out empty.
    plan = schedule(wait=0, warmup=1, active=config.steps, repeat=1)
    progress("profile", 0, config.steps)
    t0 = t1 = 0
    with native_stderr_to(workdir / "profiler.log"), \
            profile(activities=activities, record_shapes=True, schedule=plan) as prof:
        for i in range(config.steps + 1):
            if i == 1:
                t0 = time.perf_counter_ns()
            step()
            if i == config.steps:
                _sync(device)
                t1 = time.perf_counter_ns()
            prof.step()
            if i:
                progress("profile", i, config.steps)
            check_time("profile", i)

    trace_path = workdir / TRACE_NAME
    prof.export_chrome_trace(str(trace_path))
    averages = _key_averages(prof, device)
    (workdir / KEY_AVERAGES_NAME).write_text(json.dumps(averages, indent=1) + "\n")
    markers = sum(a["count"] for a in averages if a["name"].startswith("ProfilerStep"))
    if markers != config.steps:
        raise OpprofError(
            f"torch.profiler {torch.__version__} recorded {markers} ProfilerStep markers "
            f"instead of {config.steps}; this torch version's schedule is not supported"
        )

    counts = layer_counts(model)
    meta: dict[str, Any] = {
        "framework": "torch",
        "framework_version": torch.__version__,
        "model": key,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "workers": 1,
        "servers": 0,
        "mode": "single",
        "device": device.type,
        "hosts": [socket.gethostname()],
        "warmup_steps": config.warmup,
        "timing_steps": config.timing_steps,
        "profiled_steps": config.steps,
        "unprofiled_step_ns": step_ns,
        "samples_per_s": config.batch_size / (step_ns / 1e9) if step_ns else None,
        "params": counts["params"],
        "layers": {k: v for k, v in counts.items() if k != "params"},
        "input_size": size,
        "num_classes": classes,
        "seed": config.seed,
        "threads": torch.get_num_threads(),
        "profiled_wall_ns": t1 - t0,
        "command": config.command,
    }
    if device.type == "cuda":
        meta["gpus"] = [torch.cuda.get_device_name(device)]
    return Recording(native=[trace_path], meta=meta)


def _check(config: RecordConfig) -> None:
    if config.workers > 1 or config.mode != "single":
        raise OpprofError(
            "torch multi-worker recording is not implemented yet "
            f"(--workers {config.workers} --mode {config.mode}); use --workers 1 --mode single"
        )
    if config.device not in ("cpu", "cuda") and not config.device.startswith("cuda:"):
        raise OpprofError(f"unknown device {config.device!r}; choose cpu or cuda")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise OpprofError(
            f"--device cuda but torch {torch.__version__} sees no CUDA GPU "
            "(CPU-only build or no driver); use --device cpu"
        )
    for name, value, low in (("batch_size", config.batch_size, 1), ("steps", config.steps, 1),
                             ("warmup", config.warmup, 0),
                             ("timing_steps", config.timing_steps, 0)):
        if value < low:
            raise OpprofError(f"{name} must be at least {low}, got {value}")


def _cycle(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from ``loader`` forever, one epoch after another."""
    while True:
        yield from loader


def _stepper(
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    model: nn.Module,
    loss_fn: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> Callable[[], None]:
    """One training step with its four phase markers, as a function of no arguments."""
    non_blocking = device.type == "cuda"

    def step() -> None:
        with record_function("opprof.load"):
            x, y = next(batches)
            x = x.to(device, non_blocking=non_blocking)
            y = y.to(device, non_blocking=non_blocking)
        with record_function("opprof.forward"):
            loss = loss_fn(model(x), y)
        with record_function("opprof.backward"):
            loss.backward()
        with record_function("opprof.update"):
            optimizer.step()
            optimizer.zero_grad()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _key_averages(prof: profile, device: torch.device) -> list[dict[str, Any]]:
    """torch's own per-name aggregate (times in µs), kept beside the trace for cross-checks."""
    rows = []
    for avg in prof.key_averages():
        row = {
            "name": avg.key,
            "count": int(avg.count),
            "cpu_time_total_us": float(avg.cpu_time_total),
            "self_cpu_time_total_us": float(avg.self_cpu_time_total),
        }
        if device.type == "cuda":
            row["device_time_total_us"] = float(getattr(avg, "device_time_total", 0.0))
        rows.append(row)
    return rows
