"""Typed configuration of a recording, shared by `record`, `run` and `opprof.profile()`; imports
no framework, so `--fw tf` works where torch is not installed.

* closed sets are the core's enums (:mod:`opprof.kinds`): :class:`Framework`, :class:`Mode`,
  :class:`Device`, :class:`Role`; what each framework records is its row of
  :data:`opprof.kinds.FRAMEWORK_INFO`;
* the built-in models' shared facts (names, input sizes) live here, not in a framework module;
* :class:`Rendezvous` is where a multi-worker job meets (torchrun / DMLC / TF_CONFIG terms);
* :class:`Protocol` is what the runner does in every process (warm-up, timing, profiled
  steps); :class:`RecordConfig` adds what `record` builds (model, data, cluster shape). It is
  the one declaration of `opprof record`'s options: each field says how the command line
  gives it (:func:`option`: its help, bounds, choices), and the command's click options are
  made from the fields (:func:`opprof.commands.config_options`), so adding an option is one
  field here;
* :class:`Facts` is what one process reports about itself (its status file), and
  :func:`job_meta` turns the facts of every process into the `.trace` metadata.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict

from opprof.errors import OpprofError
from opprof.kinds import FRAMEWORKS as FRAMEWORKS  # re-exported: the closed sets live in
from opprof.kinds import MODES as MODES  # the core, where analysis and renderers use them too
from opprof.kinds import Device as Device
from opprof.kinds import Framework as Framework
from opprof.kinds import Mode as Mode
from opprof.kinds import Role as Role
from opprof.kinds import framework_info

if TYPE_CHECKING:
    from opprof.meta import CurveRow


def require_installed(fw: Framework) -> None:
    """An OpprofError naming the missing package when framework ``fw`` is not installed
    (checked without importing it)."""
    import importlib.util

    for name in framework_info(fw).requires:
        if importlib.util.find_spec(name) is None:
            raise OpprofError(f"--fw {fw} needs {name}, which is not installed: "
                              f"pip install -e '.[{fw}]' -c constraints.txt")


# ------------------------------------------------------------------ the built-in models

#: Input side (pixels) of each built-in model; the model docstrings are in torch_models.py.
#: The sequence models' input is SEQ_LEN tokens (their "size"), not an image.
SEQ_LEN = 32
INPUT_SIZE = {"lenet5": 32, "alexnet": 64, "resnet18": 32, "resnet50": 32, "fcn": 32,
              "lstm": SEQ_LEN, "transformer": SEQ_LEN}
MODELS = tuple(INPUT_SIZE)
#: The language models, trained on ``datasets.synthetic_tokens`` (next-token prediction).
SEQUENCE_MODELS = ("lstm", "transformer")
#: The fully connected network's hidden layers (width, count; torch_models.py, FCN).
FCN_WIDTH, FCN_HIDDEN = 1024, 3
#: The sequence models' sizes (torch_models.py): token embedding width, LSTM hidden units
#: and layers; transformer model width, heads, feed-forward width and encoder layers.
EMBED_DIM, LSTM_HIDDEN, LSTM_LAYERS = 64, 128, 2
D_MODEL, HEADS, FF_DIM, ENCODER_LAYERS = 64, 4, 128, 2


#: SGD's learning rate (momentum 0.9) in every framework: 0.01, but the LSTM's 0.1 (at 0.01
#: its loss hardly moves in a few hundred steps).
LEARNING_RATE = {"lstm": 0.1}


def learning_rate(name: str) -> float:
    """The built-in model's SGD learning rate, the same in every framework."""
    return LEARNING_RATE.get(canonical_name(name), 0.01)


def is_sequence_model(name: str) -> bool:
    """True for the language models (token input), False for the image classifiers."""
    return canonical_name(name) in SEQUENCE_MODELS


