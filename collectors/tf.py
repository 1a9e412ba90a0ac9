"""The TensorFlow adapter: the TensorFlow profiler for the runner, the built-in models' Keras
training (single, MultiWorkerMirroredStrategy, ParameterServerStrategy tasks configured by
``TF_CONFIG``), and the optimizer hook of `opprof run`.

Importing this module imports no TensorFlow; it is imported when a function runs.

**Profiler.** At the runner's profile boundary ``tf.profiler.experimental.start(LOGDIR)``
(host tracer level 2, no Python tracer), LOGDIR = ``<run folder>/<task type><index>``, so each
process writes ``<task><index>/plugins/profile/<run>/<host>.xplane.pb``. One ``opprof.clock``
marker carries the process's role, task index, rank, the run's facts and the epoch time (the
normalizer puts every rank on one clock with it). Each profiled step is a step marker
``train`` with ``step_num=N`` (xprof's convention) and ``opprof=1`` (Keras 2's ``fit`` marks its
own steps the same way), from one step boundary to the next; its ``step_num`` is attached when
the step ends, so a step cut short by the end of the process is not a step. A step boundary
may be inside a running ``tf.function`` (the hook's), so the markers are TraceMe objects started
and stopped on whichever thread reaches the boundary.

**Built-in models** (`record`): a ``tf.data`` pipeline (cached uint8 images, then per sample
resize / scale / normalize / random flip; batched, prefetched); four Python-thread markers per
step — ``opprof.load`` (``next(iterator)``), ``opprof.forward`` (a ``tf.function`` computing
the loss under an eager ``GradientTape``), ``opprof.backward`` (``tape.gradient``, ops named
``gradients/...``), ``opprof.update`` (a ``tf.function`` calling ``apply_gradients``; under
MultiWorkerMirroredStrategy the gradient all-reduce runs there, as in Keras). Modes:
``single``; ``allreduce`` (MultiWorkerMirroredStrategy, ring collectives, one process per
worker); ``ps-async`` (ParameterServerStrategy: a chief — role ``scheduler`` — schedules
``opprof_step`` functions onto worker tasks, variables on ps tasks — role ``server``; the
chief turns the other tasks' profilers on and off through the run's control file, and each
execution of the step function on a worker is one step of that worker). ``ps-sync`` is
refused: TF 2 has no synchronous parameter-server training.

**Hook** (`opprof run`): the optimizer update marks the end of a step — Keras 3's
``BaseOptimizer.apply`` (what ``apply_gradients`` and ``Model.fit`` call), Keras 2's
(``tf_keras``, or ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``) ``apply_gradients`` of its
optimizers and of its legacy ones (:data:`OPTIMIZER_UPDATES`). Called eagerly, the hook runs
right after it; traced into a ``tf.function`` (``fit``, a custom ``@tf.function`` training
step), Python runs only once, so the hook adds a ``tf.py_function`` that calls back into the
runner every time the function runs, after the optimizer has updated every weight: it depends
on a read of each trainable variable and of the iteration counter, which the function's
automatic control dependencies order after the variable's update. (Tied to the counter alone,
it ran early in the function, since Keras increments the counter without waiting for the
gradients: a step then ended before its own forward pass, and the Python time between two
calls fell in the previous step's update.)

**XLA** (``jit_compile=True``): no Python runs inside a compiled function, so the step ends
where the compiled function that holds the update returns: an update traced in an XLA context
marks the outermost compiled ``tf.function`` being called (``Function.__call__`` is wrapped),
and every later call of it ends a step — right after the call when Python makes it (a custom
loop's ``@tf.function(jit_compile=True)`` step), or through a ``tf.py_function`` that waits for
the call when a non-compiled function calls it (Keras ``fit``'s ``multi_step_on_iterator``
calling its compiled ``one_step_on_data``). Not supported: ParameterServerStrategy (steps run
in other processes) — use ``opprof.profile()`` there.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from opprof.collectors import channel
from opprof.collectors.config import (
    INPUT_SIZE,
    Facts,
    Framework,
    Mode,
    Protocol,
    RecordConfig,
    Role,
    canonical_name,
    is_sequence_model,
    keras_backend,
    learning_rate,
)
from opprof.collectors.convergence import image_convergence, token_convergence, token_data
from opprof.collectors.datasets import TOKEN_VOCAB, channel_stats, load_images
from opprof.collectors.runner import (
    Convergence,
    Runner,
    drive,
    env_identity,
    fault_point,
    raise_pending,
    reclaim_sigterm,
)
from opprof.errors import OpprofError

STEP_MARKER = "train"
#: The name scope of the hook's reads of the updated variables (a traced step's end).
STEP_DONE_SCOPE = "opprof_step_done"
ROLE_OF_TASK = {"worker": Role.WORKER, "chief": Role.WORKER, "ps": Role.SERVER,
                "evaluator": Role.WORKER}
_POLL_S = 0.05


def _tf(threads: int | None = None) -> ModuleType:
    """TensorFlow, imported quietly; with ``threads`` its intra- and inter-op pools set to it
    (before anything runs in this process)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as exc:  # this process already ran TensorFlow
            raise OpprofError(f"--threads {threads}: TensorFlow is already initialised in "
                              f"this process ({exc})") from None
    return tf


