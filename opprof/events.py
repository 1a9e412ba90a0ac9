"""Turn a raw per-format event frame into the common events table.

A normalizer produces a *raw* frame — rank, role, pid, tid, device, ts, dur, name, kind,
bytes, detail and ``link`` (an id tying a device event to the host operator that launched
it, -1 for none) — and calls :func:`finish`, which does what every format shares:

1. classify each distinct native name with the format's mapping table;
2. find, per lane (rank, pid, tid), each event's nesting depth and its outermost enclosing
   operator event; nested events take that operator's op and phase and are not ``counted``
   (``aten::conv2d > … > aten::mkldnn_convolution`` is one ``convolution``); the one
   exception is communication, which stays ``comm`` (and is counted) wherever it is issued;
3. give device events (kernels, memcpy, memset) the op and phase of the host operator that
   launched them (via ``link``) unless their own name maps to an op (NCCL kernels → comm);
4. resolve phases (intrinsic row phase > enclosing phase marker > row phase > other);
5. find each rank's steps (step markers, else the optimizer step, else one step) and number
   every event with the step it starts in.

Everything is vectorized over events; only the mapping table runs per distinct name.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from opprof.intervals import label_points, nest
from opprof.taxonomy import (
    CANONICAL_OPS,
    DEVICE_KINDS,
    INTRINSIC_PHASES,
    KINDS,
    PHASES,
    MappingTable,
)
from opprof.trace import Trace, conform

#: Names of step markers; the group is the step number.
STEP_PATTERN = r"(?:ProfilerStep|opprof\.step)#(\d+)"
RAW_COLUMNS = (
    "rank", "role", "pid", "tid", "device", "ts", "dur", "name", "kind", "bytes", "detail", "link",
)


_OPS = np.array(CANONICAL_OPS, dtype=object)
_OP = {o: i for i, o in enumerate(CANONICAL_OPS)}
_PHASE = {p: i for i, p in enumerate(PHASES)}
_KIND = {k: i for i, k in enumerate(KINDS)}
_COMM_OP, _UPDATE_OP = _OP["comm"], _OP["weights_update"]
_OTHER_PHASE, _COMM_PHASE = _PHASE["other"], _PHASE["comm"]
_MARKER_KIND = _KIND["marker"]
_DEVICE_KIND_CODES = [_KIND[k] for k in DEVICE_KINDS]
_INTRINSIC_CODES = [_PHASE[p] for p in INTRINSIC_PHASES]


def _codes(values: pd.Series | np.ndarray, index: dict[str, int]) -> np.ndarray:
    """Codes of a string column in a closed set (``index``); -1 for empty, missing or unknown.
    Categorical input is recoded per category, anything else per distinct value."""
    cat = values if isinstance(values, pd.Categorical) else (
        values.array if isinstance(values, pd.Series)
        and isinstance(values.dtype, pd.CategoricalDtype) else None)
    if cat is None:
        codes, uniq = pd.factorize(np.asarray(values, dtype=object))
        table = np.array([index.get(u, -1) if isinstance(u, str) else -1 for u in uniq]
                         + [-1], dtype=np.int64)
        return table[codes]
    table = np.array([index.get(str(u), -1) for u in cat.categories] + [-1], dtype=np.int64)
    return table[np.asarray(cat.codes, dtype=np.int64)]


def finish(
    raw: pd.DataFrame, table: MappingTable, meta: dict, *, step_pattern: str = STEP_PATTERN
) -> Trace:
    """Classify, nest, attribute and number the raw events; return the finished Trace.

    Operators, phases and kinds are carried as integer codes into the closed sets of the
    taxonomy (-1 for none), so that no per-event string is compared or hashed."""
    df = raw.reset_index(drop=True)
    n = len(df)
    names = df["name"]
    names = (names.array if isinstance(names.dtype, pd.CategoricalDtype)
             else pd.Categorical(names.astype(object)))
    if not names.categories.is_monotonic_increasing:
        names = names.reorder_categories(sorted(names.categories))
    cls = table.classify(names.categories).reindex(names.categories)
    codes = np.asarray(names.codes, dtype=np.int64)
    u_op = cls["op"].to_numpy(dtype=object)
    u_empty_op = np.append(u_op == "", False)
    u_op = np.append(np.array([_OP.get(o, -1) for o in u_op], dtype=np.int64), -1)
    u_phase = np.append(np.array([_PHASE.get(p, -1) for p in cls["phase"]], np.int64), -1)
    u_kind = np.append(np.array([_KIND.get(k, -1) for k in cls["kind"]], np.int64), -1)
    u_matched = np.append(cls["row"].to_numpy() >= 0, False)
    row_op, row_phase, row_kind = u_op[codes], u_phase[codes], u_kind[codes]
    matched = u_matched[codes]

    kind = np.where(row_kind >= 0, row_kind, _codes(df["kind"], _KIND))
    rank = df["rank"].to_numpy(dtype=np.int64)
    ts = df["ts"].to_numpy(dtype=np.int64)
    dur = np.maximum(df["dur"].to_numpy(dtype=np.int64), 0)
    end = ts + dur
    device = df["device"]
    on_host = (_codes(device, {"cpu": 0}) == 0)
    is_marker = (kind == _MARKER_KIND) | u_empty_op[codes]

    # Phase markers (host markers whose row names a phase) give a phase by time, per rank.
    is_phase_marker = is_marker & on_host & (row_phase >= 0)
    marker_phase = cover_label(rank, ts, rank[is_phase_marker], ts[is_phase_marker],
                                end[is_phase_marker], row_phase[is_phase_marker], default=-1)

    own_phase = _resolve_phase(row_phase, marker_phase)
    is_device_ev = np.isin(kind, _DEVICE_KIND_CODES) & ~on_host

    lane = lane_ids(rank, df["pid"].to_numpy(np.int64), df["tid"].to_numpy(np.int64))
    # On device lanes only kernels, copies and sets are operators (a GPU-side "Stream Sync"
    # span is not, and must not swallow the copies inside it).
    is_op = ~is_marker & (on_host | is_device_ev)
    depth, anc = nest(lane, ts, end, is_op)
    anc = np.where(is_device_ev, np.arange(n), anc)
    has_anc = anc >= 0
    op = np.where(is_marker, -1, row_op)
    phase = np.where(is_marker, row_phase, own_phase)
    op[has_anc] = op[anc[has_anc]]
    phase[has_anc] = phase[anc[has_anc]]
    counted = is_op & (anc == np.arange(n))

    # Communication stays communication wherever it is issued: the outermost comm event
    # inside a compute operator (DDP's all-reduce in a backward hook) is counted as comm;
    # the enclosing operator's total still includes it.
    own_comm = is_op & on_host & (row_op == _COMM_OP)
    if own_comm.any():
        _, comm_anc = nest(lane, ts, end, own_comm)
        in_comm = comm_anc >= 0
        op[in_comm] = _COMM_OP
        phase[in_comm] = _COMM_PHASE
        counted |= in_comm & (comm_anc == np.arange(n))

    # Device events take the op of the host operator that launched them (via ``link``)
    # unless their own name maps, and its phase unless their row phase is intrinsic.
    link = df["link"].to_numpy(dtype=np.int64)
    intrinsic = np.isin(row_phase, _INTRINSIC_CODES)
    phase[is_device_ev] = np.where(intrinsic[is_device_ev], row_phase[is_device_ev],
                                   _OTHER_PHASE)
    inherit = is_device_ev & (link >= 0)
    if inherit.any():
        host = np.flatnonzero(~is_device_ev & ~is_marker & (link >= 0))
        key_host = pd.Index(rank[host] * (1 << 40) + link[host])
        keep = ~key_host.duplicated(keep="first")
        key_host, src = key_host[keep], host[keep]
        pos = key_host.get_indexer(rank[inherit] * (1 << 40) + link[inherit])
        idx = np.flatnonzero(inherit)
        ok = pos >= 0
        take_op = ok & ~matched[idx]
        op[idx[take_op]] = op[src[pos[take_op]]]
        take_phase = ok & ~intrinsic[idx]
        phase[idx[take_phase]] = phase[src[pos[take_phase]]]
    counted |= is_device_ev

    bounds = _step_bounds(rank, ts, end, names, codes, step_pattern, on_host, is_marker,
                          op, counted)
    step = cover_label(rank, ts, bounds["rank"].to_numpy(), bounds["start"].to_numpy(),
                        bounds["end"].to_numpy(), bounds["step"].to_numpy(), default=-1)

    out = pd.DataFrame({
        "rank": rank, "role": df["role"], "pid": df["pid"], "tid": df["tid"],
        "device": device, "ts": ts, "dur": dur, "name": names,
        "kind": pd.Categorical.from_codes(kind, categories=KINDS),
        "op": pd.Categorical.from_codes(op, categories=CANONICAL_OPS),
        "phase": pd.Categorical.from_codes(phase, categories=PHASES),
        "step": step.astype(np.int32),
        "depth": np.minimum(depth, np.iinfo(np.int16).max), "counted": counted,
        "bytes": df["bytes"], "detail": df["detail"], "link": link,
    })
    meta = dict(meta)
    meta["step_bounds"] = bounds[["rank", "step", "start", "end"]].to_numpy().tolist()
    return Trace(conform(out), meta)


def lane_ids(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One integer per distinct (rank, pid, tid), numbered in order of first appearance
    (what ``groupby(..., sort=False).ngroup()`` gives, without building groups)."""
    if len(rank) == 0:
        return np.zeros(0, np.int64)
    key = np.zeros(len(rank), np.int64)
    for part in (rank, pid, tid):
        codes, uniq = pd.factorize(part)
        key = key * len(uniq) + codes  # distinct combinations stay distinct
        key = pd.factorize(key)[0].astype(np.int64)  # renumber: never overflows
    return key


