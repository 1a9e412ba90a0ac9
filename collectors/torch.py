"""The PyTorch adapter: torch.profiler (Kineto) calls for the runner, the built-in models'
training step, the clock sync between ranks, and the optimizer-step hook of `opprof run`.

Importing this module imports no torch; torch is imported when one of its functions runs.

**Profiler.** Started at the runner's profile boundary with the schedule ``wait=0, warmup=1,
active=steps, repeat=1`` (one step to settle, then the recorded ones); every later boundary is
``prof.step()``, so the step markers are torch's own ``ProfilerStep#N`` (N = 1 … steps). The
trace is ``rankR.pt.trace.json`` (R: the rank); with ``profile_memory`` (the default) it holds
the allocator's ``[memory]`` events too; torch's own aggregate ``rankR.key_averages.json``
is beside it for cross-checks. ``repeat=1`` matters: with the
default the schedule starts a new cycle and the exported trace comes out empty.

**Built-in models** (`record`): one step is four ``record_function`` markers,
``opprof.load`` (next batch from the DataLoader, copy to the device), ``opprof.forward``
(model + loss), ``opprof.backward`` and ``opprof.update`` (``optimizer.step()`` +
``zero_grad()``). Several ranks are started by torchrun (``python -m torch.distributed.run``);
each joins the process group from torchrun's environment (gloo on CPU, nccl on GPU), trains
its shard (DistributedSampler) in DistributedDataParallel (``--mode allreduce``), in DDP with
``ZeroRedundancyOptimizer`` (``zero``) or sharded by FSDP2's ``fully_shard`` (``fsdp``: each
residual block or parameter layer a unit, then the root), and runs the same protocol.

**Clock alignment.** Ranks on different hosts read different clocks. Just before profiling,
each rank r > 0 exchanges ``CLOCK_ROUNDS`` NTP-style pings with rank 0 over gloo: r sends at
t0 (its clock), rank 0 receives at t1 and replies at t2 (rank 0's clock), r receives the reply
at t3. Whatever the one-way delays, the offset θ = clock₀ − clock_r lies in
[t2 − t3, t1 − t0]; the estimate is the midpoint of the round with the smallest round-trip
delay δ = (t3 − t0) − (t2 − t1), and its error bound is δ / 2 (strict as long as the clocks do
not drift apart during the round; drift over the profiled seconds is not corrected). Ranks on
rank 0's machine (same kernel boot id, the very same clock) get offset 0 and error 0; the
measured value is kept as a check. Policy (``Rendezvous.clock_sync``): ``auto`` (that rule),
``always`` (apply the measured offsets), ``off``. The offset goes into each trace file as a
top-level ``opprofClock`` object, which the Kineto normalizer applies, and into the metadata.

**Hook** (`opprof run`): the end of ``Optimizer.step`` marks the end of a step — of the
first optimizer that steps (a GAN's second optimizer does not count twice). torch's global
optimizer step post hook would be the natural place, but it runs inside the
``Optimizer.step#…`` profiler range, so a step marker started there would nest inside the
previous step's optimizer operator; the hook wraps ``Optimizer.profile_hook_step`` (what
torch wraps every optimizer's ``step`` with) and falls back to the post hook without it.
A closure given to the step (``optimizer.step(closure)``: Lightning's automatic optimization
runs ``training_step`` and ``backward()`` in it, LBFGS calls it several times) is called inside
a range of its own, ``opprof.closure#<optimizer>`` (:data:`CLOSURE`), so that the reader
takes its forward and backward out of the ``Optimizer.step#…`` range
(:mod:`opprof.normalizers.closures`); its result and exceptions are the closure's.
Keras 3 on the torch backend (``KERAS_BACKEND=torch``) steps with its own optimizers: there the
end of ``BaseOptimizer.apply`` ends a step (:func:`install_keras_hook`).

**Exit** (`opprof run`): a process that stepped lets torch's own threads finish before the
interpreter shuts down (:func:`let_threads_finish`). Since torch 2.x every ``backward()`` puts a
Python object into the thread-local state that a collective launched during it (DDP's bucket
all-reduce) copies; gloo's worker thread drops that work — and the object — only after
``wait()`` has returned, and needs the GIL to do it. A script that ends within the interpreter's
switch interval of its last all-reduce (``destroy_process_group()``, a print, exit) starts
finalizing first, and the worker thread, woken into a finalizing interpreter, aborts the
process ("terminate called without an active exception", SIGABRT) after all its work is done:
a torch race at exit (pytorch/pytorch#190489) that profiling makes more likely on a busy machine.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypedDict, TypeVar

import numpy as np

from opprof.collectors.config import (
    INPUT_SIZE,
    SEQUENCE_MODELS,
    ClockSync,
    Framework,
    Mode,
    Protocol,
    RecordConfig,
    Role,
    canonical_name,
    learning_rate,
)
from opprof.collectors.convergence import image_convergence, token_convergence, token_data
from opprof.collectors.datasets import TOKEN_VOCAB, channel_stats, load_images, resize_nearest
from opprof.collectors.runner import Convergence, LossLog, Runner, drive
from opprof.errors import OpprofError
from opprof.files import atomic_path, write_atomic
from opprof.kinds import MODEL_PARALLEL_MODES

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch._dynamo.types import DynamoCallback
    from torch.distributed import ProcessGroup
    from torch.optim import Optimizer
    from torch.profiler import profile as Profile
    from torch.utils.data import DataLoader
    from typing_extensions import NotRequired

    from opprof.arrays import Array

    #: A batch on the device: inputs and targets.
    Batch = tuple[torch.Tensor, torch.Tensor]

P = ParamSpec("P")
R = TypeVar("R")
#: A function opprof wraps around a user's call (an optimizer step, ``backward()``).
F = TypeVar("F", bound=Callable[..., object])

CLOCK_ROUNDS = 10
CLOCK_METHOD = (f"NTP-style: {CLOCK_ROUNDS} ping rounds from each rank to rank 0 over gloo "
                "just before profiling; midpoint of the min-delay round, error = delay/2; "
                "offset 0 for ranks on rank 0's machine")
PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")
#: The profiler range around Keras 3's optimizer apply on the torch backend.
KERAS_APPLY = "keras.optimizer.apply"


def trace_name(rank: int) -> str:
    """The chrome trace of ``rank``."""
    return f"rank{rank}.pt.trace.json"


def key_averages_name(rank: int) -> str:
    """torch's own aggregate (``key_averages()``) of ``rank``."""
    return f"rank{rank}.key_averages.json"


