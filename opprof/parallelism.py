"""Recognize how a torch job is parallelized from its trace: the dimension (``dp``, ``fsdp``,
``pp``, ``tp``, ``cp``, ``ep``) of every collective, the process groups of each dimension, and
the job's layout — ``meta.mode`` (``tp``, ``pp``, ``fsdp+tp`` …) and ``meta.parallelism``.

The evidence, per collective (first that applies):

1. its process group's description where the trace has one (an NCCL trace's
   ``record_param_comms``: ``desc=mesh_tp``; ``init_device_mesh`` names each dimension's
   groups ``mesh_<name>``): the name read by :data:`MESH_NAMES`;
2. the range it is issued in: FSDP's own ranges (``FSDP::pre_forward`` …) → ``fsdp``, but an
   all-reduce there → ``dp`` (HSDP's gradients averaged over the replicas; FSDP1's
   ``NO_SHARD``); DTensor's
   redistributions (``Redistribute``, its backward, the ``PythonSubclass`` dispatch of an
   operator on a DTensor) → ``tp``;
3. its collective: ``all_to_all`` → ``ep`` (a mixture of experts exchanging tokens), ``send`` /
   ``recv`` → ``pp`` (activations and gradients between pipeline stages);
4. a functional collective (``_c10d_functional::all_reduce``, ``wait_tensor``: hand-written
   tensor parallelism) → ``tp``; an all-reduce, all-gather or reduce-scatter issued in the
   forward pass on a rank that runs no DistributedDataParallel forward → ``tp`` (where the
   model runs inside DDP's forward, one outside it is the loop's bookkeeping — the Hugging
   Face ``Trainer``'s token count gathered, a loss averaged for the log — and one inside it
   DDP's or SyncBatchNorm's; one of a single element — a mixture of experts' capacity agreed
   with ``op=MAX``, a count, a norm — is bookkeeping too: tensor parallelism exchanges
   activations); the same collectives issued in the backward of an autograd
   Function written in Python (Megatron-style hand-written tensor parallelism: the
   all-reduce of ``CopyToTensorParallelRegion``'s gradient; not torch.compile's
   ``CompiledFunctionBackward``, where DDP's hooks fire), on such a rank → ``tp``;
5. everything else (DDP's bucketed all-reduce, a loss averaged for logging) → ``dp``.

A functional collective's wait (``_c10d_functional::wait_tensor``, run when an operator first
reads the ``AsyncCollectiveTensor``) takes the dimension of the latest functional collective
issued before it on its thread: the wait of a funcol all-to-all (TorchTitan's MoE dispatch) is
``ep``, not tensor parallel for being functional or for running inside that tensor subclass's
dispatch (``PythonSubclass``, which rule 2 reads as DTensor's).

gloo runs collectives on threads of its own (a span ``gloo:all_reduce`` per execution, on a
thread that serves one process group): the spans of one collective on such a thread take the
dimension most of their calls have — per span, the latest call of a compatible collective
issued before it started.

Groups: every rank's ``distributedInfo.pg_config`` lists the process groups it belongs to
(name, description, ranks). A dimension takes the group its collectives name (an NCCL trace's
``pg=``), else the group whose description names it (a mesh's ``mesh_tp``, Megatron-LM's
``TENSOR_MODEL_PARALLEL_GROUP``); else the one group left that no dimension took (not the
default group); several dimensions left with as many unnamed groups (``dist.new_group`` by
hand, as on gloo, whose trace names no group) take them in the order the groups were made
(their names count up), by the lowest thread of each dimension's gloo spans (each group starts
its threads when it is made) — with one dimension more than groups, the default group first;
else the default group. (A dimension on the default group beside an unused group of the rank's
is given that group: the trace shows no thread of a group that ran nothing.) Its degree is
that group's size; its groups the rank lists of that group on every rank.

The layout: the dimensions whose collectives run in the steps over more than one rank, in
the order :data:`DIMS`, joined by ``+`` (``fsdp+tp``, ``dp+pp``) — but not a data-parallel
dimension whose every collective is of one element (bookkeeping, rule 4: an expert-parallel
job that agrees its capacity is ``ep``, not ``dp+ep``). A job whose only dimension is data
parallel keeps the mode it was recorded or recognized with (``allreduce``, ``fsdp``, ``zero``).

Vectorized over events; the regular expressions run once per distinct name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.filters import on_host
from opprof.intervals import Nesting, label_points, lane_ids
from opprof.kinds import BACKEND_SPAN, Mode
from opprof.sharding import FSDP_NAME
from opprof.taxonomy import COMM_OPS, mapping_table

if TYPE_CHECKING:
    from opprof.arrays import Array

#: The dimensions, in the order a layout names them.
DIMS = ("dp", "fsdp", "pp", "tp", "cp", "ep")
#: The data-parallel dimensions (a group described as data parallel serves either).
DATA_DIMS = ("dp", "fsdp")
#: A mesh dimension's (or a process group description's) name → the dimension it is.
#: Matched against the name with ``mesh_`` (``init_device_mesh``'s prefix) removed, whole,
#: case-insensitive; first row wins.
#: Megatron-LM's ``group_desc`` (``TENSOR_MODEL_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP_GLOO``,
#: ``EXPERT_DATA_PARALLEL_GROUP``) are read with ``_group``, ``_gloo`` and ``_with_cp`` removed;
#: its groups of two dimensions (``TENSOR_AND_DATA_PARALLEL_GROUP``) name none.
MESH_NAMES: tuple[tuple[str, str], ...] = (
    (r"(?:dp_)?shard(?:_cp)?|fsdp|hsdp_shard|zero\d?", "fsdp"),
    (r"dp|ddp|data(?:_parallel)?|dp_replicate|replicate|hsdp_replicate|batch"
     r"|expert_data_parallel|(?:intra|inter)_partial_data_parallel", "dp"),
    (r"tp|tensor(?:_model)?(?:_parallel)?|model(?:_parallel)?|mp|sp|sequence(?:_parallel)?"
     r"|expert_tensor_parallel", "tp"),
    (r"pp|pipe(?:line)?(?:_model)?(?:_parallel)?|stage", "pp"),
    (r"cp|context(?:_parallel)?|ring", "cp"),
    (r"ep|expert(?:s|_parallel|_model_parallel)?|moe", "ep"),
)
_MESH = [(re.compile(p, re.IGNORECASE), d) for p, d in MESH_NAMES]
_MEGATRON_SUFFIX = re.compile(r"(?:_with_cp)?(?:_group)(?:_with_cp)?(?:_gloo)?$", re.IGNORECASE)

#: Ranges whose collectives are FSDP's, DTensor's (tensor parallel) and DDP's.
_FSDP_CTX = re.compile(FSDP_NAME.pattern
                       + r"|(?:autograd::engine::evaluate_function: )?RegisterPostBackward")
_DTENSOR_CTX = re.compile(
    r"(?:autograd::engine::evaluate_function: )?(?:Nested)?Redistribute(?:Backward\d*)?"
    r"|_FromTorchTensor\w*|_ToTorchTensor\w*|PythonSubclass")
#: DistributedDataParallel's own ranges (its forward, its reducer's), matched at a name's
#: start; :data:`DDP_FORWARD` its forward, once per forward pass.
DDP_NAME = re.compile(r"DistributedDataParallel\.|torch\.distributed\.ddp\.|"
                      r"torch::distributed::reducer")
DDP_FORWARD = re.compile(r"DistributedDataParallel\.forward")
_DDP_CTX = re.compile(DDP_NAME.pattern + r"|.*ZeroRedundancyOptimizer")
#: The backward node of an autograd Function written in Python (``CopyToTPBackward``; the
#: built-in operators' nodes end in a digit, ``AddmmBackward0``), SyncBatchNorm's aside, and
#: torch.compile's graphs' (``CompiledFunctionBackward``: DDP's bucket hooks fire inside it).
_CUSTOM_BACKWARD = re.compile(r"autograd::engine::evaluate_function: "
                              r"(?!SyncBatchNorm|CompiledFunction)\w*[A-Za-z_]Backward$")
_FUNCOL = re.compile(r"_?c10d_functional(?:_autograd)?::")
_BACKEND_SPAN = re.compile(BACKEND_SPAN)
_CALL = re.compile(r"c10d::|_?c10d_functional")
#: A functional collective's wait (``_c10d_functional::wait_tensor``).
_WAIT = re.compile(r".*::wait_tensor\w*$")
_DESC = re.compile(r"desc=(\S+)")
#: A detail whose first input is one element: a 0-dim tensor or ``[1]``, alone (``[[]]``) or
#: in a tensor list (``[[[]], [], …]``, c10d's calls).
_ONE_ELEMENT = re.compile(r"(?:^|\s)\[\[?\[1?\][\],]")
_PG = re.compile(r"pg=(\S+)")
#: The collectives a backend span can serve (gloo runs a reduce-scatter as an all-reduce).
_SERVES = {"all_reduce": ("all_reduce", "reduce_scatter")}
_MODEL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def mesh_dim(name: object) -> str | None:
    """The dimension a mesh dimension or process group description names (``mesh_tp`` →
    ``tp``, ``dp_shard`` → ``fsdp``), or None."""
    if not isinstance(name, str) or not name:
        return None
    text = name[5:] if name.lower().startswith("mesh_") else name
    text = _MEGATRON_SUFFIX.sub("", text)
    for pattern, dim in _MESH:
        if pattern.fullmatch(text):
            return dim
    return None


def _per_name(names: pd.Series, pattern: re.Pattern[str]) -> Array:
    """Per event: whether its name matches ``pattern`` (tested once per distinct name)."""
    cat = names.astype("category")
    cats = cat.cat.categories.astype(str)
    hit = np.array([bool(pattern.match(c)) for c in cats] + [False], bool)
    out: Array = hit[cat.cat.codes.to_numpy()]
    return out


def collective_dims(ev: pd.DataFrame) -> Array:
    """Per event of one rank's events table: the dimension of a communication event (the
    module docstring's rules), None for every other event."""
    n = len(ev)
    out = np.full(n, None, dtype=object)
    if n == 0:
        return out
    op = ev["op"].astype(object).to_numpy()
    # what a collective's time is read from: counted events (calls, backend spans on their
    # own threads, device kernels); what nests in them follows them
    counted = ev["counted"].to_numpy(bool) if "counted" in ev else np.ones(n, bool)
    comm = np.isin(op, list(COMM_OPS)) & (op != "barrier") & counted
    if not comm.any():
        return out
    names = ev["name"]
    host = on_host(ev).to_numpy(bool)
    ts = ev["ts"].to_numpy(np.int64)
    end = ts + ev["dur"].to_numpy(np.int64)
    lane = lane_ids(ev["rank"].to_numpy(np.int64), ev["pid"].to_numpy(np.int64),
                    ev["tid"].to_numpy(np.int64))
    nesting = Nesting(lane, ts, end)

    def inside(pattern: re.Pattern[str]) -> Array:
        ctx = host & _per_name(names, pattern)
        if not ctx.any():
            return np.zeros(n, bool)
        _, anc = nesting.nest(ctx)
        hit: Array = anc >= 0
        return hit

    fsdp, dtensor, ddp = inside(_FSDP_CTX), inside(_DTENSOR_CTX), inside(_DDP_CTX)
    # a rank whose model runs inside DistributedDataParallel's forward: a collective of the
    # forward pass outside it is the loop's bookkeeping (a token count gathered, a loss
    # averaged for the log), not the model's tensor parallelism
    wrapped = bool((host & _per_name(names, DDP_FORWARD)).any())
    custom_bwd = inside(_CUSTOM_BACKWARD)
    funcol = _per_name(names, _FUNCOL)
    # a device kernel: the ranges of the host call that launched it
    link = ev["link"].to_numpy(np.int64) if "link" in ev else np.full(n, -1, np.int64)
    dev = ~host & (link >= 0) & comm
    if dev.any():
        launch = np.flatnonzero(host & (link >= 0))
        key = pd.Index(link[launch])
        keep = ~key.duplicated()
        pos = key[keep].get_indexer(link[dev])
        src = np.where(pos >= 0, launch[keep][np.maximum(pos, 0)], -1)
        idx = np.flatnonzero(dev)
        ok = src >= 0
        for flags in (fsdp, dtensor, ddp, funcol, custom_bwd):
            flags[idx[ok]] = flags[src[ok]]
    # the phase the instant of each event is in (the rank's phase markers, inferred or not)
    kind = ev["kind"].astype(object).to_numpy()
    phase = ev["phase"].astype(object).to_numpy()
    marks = np.flatnonzero(host & (kind == "marker") & np.isin(
        phase, ["forward", "backward", "update", "load"]) & (end > ts))
    in_phase = label_points(np.zeros(n, np.int64), ts, np.zeros(len(marks), np.int64),
                            ts[marks], end[marks], phase[marks].astype(str), "")
    desc = _detail_dims(ev, comm)
    one = _one_element(ev, comm)

    def choose(ops: Array) -> Array:
        """The rules, in order, for events doing the collectives ``ops``."""
        rules = [
            desc != None,  # noqa: E711 (element-wise)
            fsdp & (ops == "all_reduce"), fsdp, dtensor,
            ops == "all_to_all", np.isin(ops, ["send", "recv"]),
            funcol | (np.isin(ops, _MODEL_OPS) & ((in_phase == "forward") | custom_bwd) & ~ddp
                      & ~one & (not wrapped)),
        ]
        values: list[Any] = [desc, "dp", "fsdp", "tp", "ep", "pp", "tp"]
        return np.select(rules, values, default="dp")

    chosen = choose(op)
    out[comm] = chosen[comm]
    # a functional collective's wait serves the functional collective it waits on, whatever
    # that is: an expert all-to-all's wait is not tensor parallel for being functional, nor
    # for running inside the dispatch of funcol's own tensor subclass (``PythonSubclass``)
    waits = _per_name(names, _WAIT)
    free = comm & host & ~fsdp & (desc == None)  # noqa: E711 (element-wise)
    _follow_calls(out, free & waits, comm & host & funcol & ~waits, lane, ts)
    is_call = host & _per_name(names, _CALL)
    issuing = np.isin(lane, np.unique(lane[is_call]))
    span = comm & host & _per_name(names, _BACKEND_SPAN)
    # the calls a backend thread's spans serve, each as the collective it is itself: a call
    # inside another's range counts under that range's collective (HSDP's all-reduce over the
    # replicas inside FSDP's post_backward_reduce, a reduce-scatter), but its spans run on
    # the replicas' group's own threads
    own = np.where(is_call, _own_ops(names), op)
    voters = is_call & np.isin(own, list(COMM_OPS)) & (own != "barrier") & ~span & (
        desc == None)  # noqa: E711 (element-wise)
    voting = np.where(comm, out, choose(own))
    _thread_votes(out, span & ~issuing, lane, ts, own, voters, voting)
    return out


