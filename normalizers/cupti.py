"""Helpers the NVIDIA importers share (nsys and nvprof SQLite): safe SQLite access, CUPTI
enums, copy names in torch.profiler's spelling, NVTX range names, and the mapping table.

Both tools record the same CUPTI activity (kernels, memcpy, memset, CUDA API calls tied to
them by ``correlationId``) and NVTX ranges; they differ in table layout and string storage,
which the two importers handle. Copies are named like Kineto names them (``Memcpy HtoD
(Pageable -> Device)``, ``Memset (Device)``) so one mapping table serves all three formats.
"""

from __future__ import annotations

import os
import re
import sqlite3
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from opprof.errors import ErrorKind, OpprofError
from opprof.taxonomy import MappingTable, mapping_table

SQLITE_MAGIC = b"SQLite format 3\x00"

#: CUpti_ActivityMemcpyKind (cupti_activity.h); nsys's ENUM_CUDA_MEMCPY_OPER uses the same
#: numbers and adds 11-13 for unified-memory migrations.
COPY_KIND = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
    8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
}
UNIFIED_COPY_KINDS = frozenset({11, 12, 13})
#: Memory kinds. CUPTI's CUpti_ActivityMemoryKind (nvprof) starts at UNKNOWN = 0; nsys's
#: ENUM_CUDA_MEM_KIND starts at Pageable = 0 and puts Unknown last.
CUPTI_MEM_KIND = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array",
                  5: "Managed", 6: "Device Static", 7: "Managed Static"}
NSYS_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
                 5: "Device Static", 6: "Managed Static", 7: "Unknown"}

#: What torch's ``emit_nvtx`` appends to an operator name (torch/csrc/profiler/util.cpp
#: getNvtxStr): ``, seq = N`` (``, stashed seq = N`` in old versions), ``, op_id = N``,
#: ``, sizes = [...]``, ``, input_op_ids = [...]``.
_TORCH_SUFFIX = re.compile(
    r"^(?P<name>.+?)(?P<rest>, (?:(?:stashed )?seq ?= ?-?\d+|op_id = \d+|sizes = \[|"
    r"input_op_ids = \[).*)$", re.DOTALL)


@cache
def cupti_table() -> MappingTable:
    """The nsys/nvprof mapping table: ``maps/nsys.csv`` rows first, then every kineto row
    (PyTorch's NVTX ranges carry the same aten / autograd names as its Kineto traces)."""
    extra, kineto = mapping_table("nsys"), mapping_table("kineto")
    return MappingTable("nsys", extra.rows + kineto.rows)


def connect(path: Path) -> sqlite3.Connection:
    """Open a SQLite file read-only; a file that is not one is a one-line OpprofError."""
    try:
        con = sqlite3.connect(_uri(path), uri=True)
        con.text_factory = _text
        con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # (a damaged schema's text)
        raise OpprofError(f"unreadable SQLite file ({exc})",
                          path=path, kind=ErrorKind.UNREADABLE) from None
    return con


def _text(data: bytes) -> str:
    """SQLite text as str; bytes that are not UTF-8 (a damaged page) replaced, not raised."""
    return data.decode("utf-8", "replace")


def _uri(path: Path) -> str:
    """A read-only SQLite URI for ``path`` (its name quoted: ``?``, ``#``, ``%`` and bytes
    that are not UTF-8 are a file name's, not the URI's)."""
    from urllib.parse import quote

    return f"file:{quote(os.fsencode(Path(path).resolve()))}?mode=ro"


def is_sqlite(head: bytes) -> bool:
    """True when the first bytes are SQLite's file header."""
    return head.startswith(SQLITE_MAGIC)


def tables(con: sqlite3.Connection) -> set[str]:
    """Names of the tables in a database."""
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def sqlite_tables(path: Path) -> set[str]:
    """Table names of a SQLite file, or an empty set when it cannot be read."""
    try:
        con = sqlite3.connect(_uri(path), uri=True)
        con.text_factory = _text
        try:
            return tables(con)
        finally:
            con.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError):  # (a damaged schema's own text)
        return set()


def read_table(con: sqlite3.Connection, table: str, wanted: list[str],
               raw: tuple[str, ...] = ()) -> pd.DataFrame:
    """The ``wanted`` columns of a table; columns this schema version lacks come back as
    all-missing, so callers handle version differences in one place. NULLs in columns not
    named in ``raw`` (text, blobs) come back as -1, so integer columns stay int64: a NULL
    would turn a column into float64, which cannot hold nanosecond epochs or GlobalIds."""
    have = {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}
    cols = [c for c in wanted if c in have]
    if cols:
        sql = "SELECT " + ", ".join(f'"{c}"' if c in raw else f'COALESCE("{c}", -1) AS "{c}"'
                                    for c in cols) + f' FROM "{table}"'
        rows = con.execute(sql).fetchall()
        # rows to columns once, each column to one array (no per-row pandas inference)
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in cols]
        df = pd.DataFrame({c: _column(v, c in raw) for c, v in zip(cols, columns, strict=True)})
    else:
        n = con.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
        df = pd.DataFrame(index=range(n))
    for c in wanted:
        if c not in df.columns:
            df[c] = np.nan
    return df[wanted]


def _column(values: tuple, raw: bool) -> np.ndarray:
    """One SQL result column as an array: int64 when every value is an integer (the
    COALESCEd id and time columns), else objects (text, blobs, mixed)."""
    if not raw:
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        except (TypeError, ValueError, OverflowError):
            pass
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def int_col(s: pd.Series, fill: int = -1) -> np.ndarray:
    """A numeric column as int64, missing values as ``fill``."""
    return pd.to_numeric(s, errors="coerce").fillna(fill).to_numpy(dtype=np.int64)