def canonical_name(name: str) -> str:
    """``LeNet-5`` / ``resnet_18`` / ``ResNet18`` → the key used in INPUT_SIZE."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in INPUT_SIZE:
        raise OpprofError(f"unknown model {name!r}; choose from {', '.join(INPUT_SIZE)}")
    return key


# ------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class Option:
    """How a configuration field is given on the command line — plain data (no click here):
    :func:`opprof.commands.config_options` makes the click option from it and the field's
    type and default. ``flag``: the option's name (default ``--field-name``); ``minimum`` /
    ``maximum``: the bounds of a number (``min_open``: the minimum itself refused);
    ``choices``: the values taken (default: an enum field's); ``unset``: the command line's
    default is None, meaning the field's own default or what :meth:`RecordConfig.from_options`
    derives (said in the help). A bool field is a switch: ``--name/--no-name`` when it is on
    by default, else a flag."""

    help: str = ""
    flag: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    min_open: bool = False
    choices: tuple[str, ...] | None = None
    unset: bool = False
    show_default: bool = True


def option(default: Any = MISSING, *, help: str = "", **how: Any) -> Any:  # noqa: A002
    """A configuration field given on the command line (see :class:`Option`); no default:
    the option is required."""
    meta = {"option": Option(help=help, **how)}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def options_of(cls: type) -> list[tuple[str, Any, Option]]:
    """(field name, default or MISSING, :class:`Option`) of every field of the dataclass
    ``cls`` given on the command line, in order; a field holding another configuration
    (``metadata["options"]``) gives its fields in its place."""
    out: list[tuple[str, Any, Option]] = []
    for f in fields(cls):
        nested = f.metadata.get("options")
        if nested is not None:
            out += options_of(nested)
        elif "option" in f.metadata:
            out.append((f.name, f.default, f.metadata["option"]))
    return out


@dataclass(frozen=True)
class Rendezvous:
    """Where the processes of a job meet. On one machine everything is loopback and a free
    port; on several, every host runs the same command with its own ``node_rank``."""

    nnodes: int = option(1, minimum=1, unset=True,
                         help="Hosts in a multi-host job (run the same command on each).")
    node_rank: int = option(0, minimum=0, unset=True,
                            help="This host's index in a multi-host job.")
    master_addr: str = option("127.0.0.1", unset=True,
                              help="Rendezvous host (default 127.0.0.1).")
    #: 0: a free port picked at run time (one machine only)
    master_port: int = option(0, minimum=0, maximum=65535, unset=True,
                              help="Rendezvous port (default: a free one; needed with "
                                   "--nnodes > 1).")
    #: TF on several hosts: every worker's HOST:PORT, in order
    cluster: tuple[str, ...] = option((), unset=True,
                                      help="Every worker's HOST:PORT, comma-separated "
                                           "(TensorFlow on several hosts; --node-rank is this "
                                           "host's task index).")
    clock_sync: str = "auto"  # torch: auto (offsets for other machines) | always | off

    def check(self, workers: int, split_evenly: bool) -> None:
        """One clear error for settings that cannot work."""
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise OpprofError(f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} "
                              f"(--nnodes {self.nnodes})")
        if not 0 <= self.master_port < 65536:
            raise OpprofError(f"--master-port {self.master_port} is not a TCP port")
        if self.nnodes > 1 and not self.master_port and not self.cluster:
            raise OpprofError(f"--nnodes {self.nnodes} needs --master-port (the same on every "
                              "node)")
        if split_evenly and workers % self.nnodes:
            raise OpprofError(f"--workers {workers} (the whole job's ranks) must split "
                              f"evenly over --nnodes {self.nnodes}")
        if self.clock_sync not in ("auto", "always", "off"):
            raise OpprofError(f"clock sync {self.clock_sync!r}: choose auto, always or off")

    @property
    def loopback(self) -> bool:
        """Whether the job stays on this machine's loopback interface."""
        return self.master_addr.startswith(("127.", "localhost", "::1")) and not self.cluster


@dataclass(frozen=True)
class Protocol:
    """What the runner does in every process: ``warmup`` unprofiled steps, ``timing_steps``
    unprofiled timed steps (the median of all timed steps is the unprofiled step time, so the
    profiler's own overhead is known), then ``steps`` profiled steps, then ``timing_after``
    unprofiled timed steps more (so a change of the machine's load during the run is seen)."""

    steps: int = 5
    warmup: int = 2
    timing_steps: int = 3
    timing_after: int = 0
    #: Record the framework allocator's memory events with the profiler (torch and MXNet
    #: ``profile_memory``; TensorFlow records its allocator at host tracer level 2 anyway).
    profile_memory: bool = True

    def check(self, *, min_warmup: int = 0, min_timing: int = 0) -> None:
        for name, value, low in (("steps", self.steps, 1), ("warmup", self.warmup, min_warmup),
                                 ("timing_steps", self.timing_steps, min_timing),
                                 ("timing_after", self.timing_after, 0)):
            if value < low:
                raise OpprofError(f"{name} must be at least {low}, got {value}")

    @property
    def unprofiled(self) -> int:
        """Steps a process runs before the profiler starts."""
        return self.warmup + self.timing_steps


@dataclass(frozen=True)
class RecordConfig:
    """What `opprof record` records: one framework, model, data set and cluster shape — the
    command's options, each declared here once (:func:`option`)."""

    fw: Framework = option(choices=FRAMEWORKS, help="Framework to run.")
    model: str = option(choices=MODELS, help="Built-in model.")
    dataset: str = option("synthetic-cifar10", help="synthetic-cifar10, cifar10, cifar100 "
                                                    "(local python batches) or a PATH.")
    batch_size: int = option(32, minimum=1)
    steps: int = option(5, minimum=1, help="Profiled steps.")
    warmup: int = option(2, minimum=0, help="Unprofiled warm-up steps.")
    timing_steps: int = option(3, minimum=1, help="Unprofiled timed steps (the profiler's "
                                                  "overhead is measured against them).")
    workers: int = option(1, minimum=1)
    servers: int = option(1, minimum=1, help="Parameter servers (ps modes).")
    #: The command line's None: single for one worker, else the framework's usual
    #: (:meth:`from_options`).
    mode: Mode = option(Mode.SINGLE, choices=MODES, unset=True,
                        help="Distributed mode (default: single for 1 worker, else the "
                             "framework's usual).")
    device: Device = option(Device.CPU)
    nsys: bool = option(False, help="Also record under NVIDIA Nsight Systems (needs nsys on "
                                    "PATH).")
    #: Record the framework allocator's memory with its profiler (torch and MXNet
    #: ``profile_memory``; TensorFlow always records its allocator).
    profile_memory: bool = option(True, help="Record the framework allocator's memory with its "
                                             "profiler (torch and MXNet profile_memory; "
                                             "TensorFlow always records its allocator).")
    #: Seconds between two samples of every process's resident memory (0: no sampling).
    memory_interval_s: float = option(0.02, flag="--memory-interval", minimum=0,
                                      help="Seconds between samples of the resident memory of "
                                           "every process of the run, taken from outside them "
                                           "(0: no sampling).")
    #: Compute threads per worker (OpenMP / torch threads, TF intra- and inter-op threads);
    #: None: the host's CPUs split among the processes that compute.
    threads: int | None = option(None, minimum=1, help=(
        "Compute threads per worker (torch/OpenMP threads, TF intra- and inter-op threads, "
        "MXNet's OpenMP). Default: one worker, the framework's (every CPU); several, every "
        "framework the same: the host's CPUs split among the processes that compute on it "
        "(MXNet's servers count). Give the same number to a baseline that `opprof model` "
        "predicts from and to the runs it checks against."))
    #: DataLoader worker processes that load ahead (torch, MXNet; 0: in the training process).
    loader_workers: int = option(0, minimum=0, help=(
        "DataLoader worker processes that load batches ahead of the step (torch, MXNet; 0: in "
        "the training process)."))
    #: DistributedDataParallel's bucket size, MiB (None: DDP's own).
    bucket_mb: float | None = option(None, minimum=0, min_open=True, help=(
        "DistributedDataParallel's gradient bucket size in MiB (torch allreduce and zero; "
        "default DDP's 25, its first bucket 1)."))
    seed: int = option(0)
    #: `--converge STEPS`: train this many steps in all (0: the protocol's only), the loss of
    #: each and the accuracy every ``eval_every`` steps (0: at the end only).
    converge: int = option(0, minimum=0, help="Train STEPS steps in all (the profiled ones "
                                              "among them), keeping each step's loss and "
                                              "time: the convergence table beside the "
                                              "breakdown.")
    eval_every: int = option(0, minimum=0, help="With --converge: train and test accuracy "
                                                "every K steps (0: at the end).")
    timeout_s: float = option(600.0, flag="--timeout",
                              help="Seconds before a hung run is stopped.")
    rendezvous: Rendezvous = field(default_factory=Rendezvous,
                                   metadata={"options": Rendezvous})
    command: str = ""  # the command line, kept in the trace

    def __post_init__(self) -> None:
        for name, enum in (("fw", Framework), ("mode", Mode), ("device", Device)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                choices = ", ".join(e.value for e in enum)
                raise OpprofError(f"unknown {name} {value!r}; choose from {choices}") from None
        if isinstance(self.rendezvous, dict):
            rv = dict(self.rendezvous)
            rv["cluster"] = tuple(rv.get("cluster") or ())
            object.__setattr__(self, "rendezvous", Rendezvous(**rv))

    @property
    def protocol(self) -> Protocol:
        """The runner's protocol: the unprofiled timing is repeated after the profile."""
        return Protocol(self.steps, self.warmup, self.timing_steps,
                        timing_after=self.timing_steps, profile_memory=self.profile_memory)

    def to_json(self) -> str:
        """The configuration as JSON (enums as their values), for the worker processes."""
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> RecordConfig:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes: Any) -> RecordConfig:
        """A copy with some fields changed."""
        return RecordConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)},
                               **changes})

    @classmethod
    def from_options(cls, values: Mapping[str, Any], **more: Any) -> RecordConfig:
        """The configuration of the command line's option ``values`` (by field name, the
        rendezvous' among them; None where an :attr:`Option.unset` option was not given),
        with ``more`` fields (``command``). An unset mode is single for one worker, else the
        framework's usual; a comma-separated list is a tuple."""
        rv_names = {f.name for f in fields(Rendezvous)}
        given = {k: v for k, v in values.items() if v is not None}
        rv: dict[str, Any] = {
            k: tuple(h.strip() for h in v.split(",") if h.strip()) if k == "cluster" else v
            for k, v in given.items() if k in rv_names}
        mine = {k: v for k, v in given.items() if k not in rv_names}
        mine.update(more)
        if "mode" not in mine:
            workers = int(mine.get("workers", 1))
            mine["mode"] = (Mode.SINGLE if workers == 1
                            else framework_info(Framework(mine["fw"])).default_mode)
        return cls(rendezvous=Rendezvous(**rv), **mine)


