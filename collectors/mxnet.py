"""The MXNet adapter: MXNet's profiler for the runner, the built-in models' Gluon training
step, the parameter-server roles, and the ``gluon.Trainer`` hook of `opprof run`.

Importing this module imports no MXNet; :func:`.mxnet_lib.import_mxnet` does, when a function
runs (it restores ``np.bool`` first: MXNet 1.9 still uses the alias numpy 1.24 removed).

**Profiler.** At the runner's profile boundary (without memory: ``--no-profile-memory``
turns ``profile_all`` into everything but ``profile_memory``): ``set_config(profile_all=True,
aggregate_stats=True)`` with the trace ``rankR_worker.json`` (R: the worker's rank) and
``set_state("run")``; each step is a Frame ``opprof.step#N`` in the ``opprof`` domain, from
one step boundary to the next. MXNet's engine runs operators asynchronously, so every step
boundary from the timing steps on waits for the queued work (``nd.waitall()``): a step's
operators are timed and profiled inside that step. At the end: ``rankR_worker.dumps.txt``
(MXNet's own aggregate table, ``mx.profiler.dumps()``, the check on the trace) and
``rankR_worker.meta`` (JSON facts the normalizer reads when the folder is imported later).

**Parameter server.** Scheduler and servers are processes with ``DMLC_ROLE`` set, and run
inside ``import mxnet`` until the job ends (MXNet's design). Worker rank 0 turns the servers'
profiler on and off through the kvstore: every server writes ``rankK_server.json`` into its
working directory (the run folder).

**Built-in models** (`record`): one step is four profiler Tasks — ``opprof.load`` (next batch
from the Gluon DataLoader), ``opprof.forward`` (model + loss under ``autograd.record``),
``opprof.backward`` and ``opprof.update`` (``trainer.step``: the optimizer locally, or push
gradients / pull weights through the kvstore) — each ended by ``nd.waitall()`` so that the
phases' times add up to the step's.

**Hooks** (`opprof run`): ``gluon.Trainer.step`` (or ``update``, for scripts that call
``allreduce_grads()`` and ``update()`` themselves) or the Module API's ``Module.update``
(``fit``, or a loop of ``forward_backward`` and ``update``) marks the end of a step; the
first to end one is the process's. Forward and backward come from the operators
(:mod:`opprof.normalizers.events`' phase inference), as for Gluon.

**Compiled graphs**: hybridized blocks' CachedOps and a Module's executors run without bulk
execution for the profiled steps (:mod:`.mxnet_graphs`), so that their operators are seen
one by one: the profiler then starts after ``profiler_warmup`` unprofiled steps (a CachedOp
is built again, one step is timed as ``unbulked_step_ns``), and the user's own graphs come
back at the end.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from typing import Protocol as Structural

import numpy as np

from opprof.collectors.config import (
    INPUT_SIZE,
    SEQUENCE_MODELS,
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
from opprof.collectors.mxnet_graphs import StaticGraphs, track_blocks
from opprof.collectors.mxnet_lib import import_mxnet as import_mxnet  # (also its old home)
from opprof.collectors.runner import Convergence, LossLog, Runner, drive
from opprof.files import write_atomic

DOMAIN = "opprof"
PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")
KVSTORE = {Mode.PS_SYNC: "dist_sync", Mode.PS_ASYNC: "dist_async"}
SERVER_TRACE = "server.json"  # MXNet's server K writes it as rankK_server.json in its cwd
RUN_SERVER_TRACE = "opprof-server.json"  # the same under `opprof run` (the user's cwd)


def trace_name(rank: int) -> str:
    """The trace file of worker ``rank``."""
    return f"rank{rank}_worker.json"


def dumps_name(rank: int) -> str:
    """MXNet's aggregate table (``mx.profiler.dumps()``) of worker ``rank``."""
    return f"rank{rank}_worker.dumps.txt"


def meta_name(rank: int) -> str:
    """The per-rank facts (JSON) of worker ``rank``; not ``.json``, so that importing the
    folder finds only traces."""
    return f"rank{rank}_worker.meta"


# ------------------------------------------------------------------ the adapter