def task_of_env() -> tuple[str, int]:
    """This process's ``TF_CONFIG`` task (type, index); ``("worker", 0)`` without one."""
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
        return str(task.get("type", "worker")), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return "worker", 0


# ------------------------------------------------------------------ the adapter


class TFAdapter:
    """The TensorFlow profiler for the runner (see the module docstring)."""

    framework = Framework.TF
    profiler_warmup = 0

    def __init__(self, *, run: dict[str, str | int] | None = None, role: Role | None = None,
                 rank: int | None = None, barrier: Callable[[], object] | None = None,
                 sync: Callable[[], object] | None = None,
                 servers: Callable[[str], None] | None = None,
                 facts: dict[str, object] | None = None) -> None:
        from tensorflow.python.profiler.internal import _pywrap_traceme

        self.tf, self.traceme = _tf(), _pywrap_traceme.TraceMe
        self.run, self.role, self.rank = dict(run or {}), role, rank
        self._barrier, self._sync, self._servers = barrier, sync, servers
        self._facts = dict(facts or {})
        self.marker: Any = None
        self.index = 0
        self.logdir: Path | None = None

    def version(self) -> str:
        return str(self.tf.__version__)

    def sync(self) -> None:
        if self._sync is not None:
            self._sync()

    def identity(self) -> tuple[Role, int | None]:
        kind, index = task_of_env()
        return self.role or ROLE_OF_TASK.get(kind, Role.WORKER), (
            index if self.rank is None else self.rank)

    def before_profile(self) -> dict[str, Any]:
        if self._barrier is not None:
            self._barrier()
        return {}

    def start(self, folder: Path, role: Role, rank: int) -> None:
        kind, index = task_of_env()
        self.logdir = Path(folder) / f"{kind}{index}"
        if self._servers is not None:
            self._servers("start")
        start_profiler(self.tf, self.logdir, role, index, rank, self.run)
        if self._barrier is not None:
            self._barrier()
        self._open(0)

    def _open(self, index: int) -> None:
        self.index, self.marker = index, self.traceme(STEP_MARKER)

    def _close(self) -> None:
        self.marker.SetMetadata(step_num=self.index, _r=1, opprof=1)
        self.marker.Stop()
        self.marker = None

    def boundary(self, index: int) -> None:
        self._close()
        self._open(index)

    def stop(self, complete: bool) -> list[Path]:
        if complete:
            self._close()
            if self._barrier is not None:
                # A collective's own event is recorded when its thread leaves it, just after
                # the step has seen it finish; one more round trip lets the last one be
                # recorded before the profiler stops.
                self._barrier()
        else:
            self.marker.Stop()  # a plain ``train`` marker: not a step
            self.marker = None
        self.tf.profiler.experimental.stop()
        if self._servers is not None:  # cut short: the servers are told, not waited for
            self._servers("stop" if complete else "stop now")
        assert self.logdir is not None
        files = xplanes(self.logdir)
        from opprof.collectors.tf_graphs import write_shapes

        write_shapes(sorted({p.parent for p in files}))  # the ops' shapes, for their FLOPs
        return files

    def after_profile(self) -> None:
        if self._barrier is not None:
            # No worker sends the next step's collective traffic while another still stops
            # its profiler (a worker once stayed in the stop for the whole time limit, its
            # peer blocked in the next step's all-reduce).
            self._barrier()

    def release(self) -> None:
        self.marker = None

    def facts(self) -> dict[str, Any]:
        cfg = self.tf.config.threading
        return {**self._facts, "onednn": onednn_enabled(), "threads": {
            "intra_op": cfg.get_intra_op_parallelism_threads(),
            "inter_op": cfg.get_inter_op_parallelism_threads(), "cpus": os.cpu_count()}}