# ------------------------------------------------------------------ what a process reports

#: A process's compute threads: torch's and MXNet's count, TensorFlow's pools
#: (``intra_op``, ``inter_op``, ``cpus``); None when unknown.
Threads = int | dict[str, int | None] | None



@dataclass
class Facts:
    """What one profiled process says about itself: its status file while it runs, its facts
    when it is done. ``extra`` holds what only one framework knows (clock offsets, kvstore)."""

    pid: int
    host: str
    label: str  # how the supervisor names it: "rank 1", "server 0", "pid 4242"
    role: Role = Role.WORKER
    rank: int | None = None
    framework: str = ""
    framework_version: str = ""
    stage: str = "start"
    done: int = 0  # steps done in this stage
    total: int = 0  # steps this stage has
    steps_seen: int = 0
    warmup: int = 0
    timing_steps: int = 0
    profiled_steps: int = 0  # profiled steps completed
    profiled_target: int = 0
    unprofiled_step_ns: int | None = None
    timing_ns: list[int] = field(default_factory=list)  # each unprofiled timed step, before
    timing_after_ns: list[int] = field(default_factory=list)  # and after the profile
    profiled_wall_ns: int | None = None
    threads: Threads = None
    native: list[str] = field(default_factory=list)
    ended: str | None = None  # why the process stopped early (an exception, a signal)
    error: str | None = None  # the one-line error a failing process gives
    #: `record --converge`: [steps done, steps] while it trains, then one row per step
    #: (step, time_ns, loss, train_accuracy, test_accuracy; :class:`.runner.Convergence`).
    converge: list[int] = field(default_factory=list)
    convergence: list[CurveRow] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> Facts:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        facts = cls(**{k: v for k, v in data.items() if k in known})
        facts.role = Role(facts.role)
        return facts

    @property
    def where(self) -> str:
        """``warmup (1/2 steps done)``, ``start-up``, ``shut-down``."""
        if self.stage in ("start", "setup"):
            return "start-up"
        if self.stage == "done":
            return "shut-down"
        if self.stage == "clock":
            return "clock sync"
        if self.stage == "write":
            return "writing its trace"
        return f"{self.stage} ({self.done}/{self.total} steps done)"


