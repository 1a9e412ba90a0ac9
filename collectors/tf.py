"""The TensorFlow collector: trains a Keras model under the TensorFlow profiler, one XPlane
logdir per task, single-process or as a local cluster of TF_CONFIG tasks.

**One training step.** Four phases, each a ``tf.profiler.experimental.Trace`` marker on the
Python thread, inside the step marker ``Trace("train", step_num=N, _r=1)`` (xprof's step
convention; its trace viewer shows it as ``train N``):

* ``opprof.load``: ``next(iterator)`` on a ``tf.data`` pipeline (cached uint8 images, then per
  sample: resize for AlexNet, scale, normalize, random flip; batched and prefetched);
* ``opprof.forward``: a ``tf.function`` computing the loss, called under an eager
  ``GradientTape``;
* ``opprof.backward``: ``tape.gradient`` runs the forward function's gradient function (its
  ops are named ``gradients/...``);
* ``opprof.update``: a ``tf.function`` calling ``optimizer.apply_gradients`` (Keras 3 SGD with
  momentum; under MultiWorkerMirroredStrategy this is also where the gradient all-reduce runs,
  exactly as Keras does it).

Forward, backward and update are separate ``tf.function`` executions (rather than one function
with the tape inside) so that every phase marker encloses exactly its own ops; the ops run on
TensorFlow's inter-op threads, the markers on the Python thread.

**Modes.** ``single``: in this process. ``allreduce``: ``MultiWorkerMirroredStrategy`` with
ring (gRPC) collectives, one local process per worker, each profiling itself. ``ps-async``:
``ParameterServerStrategy`` with a ``ClusterCoordinator`` (the chief) scheduling
``opprof_step`` functions onto worker processes, variables on ``--servers`` ps processes; the
launcher starts every task's profiler before the chief's profiled steps and stops them after.
A scheduled step is one ``tf.function`` (tape inside: Python markers cannot run on a worker),
so its phases come from op scopes (``gradient_tape/`` is backward) and each execution on a
worker is one step of that worker; the optimizer runs on the ps. ``ps-sync`` is refused:
ParameterServerStrategy is asynchronous by design and TF 2 has no synchronous parameter-server
training. Tasks are configured by ``TF_CONFIG`` on free 127.0.0.1 ports, each in its own
process group; a task that dies or a run that passes ``timeout_s`` stops every task (process
groups killed) and raises one OpprofError naming the task and what was recorded.

Multi-host (allreduce): every host runs ``record`` with ``extra["cluster"]`` (all workers'
``host:port``, the same list everywhere) and its own ``extra["task_index"]`` (or
``node_rank``); each writes its worker's logdir, and ``opprof import`` of all of them merges.

Each profiled process writes ``<workdir>/<role><index>/plugins/profile/<run>/<host>.xplane.pb``
and emits one ``opprof.clock`` marker whose arguments carry its role, task index, rank and the
epoch time, so the normalizer can put all ranks on one clock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opprof.collectors import (
    Progress,
    RecordConfig,
    Recording,
    native_stderr_to,
    no_progress,
)
from opprof.collectors.datasets import channel_stats, load_images
from opprof.collectors.launch import die_with_parent, free_ports, last_line, stop
from opprof.collectors.torch_models import INPUT_SIZE, canonical_name
from opprof.errors import OpprofError

for _mod in ("tensorflow", "xprof"):
    if importlib.util.find_spec(_mod) is None:
        raise ModuleNotFoundError(f"No module named {_mod!r}", name=_mod)

MESSAGE = "OPPROF "
STEP_MARKER = "train"
ROLE_OF_TASK = {"worker": "worker", "ps": "server", "chief": "scheduler"}
_LOCAL = "127.0.0.1"


# --------------------------------------------------------------------------- entry point


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Train ``config.model`` with TensorFlow under its profiler; return the XPlane files."""
    _check(config)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if config.mode == "single" and not config.extra.get("cluster"):
        task = TaskSpec(config=asdict(config), role="worker", index=0, rank=0,
                        logdir=str(workdir / "worker0"))
        Path(task.logdir).mkdir(parents=True, exist_ok=True)
        # TensorFlow's native logs (oneDNN banner, profiler start/stop) go to the task log.
        with native_stderr_to(Path(task.logdir) / "task.log"):
            result = _run_worker(task, progress)
        return _recording(config, [result], workdir)
    return _Launcher(config, workdir, progress).run()


