"""The PyTorch collector: trains a model under torch.profiler and writes a Kineto chrome trace.

One training step is four ``record_function`` markers, ``opprof.load`` (next batch from the
DataLoader, copy to the device), ``opprof.forward`` (model + loss), ``opprof.backward``
(``loss.backward()``) and ``opprof.update`` (``optimizer.step()`` + ``zero_grad()``); the
step markers are torch's own ``ProfilerStep#N`` from ``prof.step()``.

``--mode single`` trains in this process. ``--mode allreduce`` runs one process per rank with
torch.distributed (see :mod:`opprof.collectors.torch_ddp`); every rank builds its training
with :func:`build_training` (its shard of the data, the model wrapped in
DistributedDataParallel) and runs the same protocol, :func:`run_protocol`, writing
``rank{R}.pt.trace.json``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from opprof.errors import OpprofError

from . import Progress, RecordConfig, Recording, native_stderr_to, no_progress
from .datasets import channel_stats, load_images, resize_nearest
from .torch_models import INPUT_SIZE, build, canonical_name, layer_counts

PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")
SUPPORTED_MODES = ("single", "allreduce")


def trace_name(rank: int) -> str:
    """The chrome trace of ``rank``."""
    return f"rank{rank}.pt.trace.json"


def key_averages_name(rank: int) -> str:
    """torch's own aggregate (``key_averages()``) of ``rank``."""
    return f"rank{rank}.key_averages.json"


TRACE_NAME = trace_name(0)
KEY_AVERAGES_NAME = key_averages_name(0)


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


@dataclass
class Training:
    """One rank's training set-up: ``step()`` runs one marked training step."""

    step: Callable[[], None]
    model: nn.Module
    model_key: str
    input_size: int
    num_classes: int


@dataclass
class ProtocolRun:
    """What :func:`run_protocol` measured and wrote."""

    trace: Path
    unprofiled_step_ns: int | None
    profiled_wall_ns: int


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Train ``config.model`` under torch.profiler; write the chrome trace(s) into ``workdir``."""
    check(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if config.mode == "allreduce":
        from .torch_ddp import record as record_ddp

        return record_ddp(config, workdir, progress)
    device = torch.device(config.device)
    deadline = time.monotonic() + config.timeout_s
    if config.threads:
        torch.set_num_threads(config.threads)
    training = build_training(config, device)
    run = run_protocol(config, training.step, device, workdir, progress, deadline=deadline)
    meta = rank_meta(config, training, run, device)
    meta.update({"workers": 1, "servers": 0, "mode": "single",
                 "hosts": [socket.gethostname()], "command": config.command,
                 "samples_per_s": (config.batch_size / (run.unprofiled_step_ns / 1e9)
                                   if run.unprofiled_step_ns else None)})
    return Recording(native=[run.trace], meta=meta)


def check(config: RecordConfig) -> None:
    """Reject what this collector cannot record, with one clear line."""
    if config.mode not in SUPPORTED_MODES:
        raise OpprofError(
            f"torch has no --mode {config.mode} (no parameter-server mode: torch's own "
            "distributed training is all-reduce, DistributedDataParallel); use --mode allreduce")
    if config.mode == "single" and config.workers != 1:
        raise OpprofError("--mode single runs one worker; use --mode allreduce")
    if config.device not in ("cpu", "cuda") and not config.device.startswith("cuda:"):
        raise OpprofError(f"unknown device {config.device!r}; choose cpu or cuda")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise OpprofError(
            f"--device cuda but torch {torch.__version__} sees no CUDA GPU "
            "(CPU-only build or no driver); use --device cpu"
        )
    for name, value, low in (("batch_size", config.batch_size, 1), ("steps", config.steps, 1),
                             ("warmup", config.warmup, 0), ("workers", config.workers, 1),
                             ("timing_steps", config.timing_steps, 0)):
        if value < low:
            raise OpprofError(f"{name} must be at least {low}, got {value}")


def build_training(config: RecordConfig, device: torch.device, *, rank: int = 0,
                   world: int = 1) -> Training:
    """Data loader (shard ``rank`` of ``world``), model (in DistributedDataParallel when
    ``world > 1``; the process group must be initialised), loss and optimizer."""
    torch.manual_seed(config.seed)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    per_rank = max(config.batch_size * 8, 256)
    images, labels, classes = load_images(config.dataset, n=per_rank * world, seed=config.seed)
    dataset = ImageDataset(images, labels, size=size, seed=config.seed + rank)
    if world > 1:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=config.seed, drop_last=True)
        loader = DataLoader(dataset, batch_size=config.batch_size, sampler=sampler,
                            drop_last=True, num_workers=0, pin_memory=device.type == "cuda")
    else:
        loader = DataLoader(
            dataset, batch_size=config.batch_size, shuffle=True, drop_last=True,
            num_workers=0, pin_memory=device.type == "cuda",
            generator=torch.Generator().manual_seed(config.seed),
        )
    model = build(key, classes).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trained: nn.Module = model
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        trained = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    step = _stepper(_cycle(loader), trained, nn.CrossEntropyLoss(), optimizer, device)
    return Training(step, model, key, size, classes)


def run_protocol(
    config: RecordConfig,
    step: Callable[[], None],
    device: torch.device,
    workdir: Path,
    progress: Progress = no_progress,
    *,
    rank: int = 0,
    deadline: float | None = None,
    before_profile: Callable[[], None] | None = None,
) -> ProtocolRun:
    """Warm-up, unprofiled timed steps, then ``config.steps`` profiled steps; writes
    ``rank{R}.pt.trace.json`` and ``rank{R}.key_averages.json`` into ``workdir``.
    ``before_profile`` runs just before the profiler starts (e.g. a barrier)."""
    deadline = deadline if deadline is not None else time.monotonic() + config.timeout_s

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

    if before_profile is not None:
        before_profile()
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

    trace_path = workdir / trace_name(rank)
    prof.export_chrome_trace(str(trace_path))
    averages = _key_averages(prof, device)
    (workdir / key_averages_name(rank)).write_text(json.dumps(averages, indent=1) + "\n")
    markers = sum(a["count"] for a in averages if a["name"].startswith("ProfilerStep"))
    if markers != config.steps:
        raise OpprofError(
            f"torch.profiler {torch.__version__} recorded {markers} ProfilerStep markers "
            f"instead of {config.steps}; this torch version's schedule is not supported"
        )
    return ProtocolRun(trace_path, step_ns, t1 - t0)


def rank_meta(config: RecordConfig, training: Training, run: ProtocolRun,
              device: torch.device) -> dict[str, Any]:
    """The run's facts as one rank saw them (the job-level keys are added by the caller)."""
    counts = layer_counts(training.model)
    meta: dict[str, Any] = {
        "framework": "torch",
        "framework_version": torch.__version__,
        "model": training.model_key,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "device": device.type,
        "warmup_steps": config.warmup,
        "timing_steps": config.timing_steps,
        "profiled_steps": config.steps,
        "unprofiled_step_ns": run.unprofiled_step_ns,
        "params": counts["params"],
        "layers": {k: v for k, v in counts.items() if k != "params"},
        "input_size": training.input_size,
        "num_classes": training.num_classes,
        "seed": config.seed,
        "threads": torch.get_num_threads(),
        "profiled_wall_ns": run.profiled_wall_ns,
    }
    if device.type == "cuda":
        meta["gpus"] = [torch.cuda.get_device_name(device)]
    return meta


def _cycle(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from ``loader`` forever, one epoch after another (a new shuffle each epoch)."""
    epoch = 0
    while True:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


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