def onednn_enabled() -> bool | None:
    """Whether this TensorFlow runs its CPU ops with oneDNN (null when it cannot say).

    TF turns oneDNN on by default only on some x86 CPUs (those with AVX-512's neural-network
    extensions or AMX; on an AVX2-only CPU it is off) and ``TF_ENABLE_ONEDNN_OPTS`` overrides
    that. It matters to the memory columns: only oneDNN's CPU allocator traces its
    allocations into the profile, so without it a CPU run has no allocator figure."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def start_profiler(tf: ModuleType, logdir: Path, role: Role, task: int, rank: int,
                   run: dict[str, str | int]) -> None:
    """Start the profiler into ``logdir`` and emit the ``opprof.clock`` marker."""
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=1)
    tf.profiler.experimental.start(str(logdir), options=options)
    # The epoch time beside a marker's profile-relative time puts every rank on one clock.
    # The arguments also describe the run, so an imported logdir knows what it holds.
    with tf.profiler.experimental.Trace("opprof.clock", epoch_ns=time.time_ns(),
                                        role=str(role), task=task, rank=rank,
                                        framework_version=tf.__version__, **run):
        pass


def xplanes(folder: Path) -> list[Path]:
    """The XPlane files under ``folder``."""
    return sorted(Path(folder).rglob("*.xplane.pb"))


# ------------------------------------------------------------------ the built-in models


def _dataset(tf: ModuleType, config: RecordConfig, size: int, shard: tuple[int, int] = (0, 1)):
    """The input pipeline: cached uint8 images, per-sample resize/scale/normalize/flip (the
    language models: cached token sequences split into inputs and next-token targets)."""
    n = max(config.batch_size * 8, 256) * shard[1]
    if is_sequence_model(config.model):
        tokens = token_data(config, n)[shard[0]::shard[1]]
        ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:])).cache()
        ds = ds.shuffle(len(tokens), seed=config.seed + shard[0],
                        reshuffle_each_iteration=True).repeat()
        return ds.batch(config.batch_size, drop_remainder=True).prefetch(1), TOKEN_VOCAB
    images, labels, classes = load_images(config.dataset, n=n, seed=config.seed)
    mean, std = channel_stats(images)
    images, labels = images[shard[0]::shard[1]], labels[shard[0]::shard[1]]
    seed = config.seed + shard[0]
    source = images.shape[1]

    def prepare(img: Any, label: Any) -> tuple[Any, Any]:
        x = tf.cast(img, tf.float32) / 255.0
        if size != source:
            x = tf.image.resize(x, (size, size), method="nearest")
        x = (x - mean) / std
        return tf.image.random_flip_left_right(x, seed=seed), label

    ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache()
    ds = ds.shuffle(len(images), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(config.batch_size, drop_remainder=True).prefetch(1), classes


def _model(config: RecordConfig, classes: int, strategy: Any = None):
    import keras

    from opprof.collectors.tf_models import build, layer_counts

    keras.utils.set_random_seed(config.seed)
    with strategy.scope() if strategy is not None else nullcontext():
        model = build(config.model, classes)
        optimizer = keras.optimizers.SGD(learning_rate=learning_rate(config.model),
                                             momentum=0.9)
        optimizer.build(model.trainable_variables)
    return model, optimizer, layer_counts(model)


def _loss_fn(tf: ModuleType, model: Any, global_batch: int) -> Callable[[Any, Any], Any]:
    import keras

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def loss(x: Any, y: Any) -> Any:
        # No gradient for the input: a tf.function called under an eager tape otherwise
        # differentiates its inputs too (the first convolution's Conv2DBackpropInput), work
        # torch and MXNet do not do for the same model.
        losses = per_example(y, model(tf.stop_gradient(x), training=True))
        if losses.shape.rank > 1:  # a language model's sequence: its mean over the tokens
            losses = tf.reduce_mean(losses, axis=list(range(1, losses.shape.rank)))
        return tf.nn.compute_average_loss(losses, global_batch_size=global_batch)

    return loss


def _stepper(tf: ModuleType, model: Any, optimizer: Any, iterator: Any, strategy: Any,
             global_batch: int, state: _Losses) -> Callable[[], Any]:
    """One training step with its four phase markers (see the module docstring).

    Forward, backward and update are separate ``tf.function`` executions (rather than one
    function with the tape inside) so that every phase marker encloses exactly its own ops;
    the ops run on TensorFlow's inter-op threads, the markers on the Python thread."""
    variables = model.trainable_variables
    loss_of = _loss_fn(tf, model, global_batch)
    trace = tf.profiler.experimental.Trace

    if strategy is None:
        @tf.function
        def opprof_forward(x: Any, y: Any) -> Any:
            return loss_of(x, y)

        @tf.function
        def opprof_update(grads: list[Any]) -> None:
            optimizer.apply_gradients(zip(grads, variables, strict=True))
    else:
        def update_replica(grads: list[Any]) -> None:
            # Function inputs carry no device; the all-reduce needs its destinations.
            grads = [tf.identity(g) for g in grads]
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        @tf.function
        def opprof_forward(x: Any, y: Any) -> Any:
            return strategy.run(loss_of, (x, y))

        @tf.function
        def opprof_update(grads: list[Any]) -> None:
            strategy.run(update_replica, (grads,))

    def step() -> Any:
        with trace("opprof.load"):
            x, y = next(iterator)
        with tf.GradientTape() as tape:
            with trace("opprof.forward"):
                loss = opprof_forward(x, y)
        with trace("opprof.backward"):
            grads = tape.gradient(loss, variables)
        with trace("opprof.update"):
            opprof_update(grads)
        state.loss = loss
        return loss

    return step