def _check(config: RecordConfig) -> None:
    if config.mode == "ps-sync":
        raise OpprofError(
            "--fw tf --mode ps-sync: TensorFlow's ParameterServerStrategy is asynchronous by "
            "design and TF 2 has no synchronous parameter-server training; use --mode ps-async "
            "or --mode allreduce")
    if config.mode not in ("single", "allreduce", "ps-async"):
        raise OpprofError(f"--fw tf: unknown mode {config.mode!r}")
    if config.device != "cpu":
        raise OpprofError(
            f"--fw tf --device {config.device}: the installed tensorflow-cpu has no GPU "
            "support; use --device cpu")
    extra = config.extra
    if int(extra.get("nnodes") or 1) > 1 and not extra.get("cluster"):
        raise OpprofError(
            "--fw tf on several hosts needs every worker's address (TF_CONFIG lists them all): "
            "pass --cluster HOST:PORT,HOST:PORT,... (every worker, in task order) and "
            "--node-rank (this host's task index)")
    if config.mode == "single" and config.workers != 1:
        raise OpprofError("--mode single runs one worker; pick allreduce or ps-async")
    if config.mode == "ps-async" and config.servers < 1:
        raise OpprofError("--mode ps-async needs at least one --servers")
    for name, value, low in (("batch_size", config.batch_size, 1), ("steps", config.steps, 1),
                             ("warmup", config.warmup, 0),
                             ("timing_steps", config.timing_steps, 1),
                             ("workers", config.workers, 1)):
        if value < low:
            raise OpprofError(f"{name} must be at least {low}, got {value}")
    canonical_name(config.model)


# --------------------------------------------------------------------------- one task


@dataclass
class TaskSpec:
    """What one task process does: its role in the cluster and where it writes."""

    config: dict[str, Any]
    role: str  # worker / ps / chief (TF_CONFIG task type)
    index: int
    rank: int
    logdir: str
    cluster: dict[str, list[str]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"


def _tf(threads: int | None = None) -> Any:
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


def _emit(event: str, **fields: Any) -> None:
    """A control message for the launcher (one line on stdout)."""
    print(MESSAGE + json.dumps({"event": event, **fields}), flush=True)


def _fault(spec: TaskSpec, stage: str) -> None:
    """Fault injection for tests: ``extra["inject_fault"] = {"task": "worker 1", "at": stage,
    "action": "exit" | "hang"}`` makes that task die or hang when it reaches ``stage``."""
    fault = spec.config.get("extra", {}).get("inject_fault")
    if not fault or fault.get("task") != spec.label or fault.get("at") != stage:
        return
    if fault.get("action") == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)


def _dataset(tf: Any, config: RecordConfig, size: int, shard: tuple[int, int] = (0, 1)):
    """The input pipeline: cached uint8 images, per-sample resize/scale/normalize/flip."""
    n = max(config.batch_size * 8, 256) * shard[1]
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


def _model(tf: Any, config: RecordConfig, classes: int, strategy: Any = None):
    import keras

    from opprof.collectors.tf_models import build, layer_counts

    keras.utils.set_random_seed(config.seed)
    with strategy.scope() if strategy is not None else nullcontext():
        model = build(config.model, classes)
        optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)
    return model, optimizer, layer_counts(model)


def _loss_fn(tf: Any, model: Any, global_batch: int) -> Callable[[Any, Any], Any]:
    import keras

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def loss(x: Any, y: Any) -> Any:
        return tf.nn.compute_average_loss(per_example(y, model(x, training=True)),
                                          global_batch_size=global_batch)

    return loss


def _stepper(tf: Any, model: Any, optimizer: Any, iterator: Any, strategy: Any,
             global_batch: int) -> Callable[[], Any]:
    """One training step with its four phase markers (see the module docstring)."""
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
        return loss

    return step


