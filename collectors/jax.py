"""The JAX adapter: JAX's profiler for the runner, the built-in models' jit-compiled training
step (one process, or data parallel over ``jax.distributed`` with gloo CPU collectives), and
the hook of `opprof run`.

Importing this module imports no JAX; :func:`import_jax` does, when a function runs.

**Profiler.** At the runner's profile boundary ``jax.profiler.start_trace(LOGDIR)`` with
``host_tracer_level=2`` (XLA:CPU records one event per HLO operation only from level 2; the
default of ``jax.profiler.trace`` is 1, which shows the compiled program but not its
operations) and no Python tracer; LOGDIR = ``<run folder>/rankR``, so each process writes
``rankR/plugins/profile/<run>/<host>.xplane.pb`` (and JAX's own ``.trace.json.gz`` beside it).
One ``opprof.clock`` annotation carries the process's role, rank, framework and the epoch time
(the XPlane reader puts every rank on one clock with it); each profiled step is a ``train``
annotation with ``step_num=N`` and ``opprof=1`` (xprof's step convention, as the TensorFlow
adapter writes), from one step boundary to the next, its ``step_num`` attached when it ends.
JAX dispatches asynchronously: from the timing steps on, every step boundary waits for the
step's results (``jax.block_until_ready``), so a step's operations run inside its marker.

**Built-in models** (`record`, :mod:`.jax_models`): the batch is prepared in Python (numpy:
resize, normalize, random flip, as MXNet's collector does) under an ``opprof.load``
annotation; one ``jax.jit``-compiled step computes the loss and its gradient
(``jax.value_and_grad``) and applies ``optax.sgd`` (momentum 0.9) — forward, backward and
update in one XLA program, told apart by the JAX names XLA keeps (``jvp(...)``,
``transpose(jvp(...))``, the optimizer's ops outside both: normalizers/maps/jax.csv).
``--mode allreduce``: one process per worker, ``jax.distributed.initialize`` on loopback with
gloo CPU collectives (``jax_cpu_collectives_implementation``), the step ``jax.pmap``-ed over
the job's devices with the gradients averaged by ``jax.lax.pmean`` (an XLA all-reduce).

**Hook** (`opprof run`): ``jax.jit`` and ``jax.pmap`` return functions that count their calls.
A jit-compiled function that computes a gradient (``jax.grad``, ``value_and_grad``,
``vjp``) or applies ``optax.apply_updates`` while it is traced is a training step: each call
of it from Python (not from inside another traced function) ends a step — a whole
``lax.scan`` loop compiled in one call is one step. Where the script marks its steps with
``jax.profiler.StepTraceAnnotation``, the annotation's end is the step instead; an eager loop
(no jit) steps at ``optax.apply_updates``. The loss of a step is the first floating scalar
its function returns. A script's own ``jax.profiler.trace`` / ``start_trace`` is not started
under `opprof run` (JAX allows one trace at a time; opprof's records the profiled steps),
with one line on stderr.

**Threads** (`record --threads N`): XLA:CPU sizes its thread pools by the CPUs the process may
run on, so N < the host's CPUs restricts the process to N of them (``sched_setaffinity``,
before JAX starts); N = 1 also runs XLA's Eigen code single-threaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
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

STEP_MARKER = "train"
#: The environment `record` gives each process of a data-parallel job.
COORDINATOR_ENV, PROCESSES_ENV, PROCESS_ID_ENV = (
    "OPPROF_JAX_COORDINATOR", "OPPROF_JAX_PROCESSES", "OPPROF_JAX_PROCESS_ID")


def import_jax(threads: int | None = None) -> ModuleType:
    """Import and return ``jax``; with ``threads``, XLA:CPU limited to that many CPUs (set
    before JAX starts its thread pools)."""
    if threads and "jax" not in sys.modules:
        limit_threads(threads)
    import jax

    return jax


def limit_threads(threads: int) -> None:
    """Run this process's XLA:CPU on ``threads`` CPUs: affinity to the first ``threads`` the
    process may use (XLA sizes its pools from them); one thread also turns Eigen's
    multi-threading off."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus and threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
    if threads == 1:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false "
                                       "intra_op_parallelism_threads=1").strip()


