"""Closed sets as string enums (framework, mode, device, role, collective, run status) and one
table per framework of what the rest of opprof needs to know about it.

Standard library only: the collectors (which import no framework), the analyses and the
renderers all use these. Each member is a ``str``, so ``Mode.FSDP == "fsdp"`` and a value read
back from a `.trace`'s metadata compares equal to its member.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    """A closed set whose members are their text (``str(Mode.PS_SYNC) == "ps-sync"``)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every member's text, in order."""
        return tuple(str(m.value) for m in cls)


class Framework(Kind):
    """A deep-learning framework opprof records."""

    TORCH = "torch"
    TF = "tf"
    MXNET = "mxnet"
    JAX = "jax"
    CHAINER = "chainer"


class Mode(Kind):
    """How the workers of a job train together."""

    SINGLE = "single"
    ALLREDUCE = "allreduce"
    PS_SYNC = "ps-sync"
    PS_ASYNC = "ps-async"
    FSDP = "fsdp"  # sharded data parallel (torch FSDP2 fully_shard)
    ZERO = "zero"  # DDP with the optimizer state sharded (torch ZeroRedundancyOptimizer)
    TP = "tp"  # tensor parallel (torch DTensor parallelize_module)
    PP = "pp"  # pipeline parallel (torch.distributed.pipelining)
    EP = "ep"  # expert parallel (a mixture of experts, tokens exchanged by all-to-all)
    FSDP_TP = "fsdp+tp"  # a 2-D mesh: FSDP over one dimension, tensor parallel over the other


class Device(Kind):
    """Where the training runs."""

    CPU = "cpu"
    CUDA = "cuda"


class Role(Kind):
    """What a process of a job is (the `.trace` role column)."""

    WORKER = "worker"
    SERVER = "server"
    SCHEDULER = "scheduler"


class Collective(Kind):
    """How the model's communication term moves the gradients (``model.commmodel``)."""

    ALLREDUCE = "allreduce"  # ring all-reduce (DDP, MWMS; ZeRO's gradients too)
    PS = "ps"  # parameter-server push/pull over S servers
    FSDP = "fsdp"  # all-gather in forward and backward, reduce-scatter after backward


class RunStatus(Kind):
    """What became of one run of `opprof bench`'s matrix."""

    PLANNED = "planned"
    OK = "ok"
    RESUMED = "resumed"  # recorded by an earlier `bench` and kept (--resume)
    FAILED = "failed"
    SKIPPED = "skipped"  # a combination the framework does not record
    INTERRUPTED = "interrupted"
    NOT_RUN = "not run"  # the bench was interrupted before it


#: Every framework's and mode's text, in order (command-line choices).
FRAMEWORKS = Framework.values()
MODES = Mode.values()
#: Runs whose trace is there to compare.
DONE = (RunStatus.OK, RunStatus.RESUMED)
#: The multi-worker modes that shard the model's state (recognized from a trace's names).
SHARDED_MODES = (Mode.FSDP, Mode.ZERO)
#: The parameter-server modes.
PS_MODES = (Mode.PS_SYNC, Mode.PS_ASYNC)
#: The model-parallel modes `record` runs (torch): the model itself split across the workers.
MODEL_PARALLEL_MODES = (Mode.TP, Mode.PP, Mode.EP, Mode.FSDP_TP)

#: The lanes (tids) of a rank's asynchronous backend spans, the point-to-point calls in flight
#: (``ASYNC_TID``, ``ASYNC_TID - 1`` …: :func:`opprof.normalizers.kineto.async_lanes`).
ASYNC_TID = -1000
#: A communication backend's own span of a collective or a point-to-point call
#: (``gloo:all_reduce``, ``nccl:send``), as the profiler names it.
BACKEND_SPAN = r"(?:nccl|gloo|mpi|ucc|xccl):[A-Za-z_]\w*$"