class FactsUpdate(TypedDict, total=False):
    """Some of a process's :class:`Facts`, changed at once (:meth:`.channel.Reporter.update`)."""

    role: Role
    rank: int | None
    label: str
    stage: str
    done: int
    total: int
    steps_seen: int
    profiled_steps: int
    unprofiled_step_ns: int | None
    timing_ns: list[int]
    timing_after_ns: list[int]
    profiled_wall_ns: int | None
    threads: Threads
    native: list[str]
    ended: str | None
    error: str | None
    converge: list[int]
    convergence: list[CurveRow]
    extra: dict[str, Any]


class ClockSync(TypedDict):
    """What one rank measured and applied when the ranks' clocks were synced
    (:func:`opprof.collectors.torch.clock_sync`; ``Facts.extra["clock"]``)."""

    offset_ns: int  # applied to its events (0 when not applied)
    error_ns: int
    measured_offset_ns: int
    measured_error_ns: int
    machine: str  # the machine's clock (boot id or host name)
    same_machine_as_rank0: bool
    policy: str  # auto, always, off
    method: str


#: Facts one process may know for the whole job (the first process that has one gives it).
JOB_FACTS = ("backend", "kvstore", "optimizer", "strategy", "batch_size", "scheduled_steps",
             "unprofiled_step_note", "onednn", "graphs", "unbulked_step_ns", "loader_workers",
             "bucket_mb")