def _profiler_start(tf: Any, spec: TaskSpec) -> None:
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=1)
    tf.profiler.experimental.start(spec.logdir, options=options)
    # The epoch time beside a marker's profile-relative time puts every rank on one clock.
    # The arguments also describe the run, so an imported logdir knows what it holds.
    c = spec.config
    run = {"model": canonical_name(c["model"]), "mode": c["mode"], "dataset": c["dataset"],
           "batch_size": c["batch_size"], "framework_version": tf.__version__,
           "workers": c["workers"] if c["mode"] != "single" else 1,
           "servers": c["servers"] if c["mode"] == "ps-async" else 0}
    with tf.profiler.experimental.Trace("opprof.clock", epoch_ns=time.time_ns(),
                                        role=ROLE_OF_TASK[spec.role], task=spec.index,
                                        rank=spec.rank, **run):
        pass


def _run_worker(spec: TaskSpec, progress: Progress = no_progress) -> dict[str, Any]:
    """Single mode, or one MultiWorkerMirroredStrategy worker: warm up, time, profile."""
    config = RecordConfig(**spec.config)
    deadline = time.monotonic() + config.timeout_s
    tf = _tf(config.threads)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    strategy = None
    if config.mode == "allreduce":
        impl = tf.distribute.experimental.CommunicationImplementation.RING
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl))
        workers = strategy.num_replicas_in_sync

        def dataset_fn(ctx: Any) -> Any:
            return _dataset(tf, config, size, (ctx.input_pipeline_id,
                                               ctx.num_input_pipelines))[0]

        classes = _dataset(tf, config, size)[1]
        iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    else:
        workers = 1
        ds, classes = _dataset(tf, config, size)
        iterator = iter(ds)
    model, optimizer, counts = _model(tf, config, classes, strategy)
    step = _stepper(tf, model, optimizer, iterator, strategy, config.batch_size * workers)
    barrier = _barrier(tf, strategy)

    def check_time(stage: str, done: int) -> None:
        if time.monotonic() > deadline:
            raise OpprofError(
                f"tf recording ran past its {config.timeout_s:g}s limit during {stage} "
                f"(step {done}); use fewer --steps, a smaller --batch-size or model")

    def tick(stage: str, done: int, total: int) -> None:
        progress(stage, done, total)
        check_time(stage, done)

    _fault(spec, "setup")
    tick("warmup", 0, config.warmup)
    for i in range(config.warmup):
        step()
        tick("warmup", i + 1, config.warmup)
        if i == 0:
            _fault(spec, "warmup")
    barrier()
    times = []
    for i in range(config.timing_steps):
        t = time.perf_counter_ns()
        float(step())
        times.append(time.perf_counter_ns() - t)
        tick("timing", i + 1, config.timing_steps)
    step_ns = int(sum(times) / len(times))

    barrier()
    _profiler_start(tf, spec)
    _fault(spec, "profile")
    barrier()
    t0 = time.perf_counter_ns()
    try:
        tick("profile", 0, config.steps)
        for i in range(config.steps):
            with tf.profiler.experimental.Trace(STEP_MARKER, step_num=i, _r=1):
                loss = step()
            tick("profile", i + 1, config.steps)
        float(loss)
        t1 = time.perf_counter_ns()
        # A collective's own event is recorded when its thread leaves it, just after the step
        # has already seen it finish; one more round trip lets the last one be recorded
        # before the profiler stops.
        barrier()
    finally:
        tf.profiler.experimental.stop()
    return {
        "role": spec.role, "index": spec.index, "rank": spec.rank,
        "xplanes": [str(p) for p in _xplanes(Path(spec.logdir))],
        "unprofiled_step_ns": step_ns, "profiled_wall_ns": t1 - t0,
        "params": counts["params"], "layers": {k: v for k, v in counts.items() if k != "params"},
        "num_classes": classes, "input_size": size, "tf_version": tf.__version__,
        "threads": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                    "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                    "cpus": os.cpu_count()},
        "host": socket.gethostname(), "loss": float(loss),
    }


def _barrier(tf: Any, strategy: Any) -> Callable[[], None]:
    """All workers meet (a one-number all-reduce); a no-op without a strategy."""
    if strategy is None:
        return lambda: None

    def replica() -> Any:
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]))

    @tf.function
    def opprof_barrier() -> Any:
        return strategy.run(replica)

    return lambda: float(opprof_barrier())


