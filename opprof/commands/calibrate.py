"""`opprof calibrate`: measure the gradient collective on this host (or cluster) over message
sizes and save its α–β fit as a network file for `opprof model` and `opprof whatif`."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import click
import pandas as pd
from rich.console import Console

from opprof.analysis.commmodel import Network, fit
from opprof.analysis.sharded import fit_network
from opprof.commands import echo_output, format_option
from opprof.errors import OpprofError
from opprof.files import write_atomic
from opprof.kinds import FRAMEWORKS, Collective, Framework, Mode, framework_info
from opprof.render import renderer

SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...]:
    """``4K,1M,64M`` → bytes (K, M, G are powers of 1024)."""
    from opprof.collectors.netbench import DEFAULT_SIZES

    if value is None:
        return DEFAULT_SIZES
    out = []
    for item in (v.strip().upper() for v in value.split(",") if v.strip()):
        scale = SUFFIXES.get(item[-1], 1)
        try:
            n = int(float(item[:-1] if item[-1] in SUFFIXES else item) * scale)
        except ValueError:
            raise click.BadParameter(f"{item!r}: sizes like 4K, 1M, 64M") from None
        if n < 4:
            raise click.BadParameter(f"{item!r}: at least 4 bytes (one float32)")
        out.append(n)
    if not out:
        raise click.BadParameter("give at least one size")
    return tuple(sorted(set(out)))


@click.command("calibrate")
@click.option("--fw", type=click.Choice(FRAMEWORKS), required=True,
              help="Whose collective: torch (gloo all_reduce), tf (CollectiveReduce, ring), "
                   "mxnet (kvstore push/pull).")
@click.option("--workers", type=click.IntRange(min=1), required=True)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parameter servers (mxnet).")
@click.option("--mode", type=click.Choice([Mode.ALLREDUCE.value, Mode.FSDP.value]),
              default=Mode.ALLREDUCE.value,
              show_default=True,
              help="fsdp (torch): FSDP's all-gather and reduce-scatter (each its own α–β) and "
                   "its copy, instead of DDP's all-reduce.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads per worker (default: the host's CPUs split among the processes, "
                   "as `opprof record` does).")
@click.option("--sizes", callback=parse_sizes, default=None,
              help="Message sizes, comma-separated (default 4K,16K,…,64M).")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls per size (after one warm-up call).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The network file to write (JSON).")
@format_option
def command(fw: str, workers: int, servers: int, mode: str, threads: int | None,
            sizes: tuple[int, ...], repeat: int, timeout_s: float, output: Path,
            fmt: str) -> None:
    """Time FW's gradient collective among WORKERS processes on this host over message sizes
    and fit α (latency) and β (time per byte). For torch's all-reduce, also time a compute loop
    and the collective alone and beside each other: the model's interference term.

    \b
    Example:
      opprof calibrate --fw torch --workers 2 -o net.json
      opprof calibrate --fw torch --workers 2 --mode fsdp -o fsdp-net.json
      opprof calibrate --fw mxnet --workers 2 --servers 1 --sizes 64K,1M,16M -o ps.json
    """
    from opprof.collectors import netbench

    if mode == Mode.FSDP and fw != Framework.TORCH:
        raise OpprofError(f"--mode fsdp: FSDP is PyTorch's; use --fw torch (not {fw})")
    job = netbench.Job(fw=fw, workers=workers, servers=servers, sizes=sizes, repeat=repeat,
                       threads=threads, timeout_s=timeout_s,
                       extra={"mode": str(mode)} if mode == Mode.FSDP else {})
    workdir = Path(tempfile.mkdtemp(prefix="opprof-calibrate-"))
    info = framework_info(fw)
    status = (f"calibrating {fw} {info.backend} on {workers} worker(s): "
              f"{len(sizes)} sizes × {repeat}")
    with Console(stderr=True).status(status):
        samples = netbench.run(job, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    df = pd.DataFrame(samples)
    facts = {"host": socket.gethostname(),
             "threads": threads or netbench.default_threads(fw, workers, servers),
             "repeat": repeat}
    if mode == Mode.FSDP:
        net = fsdp_network(df, workers, facts)
        write_atomic(output, json.dumps(net.to_dict(), indent=2) + "\n")
        echo_output(renderer(fmt).calibration(net), fmt)
        click.echo(f"wrote {output}", err=True)
        return
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
    write_atomic(output, json.dumps(net.to_dict(), indent=2) + "\n")
    echo_output(renderer(fmt).calibration(net), fmt)
    click.echo(f"wrote {output}", err=True)


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


def fsdp_network(df: pd.DataFrame, workers: int, info: dict) -> Network:
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