# ------------------------------------------------------------------ the adapter


class TorchAdapter:
    """torch.profiler for the runner (see the module docstring)."""

    framework = Framework.TORCH
    profiler_warmup = 1
    #: the first step after the profile is not timed: it ran 1.56x the steps before it (the
    #: median over 81 workers' records on this host; the later ones 1.00x) — the profiler's
    #: teardown, not the machine's load, which the timing after the profile is there to see
    settle_after = 1

    def __init__(self, steps: int, device: str = "cpu", clock_policy: str = "auto",
                 facts: dict[str, Any] | None = None, profile_memory: bool = True) -> None:
        import torch

        self.torch = torch
        self.steps, self.clock_policy = steps, clock_policy
        self.profile_memory = profile_memory
        self.device = torch.device(device)
        self._facts = dict(facts or {})
        self.prof: Profile | None = None
        self.trace: Path | None = None
        self.clock: ClockSync | None = None  # synced before profiling (several ranks)

    def version(self) -> str:
        return str(self.torch.__version__)

    def _dist(self) -> ModuleType | None:
        dist = self.torch.distributed
        return dist if dist.is_available() and dist.is_initialized() else None

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def identity(self) -> tuple[Role, int | None]:
        dist = self._dist()
        return Role.WORKER, (dist.get_rank() if dist else None)

    def before_profile(self) -> dict[str, Any]:
        dist = self._dist()
        if dist is None or dist.get_world_size() < 2:
            return {}
        group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        self.clock = clock_sync(dist.get_rank(), dist.get_world_size(), group,
                                self.clock_policy)
        dist.barrier()
        return {"clock": self.clock, "backend": dist.get_backend(),
                "world_size": dist.get_world_size()}

    def start(self, folder: Path, role: Role, rank: int) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.trace = trace = Path(folder) / trace_name(rank)
        self.prof = profile(activities=activities, record_shapes=True,
                            profile_memory=self.profile_memory,
                            schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1))
        with quiet(trace.parent):
            self.prof.start()

    def boundary(self, index: int) -> None:
        assert self.prof is not None and self.trace is not None  # (begun)
        if index == 1:  # the profiler starts recording (and announces it on stderr)
            with quiet(self.trace.parent):
                self.prof.step()
        else:
            self.prof.step()

    def stop(self, complete: bool) -> list[Path]:
        prof, trace = self.prof, self.trace
        assert prof is not None and trace is not None
        with quiet(trace.parent):
            prof.stop()
        with atomic_path(trace) as tmp:  # a process killed while exporting leaves no half
            prof.export_chrome_trace(str(tmp))
            if not complete:
                # The step in progress did not finish: its marker is renamed, so that it is
                # not taken for a step.
                cut = f'"ProfilerStep#{prof.step_num}"'.encode()
                tmp.write_bytes(tmp.read_bytes().replace(
                    cut, f'"opprof.incomplete_step#{prof.step_num}"'.encode()))
        if self.clock is not None:
            stamp_clock(trace, {"offset_ns": self.clock["offset_ns"],
                                "error_ns": self.clock["error_ns"]})
        if not complete:  # cut short (a signal, a failure): no time for the check below
            return [trace]
        averages = _key_averages(prof, self.device)
        write_atomic(trace.with_name(trace.name.replace(".pt.trace.json", ".key_averages.json")),
                     json.dumps(averages, indent=1) + "\n")
        markers = sum(a["count"] for a in averages
                      if a["name"].startswith("ProfilerStep") and "device_type" not in a
                      and a["cpu_time_total_us"] > 0)
        if markers != self.steps:
            raise OpprofError(
                f"torch.profiler {self.torch.__version__} recorded {markers} ProfilerStep "
                f"markers instead of {self.steps}; this torch version's schedule is not "
                "supported")
        return [trace]

    def after_profile(self) -> None:
        dist = self._dist()
        if dist is not None and dist.get_world_size() > 1:
            dist.barrier()  # no rank tears the group down while another still exports

    def release(self) -> None:
        self.prof = None

    def facts(self) -> dict[str, Any]:
        out = {**self._facts, "threads": self.torch.get_num_threads(),
               "device": self.device.type}
        if self.device.type == "cuda":
            out["gpus"] = [self.torch.cuda.get_device_name(self.device)]
        return out