class MXNetAdapter:
    """MXNet's profiler for the runner (see the module docstring)."""

    framework = Framework.MXNET
    profiler_warmup = 0

    def __init__(self, kv: Any = None, *, profile_servers: bool = False,
                 server_trace: str = SERVER_TRACE, facts: dict[str, Any] | None = None,
                 profile_memory: bool = True, graphs: StaticGraphs | None = None) -> None:
        self.mx = import_mxnet()
        self.graphs = graphs
        self.settle_after = 0
        self.profiler_warmup = 0
        self._unbulked_from = 0
        self.kv, self.profile_servers, self.server_trace = kv, profile_servers, server_trace
        self.profile_memory = profile_memory
        self._facts = dict(facts or {})
        self.domain = self.mx.profiler.Domain(DOMAIN)
        self.frame: Any = None
        self.profiling = False
        self.trace: Path | None = None
        self.rank = 0
        #: The network's nodes with their shapes (collectors.mxnet_shapes), for the operators'
        #: FLOPs; None: the hybridized blocks' cached graphs, where there are any.
        self.graph_nodes: list[dict[str, Any]] | None = None

    def version(self) -> str:
        return str(self.mx.__version__)

    def sync(self) -> None:
        self.mx.nd.waitall()

    def identity(self) -> tuple[Role, int | None]:
        return Role.WORKER, (self.kv.rank if self._dist else None)

    @property
    def _dist(self) -> bool:
        return self.kv is not None and "dist" in str(self.kv.type)

    def before_profile(self) -> dict[str, Any]:
        if not self._dist:
            return {}
        # Every worker has pushed its last unprofiled step before the servers' profiler is
        # switched on, and none pushes a profiled one before the switch was sent.
        self.kv._barrier()
        if self.profile_servers and self.kv.rank == 0:
            # MXNet forwards this configuration to every server; server K writes
            # rankK_<filename> in its own working directory.
            prof = self.mx.profiler
            prof.set_kvstore_handle(self.kv.handle)
            prof.set_config(**self._what(), aggregate_stats=True,
                            filename=self.server_trace, profile_process="server")
            prof.set_state("run", profile_process="server")
        self.kv._barrier()  # all workers start (and, at the end, stop) profiling together
        return {"kvstore": str(self.kv.type), "world_size": int(self.kv.num_workers)}

    def start(self, folder: Path, role: Role, rank: int) -> None:
        self.rank, self.trace = rank, Path(folder) / trace_name(rank)
        switched = self.graphs.unbulk() if self.graphs is not None else {}
        if switched:
            # Unprofiled steps before the profiler starts: a CachedOp is built again in the
            # first (Gluon), then one step runs as it will be profiled, without the profiler,
            # and is timed: what bulk execution off costs by itself.
            self._facts["graphs"] = switched["switched"]
            assert self.graphs is not None  # (it switched something)
            self.profiler_warmup = 1 + self.graphs.rebuilds
            self._unbulked_from = time.perf_counter_ns() if self.profiler_warmup == 1 else 0
            return
        self._start_profiler()

    def _start_profiler(self) -> None:
        self.mx.profiler.set_config(**self._what(), aggregate_stats=True,
                                    filename=str(self.trace))
        self.mx.profiler.set_state("run")
        self.profiling = True
        self._open(0)

    def _what(self) -> dict[str, bool]:
        """What the profiler records: everything (``profile_all``, which includes the storage
        allocator's ``Device Storage`` counters), or everything but memory."""
        if self.profile_memory:
            return {"profile_all": True}
        return {"profile_symbolic": True, "profile_imperative": True, "profile_api": True,
                "profile_memory": False}

    def _open(self, index: int) -> None:
        self.frame = self.mx.profiler.Frame(self.domain, f"opprof.step#{index}")
        self.frame.start()

    def boundary(self, index: int) -> None:
        if not self.profiling:
            now = time.perf_counter_ns()  # the runner waited for the engine: the step is done
            if index == self.profiler_warmup - 1:
                self._unbulked_from = now
            elif index == self.profiler_warmup:
                self._facts["unbulked_step_ns"] = now - self._unbulked_from
                self._start_profiler()
            return
        self.frame.stop()
        self._open(index - self.profiler_warmup)

    def stop(self, complete: bool) -> list[Path]:
        assert self.trace is not None
        nodes = self._nodes()  # (before the blocks' cached graphs are dropped below)
        if self.graphs is not None:
            self.graphs.restore()
            self.settle_after = self.graphs.settle_after
        if not self.profiling:  # ended before its first profiled step
            return []
        if complete:
            self.frame.stop()
        self.profiling = False
        prof = self.mx.profiler
        prof.set_state("stop")
        folder = self.trace.parent
        write_atomic(folder / dumps_name(self.rank), prof.dumps())
        prof.dump()
        facts = {**self.facts(), "framework": "mxnet", "framework_version": self.version(),
                 "rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                 "kvstore": str(self.kv.type) if self._dist else None}
        write_atomic(folder / meta_name(self.rank), json.dumps(facts, indent=1) + "\n")
        if nodes:  # the graph's nodes and shapes beside the dump, for FLOPs
            from opprof.flops.mxnet import write_nodes

            write_nodes(nodes, self.trace)
        return [self.trace] if self.trace.is_file() else []

    def _nodes(self) -> list[dict[str, Any]]:
        """The network's nodes with their shapes (opprof.collectors.mxnet_shapes): the built-in
        model's, else the hybridized blocks' cached graphs."""
        if self.graph_nodes is not None:
            return self.graph_nodes
        from opprof.collectors.mxnet_graphs import _BLOCKS
        from opprof.collectors.mxnet_shapes import block_nodes

        return block_nodes(list(_BLOCKS))

    def after_profile(self) -> None:
        if not self._dist:
            return
        self.kv._barrier()
        if self.profile_servers:
            if self.kv.rank == 0:
                self.mx.profiler.set_state("stop", profile_process="server")
                self.mx.profiler.dump(profile_process="server")
            # No worker pushes an unprofiled step before the switch was sent (an async
            # worker would otherwise push its next step while worker 0 sends it).
            self.kv._barrier()

    def facts(self) -> dict[str, Any]:
        return {**self._facts,
                "threads": int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count()}

    def release(self) -> None:
        # A kvstore freed after MXNet's own exit handler aborts the process (the graphs'
        # owner, a Trainer or a Module, holds one too).
        self.kv = self.frame = self.graphs = None


def param_facts(params: Any) -> dict[str, Any]:
    """Trainable parameter count and bytes of a Gluon ParameterDict (or list), and its arrays
    in the Trainer's key order (``param_arrays``: ``[layer, elements]`` each, the layer the
    parameter's name without its last ``_`` part: ``conv0_weight`` → ``conv0``) — a kvstore
    pushes one key per array, and MXNet's trace names neither."""
    values = params.values() if hasattr(params, "values") else params
    trained = [p for p in values if p.grad_req != "null" and p.shape]
    return {"params": int(sum(int(np.prod(p.shape)) for p in trained)),
            "param_bytes": int(sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
                                   for p in trained)),
            "param_arrays": [[str(p.name).rsplit("_", 1)[0], int(np.prod(p.shape))]
                             for p in trained]}


