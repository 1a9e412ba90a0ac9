"""MXNet profiler chrome-trace JSON → the common events table; and MXNet's aggregate table.

What MXNet 1.x writes (``mx.profiler.set_config(profile_all=True)`` then ``dump()``):

* no ``X`` events: every duration is a begin/end pair, ``B``/``E`` for operators and
  ``event``s, ``b``/``e`` (with an ``id``) for Tasks and the C API, ``(``/``)`` for Frames.
  MXNet writes both halves when the duration ends, so pairs are matched in file order per
  (category, pid, tid, id, name) — vectorized, by numbering begins and ends per key;
* category ``operator``: engine operators (``Convolution``, ``_backward_Convolution``,
  ``KVStoreDistDefaultStoragePushPull``, ``sgd_mom_update`` …) as ``B``/``E`` pairs on the
  device's pid (``process_name`` ``cpu/0``, ``gpu/0`` …) and the engine thread's tid — and
  every one a second time as a ``b``/``e`` pair in the ``operator`` domain, up to a
  microsecond off; those copies are dropped;
* ``MXNET_C_API``: the Python front end's C API calls (host runtime time, not counted);
* ``Device Storage`` counters (``C``, ``Memory: cpu/0``: the storage allocator's bytes,
  recorded with ``profile_memory``, which ``profile_all`` includes) become the ``allocated``
  memory rows of the rank (:mod:`.memory`); C API counters (call counts) are not kept;
* any other category is a user domain: Tasks (cat = domain), Frames (``domain,frame``),
  Markers (``domain,instant_marker``, instants) and Events (``event``) → markers.

Timestamps are integer microseconds on the host's clock (all ranks on one host share it).
pid and tid are 64-bit hashes: a rank's pid becomes its OS process id when the recording's
metadata has it (``rank_pids``), else -1, and tid the thread's ordinal in the file. MXNet's
async engine operators (kvstore push/pull, ops ``push``/``pull``) run concurrently on one
thread: they go to a lane of their own (tid + 2**40), where each group of overlapping ones
nests inside one ``opprof.comm_window`` event that the normalizer adds (the only event
it adds), so that communication is counted once per instant — MXNet's aggregate sums
them, 62 concurrent ResNet-18 pushes making 62 times the wait. Other operators that
overlap without nesting get sub-lanes (tid + 65536·k); operators contained in another
nest under it, counted once.

Without opprof's step frames and phase tasks (a user's own ``mx.profiler`` dump), phases come
from the operators (``_backward_*`` backward, ``*_update`` update, kvstore comm, the rest of
an ``autograd.record`` forward by operator) and the batch copy into MXNet: a Gluon
``DataLoader`` batch reaches MXNet through ``nd.array`` (the ``MXNDArraySyncCopyFromCPU`` C
API call, with a ``WaitForVar`` engine operator) or, with worker processes, from shared memory
(``MXNDArrayCreateFromSharedMem``) — the loader's own Python work has no event — so those calls
are ``data_load``. Steps end when the optimizer has updated every weight: the per-weight
update operators run interleaved with the backward pass as gradients are ready, so a step
ends with the last of them before the next forward operator (``opprof.normalizers.events``); a
``dist_sync`` worker whose weights the servers update ends its step with its last kvstore
pull.

The collector's ``rankR_worker.meta`` beside a trace, when present, gives the run's model,
batch size, mode, the rank's process id and the bytes a PS worker moves per step (which the
comm windows then carry). Role and rank come from the file name:
``rankR_worker.json`` (worker R) and ``rankK_server.json`` (server K, what MXNet names a
server's trace), numbered after the workers; other names are workers numbered in order.
Servers have no steps of their own: their events are numbered with the step of the lowest
worker rank running at that instant.
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from operator import is_
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from opprof import drops
from opprof.errors import ErrorKind, OpprofError
from opprof.normalizers import chrome
from opprof.normalizers.events import INFERRED_PREFIX, cover_label, finish
from opprof.normalizers.memory_rows import add_memory, samples
from opprof.taxonomy import CANONICAL_OPS, COMM_OPS, mapping_table
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.meta import MetaMapping

NAME = "mxnet"
_BEGIN = {"B": "B", "b": "b", "(": "("}
_END = {"E": "B", "e": "b", ")": "("}  # end phase → the begin phase it closes
_INSTANT = {"n", "i", "I"}
_DROP_CATS = {"Device Storage"}
_MX_PROCESS = re.compile(r"(?:cpu|gpu|cpu pinned|cpu shared)/\d*|MXNET_C_API|Device Storage")
_KINETO_KEYS = ("schemaVersion", "distributedInfo", "deviceProperties", "baseTimeNanoseconds")
_FILE_ROLE = re.compile(r"rank(\d+)_(worker|server)")
_SUBLANE = 1 << 16
_ASYNC = 1 << 40
COMM_WINDOW = "opprof.comm_window"


def _is_comm(names: pd.Series) -> np.ndarray:
    """Which names the mapping table classifies as communication."""
    cls = mapping_table(NAME).classify(names.unique())
    return names.map(cls["op"]).isin(COMM_OPS).to_numpy()


def _field(obj: Any, key: str) -> Any:
    """A field of a decoded document or event, typed struct or plain dict alike."""
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def claims_json(doc: Any) -> bool:
    """An MXNet profiler dump: chrome-trace events with MXNet's process names or categories."""
    events = _field(doc, "traceEvents") if not isinstance(doc, list) else None
    if not isinstance(events, list):
        return False
    if isinstance(doc, dict):
        if any(k in doc for k in _KINETO_KEYS):
            return False
    elif any(_field(doc, k) is not None for k in _KINETO_KEYS):
        return False
    if events and isinstance(events[0], msgspec.Raw):  # a Kineto Document: its head, typed
        from opprof.normalizers import kineto

        events = kineto.typed_events(doc, 0, kineto.HEAD)
    for e in events[:2000]:
        if not isinstance(e, dict) and not hasattr(e, "ph"):
            continue
        ph, cat = _field(e, "ph"), _field(e, "cat")
        if ph == "M" and _field(e, "name") == "process_name":
            args = _field(e, "args")
            if _MX_PROCESS.fullmatch(str(_field(args, "name") or "")):
                return True
        elif cat in ("MXNET_C_API", "Device Storage") or (
                cat == "operator" and ph in ("B", "E")):
            return True
    return False