def param_bytes(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the trainable parameters (each counted once): elements × element size."""
    seen: set[int] = set()
    total = 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return int(total)


@contextmanager
def quiet(folder: Path) -> Iterator[None]:
    """Send what native code writes to file descriptor 2 (Kineto's ``profiler_start`` /
    ``profiler_stop`` banners) to ``folder/profiler.log`` for the duration of the block, so
    it does not land in the user's terminal (the block is one profiler call)."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(Path(folder) / "profiler.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class KeyAverage(TypedDict):
    """One name of torch's own aggregate (``key_averages()``), times in µs."""

    name: str
    count: int
    cpu_time_total_us: float
    self_cpu_time_total_us: float
    device_time_total_us: NotRequired[float]  # on a GPU
    device_type: NotRequired[str]  # a row of the device's own events (e.g. "cuda"): the
    # GPU side of a ``record_function`` range, such as the ``ProfilerStep*`` that Kineto
    # writes beside the CPU one when it traces CUDA


def _key_averages(prof: Profile, device: torch.device) -> list[KeyAverage]:
    """torch's own per-name aggregate (times in µs), kept beside the trace for cross-checks."""
    rows = []
    for avg in prof.key_averages():
        row: KeyAverage = {"name": avg.key, "count": int(avg.count),
                           "cpu_time_total_us": float(avg.cpu_time_total),
                           "self_cpu_time_total_us": float(avg.self_cpu_time_total)}
        if device.type == "cuda":
            row["device_time_total_us"] = float(getattr(avg, "device_time_total", 0.0))
        kind = str(getattr(avg, "device_type", "CPU")).rsplit(".", 1)[-1]
        if kind != "CPU":
            row["device_type"] = kind.lower()
        rows.append(row)
    return rows


# ------------------------------------------------------------------ clocks


def machine_id() -> str:
    """What identifies this machine's clock: the kernel's boot id (containers on one host
    share it), else the host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def clock_sync(rank: int, world: int, group: ProcessGroup | None,
               policy: str = "auto") -> ClockSync:
    """Estimate this rank's clock offset to rank 0 (see the module docstring) and decide the
    offset to apply. Every rank must call it."""
    import torch
    import torch.distributed as dist

    machines: list[str | None] = [None] * world
    dist.all_gather_object(machines, machine_id(), group=group)
    measured, error = 0, 0
    if rank == 0:
        for peer in range(1, world):
            for _ in range(CLOCK_ROUNDS):
                dist.recv(torch.zeros(1, dtype=torch.int64), src=peer, group=group)
                t1 = time.time_ns()
                dist.send(torch.tensor([t1, time.time_ns()], dtype=torch.int64), dst=peer,
                          group=group)
    else:
        best = None
        for _ in range(CLOCK_ROUNDS):
            reply = torch.zeros(2, dtype=torch.int64)
            t0 = time.time_ns()
            dist.send(torch.zeros(1, dtype=torch.int64), dst=0, group=group)
            dist.recv(reply, src=0, group=group)
            t3 = time.time_ns()
            t1, t2 = (int(v) for v in reply)
            delay = (t3 - t0) - (t2 - t1)
            if best is None or delay < best[0]:
                best = (delay, ((t1 - t0) + (t2 - t3)) // 2)
        assert best is not None
        error, measured = (best[0] + 1) // 2, best[1]
    same = machines[rank] == machines[0]
    apply = policy == "always" or (policy == "auto" and not same)
    return {"offset_ns": measured if apply else 0, "error_ns": error if apply else 0,
            "measured_offset_ns": measured, "measured_error_ns": error,
            "machine": str(machines[rank]), "same_machine_as_rank0": same, "policy": policy,
            "method": CLOCK_METHOD}


def stamp_clock(trace: Path, clock: dict[str, int]) -> None:
    """Put the clock offset into the trace file as a top-level ``opprofClock`` object (the
    file is otherwise untouched; no parse of the whole document)."""
    data = trace.read_bytes()
    i = data.index(b"{")
    head = b'{"opprofClock": ' + json.dumps(clock).encode() + b","
    write_atomic(trace, head + data[i + 1:])


# ------------------------------------------------------------------ the built-in models


class ImageDataset:
    """uint8 NHWC images → normalized float CHW tensors, with a seeded random horizontal flip.

    The work is done per sample in ``__getitem__`` (resize, convert, normalize, flip), so data
    loading is real work that the profiler sees inside ``opprof.load``.
    """

    def __init__(self, images: Array, labels: Array, *, size: int,
                 seed: int = 0) -> None:
        import torch

        self.images, self.labels, self.size = images, labels, size
        mean, std = channel_stats(images)
        self.mean = torch.from_numpy(mean).view(3, 1, 1)
        self.std = torch.from_numpy(std).view(3, 1, 1)
        self.rng = np.random.default_rng(seed)  # flips: seeded, and no torch ops of their own

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import torch

        img = resize_nearest(self.images[index], self.size)
        x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)
        x = x.sub_(self.mean).div_(self.std)
        if self.rng.random() < 0.5:
            x = x.flip(-1)
        return x, int(self.labels[index])


def build_training(config: RecordConfig, device: torch.device, *, rank: int = 0,
                   world: int = 1) -> tuple[Callable[[], torch.Tensor], dict[str, Any],
                                            Convergence[torch.Tensor] | None]:
    """The marked training step of rank ``rank`` of ``world`` (its shard of the data, the
    model parallelized by ``config.mode`` when ``world > 1``, :func:`parallelize`; the process
    group must exist), the model's facts (``unit_param_bytes``: what each FSDP unit gathers,
    recorded in every mode so that a 1-worker trace can be modelled as FSDP), and with
    ``--converge`` its :class:`Convergence` (the step returns its loss, detached)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from opprof.collectors import torch_parallel
    from opprof.collectors.torch_models import (
        TokenCrossEntropy,
        build,
        layer_counts,
        unit_param_bytes,
    )

    torch.manual_seed(config.seed)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    per_rank = max(config.batch_size * 8, 256)
    model_parallel = world > 1 and config.mode in MODEL_PARALLEL_MODES
    if model_parallel:  # the batches: the same on the ranks that split one model
        world, rank = torch_parallel.data_replicas(config.mode, rank, world)
    if key in SEQUENCE_MODELS:
        tokens = token_data(config, per_rank * world)
        images, classes = tokens, TOKEN_VOCAB
        dataset: Any = TensorDataset(torch.from_numpy(tokens[:, :-1]),
                                     torch.from_numpy(tokens[:, 1:]))
    else:
        images, labels, classes = load_images(config.dataset, n=per_rank * world,
                                              seed=config.seed)
        dataset = ImageDataset(images, labels, size=size, seed=config.seed + rank)
    pin = device.type == "cuda"
    sampler: DistributedSampler[Any] | None = None
    # --loader-workers: worker processes that load ahead, kept across epochs
    n = config.loader_workers
    more: dict[str, Any] = {"num_workers": n, "persistent_workers": n > 0}
    if world > 1 or model_parallel:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=config.seed, drop_last=True)
        loader = DataLoader(dataset, batch_size=config.batch_size, sampler=sampler,
                            drop_last=True, pin_memory=pin, **more)
    else:
        loader = DataLoader(dataset, batch_size=config.batch_size, shuffle=True,
                            drop_last=True, pin_memory=pin,
                            generator=torch.Generator().manual_seed(config.seed), **more)
    if model_parallel:
        import torch.distributed as dist

        model = torch_parallel.build_model(key, classes, config.mode,
                                           dist.get_world_size()).to(device)
    else:
        model = build(key, classes).to(device)
    model.train()
    counts = layer_counts(model)
    facts = {"model": key, "dataset": config.dataset, "batch_size": config.batch_size,
             "params": counts.pop("params"), "param_bytes": param_bytes(model.parameters()),
             "layers": counts, "input_size": size, "unit_param_bytes": unit_param_bytes(model),
             "num_classes": classes, "seed": config.seed, "loader_workers": n}
    if config.bucket_mb is not None:
        facts["bucket_mb"] = config.bucket_mb
    if not model_parallel:
        trained, optimizer = parallelize(model, Mode(config.mode) if world > 1 else Mode.SINGLE,
                                         device, learning_rate(key), config.bucket_mb)

    def predict(x: Array) -> Array:
        was = model.training
        model.eval()
        with torch.no_grad():
            tensor = torch.from_numpy(x)
            if key not in SEQUENCE_MODELS:
                tensor = tensor.permute(0, 3, 1, 2)
            out: Array = model(tensor.to(device)).cpu().numpy()
        model.train(was)
        return out

    def loss_of(loss: torch.Tensor) -> float:
        return float(loss.item())

    convergence: Convergence[torch.Tensor] | None
    if key in SEQUENCE_MODELS:
        convergence = token_convergence(config, tokens, predict=predict, loss=loss_of)
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = TokenCrossEntropy()
    else:
        mean, std = channel_stats(images)
        convergence = image_convergence(config, images, labels, size=size, mean=mean,
                                        std=std, predict=predict, loss=loss_of)
        loss_fn = nn.CrossEntropyLoss()
    if model_parallel:
        step, _ = torch_parallel.training_step(config.mode, key, model, _cycle(loader), loss_fn,
                                               device, learning_rate(key), config.batch_size)
        facts["microbatches"] = (torch_parallel.microbatches(config.batch_size)
                                 if config.mode == Mode.PP else None)
        return step, facts, None
    step = _stepper(_cycle(loader), trained, loss_fn, optimizer, device)
    return step, facts, convergence


