"""Turn a raw per-format event frame into the common events table.

A normalizer produces a *raw* frame — rank, role, pid, tid, device, ts, dur, name, kind,
bytes, detail and ``link`` (an id tying a device event to the host operator that launched
it, -1 for none), and optionally ``closes_step`` (True for the events whose end closes a
training step on a rank without step markers, such as TensorFlow's call of the training
function) — and calls :func:`finish`, which does what every format shares:

1. classify each distinct native name with the format's mapping table;
2. find, per lane (rank, pid, tid), each event's nesting depth and its outermost enclosing
   operator event; nested events take that operator's op and phase and are not ``counted``
   (``aten::conv2d > … > aten::mkldnn_convolution`` is one ``convolution``); the one
   exception is communication, which stays communication (and is counted) wherever it is
   issued, the events nested in a collective taking its collective (``c10d::allreduce_ >
   record_param_comms > nccl:all_reduce`` is one ``all_reduce``); an optional raw column
   ``collective`` names the collective of a communication event whose name does not (torch's
   ``record_param_comms``, an MXNet comm window);
3. give device events (kernels, memcpy, memset) the op and phase of the host operator that
   launched them (via ``link``) unless their own name maps to an op (NCCL kernels → their
   collective; a kernel of no collective of its own, NCCL's ``SendRecv``, takes its
   launching call's);
4. resolve phases (intrinsic row phase > enclosing phase marker > row phase > other);
5. find each rank's steps (step markers, else the optimizer step, else one step) and number
   every event with the step it starts in.

**Phase inference** (a worker rank with no phase marker: a user's own trace). The phases a
step runs through show in its operators (``ConvolutionBackward0`` is backward,
``Optimizer.step`` or ``ResourceApplyAdam`` update, ``IteratorGetNext`` load), but the time
between them — the Python and framework dispatch around every operator — and the operators
no row gives a phase (``aten::add_``, ``DeleteVariable``) would be ``other``. On such a rank,
after its steps are found:

* the *phased* operators are the outermost host operators whose row gives a phase (load,
  h2d, forward, backward, update); the ones that *lead* are all of them but the update
  operators that start before their step's first backward operator (optimizer work that
  needs no gradient, such as Keras computing its learning-rate terms as the training
  function starts: it stays update, but the step is not heading there);
* a *gap* is an interval no phased operator covers, on any thread (and the tail from the
  rank's last one to its last step's end, and the head from its first step's start — a
  step marker's, as ``opprof run`` writes — to its first one); it takes the phase of the
  first leading operator that starts at or after its end (the last one's, for the tail).
  Host time before an operator is thus spent on the way to it: the gap between two forward
  operators is forward, the one before ``loss.backward()``'s first operator backward, the
  one before the next batch is fetched load. A long operator on another thread (MXNet's
  Python thread blocked in a batch copy while the engine computes) covers its time and
  leaves no gap there;
* consecutive gaps of one phase make one span, a marker event ``opprof.inferred.<phase>`` on
  a lane of its own (tid ``INFERRED_TID``): it gives its phase to the time no operator
  covers (the breakdown's marker tier) and counts in that phase's busy time;
* an outermost host operator without a phase of its own takes the phase of the first
  leading operator that starts at or after it (of the last one before it at the end), and
  what it encloses follows; one that launched a host-to-device copy (``aten::to(cuda)``) is
  h2d. An operator's own row phase always wins, and communication keeps ``comm`` (it leads
  no gap: the gaps around it go to the compute or load that follows).

``meta["inferred_phases"]`` lists the ranks inferred. Ranks with phase markers, servers and
schedulers are left as they were.

**Steps without step markers**: where the normalizer flags events that close a step
(``closes_step``), each one ends a step. Otherwise the optimizer does: a step ends where
the optimizer has updated every weight — at the latest end of the ``weights_update``
operators that run between one forward pass and the next — and the next step starts there
(the first at the rank's first operator of a phase, so that setting up before the loop is
no step). One ``Optimizer.step`` per step (torch) and many per-weight update operators
interleaved with the backward pass (MXNet's ``multi_sgd_mom_update`` per group of weights
as their gradients are ready) give one step either way. A worker whose weights are updated
elsewhere (a parameter-server worker with ``update_on_kvstore``) has no update operators:
its communication closes the step in the same way (the last pull before the next forward
pass).

**Compiled graphs** (torch.compile): events whose row is a ``container`` are transparent —
the operators inside keep their own op, the graph gets the rest (``opprof.normalizers.graphs``).

Everything is vectorized over events; only the mapping table runs per distinct name.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from opprof import drops
from opprof.errors import ErrorKind, OpprofError
from opprof.intervals import Nesting, label_points, lane_ids
from opprof.normalizers.graphs import Graphs
from opprof.taxonomy import (
    CANONICAL_OPS,
    COMM_OPS,
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
#: Phases whose operators show where a step runs through them (phase inference).
INFER_PHASES = ("load", "h2d", "forward", "backward", "update")
#: The lane (tid) of the phase spans inferred on a rank without phase markers.
INFERRED_TID = -2
#: Name of an inferred phase span: this prefix and the phase.
INFERRED_PREFIX = "opprof.inferred."


_OPS = np.array(CANONICAL_OPS, dtype=object)
_OP = {o: i for i, o in enumerate(CANONICAL_OPS)}
_PHASE = {p: i for i, p in enumerate(PHASES)}
_PHASE_NAMES = np.array(PHASES, dtype=object)
_KIND = {k: i for i, k in enumerate(KINDS)}
_COMM_OP, _UPDATE_OP = _OP["comm"], _OP["weights_update"]
_OTHER_OP = _OP["other"]
_FUSED, _FUSED_BACKWARD = _OP["fused"], _OP["fused_backward"]
#: Every communication op (the collectives, push/pull, and ``comm`` for an unnamed one).
_COMM_CODES = np.array(sorted(_OP[o] for o in COMM_OPS), np.int64)
#: What a communication call does around its collective: copies, element-wise scaling.
_CALL_OPS = np.r_[_COMM_CODES, [_OP["memory"], _OP["elementwise"]]]
_OTHER_PHASE, _COMM_PHASE = _PHASE["other"], _PHASE["comm"]
_MARKER_KIND = _KIND["marker"]
_DEVICE_KIND_CODES = [_KIND[k] for k in DEVICE_KINDS]
_INTRINSIC_CODES = [_PHASE[p] for p in INTRINSIC_PHASES]
_INFER_CODES = [_PHASE[p] for p in INFER_PHASES]


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
    raw: pd.DataFrame, table: MappingTable, meta: dict, *, step_pattern: str = STEP_PATTERN,
    checked: bool = False,
) -> Trace:
    """Classify, nest, attribute and number the raw events; return the finished Trace.

    Operators, phases and kinds are carried as integer codes into the closed sets of the
    taxonomy (-1 for none), so that no per-event string is compared or hashed. Events that
    cannot be placed on the timeline are dropped and counted first (:func:`usable`), unless
    the normalizer did (``checked``: it keeps rows aligned with columns of its own)."""
    meta = {**meta, drops.KEY: dict(meta.get(drops.KEY) or {})}
    df = (raw if checked else usable(raw, meta, step_pattern)).reset_index(drop=True)
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
    u_container = np.append(cls["container"].eq(True).to_numpy(bool), False)
    u_kernel = np.append(cls["kernel"].eq(True).to_numpy(bool), False) if "kernel" in cls \
        else np.zeros(len(u_container), bool)
    row_op, row_phase, row_kind = u_op[codes], u_phase[codes], u_kind[codes]
    matched = u_matched[codes]
    if "collective" in df:  # the collective a comm event's args name (not its name)
        named = _codes(df["collective"], _OP)
        row_op = np.where((named >= 0) & np.isin(row_op, _COMM_CODES), named, row_op)

    kind = np.where(row_kind >= 0, row_kind, _codes(df["kind"], _KIND))
    rank = df["rank"].to_numpy(dtype=np.int64)
    ts = df["ts"].to_numpy(dtype=np.int64)
    dur = df["dur"].to_numpy(dtype=np.int64)
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
    nesting = Nesting(lane, ts, end)  # sorted once for both questions below
    # Compiled-graph containers are transparent: what they enclose is classified on its own.
    container = u_container[codes] & is_op & on_host
    depth, anc = nesting.nest(is_op & ~container)
    container &= anc < 0  # a container inside an operator is part of that operator
    anc = np.where(is_device_ev, np.arange(n), anc)
    graphs = Graphs.of(lane, ts, end, container, is_op & on_host)
    # an unmapped operator inside a graph is the graph's own (fused) time
    absorb = graphs.inner >= 0
    absorb &= is_op & on_host & ~container & (anc == np.arange(n)) & ~matched
    row_op = row_op.copy()
    row_op[absorb] = row_op[graphs.inner[absorb]]
    has_anc = anc >= 0
    op = np.where(is_marker, -1, row_op)
    op[has_anc] = op[anc[has_anc]]
    counted = is_op & (anc == np.arange(n))
    # An operator no row names (a user's autograd function, ``AllToAll``) around a collective
    # is that communication's call (not ``other`` swallowing it): an unnamed comm call.
    # (On a GPU the device's kernels say what is communication: the host's calls stay.)
    if not is_device_ev.any():
        row_op, row_phase = _calls_around_comm(nesting, row_op, row_phase, is_op & on_host,
                                               matched, container, names, codes)
    # Communication stays communication wherever it is issued: the outermost comm event
    # (a comm op, or an event of phase comm such as FSDP's copy-in/out) inside a compute
    # operator (DDP's all-reduce in a backward hook, FSDP's all-gather in a pre-backward hook)
    # is counted with its own op; the enclosing operator's total still includes it. What it
    # encloses takes its collective (an unnamed one, ``comm``, that of the collectives inside
    # it when they are all of one kind: an MXNet comm window of pushes is a push). Inside it, a
    # comm-phase event of an op that is no communication (FSDP's copy-in/out, ``memory``, in
    # its all-gather) keeps that op and is counted as it.
    is_comm_op = np.isin(row_op, _COMM_CODES)
    own_comm = is_op & on_host & (is_comm_op | (row_phase == _COMM_PHASE))
    in_comm = np.zeros(n, bool)
    if own_comm.any():
        _, comm_anc = nesting.nest(own_comm)
        in_comm = comm_anc >= 0
        top_op = row_op[np.maximum(comm_anc, 0)]
        inner = in_comm & own_comm & is_comm_op & (row_op != _COMM_OP)
        if inner.any():  # an unnamed call around collectives of one kind takes their name
            kinds = pd.Series(row_op[inner]).groupby(comm_anc[inner]).agg(["first", "nunique"])
            one = kinds.loc[kinds["nunique"] == 1, "first"]
            named = one.reindex(comm_anc).to_numpy(dtype=float)
            fill = in_comm & (top_op == _COMM_OP) & ~np.isnan(named)
            top_op[fill] = named[fill].astype(np.int64)
        copy = in_comm & own_comm & ~is_comm_op & (row_op != top_op)
        op[in_comm] = np.where(copy[in_comm], row_op[in_comm], top_op[in_comm])
        comm_op = op[in_comm]  # (given back after the compiled graphs settle, below)
        counted |= in_comm & ((comm_anc == np.arange(n)) | copy)
        del comm_anc, top_op  # (a column each: the table's memory peaks below)
    costs = _costs(df, nesting, is_op, anc, rank, is_device_ev, dur,
                   row_phase == _PHASE["backward"], np.isin(row_op, _COMM_CODES))
    del nesting

    # Steps, from step markers, the events the normalizer flags, or the optimizer.
    outer = (is_op & on_host & (anc == np.arange(n))) | (container & (graphs.inner < 0))
    phased = outer & np.isin(row_phase, _INFER_CODES)
    closes_step = (df["closes_step"].to_numpy(bool) if "closes_step" in df
                   else np.zeros(n, bool))
    forward = outer & (row_phase == _PHASE["forward"])
    bounds = _step_bounds(rank, ts, end, names, codes, step_pattern, on_host, is_marker,
                          op, counted, forward, phased, closes_step)
    step = cover_label(rank, ts, bounds["rank"].to_numpy(), bounds["start"].to_numpy(),
                        bounds["end"].to_numpy(), bounds["step"].to_numpy(), default=-1)

    # Workers without phase markers: infer phases from their operators' own phases.
    worker = _codes(df["role"], {"worker": 0}) == 0
    unmarked = worker & ~np.isin(rank, np.unique(rank[is_phase_marker]))
    spans = pd.DataFrame({"rank": [], "start": [], "end": [], "phase": []})
    inferred = np.unique(rank[unmarked & phased])
    if len(inferred):
        top = np.flatnonzero(unmarked & phased)
        lead = top[_leads(rank[top], ts[top], step[top], row_phase[top])]
        spans = infer_phase_spans(rank[top], ts[top], end[top],
                                  (rank[lead], ts[lead], row_phase[lead]),
                                  bounds.groupby("rank")["end"].max(),
                                  bounds.groupby("rank")["start"].min())
        bare = np.flatnonzero(unmarked & outer & (row_phase < 0))
        own_phase[bare] = next_phase(rank[bare], ts[bare], rank[lead], ts[lead],
                                     row_phase[lead])
    phase = np.where(is_marker, row_phase, own_phase)
    if container.any():
        autograd = np.append(np.asarray(names.categories.str.contains("CompiledFunction"), bool),
                             False)[codes] & container
        late = graphs.after_backward(autograd, rank, step, row_phase, is_op & on_host, unmarked)
        graphs.settle(op, phase, row_phase, anc, is_op & on_host & ~container, late)
        op[has_anc] = op[anc[has_anc]]  # the backward twins settle gave outermost operators
        if own_comm.any():  # communication keeps its collective (all_reduce, …) as above
            op[in_comm] = comm_op
    phase[has_anc] = phase[anc[has_anc]]
    phase[in_comm] = _COMM_PHASE

    # Device events take the op of the host operator that launched them (via ``link``)
    # unless their own name maps, and its phase unless their row phase is intrinsic; one
    # with no launcher keeps its row's phase (an XLA kernel: its HLO op names its phase).
    link = df["link"].to_numpy(dtype=np.int64)
    intrinsic = np.isin(row_phase, _INTRINSIC_CODES)
    own = intrinsic | ((link < 0) & matched & (row_phase >= 0))
    phase[is_device_ev] = np.where(own[is_device_ev], row_phase[is_device_ev], _OTHER_PHASE)
    inherit = is_device_ev & (link >= 0)
    if inherit.any():
        host = np.flatnonzero(~is_device_ev & ~is_marker & (link >= 0))
        key_host = pd.Index(rank[host] * (1 << 40) + link[host])
        keep = ~key_host.duplicated(keep="first")
        key_host, src = key_host[keep], host[keep]
        pos = key_host.get_indexer(rank[inherit] * (1 << 40) + link[inherit])
        idx = np.flatnonzero(inherit)
        ok = pos >= 0
        # a comm kernel of no collective of its own (NCCL's SendRecv) takes its call's
        # (no host call with a link at all — an nsys export without its runtime table —
        # leaves every kernel with no launcher: ``ok`` is all False)
        launcher_op = op[src[np.maximum(pos, 0)]] if len(src) else np.full(len(idx), -1)
        unnamed = (row_op[idx] == _COMM_OP) & np.isin(launcher_op, _COMM_CODES)
        # a kernel row's op gives way to a mapped launcher's (opprof.taxonomy)
        yields = u_kernel[codes[idx]] & (launcher_op >= 0) & (launcher_op != _OTHER_OP)
        take_op = ok & (~matched[idx] | unnamed | yields)
        op[idx[take_op]] = op[src[pos[take_op]]]
        take_phase = ok & ~intrinsic[idx]
        phase[idx[take_phase]] = phase[src[pos[take_phase]]]
        if len(inferred):
            _launchers_of_copies(phase, anc, np.isin(rank, inferred), row_phase, is_device_ev,
                                 src[pos[ok]], idx[ok])
        del key_host, src, pos, idx, launcher_op
    counted |= is_device_ev
    op[(op == _FUSED) & (phase == _PHASE["backward"])] = _FUSED_BACKWARD
    # What the table is not made of, dropped before it is made: a report's memory peaks here.
    del codes, row_op, row_phase, row_kind, end, marker_phase, own_phase, lane, anc, matched

    # copy=False: the columns are fresh arrays, or the raw frame's (copy-on-write)
    out = pd.DataFrame({
        "rank": rank, "role": df["role"], "pid": df["pid"], "tid": df["tid"],
        "device": device, "ts": _own(ts), "dur": dur, "name": names,
        "kind": pd.Categorical.from_codes(kind, categories=KINDS),
        "op": pd.Categorical.from_codes(op, categories=CANONICAL_OPS),
        "phase": pd.Categorical.from_codes(phase, categories=PHASES),
        "step": step.astype(np.int32),
        "depth": np.minimum(depth, np.iinfo(np.int16).max), "counted": counted,
        "bytes": df["bytes"], "detail": df["detail"], "link": _own(link), **costs,
    }, copy=False)
    if container.any():
        out = pd.concat([out, graphs.own_time(out)], ignore_index=True)
    if len(spans):
        out = pd.concat([out, _span_events(spans, df, rank, on_host, bounds)],
                        ignore_index=True)
    if len(inferred):
        meta["inferred_phases"] = [int(r) for r in inferred]
    meta["step_bounds"] = bounds[["rank", "step", "start", "end"]].to_numpy().tolist()
    if not meta[drops.KEY]:
        del meta[drops.KEY]
    return Trace(conform(out), meta)


def _costs(df: pd.DataFrame, nesting: Nesting, is_op: np.ndarray, anc: np.ndarray,
           rank: np.ndarray, is_device: np.ndarray, dur: np.ndarray,
           backward: np.ndarray, comm: np.ndarray) -> dict:
    """The cost columns (opprof.flops.attribute) where the normalizer gave its events their own
    costs (raw columns ``flops``, ``model_flops``, ``mem_bytes``, ``precision``, ``cost_kind``);
    none otherwise (the table then reads them as unknown)."""
    if "cost_kind" not in df:
        return {}
    from opprof.flops.attribute import attribute
    from opprof.flops.families import PRECISIONS

    cols = attribute(df["flops"].to_numpy(np.float64), df["model_flops"].to_numpy(np.float64),
                     df["mem_bytes"].to_numpy(np.float64),
                     df["precision"].to_numpy(np.int8), df["cost_kind"].to_numpy(np.int8),
                     nesting, is_op, anc, rank, df["link"].to_numpy(np.int64), is_device, dur,
                     backward, comm)
    prec = cols.pop("precision").astype(np.int64)
    cols["precision"] = pd.Categorical.from_codes(prec, categories=list(PRECISIONS))
    return cols


def _calls_around_comm(nesting: Nesting, row_op: np.ndarray, row_phase: np.ndarray,
                       host_op: np.ndarray, matched: np.ndarray, container: np.ndarray,
                       names: pd.Categorical, codes: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``row_op`` and ``row_phase`` with every host operator that no mapping row names (not
    an ``aten::`` operator, not a compiled-graph container) and that encloses a communication
    operator and no computing one (copies and element-wise work aside) made an unnamed
    communication call (``comm``, phase comm)."""
    unnamed = host_op & ~matched & ~container
    if not unnamed.any():
        return row_op, row_phase
    aten = np.append(np.asarray(names.categories.astype(str).str.startswith("aten::"), bool),
                     False)[codes]
    unnamed &= ~aten
    comm = host_op & np.isin(row_op, _COMM_CODES)
    if not unnamed.any() or not comm.any():
        return row_op, row_phase
    _, anc = nesting.nest(unnamed)
    inner = (anc >= 0) & (anc != np.arange(len(anc)))
    around = np.unique(anc[comm & inner])
    # not one that computes (a module's ``forward`` range around a whole model): one that
    # encloses an operator other than copies, element-wise work and communication
    computes = host_op & matched & ~np.isin(row_op, _CALL_OPS) & (row_op >= 0) & inner
    around = np.setdiff1d(around, anc[computes])
    if not len(around):
        return row_op, row_phase
    row_op, row_phase = row_op.copy(), row_phase.copy()
    row_op[around], row_phase[around] = _COMM_OP, _COMM_PHASE
    return row_op, row_phase