def thread_count() -> int:
    """The CPUs this process's XLA:CPU runs on."""
    if "--xla_cpu_multi_thread_eigen=false" in os.environ.get("XLA_FLAGS", ""):
        return 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def xplanes(folder: Path) -> list[Path]:
    """The XPlane files under ``folder``."""
    return sorted(Path(folder).rglob("*.xplane.pb"))


# ------------------------------------------------------------------ the adapter


class JAXAdapter:
    """JAX's profiler for the runner (see the module docstring). ``pending`` gives the
    results of the last step (waited for at every step boundary)."""

    framework = Framework.JAX
    profiler_warmup = 0

    def __init__(self, pending: Callable[[], Any] = lambda: None, *,
                 facts: dict[str, Any] | None = None) -> None:
        self.jax = import_jax()
        self.pending = pending
        self._facts = dict(facts or {})
        self.marker: Any = None
        self.index = 0
        self.logdir: Path | None = None
        self.profiling = False

    def version(self) -> str:
        return str(self.jax.__version__)

    def sync(self) -> None:
        self.jax.block_until_ready(self.pending())

    @property
    def _world(self) -> int:
        return int(self.jax.process_count())

    def identity(self) -> tuple[Role, int | None]:
        return Role.WORKER, (int(self.jax.process_index()) if self._world > 1 else None)

    def _barrier(self, name: str) -> None:
        if self._world > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    def before_profile(self) -> dict[str, Any]:
        if self._world == 1:
            return {}
        self._barrier("opprof: profile")
        return {"world_size": self._world, "backend": "gloo"}

    def start(self, folder: Path, role: Role, rank: int) -> None:
        jax = self.jax
        self.logdir = Path(folder) / f"rank{rank}"
        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = 2  # XLA:CPU's per-operation events
        options.python_tracer_level = 0
        _HOOK.opprof_trace = True
        try:
            _ORIGINAL_TRACE.get("start", jax.profiler.start_trace)(
                str(self.logdir), profiler_options=options)
        except BaseException:
            _HOOK.opprof_trace = False
            raise
        self.profiling = True
        with jax.profiler.TraceAnnotation(
                "opprof.clock", epoch_ns=time.time_ns(), role=str(role), task=rank, rank=rank,
                framework="jax", framework_version=self.version(),
                **{k: str(v) for k, v in self._facts.items()
                   if k in ("model", "mode", "dataset", "batch_size", "workers")}):
            pass
        self._open(0)

    def _open(self, index: int) -> None:
        self.index = index
        self.marker = self.jax.profiler.TraceAnnotation(STEP_MARKER, _r=1)
        self.marker.__enter__()

    def _close(self, complete: bool = True) -> None:
        if self.marker is None:
            return
        if complete:
            self.marker.set_metadata(step_num=self.index, opprof=1)
        self.marker.__exit__(None, None, None)
        self.marker = None

    def boundary(self, index: int) -> None:
        self._close()
        self._open(index)

    def stop(self, complete: bool) -> list[Path]:
        self._close(complete)
        if complete:
            self._barrier("opprof: stop")
        if self.profiling:
            self.profiling = False
            try:
                _ORIGINAL_TRACE.get("stop", self.jax.profiler.stop_trace)()
            finally:
                _HOOK.opprof_trace = False
        assert self.logdir is not None
        return xplanes(self.logdir)

    def after_profile(self) -> None:
        self._barrier("opprof: profiled")

    def facts(self) -> dict[str, Any]:
        return {**self._facts, "threads": thread_count(),
                "backend_platform": str(self.jax.default_backend())}

    def release(self) -> None:
        self.marker = None


# the profiler's own start and stop (the hook replaces jax's; opprof calls these)
_ORIGINAL_TRACE: dict[str, Callable[..., Any]] = {}