def parallelize(model: nn.Module, mode: Mode, device: torch.device,
                lr: float = 0.01, bucket_mb: float | None = None) -> tuple[nn.Module, Optimizer]:
    """(the module to train, its optimizer: SGD with momentum at ``lr``) for ``mode``: the
    model itself (one worker); in DistributedDataParallel (``allreduce``; ``bucket_mb``: its
    ``bucket_cap_mb``, None: DDP's own); DDP with the optimizer state sharded by
    ``ZeroRedundancyOptimizer`` (``zero``); FSDP2, ``fully_shard`` on every unit of
    :func:`~.torch_models.shard_units` and then on the root (``fsdp``)."""
    import torch
    from torch import nn

    from opprof.collectors.torch_models import shard_units

    momentum = 0.9
    ids = [device.index] if device.type == "cuda" else None
    ddp: dict[str, Any] = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
    if mode == Mode.FSDP:
        from torch.distributed.fsdp import fully_shard

        for unit in shard_units(model):
            fully_shard(unit)
        fully_shard(model)
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    if mode == Mode.ZERO:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zero = nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp)
        return zero, ZeroRedundancyOptimizer(zero.parameters(), optimizer_class=torch.optim.SGD,
                                             lr=lr, momentum=momentum)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    if mode == Mode.ALLREDUCE:
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp), optimizer
    return model, optimizer