def copy_names(copy_kind: pd.Series, src: pd.Series, dst: pd.Series,
               mem_kind: dict[int, str]) -> np.ndarray:
    """``Memcpy HtoD (Pageable -> Device)`` per row, as torch.profiler names copies; built
    once per distinct (kind, src, dst) and broadcast."""
    key = pd.DataFrame({"k": int_col(copy_kind), "s": int_col(src), "d": int_col(dst)})
    combos = key.drop_duplicates().reset_index(drop=True)
    names = []
    for k, s, d in combos.itertuples(index=False):
        text = f"Memcpy {COPY_KIND.get(k, 'Unknown')}"
        if k in UNIFIED_COPY_KINDS:
            text += " (Unified Memory)"
        elif s >= 0 and d >= 0:
            text += f" ({mem_kind.get(s, 'Unknown')} -> {mem_kind.get(d, 'Unknown')})"
        names.append(text)
    combos["name"] = names
    return key.merge(combos, on=["k", "s", "d"], how="left")["name"].to_numpy(dtype=object)


def memset_names(mem: pd.Series, mem_kind: dict[int, str]) -> np.ndarray:
    """``Memset (Device)`` per row (``Memset`` when the memory kind is not recorded)."""
    codes = int_col(mem)
    labels = {k: f"Memset ({v})" for k, v in mem_kind.items()}
    return pd.Series(codes).map(labels).fillna("Memset").to_numpy(dtype=object)


def split_nvtx(texts: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per NVTX range text: (name, detail, torch_op). torch's ``emit_nvtx`` suffixes
    (``, seq = N``, ``, sizes = [...]``, …) move from the name into ``detail`` so the name
    is the operator's; ``torch_op`` marks ranges that carried such a suffix (operators).
    Texts without one are kept as they are. Work is per distinct text."""
    cat = pd.Categorical(texts.astype(object).where(texts.notna(), ""))
    uniq = pd.Series(cat.categories.astype(str))
    parts = uniq.str.extract(_TORCH_SUFFIX)
    has = parts["name"].notna()
    name = parts["name"].where(has, uniq).to_numpy(dtype=object)
    detail = parts["rest"].str.removeprefix(", ").where(has, None).to_numpy(dtype=object)
    codes = cat.codes
    return name[codes], detail[codes], has.to_numpy()[codes]


def nvtx_kinds(names: np.ndarray, torch_op: np.ndarray, table: MappingTable) -> np.ndarray:
    """Kind of each NVTX range: an operator (``cpu_op``) when torch marked it as one, when
    it is an ``aten::`` call, or when the mapping table knows it as an operator; any other
    range is a user annotation (``marker``). The table's own kind column still applies."""
    cat = pd.Categorical(names)
    cls = table.classify(cat.categories).reindex(cat.categories)
    known = ((cls["row"] >= 0) & (cls["op"] != "")).to_numpy()[cat.codes]
    aten = pd.Series(cat.categories.astype(str)).str.startswith("aten::").to_numpy()[cat.codes]
    return np.where(torch_op | known | aten, "cpu_op", "marker").astype(object)


_SIZES = re.compile(r"sizes = (\[.*?\]\])")


def nvtx_costs(names: pd.Series, details: pd.Series) -> dict[str, np.ndarray]:
    """Each torch operator range's own cost (the raw cost columns, opprof.flops.attribute)
    from the input shapes ``emit_nvtx(record_shapes=True)`` appends (``sizes = [[…], …]``, in
    ``detail``): no dtypes and no scalars there, so the FLOPs of the operators whose shapes
    say them (GEMMs, attention) are known and their bytes, and a convolution's (it needs its
    strides), are not. Per distinct (name, detail)."""
    import json

    from opprof.flops.table import UNMODELED, kineto_cost

    n = len(names)
    out = {"flops": np.full(n, np.nan), "model_flops": np.full(n, np.nan),
           "mem_bytes": np.full(n, np.nan), "precision": np.full(n, -1, np.int8),
           "cost_kind": np.full(n, UNMODELED, np.int8)}
    text = details.astype(object).where(details.notna(), "").astype(str)
    sel = np.flatnonzero(text.str.contains("sizes = [", regex=False).to_numpy())
    if not len(sel):
        return out
    key = pd.Series(names.astype(str).to_numpy()[sel] + "\x1f" + text.to_numpy()[sel])
    codes, uniq = pd.factorize(key)
    got = []
    for k in uniq:
        name, detail = k.split("\x1f", 1)
        m = _SIZES.search(detail)
        try:
            dims = json.loads(m.group(1)) if m else None
        except ValueError:
            dims = None
        got.append(kineto_cost(name, dims, None, None))
    vals = np.array(got, dtype=np.float64).reshape(-1, 5)[codes]
    out["flops"][sel], out["model_flops"][sel], out["mem_bytes"][sel] = vals[:, :3].T
    out["precision"][sel] = vals[:, 3].astype(np.int8)
    out["cost_kind"][sel] = vals[:, 4].astype(np.int8)
    return out


def missing_tables(warnings: dict, fmt: str, device: int, calls: int, launches: int,
                   kernels: bool) -> None:
    """Say (opprof.drops) what an NVIDIA export lacking a table cannot tell: GPU activities
    with no runtime call at all (the runtime table dropped or empty: no kernel has the call
    that launched it), kernel launches with no kernel (the kernel table dropped or empty:
    their GPU time is unknown)."""
    from opprof import drops

    if device and not calls:
        drops.note(warnings, f"GPU activities with no CUDA runtime call to launch them (no "
                   f"runtime-call rows in the {fmt} export): their host operators unknown",
                   device)
    if launches and not kernels:
        drops.note(warnings, f"kernel launches with no kernel in the {fmt} export (its "
                   "kernel table missing or empty): their GPU time unknown", launches)