@dataclass
class _Losses:
    """The last step's loss (a TensorFlow tensor; None before the first step), which the
    adapter's ``sync`` reads to wait for the step."""

    loss: Any = None


def _convergence(config: RecordConfig, model: Any, size: int, shards: int,
                 loss: Callable[[Any], float]) -> Convergence | None:
    """The :class:`Convergence` of ``--converge`` (None without): the pool of training
    images the input pipeline normalizes with, the model's logits in inference mode."""
    if not config.converge:
        return None
    n = max(config.batch_size * 8, 256) * shards
    if is_sequence_model(config.model):
        return token_convergence(config, token_data(config, n),
                                 predict=lambda x: model(x, training=False), loss=loss)
    images, labels, _ = load_images(config.dataset, n=n, seed=config.seed)
    mean, std = channel_stats(images)
    return image_convergence(config, images, labels, size=size, mean=mean, std=std,
                             predict=lambda x: model(x, training=False), loss=loss)


def _barrier(tf: ModuleType, strategy: Any) -> Callable[[], object] | None:
    """All workers meet (a one-number all-reduce); None without a strategy."""
    if strategy is None:
        return None

    def replica() -> Any:
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]))

    @tf.function
    def opprof_barrier() -> Any:
        return strategy.run(replica)

    return lambda: float(opprof_barrier())


def _run_facts(config: RecordConfig) -> dict[str, str | int]:
    """What the ``opprof.clock`` marker says about the run."""
    return {"model": canonical_name(config.model), "mode": str(config.mode),
            "dataset": config.dataset, "batch_size": config.batch_size,
            "workers": config.workers if config.mode != Mode.SINGLE else 1,
            "servers": config.servers if config.mode == Mode.PS_ASYNC else 0}


