"""The calibrate pipeline: the gradient collective timed among N processes on this host (or
cluster) over message sizes, its α–β fitted (:func:`calibrate`), and the network file it is
saved as (net.json: :func:`write_network`, read back by :func:`read_network` for `opprof
model`, `opprof whatif` and `opprof bench`). For torch's all-reduce, also the collectives a
model-parallel step blocks in, timed as the step calls them (``info.in_step``:
:func:`opprof.model.instep.fit_in_step`)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from opprof.errors import ErrorKind, OpprofError
from opprof.files import write_atomic
from opprof.kinds import Collective, Framework, Mode, framework_info
from opprof.model.colocation import fit_loop, slowdowns
from opprof.model.commmodel import Network, fit
from opprof.model.instep import fit_in_step
from opprof.model.sharded import fit_network

#: The model whose training step the co-location loop times by default: small, so that many
#: interleaved rounds fit in a few seconds (``--model`` names the user's).
DEFAULT_COLOCATION_MODEL = "lenet5"
DEFAULT_BATCH = 32

@dataclass(frozen=True)
class CalibrateOptions:
    """What `opprof calibrate` is asked for."""

    fw: str
    workers: int
    sizes: tuple[int, ...]
    servers: int = 1
    mode: str = Mode.ALLREDUCE.value  # or fsdp (torch): all-gather and reduce-scatter
    threads: int | None = None
    repeat: int = 5
    timeout_s: float = 600.0
    #: --mode fsdp: time the FSDP units of this built-in model or `.trace` (:func:`unit_sizes`)
    #: instead of ``sizes``
    units: str | None = None
    #: co-location: the built-in model (or a `.trace`, its model and batch) whose training step
    #: the loop times alone and on k workers at once, its batch, and the loop's rounds (0: none)
    model: str = DEFAULT_COLOCATION_MODEL
    batch_size: int | None = None
    colocation_rounds: int = 8


def status_line(o: CalibrateOptions) -> str:
    """What is being measured, in one line."""
    sizes = f"{o.units}'s FSDP units" if o.units else f"{len(o.sizes)} sizes"
    coloc = (f", then co-location: {Path(o.model).name}'s step alone and on 2…{o.workers} "
             f"workers at once × {o.colocation_rounds} rounds"
             if o.colocation_rounds > 0 and o.workers > 1 else "")
    return (f"calibrating {o.fw} {framework_info(o.fw).backend} on {o.workers} worker(s): "
            f"{sizes} × {o.repeat}{coloc}")


def calibrate(o: CalibrateOptions) -> Network:
    """Time the collective ``o`` names and fit its network (see the module docstring)."""
    from opprof.collectors import netbench

    fw, workers, servers, threads = o.fw, o.workers, o.servers, o.threads
    if o.mode == Mode.FSDP and fw != Framework.TORCH:
        raise OpprofError(f"--mode fsdp: FSDP is PyTorch's; use --fw torch (not {fw})")
    info = framework_info(fw)
    sizes = o.sizes
    if o.units is not None:
        if o.mode != Mode.FSDP:
            raise OpprofError("--units: the FSDP units' sizes are for --mode fsdp")
        sizes = unit_sizes(o.units)
    extra: dict[str, Any] = {"mode": str(o.mode)} if o.mode == Mode.FSDP else {}
    loop = colocation_loop(o)
    if loop is not None:
        extra["colocation"] = loop
    job = netbench.Job(fw=fw, workers=workers, servers=servers, sizes=sizes,
                       repeat=o.repeat, threads=threads, timeout_s=o.timeout_s, extra=extra)
    workdir = Path(tempfile.mkdtemp(prefix="opprof-calibrate-"))
    samples = netbench.run(job, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    df = pd.DataFrame(samples)
    facts: dict[str, Any] = {"host": socket.gethostname(),
                             "threads": threads or netbench.default_threads(fw, workers, servers),
                             "repeat": o.repeat}
    if "kind" in df and (df["kind"] == "coloc").any():
        facts["colocation"] = colocation_info(df[df["kind"] == "coloc"], loop or {})
        df = df[df["kind"] != "coloc"].reset_index(drop=True)
    if "kind" in df and (df["kind"] == "input").any():
        facts["distributed_input"] = distributed_input(df[df["kind"] == "input"], loop or {})
        df = df[df["kind"] != "input"].reset_index(drop=True)
    if "kind" in df:
        instep = df["kind"].astype(str).str.startswith("in_step_").to_numpy()
        if instep.any():  # calls after a compute burst, as a model-parallel step makes them
            facts["in_step"] = fit_in_step(df[instep], workers)
            df = df[~instep].reset_index(drop=True)
    if o.mode == Mode.FSDP:
        return fsdp_network(df, workers, facts)
    if "kind" in df and (df["kind"] == "beside").any():
        facts["interference"], facts["comm_interference"] = interference(df)
        df = df[~df["kind"].isin(["alone", "beside", "collective_beside"])]
    if "kind" in df:
        pack = df[df["kind"] == "pack"]
        big = pack[pack["bytes"] >= 1 << 20]
        if len(big):  # a copy: time per byte, from the sizes where per-call overhead is small
            facts["pack_ns_per_byte"] = float((big["ns"] / big["bytes"]).median())
        df = df[df["kind"] != "pack"]
    # A call's time: the mean over the workers (each timed the same call after a barrier).
    df["call"] = df.groupby(["rank", "bytes"]).cumcount()
    calls = df.groupby(["bytes", "call"], as_index=False)["ns"].mean()
    net = fit(calls, info.collective, workers, servers, source="calibrate",
              framework=fw, backend=info.backend, info=facts)
    if net.collective == Collective.PS:
        net.servers = servers
    if not net.beta_ns_per_byte and not net.alpha_ns:
        raise OpprofError(f"calibrate {fw}: the fit found neither latency nor bandwidth")
    return net


def colocation_loop(o: CalibrateOptions) -> dict[str, Any] | None:
    """What the co-location loop runs (None: ``colocation_rounds`` 0, or one worker): the
    model and batch of ``o.model`` — a built-in model, or a recorded `.trace`'s (its
    metadata's ``model`` and ``batch_size``; ``o.batch_size`` wins) — and the rounds."""
    if o.colocation_rounds <= 0 or o.workers < 2:
        return None
    model, batch = o.model, o.batch_size
    path = Path(o.model)
    if path.suffix == ".trace" or path.exists():
        from opprof.trace import TraceFile

        if not path.is_file():
            raise OpprofError("no such file (--model: a built-in model or a recorded .trace)",
                              path=path, kind=ErrorKind.MISSING)
        meta = TraceFile(path).meta
        if not meta.get("model"):
            raise OpprofError("names no built-in model in its metadata; give --model MODEL",
                              path=path)
        model, batch = str(meta["model"]), batch or meta.get("batch_size")
    from opprof.collectors.config import canonical_name

    return {"model": canonical_name(model), "batch_size": int(batch or DEFAULT_BATCH),
            "rounds": o.colocation_rounds}