def _run_server(spec: TaskSpec) -> None:
    """A ps or worker task of ParameterServerStrategy: a gRPC server that profiles itself
    when the launcher says so (commands on stdin: start, stop, exit)."""
    tf = _tf(spec.config.get("threads"))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    tf.distribute.Server(resolver.cluster_spec(), job_name=spec.role, task_index=spec.index,
                         protocol="grpc", start=True)
    _emit("ready")
    for line in sys.stdin:
        command = line.strip()
        if command == "start":
            _profiler_start(tf, spec)
            _fault(spec, "profile")
            _emit("started")
        elif command == "stop":
            tf.profiler.experimental.stop()
            _emit("stopped", xplanes=[str(p) for p in _xplanes(Path(spec.logdir))],
                  host=socket.gethostname())
        elif command == "exit":
            break
    os._exit(0)  # the gRPC server has no clean shutdown


def _run_coordinator(spec: TaskSpec) -> None:
    """The chief of ParameterServerStrategy: schedules steps onto the workers."""
    config = RecordConfig(**spec.config)
    tf = _tf(config.threads)
    key = canonical_name(config.model)
    size = INPUT_SIZE[key]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    classes = _dataset(tf, config, size)[1]
    model, optimizer, counts = _model(tf, config, classes, strategy)
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

    def run(n: int, stage: str, marked: bool = False) -> Any:
        result = None
        for i in range(n):
            with (tf.profiler.experimental.Trace(STEP_MARKER, step_num=i, _r=1) if marked
                  else nullcontext()):
                result = coordinator.schedule(opprof_step, args=(iterator,))
            _emit("progress", stage=stage, done=i + 1, total=n)
        coordinator.join()
        return result

    w = config.workers
    _fault(spec, "setup")
    run(config.warmup * w, "warmup")
    t0 = time.perf_counter_ns()
    run(config.timing_steps * w, "timing")
    step_ns = (time.perf_counter_ns() - t0) // config.timing_steps
    _emit("ready_to_profile")
    if sys.stdin.readline().strip() != "go":
        os._exit(4)
    _profiler_start(tf, spec)
    t0 = time.perf_counter_ns()
    try:
        loss = run(config.steps * w, "profile", marked=True).fetch()
        t1 = time.perf_counter_ns()
    finally:
        tf.profiler.experimental.stop()
    _emit("result", **{
        "role": spec.role, "index": spec.index, "rank": spec.rank,
        "xplanes": [str(p) for p in _xplanes(Path(spec.logdir))],
        "unprofiled_step_ns": int(step_ns), "profiled_wall_ns": t1 - t0,
        "params": counts["params"], "layers": {k: v for k, v in counts.items() if k != "params"},
        "num_classes": classes, "input_size": size, "tf_version": tf.__version__,
        "host": socket.gethostname(), "loss": float(loss), "scheduled_steps": config.steps * w,
    })
    if sys.stdin.readline().strip() == "exit":
        os._exit(0)


def _task_main(spec_path: str) -> None:
    """Entry point of a task process: ``python -m opprof.collectors.tf SPEC.json``."""
    spec = TaskSpec(**json.loads(Path(spec_path).read_text()))
    try:
        if spec.role == "chief":
            _run_coordinator(spec)
        elif spec.config["mode"] == "ps-async":
            _run_server(spec)
        else:
            result = _run_worker(spec, lambda stage, done, total: _emit(
                "progress", stage=stage, done=done, total=total))
            _emit("result", **result)
    except OpprofError as exc:
        _emit("error", message=str(exc))
        raise SystemExit(2) from None
    sys.stdout.flush()
    os._exit(0)  # skip TF's slow teardown of collective and gRPC threads


# --------------------------------------------------------------------------- the launcher


@dataclass
class _Task:
    spec: TaskSpec
    proc: subprocess.Popen
    log: Path
    offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    expected_exit: bool = False

    def poll_messages(self) -> None:
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith(MESSAGE):
                try:
                    self.events.append(json.loads(line[len(MESSAGE):]))
                except json.JSONDecodeError:
                    continue

    def has(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == event), None)

    def send(self, command: str) -> None:
        if self.proc.stdin and self.proc.poll() is None:
            try:
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def last_words(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if ln.startswith(MESSAGE) and '"error"' in ln]
        if errors:
            return json.loads(errors[-1][len(MESSAGE):]).get("message", "")
        return last_line(self.log, skip=(MESSAGE, "I0000", "W0000", "WARNING")) or "no output"