def variable_bytes(variables: Any) -> int:
    """Bytes of TF/Keras variables: elements × the size of their dtype (a Keras 3 variable's
    dtype is a name, a tf.Variable's a DType)."""
    import numpy as np

    total = 0
    for v in variables:
        dtype = getattr(v.dtype, "as_numpy_dtype", v.dtype)
        total += math.prod(int(d) for d in v.shape) * np.dtype(dtype).itemsize
    return int(total)


def _model_facts(config: RecordConfig, counts: dict[str, int], size: int,
                 classes: int, param_bytes: int) -> dict[str, object]:
    return {"model": canonical_name(config.model), "dataset": config.dataset,
            "batch_size": config.batch_size, "params": counts["params"],
            "param_bytes": param_bytes,
            "layers": {k: v for k, v in counts.items() if k != "params"},
            "input_size": size, "num_classes": classes, "seed": config.seed}


def local_step(config: RecordConfig, strategy: Any = None) -> Callable[[], float]:
    """The training step of ``config``'s model on one worker, no profiler and no strategy (its
    input pipeline, model and optimizer as `record` builds them), returning when it is done:
    what `opprof calibrate` times alone and on several workers at once (co-location). The
    threads are this process's (set before TensorFlow first ran). With ``strategy`` (a
    MultiWorkerMirroredStrategy) its batches come through the strategy's distributed dataset,
    as `record --mode allreduce` draws them; the step itself stays local."""
    tf = _tf()
    size = INPUT_SIZE[canonical_name(config.model)]
    ds, classes = _dataset(tf, config, size)
    batches = iter(ds) if strategy is None else _local(strategy, _distributed(
        tf, config, size, strategy))
    model, optimizer, _ = _model(config, classes)
    state = _Losses()
    step = _stepper(tf, model, optimizer, batches, None, config.batch_size, state)
    return lambda: float(step())


def _distributed(tf: ModuleType, config: RecordConfig, size: int, strategy: Any) -> Any:
    """The iterator of ``strategy``'s distributed dataset: each worker's input pipeline its
    own shard of the data (``distribute_datasets_from_function``)."""

    def dataset_fn(ctx: Any) -> Any:
        return _dataset(tf, config, size, (ctx.input_pipeline_id, ctx.num_input_pipelines))[0]

    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def _local(strategy: Any, iterator: Any) -> Iterator[Any]:
    """A distributed iterator's batches as this worker's own tensors (its one replica)."""
    for batch in iterator:
        yield strategy.experimental_local_results(batch)[0]


def record_worker(config: RecordConfig, folder: Path) -> None:
    """One task of `record --fw tf`: by its ``TF_CONFIG`` task (none: single)."""
    kind, _ = task_of_env()
    if config.mode == Mode.PS_ASYNC:
        if kind == "chief":
            _coordinate(config, folder)
        else:
            _serve(config, folder)
        return
    tf = _tf(config.threads)
    size = INPUT_SIZE[canonical_name(config.model)]
    strategy = None
    if config.mode == Mode.ALLREDUCE:
        impl = tf.distribute.experimental.CommunicationImplementation.RING
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl))
        reclaim_sigterm()  # TF's preemption notifier took SIGTERM over
        workers = strategy.num_replicas_in_sync
        classes = _dataset(tf, config, size)[1]
        iterator = _distributed(tf, config, size, strategy)
        shards = workers
    else:
        workers = shards = 1
        ds, classes = _dataset(tf, config, size)
        iterator = iter(ds)
    model, optimizer, counts = _model(config, classes, strategy)
    state = _Losses()
    step = _stepper(tf, model, optimizer, iterator, strategy, config.batch_size * workers, state)
    facts = _model_facts(config, counts, size, classes,
                         variable_bytes(model.trainable_variables))
    adapter = TFAdapter(run=_run_facts(config), barrier=_barrier(tf, strategy),
                        sync=lambda: float(state.loss) if state.loss is not None else None,
                        facts=facts)
    # A replica's loss is its sum over the global batch: times the replicas, its mean.
    convergence = _convergence(config, model, size, shards,
                               lambda loss: float(loss) * workers)
    drive(Runner(adapter, config.protocol, folder, extra=facts), step, convergence)