# ------------------------------------------------------------------ the built-in models


class ImageDataset:
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


class EpochSampler:
    """A new seeded permutation of ``range(n)`` every epoch (no global random state)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


@dataclass
class _Data:
    """One worker's shard of the built-in data: its loader, and what ``--converge`` reads."""

    loader: Any
    dataset: Any
    classes: int
    shard: slice
    tokens: Any = None
    images: Any = None
    labels: Any = None


def _data(mx: ModuleType, config: RecordConfig, rank: int, world: int) -> _Data:
    """Worker ``rank`` of ``world``'s shard of ``config``'s data set, and its loader."""
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    per_worker = max(config.batch_size * 8, 256)
    shard = slice(rank * per_worker, (rank + 1) * per_worker)
    seed = config.seed * 1000 + rank
    tokens = images = labels = None
    if key in SEQUENCE_MODELS:  # tokens as float32, MXNet's convention for indices
        tokens = token_data(config, per_worker * world)[shard]
        classes = TOKEN_VOCAB
        dataset: Any = mx.gluon.data.ArrayDataset(tokens[:, :-1].astype(np.float32),
                                                  tokens[:, 1:].astype(np.float32))
    else:
        images, labels, classes = load_images(config.dataset, n=per_worker * world,
                                              seed=config.seed)
        dataset = ImageDataset(images[shard], labels[shard], size=size, seed=seed)
    loader = mx.gluon.data.DataLoader(dataset, batch_size=config.batch_size,
                                      last_batch="discard",
                                      num_workers=config.loader_workers,
                                      sampler=EpochSampler(len(dataset), seed))
    return _Data(loader, dataset, classes, shard, tokens, images, labels)