def _profiler_functions() -> None:
    """Keep JAX's own ``start_trace`` / ``stop_trace`` and make a script's calls of them
    no-ops while opprof's trace runs (one trace at a time in JAX)."""
    from jax._src import profiler

    if _ORIGINAL_TRACE:
        return
    _ORIGINAL_TRACE.update(start=profiler.start_trace, stop=profiler.stop_trace)

    def start_trace(*args: Any, **kwargs: Any) -> None:
        # Under `opprof run` the script's own traces are left out: JAX runs one at a time,
        # and opprof's starts at its own step boundary.
        _note_once("this script's own jax.profiler trace is not started under opprof run "
                   "(JAX runs one trace at a time; opprof's records the profiled steps)")
        _HOOK.user_trace_ignored = True

    def stop_trace() -> None:
        if _HOOK.user_trace_ignored:
            _HOOK.user_trace_ignored = False
            return None
        return _ORIGINAL_TRACE["stop"]()

    start_trace.__doc__ = profiler.start_trace.__doc__
    stop_trace.__doc__ = profiler.stop_trace.__doc__
    profiler.start_trace = start_trace
    profiler.stop_trace = stop_trace
    import jax.profiler as public

    public.start_trace, public.stop_trace = start_trace, stop_trace


def _note_once(text: str) -> None:
    if text not in _HOOK.notes:
        _HOOK.notes.add(text)
        print(f"opprof: {text}", file=sys.stderr)


# ------------------------------------------------------------------ the built-in models


def record_worker(config: RecordConfig, folder: Path) -> None:
    """One process of `record --fw jax`: alone, or one rank of a data-parallel job."""
    jax = import_jax(config.threads)
    world, rank = 1, 0
    if os.environ.get(COORDINATOR_ENV):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=os.environ[COORDINATOR_ENV],
                                   num_processes=int(os.environ[PROCESSES_ENV]),
                                   process_id=int(os.environ[PROCESS_ID_ENV]))
        world, rank = int(jax.process_count()), int(jax.process_index())
    import jax.numpy as jnp
    import optax

    from opprof.collectors.jax_models import build, layer_counts

    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    data = NumpyBatches(config, rank, world, size, channels_first=False)
    model = build(key, data.classes)
    params, state = model.init(jax.random.PRNGKey(config.seed))
    optimizer = optax.sgd(learning_rate(key), momentum=0.9)
    opt_state = optimizer.init(params)
    sequence = key in SEQUENCE_MODELS

    def loss_fn(params: Any, state: Any, x: Any, y: Any, rng: Any) -> tuple[Any, Any]:
        logits, new_state = model.apply(params, state, x, True, rng)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, new_state

    def train_step(params: Any, state: Any, opt_state: Any, x: Any, y: Any,
                   rng: Any) -> tuple[Any, Any, Any, Any]:
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, state, x, y, rng)
        if world > 1:
            grads = jax.lax.pmean(grads, "batch")
            loss = jax.lax.pmean(loss, "batch")
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    if world > 1:
        step_fn = jax.pmap(train_step, axis_name="batch", donate_argnums=(0, 1, 2))

        def local(tree: Any) -> Any:  # one replica per process (its one CPU device)
            return jax.tree_util.tree_map(lambda a: np.asarray(a)[None], tree)

        params, state, opt_state = local(params), local(state), local(opt_state)
    else:
        step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))

        def local(tree: Any) -> Any:
            return tree

    batches = iter(data)
    rng_base = jax.random.PRNGKey(config.seed * 1000 + rank)
    held: dict[str, Any] = {"params": params, "state": state, "opt": opt_state, "loss": None,
                            "n": 0}

    def step() -> Any:
        with jax.profiler.TraceAnnotation("opprof.load"):
            x, y = next(batches)
            xs, ys = local(x), local(y)
        rng = local(jax.random.fold_in(rng_base, held["n"]))
        held["n"] += 1
        held["params"], held["state"], held["opt"], held["loss"] = step_fn(
            held["params"], held["state"], held["opt"], xs, ys, rng)
        return held["loss"]

    counts = layer_counts(model)
    param_bytes = 4 * counts["params"]  # float32
    facts = {"model": key, "dataset": config.dataset, "batch_size": config.batch_size,
             "mode": str(config.mode), "profiled_steps": config.steps,
             "params": counts["params"], "param_bytes": param_bytes,
             "layers": {k: v for k, v in counts.items() if k != "params"},
             "input_size": size, "num_classes": data.classes, "seed": config.seed,
             "workers": world, "optimizer": "sgd (optax)"}
    adapter = JAXAdapter(lambda: held["loss"], facts=facts)

    def first(tree: Any) -> Any:
        return jax.tree_util.tree_map(lambda a: a[0], tree) if world > 1 else tree

    apply = jax.jit(lambda p, s, x: model.apply(p, s, x, False)[0])

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(apply(first(held["params"]), first(held["state"]), jnp.asarray(x)))

    def read_loss(loss: Any) -> float:
        return float(np.mean(np.asarray(loss)))

    convergence: Convergence[Any] | None
    if sequence:
        assert data.tokens is not None
        convergence = token_convergence(config, data.tokens, predict=predict, loss=read_loss)
    else:
        convergence = image_convergence(
            config, data.images, data.labels, size=size, mean=data.mean, std=data.std,
            predict=predict, loss=read_loss)
    try:
        drive(Runner(adapter, config.protocol, folder, extra=facts), step, convergence)
    finally:
        if world > 1:
            with contextlib.suppress(Exception):
                jax.distributed.shutdown()


