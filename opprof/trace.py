"""The `.trace` file: one Parquet events table for all ranks plus JSON metadata.

One file, one row group per rank (``meta["row_groups"]`` maps ranks to row groups), so a
rank is read without the others (:class:`TraceFile`); categorical columns are
dictionary<int32, string>, the metadata is JSON under the schema's ``opprof`` key. Files
from before the per-rank layout (all ranks in one row group) read as they always did.

The convergence table (`record --converge`: rank, step, time_ns, loss, train_accuracy,
test_accuracy) is a second key of the schema metadata, ``opprof.convergence``, holding its
rows as a JSON array (``meta["convergence"]`` once read; files without it have none):
:func:`convergence_frame`, or in DuckDB ``parquet_kv_metadata`` (docs/convergence.md).

The memory table is the rows with kind ``memory`` (zero-duration samples of a memory series:
resident set, the kernel's high-water mark, the allocator's allocated / reserved bytes),
in the same events table and the same per-rank row groups (:mod:`opprof.normalizers.memory_rows`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api.types import union_categoricals

from opprof.errors import ErrorKind, OpprofError, first_line
from opprof.files import write_atomic
from opprof.flops.families import PRECISIONS
from opprof.kinds import Role
from opprof.meta import FORMAT_VERSION as FORMAT_VERSION  # re-exported
from opprof.meta import TraceMeta, stamp
from opprof.taxonomy import CANONICAL_OPS, COMM_OPS, KINDS, PHASES, ROLES

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping

#: Files since the per-rank layout (one row group per rank, ``meta["row_groups"]``) are
#: still format 1 (:data:`opprof.meta.FORMAT_VERSION`): older opprof reads them unchanged.
META_KEY = b"opprof"
CONVERGENCE_KEY = b"opprof.convergence"
CONVERGENCE_COLUMNS = {"rank": "int32", "step": "int32", "time_ns": "int64", "loss": "float64",
                       "train_accuracy": "float64", "test_accuracy": "float64"}

#: The events table's columns and their pandas dtypes, in file order. ``counted`` is the
#: flag DESIGN.md's "nested events are counted once" implies: True for the outermost
#: operator event on its lane (and every device event); operator totals sum only those.
#: ``link`` is the native correlation id tying a GPU kernel/copy to the runtime call that
#: launched it (the same id on both), -1 where there is none.
COLUMNS: dict[str, Any] = {
    "rank": "int32",
    "role": pd.CategoricalDtype(list(ROLES)),
    "pid": "int64",
    "tid": "int64",
    "device": "category",
    "ts": "int64",
    "dur": "int64",
    "name": "category",
    "kind": pd.CategoricalDtype(list(KINDS)),
    "op": pd.CategoricalDtype(list(CANONICAL_OPS)),
    "phase": pd.CategoricalDtype(list(PHASES)),
    "step": "int32",
    "depth": "int16",
    "counted": "bool",
    "bytes": "int64",
    "detail": "string",
    "link": "int64",
    "flops": "float64",
    "model_flops": "float64",
    "mem_bytes": "float64",
    "precision": pd.CategoricalDtype(list(PRECISIONS)),
}
#: The cost columns (opprof.flops.attribute: per counted event, the hardware FLOPs, model FLOPs,
#: bytes moved and precision of what it ran; NaN / missing where unknown). A table without them
#: (a file written before them, a format with no shapes) reads as all unknown.
OPTIONAL: dict[str, Any] = {"flops": np.nan, "model_flops": np.nan, "mem_bytes": np.nan,
                            "precision": None}


class Trace:
    """A normalized trace: ``events`` (one row per event, the COLUMNS above) and ``meta`` (a
    :class:`~opprof.meta.TraceMeta`; a mapping given is typed)."""

    def __init__(self, events: pd.DataFrame, meta: MetaMapping | None = None) -> None:
        self.events = events
        self.meta = TraceMeta.of(meta)

    def __repr__(self) -> str:
        return f"Trace({len(self.events)} events, {self.meta!r})"

    @property
    def ranks(self) -> list[int]:
        """The worker ranks present."""
        ev = self.events
        return sorted(ev.loc[ev["role"] == Role.WORKER.value, "rank"].unique().tolist())

    def step_bounds(self) -> pd.DataFrame:
        """Per rank and step: start and end (ns), from the metadata written at normalization."""
        rows = self.meta.step_bounds or []
        df = pd.DataFrame(rows, columns=["rank", "step", "start", "end"])
        return df.astype({"rank": "int32", "step": "int32", "start": "int64", "end": "int64"})


def concat_traces(traces: list[Trace], meta: MetaMapping) -> Trace:
    """Several traces' events as one table (in the order given) with ``meta``; categorical
    columns are joined by their categories, never row by row."""
    if len(traces) == 1:
        return Trace(traces[0].events, meta)
    frames = [conform(t.events) for t in traces]
    cols = {}
    for col, dtype in COLUMNS.items():
        if dtype == "category":
            cols[col] = union_categoricals([f[col].array for f in frames])
        elif isinstance(dtype, pd.CategoricalDtype):
            cols[col] = pd.Categorical.from_codes(
                np.concatenate([f[col].cat.codes.to_numpy() for f in frames]), dtype=dtype)
        elif dtype == "string":
            cols[col] = pd.concat([f[col] for f in frames], ignore_index=True)
        else:
            cols[col] = np.concatenate([f[col].to_numpy() for f in frames])
    return Trace(conform(pd.DataFrame(cols)), meta)


def empty_events() -> pd.DataFrame:
    """An events table with no rows and the right dtypes."""
    return conform(pd.DataFrame({c: [] for c in COLUMNS}))


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Return df with exactly COLUMNS in order and their dtypes. Categorical columns that
    already have the right categories are kept as they are (no per-row work); the free
    categories of ``device`` and ``name`` are text, sorted (so a table read back from many
    row groups or ranks is the same as one made at once). A column that already has its
    dtype is not copied: the result shares it with ``df`` under pandas' copy-on-write, so
    writing to either still leaves the other as it was."""
    missing = [c for c in COLUMNS if c not in df.columns and c not in OPTIONAL]
    if missing:
        raise ValueError(f"events table lacks columns {missing}")
    cols: dict[str, Any] = {}
    n = len(df)
    for col, dtype in COLUMNS.items():
        if col not in df.columns:
            c = pd.Series(OPTIONAL[col], index=df.index, dtype=object if OPTIONAL[col] is None
                          else np.float64)
        else:
            c = df[col]
        if isinstance(dtype, pd.CategoricalDtype):
            if isinstance(c.dtype, pd.CategoricalDtype) and list(c.cat.categories) == list(
                    dtype.categories):
                cols[col] = (_kept(c) if _same_categories(c.dtype, dtype.categories)
                             else pd.Categorical.from_codes(c.cat.codes.to_numpy(),
                                                            dtype=dtype))
            elif isinstance(c.dtype, pd.CategoricalDtype):  # recoded per category, not row
                at = dtype.categories.get_indexer(c.cat.categories)
                cols[col] = pd.Categorical.from_codes(
                    np.append(at, -1)[c.cat.codes.to_numpy()], dtype=dtype)
            else:
                cols[col] = pd.Categorical(c.astype(object), categories=dtype.categories)
        elif dtype == "category":
            cat = c.array if isinstance(c.dtype, pd.CategoricalDtype) else pd.Categorical(
                c.astype(object))
            text = pd.Index(cat.categories.astype("str"))
            if text.has_duplicates or not text.is_monotonic_increasing:
                cat = pd.Categorical(np.asarray(cat, dtype=object).astype(str)) if \
                    text.has_duplicates else pd.Categorical.from_codes(cat.codes, text)
                if not cat.categories.is_monotonic_increasing:
                    cat = cat.reorder_categories(sorted(cat.categories))
                text = pd.Index(cat.categories.astype("str"))
            cols[col] = (_kept(c) if isinstance(c.dtype, pd.CategoricalDtype)
                         and _same_categories(c.dtype, text)
                         else pd.Categorical.from_codes(cat.codes, categories=text))
        elif c.dtype == (np.dtype(dtype) if dtype != "string" else pd.StringDtype()):
            cols[col] = _kept(c)
        else:
            # ``.array``: no index, so a slice of a table (one rank's rows) keeps its values
            cols[col] = c.to_numpy().astype(dtype) if dtype != "string" else c.astype(
                dtype).array
    # copy=False: what is kept is shared (copy-on-write), what was made is fresh and ours
    return pd.DataFrame(cols, index=pd.RangeIndex(n), copy=False)