def _network(mx: ModuleType, config: RecordConfig, classes: int) -> Any:
    """The built-in model, initialized as `record` initializes it."""
    from opprof.collectors.mxnet_models import build, initializer

    mx.random.seed(config.seed)
    net = build(canonical_name(config.model), classes)
    net.initialize(initializer(), ctx=mx.cpu())
    return net


def local_step(config: RecordConfig) -> Callable[[], Any]:
    """The training step of ``config``'s model on one worker with a local optimizer, no
    profiler (its data, model and phases as `record` builds them; each phase waited for):
    what `opprof calibrate` times alone and on several workers at once (co-location)."""
    mx = import_mxnet()
    data = _data(mx, config, 0, 1)
    net = _network(mx, config, data.classes)
    key = canonical_name(config.model)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": learning_rate(key), "momentum": 0.9})
    marks = SimpleNamespace(profiling=False, domain=mx.profiler.Domain(DOMAIN))
    return _stepper(mx, _cycle(data.loader), net, mx.gluon.loss.SoftmaxCrossEntropyLoss(),
                    trainer, config.batch_size, marks)


def record_worker(config: RecordConfig, folder: Path) -> None:
    """One process of `record --fw mxnet`: alone, a PS worker, or a server / scheduler
    (which runs inside ``import mxnet`` and never returns)."""
    role = os.environ.get("DMLC_ROLE", "")
    mx = import_mxnet()  # a server or scheduler runs the job here, then exits
    if role in ("server", "scheduler"):
        raise SystemExit(f"mxnet returned from import as a {role}; not a PS node")
    from opprof.collectors.mxnet_models import layer_counts

    kv = mx.kv.create(KVSTORE[config.mode]) if config.mode in KVSTORE else None
    rank, world = (kv.rank, kv.num_workers) if kv is not None else (0, 1)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    data = _data(mx, config, rank, world)
    dataset, loader, classes, shard = data.dataset, data.loader, data.classes, data.shard
    tokens, images, labels = data.tokens, data.images, data.labels
    net = _network(mx, config, classes)
    # In a PS job the kvstore keeps the weights and the servers run the optimizer
    # (update_on_kvstore, the only choice MXNet allows for dist_async): ``opprof.update``
    # on a worker is pushing gradients and pulling weights.
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": learning_rate(key), "momentum": 0.9}, kvstore=kv)
    # dist_sync servers sum the gradients of all workers before the update.
    scale = config.batch_size * (world if kv is not None and "sync" in kv.type else 1)
    counts = layer_counts(net)
    facts = {"model": key, "dataset": config.dataset, "batch_size": config.batch_size,
             "mode": str(config.mode), "profiled_steps": config.steps, "params": counts["params"],
             **{k: v for k, v in param_facts(net.collect_params()).items() if k != "params"},
             "layers": {k: v for k, v in counts.items() if k != "params"},
             "input_size": size, "num_classes": classes, "seed": config.seed,
             "loader_workers": config.loader_workers}
    adapter = MXNetAdapter(kv, profile_servers=kv is not None and config.servers > 0,
                           facts=facts, profile_memory=config.profile_memory)
    from opprof.collectors.mxnet_shapes import net_nodes

    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    sample, label = dataset[0]
    adapter.graph_nodes = net_nodes(mx, net, (config.batch_size, *np.shape(sample)), loss_fn,
                                    (config.batch_size, *np.shape(label)))
    step = _stepper(mx, _cycle(loader), net, loss_fn, trainer, scale, adapter)
    convergence: Convergence[Any] | None  # (a step's losses: an MXNet NDArray)
    if key in SEQUENCE_MODELS:
        convergence = token_convergence(
            config, tokens, predict=lambda x: net(mx.nd.array(x)).asnumpy(),
            loss=lambda loss: float(loss.mean().asscalar()))
    else:
        mean, std = dataset.mean.reshape(3), dataset.std.reshape(3)
        convergence = image_convergence(
            config, images[shard], labels[shard], size=size, mean=mean, std=std,
            predict=lambda x: net(mx.nd.array(x.transpose(0, 3, 1, 2))).asnumpy(),
            loss=lambda loss: float(loss.mean().asscalar()))
    drive(Runner(adapter, config.protocol, folder, extra=facts), step, convergence)