# ------------------------------------------------------------------ the hook of `opprof run`


class _Hook:
    """What every hook of this process shares (see the module docstring)."""

    def __init__(self) -> None:
        self.protocol: Protocol | None = None
        self.folder: Path | None = None
        self.started: Callable[[Runner], bool] | None = None
        self.runner: Runner | None = None
        self.off = False
        self.owner: int | None = None  # the step function (id of its wrapper)
        self.annotated = False  # the script marks its steps (StepTraceAnnotation)
        self.pending: Any = None
        self.loss: LossLog[Any] | None = None
        self.local = threading.local()
        self.hooked: set[str] = set()
        self.opprof_trace = False
        self.user_trace_ignored = False
        self.notes: set[str] = set()

    def stack(self) -> list[_Counted]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        stack: list[_Counted] = self.local.stack
        return stack

    def runner_for(self, owner: int, facts: dict[str, Any]) -> Runner | None:
        if self.off or self.protocol is None or self.folder is None or self.started is None:
            return None
        runner = self.runner
        if runner is None or runner.facts.pid != os.getpid():
            self.owner = owner
            adapter = JAXAdapter(lambda: self.pending, facts=facts)
            runner = self.runner = Runner(adapter, self.protocol, self.folder, extra=facts)
            if not self.started(runner):
                self.off = True
                return None
            if os.environ.get("OPPROF_LOSS", "1") != "0":
                self.loss = LossLog(_read_losses)
            runner.loss_log = self.loss
        elif owner == ANNOTATION and self.owner != ANNOTATION:
            self.owner = ANNOTATION  # the script's annotations mark the steps from now on
        elif owner != self.owner:
            return None
        return runner

    def step_end(self, owner: int, result: Any, facts: dict[str, Any]) -> None:
        runner = self.runner_for(owner, facts)
        if runner is None:
            return
        self.pending = result
        if self.loss is not None:
            loss = _first_scalar(result)
            if loss is not None:
                self.loss.seen(loss)
            self.loss.step_end(runner.profiling)
        runner.step_or_give_up()


_HOOK = _Hook()
#: The owner of the steps a script marks with ``jax.profiler.StepTraceAnnotation``.
ANNOTATION = -1


def _read_losses(values: list[Any]) -> list[float]:
    import jax

    return [float(np.mean(np.asarray(v))) for v in jax.device_get(values)]


def _first_scalar(tree: Any) -> Any:
    """The first floating scalar of a step's results (per device, for pmap), or None."""
    import jax

    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None or not np.issubdtype(np.dtype(dtype), np.floating):
            continue
        if len(shape) == 0 or (len(shape) == 1 and shape[0] <= 1024 and
                               type(leaf).__name__ != "ndarray" and _per_device(leaf)):
            return leaf
    return None


def _per_device(leaf: Any) -> bool:
    sharding = getattr(leaf, "sharding", None)
    return type(sharding).__name__ == "PmapSharding"


def _tracing() -> bool:
    """Whether JAX is tracing now (a call made inside a function being traced)."""
    try:
        from jax._src import core

        return not core.trace_state_clean()
    except (ImportError, AttributeError):
        return False