def _same_categories(dtype: pd.CategoricalDtype, categories: pd.Index) -> bool:
    """The categorical dtype has exactly these categories: values, order and their dtype."""
    return (not dtype.ordered and dtype.categories.dtype == categories.dtype
            and dtype.categories.equals(categories))


def _kept(c: pd.Series) -> pd.Series:
    """A column that is already right, shared under copy-on-write (no copy): its positions
    as the index, so a slice of a table (one rank's rows) keeps its values."""
    return c.reset_index(drop=True)


#: The events table as Arrow: categorical columns are dictionary<int32, string> whatever
#: their number of categories, so every rank's row group has the same schema.
_DICT = pa.dictionary(pa.int32(), pa.string())
_ARROW_TYPES = {"int32": pa.int32(), "int64": pa.int64(), "int16": pa.int16(),
                "bool": pa.bool_(), "string": pa.string(), "float64": pa.float64()}
SCHEMA = pa.schema([pa.field(c, _DICT if (isinstance(t, pd.CategoricalDtype) or t == "category")
                             else _ARROW_TYPES[t]) for c, t in COLUMNS.items()])
#: A rank with more events than this spans several row groups.
ROW_GROUP_ROWS = 1 << 20


def to_arrow(events: pd.DataFrame) -> pa.Table:
    """The events table (conformed) as an Arrow table with :data:`SCHEMA`."""
    ev = conform(events)
    arrays = []
    for col, field_ in zip(COLUMNS, SCHEMA, strict=True):
        c = ev[col]
        if field_.type == _DICT:
            cats = pa.array(np.asarray(c.cat.categories, dtype=object), pa.string())
            codes = c.cat.codes.to_numpy(np.int32)
            arrays.append(pa.DictionaryArray.from_arrays(
                pa.array(codes, pa.int32(), mask=codes < 0), cats))
        elif field_.type == pa.string():
            arrays.append(pa.array(c.to_numpy(dtype=object, na_value=None), pa.string()))
        else:
            arrays.append(pa.array(c.to_numpy(), field_.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def rank_slices(events: pd.DataFrame) -> list[tuple[int, Array]]:
    """(rank, row positions) per rank, ranks in order of first appearance, rows in order."""
    rank = events["rank"].to_numpy(np.int64)
    if len(rank) == 0:
        return []
    codes, uniq = pd.factorize(rank)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    return [(int(r), order[bounds[i]:bounds[i + 1]]) for i, r in enumerate(uniq)]


def file_meta(meta: MetaMapping) -> bytes:
    """The metadata as stored (JSON), stamped (:func:`opprof.meta.stamp`: the format
    version, opprof's version and the command writing it)."""
    return json.dumps(stamp(meta).to_dict(), default=_json_default).encode()


class TraceWriter:
    """Writes a `.trace` rank by rank: one row group per rank (more for a rank over
    ROW_GROUP_ROWS events), the metadata known up front. Use as a context manager inside
    :func:`opprof.files.atomic_path`."""

    def __init__(self, tmp: Path, meta: MetaMapping) -> None:
        meta = TraceMeta.of(meta).copy()
        curve = meta.pop("convergence", None)
        kv = {META_KEY: file_meta(meta)}
        if curve:
            kv[CONVERGENCE_KEY] = json.dumps(curve, default=_json_default).encode()
        schema = SCHEMA.with_metadata(kv)
        import pyarrow.parquet as pq  # (with its file systems: not for a native trace)

        self._writer = pq.ParquetWriter(tmp, schema, compression="zstd")
        self.row_groups: dict[str, list[int]] = {}
        self._next = 0

    def write(self, rank: int, table: pa.Table) -> None:
        """Append one rank's events (an Arrow table with SCHEMA)."""
        for start in range(0, max(table.num_rows, 1), ROW_GROUP_ROWS):
            part = table.slice(start, ROW_GROUP_ROWS)
            if part.num_rows == 0:
                break
            self._writer.write_table(part.replace_schema_metadata(None),
                                     row_group_size=ROW_GROUP_ROWS)
            self.row_groups.setdefault(str(rank), []).append(self._next)
            self._next += 1

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write the trace atomically (temporary file in the same folder, then rename), one row
    group per rank; ``meta["row_groups"]`` maps each rank to its row groups."""
    path = Path(path)
    events = conform(trace.events)
    slices = rank_slices(events)
    meta = trace.meta.copy()
    groups: dict[str, list[int]] = {}
    n = 0
    for rank, rows in slices:
        k = max(1, -(-len(rows) // ROW_GROUP_ROWS))
        groups[str(rank)] = list(range(n, n + k))
        n += k
    meta["row_groups"] = groups

    def write(tmp: Path) -> None:
        with TraceWriter(tmp, meta) as w:
            if not slices:
                w._writer.write_table(to_arrow(events))
            for rank, rows in slices:
                w.write(rank, to_arrow(events.iloc[rows]))

    write_atomic(path, write)
    return path


def convergence_frame(meta: MetaMapping) -> pd.DataFrame:
    """The convergence table of a trace's metadata (empty without ``--converge``): one row per
    step and rank; the accuracies are NaN between evaluations."""
    df = pd.DataFrame(meta.get("convergence") or [], columns=list(CONVERGENCE_COLUMNS))
    return df.astype(CONVERGENCE_COLUMNS)


def _json_default(obj: object) -> int | float | str:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


class TraceFile:
    """An opened `.trace`: its metadata, and its events read whole or one rank at a time.

    Files written now hold one row group per rank (``meta["row_groups"]``), so a
    rank is read without the others. Older files are read by their row groups' rank
    statistics when each holds one rank, else whole."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        import pyarrow.parquet as pq  # (with its file systems: not for a native trace)

        try:
            self._pf = pq.ParquetFile(_source(self.path))
        except (pa.ArrowInvalid, OSError) as exc:
            raise OpprofError(f"unreadable Parquet file ({first_line(exc)})",
                              path=path, kind=ErrorKind.UNREADABLE) from None
        meta_raw = (self._pf.schema_arrow.metadata or {}).get(META_KEY)
        if meta_raw is None:
            cols = ", ".join(self._pf.schema_arrow.names[:6])
            raise OpprofError("a Parquet file but not an opprof trace (no opprof "
                              f"metadata; columns: {cols})", path=path, kind=ErrorKind.NOT_A_TRACE)
        try:
            meta = json.loads(meta_raw)
        except ValueError as exc:
            raise OpprofError(f"damaged opprof metadata ({first_line(exc)})",
                              path=path, kind=ErrorKind.DAMAGED) from None
        except RecursionError:
            raise OpprofError("damaged opprof metadata (nested too deeply)",
                              path=path, kind=ErrorKind.DAMAGED) from None
        if not isinstance(meta, dict):
            raise OpprofError("damaged opprof metadata (not a JSON object)",
                              path=path, kind=ErrorKind.DAMAGED)
        problem = _meta_problem(meta) or _schema_problem(self._pf.schema_arrow)
        if problem:
            raise OpprofError(f"damaged opprof trace ({problem})",
                              path=path, kind=ErrorKind.DAMAGED)
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise OpprofError(
                f"opprof trace format {meta['format_version']} is newer than this "
                f"opprof reads ({FORMAT_VERSION}); upgrade opprof", path=path, kind=ErrorKind.NEWER)
        curve = (self._pf.schema_arrow.metadata or {}).get(CONVERGENCE_KEY)
        if curve is not None:
            try:
                meta["convergence"] = json.loads(curve)
            except ValueError as exc:
                raise OpprofError("damaged convergence table "
                                  f"({first_line(exc)})",
                                  path=path, kind=ErrorKind.DAMAGED) from None
        self.meta = TraceMeta.of(meta)
        self.found: dict[str, Any] = {}  # what reading dropped (opprof.drops), once read
        self.row_groups = self._rank_groups()

    def _rank_groups(self) -> dict[int, list[int]] | None:
        """Row groups per rank, or None when some row group mixes ranks (old files)."""
        stored = self.meta.get("row_groups")
        n = self._pf.num_row_groups
        if isinstance(stored, dict):
            try:
                given = {int(r): [int(i) for i in g] for r, g in stored.items()}
                if all(0 <= i < n for g in given.values() for i in g):
                    return given
            except (TypeError, ValueError):
                pass
        col = self._pf.schema_arrow.get_field_index("rank")
        out: dict[int, list[int]] = {}
        for i in range(n):
            st = self._pf.metadata.row_group(i).column(col).statistics
            if st is None or not st.has_min_max or st.min != st.max:
                return None
            out.setdefault(int(st.min), []).append(i)
        return out

    @property
    def ranks(self) -> list[int]:
        """Every rank in the file, in file order (workers, servers, schedulers)."""
        if self.row_groups is not None:
            return list(self.row_groups)
        return [int(r) for r in pd.unique(self._read(None)["rank"])]

    @property
    def by_rank(self) -> bool:
        """Whether one rank can be read without the others."""
        return self.row_groups is not None

    def _read(self, groups: list[int] | None, detail: bool = True) -> pd.DataFrame:
        try:
            table = (self._pf.read() if groups is None else self._pf.read_row_groups(groups))
            problem = _table_problem(table)
            if problem:
                raise OpprofError(f"damaged opprof trace ({problem})",
                                  path=self.path, kind=ErrorKind.DAMAGED)
            if not detail and "detail" in table.column_names:
                table = _comm_detail_only(table)
            events = table.to_pandas()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise OpprofError(f"damaged opprof trace ({first_line(exc)})",
                              path=self.path, kind=ErrorKind.DAMAGED) from None
        if "link" not in events:
            events["link"] = -1
        if "detail" not in events:
            events["detail"] = None
        return self._usable(events)

    def _usable(self, events: pd.DataFrame) -> pd.DataFrame:
        """The rows that can be placed on the timeline (a duration >= 0, a time inside the
        trace's span); the others are dropped and counted in :attr:`found`."""
        from opprof import drops

        if not len(events) or "ts" not in events or "dur" not in events:
            return events  # (a column missing: conform says so)
        negative, outside = drops.timeline_problems(events["ts"].to_numpy(np.int64),
                                                    events["dur"].to_numpy(np.int64))
        bad = negative | outside
        if not bad.any():
            return events
        drops.skip(self.found, negative, "negative duration")
        drops.skip(self.found, outside, "time outside the trace's span")
        if bad.all():
            raise OpprofError("no usable events "
                              f"({drops.describe(self.found[drops.KEY])})",
                              path=self.path, kind=ErrorKind.NO_EVENTS)
        return events[~bad].reset_index(drop=True)

    @property
    def read_meta(self) -> TraceMeta:
        """The file's metadata with what reading it dropped so far added to its read
        warnings (those the import counted are stored in the file)."""
        from opprof import drops

        if not self.found:
            return self.meta
        meta = self.meta.copy()
        meta[drops.KEY] = drops.merged([self.meta.get(drops.KEY), self.found[drops.KEY]])
        return meta

    def read(self) -> Trace:
        """The whole trace."""
        try:
            events = conform(self._read(None))
            return Trace(events, self.read_meta)
        except (ValueError, TypeError) as exc:
            raise OpprofError(f"damaged opprof trace ({first_line(exc)})",
                              path=self.path, kind=ErrorKind.DAMAGED) from None

    def read_rank(self, rank: int, detail: bool = True) -> Trace:
        """One rank's events (with the file's metadata); ``detail=False`` keeps the native
        detail of communication events only (their process group, which the collectives
        analysis reads; no other analysis reads it)."""
        if self.row_groups is None:
            ev = self.read().events
            return Trace(ev[ev["rank"] == rank].reset_index(drop=True), self.read_meta)
        try:
            events = conform(self._read(self.row_groups[rank], detail))
            return Trace(events, self.read_meta)
        except (ValueError, TypeError) as exc:
            raise OpprofError(f"damaged opprof trace ({first_line(exc)})",
                              path=self.path, kind=ErrorKind.DAMAGED) from None


def _source(path: Path) -> str | BinaryIO:
    """What pyarrow opens for ``path``: the path, or — for a name that is not UTF-8, which
    pyarrow cannot encode — the open file."""
    try:
        str(path).encode("utf-8")
        return str(path)
    except UnicodeEncodeError:
        return open(path, "rb")  # noqa: SIM115 - pyarrow reads it for the TraceFile's life


#: Columns that may hold no nulls, and the closed vocabularies of the categorical ones.
_REQUIRED = ("rank", "pid", "tid", "ts", "dur", "step", "depth", "counted", "bytes")
_VOCABULARY = {c: set(t.categories) for c, t in COLUMNS.items()
               if isinstance(t, pd.CategoricalDtype)}


def _meta_problem(meta: JSONObject) -> str | None:
    """What is wrong with the metadata fields the analyses read, or None."""
    bounds = meta.get("step_bounds", [])
    if not isinstance(bounds, list) or not all(
            isinstance(b, list) and len(b) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63
                    for v in b) for b in bounds):
        return "step_bounds is not a list of [rank, step, start, end] integers"
    for key in ("row_groups", "clock_offsets_ns", "unprofiled_samples_ns", "partial"):
        if key in meta and not isinstance(meta[key], (dict, type(None))):
            return f"{key} is not an object"
    return None


def _schema_problem(schema: pa.Schema) -> str | None:
    """A column whose type cannot be opprof's, or None (integer widths may differ)."""
    for field_ in schema:
        want = SCHEMA.field(field_.name).type if field_.name in SCHEMA.names else None
        if want is None:
            continue
        got = field_.type
        if pa.types.is_dictionary(want):
            ok = pa.types.is_dictionary(got) or pa.types.is_string(got) or \
                pa.types.is_large_string(got)
        elif pa.types.is_integer(want):
            ok = pa.types.is_integer(got)
        elif pa.types.is_boolean(want):
            ok = pa.types.is_boolean(got)
        elif pa.types.is_floating(want):
            ok = pa.types.is_floating(got) or pa.types.is_integer(got) or pa.types.is_null(got)
        else:
            ok = pa.types.is_string(got) or pa.types.is_large_string(got) or \
                pa.types.is_null(got)
        if not ok:
            return f"column {field_.name} is {got}, not {want}"
    return None


def _table_problem(table: pa.Table) -> str | None:
    """Nulls where opprof writes none, integers beyond their column's width, and values
    outside a closed vocabulary (role, kind, op, phase), or None."""
    import pyarrow.compute as pc

    for name in _REQUIRED:
        if name in table.column_names and table.column(name).null_count:
            return f"column {name} has {table.column(name).null_count} missing values"
    for name, dtype in COLUMNS.items():
        if name not in table.column_names or dtype not in ("int16", "int32"):
            continue
        col = table.column(name)
        if col.type.bit_width > np.dtype(dtype).itemsize * 8 and len(col):
            low, high = pc.min_max(col).values()
            info = np.iinfo(dtype)
            if low.as_py() < info.min or high.as_py() > info.max:
                return f"column {name} holds values beyond {dtype}"
    for name, allowed in _VOCABULARY.items():
        if name not in table.column_names:
            continue
        col = table.column(name)
        values = ({v for chunk in col.chunks for v in chunk.dictionary.to_pylist()}
                  if pa.types.is_dictionary(col.type) else set(pc.unique(col).to_pylist()))
        bad = sorted(str(v) for v in values - allowed - {None})
        if bad:
            return f"column {name} holds values opprof does not know: {', '.join(bad[:3])}"
    return None


def _comm_detail_only(table: pa.Table) -> pa.Table:
    """``table`` with ``detail`` null except on communication events."""
    import pyarrow.compute as pc

    is_comm = pc.is_in(pc.cast(table.column("op"), pa.string()),
                       value_set=pa.array(sorted(COMM_OPS)))
    i = table.column_names.index("detail")
    kept = pc.if_else(pc.fill_null(is_comm, False), table.column("detail"),
                      pa.nulls(len(table), table.schema.field("detail").type))
    return table.set_column(i, table.schema.field("detail"), kept)


def read_parquet(path: Path) -> Trace:
    """Read an opprof `.trace` file; reject other Parquet files with a clear message."""
    return TraceFile(path).read()