def distributed_input(samples: pd.DataFrame, loop: dict[str, Any]) -> dict[str, Any]:
    """The network file's ``info.distributed_input`` (TensorFlow's
    ``MultiWorkerMirroredStrategy``: :func:`opprof.collectors.netbench._tf_input`): ``ns``,
    what its distributed dataset adds to a step — per round the median step fed through it
    less the median step fed by the dataset itself (every worker's steps but each phase's
    first), the median over the rounds, at least 0 — and those medians, the rounds' own
    differences and the loop's model and batch."""
    s = samples.copy()
    s["index"] = s.groupby(["rank", "round", "variant"]).cumcount()
    med = s[s["index"] > 0].groupby(["round", "variant"])["ns"].median().unstack()
    rounds = (med["distributed"] - med["plain"]).dropna()
    return {"ns": max(0.0, float(rounds.median())) if len(rounds) else 0.0,
            "plain_ns": float(med["plain"].median()),
            "distributed_ns": float(med["distributed"].median()),
            "rounds_ns": [float(x) for x in rounds], "model": loop.get("model"),
            "batch_size": loop.get("batch_size")}


def colocation_info(samples: pd.DataFrame, loop: dict[str, Any]) -> dict[str, Any]:
    """The network file's ``info.colocation``: ``slowdown`` (k → s(k): the median over the
    rounds of each round's ratio of the k-worker phase's median step to the one-worker phase's,
    less 1; :mod:`opprof.model.colocation`), each round's ratios, ``cpu_slowdown`` (the
    same of the steps' CPU time: the contention for caches and memory without the scheduler's
    share of the cores, which the wall time holds too), the median step alone and
    with k at once, the loop's model, batch, rounds and seconds per phase, this host's CPUs
    and its load average when the loop ended."""
    from opprof.collectors.netbench import PHASE_S

    ratios = fit_loop(samples)
    med = samples[samples["index"] > 0].groupby("k")["ns"].median()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = slowdowns(fit_loop(samples, "cpu_ns")) if "cpu_ns" in samples else {}
    return {"slowdown": {str(k): v for k, v in slowdowns(ratios).items()},
            "ratios": {str(k): v for k, v in ratios.items()},
            "cpu_slowdown": {str(k): v for k, v in cpu.items()},
            "alone_ns": float(med.get(1, float("nan"))),
            "together_ns": {str(int(k)): float(v) for k, v in med.items() if int(k) > 1},
            "model": loop.get("model"), "batch_size": loop.get("batch_size"),
            "rounds": int(samples["round"].nunique()), "seconds_per_phase": PHASE_S,
            "cpus": cpus, "load_average": round(os.getloadavg()[0], 2)}


