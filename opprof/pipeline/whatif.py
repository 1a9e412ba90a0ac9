"""The what-if pipeline: the trace (and every other trace an ``--op OP=OTHER.trace`` names)
read once each, the step re-simulated with the changes, one immutable
:class:`~opprof.model.whatif.WhatIf` that every renderer only draws (:func:`whatif`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.errors import OpprofError
from opprof.pipeline.sources import Traces

if TYPE_CHECKING:
    from opprof.model.whatif import Context, WhatIf


@dataclass(frozen=True)
class WhatIfOptions:
    """What `opprof whatif` is asked for: the trace, the changes (``ops``: the ``--op``
    specs as given, ``OP=FACTOR`` or ``OP=OTHER.trace``; ``comm``: ``hidden`` or a factor as
    given), and the workers to re-simulate on."""

    paths: tuple[Path, ...]
    ops: tuple[str, ...] = ()
    comm: str | None = None
    io_hidden: bool = False
    workers: int | None = None
    mode: str | None = None
    servers: int | None = None
    network: Path | None = None


def comm_value(spec: str | None) -> str | float | None:
    """``--comm hidden|FACTOR`` → "hidden", the factor (≥ 0), or None."""
    if spec is None or spec == "hidden":
        return spec
    try:
        value = float(spec)
    except ValueError:
        raise OpprofError(f"--comm {spec}: give hidden or a factor") from None
    if value < 0:
        raise OpprofError(f"--comm {spec}: the factor must be ≥ 0")
    return value


def parse_op(spec: str) -> tuple[str, float | Path, str]:
    """``OP=FACTOR`` or ``OP=OTHER.trace`` → (op, the factor or the other trace's path, the
    value as given)."""
    op, sep, value = spec.partition("=")
    if not sep or not op.strip() or not value.strip():
        raise OpprofError(f"--op {spec}: give OP=FACTOR or OP=OTHER.trace")
    op, value = op.strip(), value.strip()
    try:
        return op, float(value), value
    except ValueError:
        pass
    path = Path(value)
    if not path.exists():
        raise OpprofError(f"--op {spec}: {value} is neither a number nor an existing trace")
    return op, path, path.name


def whatif(o: WhatIfOptions) -> WhatIf:
    """The what-if of ``o``, each trace read once (the trace itself given as another's, or
    one other trace named twice, is the same read)."""
    from opprof.model.whatif import context
    from opprof.model.whatif import whatif as simulate
    from opprof.pipeline.calibrate import read_network

    comm = comm_value(o.comm)
    net = read_network(o.network)
    traces = Traces()
    ctx = context(traces.load(o.paths), o.paths[0].name)
    others: dict[int, Context] = {id(traces.load(o.paths)): ctx}
    changes: dict[str, float | Context] = {}
    labels: dict[str, str] = {}
    for spec in o.ops:
        op, value, label = parse_op(spec)
        if isinstance(value, Path):
            other = traces.load(value)
            if id(other) not in others:
                others[id(other)] = context(other, value.name)
            changes[op] = others[id(other)]
        else:
            changes[op] = value
        labels[op] = label
    return simulate(ctx, changes, comm, o.io_hidden, o.workers, o.mode, o.servers, net, labels)