def collective_of(mode: str) -> Collective | None:
    """The model's collective of a distributed mode; None for ``single`` (or no mode)."""
    if mode in PS_MODES:
        return Collective.PS
    if mode == Mode.FSDP:
        return Collective.FSDP
    if mode in (Mode.ALLREDUCE, Mode.ZERO):  # ZeRO: DDP's all-reduce of the gradients
        return Collective.ALLREDUCE
    return None


@dataclass(frozen=True)
class FrameworkInfo:
    """What the rest of opprof needs to know about one framework."""

    framework: Framework
    #: The module a training script imports (what ``opprof.profile()`` looks for).
    module: str
    #: Modules that must be importable for a recording (checked without importing them).
    requires: tuple[str, ...]
    #: The modes its collector records, ``single`` first.
    modes: tuple[Mode, ...]
    #: The multi-worker mode its users usually mean.
    default_mode: Mode
    #: Its adapter module (framework calls only) under ``opprof.collectors``.
    adapter: str
    #: Python that imports it in a subprocess (a broken install cannot crash the caller).
    probe: str
    #: The collective `opprof calibrate` times, and what it is called there.
    collective: Collective
    backend: str
    #: Environment variables every process of the framework needs at start-up (Chainer 7:
    #: ``SETUPTOOLS_USE_DISTUTILS=stdlib``, read by setuptools before any import).
    env: tuple[tuple[str, str], ...] = ()


FRAMEWORK_INFO: dict[Framework, FrameworkInfo] = {
    Framework.TORCH: FrameworkInfo(
        Framework.TORCH, "torch", ("torch",),
        (Mode.SINGLE, Mode.ALLREDUCE, Mode.FSDP, Mode.ZERO, *MODEL_PARALLEL_MODES),
        Mode.ALLREDUCE,
        "opprof.collectors.torch", "import torch", Collective.ALLREDUCE, "gloo all_reduce"),
    Framework.TF: FrameworkInfo(
        Framework.TF, "tensorflow", ("tensorflow", "xprof"),
        (Mode.SINGLE, Mode.ALLREDUCE, Mode.PS_ASYNC), Mode.ALLREDUCE,
        "opprof.collectors.tf", "import tensorflow, xprof", Collective.ALLREDUCE,
        "CollectiveReduceV2 (ring) under MultiWorkerMirroredStrategy"),
    Framework.MXNET: FrameworkInfo(
        Framework.MXNET, "mxnet", ("mxnet",),
        (Mode.SINGLE, Mode.PS_SYNC, Mode.PS_ASYNC), Mode.PS_SYNC,
        "opprof.collectors.mxnet",
        "from opprof.collectors.mxnet_lib import import_mxnet; import_mxnet()", Collective.PS,
        "kvstore dist_sync push/pull"),
    Framework.JAX: FrameworkInfo(
        Framework.JAX, "jax", ("jax", "optax", "xprof"),
        (Mode.SINGLE, Mode.ALLREDUCE), Mode.ALLREDUCE,
        "opprof.collectors.jax", "import jax, optax, xprof", Collective.ALLREDUCE,
        "psum (all-reduce) over jax.distributed, gloo CPU collectives"),
    Framework.CHAINER: FrameworkInfo(
        Framework.CHAINER, "chainer", ("chainer",),
        (Mode.SINGLE, Mode.ALLREDUCE), Mode.ALLREDUCE,
        "opprof.collectors.chainer", "import chainer", Collective.ALLREDUCE,
        "ChainerMN multi_node_mean_grad (MPI all-reduce)",
        env=(("SETUPTOOLS_USE_DISTUTILS", "stdlib"),)),
}


def framework_info(fw: str) -> FrameworkInfo:
    """The table row of framework ``fw`` (its text or member); ValueError for another."""
    return FRAMEWORK_INFO[Framework(fw)]


def default_mode(fw: str | None) -> Mode:
    """The multi-worker mode a framework's users usually mean (allreduce for an unknown one)."""
    try:
        return framework_info(str(fw)).default_mode
    except ValueError:
        return Mode.ALLREDUCE