def unit_sizes(spec: str) -> tuple[int, ...]:
    """The distinct unsharded bytes of the FSDP units of ``spec``: a `.trace` (its units,
    :func:`opprof.model.sharded.unit_bytes`) or a built-in model, sharded as `opprof record
    --mode fsdp` shards it (with the default dataset's classes)."""
    from opprof.model.sharded import unit_bytes

    path = Path(spec)
    if path.suffix == ".trace" or path.exists():
        from opprof.loader import load

        units = [int(n) for n in unit_bytes(load(path))[0]]
        if not units:
            raise OpprofError("names no FSDP units (no unit_param_bytes in its metadata and no "
                              "FSDP all-gathers)", path=path)
    else:
        from opprof.collectors.config import is_sequence_model
        from opprof.collectors.datasets import TOKEN_VOCAB
        from opprof.collectors.torch_models import build, unit_param_bytes

        units = unit_param_bytes(build(spec, TOKEN_VOCAB if is_sequence_model(spec) else 10))
    return tuple(sorted({n for n in units if n >= 4}))


def write_network(net: Network, path: Path) -> None:
    """Save a network file (net.json) atomically."""
    write_atomic(path, json.dumps(net.to_dict(), indent=2) + "\n")


def read_network(path: Path | None) -> Network | None:
    """A network file written by :func:`write_network` (None: none given)."""
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise OpprofError("no such file", path=path, kind=ErrorKind.MISSING) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpprofError(f"not JSON ({exc}); write one with `opprof calibrate`",
                          path=path, kind=ErrorKind.NOT_A_TRACE) from None
    return Network.from_dict(doc, str(path))