def job_meta(facts: list[Facts], **job: Any) -> dict[str, Any]:
    """The `.trace` metadata of a job from the facts of its processes and what the job itself
    knows (``job``: model, dataset, mode, command …, which win)."""
    facts = sorted(facts, key=lambda f: (f.role != Role.WORKER, f.rank is None, f.rank or 0))
    workers = [f for f in facts if f.role == Role.WORKER]
    lead = facts[0] if facts else None
    timed = ([f.unprofiled_step_ns for f in workers if f.unprofiled_step_ns]
             or [f.unprofiled_step_ns for f in facts if f.unprofiled_step_ns])
    step_ns = int(sum(timed) / len(timed)) if timed else None
    meta: dict[str, Any] = {}
    if lead is not None:
        meta.update({"framework": lead.framework, "framework_version": lead.framework_version,
                     "warmup_steps": lead.warmup, "timing_steps": lead.timing_steps,
                     "profiled_steps": lead.profiled_target, "threads": lead.threads})
        shared = ("params", "param_bytes", "param_arrays", "unit_param_bytes", "layers",
                  "input_size", "num_classes", "model", "dataset", "device", "seed")
        meta.update({k: lead.extra[k] for k in shared if k in lead.extra})
    for key in JOB_FACTS:
        value = next((f.extra[key] for f in facts if f.extra.get(key) is not None), None)
        if value is not None:
            meta[key] = value
    clocks = {str(f.rank): f.extra["clock"] for f in workers if f.extra.get("clock")}
    if clocks:
        meta.update(clock_meta(clocks))
    if str(meta.get("kvstore", "")).startswith("dist"):
        # A PS worker pushes every gradient and pulls every weight once per step; MXNet's
        # trace does not say which array an operator moved, so this is per step (the
        # normalizer puts it on the step's comm windows).
        meta["comm_bytes_per_step"] = {str(f.rank): 2 * int(f.extra.get("param_bytes", 0))
                                       for f in workers}
    meta.update({
        "workers": len(workers),
        "servers": sum(f.role == Role.SERVER for f in facts),
        "hosts": sorted({f.host for f in facts}),
        "unprofiled_step_ns": step_ns,
        "unprofiled_step_ns_per_rank": {str(f.rank): f.unprofiled_step_ns for f in workers},
        "unprofiled_samples_ns": {str(f.rank): {"before": f.timing_ns,
                                                "after": f.timing_after_ns}
                                  for f in workers if f.timing_ns or f.timing_after_ns},
        "profiled_wall_ns": max((f.profiled_wall_ns or 0 for f in workers), default=0) or None,
        "rank_pids": {str(f.rank): f.pid for f in workers},
        "tasks": [{"role": str(f.role), "task": f.label.replace(" ", ""), "rank": f.rank}
                  for f in facts],
        "per_rank": [{"rank": f.rank, "role": str(f.role), "host": f.host, "pid": f.pid,
                      "unprofiled_step_ns": f.unprofiled_step_ns,
                      "profiled_wall_ns": f.profiled_wall_ns, "threads": f.threads,
                      "steps_seen": f.steps_seen, "profiled_steps": f.profiled_steps,
                      **({"param_bytes": int(f.extra["param_bytes"])}
                         if f.extra.get("param_bytes") is not None else {}),
                      **({"ended": f.ended} if f.ended else {})} for f in facts],
    })
    curves = [{"rank": f.rank if f.rank is not None else i, **row}
              for i, f in enumerate(facts) if f.convergence for row in f.convergence]
    if curves:  # `record --converge`: one row per step and process (a TF ps-async chief's)
        meta["convergence"] = curves
    meta.update(job)
    batch = meta.get("batch_size")
    if step_ns and batch and meta["workers"]:
        meta["samples_per_s"] = int(meta["workers"]) * int(batch) / (step_ns / 1e9)
    return meta


def clock_meta(clocks: dict[str, ClockSync]) -> dict[str, Any]:
    """The job metadata of the ranks' clock syncs (rank → what each rank measured and applied:
    ``offset_ns``, ``error_ns``, ``measured_offset_ns``, ``measured_error_ns``, ``machine``,
    ``policy``, ``method``)."""
    first = next(iter(clocks.values()))
    return {
        "clock_offsets_ns": {r: c["offset_ns"] for r, c in clocks.items()},
        "clock_error_ns": {r: c["error_ns"] for r, c in clocks.items()},
        "clock_sync": {"method": first.get("method", ""), "policy": first.get("policy", ""),
                       "measured_offsets_ns": {r: c["measured_offset_ns"]
                                               for r, c in clocks.items()},
                       "measured_error_ns": {r: c["measured_error_ns"]
                                             for r, c in clocks.items()},
                       "machines": {r: c["machine"] for r, c in clocks.items()}},
    }


def keras_backend() -> str:
    """The backend of the Keras 3 imported in this process (``KERAS_BACKEND``, keras.json, …;
    ``tensorflow`` when none is imported yet)."""
    config = sys.modules.get("keras.src.backend.config")
    return str(config.backend()) if config is not None else "tensorflow"
