"""Run an MXNet parameter-server job — one scheduler, M servers, N workers, each a separate
process — and collect every rank's profiler trace.

Each process is ``python -m opprof.collectors.mxnet_ps`` with MXNet's DMLC environment
(``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` / ``DMLC_PS_ROOT_PORT``, ``DMLC_NUM_SERVER``,
``DMLC_NUM_WORKER``, ``DMLC_NODE_HOST``). Schedulers and servers run inside ``import mxnet``
(MXNet's design) and exit when the job ends; workers run
:func:`opprof.collectors.mxnet.run_worker` with a ``dist_sync`` / ``dist_async`` kvstore.
Worker rank 0 turns on the servers' profiler through the kvstore, so every server writes
``rankK_server.json`` into the run folder (its working directory).

By default the whole job runs on this machine over loopback (127.0.0.1, a free port). A job
spread over several machines runs the same ``opprof record`` on each, with the rendezvous
options ``opprof record`` puts into ``RecordConfig.extra``: ``nnodes`` (machines),
``node_rank`` (this one's index; machine 0 runs the scheduler), ``master_addr`` /
``master_port`` (the scheduler's address, the same everywhere). The job's workers and
servers are shared out over the machines (the first ``workers % nnodes`` machines take one
more); each machine keeps the traces of its own ranks. Finer control, also in ``extra``:
``local_workers``, ``local_servers``, ``scheduler`` (run it here or not) and ``node_host``
(this machine's address as the others reach it; MXNet's ps-lite picks an interface when it
is not given and the job is not on loopback).

Every process has its own process group; when one fails, or the job outlives
``config.timeout_s``, all groups are killed and an :class:`OpprofError` names what happened,
keeping whatever traces were already written. Logs are ``<role><i>.log`` in the run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opprof.collectors import Progress, RecordConfig, Recording, no_progress
from opprof.collectors.launch import describe_exit, die_with_parent, free_port, last_line, stop
from opprof.errors import OpprofError

PROGRESS_FILE = "progress.log"
_POLL_S = 0.1
_EXTRA_KEYS = {"nnodes", "node_rank", "master_addr", "master_port",
               "node_host", "local_workers", "local_servers", "scheduler"}
_LOOPBACK = ("127.", "localhost", "::1")


@dataclass
class Node:
    """One process of the job."""

    role: str
    index: int
    proc: subprocess.Popen
    log: Path

    @property
    def label(self) -> str:
        """``worker process 1``, ``server process 0``, ``scheduler``."""
        return self.role if self.role == "scheduler" else f"{self.role} process {self.index}"


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Run the PS job described by ``config``; return the traces of the ranks run here."""
    from opprof.collectors.mxnet import job_meta, trace_name

    unknown = set(config.extra) - _EXTRA_KEYS
    if unknown:
        raise OpprofError(f"unknown mxnet ps options: {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(_EXTRA_KEYS))})")
    workdir = Path(workdir).resolve()
    extra = config.extra
    nnodes, node_rank = int(extra.get("nnodes", 1)), int(extra.get("node_rank", 0))
    if not 0 <= node_rank < nnodes:
        raise OpprofError(f"--node-rank {node_rank} is not one of the {nnodes} nodes (0..)")
    root_host = str(extra.get("master_addr") or "127.0.0.1")
    if extra.get("master_port"):
        root_port = int(extra["master_port"])
    elif nnodes == 1:
        root_port = free_port(root_host)
    else:
        raise OpprofError(f"a job over {nnodes} nodes needs --master-port (the scheduler's "
                          "port, the same on every node)")
    local_workers = int(extra.get("local_workers", _share(config.workers, nnodes, node_rank)))
    local_servers = int(extra.get("local_servers", _share(config.servers, nnodes, node_rank)))
    run_scheduler = bool(extra.get("scheduler", node_rank == 0))
    node_host = extra.get("node_host") or (
        "127.0.0.1" if root_host.startswith(_LOOPBACK) else None)
    env = dict(os.environ)
    env.update({
        "DMLC_PS_ROOT_URI": root_host, "DMLC_PS_ROOT_PORT": str(root_port),
        "DMLC_NUM_SERVER": str(config.servers), "DMLC_NUM_WORKER": str(config.workers),
    })
    if node_host:
        env["DMLC_NODE_HOST"] = str(node_host)
    # Share this machine's cores among the processes that compute, unless the user chose.
    env.setdefault("OMP_NUM_THREADS",
                   str(max(1, (os.cpu_count() or 1) // max(1, local_workers + local_servers))))
    (workdir / PROGRESS_FILE).unlink(missing_ok=True)

    job = json.dumps(dataclasses.asdict(config))
    me = [sys.executable, "-m", "opprof.collectors.mxnet_ps"]
    plan = ([("scheduler", 0, [*me, "node"])] if run_scheduler else [])
    plan += [("server", i, [*me, "node"]) for i in range(local_servers)]
    plan += [("worker", i, [*me, "worker", job, str(workdir)]) for i in range(local_workers)]
    nodes: list[Node] = []
    t0 = time.monotonic()
    try:
        for role, i, cmd in plan:
            log = workdir / (f"{role}.log" if role == "scheduler" else f"{role}{i}.log")
            with open(log, "wb") as fh:
                proc = subprocess.Popen(cmd, env={**env, "DMLC_ROLE": role}, cwd=workdir,
                                        stdin=subprocess.DEVNULL, stdout=fh,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=die_with_parent)
            nodes.append(Node(role, i, proc, log))
        _wait(nodes, config, workdir, t0, progress)
    finally:
        stop(n.proc for n in nodes)

    results = []
    for path in sorted(workdir.glob("rank*_worker.meta")):
        results.append(json.loads(path.read_text()))
    if len(results) != local_workers:
        raise OpprofError(f"mxnet {config.mode}: {len(results)} of {local_workers} workers "
                          f"wrote their results into {workdir}; see worker*.log there")
    native = [workdir / trace_name(r["rank"]) for r in sorted(results, key=lambda r: r["rank"])]
    servers = sorted(workdir.glob("rank*_server.json"))
    if not servers and nnodes == 1:  # a one-machine job always profiles its servers
        raise OpprofError(f"mxnet {config.mode}: the servers wrote no profiler trace into "
                          f"{workdir}; see server*.log there")
    meta = job_meta(config, results)
    meta.update({"scheduler": f"{root_host}:{root_port}", "server_traces": len(servers)})
    return Recording(native=native + servers, meta=meta)


def _share(total: int, nnodes: int, node_rank: int) -> int:
    """This node's share of ``total`` processes spread evenly over ``nnodes`` nodes."""
    return total // nnodes + (1 if node_rank < total % nnodes else 0)


def _wait(nodes: list[Node], config: RecordConfig, workdir: Path, t0: float,
          progress: Progress) -> None:
    """Until every process has exited cleanly; raise on the first failure or at the deadline."""
    deadline = t0 + config.timeout_s
    offset = 0
    while True:
        offset = _relay_progress(workdir / PROGRESS_FILE, offset, progress)
        codes = [n.proc.poll() for n in nodes]
        for node, code in zip(nodes, codes, strict=True):
            if code not in (None, 0):
                stop(n.proc for n in nodes)
                raise OpprofError(
                    f"mxnet {config.mode}: {node.label} {describe_exit(code)} after "
                    f"{time.monotonic() - t0:.1f}s ({_log_tail(node.log)}); stopped the "
                    f"other processes; traces written so far are kept in {workdir}")
        if all(c == 0 for c in codes):
            _relay_progress(workdir / PROGRESS_FILE, offset, progress)
            return
        if time.monotonic() > deadline:
            running = [n.label for n, c in zip(nodes, codes, strict=True) if c is None]
            stop(n.proc for n in nodes)
            raise OpprofError(
                f"mxnet {config.mode}: the job did not finish within {config.timeout_s:g}s "
                f"(still running: {', '.join(running)}); stopped all its processes; traces "
                f"written so far are kept in {workdir} (logs: *.log there)")
        time.sleep(_POLL_S)


def _log_tail(log: Path) -> str:
    """``last log line: ...`` or ``no output in <log>``."""
    line = last_line(log)
    return f"last log line: {line}" if line else f"no output in {log.name}"


def _relay_progress(path: Path, offset: int, progress: Progress) -> int:
    """Pass worker rank 0's new progress lines (``stage done total``) to ``progress``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode().splitlines():
        stage, done, total = line.split()
        progress(stage, int(done), int(total))
    return offset + len(complete)


def _worker_main(job: str, workdir: str) -> int:
    """A worker process: join the job, run the protocol, write this rank's files."""
    from opprof.collectors.mxnet import PS_MODES, mx, run_worker

    config = RecordConfig(**json.loads(job))
    kv = mx.kv.create(PS_MODES[config.mode])
    out = Path(workdir)

    def report(stage: str, done: int, total: int) -> None:
        if kv.rank == 0:
            with open(out / PROGRESS_FILE, "a") as f:
                f.write(f"{stage} {done} {total}\n")

    run_worker(config, out, kv=kv, progress=report)
    return 0


def main(argv: list[str]) -> int:
    """Entry point of every process of the job (``python -m opprof.collectors.mxnet_ps``)."""
    role = os.environ.get("DMLC_ROLE", "")
    if argv[:1] == ["node"] and role in ("scheduler", "server"):
        from opprof.collectors._mxnet_shim import import_mxnet

        import_mxnet()  # runs this node until the job ends, then exits the process
        print(f"mxnet returned from import as a {role}; not a PS node", file=sys.stderr)
        return 1
    if argv[:1] == ["worker"] and len(argv) == 3 and role == "worker":
        try:
            return _worker_main(argv[1], argv[2])
        except OpprofError as exc:
            print(f"opprof: {exc}", file=sys.stderr)
            return 2
    print("usage: DMLC_ROLE=scheduler|server python -m opprof.collectors.mxnet_ps node\n"
          "       DMLC_ROLE=worker python -m opprof.collectors.mxnet_ps worker JOB WORKDIR",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