def _serve(config: RecordConfig, folder: Path) -> None:
    """A worker or ps task of ParameterServerStrategy: a gRPC server that runs what the chief
    schedules, and profiles itself while the run's control file says ``start``."""
    tf = _tf(config.threads)
    kind, index = task_of_env()
    role = ROLE_OF_TASK.get(kind, Role.WORKER)
    _, _, label = env_identity()
    rank = index if role == Role.WORKER else config.workers + index
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    tf.distribute.Server(resolver.cluster_spec(), job_name=kind, task_index=index,
                         protocol="grpc", start=True)
    reclaim_sigterm()
    reporter = channel.Reporter(folder, Facts(
        pid=os.getpid(), host=socket.gethostname(), label=label, role=role, rank=rank,
        framework="tf", framework_version=tf.__version__, stage="ready"))
    reporter.update()
    logdir = Path(folder) / f"{kind}{index}"
    profiling = False
    try:
        while True:
            command = channel.received(folder)
            if command == "start" and not profiling:
                start_profiler(tf, logdir, role, index, rank, _run_facts(config))
                fault_point(label, "profile")
                profiling = True
                reporter.update(stage="profiling")
            elif command == "stop" and profiling:
                reporter.update(stage="write")
                tf.profiler.experimental.stop()
                profiling = False
                reporter.update(stage="done", native=[str(p) for p in xplanes(logdir)])
            raise_pending()
            time.sleep(_POLL_S)
    except BaseException as exc:  # SIGTERM (an interrupted run): keep what was profiled
        if profiling:
            why = str(exc) or type(exc).__name__
            reporter.update(stage="write", ended=why)
            tf.profiler.experimental.stop()
            reporter.update(native=[str(p) for p in xplanes(logdir)])
        raise


def _coordinate(config: RecordConfig, folder: Path) -> None:
    """The chief of ParameterServerStrategy: schedules steps onto the workers. One runner
    step is one round of ``workers`` scheduled steps; the chief's profiler start and stop
    also start and stop every other task's (through the control file)."""
    tf = _tf(config.threads)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    reclaim_sigterm()
    classes = _dataset(tf, config, size)[1]
    model, optimizer, counts = _model(config, classes, strategy)
    variables = model.trainable_variables
    loss_of = _loss_fn(tf, model, config.batch_size)

    def dataset_fn() -> Any:
        # Traced once and run on every worker: each worker reads the same (shuffled) data.
        return _dataset(tf, config, size)[0]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def opprof_step(it: Any) -> Any:
        def replica(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        x, y = next(it)
        return strategy.run(replica, (x, y))

    def round_of_steps() -> list[Any]:
        losses = [coordinator.schedule(opprof_step, args=(iterator,))
                  for _ in range(config.workers)]
        coordinator.join()
        return losses

    others = config.workers + config.servers

    def servers(command: str) -> None:
        channel.send(folder, command.split()[0])
        if command == "stop now":
            return
        want = "profiling" if command == "start" else "done"
        channel.wait_until(
            lambda st: sum(s.stage == want for s in st if s.pid != os.getpid()) >= others,
            folder, time.monotonic() + config.timeout_s,
            f"the other tasks to {command} profiling")

    facts = {**_model_facts(config, counts, size, classes, variable_bytes(variables)),
             "scheduled_steps": config.steps * config.workers,
             "unprofiled_step_note": "ps-async: wall time of one round of `workers` scheduled "
                                     "steps, i.e. the mean step time of one worker"}
    adapter = TFAdapter(run=_run_facts(config), role=Role.SCHEDULER,
                        rank=config.workers + config.servers, servers=servers,
                        facts=facts)
    # One convergence step is one round: the mean loss of its `workers` scheduled steps.
    convergence = _convergence(config, model, size, 1,
                               lambda losses: sum(float(v.fetch()) for v in losses)
                               / len(losses))
    drive(Runner(adapter, config.protocol, folder, extra=facts), round_of_steps, convergence)


# ------------------------------------------------------------------ the hook of `opprof run`

#: The optimizer updates that end a training step (module, class, method, Keras): Keras 3's
#: ``BaseOptimizer.apply``; Keras 2's (``tf_keras``) ``apply_gradients`` of its optimizers and
#: of its legacy ones (``tf_keras.optimizers.legacy``, ``TF_USE_LEGACY_KERAS=1``'s
#: ``tf.keras.optimizers.legacy``). Each class's subclasses reach it (``super()``).
OPTIMIZER_UPDATES = (
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "apply", 3),
    ("tf_keras.src.optimizers.optimizer", "_BaseOptimizer", "apply_gradients", 2),
    ("tf_keras.src.optimizers.legacy.optimizer_v2", "OptimizerV2", "apply_gradients", 2),
)
#: The modules whose import lets :func:`install_hook` hook an optimizer update.
HOOK_MODULES = tuple(dict.fromkeys(module for module, *_ in OPTIMIZER_UPDATES))


