"""Chainer traces (``rankR.chainer.json``, written by opprof's Chainer collector from Chainer's
own function hooks: Chainer has no profiler) → the common events table.

The file is JSON whose first key is ``opprof_chainer_trace``; then the process's facts
(``rank``, ``role``, ``pid``, ``epoch_offset_ns``: perf-counter → epoch clock, ``facts``: the
run's model, batch size …) and ``events``: ``[name, ts_ns, dur_ns, tid]`` rows on the process's
perf counter. Names are ``forward:<function label>`` / ``backward:<function label>`` (one
``FunctionNode``'s forward or backward; what a backward applies is nested inside it and
counted once), ``update:<update rule>``, ``comm:<collective>:<ChainerMN call>``,
``load:<iterator>``, and opprof's markers (``opprof.step#N``, ``opprof.load`` …).
normalizers/maps/chainer.csv maps them. Memory is the sampled resident memory (Chainer on
numpy has no allocator to read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opprof.errors import ErrorKind, OpprofError
from opprof.normalizers.events import finish
from opprof.taxonomy import mapping_table
from opprof.trace import Trace

NAME = "chainer"
MAGIC = b'{"opprof_chainer_trace"'


def claims_file(path: Path, head: bytes) -> bool:
    """A trace written by opprof's Chainer collector."""
    return head.startswith(MAGIC)


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise OpprofError(f"cannot be read ({exc})", path=path,
                          kind=ErrorKind.UNREADABLE) from None
    except ValueError as exc:
        raise OpprofError(f"damaged Chainer trace: not complete JSON ({exc})", path=path,
                          kind=ErrorKind.DAMAGED) from None
    rows = doc.get("events") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise OpprofError("Chainer trace with no events (was anything profiled?)", path=path,
                          kind=ErrorKind.NO_EVENTS)
    return doc


def _frame(doc: dict[str, Any], path: Path, rank: int) -> pd.DataFrame:
    rows = [r for r in doc["events"] if isinstance(r, list) and len(r) == 4]
    df = pd.DataFrame(rows, columns=["name", "ts", "dur", "tid"])
    ts = pd.to_numeric(df["ts"], errors="coerce")
    dur = pd.to_numeric(df["dur"], errors="coerce")
    ok = ts.notna() & dur.notna() & (dur >= 0) & df["name"].map(lambda n: isinstance(n, str))
    if not ok.any():
        raise OpprofError("Chainer trace with no usable events", path=path,
                          kind=ErrorKind.NO_EVENTS)
    df = df[ok]
    offset = int(doc.get("epoch_offset_ns") or 0)
    name = df["name"].astype(str)
    marker = name.str.startswith("opprof.")
    detail = name.str.split(":", n=1).str[-1].where(~marker, None)
    n = len(df)
    return pd.DataFrame({
        "rank": rank, "role": str(doc.get("role") or "worker"),
        "pid": int(doc.get("pid") or -1),
        "tid": pd.to_numeric(df["tid"], errors="coerce").fillna(0).astype(np.int64) % (1 << 31),
        "device": "cpu", "ts": ts[ok].astype(np.int64).to_numpy() + offset,
        "dur": dur[ok].astype(np.int64).to_numpy(), "name": name.to_numpy(object),
        "kind": np.where(marker, "marker", "cpu_op"), "bytes": np.zeros(n, np.int64),
        "detail": detail.to_numpy(object), "link": np.full(n, -1, np.int64)})


def from_files(paths: list[Path], meta: dict[str, Any]) -> Trace:
    """Normalize one Chainer trace per process into one Trace (ranks as the files say, else
    in file order)."""
    docs = [(Path(p), _read(Path(p))) for p in paths]
    taken: set[int] = set()
    frames, ranks = [], []
    for i, (p, doc) in enumerate(docs):
        rank = doc.get("rank")
        rank = int(rank) if isinstance(rank, int) and rank not in taken else i
        while rank in taken:
            rank += 1
        taken.add(rank)
        ranks.append({"rank": rank, "role": str(doc.get("role") or "worker"), "source": str(p)})
        frames.append(_frame(doc, p, rank))
    first = docs[0][1]
    info: dict[str, Any] = {
        "source_formats": [NAME], "sources": [str(p) for p, _ in docs],
        "framework": "chainer", "framework_version": str(first.get("framework_version", "")),
        "workers": sum(r["role"] == "worker" for r in ranks), "servers": 0, "device": "cpu",
        "clock": "epoch", "ranks": ranks,
        "clock_offsets_ns": {str(r["rank"]): 0 for r in ranks}}
    for key, value in (first.get("facts") or {}).items():
        info.setdefault(key, value)
    info.update(meta)
    return finish(pd.concat(frames, ignore_index=True), mapping_table(NAME), info)