class _Launcher:
    """Starts a local cluster of task processes and drives it to the end or a clean stop."""

    def __init__(self, config: RecordConfig, workdir: Path, progress: Progress) -> None:
        self.config, self.workdir, self.progress = config, workdir, progress
        self.deadline = time.monotonic() + config.timeout_s
        self.tasks: list[_Task] = []
        self.stage = "start-up"
        self.shown = 0

    def run(self) -> Recording:
        try:
            specs = self._specs()
            for spec in specs:
                self.tasks.append(self._start(spec))
            if self.config.mode == "allreduce":
                results = self._drive_allreduce()
            else:
                results = self._drive_ps()
        except BaseException:
            self._stop_all()
            raise
        self._stop_all()
        return _recording(self.config, results, self.workdir)

    def _specs(self) -> list[TaskSpec]:
        c = self.config
        extra = c.extra
        base = asdict(c)
        if extra.get("cluster"):
            # Multi-host: this machine runs one task of a cluster given by --cluster/--task.
            if c.mode != "allreduce":
                raise OpprofError("--cluster (multi-host) is supported for --mode allreduce only")
            hosts = list(extra["cluster"])
            index = int(extra.get("task_index", extra.get("node_rank", 0)))
            if not 0 <= index < len(hosts):
                raise OpprofError(f"--task-index {index} is not in the {len(hosts)}-task cluster")
            base["workers"] = len(hosts)
            return [TaskSpec(base, "worker", index, index, str(self.workdir / f"worker{index}"),
                             {"worker": hosts})]
        if c.mode == "allreduce":
            ports = free_ports(c.workers, _LOCAL)
            cluster = {"worker": [f"{_LOCAL}:{p}" for p in ports]}
            return [TaskSpec(base, "worker", i, i, str(self.workdir / f"worker{i}"), cluster)
                    for i in range(c.workers)]
        ports = free_ports(1 + c.workers + c.servers, _LOCAL)
        cluster = {"chief": [f"{_LOCAL}:{ports[0]}"],
                   "worker": [f"{_LOCAL}:{p}" for p in ports[1:1 + c.workers]],
                   "ps": [f"{_LOCAL}:{p}" for p in ports[1 + c.workers:]]}
        specs = [TaskSpec(base, "worker", i, i, str(self.workdir / f"worker{i}"), cluster)
                 for i in range(c.workers)]
        specs += [TaskSpec(base, "ps", i, c.workers + i, str(self.workdir / f"ps{i}"), cluster)
                  for i in range(c.servers)]
        specs.append(TaskSpec(base, "chief", 0, c.workers + c.servers,
                              str(self.workdir / "chief0"), cluster))
        return specs

    def _start(self, spec: TaskSpec) -> _Task:
        folder = Path(spec.logdir)
        folder.mkdir(parents=True, exist_ok=True)
        spec_path = folder / "task-spec.txt"
        spec_path.write_text(json.dumps(asdict(spec)))
        log = folder / "task.log"
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": spec.cluster,
                                      "task": {"type": spec.role, "index": spec.index}})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "opprof.collectors.tf", str(spec_path)],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=die_with_parent, text=True, cwd=str(folder))
        return _Task(spec, proc, log)

    # -- waiting

    def _wait(self, tasks: list[_Task], event: str, stage: str) -> None:
        """Until every task in ``tasks`` has sent ``event``; fail on a death or the deadline."""
        self.stage = stage
        lead = self.tasks[0] if self.config.mode == "allreduce" else self.tasks[-1]
        while True:
            for t in self.tasks:
                t.poll_messages()
            progress = [e for e in lead.events if e.get("event") == "progress"]
            for e in progress[self.shown:]:
                self.progress(e["stage"], e["done"], e["total"])
            self.shown = len(progress)
            if all(t.has(event) for t in tasks):
                return
            for t in self.tasks:
                rc = t.proc.poll()
                if rc is not None and not (rc == 0 and t.has("result")) and not t.expected_exit:
                    raise self._failure(f"{t.spec.label} exited with code {rc} during {stage}: "
                                        f"{t.last_words()}")
            if time.monotonic() > self.deadline:
                waiting = ", ".join(t.spec.label for t in tasks if not t.has(event))
                raise self._failure(
                    f"timed out after {self.config.timeout_s:g}s during {stage}, waiting for "
                    f"{waiting} (hung?)")
            time.sleep(0.1)

    def _failure(self, what: str) -> OpprofError:
        self._stop_all()
        found = sorted(str(p.relative_to(self.workdir)) for p in _xplanes(self.workdir))
        recorded = (f"recorded {len(found)} profile(s): {', '.join(found)}" if found
                    else "no profile was recorded")
        return OpprofError(
            f"tf {self.config.mode}: {what}; all {len(self.tasks)} tasks stopped; {recorded}; "
            f"task logs in {self.workdir}/*/task.log")

    def _stop_all(self) -> None:
        """End every task's process group: SIGTERM, then SIGKILL after a short grace."""
        stop((t.proc for t in self.tasks), grace_s=3.0)
        for t in self.tasks:
            if t.proc.stdin:
                try:
                    t.proc.stdin.close()
                except OSError:
                    pass

    # -- the two modes

    def _drive_allreduce(self) -> list[dict[str, Any]]:
        self._wait(self.tasks, "result", "the run")
        for t in self.tasks:
            t.expected_exit = True
        return [t.has("result") for t in self.tasks]

    def _drive_ps(self) -> list[dict[str, Any]]:
        chief = self.tasks[-1]
        servers = self.tasks[:-1]
        self._wait(servers, "ready", "server start-up")
        self._wait([chief], "ready_to_profile", "warm-up and timing")
        for t in servers:
            t.send("start")
        self._wait(servers, "started", "profiler start")
        chief.send("go")
        self._wait([chief], "result", "profiled steps")
        for t in servers:
            t.send("stop")
        self._wait(servers, "stopped", "profiler stop")
        for t in self.tasks:
            t.expected_exit = True
            t.send("exit")
        results = []
        for t in servers:
            stopped = t.has("stopped")
            results.append({"role": t.spec.role, "index": t.spec.index, "rank": t.spec.rank,
                            "xplanes": stopped["xplanes"], "host": stopped.get("host")})
        results.append(chief.has("result"))
        return results


