"""The model pipeline: the trace (and the measured run ``--check`` compares with) read once
each, the step predicted at each worker count (or, for a model-parallel job, at each degree
of its dimension) and checked, one immutable result that every renderer only draws
(:func:`model`: a :class:`~opprof.model.predict.ModelResult`, a
:class:`~opprof.model.parallel.ParallelResult`, or for a one-worker trace with ``--mode tp|pp``
a :class:`~opprof.model.fromsingle.SplitResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.errors import OpprofError
from opprof.pipeline.sources import Traces

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from opprof.meta import MetaMapping
    from opprof.model.fromsingle import SplitResult
    from opprof.model.parallel import ParallelResult
    from opprof.model.predict import ModelResult

#: The model-parallel dimensions `opprof model --mode` takes (opprof.model.parallel).
MODEL_PARALLEL = ("tp", "pp", "ep")


@dataclass(frozen=True)
class ModelOptions:
    """What `opprof model` is asked for (None: the trace's, or the default)."""

    paths: tuple[Path, ...]
    workers: tuple[int, ...] = (1, 2, 4, 8)
    mode: str | None = None
    servers: int | None = None
    network: Path | None = None  # a network file (`opprof calibrate -o net.json`)
    measured: Path | None = None  # --check: a measured multi-worker trace
    workers_per_host: int | None = None
    straggler: bool = True
    microbatches: int | None = None  # --mode pp: the predicted pipeline's micro-batches
    schedule: str | None = None  # --mode pp from one worker: gpipe or 1f1b

    @property
    def label(self) -> str:
        """The modelled trace's name."""
        first = self.paths[0].name
        return first if len(self.paths) == 1 else f"{first} (+{len(self.paths) - 1})"


def dimension(mode: str | None, trace_mode: object) -> str | None:
    """The model-parallel dimension to model: ``--mode tp|pp|ep``, else the one the trace's
    layout names (the last of ``fsdp+tp``), else None (the data-parallel model)."""
    if mode in MODEL_PARALLEL:
        return mode
    if mode is not None:
        return None
    dims = [d for d in str(trace_mode or "").split("+") if d in MODEL_PARALLEL]
    return dims[-1] if dims else None


def parallel(result: ModelResult | ParallelResult | SplitResult) -> TypeIs[ParallelResult]:
    """Whether ``result`` is a model-parallel job's (its own renderer draws it)."""
    from opprof.model.parallel import ParallelResult

    return isinstance(result, ParallelResult)


def from_single(result: ModelResult | ParallelResult | SplitResult) -> TypeIs[SplitResult]:
    """Whether ``result`` splits a one-worker trace (its own renderer draws it)."""
    from opprof.model.fromsingle import SplitResult

    return isinstance(result, SplitResult)


def one_worker(meta: MetaMapping, dim: str) -> bool:
    """Whether the trace is a one-worker run (no ``dim`` to scale from: the model splits it,
    :mod:`opprof.model.fromsingle`)."""
    par = meta.get("parallelism") or {}
    degree = int((par.get(dim) or {}).get("degree") or 1) if isinstance(par, dict) else 1
    return degree < 2 and int(meta.get("workers") or 1) <= 1


def model(o: ModelOptions) -> ModelResult | ParallelResult | SplitResult:
    """The prediction (and its check against ``o.measured``), each trace read once; the
    measured run's worker count is predicted too, in its mode and with its servers unless
    the options say otherwise."""
    from opprof.analysis.noise import assess, flags
    from opprof.model.predict import predict, with_check
    from opprof.pipeline.calibrate import read_network

    net = read_network(o.network)
    traces = Traces()
    tr = traces.load(o.paths)
    dim = dimension(o.mode, tr.meta.get("mode"))
    if dim is not None and one_worker(tr.meta, dim):
        from opprof.model.fromsingle import (
            DIMENSIONS,
            check_from_single,
            predict_from_single,
            with_split_check,
        )

        if o.mode is None and dim not in DIMENSIONS:
            # the layout is the trace's (one rank's file of a larger job), not the user's
            raise OpprofError(
                f"{o.label}: a {tr.meta.get('mode')} job's layout, but one worker's trace: "
                f"{dim} is modelled from the trace of all its ranks (give every rank's file), "
                "or give --mode tp|pp to split this one, --mode allreduce for data parallel")

        split = predict_from_single(tr, dim, list(o.workers), o.microbatches, net, o.label,
                                    o.schedule, o.workers_per_host)
        if o.measured is None:
            return split
        return with_split_check(split, check_from_single(split, traces.load(o.measured),
                                                         o.measured.name))
    if dim is not None:
        from opprof.model.parallel import check_parallel, predict_parallel, with_parallel_check

        layout = predict_parallel(tr, dim, list(o.workers), o.microbatches, net, label=o.label)
        if o.measured is None:
            return layout
        measured = traces.load(o.measured)
        return with_parallel_check(layout, check_parallel(layout, measured, o.measured.name))
    workers, mode, servers = list(o.workers), o.mode, o.servers
    if o.measured is None:
        return predict(tr, workers, mode=mode, servers=servers, network=net,
                       straggler=o.straggler, label=o.label,
                       workers_per_host=o.workers_per_host)
    m = traces.load(o.measured)
    m_workers = int(m.meta.get("workers") or len(m.ranks) or 1)
    if m_workers not in workers:
        workers = [*workers, m_workers]
    mode = mode or (str(m.meta["mode"]) if m_workers > 1 and m.meta.get("mode") else None)
    servers = servers or (int(m.meta.get("servers") or 0) or None)
    result = predict(tr, workers, mode=mode, servers=servers, network=net,
                     straggler=o.straggler, label=o.label, workers_per_host=o.workers_per_host)
    noisy = tuple(name for name, t in ((o.label, tr), (o.measured.name, m))
                  if "noisy" in flags(assess(t.meta)))
    return with_check(result, m, o.measured.name, noisy)