def install_hook(protocol: Protocol, folder: Path,
                 started: Callable[[Runner], bool]) -> None:
    """Count steps at the optimizer updates of :data:`OPTIMIZER_UPDATES` whose module is
    imported (the first call in a process sets the hook up; later calls hook what has been
    imported since). See the module docstring for how a traced or compiled step calls back."""
    hook = _StepHook.of_process(protocol, folder, started)
    for module, cls, method, keras in OPTIMIZER_UPDATES:
        if module in sys.modules:
            hook.wrap(getattr(sys.modules[module], cls), method, keras)
    hook.wrap_compiled_calls()


class _StepHook:
    """The process's step counting (one runner, whichever optimizer update steps first)."""

    _instance: _StepHook | None = None

    def __init__(self, protocol: Protocol, folder: Path,
                 started: Callable[[Runner], bool]) -> None:
        import weakref

        self.protocol, self.folder, self.started = protocol, Path(folder), started
        self.runner: Runner | None = None
        self.optimizer: int | None = None
        self.off = False
        self.facts: dict[str, object] | None = None
        self.depth = 0
        self.warned: set[str] = set()
        #: XLA-compiled functions that hold a step → the callback that ends it.
        self.compiled: weakref.WeakKeyDictionary[Any, Callable[[], None]] = (
            weakref.WeakKeyDictionary())
        self.compiled_traced = 0  # optimizer updates traced in an XLA context so far
        self.compiled_end: Callable[[], None] | None = None

    @classmethod
    def of_process(cls, protocol: Protocol, folder: Path,
                   started: Callable[[Runner], bool]) -> _StepHook:
        if cls._instance is None:
            cls._instance = cls(protocol, folder, started)
        return cls._instance

    # -- counting

    def runner_for(self, optimizer: Any) -> Runner | None:
        if self.off:
            return None
        runner = self.runner
        if runner is None or runner.facts.pid != os.getpid():
            self.optimizer = id(optimizer)
            facts = {"optimizer": type(optimizer).__name__, **(self.facts or {})}
            runner = self.runner = Runner(TFAdapter(facts=facts), self.protocol, self.folder,
                                          extra=facts)
            if not self.started(runner):
                self.off = True
                return None
        elif id(optimizer) != self.optimizer:
            return None
        return runner

    def on_step(self, optimizer: Any) -> None:
        runner = self.runner_for(optimizer)
        if runner is not None:
            runner.step_or_give_up()

    # -- the optimizer update

    def wrap(self, cls: type, method: str, keras: int) -> None:
        """Make ``cls.method`` (an optimizer update of Keras ``keras``) end a step."""
        original = cls.__dict__[method]
        if getattr(original, "_opprof", False) or (keras == 3 and keras_backend() != "tensorflow"):
            return  # hooked already; Keras 3 on another backend is not TensorFlow's to count
        hook = self

        def update(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if keras == 2:  # grads_and_vars may be a zip: keep the pairs to read the variables
                pairs = list(args[0] if args else kwargs.pop("grads_and_vars"))
                args = (pairs, *args[1:])
                variables = [v for _, v in pairs]
            hook.depth += 1
            try:
                result = original(optimizer, *args, **kwargs)
            finally:
                hook.depth -= 1
            if hook.depth:
                return result  # an optimizer wrapping another (LossScaleOptimizer): count once
            if keras == 3:
                given = args[1] if len(args) > 1 else kwargs.get("trainable_variables")
                variables = list(given if given is not None else (
                    getattr(optimizer, "_trainable_variables", None) or []))
            hook.updated(optimizer, variables)
            return result

        update.__doc__ = original.__doc__
        update.__wrapped__ = original  # type: ignore[attr-defined]
        update._opprof = True  # type: ignore[attr-defined]
        setattr(cls, method, update)

    def updated(self, optimizer: Any, variables: list[Any]) -> None:
        """``optimizer`` has just updated ``variables``: end the step, now (eager), when the
        function being traced runs (a callback in it), or when the XLA-compiled function
        being traced returns (:meth:`wrap_compiled_calls`)."""
        tf = sys.modules["tensorflow"]
        if self.facts is None:
            self.facts = _strategy_facts(tf, variables)
        if not tf.inside_function():
            self.on_step(optimizer)
            return
        from tensorflow.python.ops import control_flow_util

        if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
            self.compiled_traced += 1
            self.compiled_end = lambda: self.on_step(optimizer)
            return
        if tf.distribute.has_strategy() and "ParameterServer" in type(
                tf.distribute.get_strategy()).__name__:
            why = "ParameterServerStrategy runs the steps in other processes"
            if why not in self.warned:
                self.warned.add(why)
                print(f"opprof: {why}: steps of this function are not counted; use "
                      "opprof.profile() in the script", file=sys.stderr)
            return
        with tf.name_scope(STEP_DONE_SCOPE):  # the reads are weights_update (maps/tf.csv)
            done = [tf.identity(optimizer.iterations), *(tf.identity(v) for v in variables)]
            with tf.control_dependencies(done):  # the callback is opprof's, no operator
                tf.py_function(lambda: self.on_step(optimizer), [], [])

    # -- XLA: the step ends where the compiled function returns

    def wrap_compiled_calls(self) -> None:
        """Make every call of a ``tf.function(jit_compile=True)`` that holds an optimizer
        update end a step when it returns: right after the call when Python makes it; in a
        function being traced (Keras ``fit``'s ``multi_step_on_iterator`` calling its
        compiled ``one_step_on_data``), a callback there that waits for the call. No Python
        runs inside the compiled function."""
        module = sys.modules.get(
            "tensorflow.python.eager.polymorphic_function.polymorphic_function")
        if module is None:  # no tf.function yet (Keras 3 on another backend)
            return
        original = module.Function.__call__
        if getattr(original, "_opprof", False):
            return
        from tensorflow.python.ops import control_flow_util

        tf = sys.modules["tensorflow"]
        hook = self

        def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(fn, "_jit_compile", False):
                return original(fn, *args, **kwargs)
            graph = tf.compat.v1.get_default_graph()
            if control_flow_util.GraphOrParentsInXlaContext(graph):
                return original(fn, *args, **kwargs)  # inside a compiled caller: it counts
            traced = not tf.executing_eagerly()
            before, first = hook.compiled_traced, len(graph.get_operations()) if traced else 0
            result = original(fn, *args, **kwargs)
            if hook.compiled_traced != before and hook.compiled_end is not None:
                hook.compiled[fn] = hook.compiled_end
            end = hook.compiled.get(fn)
            if end is None:
                return result
            if not traced:
                end()
                return result
            with tf.name_scope(STEP_DONE_SCOPE), tf.control_dependencies(
                    graph.get_operations()[first:]):
                tf.py_function(end, [], [])  # opprof's callback, no operator (maps/tf.csv)
            return result

        call.__doc__ = original.__doc__
        call.__wrapped__ = original  # type: ignore[attr-defined]
        call._opprof = True  # type: ignore[attr-defined]
        module.Function.__call__ = call


def _strategy_facts(tf: ModuleType, variables: list[Any]) -> dict[str, object]:
    """What the hook can tell about the training when it first sees the optimizer update."""
    facts: dict[str, object] = {}
    if tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
        facts["strategy"] = type(strategy).__name__
        facts["replicas"] = int(strategy.num_replicas_in_sync)
    try:
        facts["params"] = sum(math.prod(int(d) for d in v.shape) for v in variables)
        facts["param_bytes"] = variable_bytes(variables)
    except (TypeError, ValueError, AttributeError):  # shapes not known yet
        pass
    return facts
