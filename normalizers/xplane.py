"""TensorFlow profiler XPlane files (``<host>.xplane.pb``) → the common events table, read
through xprof's own converters (never by parsing the protobuf here).

Each file is one profiled process ("host" in xprof's words). xprof's ``trace_viewer`` tool
turns it into a chrome trace (one file per call; events in µs from the start of that
profile); every complete event becomes a row. What each row is:

* **TF ops** carry ``args.long_name = "<full op name>:<op type>"``. ``name`` keeps the op type
  exactly as the trace viewer names it (``_MklNativeConv2DBackpropInput`` under oneDNN,
  ``Conv2DBackpropInput`` without); ``detail`` keeps the full op name. They are classified by
  the whole ``long_name``, so scope decides what the type alone cannot: ``MatMul`` under
  ``gradients/`` or ``gradient_tape/`` is ``fully_connected_backward``; Keras 3's unfused
  BatchNormalization (``Mean``, ``SquaredDifference``, ``Rsqrt`` … under
  ``batch_normalization*/``) is ``batch_norm``; optimizer scopes (``sgd/`` …) are
  ``weights_update``.
* **Async kernels** (``ExecutorState::ProcessAsync::Start``/``Done``, with ``kernel_type`` and
  ``name`` args: ``_Recv``, ``IteratorGetNext``, collectives) are classified as
  ``"<name>:<kernel_type>"``.
* **Steps**: any event with a ``step_num`` argument (``tf.profiler.experimental.Trace("train",
  step_num=N)``, shown as ``train N``) is step marker N; where opprof's own markers
  (``opprof=1``) are there, only they are (Keras 2's ``fit`` marks its steps too). A process
  without step markers has its steps from its main training function (the ``tf.function``
  executed most often, ``EagerLocalExecute: __inference_F_N``): called from Python in the
  process (a custom loop's ``train_step``, Keras 3 ``fit``'s ``multi_step_on_iterator``), each
  Python call event
  (``tf_function_call``) closes a step that reaches back to the previous call's end, so it
  holds fetching the batch (``closes_step`` in the raw frame); executed remotely (a
  ParameterServerStrategy worker runs what the chief schedules, and idles in between), each
  execution is step marker k, in time order. (xprof's own grouping, the ``group_id`` it
  gives events, numbers the same executions for Keras ``fit``, but makes every iteration of
  a ``while`` loop a group of its own — 21 "steps" per call of an LSTM's training step —
  which is why steps come from the calls here.)
* **XLA ops** (``jit_compile=True``; trace viewer events with ``hlo_op`` and ``hlo_module``
  args, on CPU on the Eigen threads) are HLO instructions: fusions (``broadcast_add_fusion.1``),
  ``convolution.2``, dots (``MatMul.8``), copies, XLA CPU's single-op ``wrapped_*`` fusions.
  They are classified as ``"XLA <category>: <TF op name>:<TF op type>"``: xprof's HLO category
  (XLA's ``ToCategory``: ``loop fusion``, ``convolution``, ``dot``, ``data formatting``,
  ``non-fusion elementwise``, ``reduce-window`` …; a custom call adds its target) and the TF op
  of the instruction's HLO metadata, from xprof's ``hlo_category`` and ``tf_op`` args where the
  trace viewer gives them (GPU and TPU XLA Ops lines), else from the HLO protos the XPlane
  holds (:func:`_hlo_instructions`). The TF op's name says the phase, as for TF ops: the
  backward's instructions come from ops under ``gradient_tape/`` (``Conv2DBackpropFilter`` …),
  the update's from the optimizer's scope. Fusions are ``fused`` / ``fused_backward``; the
  fusion's name stays ``name`` and ``detail`` is ``"<TF op> @ <module>/<HLO op> = <fused
  computation>"``. The compiled function's launch (its ``StatefulPartitionedCall`` kernel,
  ``__inference_*`` executed eagerly, ``CpuExecutable::*``, ``ThunkExecutor::*``,
  ``BlockUntilReady``) are markers around them. xprof has no HLO aggregate for a CPU profile
  (hlo_stats and op_profile are empty there); framework_op_stats lists the TF ops around the
  program.
* **Phases without opprof markers** (a user's own logdir): the scope says it — ops under
  ``gradient_tape/`` or ``gradients/`` are backward, under the optimizer's name scope (or
  ``*Apply*`` kernels) update, ``IteratorGetNext``/``Iterator::*``/``tf.data`` threads load,
  and the table gives every other op of a training graph (memory, elementwise, a Keras
  LSTM's ``while`` loop …) the forward phase; time between ops follows
  ``opprof.normalizers.events`` (it goes to the op that starts next).
* **Thread-pool work is not counted twice**: ``ThreadpoolListener::Region`` (Eigen and
  inter-op pool work items), ``ExecutorState::Process``, ``ParallelFor`` and the eager runtime
  wrappers (``EagerExecute``, ``KernelAndDeviceFunc::Run``, the Python-side ``tf.function``
  call …) are markers: they enclose or mirror ops that are already counted on their own
  threads (an op that shards work onto Eigen threads is counted once, with its full wall
  duration, on the thread that ran it).
* **Input pipeline**: every event on a ``tf_data_*`` thread is classified as
  ``"tf.data: <key>"`` → ``data_load`` (after the wrapper rows), as are ``Iterator::*`` and
  ``IteratorGetNext`` ops; ``opprof.load`` is a ``data_load`` operator like Kineto's.
* **Receives** (``_Recv``, parameter-server pulls) are asynchronous: the union of their
  posted→arrived intervals becomes synthesized ``_Recv`` comm events on a lane of their own
  (tid -1), and their Start/Done halves become markers. These intervals overlap compute; the
  wall-time breakdown counts as ``comm`` only the part no compute op hides.

xprof's trace viewer keeps only the first ``TF_PROFILER_TRACE_VIEWER_MAX_EVENTS`` (default
1,000,000) events of a file; the limit is lifted while opprof converts, so nothing is cut.
Per TF op type, the totals here equal xprof's ``framework_op_stats`` (count and time; its
``Dataset`` type is the ``Iterator::*`` events); framework_op_stats has no row for what is not
a TF op (runtime events, annotations, async-kernel halves) and adds a host ``IDLE`` row.

Ranks and clock: the opprof collector emits one ``opprof.clock`` marker per process with its
role, task index, rank and the epoch time at that instant, which places the file on the epoch
clock (``ts`` is then ns since the epoch, common to all ranks). Without it (any other logdir)
the role and index come from the path (``worker1/``, ``ps0/``, ``chief0/``) or file order, and
times stay relative to each profile's start (meta ``clock = "profile-relative"``).
Servers (ps) and the chief (scheduler) keep their events but get no steps (step -1): only
workers have training steps.

Memory: xprof's ``memory_profile`` tool gives each allocator's bytes in use over the profile;
they become the ``allocated`` memory rows of the rank (:func:`allocator_samples` says what TF
traces on a CPU).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from opprof import drops
from opprof.errors import ErrorKind, OpprofError, first_line
from opprof.normalizers import jaxplane
from opprof.normalizers.chrome import NONE
from opprof.normalizers.events import finish
from opprof.normalizers.hlo import category as _category
from opprof.normalizers.memory_rows import add_memory, samples
from opprof.taxonomy import mapping_table
from opprof.trace import Trace, conform

NAME = "xplane"
TABLE = "tf"
SUFFIX = ".xplane.pb"
_RUN_ARGS = ["model", "mode", "dataset", "batch_size", "workers", "servers",
             "framework_version"]
_ARGS = ["long_name", "step_num", "tf_function_call", "kernel_type", "name", "step_id",
         "epoch_ns", "role", "task", "rank", "opprof", "hlo_op", "hlo_module", "hlo_category",
         "tf_op", "framework", *_RUN_ARGS]
_RECV_KERNELS = ("_Recv", "_HostRecv")
_MAX_EVENTS_ENV = "TF_PROFILER_TRACE_VIEWER_MAX_EVENTS"
_MAX_EVENTS = 2_000_000_000
RECV_WAIT_TID = -1
_TASK_DIR = re.compile(r"(worker|ps|chief|master|evaluator)[_-]?(\d+)$")
_ROLE_OF_DIR = {"worker": "worker", "ps": "server", "chief": "scheduler", "master": "scheduler",
                "evaluator": "scheduler"}
_REMOTE_FN = re.compile(r"EagerLocalExecute: __inference_(\w+?)_\d+")
_ASYNC = ("ExecutorState::ProcessAsync::Start", "ExecutorState::ProcessAsync::Done")


def claims_file(path: Path, head: bytes) -> bool:
    """An XPlane file written by the TensorFlow/JAX profiler."""
    return Path(path).name.endswith(SUFFIX)


def from_files(paths: list[Path], meta: dict) -> Trace:
    """Normalize one XPlane file per profiled process into one Trace."""
    hosts = [_host_events(Path(p)) for p in paths]
    _assign_ranks(hosts)
    raw = pd.concat([h["raw"] for h in hosts], ignore_index=True)
    # dropped here, not in finish, so that the rows stay aligned with their display names
    warnings = {drops.KEY: drops.merged(h["warnings"] for h in hosts)}
    negative, outside = drops.timeline_problems(raw["ts"].to_numpy(np.int64),
                                                raw["dur"].to_numpy(np.int64))
    if (negative | outside).any():
        keep = drops.skip(warnings, negative, "negative duration")
        keep &= drops.skip(warnings, outside, "time outside the trace's span")
        if not keep.any():
            raise OpprofError("XPlane with no usable events "
                              f"({drops.describe(warnings[drops.KEY])})",
                              path=paths[0], kind=ErrorKind.NO_EVENTS)
        raw = raw[keep].reset_index(drop=True)
    display = raw.pop("display")
    clocked = all(h["epoch_offset"] is not None for h in hosts)
    workers = sorted(h["rank"] for h in hosts if h["role"] == "worker")
    jax = all(h["framework"] == "jax" for h in hosts)
    info = {
        "source_formats": [NAME],
        "sources": [str(p) for p in paths],
        "framework": "jax" if jax else "tf",
        "workers": len(workers),
        "servers": sum(h["role"] == "server" for h in hosts),
        "device": "cuda" if (raw["device"] != "cpu").any() else "cpu",
        "clock": "epoch" if clocked else "profile-relative",
        "clock_offsets_ns": {str(h["rank"]): int(h["epoch_offset"] or 0) for h in hosts},
        "ranks": [{"rank": h["rank"], "role": h["role"], "source": str(h["path"])}
                  for h in hosts],
    }
    # What the run was (model, mode, batch size …) as the collector stamped it on its clock
    # marker; explicit metadata from the caller wins.
    for h in hosts:
        for k, v in h["run"].items():
            info.setdefault(k, v)
    info.update(meta)
    if warnings[drops.KEY]:
        info[drops.KEY] = drops.merged([info.get(drops.KEY), warnings[drops.KEY]])
    if jax and not any(h["operations"] for h in hosts):
        info.setdefault("graphs", jaxplane.NO_OPERATIONS)
    trace = finish(raw, mapping_table(jaxplane.TABLE if jax else TABLE), info, checked=True)
    ev = trace.events
    # xprof's names for the native events; what opprof adds after them keeps its own.
    names = ev["name"].astype(object).to_numpy().copy()
    names[:len(display)] = display.to_numpy(dtype=object)
    ev["name"] = names
    # Only workers train: servers and the scheduler carry no steps.
    not_worker = (ev["role"] != "worker").to_numpy()
    ev.loc[not_worker, "step"] = -1
    trace.meta["step_bounds"] = [b for b in trace.meta["step_bounds"] if b[0] in workers]
    trace.events = conform(ev)
    pids = {int(k): int(v) for k, v in (trace.meta.get("rank_pids") or {}).items()}
    memory = [allocator_samples(h["path"], h["rank"], h["role"], h["epoch_offset"] or 0,
                                pids.get(h["rank"], -1)) for h in hosts]
    return add_memory(trace, pd.concat(memory, ignore_index=True))


#: A TF allocator's name → the device it allocates on (others are left out).
_GPU_ALLOCATOR = re.compile(r"GPU_(\d+)_bfc")
_CPU_ALLOCATORS = ("mklcpu", "cpu")


def allocator_samples(path: Path, rank: int, role: str, offset_ns: int,
                      pid: int = -1) -> pd.DataFrame:
    """The allocators' timeline from xprof's ``memory_profile`` tool as ``allocated``
    samples: per allocator (``mklcpu`` or ``cpu`` → ``cpu``, ``GPU_N_bfc`` → ``cuda:N``) its
    snapshots (xprof keeps at most 1,000 per allocator, the largest of each window, plus the
    ones at the peak), bytes in use = heap + stack, at ``timeOffsetPs`` from the profile's
    start, put on the trace's clock with the host's ``offset_ns``.

    What TensorFlow records: its allocators trace their allocations (``MemoryAllocation``
    events) at host tracer level 2. On a CPU with oneDNN the ``mklcpu`` allocator hands
    allocations of 256 KiB and more to a BFC allocator, which traces them with its own bytes
    in use; smaller ones go to plain ``malloc`` and are not traced. So on the CPU the figure
    is the memory of the large tensors (all of them, since the process started), and a model
    of only small tensors has none. Without oneDNN (TF's default on x86 CPUs without
    AVX-512's neural-network extensions, or ``TF_ENABLE_ONEDNN_OPTS=0``) the plain ``cpu``
    allocator traces nothing and there is no figure; the run's fact ``onednn`` says which."""
    doc = _tool(Path(path), "memory_profile")
    per = doc.get("memoryProfilePerAllocator") if isinstance(doc, dict) else None
    frames = [samples(rank, role, pid, "cpu", np.zeros(0, np.int64), "allocated",
                      np.zeros(0, np.int64), "xprof")]
    for name, prof in (per or {}).items():
        gpu = _GPU_ALLOCATOR.fullmatch(str(name))
        if (not gpu and name not in _CPU_ALLOCATORS) or not isinstance(prof, dict):
            continue
        snaps = [*(prof.get("sampledTimelineSnapshots") or []),
                 *(prof.get("memoryProfileSnapshots") or [])]
        rows = []
        for snap in snaps:
            stats = (snap.get("aggregationStats") or {}) if isinstance(snap, dict) else {}
            try:
                t_ps = int(snap["timeOffsetPs"])
                used = int(stats.get("heapAllocatedBytes", 0)) + int(
                    stats.get("stackReservedBytes", 0))
            except (KeyError, TypeError, ValueError):
                continue
            rows.append((t_ps // 1000, used))
        if not rows:
            continue
        at, nbytes = (np.array(c, np.int64) for c in zip(*sorted(set(rows)), strict=True))
        frames.append(samples(rank, role, pid, f"cuda:{gpu.group(1)}" if gpu else "cpu",
                              at + offset_ns, "allocated", nbytes, "xprof"))
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- xprof


def _xprof() -> ModuleType:
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        raise OpprofError(
            "reading .xplane.pb files needs xprof: pip install -e '.[tf]' -c constraints.txt"
        ) from None
    return raw_to_tool_data


@contextmanager
def _native_stderr_quiet() -> Iterator[None]:
    """xprof's C++ code logs to file descriptor 2 (absl banners, info lines); keep that off the
    user's terminal while it runs (our own errors say what went wrong)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _tool(path: Path, tool: str) -> Any:
    """Run one xprof tool on one XPlane file; return its parsed JSON."""
    if not path.exists():
        raise OpprofError("no such file", path=path, kind=ErrorKind.MISSING)
    if path.stat().st_size == 0:
        raise OpprofError("file is empty", path=path, kind=ErrorKind.EMPTY)
    convert = _xprof()
    # The trace viewer silently keeps only the first 1,000,000 events unless told otherwise.
    saved = os.environ.get(_MAX_EVENTS_ENV)
    os.environ[_MAX_EVENTS_ENV] = str(_MAX_EVENTS)
    try:
        # xprof caches tool results (ALL_HOSTS.op_stats_v2.pb) beside the file it reads: give
        # it a link in a scratch folder so that reading never writes into the user's logdir.
        with _native_stderr_quiet(), tempfile.TemporaryDirectory(prefix="opprof-xprof-") as tmp:
            link = Path(tmp) / path.name
            link.symlink_to(path.resolve())
            out = convert.xspace_to_tool_data([str(link)], tool, {"use_saved_result": False})
    except Exception as exc:  # xprof raises plain exceptions for unreadable files
        raise OpprofError("not a readable XPlane (truncated, or not written by the "
                          f"TensorFlow profiler); xprof says: {first_line(exc)}",
                          path=path, kind=ErrorKind.NOT_A_TRACE) from None
    finally:
        if saved is None:
            os.environ.pop(_MAX_EVENTS_ENV, None)
        else:
            os.environ[_MAX_EVENTS_ENV] = saved
    data = out[0] if isinstance(out, tuple) else out
    if data is None:
        raise OpprofError(f"xprof's {tool} converter failed: not a readable XPlane "
                          "(truncated, or not written by the TensorFlow profiler)",
                          path=path, kind=ErrorKind.NOT_A_TRACE)
    if isinstance(data, (bytes, bytearray)):
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        data = data.decode("utf-8", "replace")
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise OpprofError(f"xprof's {tool} output is not JSON ({exc})",
                          path=path, kind=ErrorKind.NOT_A_TRACE) from None


def trace_viewer(path: Path) -> dict:
    """xprof's trace viewer document (chrome trace JSON) for one XPlane file."""
    doc = _tool(Path(path), "trace_viewer")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise OpprofError("xprof's trace viewer output has no traceEvents",
                          path=path, kind=ErrorKind.NO_EVENTS)
    return doc


def framework_op_stats(path: Path) -> pd.DataFrame:
    """xprof's own per-op aggregate (the TF Stats table, IDLE excluded) for one XPlane file:
    one row per op with host_or_device, type, operation, occurrences, total_us, self_us."""
    tables = _tool(Path(path), "framework_op_stats")
    table = tables[-1] if isinstance(tables, list) else tables
    ids = [c["id"] for c in table["cols"]]
    rows = [[cell.get("v") if isinstance(cell, dict) else cell for cell in r["c"]]
            for r in table["rows"]]
    df = pd.DataFrame(rows, columns=ids)
    df = df[df["type"] != "IDLE"]
    return pd.DataFrame({
        "host_or_device": df["host_or_device"], "type": df["type"],
        "operation": df["operation"], "occurrences": df["occurrences"].astype(np.int64),
        "total_us": df["total_time"].astype(float), "self_us": df["total_self_time"].astype(float),
    }).reset_index(drop=True)


# --------------------------------------------------------------------------- XLA

_HLO_COLUMNS = ["module", "hlo_op", "category", "tf_op", "computation"]


def _hlo_instructions(path: Path, rows_of: Any = None) -> pd.DataFrame:
    """Per HLO instruction of the XLA programs an XPlane holds: its module, name, xprof's
    category and the TensorFlow op it comes from (``op_name:op_type`` of its metadata; an
    instruction XLA made without one takes that of the first instruction using its result,
    so the helpers of a gradient are backward too). xprof extracts the programs' HLO protos
    from the XPlane (its tool-names step writes ``<module>(<id>).hlo_proto.pb``); without
    TensorFlow's HLO proto module, none (XLA ops are then known by their category only
    where the trace viewer gives it)."""
    try:
        with _native_stderr_quiet():  # TensorFlow's import logs (absl, oneDNN) to descriptor 2
            from tensorflow.compiler.xla.service import hlo_pb2
    except ImportError:
        return pd.DataFrame(columns=_HLO_COLUMNS)
    convert = _xprof()
    rows: list[tuple[str, str, str, str, str]] = []
    with _native_stderr_quiet(), tempfile.TemporaryDirectory(prefix="opprof-xprof-") as tmp:
        link = Path(tmp) / path.name
        link.symlink_to(Path(path).resolve())
        try:
            convert.xspace_to_tool_names([str(link)])
        except Exception:  # noqa: BLE001 - the trace viewer reports an unreadable file
            return pd.DataFrame(columns=_HLO_COLUMNS)
        protos = sorted(Path(tmp).glob("*.hlo_proto.pb"))
        for f in protos:
            proto = hlo_pb2.HloProto()
            proto.ParseFromString(f.read_bytes())
            rows += (rows_of or _module_rows)(proto.hlo_module)
    return pd.DataFrame(rows, columns=_HLO_COLUMNS).drop_duplicates(["module", "hlo_op"])


def _module_rows(module: Any) -> list[tuple[str, str, str, str, str]]:
    """:func:`_hlo_instructions`' rows of one HLO module."""
    computations = {c.id: c for c in module.computations}
    rows = []
    for comp in module.computations:
        users: dict[int, list[int]] = {}
        for i in comp.instructions:
            for o in i.operand_ids:
                users.setdefault(o, []).append(i.id)
        tf_op = {i.id: f"{i.metadata.op_name}:{i.metadata.op_type}"
                 for i in comp.instructions if i.metadata.op_name}
        for i in reversed(comp.instructions):  # post order: users come after their operands
            if i.id not in tf_op:
                user = next((tf_op[u] for u in users.get(i.id, []) if u in tf_op), None)
                if user is not None:
                    tf_op[i.id] = user
        for i in comp.instructions:
            category, called = _category(i, computations)
            rows.append((module.name, i.name, category, tf_op.get(i.id, ":"), called))
    return rows


def xla_keys(args: pd.DataFrame, hlo: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Classification key and detail of XLA op events (trace viewer args ``hlo_op``,
    ``hlo_module``): ``"XLA <category>: <TF op name>:<TF op type>"`` (maps/tf.csv's XLA
    rows), with xprof's ``hlo_category`` and ``tf_op`` where the trace viewer gives them (its
    XLA Ops lines on GPU and TPU), else from the HLO (``hlo``, :func:`_hlo_instructions`);
    detail: ``"<TF op> @ <module>/<HLO op>[ = <fused computation>]"``."""
    ev = pd.DataFrame({"module": _text(args["hlo_module"]).to_numpy(object),
                       "hlo_op": _text(args["hlo_op"]).to_numpy(object)})
    known = ev.merge(hlo, on=["module", "hlo_op"], how="left")
    category = _text(args["hlo_category"]).to_numpy(object)
    category = np.where(category != "", category, _text(known["category"]).to_numpy(object))
    category = np.where(category != "", category, "unknown")
    tf_op = _text(args["tf_op"]).to_numpy(object)
    tf_op = np.where(tf_op != "", tf_op, _text(known["tf_op"]).to_numpy(object))
    tf_op = np.where(tf_op != "", tf_op, ":")
    key = pd.Series("XLA " + category + ": " + tf_op, dtype=object)
    called = _text(known["computation"])
    detail = (pd.Series(tf_op, dtype=object).str.rstrip(":") + " @ " + ev["module"] + "/"
              + ev["hlo_op"] + np.where(called != "", " = " + called, ""))
    return key, detail


# --------------------------------------------------------------------------- one host


def _host_events(path: Path) -> dict[str, Any]:
    doc = trace_viewer(path)
    events = doc["traceEvents"]
    frame = pd.DataFrame.from_records(
        events, columns=["ph", "pid", "tid", "name", "ts", "dur", "args"])
    meta_ev = frame[frame["ph"] == "M"]
    threads = {(int(r.pid), int(r.tid)): str(r.args.get("name", ""))
               for r in meta_ev[meta_ev["name"] == "thread_name"].itertuples()
               if isinstance(r.args, dict)}
    ev = frame[frame["ph"] == "X"].reset_index(drop=True)
    if ev.empty:
        raise OpprofError("XPlane with no complete events (was anything profiled?)",
                          path=path, kind=ErrorKind.NO_EVENTS)
    args = pd.DataFrame.from_records([a if isinstance(a, dict) else {} for a in ev["args"]],
                                     columns=_ARGS)
    name = ev["name"].astype(object).fillna("").astype(str)
    pid = pd.to_numeric(ev["pid"], errors="coerce").fillna(-1).astype(np.int64)
    tid = pd.to_numeric(ev["tid"], errors="coerce").fillna(-1).astype(np.int64)
    ts = np.rint(pd.to_numeric(ev["ts"], errors="coerce").to_numpy(np.float64) * 1000)
    dur = np.rint(pd.to_numeric(ev["dur"], errors="coerce").to_numpy(np.float64) * 1000)
    warnings: dict = {}
    with np.errstate(invalid="ignore"):
        bad_ts = ~(np.abs(ts) < 2**62)
        bad_dur = ~bad_ts & ~(np.abs(dur) < 2**62)
    keep = drops.skip(warnings, bad_ts, "timestamp missing, not a number or out of range")
    keep &= drops.skip(warnings, bad_dur, "duration missing, not a number or out of range")
    if not keep.any():
        raise OpprofError("XPlane with no usable events "
                          f"({drops.describe(warnings[drops.KEY])})",
                          path=path, kind=ErrorKind.NO_EVENTS)
    if not keep.all():
        ev, name, pid, tid = (x[keep].reset_index(drop=True) for x in (ev, name, pid, tid))
        args, ts, dur = args[keep].reset_index(drop=True), ts[keep], dur[keep]

    long_name = _text(args["long_name"])
    is_op = long_name.str.fullmatch(r"[^:]+:\w+")
    op_name = long_name.str.rsplit(":", n=1).str[0]
    key = name.where(~is_op, long_name)
    # TF ops: the full op name; other events with a long name (tf.data iterators): that.
    detail = pd.Series(np.where(is_op, op_name, np.where(long_name != "", long_name, NONE)),
                       dtype=object)
    root = name.str.startswith("Iterator::") & detail.isna()  # Iterator::Root has no long name
    detail = detail.where(~root, name)

    is_async = name.isin(_ASYNC) & args["kernel_type"].notna()
    async_op = _text(args["name"])
    key = key.where(~is_async, async_op + ":" + _text(args["kernel_type"]))
    detail = detail.where(~is_async, async_op)

    is_xla = _text(args["hlo_op"]) != ""
    jax = jaxplane.is_jax(name, args)
    if is_xla.any():
        if jax:
            hlo = _hlo_instructions(path, rows_of=jaxplane.module_rows)
            xla_key, xla_detail = jaxplane.xla_keys(args[is_xla], hlo)
        else:
            xla_key, xla_detail = xla_keys(args[is_xla], _hlo_instructions(path))
        key, detail = key.copy(), detail.copy()
        key.loc[is_xla] = xla_key.to_numpy(object)
        detail.loc[is_xla] = xla_detail.to_numpy(object)

    step_no = pd.to_numeric(args["step_num"], errors="coerce")
    ours = pd.to_numeric(args["opprof"], errors="coerce").notna()
    if ours.any():  # opprof's own step markers; the framework's (Keras 2's fit) are markers
        step_no = step_no.where(ours)
    is_step = step_no.notna()
    key = key.where(~is_step, "opprof.step#" + step_no.fillna(0).astype(np.int64).astype(str))
    detail = detail.where(~is_step, name)

    thread = pd.Series([threads.get(k, "") for k in zip(pid, tid, strict=True)], dtype=object)
    on_data_thread = thread.str.startswith("tf_data").to_numpy()
    key = key.where(~on_data_thread, "tf.data: " + key)

    is_call = args["tf_function_call"].notna()
    kind = np.where(is_call | is_step, "marker", "cpu_op")
    device, kind = _gpu_lanes(meta_ev, pid, thread, name, kind)
    closes_step = np.zeros(len(ev), bool)
    if jax and not is_step.any() and not is_xla.any():
        closes_step = jaxplane.call_steps(name, ts, dur)
    elif not is_step.any():
        key, closes_step = _function_steps(key, name, ts, dur, tid.to_numpy(),
                                           is_call.to_numpy())

    waits, paired = _recv_waits(name, args, ts, dur, pid)
    key = key.where(~paired, name)

    clock = ev.index[name == "opprof.clock"]
    offset = role = rank = task = None
    run: dict[str, Any] = {}
    if len(clock):
        c = args.loc[clock[0]]
        epoch = pd.to_numeric(pd.Series([c["epoch_ns"]]), errors="coerce").iloc[0]
        if pd.notna(epoch):
            offset = int(epoch) - int(ts[clock[0]])
        role = c["role"] if isinstance(c["role"], str) else None
        rank = int(c["rank"]) if pd.notna(pd.to_numeric(c["rank"], errors="coerce")) else None
        task = int(c["task"]) if pd.notna(pd.to_numeric(c["task"], errors="coerce")) else None
        run = {k: c[k] for k in _RUN_ARGS if isinstance(c[k], str)}
        for k in ("batch_size", "workers", "servers"):
            if k in run and run[k].isdigit():
                run[k] = int(run[k])
    raw = pd.DataFrame({
        "rank": 0, "role": "worker", "pid": pid, "tid": tid, "device": device,
        "ts": ts.astype(np.int64) + (offset or 0), "dur": dur.astype(np.int64),
        "name": key, "kind": kind, "bytes": np.zeros(len(ev), np.int64), "detail": detail,
        "link": np.full(len(ev), -1, np.int64), "closes_step": closes_step, "display": name,
    })
    raw = raw.assign(**_costs(path, name, op_name.where(is_op, "")))
    if len(waits):
        waits["ts"] += offset or 0
        raw = pd.concat([raw, waits], ignore_index=True)
        raw["cost_kind"] = raw["cost_kind"].fillna(0).astype(np.int8)
        raw["precision"] = raw["precision"].fillna(-1).astype(np.int8)
    return {"path": path, "raw": raw, "epoch_offset": offset, "role": role, "rank": rank,
            "task": task, "run": run, "warnings": warnings.get(drops.KEY, {}),
            "framework": "jax" if jax else "tf", "operations": bool(is_xla.any())}


def _costs(path: Path, types: pd.Series, op_names: pd.Series) -> dict[str, np.ndarray]:
    """Each event's own cost (the raw cost columns, opprof.flops.attribute): its runtime type's
    row of ``maps/tf.csv`` with the shapes of the graph op of its name, which opprof's
    TensorFlow adapter writes beside the XPlane (:mod:`opprof.flops.tensorflow`); unknown
    without that file."""
    from opprof.flops.tensorflow import costs, read_shapes

    got = costs(types.tolist(), op_names.tolist(), read_shapes(path.parent))
    return {"flops": np.asarray(got["flops"], np.float64),
            "model_flops": np.asarray(got["model_flops"], np.float64),
            "mem_bytes": np.asarray(got["mem_bytes"], np.float64),
            "precision": np.asarray(got["precision"], np.int8),
            "cost_kind": np.asarray(got["cost_kind"], np.int8)}


def _gpu_lanes(meta_ev: pd.DataFrame, pid: pd.Series, thread: pd.Series, name: pd.Series,
               kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device and kind per event: on a GPU's process (``/device:GPU:N``) its streams' events
    are kernels (copies: ``Memcpy*``) on ``cuda:N`` — an XLA kernel carries its HLO op as
    ``hlo_op``/``hlo_module`` args, classified as on the CPU — and the lines xprof derives
    from them (XLA Ops, XLA Modules, TensorFlow Ops …) are markers; every other event is the
    host's."""
    procs = {int(r.pid): str(r.args.get("name", "")) for r in
             meta_ev[meta_ev["name"] == "process_name"].itertuples() if isinstance(r.args, dict)}
    gpu = pd.Series([procs.get(int(p), "") for p in pid], dtype=object).str.extract(
        r"^/device:GPU:(\d+)$")[0]
    on_gpu = gpu.notna().to_numpy()
    if not on_gpu.any():
        return np.full(len(pid), "cpu", dtype=object), kind
    device = np.where(on_gpu, "cuda:" + gpu.fillna("").astype(str).to_numpy(object), "cpu")
    stream = on_gpu & thread.str.startswith("Stream").to_numpy()
    copy = name.str.contains("memcpy", case=False).to_numpy()
    kind = np.where(stream, np.where(copy, "memcpy", "kernel"), np.where(on_gpu, "marker", kind))
    return device, kind


def _recv_waits(name: pd.Series, args: pd.DataFrame, ts: np.ndarray, dur: np.ndarray,
                pid: pd.Series) -> tuple[pd.DataFrame, pd.Series]:
    """Receives are asynchronous: a ``_Recv`` kernel starts (``ProcessAsync::Start``), the
    thread moves on, and a ``ProcessAsync::Done`` fires when the tensor arrives. The time in
    between is communication no event spans. Pair each Start with its Done (same step_id and
    op name), take the union of the [start, done] intervals of the process, and return one
    synthesized ``_Recv`` comm event per disjoint interval on a lane of its own (tid -1);
    the paired Start/Done events become plain markers so nothing is counted twice."""
    is_recv = name.isin(_ASYNC) & args["kernel_type"].isin(_RECV_KERNELS)
    none = pd.Series(np.zeros(len(name), bool))
    if not is_recv.any():
        return pd.DataFrame(), none
    sel = pd.DataFrame({"i": np.flatnonzero(is_recv), "start": name[is_recv] == _ASYNC[0],
                        "step": _text(args["step_id"])[is_recv], "op": _text(args["name"])[is_recv],
                        "ts": ts[is_recv], "end": ts[is_recv] + dur[is_recv]})
    pairs = sel[sel["start"]].merge(sel[~sel["start"]], on=["step", "op"], suffixes=("", "_d"))
    pairs = pairs[pairs["end_d"] >= pairs["ts"]]
    pairs = pairs.sort_values("end_d").drop_duplicates("i", keep="first")
    pairs = pairs.drop_duplicates("i_d", keep="first").sort_values("ts")
    if pairs.empty:
        return pd.DataFrame(), none
    paired = none.copy()
    paired.iloc[np.concatenate([pairs["i"].to_numpy(), pairs["i_d"].to_numpy()])] = True
    lo, hi = pairs["ts"].to_numpy(), pairs["end_d"].to_numpy()
    reach = np.maximum.accumulate(hi)
    group = np.concatenate([[0], np.cumsum(lo[1:] > reach[:-1])])
    g = pd.DataFrame({"g": group, "lo": lo, "hi": hi, "op": pairs["op"].to_numpy()})
    agg = g.groupby("g").agg(lo=("lo", "min"), hi=("hi", "max"), n=("op", "size"),
                             first=("op", "first"), ops=("op", lambda o: ", ".join(o[:5])))
    n = len(agg)
    waits = pd.DataFrame({
        "rank": 0, "role": "worker", "pid": int(pid.iloc[0]), "tid": RECV_WAIT_TID,
        "device": "cpu", "ts": agg["lo"].to_numpy(np.int64),
        "dur": (agg["hi"] - agg["lo"]).to_numpy(np.int64),
        "name": (agg["first"] + ":_Recv").to_numpy(object), "kind": "comm",
        "bytes": np.zeros(n, np.int64),
        "detail": ("waiting for " + agg["n"].astype(str) + " _Recv: " + agg["ops"]).to_numpy(
            object),
        "link": np.full(n, -1, np.int64), "display": "_Recv",
    })
    return waits, paired


def _text(col: pd.Series) -> pd.Series:
    """A column of strings, missing values as empty strings."""
    return col.astype(object).where(col.notna(), "").astype(str)


def _function_steps(key: pd.Series, name: pd.Series, ts: np.ndarray, dur: np.ndarray,
                    tid: np.ndarray, is_call: np.ndarray) -> tuple[pd.Series, np.ndarray]:
    """Steps of a process without step markers, from its main training function: the
    ``tf.function`` executed most often (``EagerLocalExecute: __inference_F_N``; ties go to
    the one with more time).

    * Called from Python in this process (a custom loop's ``train_step``, Keras ``fit``'s
      ``multi_step_on_iterator``): the Python call event (``tf_function_call``) around each
      execution closes a step (returned as ``closes_step``); the step reaches back to the
      previous one's end, so it holds the loop's own work between calls: fetching the batch
      (``IteratorGetNext``), callbacks.
    * Executed remotely (a ParameterServerStrategy worker runs what the chief schedules, and
      idles in between): each execution is step marker k (time order)."""
    closes = np.zeros(len(key), bool)
    fn = name.str.extract(f"^{_REMOTE_FN.pattern}$")[0]
    if fn.isna().all():
        return key, closes
    stats = pd.DataFrame({"fn": fn, "dur": dur}).dropna().groupby("fn")["dur"].agg(
        ["size", "sum"])
    main = stats.sort_values(["size", "sum"], ascending=False).index[0]
    sel = np.flatnonzero((fn == main).to_numpy())
    order = sel[np.argsort(ts[sel], kind="stable")]
    call = _enclosing_call(ts[order], ts[order] + dur[order], tid[order], ts, dur, tid,
                           is_call)
    if (call >= 0).all():
        closes[call] = True
        return key, closes
    key = key.copy()
    key.iloc[order] = [f"opprof.step#{k}" for k in range(len(order))]
    return key, closes


def _enclosing_call(start: np.ndarray, end: np.ndarray, lane: np.ndarray, ts: np.ndarray,
                    dur: np.ndarray, tid: np.ndarray, is_call: np.ndarray) -> np.ndarray:
    """Per execution [start, end) on thread ``lane``: the index of the Python
    ``tf.function`` call event on that thread that encloses it, else -1."""
    calls = pd.DataFrame({"ts": ts[is_call], "end": ts[is_call] + dur[is_call],
                          "tid": tid[is_call], "i": np.flatnonzero(is_call)})
    if calls.empty:
        return np.full(len(start), -1, np.int64)
    ex = pd.DataFrame({"ts": start, "end_x": end, "tid": lane, "n": np.arange(len(start))})
    m = pd.merge_asof(ex.sort_values("ts"), calls.sort_values("ts"), on="ts", by="tid",
                      direction="backward")
    # merge_asof keys on the execution's start: the latest call starting at or before it
    m = m.sort_values("n")
    ok = m["i"].notna() & (m["end"] >= m["end_x"])
    return np.where(ok, m["i"].fillna(-1), -1).astype(np.int64)


def _assign_ranks(hosts: list[dict[str, Any]]) -> None:
    """Role and rank per host: from its opprof.clock marker, else its path, else file order."""
    for h in hosts:
        if h["role"] is None:
            m = next((_TASK_DIR.search(part) for part in reversed(h["path"].parts)
                      if _TASK_DIR.search(part)), None)
            h["role"] = _ROLE_OF_DIR[m.group(1)] if m else "worker"
            h["task"] = int(m.group(2)) if m else None
    workers = [h for h in hosts if h["role"] == "worker"]
    others = [h for h in hosts if h["role"] != "worker"]
    taken: set[int] = set()
    for group in (workers, others):
        for h in group:
            want = h["rank"] if h["rank"] is not None else (
                h["task"] if group is workers and h["task"] is not None else None)
            if want is None or want in taken:
                want = max(taken, default=-1) + 1
            h["rank"] = want
            taken.add(want)
    for h in hosts:
        h["raw"]["rank"] = h["rank"]
        h["raw"]["role"] = h["role"]
