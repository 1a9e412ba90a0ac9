"""The common taxonomy: canonical operators, phases, event kinds, and native-name mapping tables.

A mapping table is data (``normalizers/maps/<format>.csv``), one row per pattern, first match
wins. Columns:

- ``pattern``: a Python regular expression matched against the whole native name;
- ``op``: the canonical operator, or empty for a marker (a step or phase annotation);
- ``phase``: the phase the row implies, or empty to take the phase from the enclosing marker;
- ``kind``: overrides the kind the normalizer derived from the native category, or empty;
- ``example``: a native name this row must classify (each row is tested with it);
- ``container`` (optional column): ``kernel`` for a GPU kernel's own name that gives its op only
  where the operator that launched it gives none (a GEMM kernel launched by ``aten::linear`` is
  that ``fully_connected``'s, one launched by a convolution that ``convolution``'s; a kernel whose
  launch the trace lacks, or whose launcher is unmapped, takes the row's op); ``yes`` for a
  compiled-graph container (torch.compile's
  ``CompiledFunction``, the FX graph call): not an operator that swallows what it encloses,
  but a region whose operators keep their own op; the container's own op (``fused``) gets
  only the time no mapped operator inside covers (``opprof.normalizers.events``).

Lines starting with ``"# "`` are comments.

Phase resolution for one event: a row phase in ``INTRINSIC_PHASES`` (backward, update, comm,
load, h2d) always wins; otherwise the phase of the enclosing phase marker; otherwise the row
phase (``forward`` for forward operators); otherwise, on a worker rank with no phase marker,
the phase inferred from the operators around it (``opprof.normalizers.events``); otherwise
``other``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.errors import OpprofError
from opprof.kinds import Role

if TYPE_CHECKING:
    from opprof.arrays import Array

BASE_OPS = (
    "convolution", "batch_norm", "fully_connected", "activation", "pooling", "loss",
    "elementwise", "normalization", "embedding", "attention", "recurrent", "dropout", "memory",
)
#: Communication by collective (phase ``comm``), named from the framework call; ``comm`` is
#: a communication call whose collective is unknown (and the op of every comm event in
#: traces written before collectives were named).
COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv",
    "barrier",
)
#: Parameter-server traffic keeps its own names.
PS_OPS = ("push", "pull")
COMM_OPS = frozenset({"comm", *COLLECTIVES, *PS_OPS})
#: Compiled-graph time that no mapped operator inside the graph covers (torch.compile /
#: inductor kernels, XLA fusions), forward and backward graphs.
FUSED_OPS = ("fused", "fused_backward")
#: A graph compiler's own work in a step: compiling (torch.compile's Dynamo tracing and
#: inductor's code generation; a step that holds it is flagged) and the guard checks / cache
#: lookup before every call of a compiled region.
COMPILER_OPS = ("compile", "guard")
#: ``sync``: the host waiting for a device (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
#: ``hipDeviceSynchronize``, a ``.item()``'s copy back …) where no operator encloses the wait.
CANONICAL_OPS = (
    *BASE_OPS,
    *(f"{op}_backward" for op in BASE_OPS),
    "weights_update", "comm", "data_load", "h2d", "other",
    *FUSED_OPS, *COLLECTIVES, *PS_OPS, *COMPILER_OPS, "sync",
)
PHASES = ("load", "h2d", "forward", "backward", "update", "comm", "other")
INTRINSIC_PHASES = frozenset({"backward", "update", "comm", "load", "h2d"})
KINDS = ("cpu_op", "kernel", "memcpy", "memset", "runtime", "comm", "marker", "io", "memory")
#: The memory table is the rows of kind ``memory``: one zero-duration row per sample of a
#: series (its ``name``), never counted in operator time (see opprof.normalizers.memory_rows).
MEMORY_KIND = "memory"
#: Memory series: the resident set sampled from outside the process (``rss``), the kernel's
#: high-water mark of it (``hwm``, VmHWM), and the framework allocator's ``allocated`` and
#: ``reserved`` bytes where the framework exposes them.
MEMORY_SERIES = ("rss", "hwm", "allocated", "reserved")
#: Where a memory row comes from (its ``detail``).
MEMORY_SOURCES = ("sampled", "kineto", "xprof", "mxnet", "nsys")
#: The kinds that run on a device (GPU kernels and copies), not a host thread.
DEVICE_KINDS = ("kernel", "memcpy", "memset")
ROLES = Role.values()


@dataclass(frozen=True)
class MappingRow:
    """One row of a mapping table."""

    pattern: str
    op: str
    phase: str
    kind: str
    example: str
    container: bool = False
    #: A device kernel's name row: its op only where its launcher's is unknown.
    kernel: bool = False


#: Per mapping table (name and rows), the row each name already classified matched.
_ROWS: dict[tuple[str, tuple[MappingRow, ...]], dict[str, int]] = {}


@dataclass(frozen=True)
class MappingTable:
    """An ordered native-name → (op, phase, kind) table; the first matching row wins."""

    name: str
    rows: tuple[MappingRow, ...]

    def classify(self, names: pd.Series | Array | list[str]) -> pd.DataFrame:
        """Classify unique names: a frame indexed by name with columns op, phase, kind, row,
        container.

        Unmatched names get op ``other`` and row -1. Work is per distinct name, vectorized
        over names per row, so its cost does not grow with the number of events.
        """
        uniq = pd.Index(pd.unique(pd.Series(names, dtype=object).dropna().astype(str)))
        # names seen before (the previous rank's: ranks share their names) are not matched
        # again; the cache lives as long as the process and the table
        seen = _ROWS.setdefault((self.name, self.rows), {})
        row = np.array([seen.get(u, -2) for u in uniq], dtype=np.int32)
        todo = np.flatnonzero(row == -2)
        new = uniq[todo].tolist()
        # per new distinct name, its rows in order until one matches (what a pandas
        # ``str.fullmatch`` per row over the names still free does, without its overhead
        # per row)
        match = _combined(self.name, self.rows)
        new_row = [int(m.lastgroup[1:]) if (m := match(u)) and m.lastgroup else -1
                   for u in new]
        row[todo] = new_row
        seen.update(zip(new, new_row, strict=True))
        ops = np.array([r.op for r in self.rows] + ["other"], dtype=object)
        phases = np.array([r.phase for r in self.rows] + [""], dtype=object)
        kinds = np.array([r.kind for r in self.rows] + [""], dtype=object)
        containers = np.array([r.container for r in self.rows] + [False], dtype=bool)
        kernel_rows = np.array([r.kernel for r in self.rows] + [False], dtype=bool)
        return pd.DataFrame(
            {"op": ops[row], "phase": phases[row], "kind": kinds[row], "row": row,
             "container": containers[row], "kernel": kernel_rows[row]}, index=uniq
        )

    def lookup(self, name: str) -> MappingRow | None:
        """The row that classifies one name (for tests and docs)."""
        for r in self.rows:
            if re.fullmatch(r.pattern, name):
                return r
        return None


@cache
def _combined(name: str, rows: tuple[MappingRow, ...]) -> Callable[[str], re.Match[str] | None]:
    """One pattern of every row's, in order (``(?P<r0>…)|(?P<r1>…)|…``): its full match of a
    name is the first row's that matches it whole (alternatives are tried in order, each to
    the end of the name), ``lastgroup`` naming the row — one regex run per name instead of
    one per row (a python_function trace has thousands of distinct names)."""
    return re.compile("|".join(f"(?P<r{i}>{r.pattern})" for i, r in enumerate(rows))).fullmatch


def _check_row(table: str, n: int, row: MappingRow) -> None:
    if row.op and row.op not in CANONICAL_OPS:
        raise OpprofError(f"mapping table {table} row {n}: unknown op {row.op!r}")
    if row.phase and row.phase not in PHASES:
        raise OpprofError(f"mapping table {table} row {n}: unknown phase {row.phase!r}")
    if row.kind and (row.kind not in KINDS or row.kind == MEMORY_KIND):
        raise OpprofError(f"mapping table {table} row {n}: unknown kind {row.kind!r}")


@cache
def mapping_table(name: str) -> MappingTable:
    """Load the mapping table shipped as ``opprof/normalizers/maps/<name>.csv``."""
    text = resources.files("opprof.normalizers").joinpath("maps").joinpath(
        f"{name}.csv").read_text()
    return parse_table(name, text)


def parse_table(name: str, text: str) -> MappingTable:
    """A mapping table from its CSV text (columns pattern, op, phase, kind, example and
    optionally container; ``# `` lines are comments); a bad row is one error naming it."""
    rows = []
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("# ")]
    for n, rec in enumerate(csv.DictReader(lines), start=2):
        row = MappingRow(
            pattern=rec["pattern"], op=rec["op"].strip(), phase=rec["phase"].strip(),
            kind=rec["kind"].strip(), example=rec["example"],
            container=(rec.get("container") or "").strip() == "yes",
            kernel=(rec.get("container") or "").strip() == "kernel",
        )
        _check_row(name, n, row)
        rows.append(row)
    try:  # every row's pattern, compiled once as the table's combined one
        _combined(name, tuple(rows))
    except re.error as whole:
        for n, row in enumerate(rows, start=2):  # which row: only when one is bad
            try:
                re.compile(row.pattern)
            except re.error as exc:
                raise OpprofError(f"mapping table {name} row {n}: bad pattern "
                                  f"{row.pattern!r} ({exc})") from None
        raise OpprofError(f"mapping table {name}: its patterns do not combine into one "
                          f"({whole})") from None
    return MappingTable(name, tuple(rows))