def _resolve_phase(row_phase: np.ndarray, marker_phase: np.ndarray) -> np.ndarray:
    """Intrinsic row phase > marker phase > row phase > other (phase codes; -1 for none)."""
    intrinsic = np.isin(row_phase, _INTRINSIC_CODES)
    out = np.where(marker_phase >= 0, marker_phase, row_phase)
    out = np.where(intrinsic, row_phase, out)
    return np.where(out < 0, _OTHER_PHASE, out)


def cover_label(rank: np.ndarray, ts: np.ndarray, i_rank: np.ndarray, i_start: np.ndarray,
                i_end: np.ndarray, i_label: np.ndarray, default: str | int) -> np.ndarray:
    """For each point (rank, ts): the label of the latest-starting interval of the same rank
    that covers it, or ``default`` (:func:`opprof.intervals.label_points`)."""
    return label_points(rank, ts, i_rank, i_start, i_end, i_label, default)


def _step_bounds(rank, ts, end, names, codes, step_pattern, on_host, is_marker, op, counted):
    """Per rank: step intervals from step markers, else from optimizer steps, else the
    whole rank as step 0."""
    cats = pd.Series(names.categories.astype(str))
    num = cats.str.extract(f"^{step_pattern}$", flags=re.ASCII)[0]
    step_no = pd.to_numeric(num, errors="coerce").to_numpy()[codes] if len(cats) else np.array([])
    is_step = on_host & is_marker & ~np.isnan(step_no) if len(cats) else np.zeros(0, bool)
    frames = []
    ranks = np.unique(rank)
    have = np.unique(rank[is_step])
    if len(have):
        frames.append(pd.DataFrame({"rank": rank[is_step], "step": step_no[is_step].astype(int),
                                    "start": ts[is_step], "end": end[is_step]}))
    rest = np.setdiff1d(ranks, have)
    if len(rest):
        upd = np.isin(rank, rest) & on_host & counted & (op == _UPDATE_OP)
        first = pd.Series(ts[np.isin(rank, rest)]).groupby(rank[np.isin(rank, rest)]).min()
        if upd.any():
            u = pd.DataFrame({"rank": rank[upd], "end": end[upd]}).sort_values(["rank", "end"])
            u["step"] = u.groupby("rank").cumcount()
            u["start"] = u.groupby("rank")["end"].shift(1)
            u["start"] = u["start"].fillna(u["rank"].map(first)).astype(np.int64)
            frames.append(u[["rank", "step", "start", "end"]])
            rest = np.setdiff1d(rest, u["rank"].unique())
        if len(rest):
            sel = np.isin(rank, rest)
            g = pd.DataFrame({"rank": rank[sel], "ts": ts[sel], "end": end[sel]}).groupby("rank")
            whole = pd.DataFrame({"start": g["ts"].min(), "end": g["end"].max()}).reset_index()
            whole["step"] = 0
            frames.append(whole[["rank", "step", "start", "end"]])
    if not frames:
        return pd.DataFrame({"rank": [], "step": [], "start": [], "end": []}, dtype=np.int64)
    b = pd.concat(frames, ignore_index=True).astype(np.int64)
    return b.sort_values(["rank", "start"]).drop_duplicates(["rank", "step"]).reset_index(drop=True)
