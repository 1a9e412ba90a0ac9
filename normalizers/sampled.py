"""opprof's own resident-memory samples (``memory/<pid>.memory.csv`` in a run's ``.native``
folder, written by :mod:`opprof.collectors.rss`) → memory rows of the ranks they belong to.

A file is one process: a header line (``# opprof memory samples {json}``: pid, host, label,
role, rank as the run's channel knew them) and ``ts_ns,rss_bytes,hwm_bytes`` rows, the
times from the process's host clock (``time.time_ns``). Each file becomes the ``rss`` series
(every sample) and the ``hwm`` series (the samples where the high-water mark changed, and
the last one) of one rank, found by, in order:

1. its role and rank, when the trace has that rank with that role (the runner claimed the
   rank the trace file is named by: torch's ``RANK``, the MXNet kvstore rank, the TF task);
2. its pid, when exactly one rank of the trace has events of that OS process (torch traces
   carry the OS pid; MXNet's do when the run's metadata gives ``rank_pids``);
3. a parameter server without a rank (MXNet's servers run inside ``import mxnet`` and learn
   their server rank from the scheduler): the k-th server by its label (``server k``) is the
   k-th server rank of the trace, in rank order — MXNet numbers servers as they register
   with the scheduler, so with several servers the pairing follows the start order;
4. a scheduler or server with no events in the trace (MXNet's scheduler writes no trace): a
   rank of its own after the others, with memory rows only.

Files of processes that never reported on the channel (role ``null``: torchrun's agent, a
shell) are not ranks and are left out. Times are put on the trace's clock with the rank's
host offset (:func:`host_offsets`); a trace whose clock cannot be related to the host clock
(a TF logdir without opprof's clock marker) takes no samples, and ``meta["memory_skipped"]``
says why.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opprof.errors import ErrorKind, OpprofError, first_line
from opprof.normalizers.memory_rows import add_memory, is_memory, samples
from opprof.trace import Trace

NAME = "sampled"
SUFFIX = ".memory.csv"
HEADER = "# opprof memory samples "
_SERVER_LABEL = re.compile(r"server\s*(\d+)$")


def is_memory_file(path: Path) -> bool:
    """Whether ``path`` is named like an opprof memory sample file."""
    return Path(path).name.endswith(SUFFIX)


def header(path: Path) -> dict[str, Any]:
    """The header of one file (its first line only); a file that is not one is one
    OpprofError line."""
    try:
        with open(path, "rb") as f:
            head = f.readline(1 << 16).decode("utf-8", "replace").rstrip("\n")
    except OSError as exc:
        raise OpprofError(f"cannot read ({exc.strerror or exc})",
                          path=path, kind=ErrorKind.UNREADABLE) from None
    return _parse_header(path, head)


def _parse_header(path: Path, head: str) -> dict[str, Any]:
    if not head.startswith(HEADER):
        raise OpprofError(f"not an opprof memory sample file (no '{HEADER.strip()}' "
                          "header line)", path=path, kind=ErrorKind.NOT_A_TRACE)
    try:
        info = json.loads(head[len(HEADER):])
        if not isinstance(info, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise OpprofError(f"damaged memory sample header ({first_line(exc)})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    return info


def read(path: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """(header, samples: ts_ns, rss_bytes, hwm_bytes) of one file; a file that is not one
    is one OpprofError line. A damaged row (a file cut short) is skipped."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise OpprofError(f"cannot read ({exc.strerror or exc})",
                          path=path, kind=ErrorKind.UNREADABLE) from None
    head, _, body = text.partition("\n")
    info = _parse_header(path, head)
    try:
        df = pd.read_csv(io.StringIO(body), dtype="float64", on_bad_lines="skip")
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise OpprofError(f"damaged memory samples ({first_line(exc)})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    cols = ["ts_ns", "rss_bytes", "hwm_bytes"]
    if list(df.columns) != cols:
        raise OpprofError(f"memory samples must have the columns {','.join(cols)}",
                          path=path, kind=ErrorKind.DAMAGED)
    df = df.dropna()
    return info, df.astype(np.int64).sort_values("ts_ns", kind="stable").reset_index(drop=True)


def host_offsets(trace: Trace) -> dict[int, int] | None:
    """Per rank, what to add to its host's ``time.time_ns()`` to land on the trace's clock;
    None when the trace's clock is not the hosts' (profile-relative TF times)."""
    meta = trace.meta
    formats = set(meta.get("source_formats") or [])
    if "xplane" in formats and meta.get("clock") != "epoch":
        return None
    offsets = meta.get("clock_offsets_ns") or {}
    if formats & {"kineto"}:  # Kineto's offsets align each host to rank 0's clock
        return {int(r): int(v) for r, v in offsets.items()}
    return {}


def attach(trace: Trace, paths: list[Path], new_ranks: bool = True) -> Trace:
    """The trace with the samples of the files at ``paths`` as memory rows (see the module
    docstring for which rank each file becomes; ``new_ranks=False``: only rules 1 and 2,
    for a trace holding some of a job's ranks)."""
    if not paths:
        return trace
    offsets = host_offsets(trace)
    meta = dict(trace.meta)
    if offsets is None:
        meta["memory_skipped"] = (f"{len(paths)} sampled memory file(s) left out: the trace's "
                                  "times are relative to the profile, not the host clock")
        return Trace(trace.events, meta)
    files = sorted((Path(p) for p in paths), key=str)
    infos = [header(p) for p in files]  # headers first: only this trace's files are read
    owners = _owners(trace, infos, new_ranks)
    frames = []
    for path, info, (rank, role) in zip(files, infos, owners, strict=True):
        if rank is None:
            continue
        df = read(path)[1]
        if df.empty:
            continue
        ts = df["ts_ns"].to_numpy(np.int64) + offsets.get(rank, 0)
        pid = int(info.get("pid", -1)) if str(info.get("pid", "")).lstrip("-").isdigit() else -1
        frames.append(samples(rank, role, pid, "cpu", ts, "rss", df["rss_bytes"].to_numpy(),
                              "sampled"))
        hwm = df["hwm_bytes"].to_numpy(np.int64)
        keep = np.r_[True, hwm[1:] != hwm[:-1]]
        keep[-1] = True
        frames.append(samples(rank, role, pid, "cpu", ts[keep], "hwm", hwm[keep], "sampled"))
    out = Trace(trace.events, meta)  # (the files read: meta["memory_sources"], add_memory)
    return add_memory(out, pd.concat(frames, ignore_index=True)) if frames else out


def _owners(trace: Trace, infos: list[dict[str, Any]],
            new_ranks: bool = True) -> list[tuple[int | None, str]]:
    """(rank, role) of each file's process (None: not a rank of this trace)."""
    ev = trace.events
    ev = ev[~is_memory(ev)]
    roles = ev.groupby("rank", observed=True)["role"].first().astype(str).to_dict()
    pids = ev.loc[ev["pid"] >= 0, ["rank", "pid"]].drop_duplicates()
    by_pid = pids.groupby("pid")["rank"].agg(list).to_dict()
    taken: set[int] = set()
    out: list[tuple[int | None, str] | None] = [None] * len(infos)
    for i, info in enumerate(infos):  # 1. role and rank
        role, rank = info.get("role"), info.get("rank")
        if role and isinstance(rank, int) and roles.get(rank) == role and rank not in taken:
            out[i] = (rank, role)
            taken.add(rank)
    for i, info in enumerate(infos):  # 2. the OS pid
        ranks = by_pid.get(info.get("pid"), [])
        if out[i] is None and info.get("role") and len(ranks) == 1 and ranks[0] not in taken:
            out[i] = (int(ranks[0]), roles[int(ranks[0])])
            taken.add(int(ranks[0]))
    if not new_ranks:
        return [o if o is not None else (None, "") for o in out]
    servers = [r for r in sorted(roles) if roles[r] == "server" and r not in taken]
    waiting = sorted((i for i, info in enumerate(infos)
                      if out[i] is None and info.get("role") == "server"),
                     key=lambda i: _label_index(infos[i]))
    for i, rank in zip(waiting, servers, strict=False):  # 3. servers by label
        out[i] = (rank, "server")
        taken.add(rank)
    nxt = max([*roles, *taken], default=-1) + 1
    for i, info in enumerate(infos):  # 4. a process with no trace of its own
        if out[i] is None and info.get("role") in ("server", "scheduler"):
            out[i] = (nxt, str(info["role"]))
            nxt += 1
    return [o if o is not None else (None, "") for o in out]


def _label_index(info: dict[str, Any]) -> tuple[int, int]:
    m = _SERVER_LABEL.search(str(info.get("label") or ""))
    return (int(m.group(1)) if m else 1 << 30, int(info.get("pid") or 0))
