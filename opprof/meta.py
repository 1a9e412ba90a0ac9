"""A trace's metadata, typed: :class:`TraceMeta`, and the one place it is stamped before a
`.trace` is written (:func:`stamp`: format version, opprof version, the command that wrote it).

The fields are what every writer fills and the structure the readers rely on (step bounds,
row groups, clock offsets, what reading dropped); a field not given is :data:`msgspec.UNSET`
and absent from the file. Every other key (what one framework knows: ``kvstore``,
``onednn``, a trace's ``distributed`` info …; any key of an older or newer opprof) is kept in
:attr:`TraceMeta.extra`, written back and readable as before: ``meta.get("kvstore")``. A
value of the wrong type for its field is kept the same way (in ``extra``), never dropped.

A TraceMeta is also a mapping of the keys as stored (``meta["mode"]``, ``meta.get(k)``,
``{**meta}``, ``"partial" in meta``), so code that reads the framework-specific keys reads
them as it reads the typed ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

import msgspec
from msgspec import UNSET, UnsetType

from opprof.invocation import invocation
from opprof.kinds import Framework, Mode

#: A trace's metadata as a function takes it: a :class:`TraceMeta`, or any mapping of its keys
#: (a writer's dict).
MetaMapping: TypeAlias = Mapping[str, Any]

#: The `.trace` format this opprof writes (files since the per-rank layout are still 1).
FORMAT_VERSION = 1


class CurveRow(TypedDict):
    """One training step of a convergence curve (`record --converge`, `run`'s loss): its
    duration so far, its loss and the accuracies (None between evaluations)."""

    step: int
    time_ns: int
    loss: float | None
    train_accuracy: float | None
    test_accuracy: float | None


if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject
    _Mapping = MutableMapping[str, Any]
else:
    class _Mapping:
        """MutableMapping's mixin methods (get, keys, items, values, pop, update, setdefault …)
        for TraceMeta, whose metaclass (msgspec's) cannot also be ABCMeta."""

        __slots__ = ()
        _MutableMapping__marker = MutableMapping._MutableMapping__marker  # (pop's default)
        get = MutableMapping.get
        keys = MutableMapping.keys
        items = MutableMapping.items
        values = MutableMapping.values
        pop = MutableMapping.pop
        popitem = MutableMapping.popitem
        clear = MutableMapping.clear
        update = MutableMapping.update
        setdefault = MutableMapping.setdefault


class TraceMeta(msgspec.Struct, _Mapping, kw_only=True, repr_omit_defaults=True):
    """A `.trace`'s metadata (see the module docstring; docs/trace-file.md lists the keys)."""

    # stamped when the file is written (:func:`stamp`)
    format_version: int | UnsetType = UNSET
    opprof_version: str | UnsetType = UNSET
    #: the opprof command (or the Python process) that wrote the file
    opprof_command: str | UnsetType = UNSET
    # what was recorded
    #: the command that was profiled (`record`'s own line, `run`'s COMMAND, a script's argv)
    command: str | UnsetType = UNSET
    launcher: str | UnsetType = UNSET
    framework: Framework | UnsetType = UNSET
    framework_version: str | UnsetType = UNSET
    source_formats: list[str] | UnsetType = UNSET
    model: str | UnsetType = UNSET
    dataset: str | UnsetType = UNSET
    batch_size: int | UnsetType = UNSET
    mode: Mode | None | UnsetType = UNSET
    device: str | UnsetType = UNSET
    workers: int | UnsetType = UNSET
    servers: int | UnsetType = UNSET
    hosts: list[str] | UnsetType = UNSET
    native_dir: str | UnsetType = UNSET
    unprofiled_step_ns: int | None | UnsetType = UNSET
    samples_per_s: float | None | UnsetType = UNSET
    # structure the readers rely on
    #: [rank, step, start ns, end ns] of every step (:meth:`opprof.trace.Trace.step_bounds`)
    step_bounds: list[list[int]] | UnsetType = UNSET
    #: rank → its row groups in the file (:class:`opprof.trace.TraceFile`)
    row_groups: dict[str, list[int]] | UnsetType = UNSET
    clock_offsets_ns: dict[str, int] | UnsetType = UNSET
    #: what reading dropped, per kind (:mod:`opprof.drops`)
    read_warnings: dict[str, int] | UnsetType = UNSET
    #: files a folder held that could not be read: path and problem
    damaged_files: list[dict[str, str]] | UnsetType = UNSET
    skipped_files: list[str] | UnsetType = UNSET
    #: a run cut short: what was kept (docs/failures.md)
    partial: dict[str, Any] | None | UnsetType = UNSET
    memory_sources: list[str] | UnsetType = UNSET
    #: `record --converge`: one row per step and rank (:func:`opprof.trace.convergence_frame`)
    convergence: list[dict[str, Any]] | UnsetType = UNSET
    #: every other key, as stored
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    #: the keys in the order they were given (a file's, a writer's), kept when written back
    order: list[str] = msgspec.field(default_factory=list)

    # ------------------------------------------------------------------ building

    @classmethod
    def of(cls, meta: MetaMapping | None) -> TraceMeta:
        """``meta`` as a TraceMeta: itself when it is one, else its keys typed (a value that is
        not of its field's type stays in :attr:`extra`)."""
        if isinstance(meta, TraceMeta):
            return meta
        out = cls()
        for key, value in (meta or {}).items():
            out[key] = value
        return out

    def copy(self) -> TraceMeta:
        """A shallow copy (its lists and dicts shared, as ``dict(meta)``'s)."""
        return msgspec.structs.replace(self, extra=dict(self.extra), order=list(self.order))

    def to_dict(self) -> JSONObject:
        """The keys as stored: the typed fields given, then the others."""
        return dict(self.items())

    # ------------------------------------------------------------------ the mapping view

    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            value = getattr(self, key)
            if value is not UNSET:
                return value
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self:
            self.order.append(key)
        if key in _FIELDS:
            try:
                setattr(self, key, msgspec.convert(value, _FIELDS[key]))
                self.extra.pop(key, None)
                return
            except msgspec.ValidationError:
                setattr(self, key, UNSET)  # kept as given, below
        self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _FIELDS and getattr(self, key) is not UNSET:
            setattr(self, key, UNSET)
        else:
            del self.extra[key]
        self.order[:] = [k for k in self.order if k != key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str) and key in _FIELDS and getattr(self, key) is not UNSET:
            return True
        return key in self.extra

    def __iter__(self) -> Iterator[str]:
        """The keys given, in the order given (a field set as an attribute: after them)."""
        given = [k for k in dict.fromkeys(self.order) if k in self]
        seen = set(given)
        yield from given
        yield from (k for k in _FIELDS if getattr(self, k) is not UNSET and k not in seen)
        yield from (k for k in self.extra if k not in seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # ------------------------------------------------------------------ typed readers

    @property
    def written_by(self) -> str | None:
        """The opprof command that wrote the file; in files from before it was stamped
        (``opprof_command``), `record`'s ``command``, which was that line."""
        if isinstance(self.opprof_command, str):
            return self.opprof_command
        if isinstance(self.command, str) and self.command.split(" ", 1)[0] == "opprof":
            return self.command
        return None

    @property
    def steps(self) -> int:
        """How many (rank, step) bounds the trace has."""
        return len(self.step_bounds) if isinstance(self.step_bounds, list) else 0


#: Field name → its type (``extra`` is no key of the file).
_FIELDS: dict[str, object] = {
    f.name: f.type for f in msgspec.structs.fields(TraceMeta) if f.name not in ("extra", "order")}
MutableMapping.register(TraceMeta)


# ------------------------------------------------------------------ the stamp

def stamp(meta: MetaMapping | None) -> TraceMeta:
    """A copy of ``meta`` as every `.trace` is written: the format version, the opprof
    version and the command that writes it (:func:`invocation`) — the one place they are
    set, for `record`, `run`, `import`, `opprof.profile()`, a merge and ``opprof.save``."""
    from opprof.version import __version__

    out = TraceMeta.of(meta).copy()
    if out.format_version is UNSET:  # (a format given stays: what the file's events follow)
        out.format_version = FORMAT_VERSION
    out.opprof_version = __version__
    out.opprof_command = invocation()
    return out