def _cycle(loader: Any) -> Iterator[tuple[Any, Any]]:
    """Batches from ``loader`` forever, one epoch after another."""
    while True:
        yield from loader


class _Marks(Structural):
    """What a step needs of its adapter: whether the profiler runs, and its domain."""

    profiling: bool
    domain: Any


def _stepper(mx: ModuleType, batches: Iterator[tuple[Any, Any]], net: Any, loss_fn: Any,
             trainer: Any, scale: int, adapter: _Marks) -> Callable[[], Any]:
    """One training step, returning its per-sample losses (read them after the step); its
    phases are Tasks while the profiler runs (Tasks record even while the profiler is
    stopped, so unprofiled steps use none)."""
    tasks = [mx.profiler.Task(adapter.domain, name) for name in PHASES]
    state = _Step()

    def load() -> None:
        state.x, state.y = next(batches)

    def forward() -> None:
        with mx.autograd.record():
            state.loss = loss_fn(net(state.x), state.y)

    def backward() -> None:
        state.loss.backward()

    def update() -> None:
        trainer.step(scale)

    def step() -> Any:
        marks = adapter.profiling
        # Without a wait at each phase boundary the work of one phase would run (and be
        # timed) inside the next: each phase ends with nd.waitall().
        for task, work in zip(tasks, (load, forward, backward, update), strict=True):
            if marks:
                task.start()
            work()
            mx.nd.waitall()
            if marks:
                task.stop()
        return state.loss

    return step


@dataclass
class _Step:
    """The arrays of the step in progress (MXNet's NDArrays), from one phase to the next."""

    x: Any = None
    y: Any = None
    loss: Any = None


# ------------------------------------------------------------------ the hooks of `opprof run`


@dataclass
class _Hooks:
    """What every hook of this process shares: the runner (one per process) and what it
    counts: the owner (a Trainer or Module, its id) whose steps count, the counted calls in
    progress (a Trainer's ``step`` calls its ``update``), which classes are hooked, the loss
    log (None: ``OPPROF_LOSS=0``; unset: not hooked yet)."""

    depth: int = 0
    hooked: set[str] = field(default_factory=set)
    runner: Runner | None = None
    owner: int | None = None
    off: bool = False
    loss_hooked: bool = False
    loss: LossLog[Any] | None = None


_HOOKS = _Hooks()


#: ``0``: `opprof run` does not keep the loss of each step.
LOSS_ENV = "OPPROF_LOSS"


