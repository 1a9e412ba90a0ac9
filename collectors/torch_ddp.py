"""Distributed PyTorch recording: one process per rank with torch.distributed and
DistributedDataParallel (gloo on CPU, nccl on GPU), each profiled like a single run.

:func:`record` (called by the torch collector for ``--mode allreduce``) starts this node's
ranks as ``python -m opprof.collectors.torch_ddp`` processes, each in its own process group,
watches them, and returns their traces ``rank{R}.pt.trace.json`` for the Kineto normalizer,
which takes the rank from the ``distributedInfo`` torch writes (the process group is
initialised before profiling starts). Every rank trains on its own shard of the data
(DistributedSampler) and follows :func:`opprof.collectors.torch.run_protocol`.

Rendezvous is torchrun-style, in ``RecordConfig.extra``: ``master_addr`` (default
127.0.0.1), ``master_port`` (default 0: a free port picked at run time), ``nnodes`` and
``node_rank``. Node 0's ``opprof record`` hosts the rendezvous store on a socket bound to
``master_addr`` only; on more than one node run the same command on every host with
``--nnodes N --node-rank K --master-addr ADDR --master-port PORT``; ``--workers`` is the whole
job's rank count, split evenly over the nodes, and each node writes the traces of its own
ranks (``opprof import`` their ``.native`` folders together for the whole job). With a
loopback master the ranks' gloo sockets are pinned to loopback (``GLOO_SOCKET_IFNAME=lo``).

A rank that exits with an error or a signal, or a run that passes ``config.timeout_s``, stops
every rank (their whole process groups) and raises one OpprofError naming the rank and what
happened; traces already written and each rank's log (``rank{R}.log``) stay in the folder.

**Clock alignment.** Ranks on different hosts read different clocks. Just before profiling,
each rank r > 0 exchanges ``CLOCK_ROUNDS`` NTP-style pings with rank 0 over gloo: r sends at
t0 (its clock), rank 0 receives at t1 and replies at t2 (rank 0's clock), r receives the reply
at t3. Whatever the one-way delays, the offset θ = clock₀ − clock_r lies in
[t2 − t3, t1 − t0]; the estimate is the midpoint of the round with the smallest round-trip
delay δ = (t3 − t0) − (t2 − t1), and its error bound is δ / 2 (a strict bound as long as the
clocks do not drift apart during the round; drift over the profiled seconds afterwards is
not corrected, ~10 µs per second for a 10 ppm clock). Ranks on the machine of rank 0 (same
kernel boot id, so the very same clock) get offset 0 and error 0; the measured value is kept
as a check. ``extra["clock_sync"]``: ``auto`` (that rule), ``always`` (apply the measured
offsets to every rank), ``off``. The offsets go into ``meta["clock_offsets_ns"]`` (rank →
ns to add to that rank's timestamps), the bounds into ``meta["clock_error_ns"]``, and into
each trace file as a top-level ``opprofClock`` object, so the normalizer applies them also
when the native files are imported later.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from opprof.errors import OpprofError
from opprof.files import write_atomic

from . import Progress, RecordConfig, Recording, native_stderr_to, no_progress
from .launch import describe_exit, die_with_parent, last_line, stop

CLOCK_ROUNDS = 10
CLOCK_METHOD = (f"NTP-style: {CLOCK_ROUNDS} ping rounds from each rank to rank 0 over gloo "
                "just before profiling; midpoint of the min-delay round, error = delay/2; "
                "offset 0 for ranks on rank 0's machine")
ERROR_PREFIX = "opprof rank error: "
_STAGES = ("start", "warmup", "timing", "clock", "profile", "done")
_POLL_S = 0.05


def rank_log(rank: int) -> str:
    """The file a rank's stdout and stderr go to."""
    return f"rank{rank}.log"


def rank_meta_name(rank: int) -> str:
    """The per-rank facts (JSON); not named ``.json`` so that importing the folder only finds
    traces."""
    return f"rank{rank}.meta"


