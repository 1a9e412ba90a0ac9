"""The `.trace` file: one Parquet events table for all ranks plus JSON metadata."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from opprof.errors import OpprofError, first_line
from opprof.files import write_atomic
from opprof.taxonomy import CANONICAL_OPS, KINDS, PHASES, ROLES

FORMAT_VERSION = 1
META_KEY = b"opprof"

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
}


@dataclass
class Trace:
    """A normalized trace: ``events`` (one row per event, the COLUMNS above) and ``meta``."""

    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        """The worker ranks present."""
        ev = self.events
        return sorted(ev.loc[ev["role"] == "worker", "rank"].unique().tolist())

    def step_bounds(self) -> pd.DataFrame:
        """Per rank and step: start and end (ns), from the metadata written at normalization."""
        rows = self.meta.get("step_bounds", [])
        df = pd.DataFrame(rows, columns=["rank", "step", "start", "end"])
        return df.astype({"rank": "int32", "step": "int32", "start": "int64", "end": "int64"})


def empty_events() -> pd.DataFrame:
    """An events table with no rows and the right dtypes."""
    return conform(pd.DataFrame({c: [] for c in COLUMNS}))


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Return df with exactly COLUMNS in order and their dtypes. Categorical columns that
    already have the right categories are kept as they are (no per-row work); the free
    categories of ``device`` and ``name`` are text, sorted (so a table read back from many
    row groups or ranks is the same as one made at once)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"events table lacks columns {missing}")
    cols = {}
    n = len(df)
    for col, dtype in COLUMNS.items():
        c = df[col]
        if isinstance(dtype, pd.CategoricalDtype):
            if isinstance(c.dtype, pd.CategoricalDtype) and c.dtype == dtype:
                cols[col] = c.array.copy()
            else:
                cols[col] = pd.Categorical(np.asarray(c, dtype=object) if isinstance(
                    c.dtype, pd.CategoricalDtype) else c.astype(object),
                    categories=dtype.categories)
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
            cols[col] = pd.Categorical.from_codes(cat.codes, categories=text)
        else:
            cols[col] = c.to_numpy().astype(dtype) if dtype != "string" else c.astype(dtype)
    return pd.DataFrame(cols, index=pd.RangeIndex(n))


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write the trace atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    meta = dict(trace.meta)
    meta.setdefault("format_version", FORMAT_VERSION)
    table = pa.Table.from_pandas(conform(trace.events), preserve_index=False)
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[META_KEY] = json.dumps(meta, default=_json_default).encode()
    table = table.replace_schema_metadata(schema_meta)
    write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def read_parquet(path: Path) -> Trace:
    """Read an opprof `.trace` file; reject other Parquet files with a clear message."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise OpprofError(f"{path}: unreadable Parquet file ({first_line(exc)})") from None
    meta_raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if meta_raw is None:
        cols = ", ".join(pf.schema_arrow.names[:6])
        raise OpprofError(
            f"{path}: a Parquet file but not an opprof trace (no opprof metadata; columns: {cols})"
        )
    meta = json.loads(meta_raw)
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise OpprofError(
            f"{path}: opprof trace format {meta['format_version']} is newer than this "
            f"opprof reads ({FORMAT_VERSION}); upgrade opprof"
        )
    try:
        events = pf.read().to_pandas()
        if "link" not in events:
            events["link"] = -1
    except (pa.ArrowInvalid, OSError) as exc:
        raise OpprofError(f"{path}: damaged opprof trace ({first_line(exc)})") from None
    return Trace(conform(events), meta)