def hook_loss() -> LossLog[Any]:
    """Keep the arrays every ``NDArray.backward()`` / ``autograd.backward()`` runs on
    (detached), for the :class:`LossLog` of `opprof run`; its value is their mean (a Gluon loss
    is one value per sample; ``autograd.backward([loss_0, loss_1])`` takes one per device),
    read outside the profiled steps."""
    import mxnet as mx

    def mean(v: Any) -> Any:
        if isinstance(v, tuple):
            v = mx.nd.concat(*[h.reshape((-1,)) for h in v], dim=0)
        return v.mean().reshape((1,))

    def read(values: list[Any]) -> list[float]:
        return [float(v) for v in mx.nd.stack(*[mean(v) for v in values]).asnumpy().ravel()]

    log = LossLog(read)
    nd_backward, autograd_backward = mx.nd.NDArray.backward, mx.autograd.backward

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        log.seen(self.detach())
        return nd_backward(self, *args, **kwargs)

    def autograd(heads: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(heads, mx.nd.NDArray):
            log.seen(heads.detach())
        elif (isinstance(heads, (list, tuple)) and heads
              and all(isinstance(h, mx.nd.NDArray) for h in heads)):
            log.seen(tuple(h.detach() for h in heads))  # a loss per device, or one in a list
        return autograd_backward(heads, *args, **kwargs)

    backward.__doc__, autograd.__doc__ = nd_backward.__doc__, autograd_backward.__doc__
    mx.nd.NDArray.backward = backward
    mx.autograd.backward = autograd
    return log


def install_hook(protocol: Protocol, folder: Path,
                 started: Callable[[Runner], bool]) -> None:
    """Count steps at ``gluon.Trainer.step`` / ``update`` and ``Module.update``, whichever of
    their modules has been imported (``import mxnet`` imports both); track hybridized
    blocks for the profiled steps' static graphs (:mod:`.mxnet_graphs`)."""
    import sys

    hooked = _HOOKS.hooked
    if not _HOOKS.loss_hooked:  # the loss backward() ran on, kept unless OPPROF_LOSS=0
        _HOOKS.loss_hooked = True
        _HOOKS.loss = hook_loss() if os.environ.get(LOSS_ENV, "1") != "0" else None
    if "mxnet.gluon.trainer" in sys.modules and "trainer" not in hooked:
        hooked.add("trainer")
        _hook_trainer(protocol, folder, started)
    if "mxnet.module.module" in sys.modules and "module" not in hooked:
        hooked.add("module")
        _hook_module(protocol, folder, started)


def _counted(method: Callable[..., Any], after: Callable[..., None]) -> Callable[..., Any]:
    """``method`` that calls ``after(self, *args)`` when the outermost counted call returns
    (a Trainer's ``step`` calls its ``update``; a BucketingModule's update, a Module's)."""
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        _HOOKS.depth += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _HOOKS.depth -= 1
        if _HOOKS.depth == 0:
            after(self, *args, **kwargs)
        return result

    wrapper.__wrapped__ = method  # type: ignore[attr-defined]
    wrapper.__doc__ = method.__doc__
    return wrapper


def _count(owner: Any, make: Callable[[], tuple[Any, dict[str, Any]]], protocol: Protocol,
           folder: Path, started: Callable[[Runner], bool]) -> None:
    """A step of ``owner`` (a Trainer or a Module) ended: the first one creates the runner
    (``make`` gives its kvstore and facts); steps of other owners are not counted."""
    if _HOOKS.off:
        return
    runner = _HOOKS.runner
    if runner is None or runner.facts.pid != os.getpid():
        _HOOKS.owner = id(owner)
        kv, facts = make()
        # A parameter-server job's servers are profiled too: worker 0 switches them on
        # through the kvstore, they write into their working directory, and `opprof
        # run` collects the files (they announced where they are).
        dist = kv is not None and "dist" in str(kv.type)
        adapter = MXNetAdapter(kv, profile_servers=dist, server_trace=RUN_SERVER_TRACE,
                               facts=facts, profile_memory=protocol.profile_memory,
                               graphs=StaticGraphs(owner))
        runner = _HOOKS.runner = Runner(adapter, protocol, folder, extra=facts)
        if not started(runner):
            _HOOKS.off = True
            return
        runner.loss_log = _HOOKS.loss
    elif id(owner) != _HOOKS.owner:
        return
    if _HOOKS.loss is not None:
        _HOOKS.loss.step_end(runner.profiling)
    runner.step_or_give_up()


def _hook_trainer(protocol: Protocol, folder: Path,
                  started: Callable[[Runner], bool]) -> None:
    from mxnet.gluon.block import HybridBlock
    from mxnet.gluon.trainer import Trainer  # mxnet.gluon itself is still being imported

    def after(trainer: Any, batch_size: Any = None, *rest: Any, **kwargs: Any) -> None:
        batch_size = kwargs.get("batch_size", batch_size)
        def make() -> tuple[Any, dict[str, Any]]:
            facts = {**param_facts(trainer._params),
                     "optimizer": type(trainer._optimizer).__name__}
            if isinstance(batch_size, int):
                facts["batch_size"] = batch_size
            return getattr(trainer, "_kvstore", None), facts

        _count(trainer, make, protocol, folder, started)

    Trainer.step = _counted(Trainer.step, after)
    Trainer.update = _counted(Trainer.update, after)
    track_blocks(HybridBlock)


def _hook_module(protocol: Protocol, folder: Path,
                 started: Callable[[Runner], bool]) -> None:
    """``Module.update`` ends a step (``fit``, or a loop of ``forward_backward`` and
    ``update``)."""
    from mxnet.module.module import Module

    def after(module: Any, *rest: Any, **kwargs: Any) -> None:
        def make() -> tuple[Any, dict[str, Any]]:
            group = module._exec_group
            arrays = [a[0] for a in group.param_arrays]
            facts: dict[str, Any] = {
                "params": int(sum(int(np.prod(a.shape)) for a in arrays)),
                "param_bytes": int(sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                                       for a in arrays)),
                "optimizer": type(module._optimizer).__name__,
                "batch_size": int(group.batch_size), "api": "module"}
            return module._kvstore, facts

        _count(module, make, protocol, folder, started)

    Module.update = _counted(Module.update, after)