def _cycle(loader: DataLoader[Batch]) -> Iterator[Batch]:
    """Batches from ``loader`` forever, one epoch after another (a new shuffle each epoch)."""
    from torch.utils.data import DistributedSampler

    epoch = 0
    while True:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _stepper(batches: Iterator[Batch], model: nn.Module,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             optimizer: Optimizer, device: torch.device) -> Callable[[], torch.Tensor]:
    """One training step with its four phase markers, as a function of no arguments that
    returns the step's loss (detached: read it after the step)."""
    from torch.profiler import record_function

    non_blocking = device.type == "cuda"

    def step() -> torch.Tensor:
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
            return loss.detach()  # (inside: the loss kept for --converge is the step's)

    return step


def record_worker(config: RecordConfig, folder: Path) -> None:
    """One process of `record --fw torch`: alone, or one of torchrun's ranks."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = config.device == "cuda"
    if cuda:
        device = torch.device(f"cuda:{local % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=timedelta(seconds=max(config.timeout_s, 1.0)))
    if config.threads:
        torch.set_num_threads(config.threads)
    step, facts, convergence = build_training(config, device, rank=rank, world=world)
    adapter = TorchAdapter(config.steps, str(device), config.rendezvous.clock_sync, facts,
                           profile_memory=config.profile_memory)
    drive(Runner(adapter, config.protocol, folder, extra=facts), step, convergence)
    if world > 1:
        dist.destroy_process_group()


# ------------------------------------------------------------------ the hook of `opprof run`


@dataclass
class _Counting:
    """What the step hook of one process keeps: its runner, the optimizer it counts (its
    id), whether it gave up (another runner took the process)."""

    runner: Runner | None = None
    optimizer: int | None = None
    off: bool = False


def _step_counter(protocol: Protocol, folder: Path, started: Callable[[Runner], bool]
                  ) -> Callable[[object, list[torch.Tensor]], None]:
    """``on_step(optimizer, params)``: the end of one step of the first optimizer that steps
    in this process (its runner is made then, from the parameters it updates); the loss of
    each step is kept unless ``OPPROF_LOSS=0`` (:func:`hook_loss`)."""
    state = _Counting()
    log = hook_loss() if os.environ.get(LOSS_ENV, "1") != "0" else None

    def on_step(optimizer: object, params: list[torch.Tensor]) -> None:
        if state.off:
            return
        runner = state.runner
        if runner is None or runner.facts.pid != os.getpid():
            state.optimizer = id(optimizer)
            device = "cuda" if any(p.is_cuda for p in params) else "cpu"
            facts = {"params": int(sum(p.numel() for p in params)),
                     "param_bytes": param_bytes(params), "optimizer": type(optimizer).__name__}
            runner = state.runner = Runner(
                TorchAdapter(protocol.steps, device, facts=facts,
                             profile_memory=protocol.profile_memory), protocol, folder,
                extra=facts)
            if not started(runner):
                state.off = True
                return
            atexit.register(let_threads_finish)  # after opprof's own exit handler
            runner.loss_log = log
        elif id(optimizer) != state.optimizer:
            return
        if log is not None:
            log.step_end(runner.profiling)
        runner.step_or_give_up()

    return on_step


def install_hook(protocol: Protocol, folder: Path,
                 started: Callable[[Runner], bool]) -> None:
    """Count steps at the end of every ``Optimizer.step`` (torch.optim is being imported)."""
    import functools

    from torch.optim import optimizer as module
    from torch.profiler import record_function

    depth = [0]  # optimizer steps in progress (one wrapping another counts once)
    on_step = _step_counter(protocol, folder, started)

    def after_optimizer_step(optimizer: Optimizer) -> None:
        on_step(optimizer, [p for g in optimizer.param_groups for p in g["params"]])

    original = getattr(module.Optimizer, "profile_hook_step", None)
    if original is None:  # an older or newer torch: its global post hook (inside the step)
        module.register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: after_optimizer_step(optimizer))
        return

    # The step ends when ``Optimizer.step`` has returned: torch's own post hooks run inside
    # its ``Optimizer.step#…`` profiler range, and a step marker started there would nest in
    # the previous step's optimizer operator. So the step function torch wraps every
    # optimizer class's ``step`` with is wrapped once more.
    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        hooked = original(func)

        @functools.wraps(hooked)
        def step(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                if _under_dynamo():  # torch's own range is dropped from the traced step
                    with record_function(f"Optimizer.step#{type(args[0]).__name__}.step"):
                        out = hooked(*args, **kwargs)
                else:
                    if depth[0] == 1:  # the closure's forward and backward: not the step's
                        args, kwargs = _marked_closure(args, kwargs)
                    out = hooked(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # an optimizer wrapping another counts once
                _outside_dynamo(after_optimizer_step, args[0])
            return out

        return _eager_under_dynamo(step)

    module.Optimizer.profile_hook_step = staticmethod(  # type: ignore[method-assign]  # torch's
        profile_hook_step)


#: The profiler range opprof puts around each call of the closure an optimizer step is given
#: (``optimizer.step(closure)``: Lightning's automatic optimization, LBFGS): ``opprof.closure#``
#: and the optimizer's class. What runs inside is the closure's (its forward and backward), not
#: the optimizer's (:mod:`opprof.normalizers.closures`).
CLOSURE = "opprof.closure#"


def _marked_closure(args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of ``Optimizer.step(self, closure=None)`` with the closure, if any, called
    inside a profiler range of its own (:data:`CLOSURE`); its result and exceptions unchanged."""
    from torch.profiler import record_function

    given = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1
                                                                  else None)
    if not callable(given):
        return args, kwargs
    name = f"{CLOSURE}{type(args[0]).__name__}"

    def closure(*a: Any, **kw: Any) -> Any:
        with record_function(name):
            return given(*a, **kw)

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