def interference(df: pd.DataFrame) -> tuple[float, float]:
    """How much slower the compute loop ran beside the collective than alone, and the
    collective beside the loop than alone (its timed calls of the same size): the median of
    each per worker, the median over workers, at least 0."""
    kind = df["kind"].fillna("collective") if "kind" in df else pd.Series("collective", df.index)
    per = df.assign(kind=kind).groupby(["rank", "kind"])["ns"].median()

    def slower(a: str, b: str) -> float:
        if a not in per.index.get_level_values("kind") or b not in \
                per.index.get_level_values("kind"):
            return 0.0
        ratio = (per.xs(a, level="kind") / per.xs(b, level="kind")).dropna()
        return max(0.0, float(ratio.median()) - 1.0) if len(ratio) else 0.0

    beside = df[kind == "collective_beside"]
    alone = df[(kind == "collective") & df["bytes"].isin(beside["bytes"].unique())]
    both = pd.concat([alone.assign(kind="collective"), beside.assign(kind="collective_beside")])
    per_coll = both.groupby(["rank", "kind"])["ns"].median()
    comm = 0.0
    if {"collective", "collective_beside"} <= set(per_coll.index.get_level_values("kind")):
        r = (per_coll.xs("collective_beside", level="kind")
             / per_coll.xs("collective", level="kind")).dropna()
        comm = max(0.0, float(r.median()) - 1.0) if len(r) else 0.0
    return slower("beside", "alone"), comm


def fsdp_network(df: pd.DataFrame, workers: int, info: dict[str, Any]) -> Network:
    """The ``fsdp`` network of FSDP's timed collectives (:func:`fsdp_calls`): each size's time
    is the mean of its calls (the scheduler's rare long wake-ups are part of what FSDP pays
    per call, so not a median); FSDP's copies are inside those times (``copy_ns_per_byte``
    0); ``info`` adds the mean wait per call for the last rank (``wait_ns``) and the spread of
    the ranks' exits (``exit_spread_ns``), which the model's wait at the next collective
    adds to each compute segment's own, and what an optimizer's call on FSDP's sharded
    parameters costs beyond the same call on their local shards (``sharded_op_ns``: the
    median over rounds and ranks of the difference, 0 where it came out below)."""
    kind = df["kind"] if "kind" in df else pd.Series("", df.index)
    ops = df[kind.isin(["sharded_op", "local_op"]).to_numpy()]
    df = df[~kind.isin(["sharded_op", "local_op"]).to_numpy()]
    calls, spread = fsdp_calls(df)
    net = fit_network(calls, workers, 0.0, "mean", source="calibrate", framework="torch",
                      backend="gloo all_gather_single / reduce_scatter_single, with FSDP's "
                              "copies, after compute")
    net.info.update(info)
    net.info.update({"copies": "inside the collectives' times",
                     "wait_ns": float(calls["wait_ns"].mean()), "exit_spread_ns": spread,
                     "calls": int(len(calls))})
    if len(ops):
        per = ops.assign(round=ops.groupby(["rank", "kind"]).cumcount()) \
            .pivot_table(index=["rank", "round"], columns="kind", values="ns")
        if {"sharded_op", "local_op"} <= set(per.columns):
            extra = float((per["sharded_op"] - per["local_op"]).median())
            net.info["sharded_op_ns"] = max(0.0, extra)
    return net


def fsdp_calls(df: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """Each timed FSDP call (kind, bytes) once: ``ns``, what it took after the last rank
    entered it (exit − the latest enter over the ranks, the mean over the ranks: the wait
    for that rank is the model's straggler term, not the collective's cost) and
    ``wait_ns``, the mean wait for that rank; and the ranks' exits' spread (the pooled
    standard deviation of one rank's exit about the call's mean exit, ns)."""
    df = df.assign(call=df.groupby(["rank", "kind", "bytes"]).cumcount())
    g = df.groupby(["kind", "bytes", "call"])
    last = g["enter"].transform("max")
    df = df.assign(ns=df["exit"] - last, wait_ns=last - df["enter"],
                   dev=df["exit"] - g["exit"].transform("mean"))
    calls = df.groupby(["kind", "bytes", "call"], as_index=False)[["ns", "wait_ns"]].mean()
    free = len(df) - len(calls)
    spread = float(((df["dev"].astype(float) ** 2).sum() / free) ** 0.5) if free > 0 else 0.0
    return calls, spread