def _own_ops(names: pd.Series) -> Array:
    """Per event: the collective its name is by the Kineto mapping table (``c10d::allreduce_``
    → ``all_reduce``), tested once per distinct name of a call (:data:`_CALL`); '' else."""
    cat = names.astype("category")
    cats = cat.cat.categories.astype(str)
    ops = np.full(len(cats) + 1, "", dtype=object)
    calls = np.flatnonzero([bool(_CALL.match(c)) for c in cats])
    if len(calls):
        ops[calls] = mapping_table("kineto").classify(cats[calls])["op"].to_numpy(object)
    out: Array = ops[cat.cat.codes.to_numpy()]
    return out


def _follow_calls(out: Array, waits: Array, calls: Array, lane: Array, ts: Array) -> None:
    """Each of ``waits`` takes the dimension of the latest of ``calls`` issued before it on
    its thread (kept where none was); in place."""
    w, c = np.flatnonzero(waits), np.flatnonzero(calls)
    if not len(w) or not len(c):
        return
    for one in np.unique(lane[w]):
        mine = w[lane[w] == one]
        theirs = c[lane[c] == one]
        if not len(theirs):
            continue
        theirs = theirs[np.argsort(ts[theirs], kind="stable")]
        pos = np.searchsorted(ts[theirs], ts[mine], side="right") - 1
        found = pos >= 0
        out[mine[found]] = out[theirs[pos[found]]]