def _xplanes(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.xplane.pb"))


# --------------------------------------------------------------------------- metadata


def _recording(config: RecordConfig, results: list[dict[str, Any]], workdir: Path) -> Recording:
    native = [Path(p) for r in results for p in r.get("xplanes", [])]
    missing = [f"{r['role']} {r['index']}" for r in results if not r.get("xplanes")]
    if missing:
        raise OpprofError(f"tf {config.mode}: no profile written by {', '.join(missing)} "
                          f"(see {workdir}/*/task.log)")
    lead = next(r for r in results if "unprofiled_step_ns" in r)
    step_ns = lead["unprofiled_step_ns"]
    workers = config.workers if config.mode != "single" else 1
    servers = config.servers if config.mode == "ps-async" else 0
    meta: dict[str, Any] = {
        "framework": "tf",
        "framework_version": lead["tf_version"],
        "model": canonical_name(config.model),
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "workers": workers,
        "servers": servers,
        "mode": config.mode,
        "device": "cpu",
        "hosts": sorted({r["host"] for r in results if r.get("host")}),
        "warmup_steps": config.warmup,
        "timing_steps": config.timing_steps,
        "profiled_steps": config.steps,
        "unprofiled_step_ns": step_ns,
        "samples_per_s": config.batch_size * workers / (step_ns / 1e9) if step_ns else None,
        "params": lead["params"],
        "layers": lead["layers"],
        "input_size": lead["input_size"],
        "num_classes": lead["num_classes"],
        "seed": config.seed,
        "profiled_wall_ns": lead["profiled_wall_ns"],
        "command": config.command,
        "tasks": [{"role": ROLE_OF_TASK[r["role"]], "task": f"{r['role']}{r['index']}",
                   "rank": r["rank"]} for r in results],
    }
    if "threads" in lead:
        meta["threads"] = lead["threads"]
    if config.mode == "ps-async":
        meta["unprofiled_step_note"] = (
            "ps-async: wall time of timing_steps x workers scheduled steps / timing_steps, "
            "i.e. the mean step time of one worker")
        meta["scheduled_steps"] = lead.get("scheduled_steps")
    return Recording(native=native, meta=meta)


if __name__ == "__main__":
    _task_main(sys.argv[1])
