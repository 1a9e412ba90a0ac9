"""The MXNet collector: trains a Gluon model under MXNet's profiler and writes its chrome-trace
JSON plus MXNet's own aggregate table (``mx.profiler.dumps()``) beside it.

``--mode single`` trains in this process; ``ps-sync`` / ``ps-async`` start a parameter-server
job (scheduler, servers, workers as separate processes, see :mod:`opprof.collectors.mxnet_ps`)
whose workers run :func:`run_worker` below with a ``dist_sync`` / ``dist_async`` kvstore.

Per worker rank R the files are ``rankR_worker.json`` (the trace), ``rankR_worker.dumps.txt``
(the aggregate, the check on the trace) and ``rankR_worker.meta`` (JSON: the run's and the
rank's facts, read back by the normalizer when the folder is imported; not named ``.json``
so that importing the folder finds only traces). Servers write ``rankK_server.json``. The
names carry role and rank for the normalizer.

One step is four profiler Tasks in the ``opprof`` domain — ``opprof.load`` (next batch from the
Gluon DataLoader), ``opprof.forward`` (model + loss under ``autograd.record``),
``opprof.backward`` and ``opprof.update`` (``trainer.step``: the optimizer locally, or push
gradients / pull weights through the kvstore) — inside one Frame ``opprof.step#N``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from opprof.collectors import Progress, RecordConfig, Recording, no_progress
from opprof.collectors._mxnet_shim import import_mxnet
from opprof.collectors.datasets import channel_stats, load_images, resize_nearest
from opprof.collectors.mxnet_models import (
    INPUT_SIZE,
    build,
    canonical_name,
    initializer,
    layer_counts,
)
from opprof.errors import OpprofError

mx = import_mxnet()
autograd, gluon, nd = mx.autograd, mx.gluon, mx.nd

PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")
DOMAIN = "opprof"
PS_MODES = {"ps-sync": "dist_sync", "ps-async": "dist_async"}
SERVER_TRACE = "server.json"  # MXNet's server K writes it as rankK_server.json in its cwd


def trace_name(rank: int) -> str:
    """The trace file of worker ``rank``."""
    return f"rank{rank}_worker.json"


def dumps_name(rank: int) -> str:
    """MXNet's aggregate table (``mx.profiler.dumps()``) of worker ``rank``."""
    return f"rank{rank}_worker.dumps.txt"


def meta_name(rank: int) -> str:
    """The per-rank facts (JSON) of worker ``rank``."""
    return f"rank{rank}_worker.meta"