def _detail_dims(ev: pd.DataFrame, comm: Array) -> Array:
    """Per event: the dimension its process group's description names (``desc=`` in its
    detail), else None."""
    out = np.full(len(ev), None, dtype=object)
    if "detail" not in ev or not comm.any():
        return out
    text = ev["detail"].astype(object).to_numpy()[comm]
    descs = pd.Series(text, dtype=object).fillna("").astype(str).str.extract(_DESC)[0]
    out[comm] = [mesh_dim(d) for d in descs.to_numpy(object)]
    return out


def _one_element(ev: pd.DataFrame, comm: Array) -> Array:
    """Per event: whether it is a collective of one element (its detail's first input
    shape, :data:`_ONE_ELEMENT`; tested once per distinct detail)."""
    out = np.zeros(len(ev), bool)
    if "detail" not in ev or not comm.any():
        return out
    text = pd.Series(ev["detail"].astype(object).to_numpy()[comm], dtype=object)
    cat = text.fillna("").astype(str).astype("category")
    hit = np.array([bool(_ONE_ELEMENT.search(c)) for c in cat.cat.categories] + [False], bool)
    out[comm] = hit[cat.cat.codes.to_numpy()]
    return out


def _thread_votes(out: Array, spans: Array, lane: Array, ts: Array, op: Array,
                  calls: Array, dims: Array) -> None:
    """Backend spans on threads that issue no call (gloo's own threads): the spans of one
    collective on one thread take the dimension (``dims``) most of their calls have (per span,
    the latest call of a collective it can serve issued before it started); in place."""
    own = np.flatnonzero(spans)
    c = np.flatnonzero(calls)
    if not len(own) or not len(c):
        return
    vote = np.full(len(own), None, dtype=object)
    for span_op in np.unique(op[own]):
        mine = op[own] == span_op
        served = c[np.isin(op[c], _SERVES.get(str(span_op), (span_op,)))]
        if not len(served):
            continue
        served = served[np.argsort(ts[served], kind="stable")]
        pos = np.searchsorted(ts[served], ts[own[mine]], side="right") - 1
        got = dims[served[np.maximum(pos, 0)]].copy()
        got[pos < 0] = None
        vote[mine] = got
    has = vote != None  # noqa: E711 (element-wise)
    if not has.any():
        return
    # per thread and collective: one process group's thread may serve two dimensions (a
    # mixture of experts' all-to-all and the replicated parameters' all-reduce on one group)
    key = lane[own].astype(np.int64) * 64 + pd.factorize(op[own])[0]
    votes = pd.DataFrame({"key": key[has], "dim": vote[has].astype(str)})
    top = votes.groupby("key")["dim"].agg(lambda d: d.value_counts().index[0])
    dims = top.reindex(key).to_numpy(object)
    keep = pd.isna(dims)
    out[own] = np.where(keep, out[own], dims)