def _own(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy of it when it is a read-only view of a frame (pandas' ``to_numpy``)."""
    return a if a.flags.writeable else a.copy()


def _launchers_of_copies(phase: np.ndarray, anc: np.ndarray, unmarked: np.ndarray,
                         row_phase: np.ndarray, is_device_ev: np.ndarray, launch: np.ndarray,
                         device: np.ndarray) -> None:
    """On ranks with inferred phases, a host operator with no phase of its own that launched
    a host-to-device copy (``aten::to(cuda)`` around ``cudaMemcpyAsync``) is h2d, with what
    it encloses, rather than the phase of the span it runs in (in place)."""
    copies = row_phase[device] == _PHASE["h2d"]
    launcher = anc[launch[copies]]
    launcher = launcher[launcher >= 0]
    launcher = np.unique(launcher[unmarked[launcher] & (row_phase[launcher] < 0)])
    if len(launcher):
        phase[np.isin(anc, launcher) & ~is_device_ev] = _PHASE["h2d"]


def _leads(rank: np.ndarray, ts: np.ndarray, step: np.ndarray,
           phase: np.ndarray) -> np.ndarray:
    """Which phased operators lead the way (give their phase to the time before them): all
    but the update operators that start before their step's first backward operator — the
    optimizer's work that needs no gradient (Keras computing its learning rate and momentum
    terms as the training function starts, torch's ``zero_grad``) runs early but is not
    where the step is heading."""
    bwd = phase == _PHASE["backward"]
    key = pd.Series(rank * (1 << 24) + step)
    first_bwd = pd.Series(ts[bwd]).groupby(key[bwd].to_numpy()).min()
    start = key.map(first_bwd).to_numpy(dtype=float)
    early = (phase == _PHASE["update"]) & (step >= 0) & ~np.isnan(start) & (ts < start)
    return ~early


def infer_phase_spans(rank: np.ndarray, ts: np.ndarray, end: np.ndarray,
                      leads: tuple[np.ndarray, np.ndarray, np.ndarray],
                      until: pd.Series, since: pd.Series | None = None) -> pd.DataFrame:
    """Phase spans of ranks without phase markers, from their phased operators.

    Per rank, a *gap* is an interval no phased operator covers (on any thread); it takes
    the phase of the first operator in ``leads`` (rank, start, phase) that starts at or
    after its end (the last one's, for the gap after the rank's last operator up to
    ``until[rank]``, its last step's end), and so is the head from ``since[rank]``, its first
    step's start (a step marker's), to its first operator: the first profiled step is on its
    way there as every later one is. Consecutive gaps of one phase make one span,
    from the first gap's start to the last one's end (the operators in between run in that
    phase, or win their instants by their own). The spans of a rank do not overlap.
    Returns rank, start, end, phase."""
    none = pd.DataFrame({"rank": [], "start": [], "end": [], "phase": []})
    if len(ts) == 0:
        return none
    order = np.lexsort((-end, ts, rank))
    r, s, e = rank[order], ts[order], end[order]
    reach = pd.Series(e).groupby(r, sort=False).cummax()
    last = reach.groupby(r, sort=False).max()
    reach = reach.groupby(r, sort=False).shift(1)
    first = reach.isna().to_numpy()
    reach = reach.fillna(0).to_numpy(np.int64)
    gap = ~first & (s > reach)
    tail = until.reindex(last.index).to_numpy(dtype=float)
    has_tail = ~np.isnan(tail) & (tail > last.to_numpy())
    head_rank = r[first]
    since = pd.Series(dtype=np.int64) if since is None else since
    head = since.reindex(head_rank, fill_value=0).to_numpy(np.int64)
    has_head = np.isin(head_rank, since.index) & (head < s[first])
    g_rank = np.r_[head_rank[has_head], r[gap], last.index.to_numpy(np.int64)[has_tail]]
    g_start = np.r_[head[has_head], reach[gap],
                    last.to_numpy(np.int64)[has_tail]]
    g_end = np.r_[s[first][has_head], s[gap], tail[has_tail].astype(np.int64)]
    if not len(g_rank):
        return none
    order = np.lexsort((g_start, g_rank))
    g_rank, g_start, g_end = g_rank[order], g_start[order], g_end[order]
    g_phase = next_phase(g_rank, g_end, *leads)
    run = np.cumsum(np.r_[True, (g_rank[1:] != g_rank[:-1]) | (g_phase[1:] != g_phase[:-1])])
    g = pd.DataFrame({"run": run, "rank": g_rank, "start": g_start, "end": g_end,
                      "phase": g_phase})
    return g.groupby("run", sort=True).agg(rank=("rank", "first"), start=("start", "min"),
                                          end=("end", "max"), phase=("phase", "first")
                                          ).reset_index(drop=True)


def next_phase(rank: np.ndarray, ts: np.ndarray, p_rank: np.ndarray, p_ts: np.ndarray,
               p_phase: np.ndarray) -> np.ndarray:
    """Per point (rank, ts): the phase (code) of the first phased operator of the rank that
    starts at or after it, else of the last one before it, else ``other``."""
    out = np.full(len(ts), _OTHER_PHASE, dtype=np.int64)
    if len(ts) == 0 or len(p_ts) == 0:
        return out
    t0 = min(ts.min(), p_ts.min())
    width = int(max(ts.max(), p_ts.max()) - t0) + 2
    key_p = p_rank.astype(np.int64) * width + (p_ts - t0)
    order = np.argsort(key_p, kind="stable")
    key_p, r_p, ph = key_p[order], p_rank[order], np.asarray(p_phase, dtype=np.int64)[order]
    pos = np.searchsorted(key_p, rank.astype(np.int64) * width + (ts - t0), side="left")
    nxt = np.minimum(pos, len(key_p) - 1)
    ok = (pos < len(key_p)) & (r_p[nxt] == rank)
    out[ok] = ph[nxt[ok]]
    prv = np.maximum(pos - 1, 0)
    back = ~ok & (pos > 0) & (r_p[prv] == rank)
    out[back] = ph[prv[back]]
    return out


def _span_events(spans: pd.DataFrame, df: pd.DataFrame, rank: np.ndarray, on_host: np.ndarray,
                 bounds: pd.DataFrame) -> pd.DataFrame:
    """The inferred phase spans as marker events on their rank's lane ``INFERRED_TID``."""
    r = spans["rank"].to_numpy(np.int64)
    host = pd.DataFrame({"rank": rank[on_host], "pid": df["pid"].to_numpy()[on_host],
                         "role": df["role"].astype(object).to_numpy()[on_host]})
    main = host.groupby("rank").agg(pid=("pid", lambda x: x.mode().iloc[0]),
                                    role=("role", "first"))
    start = spans["start"].to_numpy(np.int64)
    step = cover_label(r, start, bounds["rank"].to_numpy(), bounds["start"].to_numpy(),
                       bounds["end"].to_numpy(), bounds["step"].to_numpy(), default=-1)
    n = len(spans)
    return pd.DataFrame({
        "rank": r, "role": main["role"].reindex(r).to_numpy(),
        "pid": main["pid"].reindex(r).to_numpy(np.int64), "tid": np.full(n, INFERRED_TID),
        "device": "cpu", "ts": start, "dur": spans["end"].to_numpy(np.int64) - start,
        "name": INFERRED_PREFIX + _PHASE_NAMES[spans["phase"].to_numpy(np.int64)],
        "kind": "marker", "op": None, "phase": _PHASE_NAMES[spans["phase"].to_numpy(np.int64)],
        "step": step.astype(np.int32), "depth": np.zeros(n, np.int16),
        "counted": np.zeros(n, bool), "bytes": np.zeros(n, np.int64),
        "detail": "inferred from the operators' phases (no phase markers)",
        "link": np.full(n, -1, np.int64),
    })


def _resolve_phase(row_phase: np.ndarray, marker_phase: np.ndarray) -> np.ndarray:
    """Intrinsic row phase > marker phase > row phase > other (phase codes; -1 for none)."""
    intrinsic = np.isin(row_phase, _INTRINSIC_CODES)
    out = np.where(marker_phase >= 0, marker_phase, row_phase)
    out = np.where(intrinsic, row_phase, out)
    return np.where(out < 0, _OTHER_PHASE, out)


def usable(raw: pd.DataFrame, meta: dict, step_pattern: str = STEP_PATTERN) -> pd.DataFrame:
    """The raw events that can be placed on the timeline: a duration >= 0 and a start and
    end inside the trace's span (:func:`opprof.drops.timeline_problems`). The others are dropped and
    counted in ``meta`` (:mod:`opprof.drops`), a step marker among them as an unusable step
    marker; a trace with no usable event is one error line naming its file."""
    n = len(raw)
    if n == 0:
        return raw
    negative, outside = drops.timeline_problems(raw["ts"].to_numpy(dtype=np.int64),
                                                raw["dur"].to_numpy(dtype=np.int64))
    bad = negative | outside
    if not bad.any():
        return raw
    names = raw["name"].astype(object).to_numpy()
    marker = np.zeros(n, bool)
    sel = np.flatnonzero(bad)
    marker[sel] = pd.Series(names[sel], dtype=object).astype(str).str.fullmatch(
        step_pattern).to_numpy(bool)
    drops.note(meta, "step markers unusable (negative duration or time outside the "
               "trace)", int(marker.sum()))
    drops.skip(meta, negative & ~marker, "negative duration")
    drops.skip(meta, outside & ~marker, "time outside the trace's span")
    if bad.all():
        source = (meta.get("sources") or ["trace"])[0]
        raise OpprofError(f"no usable events ({drops.describe(meta[drops.KEY])})",
                          path=source, kind=ErrorKind.NO_EVENTS)
    return raw[~bad]


def cover_label(rank: np.ndarray, ts: np.ndarray, i_rank: np.ndarray, i_start: np.ndarray,
                i_end: np.ndarray, i_label: np.ndarray, default: str | int) -> np.ndarray:
    """For each point (rank, ts): the label of the latest-starting interval of the same rank
    that covers it, or ``default`` (:func:`opprof.intervals.label_points`)."""
    return label_points(rank, ts, i_rank, i_start, i_end, i_label, default)


def _step_bounds(rank, ts, end, names, codes, step_pattern, on_host, is_marker, op, counted,
                 is_forward, phased, closes_step):
    """Per rank: step intervals from step markers, else from the events the normalizer says
    close a step, else from optimizer steps (see :func:`optimizer_steps`), else the whole
    rank as step 0."""
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
        in_rest = np.isin(rank, rest)
        # The first step starts at the rank's first phased operator (what ran before it,
        # such as building the model under an early-started profiler, is no step), else at
        # its first event.
        first = pd.Series(ts[in_rest]).groupby(rank[in_rest]).min()
        lead = in_rest & phased
        first_op = pd.Series(ts[lead]).groupby(rank[lead]).min()
        first.loc[first_op.index] = first_op  # int64 kept (no NaN, no float)
        flagged = in_rest & closes_step
        host_op = in_rest & on_host & counted & ~np.isin(rank, np.unique(rank[flagged]))
        upd = host_op & (op == _UPDATE_OP)
        # A worker updated elsewhere (parameter server): its communication closes the step.
        comm = host_op & np.isin(op, _COMM_CODES) & ~np.isin(rank, np.unique(rank[upd]))
        closing = flagged | upd | comm
        if closing.any():
            u = optimizer_steps(rank, ts, end, closing, is_forward & in_rest, first,
                                alone=flagged)
            frames.append(u)
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


def optimizer_steps(rank: np.ndarray, ts: np.ndarray, end: np.ndarray, closing: np.ndarray,
                    forward: np.ndarray, first: pd.Series,
                    alone: np.ndarray | None = None) -> pd.DataFrame:
    """Steps of ranks without step markers: each group of ``closing`` events (weights
    updates) between two forward operators ends a step at its latest end (an ``alone``
    closing event is a group of its own); the next step starts there, the first at the
    rank's ``first`` instant. Returns rank, step, start, end."""
    alone = np.zeros(len(ts), bool) if alone is None else alone
    sel = closing | forward
    r, s, e, c, a = rank[sel], ts[sel], end[sel], closing[sel], alone[sel]
    order = np.lexsort((s, r))
    r, e, c, a = r[order], e[order], c[order], a[order]
    # a group: the closing operators after a forward operator (or the rank's start)
    group = np.cumsum(np.r_[True, r[1:] != r[:-1]] | ~c | a)
    g = pd.DataFrame({"rank": r[c], "group": group[c], "end": e[c]})
    steps = g.groupby(["rank", "group"], sort=True)["end"].max().reset_index()
    steps = steps.sort_values(["rank", "end"], kind="stable").reset_index(drop=True)
    sr, se = steps["rank"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    new_rank = np.r_[True, sr[1:] != sr[:-1]]
    # integers throughout: epoch nanoseconds do not survive a trip through float64
    start = np.r_[np.int64(0), se[:-1]]
    start[new_rank] = first.reindex(sr[new_rank]).to_numpy(np.int64)
    return pd.DataFrame({"rank": sr, "step": steps.groupby("rank").cumcount().to_numpy(),
                         "start": start, "end": se}).astype(np.int64)
