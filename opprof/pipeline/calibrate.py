"""The calibrate pipeline: the gradient collective timed among N processes on this host (or
cluster) over message sizes, its α–β fitted (:func:`calibrate`), and the network file it is
saved as (net.json: :func:`write_network`, read back by :func:`read_network` for `opprof
model`, `opprof whatif` and `opprof bench`)."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from opprof.analysis.commmodel import Network, fit
from opprof.analysis.sharded import fit_network
from opprof.errors import ErrorKind, OpprofError
from opprof.files import write_atomic
from opprof.kinds import Collective, Framework, Mode, framework_info


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


def status_line(o: CalibrateOptions) -> str:
    """What is being measured, in one line."""
    return (f"calibrating {o.fw} {framework_info(o.fw).backend} on {o.workers} worker(s): "
            f"{len(o.sizes)} sizes × {o.repeat}")


def calibrate(o: CalibrateOptions) -> Network:
    """Time the collective ``o`` names and fit its network (see the module docstring)."""
    from opprof.collectors import netbench

    fw, workers, servers, threads = o.fw, o.workers, o.servers, o.threads
    if o.mode == Mode.FSDP and fw != Framework.TORCH:
        raise OpprofError(f"--mode fsdp: FSDP is PyTorch's; use --fw torch (not {fw})")
    info = framework_info(fw)
    job = netbench.Job(fw=fw, workers=workers, servers=servers, sizes=o.sizes,
                       repeat=o.repeat, threads=threads, timeout_s=o.timeout_s,
                       extra={"mode": str(o.mode)} if o.mode == Mode.FSDP else {})
    workdir = Path(tempfile.mkdtemp(prefix="opprof-calibrate-"))
    samples = netbench.run(job, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    df = pd.DataFrame(samples)
    facts = {"host": socket.gethostname(),
             "threads": threads or netbench.default_threads(fw, workers, servers),
             "repeat": o.repeat}
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
    """The ``fsdp`` network of FSDP's timed collectives and copy (a call's time: the mean
    over the workers, as for the all-reduce)."""
    df = df.assign(call=df.groupby(["rank", "kind", "bytes"]).cumcount())
    calls = df.groupby(["kind", "bytes", "call"], as_index=False)["ns"].mean()
    copy = calls[calls["kind"] == "copy"]
    big = copy[copy["bytes"] >= 1 << 20]
    rate = float((big["ns"] / big["bytes"]).median()) if len(big) else None
    net = fit_network(calls[calls["kind"] != "copy"], workers, rate, source="calibrate",
                      framework="torch",
                      backend="gloo all_gather_into_tensor / reduce_scatter_tensor")
    net.info.update(info)
    return net