# ------------------------------------------------------------------ groups and the layout

def rank_facts(ev: pd.DataFrame, dims: Array, distributed: Any) -> dict[str, Any]:
    """One rank's facts for :func:`layout`: per dimension whose collectives run in its steps,
    the calls and the process group it takes (``pg``, ``desc``, ``ranks``, ``size``; the module
    docstring), and the rank's groups as its trace lists them."""
    step = ev["step"].to_numpy() if "step" in ev else np.zeros(len(ev), np.int64)
    counted = ev["counted"].to_numpy(bool) if "counted" in ev else np.ones(len(ev), bool)
    sel = (dims != None) & (step >= 0) & counted  # noqa: E711 (element-wise)
    # a collective counted once, by what times it (as `--by comm` does: its device kernels if
    # the rank has any, else gloo's spans that ran it, else its calls — not their waits)
    names = ev["name"]
    host = on_host(ev).to_numpy(bool) if "device" in ev else np.ones(
        len(ev), bool)
    span = host & _per_name(names, _BACKEND_SPAN)
    labels = dims.astype(str)
    one = _one_element(ev, sel)
    kinds = (sel & ~host, sel & span, sel & host & ~span & ~_per_name(names, _WAIT))

    def count(extra: Array) -> dict[str, int]:
        out: dict[str, int] = {}
        for mask in kinds:  # the first kind a dimension has
            for k, v in pd.Series(labels[mask & extra]).value_counts().items():
                out.setdefault(str(k), int(v))
        return out

    calls = count(np.ones(len(ev), bool))
    bulk = count(~one)
    groups = process_groups(distributed)
    seen = [d for d in DIMS if d in calls]
    taken = assign_groups(seen, groups, _detail_groups(ev, dims), _span_threads(ev, dims))
    out: dict[str, Any] = {"dims": {}}
    for d in seen:
        g = taken.get(d)
        out["dims"][d] = {"calls": int(calls[d]), "bulk_calls": int(bulk.get(d, 0)),
                          **(g or {})}
    if isinstance(distributed, Mapping) and "world_size" in distributed:
        out["world_size"] = distributed.get("world_size")
    return out