class ImageDataset(gluon.data.Dataset):
    """uint8 NHWC images → normalized float32 CHW arrays, with a seeded random horizontal flip.

    The work is done per sample in ``__getitem__`` (resize, convert, normalize, flip), so data
    loading is real work that the profiler sees inside ``opprof.load``.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, size: int, seed: int) -> None:
        self.images, self.labels, self.size = images, labels.astype(np.float32), size
        mean, std = channel_stats(images)
        self.mean, self.std = mean.reshape(1, 1, 3), std.reshape(1, 1, 3)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.float32]:
        img = resize_nearest(self.images[index], self.size).astype(np.float32) / 255.0
        img = (img - self.mean) / self.std
        if self.rng.random() < 0.5:
            img = img[:, ::-1]
        return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32), self.labels[index]


class EpochSampler(gluon.data.Sampler):
    """A new seeded permutation of ``range(n)`` every epoch (no global random state)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Train ``config.model`` under MXNet's profiler; write the native files into ``workdir``."""
    check(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if config.mode in PS_MODES:
        from opprof.collectors import mxnet_ps

        return mxnet_ps.record(config, workdir, progress)
    deadline = time.monotonic() + config.timeout_s
    result = run_worker(config, workdir, progress=progress, deadline=deadline)
    return Recording(native=[workdir / trace_name(0)], meta=job_meta(config, [result]))


def check(config: RecordConfig) -> None:
    """Reject what this collector cannot record, with one clear line."""
    if config.mode not in ("single", *PS_MODES):
        raise OpprofError(
            f"mxnet has no --mode {config.mode} (MXNet's own distributed training is the "
            "parameter server); use --mode ps-sync or ps-async")
    if config.mode == "single" and (config.workers != 1 or config.extra.get("nnodes", 1) > 1):
        raise OpprofError("--mode single runs one worker on one machine; use --mode ps-sync "
                          "or ps-async")
    if config.device != "cpu":
        if not config.device.startswith("cuda"):
            raise OpprofError(f"unknown device {config.device!r}; choose cpu or cuda")
        raise OpprofError(
            f"--device {config.device}: this opprof MXNet collector records CPU training "
            f"only (MXNet {mx.__version__}, {mx.context.num_gpus()} GPUs visible); "
            "use --device cpu")
    for name, value, low in (("batch_size", config.batch_size, 1), ("steps", config.steps, 1),
                             ("warmup", config.warmup, 0), ("workers", config.workers, 1),
                             ("timing_steps", config.timing_steps, 0),
                             ("servers", config.servers, 1)):
        if value < low:
            raise OpprofError(f"{name} must be at least {low}, got {value}")


def run_worker(
    config: RecordConfig,
    workdir: Path,
    *,
    kv: Any = None,
    progress: Progress = no_progress,
    deadline: float | None = None,
) -> dict[str, Any]:
    """One worker's whole protocol: warm-up, unprofiled timing, profiled steps; writes this
    rank's trace, aggregate and facts into ``workdir`` and returns the facts.

    ``kv`` is the dist kvstore of a parameter-server job (None: train alone). Each worker
    trains on its own shard of the data set (shard ``kv.rank`` of ``kv.num_workers``).
    """
    workdir = Path(workdir)
    rank, world = (kv.rank, kv.num_workers) if kv is not None else (0, 1)
    deadline = deadline if deadline is not None else time.monotonic() + config.timeout_s
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    per_worker = max(config.batch_size * 8, 256)
    images, labels, classes = load_images(config.dataset, n=per_worker * world, seed=config.seed)
    shard = slice(rank * per_worker, (rank + 1) * per_worker)
    dataset = ImageDataset(images[shard], labels[shard], size=size, seed=config.seed * 1000 + rank)
    loader = gluon.data.DataLoader(
        dataset, batch_size=config.batch_size, last_batch="discard", num_workers=0,
        sampler=EpochSampler(len(dataset), config.seed * 1000 + rank))

    mx.random.seed(config.seed)
    ctx = mx.cpu()
    net = build(key, classes)
    net.initialize(initializer(), ctx=ctx)
    # In a PS job the kvstore keeps the weights and the servers run the optimizer
    # (update_on_kvstore, the only choice MXNet allows for dist_async): ``opprof.update``
    # on a worker is pushing gradients and pulling weights.
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)
    # dist_sync servers sum the gradients of all workers before the update.
    scale = config.batch_size * (world if kv is not None and "sync" in kv.type else 1)
    step = _stepper(_cycle(loader), net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, scale)

    def check_time(stage: str, done: int) -> None:
        if time.monotonic() > deadline:
            raise OpprofError(
                f"mxnet recording ran past its {config.timeout_s:g}s limit during {stage} "
                f"(step {done}); use fewer --steps, a smaller --batch-size or model")

    progress("warmup", 0, config.warmup)
    for i in range(config.warmup):
        step(None)
        progress("warmup", i + 1, config.warmup)
        check_time("warmup", i + 1)

    progress("timing", 0, config.timing_steps)
    times = []
    for i in range(config.timing_steps):
        t = time.perf_counter_ns()
        step(None)
        times.append(time.perf_counter_ns() - t)
        progress("timing", i + 1, config.timing_steps)
        check_time("timing", i + 1)
    step_ns = int(sum(times) / len(times)) if times else None

    trace_path = workdir / trace_name(rank)
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=str(trace_path))
    profile_servers = kv is not None and rank == 0 and config.servers > 0
    if profile_servers:
        # MXNet forwards this configuration to every server; server K writes
        # rankK_<filename> in its own working directory (the launcher sets it to workdir).
        mx.profiler.set_kvstore_handle(kv.handle)
        mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=SERVER_TRACE,
                               profile_process="server")
        mx.profiler.set_state("run", profile_process="server")
    if kv is not None:
        kv._barrier()  # all workers start (and, below, stop) profiling together
    progress("profile", 0, config.steps)
    mx.profiler.set_state("run")
    t0 = time.perf_counter_ns()
    for i in range(config.steps):
        step(i)
        progress("profile", i + 1, config.steps)
        check_time("profile", i + 1)
    t1 = time.perf_counter_ns()
    mx.profiler.set_state("stop")
    (workdir / dumps_name(rank)).write_text(mx.profiler.dumps())
    mx.profiler.dump()
    if kv is not None:
        kv._barrier()
    if profile_servers:
        mx.profiler.set_state("stop", profile_process="server")
        mx.profiler.dump(profile_process="server")
    if not trace_path.is_file():
        raise OpprofError(f"{trace_path}: MXNet {mx.__version__} wrote no profiler trace")

    counts = layer_counts(net)
    param_bytes = sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
                      for p in net.collect_params().values() if p.grad_req != "null")
    facts: dict[str, Any] = {
        "framework": "mxnet",
        "framework_version": mx.__version__,
        "model": key,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "mode": config.mode,
        "profiled_steps": config.steps,
        "rank": rank,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "kvstore": kv.type if kv is not None else None,
        "unprofiled_step_ns": step_ns,
        "profiled_wall_ns": t1 - t0,
        "params": counts["params"],
        "param_bytes": param_bytes,
        "layers": {k: v for k, v in counts.items() if k != "params"},
        "input_size": size,
        "num_classes": classes,
        "threads": int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count(),
    }
    (workdir / meta_name(rank)).write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def job_meta(config: RecordConfig, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's metadata from the facts every worker rank wrote."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    first = ranks[0]
    per_rank = [r["unprofiled_step_ns"] for r in ranks if r["unprofiled_step_ns"]]
    step_ns = int(sum(per_rank) / len(per_rank)) if per_rank else None
    workers = len(ranks)
    ps = config.mode in PS_MODES
    meta: dict[str, Any] = {
        "framework": "mxnet",
        "framework_version": mx.__version__,
        "model": canonical_name(config.model),
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "workers": workers,
        "servers": config.servers if ps else 0,
        "mode": config.mode,
        "kvstore": first["kvstore"],
        "device": "cpu",
        "hosts": sorted({r["host"] for r in ranks}),
        "warmup_steps": config.warmup,
        "timing_steps": config.timing_steps,
        "profiled_steps": config.steps,
        "unprofiled_step_ns": step_ns,
        "unprofiled_step_ns_per_rank": {str(r["rank"]): r["unprofiled_step_ns"] for r in ranks},
        "samples_per_s": workers * config.batch_size / (step_ns / 1e9) if step_ns else None,
        "params": first["params"],
        "layers": first["layers"],
        "input_size": first["input_size"],
        "num_classes": first["num_classes"],
        "seed": config.seed,
        "threads": first["threads"],
        "profiled_wall_ns": max(r["profiled_wall_ns"] for r in ranks),
        "rank_pids": {str(r["rank"]): r["pid"] for r in ranks},
        "command": config.command,
    }
    if ps:
        # Each worker pushes every gradient and pulls every weight once per step; MXNet's
        # trace does not say which array an operator moved, so this is per step (the
        # normalizer puts it on the step's comm windows).
        meta["comm_bytes_per_step"] = {str(r["rank"]): 2 * r["param_bytes"] for r in ranks}
    return meta


def _cycle(loader: Any) -> Iterator[tuple[Any, Any]]:
    """Batches from ``loader`` forever, one epoch after another."""
    while True:
        yield from loader


def _stepper(batches: Iterator[tuple[Any, Any]], net: Any, loss_fn: Any, trainer: Any,
             scale: int) -> Callable[[int | None], None]:
    """One training step: ``step(i)`` marks it (Frame ``opprof.step#i`` around the four phase
    Tasks), ``step(None)`` runs it unmarked."""
    domain = mx.profiler.Domain(DOMAIN)
    tasks = [mx.profiler.Task(domain, name) for name in PHASES]
    state: dict[str, Any] = {}

    def load() -> None:
        state["x"], state["y"] = next(batches)

    def forward() -> None:
        with autograd.record():
            state["loss"] = loss_fn(net(state["x"]), state["y"])

    def backward() -> None:
        state["loss"].backward()

    def update() -> None:
        trainer.step(scale)

    def step(index: int | None) -> None:
        # Tasks record even while the profiler is stopped, so unprofiled steps use none.
        marks = index is not None
        frame = mx.profiler.Frame(domain, f"opprof.step#{index}") if marks else None
        if frame is not None:
            frame.start()
        # MXNet's engine runs operators asynchronously: without a wait at each phase boundary
        # the work of one phase would run (and be timed) inside the next. The research's
        # methodology attributes every operator to its own phase, so each phase ends with
        # nd.waitall(), and the phases' times add up to the step's.
        for task, work in zip(tasks, (load, forward, backward, update), strict=True):
            if marks:
                task.start()
            work()
            nd.waitall()
            if marks:
                task.stop()
        if frame is not None:
            frame.stop()

    return step