class _Counted:
    """A function ``jax.jit`` or ``jax.pmap`` returned, counting its calls: its calls from
    Python end a step once it is known to compute a gradient or an optimizer update."""

    def __init__(self, fn: Any, transform: str) -> None:
        self.__wrapped__ = fn
        self._transform = transform
        self._trains = False
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stack = _HOOK.stack()
        outer = not stack and not _tracing()
        stack.append(self)
        try:
            result = self.__wrapped__(*args, **kwargs)
        finally:
            stack.pop()
        if outer and self._trains and not _HOOK.annotated:
            name = str(getattr(self.__wrapped__, "__name__", "step"))
            _HOOK.step_end(id(self), result, {"step_function": name,
                                              "transform": self._transform})
        return result

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else functools.partial(self, instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


def _mark_training() -> None:
    """A gradient or an optimizer update is being computed: the outermost counted function
    being called (traced) is a training step."""
    stack = _HOOK.stack()
    if stack:
        stack[0]._trains = True


def _wrap_transform(transform: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``jax.jit`` / ``jax.pmap`` whose functions count their calls (decorator use with or
    without arguments included)."""
    if getattr(transform, "_opprof", False):
        return transform

    @functools.wraps(transform)
    def wrapped(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
        if fun is None:  # @jax.jit(static_argnums=...) style
            return functools.partial(wrapped, *args, **kwargs)
        return _Counted(transform(fun, *args, **kwargs), name)

    wrapped._opprof = True  # type: ignore[attr-defined]
    return wrapped


def _wrap_marking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.grad`` & co.: the function they return marks the step function it runs in."""
    if getattr(fn, "_opprof", False):
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        inner = fn(*args, **kwargs)
        if not callable(inner):
            _mark_training()
            return inner

        @functools.wraps(inner)
        def marked(*a: Any, **k: Any) -> Any:
            _mark_training()
            return inner(*a, **k)

        return marked

    wrapped._opprof = True  # type: ignore[attr-defined]
    return wrapped


def _hook_optax() -> None:
    """``optax.apply_updates``: in a traced function it marks the step function; called
    eagerly (no jit) outside any counted function, it ends a step."""
    optax = sys.modules.get("optax")
    if optax is None or "optax" in _HOOK.hooked:
        return
    _HOOK.hooked.add("optax")
    original: Callable[..., Any] = optax.apply_updates

    @functools.wraps(original)
    def apply_updates(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if _tracing() or _HOOK.stack():
            _mark_training()
        elif not _HOOK.annotated:
            _HOOK.step_end(id(original), result, {"step_function": "optax.apply_updates",
                                                  "transform": "eager"})
        return result

    setattr(optax, "apply_updates", apply_updates)  # noqa: B010 - a module typed as its own


def _hook_annotations(jax: ModuleType) -> None:
    """The script's own ``jax.profiler.StepTraceAnnotation`` marks its steps: its end is a
    step's end (and the counted functions no longer are)."""
    cls = jax.profiler.StepTraceAnnotation
    if getattr(cls.__exit__, "_opprof", False):
        return
    original, enter = cls.__exit__, cls.__enter__

    def __enter__(self: Any) -> Any:
        _HOOK.annotated = True  # the calls inside are not steps of their own
        return enter(self)

    def __exit__(self: Any, *exc: Any) -> Any:
        result = original(self, *exc)
        _HOOK.annotated = True
        _HOOK.step_end(ANNOTATION, _HOOK.pending, {"step_function": "StepTraceAnnotation",
                                           "transform": "annotation"})
        return result

    __exit__._opprof = True  # type: ignore[attr-defined]
    cls.__enter__, cls.__exit__ = __enter__, __exit__


def install_hook(protocol: Protocol, folder: Path, started: Callable[[Runner], bool]) -> None:
    """Count steps (see the module docstring); a later call (``optax`` imported after
    ``jax``) hooks what has been imported since."""
    _HOOK.protocol, _HOOK.folder, _HOOK.started = protocol, Path(folder), started
    jax = sys.modules.get("jax")
    if jax is not None and "jax" not in _HOOK.hooked:
        _HOOK.hooked.add("jax")
        for name in ("jit", "pmap"):
            setattr(jax, name, _wrap_transform(getattr(jax, name), name))
        for name in ("grad", "value_and_grad", "vjp"):
            setattr(jax, name, _wrap_marking(getattr(jax, name)))
        _hook_annotations(jax)
        _profiler_functions()
    _hook_optax()