def _span_threads(ev: pd.DataFrame, dims: Array) -> dict[str, int]:
    """Dimension → the lowest thread id among the backend spans of its collectives that run
    on the backend's own threads (gloo's: each process group starts its worker threads when it
    is made, so thread ids rise in the order the groups were made)."""
    has = dims != None  # noqa: E711 (element-wise)
    if not has.any() or "tid" not in ev:
        return {}
    names = ev["name"]
    span = has & _per_name(names, _BACKEND_SPAN) & on_host(ev).to_numpy(bool)
    issuing = np.unique(ev["tid"].to_numpy(np.int64)[_per_name(names, _CALL)])
    tid = ev["tid"].to_numpy(np.int64)
    span &= ~np.isin(tid, issuing)
    if not span.any():
        return {}
    low = pd.Series(tid[span]).groupby(dims[span].astype(str)).min()
    return {str(d): int(t) for d, t in low.items()}


def process_groups(distributed: Any) -> list[dict[str, Any]]:
    """The process groups a rank's ``distributedInfo`` lists: pg (name), desc, ranks, size."""
    if not isinstance(distributed, Mapping):
        return []
    cfg = distributed.get("pg_config")
    out = []
    for g in cfg if isinstance(cfg, list) else []:
        if not isinstance(g, Mapping):
            continue
        ranks = g.get("ranks")
        ranks = [int(r) for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else []
        size = g.get("pg_size")
        out.append({"pg": str(g.get("pg_name", "")), "desc": str(g.get("pg_desc", "") or ""),
                    "ranks": ranks, "size": int(size) if isinstance(size, int) else len(ranks)})
    return out


def _detail_groups(ev: pd.DataFrame, dims: Array) -> dict[str, str]:
    """Dimension → the process group name its collectives' detail names (``pg=``), where
    one does."""
    if "detail" not in ev:
        return {}
    has = dims != None  # noqa: E711 (element-wise)
    text = pd.Series(ev["detail"].astype(object).to_numpy()[has], dtype=object)
    pg = text.fillna("").astype(str).str.extract(_PG)[0]
    frame = pd.DataFrame({"dim": dims[has].astype(str), "pg": pg.to_numpy(object)}).dropna()
    if frame.empty:
        return {}
    first = frame.groupby("dim")["pg"].agg(lambda p: p.value_counts().index[0])
    return {str(k): str(v) for k, v in first.items()}


def assign_groups(dims: Iterable[str], groups: list[dict[str, Any]],
                  named: Mapping[str, str] | None = None,
                  threads: Mapping[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """Dimension → the process group it runs in (the module docstring's rules): the group its
    collectives name (``named``), the group whose description names it, the one group left;
    several dimensions left with as many groups (the unnamed ones made by ``new_group``, and
    the default group where one more is needed): in the order the groups were made, by the
    lowest thread id of each dimension's backend spans (``threads``: gloo's threads start
    with their group); else the default group (``default_pg``, or the first listed)."""
    dims = list(dims)
    by_name = {g["pg"]: g for g in groups}
    out: dict[str, dict[str, Any]] = {}
    for d in dims:
        g = by_name.get((named or {}).get(d, "\0"))
        if g is not None:
            out[d] = g
    for d in dims:
        if d in out:
            continue
        match = [g for g in groups if mesh_dim(g["desc"]) == d] or [
            g for g in groups if d in DATA_DIMS and mesh_dim(g["desc"]) in DATA_DIMS]
        if len(match) == 1:
            out[d] = match[0]
    used = {out[d]["pg"] for d in out}
    default = next((g for g in groups if g["desc"] == "default_pg"), groups[0] if groups else None)
    free = [g for g in groups if g["pg"] not in used and g is not default
            and mesh_dim(g["desc"]) is None]
    left = [d for d in dims if d not in out]
    made = sorted(free + ([default] if default is not None and len(left) == len(free) + 1
                          and default["pg"] not in used else []), key=_made)
    if len(left) > 1 and len(made) == len(left) and all(d in (threads or {}) for d in left):
        for d, g in zip(sorted(left, key=lambda d: (threads or {})[d]), made, strict=True):
            out[d] = g
        left = []
    if len(left) == 1 and len(free) >= 1:
        # the group left: with several, the one of the smallest size that is not the world
        out[left[0]] = sorted(free, key=lambda g: g["size"])[0] if len(free) > 1 else free[0]
        left = []
    for d in left:
        if default is not None:
            out[d] = default
    return {d: {"pg": g["pg"], "desc": g["desc"], "ranks": g["ranks"], "size": g["size"]}
            for d, g in out.items()}


def _made(group: Mapping[str, Any]) -> tuple[int, str]:
    """A group's place in the order groups were made: its name, a counter (``"3"``)."""
    name = str(group.get("pg", ""))
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def layout(facts: Iterable[Mapping[str, Any]], workers: int,
           recorded: object = None) -> tuple[str | None, dict[str, Any]]:
    """The job's mode and ``parallelism`` (dimension → degree and groups) from every rank's
    :func:`rank_facts`. The mode is None when the job shows no model parallelism (its only
    dimension data parallel, or none): the recorded or recognized mode stays. A recorded
    model-parallel mode with the same model-parallel dimensions stays too (``record --mode
    ep``, whose replicated parameters' gradients are all-reduced: ``dp+ep`` in full)."""
    dims: dict[str, dict[str, Any]] = {}
    for f in facts:
        for d, info in (f.get("dims") or {}).items():
            entry = dims.setdefault(d, {"calls": 0, "bulk": 0, "groups": [], "sizes": []})
            entry["calls"] += int(info.get("calls", 0))
            entry["bulk"] += int(info.get("bulk_calls", info.get("calls", 0)))
            ranks = sorted(info.get("ranks") or [])
            if ranks and ranks not in entry["groups"]:
                entry["groups"].append(ranks)
            if info.get("size"):
                entry["sizes"].append(int(info["size"]))
    parallelism: dict[str, Any] = {}
    for d in DIMS:
        if d not in dims:
            continue
        e = dims[d]
        groups = sorted(e["groups"]) or [list(range(workers))]
        degree = max(e["sizes"]) if e["sizes"] else len(groups[0])
        parallelism[d] = {"degree": int(degree), "groups": groups, "calls": int(e["calls"])}
    # a dimension whose groups hold one rank parallelizes nothing (Lightning's
    # ModelParallelStrategy with data_parallel_size=1 still broadcasts over its mesh's 1-rank
    # data-parallel groups): it stays in ``parallelism``, not in the mode. (A degree of 1
    # because one rank's trace of a larger job is read, its groups unknown, is no such thing.)
    names = [d for d in parallelism if not (dims[d]["sizes"] and max(dims[d]["sizes"]) == 1)]
    # data parallelism seen only in collectives of one element (a loss averaged for the log,
    # a mixture of experts' capacity agreed) is the loop's bookkeeping: not in the mode
    names = [d for d in names if d not in DATA_DIMS or dims[d]["bulk"]]
    model = [d for d in names if d not in DATA_DIMS]
    if not model:
        return None, parallelism
    asked = str(recorded or "").split("+")
    if set(model) == {d for d in asked if d not in DATA_DIMS} and set(asked) <= set(DIMS):
        return str(recorded), parallelism  # what `record --mode ep` asked for, and ran
    if "dp" in names and recorded == Mode.ZERO:
        names[names.index("dp")] = str(Mode.ZERO)
    return "+".join(names), parallelism


def group_text(dim: str, group: Mapping[str, Any] | None) -> str:
    """``pg=3 size=2 desc=mesh_tp`` of a dimension's process group ('' without one)."""
    if group is None or not group.get("pg"):
        return ""
    parts = [f"pg={group['pg']}"]
    if group.get("size"):
        parts.append(f"size={group['size']}")
    desc = group.get("desc")
    if desc and " " not in desc and desc != "undefined":
        parts.append(f"desc={desc}")
    return " ".join(parts)


def tag(ev: pd.DataFrame, distributed: Any) -> tuple[pd.Series | None, dict[str, Any]]:
    """One rank's events: the ``detail`` column with every collective's process group where it
    names none (:func:`group_text`, first) and its dimension (``parallel=tp``, last), None when
    the rank has no collective; and the rank's :func:`rank_facts`."""
    dims = collective_dims(ev)
    facts = rank_facts(ev, dims, distributed)
    has = np.flatnonzero(dims != None)  # noqa: E711 (element-wise)
    if not len(has):
        return None, facts
    groups = {d: info for d, info in facts["dims"].items()}
    groups.update({d: g for d, g in assign_groups(
        sorted(set(dims[has].astype(str)) - set(groups)), process_groups(distributed)).items()})
    text = (ev["detail"].astype(object) if "detail" in ev
            else pd.Series(None, index=ev.index, dtype=object)).iloc[has]
    text = text.where(text.notna(), "").astype(str)
    dim = pd.Series(dims[has].astype(str), index=text.index)
    named = text.str.contains("pg=", regex=False)
    prefix = dim.map({d: group_text(d, groups.get(d)) for d in dim.unique()})
    prefix = prefix.where(~named & (prefix != ""), "")
    tagged = (prefix + np.where((prefix != "") & (text != ""), " ", "") + text
              + np.where((prefix != "") | (text != ""), " ", "") + "parallel=" + dim)
    detail = (ev["detail"].astype(object) if "detail" in ev
              else pd.Series(None, index=ev.index, dtype=object)).copy()
    detail.iloc[has] = tagged.to_numpy(object)
    return detail.astype("string"), facts