def rendezvous(config: RecordConfig) -> dict[str, Any]:
    """The rendezvous settings from ``config.extra`` with their defaults, checked."""
    x = config.extra
    rv = {"master_addr": str(x.get("master_addr") or "127.0.0.1"),
          "master_port": int(x.get("master_port") or 0),
          "nnodes": int(x.get("nnodes") or 1), "node_rank": int(x.get("node_rank") or 0)}
    if rv["nnodes"] < 1 or not 0 <= rv["node_rank"] < rv["nnodes"]:
        raise OpprofError(f"--node-rank {rv['node_rank']} must be in 0..{rv['nnodes'] - 1} "
                          f"(--nnodes {rv['nnodes']})")
    if config.workers % rv["nnodes"]:
        raise OpprofError(f"--workers {config.workers} (the whole job's ranks) must split "
                          f"evenly over --nnodes {rv['nnodes']}")
    if rv["nnodes"] > 1 and not rv["master_port"]:
        raise OpprofError("--nnodes > 1 needs --master-port (the same on every node)")
    if not 0 <= rv["master_port"] < 65536:
        raise OpprofError(f"--master-port {rv['master_port']} is not a TCP port")
    return rv


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        return False


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Run this node's ranks, wait for them (stopping all on the first failure or at the
    time limit), and return their traces with the job's metadata."""
    rv = rendezvous(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + config.timeout_s
    world = config.workers
    per_node = world // rv["nnodes"]
    ranks = list(range(rv["node_rank"] * per_node, (rv["node_rank"] + 1) * per_node))
    store = _store(rv, config.timeout_s, workdir)
    port = store.port
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = config.threads or max(1, (cpus or 1) // per_node)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    if _is_loopback(rv["master_addr"]):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cfg = json.dumps(asdict(config))
    procs: dict[int, subprocess.Popen] = {}
    try:
        for i, r in enumerate(ranks):
            cmd = [sys.executable, "-m", "opprof.collectors.torch_ddp", "--rank", str(r),
                   "--local-rank", str(i), "--world", str(world), "--threads", str(threads),
                   "--master", f"{rv['master_addr']}:{port}", "--workdir", str(workdir),
                   "--seconds", f"{max(deadline - time.monotonic(), 1.0):.1f}",
                   "--config", cfg]
            with open(workdir / rank_log(r), "wb") as log:
                procs[r] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True, preexec_fn=die_with_parent)
        _watch(procs, store, workdir, deadline, config.timeout_s, progress)
        if rv["node_rank"] == 0 and rv["nnodes"] > 1:
            _await_other_nodes(store, world, deadline, config.timeout_s)
    finally:
        stop(procs.values(), grace_s=3.0)
        del store
    metas = [json.loads((workdir / rank_meta_name(r)).read_text()) for r in ranks]
    return Recording(native=[Path(m.pop("trace")) for m in metas],
                     meta=job_meta(config, rv, port, metas))


def _store(rv: dict[str, Any], timeout_s: float, workdir: Path) -> Any:
    """The rendezvous store: hosted here on node 0 (on a socket bound to master_addr only,
    port 0 picking a free one), a client of node 0's elsewhere."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=timeout_s)
    addr = rv["master_addr"]
    if rv["node_rank"] != 0:
        try:
            with native_stderr_to(workdir / "rendezvous.log"):  # c10d's retry messages
                return TCPStore(addr, rv["master_port"], None, False, timeout=timeout)
        except RuntimeError as exc:  # torch's DistStoreError / DistNetworkError
            raise OpprofError(
                f"node {rv['node_rank']}: cannot reach the rendezvous at {addr}:"
                f"{rv['master_port']} within {timeout_s:g}s (is node 0's `opprof record` "
                f"running?): {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            ) from None
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((addr, rv["master_port"]))
    except OSError as exc:
        listener.close()
        raise OpprofError(f"--master-addr {addr} --master-port {rv['master_port']}: cannot "
                          f"listen there ({exc.strerror or exc})") from None
    listener.listen(128)
    port = listener.getsockname()[1]
    try:
        store = TCPStore(addr, port, None, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now and closes it when it goes
    return store


def _progress_of(store: Any, rank: int) -> tuple[str, int, int]:
    key = f"opprof/progress/{rank}"
    try:
        if not store.check([key]):
            return ("start", 0, 0)
        stage, done, total = store.get(key).decode().split()
    except (RuntimeError, ValueError):  # node 0's store is gone (its job is over)
        return ("start", 0, 0)
    return (stage, int(done), int(total))


def _await_other_nodes(store: Any, world: int, deadline: float, timeout_s: float) -> None:
    """Node 0 hosts the store: keep it up until every rank of every node is done."""
    while True:
        left = [r for r in range(world) if _progress_of(store, r)[0] != "done"]
        if not left:
            return
        if time.monotonic() > deadline:
            raise OpprofError(
                f"torch DDP: rank(s) {', '.join(map(str, left))} on other nodes did not finish "
                f"within {timeout_s:g}s (--timeout); see those nodes' logs")
        time.sleep(_POLL_S * 4)


def _order(p: tuple[str, int, int]) -> tuple[int, int]:
    return (_STAGES.index(p[0]) if p[0] in _STAGES else 0, p[1])


def _watch(procs: dict[int, subprocess.Popen], store: Any, workdir: Path, deadline: float,
           timeout_s: float, progress: Progress) -> None:
    """Wait for every rank; raise on the first failure or at the deadline."""
    first = min(procs)
    shown: tuple[str, int, int] | None = None
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        failed = [r for r, c in codes.items() if c not in (None, 0)]
        if failed:
            raise OpprofError(_failure(failed, codes, store, workdir))
        if all(c == 0 for c in codes.values()):
            return
        if time.monotonic() > deadline:
            running = [r for r, c in codes.items() if c is None]
            where = {r: _progress_of(store, r) for r in running}
            hung = min(running, key=lambda r: (_order(where[r]), r))
            rest = ", ".join(f"rank {r} in {_fmt(where[r])}" for r in running if r != hung)
            raise OpprofError(
                f"torch DDP: rank {hung} hung in {_fmt(where[hung])} and the run passed its "
                f"{timeout_s:g}s limit (--timeout); stopped all ranks"
                + (f" ({rest})" if rest else "") + f"; logs in {workdir}")
        p = _progress_of(store, first)
        if p != shown and p[0] in ("warmup", "timing", "profile"):
            progress(*p)
            shown = p
        time.sleep(_POLL_S)


def _fmt(p: tuple[str, int, int]) -> str:
    if p[0] in ("start", "clock", "done"):
        return {"start": "start-up", "clock": "clock sync", "done": "shut-down"}[p[0]]
    return f"{p[0]} ({p[1]}/{p[2]} steps done)"


def _failure(failed: list[int], codes: dict[int, int | None], store: Any,
             workdir: Path) -> str:
    """One line naming the rank that failed first and how. A rank whose peer died fails too,
    with a communication error; so a rank that died without an error of its own (exit,
    signal) is named first, then one with its own error, then one that lost a peer."""
    own = {r: _own_error(workdir / rank_log(r)) for r in failed}
    peer = ("connection closed", "connection reset", "broken pipe", "peer", "timed out",
            "timeout", "socket", "nccl")

    def suspicion(r: int) -> tuple[int, int]:
        if own[r] is None:
            return (0, r)
        return (2 if any(w in own[r].lower() for w in peer) else 1, r)

    r = min(failed, key=suspicion)
    code = codes[r] or 0
    how = describe_exit(code)
    why = own[r] if own[r] is not None else last_line(workdir / rank_log(r))
    return (f"torch DDP: rank {r} {how} during {_fmt(_progress_of(store, r))}"
            + (f": {why}" if why else "")
            + f"; stopped the other ranks (log: {workdir / rank_log(r)})")


def _own_error(log: Path) -> str | None:
    """The error line the rank printed itself (None: it died without one)."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    mine = [ln[len(ERROR_PREFIX):].strip() for ln in text if ln.startswith(ERROR_PREFIX)]
    return mine[-1] if mine else None


def job_meta(config: RecordConfig, rv: dict[str, Any], port: int,
             metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's metadata from its ranks' facts."""
    per_rank_keys = ("rank", "host", "pid", "unprofiled_step_ns", "profiled_wall_ns", "threads",
                     "clock")
    meta = {k: v for k, v in metas[0].items() if k not in per_rank_keys}
    steps = [m["unprofiled_step_ns"] for m in metas if m.get("unprofiled_step_ns")]
    step_ns = int(sum(steps) / len(steps)) if steps else None
    clocks = {str(m["rank"]): m["clock"] for m in metas}
    meta.update({
        "workers": config.workers, "servers": 0, "mode": "allreduce",
        "hosts": sorted({m["host"] for m in metas}),
        "nnodes": rv["nnodes"], "node_rank": rv["node_rank"],
        "master": f"{rv['master_addr']}:{port}",
        "unprofiled_step_ns": step_ns,
        "samples_per_s": (config.workers * config.batch_size / (step_ns / 1e9)
                          if step_ns else None),
        "profiled_wall_ns": max(m["profiled_wall_ns"] for m in metas),
        "threads": metas[0]["threads"],
        "clock_offsets_ns": {r: c["offset_ns"] for r, c in clocks.items()},
        "clock_error_ns": {r: c["error_ns"] for r, c in clocks.items()},
        "clock_sync": {"method": CLOCK_METHOD, "policy": config.extra.get("clock_sync", "auto"),
                       "measured_offsets_ns": {r: c["measured_offset_ns"]
                                               for r, c in clocks.items()},
                       "measured_error_ns": {r: c["measured_error_ns"]
                                             for r, c in clocks.items()},
                       "machines": {r: c["machine"] for r, c in clocks.items()}},
        "per_rank": [{k: m[k] for k in per_rank_keys if k != "clock"} for m in metas],
        "command": config.command,
    })
    return meta


# ---------------------------------------------------------------- inside one rank process


def machine_id() -> str:
    """What identifies this machine's clock: the kernel's boot id (containers on one host
    share it), else the host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def clock_sync(rank: int, world: int, group: Any, policy: str = "auto") -> dict[str, Any]:
    """Estimate this rank's clock offset to rank 0 (see the module docstring) and decide the
    offset to apply. Every rank must call it."""
    import torch
    import torch.distributed as dist

    machines: list[Any] = [None] * world
    dist.all_gather_object(machines, machine_id(), group=group)
    measured, error = 0, 0
    if rank == 0:
        for peer in range(1, world):
            for _ in range(CLOCK_ROUNDS):
                dist.recv(torch.zeros(1, dtype=torch.int64), src=peer, group=group)
                t1 = time.time_ns()
                dist.send(torch.tensor([t1, time.time_ns()], dtype=torch.int64), dst=peer,
                          group=group)
    else:
        best = None
        for _ in range(CLOCK_ROUNDS):
            reply = torch.zeros(2, dtype=torch.int64)
            t0 = time.time_ns()
            dist.send(torch.zeros(1, dtype=torch.int64), dst=0, group=group)
            dist.recv(reply, src=0, group=group)
            t3 = time.time_ns()
            t1, t2 = (int(v) for v in reply)
            delay = (t3 - t0) - (t2 - t1)
            if best is None or delay < best[0]:
                best = (delay, ((t1 - t0) + (t2 - t3)) // 2)
        assert best is not None
        error, measured = (best[0] + 1) // 2, best[1]
    same = machines[rank] == machines[0]
    apply = policy == "always" or (policy == "auto" and not same)
    return {"offset_ns": measured if apply else 0, "error_ns": error if apply else 0,
            "measured_offset_ns": measured, "measured_error_ns": error,
            "machine": machines[rank], "same_machine_as_rank0": same}


def stamp_clock(trace: Path, clock: dict[str, Any]) -> None:
    """Put the clock offset into the trace file as a top-level ``opprofClock`` object (the
    file is otherwise untouched; no parse of the whole document)."""
    data = trace.read_bytes()
    i = data.index(b"{")
    head = b'{"opprofClock": ' + json.dumps(clock).encode() + b","
    write_atomic(trace, head + data[i + 1:])


def run_rank(config: RecordConfig, rank: int, local_rank: int, world: int, master: str,
             workdir: Path, seconds: float, threads: int) -> None:
    """One rank: join the process group, train on its shard under the profiler, write its
    trace (with its clock offset) and ``rank{R}.meta``."""
    import torch
    import torch.distributed as dist

    from . import torch as tc

    deadline = time.monotonic() + seconds
    torch.set_num_threads(threads)
    addr, port = master.rsplit(":", 1)
    timeout = timedelta(seconds=max(seconds, 1.0))
    store = dist.TCPStore(addr.strip("[]"), int(port), None, False, timeout=timeout)

    def progress(stage: str, done: int, total: int) -> None:
        store.set(f"opprof/progress/{rank}", f"{stage} {done} {total}")

    cuda = config.device.startswith("cuda")
    if cuda:
        device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("pg", store),
                            rank=rank, world_size=world, timeout=timeout)
    ping = dist.new_group(backend="gloo") if cuda else None
    training = tc.build_training(config, device, rank=rank, world=world)
    step = _inject_failure(training.step, config, rank)
    clock: dict[str, Any] = {}

    def before_profile() -> None:
        progress("clock", 0, 1)
        clock.update(clock_sync(rank, world, ping, str(config.extra.get("clock_sync", "auto"))))
        dist.barrier()

    run = tc.run_protocol(config, step, device, workdir, progress, rank=rank,
                          deadline=deadline, before_profile=before_profile)
    dist.barrier()  # no rank tears the group down while another still exports
    stamp_clock(run.trace, {k: clock[k] for k in ("offset_ns", "error_ns")})
    meta = tc.rank_meta(config, training, run, device)
    meta.update({"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
                 "backend": dist.get_backend(), "clock": clock, "trace": str(run.trace)})
    write_atomic(workdir / rank_meta_name(rank), json.dumps(meta, indent=1))
    progress("done", 1, 1)
    dist.destroy_process_group()


def _inject_failure(step: Any, config: RecordConfig, rank: int) -> Any:
    """Test hook: ``extra["fail_rank"] = R`` makes rank R exit with code 3 (or hang, with
    ``extra["fail_how"] = "hang"``) after its first training step."""
    if config.extra.get("fail_rank") is None or int(config.extra["fail_rank"]) != rank:
        return step
    how = config.extra.get("fail_how", "exit")
    calls = [0]

    def failing_step() -> None:
        step()
        calls[0] += 1
        if calls[0] == 1:
            if how == "hang":
                while True:
                    time.sleep(3600)
            os._exit(3)

    return failing_step


def main(argv: list[str] | None = None) -> None:
    """The entry point of one rank process (started by :func:`record`)."""
    ap = argparse.ArgumentParser(prog="python -m opprof.collectors.torch_ddp")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--local-rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--master", required=True, help="ADDR:PORT of the rendezvous store")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--seconds", type=float, required=True, help="time left for this rank")
    ap.add_argument("--config", required=True, help="RecordConfig as JSON")
    a = ap.parse_args(argv)
    try:
        config = RecordConfig(**json.loads(a.config))
        run_rank(config, a.rank, a.local_rank, a.world, a.master, a.workdir, a.seconds,
                 a.threads)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line for the parent
        traceback.print_exc()
        text = str(exc).strip().splitlines()
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os._exit(2 if isinstance(exc, OpprofError) else 1)


if __name__ == "__main__":
    main()