class Event(msgspec.Struct, gc=False):
    """One MXNet chrome-trace event, as far as opprof reads it (other fields are skipped)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    args: Any = None


class Document(msgspec.Struct, gc=False):
    """An MXNet profiler dump."""

    traceEvents: list[Event]
    #: bytes of the text that were not UTF-8 (set after decoding, chrome.Repaired)
    invalid_utf8: int = msgspec.field(default=0, name="\u00a7opprof invalid utf-8\u00a7")


_DECODER = msgspec.json.Decoder(Document)


def decode(data: bytes | bytearray, path: Path) -> Document:
    """Decode an MXNet dump for :func:`from_docs` (typed: unread fields are skipped)."""
    doc = chrome.decode(data, path, _DECODER, "MXNet profiler dump")
    doc.invalid_utf8 = getattr(data, "invalid_utf8", 0)
    return doc


def _events_frame(doc: Document | dict) -> pd.DataFrame:
    """The events' fields as columns (ph, cat, name, ts, dur, args, pid, tid, id); a plain
    dict document (``json.load``) is read too."""
    cols = ("ph", "cat", "name", "ts", "dur", "args")
    if isinstance(doc, dict):
        events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
        ev = pd.DataFrame.from_records(events, columns=list(cols))
        ids = [[e.get(k) for e in events] for k in ("pid", "tid", "id")]
    else:
        values = chrome.columns(doc.traceEvents, (*cols, "pid", "tid", "id"))
        ev = pd.DataFrame({c: chrome._as_objects(v) for c, v in zip(cols, values,
                                                                     strict=False)})
        ids = values[len(cols):]
    ev["pid"], ev["tid"], ev["id"] = (_u64(v) for v in ids)
    # a process or thread id that is missing or no integer (MXNet writes both on every
    # event): such an event cannot be placed on its thread
    ev["bad_id"] = _not_integer(ids[0]) | _not_integer(ids[1])
    return ev


def _not_integer(values: list) -> np.ndarray:
    """Which values are not JSON integers (missing, text, fractions, booleans)."""
    return ~np.fromiter(map(is_, map(type, values), repeat(int)), bool, len(values))


def from_docs(docs: list[tuple[Path, Document]], meta: MetaMapping) -> Trace:
    """Normalize MXNet dumps (one per worker, and per server of a PS job) into one Trace."""
    roles = _roles([p for p, _ in docs])
    meta = {**_sidecar_meta([p for p, _ in docs], roles), **meta}
    pids = {int(k): int(v) for k, v in (meta.get("rank_pids") or {}).items()}
    frames, memory = [], []
    warnings: dict = {}
    for (path, doc), (rank, role) in zip(docs, roles, strict=True):
        drops.note(warnings, "bytes of JSON text not UTF-8 (the fields holding them unread)",
                   getattr(doc, "invalid_utf8", 0))
        raw, mem = _raw_events(doc, rank, role, path, pids.get(rank, -1), warnings)
        frames.append(raw)
        memory.append(mem)
    raw = pd.concat(frames, ignore_index=True)
    workers = sorted(r for r, role in roles if role == "worker")
    servers = sorted(r for r, role in roles if role == "server")
    info: dict[str, Any] = {
        "source_formats": [NAME],
        "sources": [str(p) for p, _ in docs],
        "framework": "mxnet",
        "workers": len(workers),
        "servers": len(servers),
        "device": "cuda" if raw["device"].astype(str).str.startswith("cuda").any() else "cpu",
        "roles": {str(r): role for r, role in roles},
        "clock_offsets_ns": {str(r): 0 for r, _ in roles},
    }
    info.update(meta)
    if warnings:
        info[drops.KEY] = drops.merged([info.get(drops.KEY), warnings[drops.KEY]])
    trace = _gradients_made_of_forward_ops(finish(raw, mapping_table(NAME), info))
    trace = _server_steps(trace, set(workers))
    trace = _window_bytes(trace, info.get("comm_bytes_per_step") or {})
    return add_memory(trace, pd.concat(memory, ignore_index=True))


#: Each canonical op's backward twin (``attention`` → ``attention_backward``), where it has one.
_TWIN = {o: f"{o}_backward" for o in CANONICAL_OPS if f"{o}_backward" in CANONICAL_OPS}


def _gradients_made_of_forward_ops(trace: Trace) -> Trace:
    """MXNet builds some gradients from forward operators (``batch_dot``'s is two
    ``batch_dot``s, ``transpose``'s a ``transpose``): on a worker those are their op's backward
    twin (``attention_backward``), as every ``_backward_*`` operator is, so that a diff with
    torch or TF compares backward with backward. With phase markers, the operators in the
    backward phase; without (a user's own job: their row says forward), the ones that run
    after both a step's first ``_backward_*`` operator and its loss (the forward pass is over
    then; the engine may run a gradient that needs only a shape before the loss) and before its
    last ``_backward_*`` operator, with the inferred forward spans there (the gaps before
    them)."""
    ev = trace.events
    op = ev["op"].astype(object)
    twin = op.map(_TWIN)
    worker = (ev["role"] == "worker") & (ev["step"] >= 0)
    backward = (ev["phase"] == "backward").to_numpy()
    inferred = ev["rank"].isin(trace.meta.get("inferred_phases", [])).to_numpy()
    change = (worker & twin.notna()).to_numpy() & backward
    spans = np.zeros(len(ev), bool)
    if inferred.any():
        own = worker.to_numpy() & inferred & ev["counted"].to_numpy() & backward & \
            ev["name"].astype(str).str.startswith("_backward_").to_numpy()
        key = ev["rank"].to_numpy(np.int64) * (1 << 24) + ev["step"].to_numpy(np.int64)
        start, end = ev["ts"].to_numpy(np.int64), (ev["ts"] + ev["dur"]).to_numpy(np.int64)
        first = pd.Series(start[own]).groupby(key[own]).min()
        last = pd.Series(end[own]).groupby(key[own]).max()
        # the window opens after the first gradient and the loss: the engine runs a gradient
        # as soon as its inputs are ready (a mean's needs only a shape), maybe before the loss
        loss = worker.to_numpy() & inferred & (ev["op"] == "loss").to_numpy()
        loss_end = pd.Series(end[loss]).groupby(key[loss]).max()
        lo = np.fmax(pd.Series(key).map(first).to_numpy(dtype=float),
                     pd.Series(key).map(loss_end).to_numpy(dtype=float))
        hi = pd.Series(key).map(last).to_numpy(dtype=float)
        inside = inferred & (start >= lo) & (end <= hi)  # NaN (no backward) compares False
        forward = (ev["phase"] == "forward").to_numpy()
        change |= inside & forward & worker.to_numpy() & twin.notna().to_numpy() & \
            (ev["kind"] == "cpu_op").to_numpy()
        spans = inside & forward & (ev["name"] == INFERRED_PREFIX + "forward").to_numpy()
    if not (change.any() or spans.any()):
        return trace
    ev = ev.copy()
    ev.loc[change, "op"] = twin[change].to_numpy()
    ev.loc[change | spans, "phase"] = "backward"
    if spans.any():
        name = INFERRED_PREFIX + "backward"
        if isinstance(ev["name"].dtype, pd.CategoricalDtype) and \
                name not in ev["name"].cat.categories:
            ev["name"] = ev["name"].cat.add_categories([name])
        ev.loc[spans, "name"] = name
    return Trace(ev, trace.meta)


def _window_bytes(trace: Trace, per_step: dict[str, int]) -> Trace:
    """Give each worker's comm windows their payload: a PS worker pushes every gradient and
    pulls every weight once a step (``comm_bytes_per_step``, from the collector), shared over
    that step's windows by how many kvstore operators each holds (exact for the usual one
    window per step). MXNet's trace itself does not say which array an operator moved."""
    ev = trace.events
    win = (ev["name"] == COMM_WINDOW) & (ev["role"] == "worker") & (ev["step"] >= 0)
    if not per_step or not win.any():
        return trace
    w = ev.loc[win, ["rank", "step"]].copy()
    w["n"] = ev.loc[win, "detail"].str.split().str[0].astype(np.int64)
    share = w["n"] / w.groupby(["rank", "step"])["n"].transform("sum")
    total = w["rank"].astype(str).map({str(k): v for k, v in per_step.items()})
    ev = ev.copy()
    ev.loc[win, "bytes"] = np.rint(share * total.fillna(0)).astype(np.int64).to_numpy()
    return Trace(ev, trace.meta)