def tables_markdown() -> str:
    """Every shipped mapping table as markdown (docs/taxonomy.md is this, kept in sync by a
    test)."""
    from importlib import resources as res

    names = sorted(p.name.removesuffix(".csv")
                   for p in res.files("opprof.normalizers").joinpath("maps").iterdir()
                   if p.name.endswith(".csv"))
    out = ["# Taxonomy: native names → canonical operators", "",
           "Generated from `normalizers/maps/*.csv` by `python docs/make_taxonomy.py`; "
           "do not edit by hand.", "",
           "Canonical operators: " + ", ".join(f"`{o}`" for o in CANONICAL_OPS) + ".", "",
           "Phases: " + ", ".join(f"`{p}`" for p in PHASES) + ".", "",
           "In each table the first row whose pattern (a Python regular expression) matches the "
           "whole native name wins; an empty op marks a marker (a step or phase annotation); an "
           "empty phase takes the phase of the enclosing phase marker (on a worker without phase "
           "markers, the phase inferred from the operators around it: see "
           "[ops.md](ops.md#traces-without-opprof-markers)). Names no row matches are `other`. A "
           "`(container)` row is a compiled graph (torch.compile): its operators keep their "
           "own op, and its op gets only the time no mapped operator inside it covers (see "
           "[frameworks.md](frameworks.md#compiled-graphs)). A `(kernel)` row names a GPU "
           "kernel: it gives the kernel its op only where the operator that launched it gives "
           "none (no launch in the trace, or an unmapped launcher).", "",
           "Kinds: " + ", ".join(f"`{k}`" for k in KINDS) + ". The memory table is the rows "
           "with kind `memory`: no mapping table makes them (a name is a memory series, not an "
           "operator); each is one sample of a series (" + ", ".join(
               f"`{s}`" for s in MEMORY_SERIES) + ") with its bytes, never counted in "
           "operator time (see [memory.md](memory.md)).", ""]
    for name in names:
        out += [f"## {name}", "", "| pattern | op | phase | kind | example |",
                "|---|---|---|---|---|"]
        for r in mapping_table(name).rows:
            op = (r.op or "(marker)") + (" (container)" if r.container else "") + (
                " (kernel)" if r.kernel else "")
            cells = [r.pattern, op, r.phase, r.kind, r.example]
            out.append("| " + " | ".join(f"`{c}`" if c else "" for c in
                                         (c.replace("|", "\\|") for c in cells)) + " |")
        out.append("")
    return "\n".join(out)