def install_keras_hook(protocol: Protocol, folder: Path,
                       started: Callable[[Runner], bool]) -> None:
    """Count steps at the end of Keras 3's ``BaseOptimizer.apply`` on the torch backend (what
    ``fit``'s ``train_step`` calls after ``loss.backward()``); the apply is recorded as
    ``keras.optimizer.apply#<optimizer>`` (``weights_update``, maps/kineto.csv), since
    Keras's torch optimizers update the weights with ``torch._foreach_*`` calls of their own,
    outside ``torch.optim``."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from torch.profiler import record_function

    depth = [0]  # applies in progress (one wrapping another counts once)
    on_step = _step_counter(protocol, folder, started)
    original = BaseOptimizer.apply

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        depth[0] += 1
        try:
            with record_function(f"{KERAS_APPLY}#{type(self).__name__}"):
                result = original(self, grads, trainable_variables)
        finally:
            depth[0] -= 1
        if depth[0] == 0:  # an optimizer wrapping another (LossScaleOptimizer): once
            variables = (trainable_variables if trainable_variables is not None
                         else getattr(self, "_trainable_variables", None) or [])
            _outside_dynamo(on_step, self, [getattr(v, "value", v) for v in variables])
        return result

    apply.__doc__ = original.__doc__
    apply.__wrapped__ = original  # type: ignore[attr-defined]
    _eager_under_dynamo(apply)
    BaseOptimizer.apply = apply


#: ``0``: `opprof run` does not keep the loss of each step.
LOSS_ENV = "OPPROF_LOSS"


@functools.cache  # one wrapper per process, whichever of the step hooks asks first
def hook_loss() -> LossLog[torch.Tensor]:
    """Keep the scalar every ``Tensor.backward()`` / ``torch.autograd.backward()`` of one
    element runs on (detached; the last of a step is the step's loss), for the
    :class:`LossLog` of `opprof run`. Under AMP's GradScaler that is the scaled loss."""
    import torch
    import torch.autograd

    def read(values: list[torch.Tensor]) -> list[float]:
        floats: list[float] = torch.stack([v.reshape(()).float() for v in values]).cpu().tolist()
        return floats

    log = LossLog(read)
    autograd_backward = torch.autograd.backward

    # Tensor.backward() calls torch.autograd.backward (looked up at each call): one wrapper
    # sees both.
    @functools.wraps(autograd_backward)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensors, torch.Tensor) and tensors.requires_grad and tensors.numel() == 1:
            value = _loss_value(tensors.detach())
            if value is not None:  # a list is no one loss: skipped
                _outside_dynamo(log.seen, value)
        return autograd_backward(tensors, *args, **kwargs)

    torch.autograd.backward = _eager_under_dynamo(backward)
    return log