_SIDECAR_KEYS = ("framework_version", "model", "dataset", "batch_size", "mode",
                 "profiled_steps", "params", "param_bytes", "threads")


def _sidecar_meta(paths: list[Path], roles: list[tuple[int, str]]) -> dict[str, Any]:
    """What the collector's ``rankR_worker.meta`` files beside the traces say about the run
    (model, batch size, mode, each rank's process id), for folders imported after the fact."""
    out: dict[str, Any] = {}
    pids, comm = {}, {}
    for path, (rank, role) in zip(paths, roles, strict=True):
        side = path.with_name(path.name.split(".json")[0] + ".meta")
        if role != "worker" or not side.is_file():
            continue
        try:
            facts = json.loads(side.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(facts, dict):
            for k in _SIDECAR_KEYS:
                out.setdefault(k, facts.get(k))
            if "pid" in facts:
                pids[str(rank)] = facts["pid"]
            if facts.get("kvstore") and "param_bytes" in facts:
                comm[str(rank)] = 2 * int(facts["param_bytes"])
    if pids:
        out["rank_pids"] = pids
    if comm:
        out["comm_bytes_per_step"] = comm
    return {k: v for k, v in out.items() if v is not None}


def _roles(paths: list[Path]) -> list[tuple[int, str]]:
    """(rank, role) per file: workers keep the rank in their name, servers follow them."""
    named = [_FILE_ROLE.search(p.name) for p in paths]
    taken: set[int] = set()
    out: list[tuple[int, str] | None] = [None] * len(paths)
    for i, m in enumerate(named):
        if m and m.group(2) == "worker" and int(m.group(1)) not in taken:
            out[i] = (int(m.group(1)), "worker")
            taken.add(int(m.group(1)))
    for i, m in enumerate(named):
        if out[i] is None and not (m and m.group(2) == "server"):
            rank = next(r for r in range(len(paths) + len(taken) + 1) if r not in taken)
            out[i] = (rank, "worker")
            taken.add(rank)
    base = max(taken) + 1 if taken else 0
    servers = sorted((int(m.group(1)), i) for i, m in enumerate(named)
                     if out[i] is None and m)
    for n, (_, i) in enumerate(servers):
        out[i] = (base + n, "server")
    return [r for r in out if r is not None]


def _u64(values: list) -> np.ndarray:
    """A 64-bit id field (pid, tid, id: MXNet writes unsigned hashes) exactly, as int64."""
    try:
        vals = np.fromiter((v or 0 for v in values), dtype=np.uint64, count=len(values))
    except (OverflowError, TypeError, ValueError):
        vals = pd.to_numeric(pd.Series(values, dtype=object),
                             errors="coerce").fillna(0).astype(np.int64).to_numpy()
        return vals
    return vals.view(np.int64)


#: The storage allocator's counters (``profile_memory``): ``Memory: cpu/0``, ``Memory: gpu/1``.
_STORAGE = re.compile(r"Memory: (cpu|gpu)/(\d+)")


def _storage_samples(ev: pd.DataFrame, ph: pd.Series, rank: int, role: str,
                     os_pid: int) -> pd.DataFrame:
    """The ``Device Storage`` counters as ``allocated`` samples (``cpu`` for ``cpu/0``,
    ``cpu:N`` for other CPU contexts, ``cuda:N`` for ``gpu/N``). MXNet's storage profiler
    counts only what is allocated and freed while it runs, in an unsigned counter: a value
    past 2**62 (the counter wrapped below zero when an array allocated before profiling was
    freed) is left out."""
    sel = (ph == "C").to_numpy() & (ev["cat"].astype(object) == "Device Storage").to_numpy()
    c = ev[sel]
    if c.empty:
        return samples(rank, role, os_pid, "cpu", np.zeros(0, np.int64), "allocated",
                       np.zeros(0, np.int64), NAME)
    name = c["name"].astype(object).fillna("").astype(str)
    m = name.str.fullmatch(_STORAGE.pattern)
    parts = name.str.extract(_STORAGE.pattern)
    value = pd.to_numeric(pd.Series([a.get(n) if isinstance(a, dict) else None
                                     for a, n in zip(c["args"], name, strict=True)],
                                    dtype=object), errors="coerce").to_numpy(np.float64)
    ts = pd.to_numeric(c["ts"], errors="coerce").to_numpy(np.float64)
    ok = m.to_numpy() & ~np.isnan(value) & ~np.isnan(ts) & (value >= 0) & (value < 2.0**62)
    kind, num = parts[0].to_numpy(object)[ok], parts[1].to_numpy(object)[ok]
    device = np.where(kind == "gpu", "cuda:" + num.astype(str).astype(object),
                      np.where(num == "0", "cpu", "cpu:" + num.astype(str).astype(object)))
    return samples(rank, role, os_pid, device, _us_to_ns(ts[ok]), "allocated",
                   value[ok].astype(np.int64), NAME)


def _raw_events(doc: Document | dict, rank: int, role: str, path: Path, os_pid: int,
                warnings: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the raw events of one dump, its storage counters as memory samples); the events
    that cannot be used are dropped and counted in ``warnings`` (:mod:`opprof.drops`)."""
    ev = _events_frame(doc)
    ph = ev["ph"].astype(object).fillna("").astype(str)
    # an event with no phase type (``ph``) is no event of any kind: counted, not read
    drops.note(warnings, "events skipped: phase type (ph) missing", int((ph == "").sum()))
    memory = _storage_samples(ev, ph, rank, role, os_pid)
    meta = ev[(ph == "M") & (ev["name"] == "process_name")]
    proc = dict(zip(meta["pid"], meta["args"].map(lambda a: (a or {}).get("name", "")),
                    strict=True))
    cat = ev["cat"].astype(object).fillna("").astype(str)
    keep = (ph.isin([*_BEGIN, *_END, *_INSTANT, "X"]) & ~cat.isin(_DROP_CATS)).to_numpy()
    ev, ph, cat = ev[keep].reset_index(drop=True), ph[keep].to_numpy(), cat[keep].to_numpy()
    us = pd.to_numeric(ev["ts"], errors="coerce").to_numpy(np.float64)
    with np.errstate(invalid="ignore"):
        bad_ts = ~(np.abs(us) < 2**62 / 1000)  # NaN (missing, text) and infinities too
        negative = ~bad_ts & (us < 0)  # microseconds since the epoch: never negative
    usable = drops.skip(warnings, bad_ts, "timestamp missing, not a number or out of range")
    usable &= drops.skip(warnings, negative, "negative timestamp")
    name = ev["name"].to_numpy(object)
    no_name = usable & (~np.fromiter(map(is_, map(type, name), repeat(str)), bool, len(name))
                        | (name == ""))  # missing (None, NaN), a number, a list
    usable &= drops.skip(warnings, no_name, "name missing or not text")
    usable &= drops.skip(warnings, usable & (cat == ""), "category (cat) missing")
    usable &= drops.skip(warnings, usable & ev["bad_id"].to_numpy(bool),
                         "process or thread id missing or not an integer")
    if len(us) and not usable.any():
        raise OpprofError("MXNet trace with no usable events "
                          f"({drops.describe(warnings.get(drops.KEY))})",
                          path=path, kind=ErrorKind.NO_EVENTS)
    # unusable begin/end events stay until paired, so that their partners are left out too
    # (and no later pair is shifted): see _pair
    ev["ts"] = _us_to_ns(np.where(usable, us, 0))
    ev["bad"] = ~usable
    ev["name"] = ev["name"].astype(object).fillna("").astype(str)
    ev["cat"] = cat

    spans = _pair(ev, ph, warnings)
    if spans.empty:
        dropped = warnings.get(drops.KEY)
        raise OpprofError(f"{path}: MXNet trace with no complete events"
                          + (f" ({drops.describe(dropped)})" if dropped else ""))
    spans = _drop_domain_copies(spans)
    kind = np.select([spans["cat"] == "operator", spans["cat"] == "MXNET_C_API"],
                     ["cpu_op", "runtime"], "marker")
    pname = spans["pid"].map(proc).fillna("").astype(str)
    gpu = pname.str.extract(r"^gpu/(\d+)$")[0]
    device = np.where(gpu.notna() & (spans["cat"] == "operator"), "cuda:" + gpu.fillna(""),
                      "cpu")
    tid = pd.factorize(spans["tid"])[0].astype(np.int64)
    # Operators of one engine thread nest; async ones (kvstore push/pull: comm ops) run
    # concurrently on it: they go to a lane of their own, inside comm windows.
    comm = (kind == "cpu_op") & _is_comm(spans["name"])
    sync = (kind == "cpu_op") & ~comm
    start, stop = spans["ts"].to_numpy(np.int64), (spans["ts"] + spans["dur"]).to_numpy(np.int64)
    tid[sync] += _SUBLANE * _sublanes(tid[sync], start[sync], stop[sync])
    tid[comm] += _ASYNC
    args = spans["args"]
    has_args = args.map(lambda a: isinstance(a, dict) and bool(a)) if len(args) else args
    detail = pd.Series(None, index=spans.index, dtype=object)
    if has_args.any():
        detail[has_args] = args[has_args].map(_detail)
    raw = pd.DataFrame({
        "rank": rank, "role": role, "pid": os_pid, "tid": tid, "device": device,
        "ts": start, "dur": spans["dur"].to_numpy(np.int64),
        "name": spans["name"].to_numpy(object), "kind": kind, "bytes": np.int64(0),
        "detail": detail.to_numpy(object), "link": np.int64(-1),
    })
    raw = raw.assign(**_costs(path, raw["name"]))
    out = pd.concat([raw, _comm_windows(raw[comm])], ignore_index=True)
    out["cost_kind"] = out["cost_kind"].fillna(0).astype(np.int8)
    out["precision"] = out["precision"].fillna(-1).astype(np.int8)
    return out, memory


def _costs(path: Path, names: pd.Series) -> dict[str, np.ndarray]:
    """Each operator event's own cost (the raw cost columns, opprof.flops.attribute): the mean
    over the graph's nodes of its operator, from the shapes opprof's MXNet adapter writes
    beside the dump (:mod:`opprof.flops.mxnet`); unknown without them."""
    from opprof.flops.mxnet import costs, read_nodes

    got = costs(names.astype(str).tolist(), read_nodes(path))
    return {"flops": np.asarray(got["flops"], np.float64),
            "model_flops": np.asarray(got["model_flops"], np.float64),
            "mem_bytes": np.asarray(got["mem_bytes"], np.float64),
            "precision": np.asarray(got["precision"], np.int8),
            "cost_kind": np.asarray(got["cost_kind"], np.int8)}


def _comm_windows(comm: pd.DataFrame) -> pd.DataFrame:
    """One ``opprof.comm_window`` event per group of overlapping communication operators of a
    lane, from the first one's start to the last one's end. The operators nest inside it, so
    communication is counted once per instant (a step's 62 concurrent pushes of ResNet-18
    weigh what the step waited for them, not 62 times that) while every native event stays."""
    if comm.empty:
        return comm.iloc[0:0]
    c = comm.sort_values(["tid", "ts"], kind="stable")
    end = c["ts"] + c["dur"]
    prev = end.groupby(c["tid"]).cummax().groupby(c["tid"]).shift(1)
    window = (prev.isna() | (c["ts"] >= prev)).cumsum()
    w = c.assign(end=end).groupby(window.to_numpy(), sort=False).agg(
        rank=("rank", "first"), role=("role", "first"), pid=("pid", "first"),
        tid=("tid", "first"), device=("device", "first"), ts=("ts", "min"),
        end=("end", "max"), n=("ts", "size"))
    return pd.DataFrame({
        "rank": w["rank"], "role": w["role"], "pid": w["pid"], "tid": w["tid"],
        "device": w["device"], "ts": w["ts"], "dur": w["end"] - w["ts"], "name": COMM_WINDOW,
        "kind": "comm", "bytes": np.int64(0),
        "detail": w["n"].astype(str) + " overlapping kvstore operators",
        "link": np.int64(-1)}).reset_index(drop=True)


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds since the epoch (float64, exact below 2**53) → int64 nanoseconds, without
    the rounding that multiplying by 1000 in float64 would bring."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _pair(ev: pd.DataFrame, ph: np.ndarray, warnings: dict) -> pd.DataFrame:
    """Begin/end pairs → spans (ts, dur); complete and instant events pass through. A pair
    that ends before it begins, and a complete event whose duration is not a number >= 0,
    are dropped and counted in ``warnings``."""
    begin = np.isin(ph, list(_BEGIN))
    end = np.isin(ph, list(_END))
    opener = pd.Series(ph).map({**_BEGIN, **_END}).fillna("").to_numpy()
    key = pd.DataFrame({"o": opener, "c": ev["cat"], "p": ev["pid"], "t": ev["tid"],
                        "i": np.where(opener == "b", ev["id"], 0), "n": ev["name"]})
    gid = key.groupby(list(key.columns), sort=False).ngroup().to_numpy()
    cols = ["cat", "name", "pid", "tid", "ts", "args"]
    b = ev.loc[begin, cols + ["bad"]].assign(g=gid[begin], o=opener[begin])
    e = ev.loc[end, ["ts", "args", "bad"]].assign(g=gid[end])
    b["nth"] = b.groupby("g").cumcount()
    e["nth"] = e.groupby("g").cumcount()
    pairs = b.merge(e, on=["g", "nth"], suffixes=("", "_end"))
    one_bad = (pairs["bad"] ^ pairs["bad_end"]).to_numpy()
    if (pairs["bad"] | pairs["bad_end"]).any():
        drops.note(warnings, "events skipped: the partner of an unusable begin or end",
                   int(one_bad.sum()))
        pairs = pairs[~(pairs["bad"] | pairs["bad_end"]).to_numpy()]
    pairs["dur"] = pairs["ts_end"] - pairs["ts"]
    backwards = (pairs["dur"] < 0).to_numpy()
    if backwards.any():
        pairs = pairs[drops.skip(warnings, backwards, "end before begin")]
    pairs["args"] = pairs["args"].where(pairs["args"].notna(), pairs["args_end"])
    pairs["async"] = pairs["o"] == "b"
    single = ~begin & ~end & ~ev["bad"].to_numpy(bool)
    x = ev.loc[single, cols + ["dur"]].copy()
    dur = pd.to_numeric(x["dur"], errors="coerce").to_numpy(np.float64)
    instant = ~np.isin(ph[single], ["X"])  # instants have no duration
    dur = np.where(instant & np.isnan(dur), 0, dur)
    with np.errstate(invalid="ignore"):
        bad = ~((dur >= 0) & (dur < 2**62 / 1000))
    if bad.any():
        x, dur = x[drops.skip(warnings, bad, "duration missing, negative or not a number")], \
            dur[~bad]
    x["dur"] = _us_to_ns(dur)
    x["async"] = False
    return pd.concat([pairs[cols + ["dur", "async"]], x], ignore_index=True)


def _drop_domain_copies(spans: pd.DataFrame) -> pd.DataFrame:
    """Drop the ``operator``-domain b/e copies: MXNet writes every operator both as a B/E pair
    and as a b/e copy that may start or end a microsecond off, so where an operator name has
    B/E pairs on a thread its b/e spans there are the copies."""
    op = (spans["cat"] == "operator").to_numpy()
    is_async = spans["async"].to_numpy(bool)
    key = ["name", "tid"]
    have = pd.MultiIndex.from_frame(spans.loc[op & ~is_async, key])
    copies = np.flatnonzero(op & is_async)
    dup = np.zeros(len(spans), bool)
    dup[copies] = pd.MultiIndex.from_frame(spans.iloc[copies][key]).isin(have)
    return spans[~dup].reset_index(drop=True)


def _sublanes(lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per operator, a sub-lane such that operators of one lane nest properly: one that starts
    inside an earlier one and ends after it goes to the next sub-lane of its overlapping
    group; one contained in an earlier one (a DeleteVariable freed inside a FullyConnected)
    stays with it, to be nested and counted once."""
    n = len(ts)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((-end, ts, lane))
    ln, s, e = lane[order], ts[order], end[order]
    prev_max = pd.Series(e).groupby(ln, sort=False).cummax().groupby(ln, sort=False).shift(1)
    first = prev_max.isna().to_numpy()
    prev = prev_max.fillna(0).to_numpy(np.int64)
    contained = ~first & (e <= prev) & (s < prev)
    own = ~contained
    group = np.cumsum((first | (s >= prev)) & own)
    sub = np.zeros(n, np.int64)
    sub[own] = pd.Series(group[own]).groupby(group[own]).cumcount().to_numpy()
    if contained.any():
        # the container is the latest earlier operator that set a new latest end on the lane
        setter = pd.Series(np.where(own, np.arange(n), np.nan)).groupby(ln, sort=False).ffill()
        sub[contained] = sub[setter.to_numpy()[contained].astype(np.int64)]
    out = np.empty(n, np.int64)
    out[order] = sub
    return out


def _detail(args: dict) -> str:
    """An operator's arguments as native detail (``act_type`` alone when that is all)."""
    if set(args) == {"act_type"}:
        return str(args["act_type"])
    return json.dumps(args, sort_keys=True, default=str)


def _server_steps(trace: Trace, workers: set[int]) -> Trace:
    """Give server events the step of the lowest worker rank; keep only worker step bounds."""
    ev = trace.events
    bounds = trace.step_bounds()
    on_server = (~ev["rank"].isin(workers)).to_numpy()
    if not on_server.any() or not workers:
        return trace
    worker_bounds = bounds[bounds["rank"].isin(workers)]
    ref = worker_bounds[worker_bounds["rank"] == min(workers)]
    ts = ev["ts"].to_numpy(np.int64)[on_server]
    step = cover_label(np.zeros(len(ts), np.int64), ts, np.zeros(len(ref), np.int64),
                        ref["start"].to_numpy(np.int64), ref["end"].to_numpy(np.int64),
                        ref["step"].to_numpy(np.int64), default=-1)
    ev = ev.copy()
    ev.loc[on_server, "step"] = step.astype(np.int32)
    meta = dict(trace.meta)
    meta["step_bounds"] = worker_bounds[["rank", "step", "start", "end"]].to_numpy().tolist()
    return Trace(ev, meta)


def parse_aggregate(text: str) -> pd.DataFrame:
    """MXNet's aggregate table (``mx.profiler.dumps()``, table format) as a frame: section
    (``operator``, ``MXNET_C_API``, a domain …), name, count, total_ns, min_ns, max_ns,
    avg_ns. Sections without times (``Device Storage``, in kB) are left out."""
    rows = []
    section, timed = "", False
    lines = text.splitlines()
    row = re.compile(r"^(?P<name>.*\S)\s+(?P<count>\d+)\s+(?P<total>-?[\d.]+)\s+"
                     r"(?P<min>-?[\d.]+)\s+(?P<max>-?[\d.]+)\s+(?P<avg>-?[\d.]+)\s*$")
    for i, line in enumerate(lines):
        if line.startswith("====") and i > 0:
            section, timed = lines[i - 1].strip(), False
            continue
        if line.startswith("Name") and "Total Count" in line:
            timed = "Time (ms)" in line
            continue
        if not section or not timed or line.startswith("----") or not line.strip():
            continue
        m = row.match(line)
        if m:
            rows.append((section, m["name"], int(m["count"]),
                         *(float(m[k]) * 1e6 for k in ("total", "min", "max", "avg"))))
    return pd.DataFrame(rows, columns=["section", "name", "count", "total_ns", "min_ns",
                                       "max_ns", "avg_ns"])
