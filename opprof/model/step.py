"""The simulated training step's shared types: the compute lane's phases, a pipeline policy,
the inputs of a step (:class:`StepPlan`; an FSDP step: :class:`ShardedPlan`), its result
(:class:`SimResult`) and the expected wait for the slowest of N workers.

Every module of the performance model that builds, runs or reads a simulated step imports them
from here, so that no two model modules import each other (the simulators:
:mod:`opprof.model.simulate`, :mod:`opprof.model.sharded`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from opprof.arrays import Array

COMPUTE_PHASES = ("load", "h2d", "forward", "backward", "update", "other")


@dataclass(frozen=True)
class Policy:
    """How a framework moves gradients: when messages start, how they are grouped, where the
    update runs."""

    name: str
    overlap: bool  # messages start when their gradients are ready, during backward
    first_bucket_bytes: int = 0
    bucket_bytes: int = 0  # 0: one message of all gradients
    server_update: bool = False
    describe: str = ""
    pack: bool = False  # gradients packed into one tensor before, split after (an update cost)
    per_tensor: bool = False  # one message per gradient (a kvstore key), not one for all

@dataclass
class StepPlan:
    """The inputs of one simulated step (times in ns)."""

    phases: dict[str, float]  # compute lane: load, h2d, forward, backward, update, other
    ready_frac: Array  # gradients in ready order: fraction of backward when ready
    grad_bytes: Array  # bytes of each gradient
    policy: Policy
    cost: Callable[[float], float]  # bytes -> ns of one collective (N and S already applied)
    comm_scale: float = 1.0
    io_busy_ns: float = 0.0
    io_prefetch: bool = False
    straggler_ns: float = 0.0
    server_update_ns: float = 0.0
    communicate: bool = True
    pack_ns: float = 0.0  # packing and unpacking the gradients (policies with ``pack``)
    #: compute beside a collective takes (1 + interference) × its time alone
    #: (:mod:`opprof.model.interference`)
    interference: float = 0.0
    #: a collective beside compute takes (1 + comm_interference) × its cost
    comm_interference: float = 0.0
    #: more time of the step's first message only (ns; a kvstore's first key, the one call
    #: that follows the compute: :func:`opprof.model.predict.plan`)
    first_extra_ns: float = 0.0
    #: more input time of every step that no prefetch hides (ns; TensorFlow's distributed
    #: dataset: :func:`opprof.model.predict.distributed_input_ns`)
    input_ns: float = 0.0


@dataclass
class SimResult:
    """One simulated step: wall ns per phase (summing to ``step_ns``) and the messages."""

    step_ns: float
    phases: dict[str, float]
    comm_busy_ns: float
    comm_hidden_ns: float
    messages: list[dict[str, float]] = field(default_factory=list)
    #: the part of ``phases["backward"]`` that is compute slowed beside collectives
    interference_ns: float = 0.0

@dataclass
class ShardedPlan:
    """The inputs of one simulated FSDP step (times in ns, bytes unsharded)."""

    phases: dict[str, float]  # compute lane: load, h2d, forward, backward, update, other
    unit_bytes: Array  # root first, then each unit, in forward order
    share: Array  # each unit's share of the forward and backward compute (sums to 1)
    cost: Callable[[str, float], float]  # (kind, bytes) -> ns of one collective
    copy_ns_per_byte: float
    workers: int
    overlap: bool
    comm_scale: float = 1.0
    io_busy_ns: float = 0.0
    io_prefetch: bool = False
    straggler_ns: float = 0.0
    communicate: bool = True

def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n ≤ 1), by numerical integration: how
    many standard deviations the slowest of n workers lies above the mean."""
    if n <= 1:
        return 0.0
    x = np.linspace(-9.0, 9.0, 6001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    pdf = np.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi)
    dens = n * pdf * cdf ** (n - 1)
    return float(np.sum(x * dens) * (x[1] - x[0]))