def _loss_value(loss: torch.Tensor) -> torch.Tensor | None:
    """The loss as a plain tensor: a DTensor's local tensor where every rank holds the whole
    value (replicated, as ``loss_parallel``'s cross-entropy returns it); None for a partial or
    sharded DTensor, whose value only a collective would give (none is added to the step)."""
    to_local = getattr(loss, "to_local", None)
    if to_local is None:
        return loss
    placements = getattr(loss, "placements", ())
    return to_local() if all(p.is_replicate() for p in placements) else None


def _eager_under_dynamo(fn: F) -> F:
    """``fn`` (a hook around a user's optimizer step or ``backward()``), which Dynamo never
    traces: inside a ``torch.compile``'d function it runs as it does in eager code (a profiler
    range of its own, the step counted) instead of being traced, where each of its Python
    calls would break the user's graph. Called from a compiled function, the call is where
    Dynamo breaks the graph anyway (torch's optimizer breaks around its step, ``backward()``
    is not traced), and the user's code it calls in turn is compiled as before; opprof's own
    bookkeeping there runs :func:`_outside_dynamo`. What ``torch._dynamo.skip`` does, without
    importing Dynamo (seconds) for eager jobs."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
        # its frames run as they are, and those of the helpers it calls first
        for code in (fn.__code__, _under_dynamo.__code__, _outside_dynamo.__code__,
                     _frame_api.__wrapped__.__code__):
            set_code_exec_strategy(code, skip)
    except (ImportError, AttributeError, TypeError):  # a torch with another Dynamo: as before
        return fn
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]  # never inlined
    return fn


@functools.cache
def _frame_api() -> tuple[Callable[[], DynamoCallback],
                          Callable[[DynamoCallback], DynamoCallback]] | None:
    """torch's C functions that read and set the frame evaluation callback (Dynamo's, while
    a compiled function runs); None for a torch without them."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback, set_eval_frame
    except ImportError:
        return None
    return get_eval_frame_callback, set_eval_frame


def _under_dynamo() -> bool:
    """Whether Dynamo processes the frames called from here (a compiled function's call):
    the profiler ranges they open are dropped from the traced code."""
    api = _frame_api()
    return api is not None and api[0]() not in (None, False)


def _outside_dynamo(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args)`` with Dynamo leaving alone every frame it runs (opprof's bookkeeping,
    called from a hook inside a compiled function: Dynamo would compile the runner), as
    ``torch._dynamo.disable`` does; in eager code a plain call (a fraction of a µs more)."""
    api = _frame_api()
    if api is None or api[0]() in (None, False):
        return fn(*args, **kwargs)
    prior = api[1](None)
    try:
        return fn(*args, **kwargs)
    finally:
        api[1](prior)


def let_threads_finish(limit_s: float = 0.2, slice_s: float = 0.002) -> float:
    """Give the process's other threads the GIL and the CPU until none of them is runnable
    (Linux: each thread's state in ``/proc/self/task``), for at most ``limit_s``; returns the
    seconds waited. Run at exit, before the interpreter finalizes (see the module docstring)."""
    began = time.monotonic()
    me = str(threading.get_native_id())
    quiet_slices = 0
    while time.monotonic() - began < limit_s:
        time.sleep(slice_s)  # releases the GIL: a thread waiting for it takes it now
        runnable = _runnable_threads(me)
        if runnable is None:  # no /proc: one slice is what can be done
            break
        quiet_slices = quiet_slices + 1 if not runnable else 0
        if quiet_slices >= 2:
            break
    return time.monotonic() - began


def _runnable_threads(me: str) -> int | None:
    """How many threads of this process other than ``me`` are running or ready to run; None
    where ``/proc/self/task`` cannot be read."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for tid in tasks:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rindex(b")") + 2:][:1] == b"R":
            count += 1
    return count

