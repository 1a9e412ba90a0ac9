"""`record`'s jobs: which processes a recording starts for each framework and mode, under the
one supervisor, and the Recording they leave (native traces + metadata). Imports no framework:
only the processes it starts do.

Every process runs ``python -m opprof.collectors.worker`` (the built-in model under the
runner), started the way that framework's users start a job:

* torch: one process, or torchrun (``python -m torch.distributed.run``) with a static
  rendezvous (``--nnodes --node-rank --master-addr --master-port``; on one machine 127.0.0.1
  and a free port; gloo pinned to loopback);
* MXNet: one process, or a parameter-server job: a scheduler, servers and workers, each a
  process with MXNet's DMLC environment (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` …);
* TensorFlow: one process, or one process per ``TF_CONFIG`` task (MultiWorkerMirroredStrategy
  workers; or ParameterServerStrategy's chief, workers and ps).

While the job runs, the resident memory of every process is sampled from outside
(:mod:`.memory`). On several hosts every host runs the same `record` with its own
``--node-rank`` and keeps the traces of the ranks it ran (``opprof import`` their folders
together). Logs are ``<process>.log`` in the run folder, statuses in its ``procs/``
(:mod:`.channel`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias, TypedDict

from opprof.collectors import channel
from opprof.collectors.config import (
    Device,
    Facts,
    Framework,
    Mode,
    RecordConfig,
    Role,
    canonical_name,
    job_meta,
    require_installed,
)
from opprof.collectors.rss import memory_files, sampling
from opprof.collectors.runner import LABEL_ENV
from opprof.collectors.supervisor import (
    Child,
    Progress,
    Supervisor,
    describe_exit,
    free_port,
    free_ports,
    last_line,
    log_name,
    no_progress,
)
from opprof.errors import Interrupted, OpprofError
from opprof.kinds import framework_info

CONFIG_FILE = "record.config"


@dataclass
class Recording:
    """What a recording produced: native trace files, the processes' sampled memory files
    (:mod:`.memory`) and the run's metadata."""

    native: list[Path]
    meta: dict[str, Any]
    memory: list[Path] = field(default_factory=list)


class JobPlan(TypedDict, total=False):
    """What a framework's launch plan knows of the job (its metadata: ``workers`` …), and
    how many processes of this host must write a profile (``expected_profiles``)."""

    workers: int
    servers: int
    expected_profiles: int
    nnodes: int
    node_rank: int
    master: str  # torch's rendezvous, host:port
    launcher: str
    kvstore: str | None  # MXNet's
    scheduler: str  # MXNet's, host:port
    server_traces: int  # MXNet's servers' trace files kept


#: Who failed first in a launcher's processes, and how: (who, how) from the child that
#: ended, its exit code and every process's status (:func:`torchrun_root_cause`).
Explain: TypeAlias = Callable[[Child, int, list[Facts]], tuple[str, str]]


@dataclass
class Launch:
    """One process to start."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    explain: Explain | None = None


# ------------------------------------------------------------------ checks


def check(config: RecordConfig) -> None:
    """Reject, with one clear line, what cannot be recorded — before anything starts."""
    fw, mode = config.fw, config.mode
    canonical_name(config.model)
    if fw == Framework.TORCH:
        from opprof.collectors.torch_parallel import check as check_model_parallel

        check_model_parallel(mode, canonical_name(config.model), config.workers,
                             config.batch_size)
    if mode not in framework_info(fw).modes:
        raise OpprofError({
            Framework.TORCH: f"torch has no --mode {mode} (no parameter-server mode: torch's "
                             "own distributed training is DistributedDataParallel or sharded)"
                             "; use --mode allreduce, fsdp, zero, tp, pp, ep or fsdp+tp",
            Framework.MXNET: f"mxnet has no --mode {mode} (MXNet's own distributed training "
                             "is the parameter server); use --mode ps-sync or ps-async",
            Framework.TF: "--fw tf --mode ps-sync: TensorFlow's ParameterServerStrategy is "
                          "asynchronous by design and TF 2 has no synchronous parameter-server "
                          "training; use --mode ps-async or --mode allreduce",
            Framework.JAX: f"jax has no --mode {mode} (JAX's data parallelism is a collective "
                           "over its devices); use --mode allreduce",
            Framework.CHAINER: f"chainer has no --mode {mode} (ChainerMN's data parallelism is "
                               "an MPI all-reduce); use --mode allreduce",
        }[fw])
    rv = config.rendezvous
    if mode == Mode.SINGLE and (config.workers != 1 or rv.nnodes > 1):
        raise OpprofError("--mode single runs one worker on one machine; use "
                          + {Framework.TORCH: "--mode allreduce", Framework.TF:
                             "--mode allreduce or ps-async"}.get(fw, "--mode ps-sync or ps-async"))
    if config.device == Device.CUDA and fw != Framework.TORCH:
        raise OpprofError(
            {Framework.MXNET: "--device cuda: opprof's MXNet collector records CPU training "
                              "only (the installed MXNet build has no CUDA); use --device cpu",
             Framework.TF: "--fw tf --device cuda: the installed tensorflow-cpu has no GPU "
                           "support; use --device cpu",
             Framework.JAX: "--fw jax --device cuda: the installed jaxlib is CPU-only; use "
                            "--device cpu",
             Framework.CHAINER: "--fw chainer --device cuda: CuPy is not installed (Chainer "
                                "runs on numpy here); use --device cpu"}[fw])
    if fw == Framework.TF and rv.nnodes > 1 and not rv.cluster:
        raise OpprofError(
            "--fw tf on several hosts needs every worker's address (TF_CONFIG lists them all): "
            "pass --cluster HOST:PORT,HOST:PORT,... (every worker, in task order) and "
            "--node-rank (this host's task index)")
    if rv.cluster and (fw != Framework.TF or mode != Mode.ALLREDUCE):
        raise OpprofError("--cluster (TensorFlow on several hosts) is for --fw tf --mode "
                          "allreduce only")
    for name, value, low in (("batch_size", config.batch_size, 1),
                             ("workers", config.workers, 1), ("servers", config.servers, 1)):
        if value < low:
            raise OpprofError(f"{name} must be at least {low}, got {value}")
    config.protocol.check(min_timing=1 if fw == Framework.TF else 0)
    if config.converge < 0 or config.eval_every < 0:
        raise OpprofError(f"--converge {config.converge} / --eval-every {config.eval_every}: "
                          "steps cannot be negative")
    if config.eval_every and not config.converge:
        raise OpprofError("--eval-every needs --converge STEPS (the steps to train)")
    if config.loader_workers and fw not in (Framework.TORCH, Framework.MXNET):
        how = ("with tf.data, which parallelizes itself" if fw == Framework.TF
               else "in the training process")
        raise OpprofError(f"--loader-workers: the {fw} models load {how}; give it for torch "
                          "or mxnet")
    if config.bucket_mb is not None and (fw != Framework.TORCH
                                         or mode not in (Mode.ALLREDUCE, Mode.ZERO)):
        raise OpprofError("--bucket-mb sets DistributedDataParallel's buckets: torch with "
                          "--mode allreduce or zero")
    if fw == Framework.CHAINER and mode != Mode.SINGLE:
        from opprof.collectors.chainer import mpi_problem

        problem = mpi_problem()
        if problem:
            raise OpprofError(f"--fw chainer --mode {mode} runs ChainerMN under MPI: {problem}")
        if rv.nnodes > 1:
            raise OpprofError("--fw chainer on several hosts: start ChainerMN with your own "
                              "mpiexec and `opprof run` (record runs one host)")
    rv.check(config.workers, split_evenly=fw in (Framework.TORCH, Framework.JAX)
             and mode != Mode.SINGLE)


# ------------------------------------------------------------------ recording


def record(config: RecordConfig, workdir: Path, progress: Progress = no_progress) -> Recording:
    """Run the job ``config`` describes, its native files into ``workdir``; the traces of the
    ranks run on this machine and the job's metadata."""
    check(config)
    require_installed(config.fw)
    if config.device == Device.CUDA:
        from opprof.collectors.gpu import require_cuda, require_gpu_per_rank

        gpus = require_cuda(str(config.fw))
        require_gpu_per_rank(str(config.fw), config.workers // config.rendezvous.nnodes, gpus)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = with_default_threads(config)
    cfg = workdir / CONFIG_FILE
    cfg.write_text(config.to_json())
    argv = [sys.executable, "-m", "opprof.collectors.worker", str(cfg), str(workdir)]
    env = dict(os.environ)
    env.pop(LABEL_ENV, None)  # (a test's $OPPROF_TEST_FAULT stays: tests/faults.py)
    if config.threads:  # OpenMP reads it when a framework loads, in every process started
        env.update({"OMP_NUM_THREADS": str(config.threads),
                    "MKL_NUM_THREADS": str(config.threads),
                    "OPENBLAS_NUM_THREADS": str(config.threads)})  # numpy's BLAS (Chainer)
    env.update(framework_info(config.fw).env)
    plan, job = _PLANS[config.fw](config, argv, env)
    what = f"{config.fw} {config.mode}"
    with Supervisor(workdir, what, timeout_s=config.timeout_s, progress=progress,
                    watch_progress=True) as sup, sampling(sup, config.memory_interval_s):
        # A launcher's children (torchrun's ranks) name themselves from its environment.
        children = [sup.start(p.label, p.argv, cwd=workdir, log=workdir / log_name(p.label),
                              env={**env, **p.env, **({} if p.explain else {LABEL_ENV: p.label})},
                              explain=p.explain)
                    for p in plan]
        done = None
        if config.fw == Framework.TF and config.mode == Mode.PS_ASYNC:
            chief = children[-1]

            def done(s: Supervisor) -> bool:  # the chief is done: stop the servers
                return chief.code == 0

        try:
            sup.wait(done)
        except Interrupted as exc:
            # What the processes wrote before they stopped, for the caller to keep.
            exc.recording = partial_recording(config, workdir, sup.statuses(), job,  # type: ignore[attr-defined]
                                              f"interrupted by {exc.name}")
            raise
        for c in children:
            c.expected_exit = True
    return _recording(config, workdir, sup.statuses(), job)


def partial_recording(config: RecordConfig, workdir: Path, facts: list[Facts],
                      job: JobPlan, reason: str) -> Recording | None:
    """The traces of a run cut short (``reason``): those its processes wrote (each holds its
    completed profiled steps), with the run's metadata, ``meta["partial"]`` saying why and
    how far each process got; None when no process wrote a trace."""
    job = job.copy()
    job.pop("expected_profiles", None)
    profiled = [f for f in facts if f.native and all(Path(p).is_file() for p in f.native)]
    if not profiled:
        return None
    order = sorted(profiled, key=lambda f: (f.role != Role.WORKER, f.rank or 0))
    native = [Path(p) for f in order for p in f.native]
    servers = sorted(workdir.glob("rank*_server.json"))
    if servers:
        job["server_traces"] = len(servers)
    meta = record_meta(config, facts, order, job)
    meta["partial"] = partial_meta(facts, reason)
    # (the memory samples are written when the sampler stops: the caller adds them)
    return Recording(native=native + servers, meta=meta)


def partial_meta(facts: list[Facts], reason: str) -> dict[str, Any]:
    """``meta["partial"]``: why a recording is incomplete and the profiled steps each
    worker kept."""
    return {"reason": reason,
            "kept_steps": {str(f.rank): f.profiled_steps for f in facts
                           if f.role == Role.WORKER and f.native and f.rank is not None},
            "target_steps": max((f.profiled_target for f in facts), default=0)}


def _recording(config: RecordConfig, workdir: Path, facts: list[Facts],
               job: JobPlan) -> Recording:
    what = f"{config.fw} {config.mode}"
    profiled = [f for f in facts if f.native]
    expected = job.pop("expected_profiles")
    if len(profiled) < expected:
        missing = [f.label for f in facts if not f.native]
        raise OpprofError(
            f"{what}: {len(profiled)} of {expected} processes wrote a profile"
            + (f" (none from {', '.join(missing)})" if missing else "")
            + f"; see the logs in {workdir}")
    order = sorted(profiled, key=lambda f: (f.role != Role.WORKER, f.rank or 0))
    native = [Path(p) for f in order for p in f.native]
    servers = sorted(workdir.glob("rank*_server.json"))  # MXNet's servers
    if config.fw == Framework.MXNET and config.mode != Mode.SINGLE:
        if not servers and config.rendezvous.nnodes == 1:
            raise OpprofError(f"{what}: the servers wrote no profiler trace into {workdir}; "
                              "see server*.log there")
        job["server_traces"] = len(servers)
    meta = record_meta(config, facts, order, job)
    return Recording(native=native + servers, meta=meta, memory=memory_files(workdir))


def compute_processes(config: RecordConfig) -> int:
    """The processes of the job that compute on this host: torch's ranks on this node, MXNet's
    workers and servers on it (the servers run the optimizer), TensorFlow's tasks on it (all
    the workers of a one-host cluster, this one task of a given cluster; the workers and
    parameter servers of ps-async)."""
    rv = config.rendezvous
    if config.mode == Mode.SINGLE:
        return 1
    if config.fw == Framework.TORCH:
        return max(1, config.workers // max(rv.nnodes, 1))
    if config.fw in (Framework.JAX, Framework.CHAINER):
        return max(1, config.workers // max(rv.nnodes, 1))
    if config.fw == Framework.MXNET:
        def share(total: int) -> int:
            return total // rv.nnodes + (1 if rv.node_rank < total % rv.nnodes else 0)
        return max(1, share(config.workers) + share(config.servers))
    if config.mode == Mode.ALLREDUCE:
        return 1 if rv.cluster else config.workers
    return config.workers + config.servers


def with_default_threads(config: RecordConfig) -> RecordConfig:
    """``config`` with its compute threads per process set, one rule for every framework: the
    user's ``--threads``, else this host's CPUs split among the processes that compute on it
    (:func:`compute_processes`; at least 1). A 1-process run keeps the framework's own default
    (every CPU)."""
    if config.threads or config.mode == Mode.SINGLE:
        return config
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return replace(config, threads=max(1, (cpus or 1) // compute_processes(config)))


# ------------------------------------------------------------------ torch


def _torch(config: RecordConfig, argv: list[str],
           env: dict[str, str]) -> tuple[list[Launch], JobPlan]:
    if config.mode == Mode.SINGLE:
        return [Launch("rank 0", argv)], {"workers": 1, "servers": 0, "expected_profiles": 1}
    rv = config.rendezvous
    per_node = config.workers // rv.nnodes
    port = rv.master_port or free_port(rv.master_addr)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    extra = {"OMP_NUM_THREADS": str(config.threads or max(1, (cpus or 1) // per_node))}
    if rv.loopback:
        extra["GLOO_SOCKET_IFNAME"] = "lo"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(rv.nnodes),
                "--nproc-per-node", str(per_node), "--node-rank", str(rv.node_rank),
                "--master-addr", rv.master_addr, "--master-port", str(port),
                "--max-restarts", "0", "--monitor-interval", "0.1", *argv[1:]]
    job: JobPlan = {"workers": config.workers, "servers": 0, "nnodes": rv.nnodes,
           "node_rank": rv.node_rank, "master": f"{rv.master_addr}:{port}",
           "launcher": "torchrun", "expected_profiles": per_node}
    return [Launch("torchrun", torchrun, extra, explain=torchrun_root_cause)], job


#: One failed rank in torchrun's failure summary: its ``rank :`` line, then ``exitcode :``.
_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
_PEER = ("connection closed", "connection reset", "broken pipe", "peer", "timed out",
         "timeout", "socket", "nccl")


def torchrun_root_cause(child: Child, code: int, statuses: list[Facts]) -> tuple[str, str]:
    """(who, how): the rank that failed first among those torchrun reports. A rank whose peer
    died fails too, with a communication error, sometimes before torchrun sees the first one
    die; so a rank that died without an error of its own (an exit, a signal) is named first,
    then one with its own error, then one that lost a peer, then one torchrun stopped."""
    text = child.log.read_text(errors="replace") if child.log else ""
    failed = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    if not failed:
        return "torchrun", describe_exit(code)
    ranks = [s for s in statuses if s.label.startswith("rank ")]
    errors = {s.rank: (s.error or "") for s in ranks}
    # Stopped by torchrun: its status says so, or its log's last line (a SIGTERM in the
    # instant it began to fail on its own leaves no status behind, only the traceback).
    stopped = {s.rank for s in ranks if "SIGTERM" in f"{s.ended} {s.error}"} | {
        r for r in failed if child.log and "terminated by SIGTERM" in last_line(
            child.log.parent / log_name(f"rank {r}"))}

    def suspicion(rank: int) -> tuple[int, int]:
        if failed[rank] in (-15, 143) or rank in stopped:  # torchrun stopping the others
            return (3, rank)
        error = errors.get(rank, "")
        if not error:
            return (0, rank)
        return (2 if any(w in error.lower() for w in _PEER) else 1, rank)

    rank = min(failed, key=suspicion)
    return f"rank {rank}", describe_exit(failed[rank])


# ------------------------------------------------------------------ MXNet


def _mxnet(config: RecordConfig, argv: list[str],
           env: dict[str, str]) -> tuple[list[Launch], JobPlan]:
    if config.mode == Mode.SINGLE:
        return [Launch("worker 0", argv)], {"workers": 1, "servers": 0, "kvstore": None,
                                            "expected_profiles": 1}
    rv = config.rendezvous

    def share(total: int) -> int:
        return total // rv.nnodes + (1 if rv.node_rank < total % rv.nnodes else 0)

    workers, servers = share(config.workers), share(config.servers)
    port = rv.master_port or free_port(rv.master_addr)
    dmlc = {"DMLC_PS_ROOT_URI": rv.master_addr, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(config.servers), "DMLC_NUM_WORKER": str(config.workers)}
    if rv.loopback:
        dmlc["DMLC_NODE_HOST"] = "127.0.0.1"
    # Share this machine's cores among the processes that compute, unless the user chose.
    dmlc["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(
        max(1, (os.cpu_count() or 1) // max(1, workers + servers)))
    plan = [Launch("scheduler", argv, {**dmlc, "DMLC_ROLE": "scheduler"})] \
        if rv.node_rank == 0 else []
    plan += [Launch(f"server {i}", argv, {**dmlc, "DMLC_ROLE": "server"})
             for i in range(servers)]
    plan += [Launch(f"worker {i}", argv, {**dmlc, "DMLC_ROLE": "worker"})
             for i in range(workers)]
    job: JobPlan = {
           "workers": config.workers, "servers": config.servers,
           "kvstore": {Mode.PS_SYNC: "dist_sync", Mode.PS_ASYNC: "dist_async"}[config.mode],
           "scheduler": f"{rv.master_addr}:{port}", "expected_profiles": workers}
    return plan, job


# ------------------------------------------------------------------ TensorFlow


def _tf(config: RecordConfig, argv: list[str],
        env: dict[str, str]) -> tuple[list[Launch], JobPlan]:
    job: JobPlan = {"servers": 0}
    if config.mode == Mode.SINGLE:
        return [Launch("worker 0", argv)], {**job, "workers": 1, "expected_profiles": 1}
    rv = config.rendezvous
    if config.mode == Mode.ALLREDUCE:
        if rv.cluster:  # several hosts: this one runs one task of the given cluster
            hosts = list(rv.cluster)
            if not 0 <= rv.node_rank < len(hosts):
                raise OpprofError(f"--node-rank {rv.node_rank} is not in the {len(hosts)}-task "
                                  "cluster")
            tasks = [("worker", rv.node_rank)]
        else:
            hosts = [f"127.0.0.1:{p}" for p in free_ports(config.workers)]
            tasks = [("worker", i) for i in range(config.workers)]
        cluster = {"worker": hosts}
        job.update({"workers": len(hosts), "expected_profiles": len(tasks)})
    else:
        ports = [f"127.0.0.1:{p}" for p in free_ports(1 + config.workers + config.servers)]
        cluster = {"chief": ports[:1], "worker": ports[1:1 + config.workers],
                   "ps": ports[1 + config.workers:]}
        tasks = [("worker", i) for i in range(config.workers)]
        tasks += [("ps", i) for i in range(config.servers)] + [("chief", 0)]
        job.update({"workers": config.workers, "servers": config.servers,
                    "expected_profiles": len(tasks)})
    plan = [Launch(f"{kind} {i}", argv, {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}),
        "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2")}) for kind, i in tasks]
    return plan, job


# ------------------------------------------------------------------ JAX


def _jax(config: RecordConfig, argv: list[str],
         env: dict[str, str]) -> tuple[list[Launch], JobPlan]:
    """One process, or one per worker meeting through ``jax.distributed`` on loopback."""
    if config.mode == Mode.SINGLE:
        return [Launch("rank 0", argv)], {"workers": 1, "servers": 0, "expected_profiles": 1}
    from opprof.collectors.jax import COORDINATOR_ENV, PROCESS_ID_ENV, PROCESSES_ENV

    rv = config.rendezvous
    port = rv.master_port or free_port(rv.master_addr)
    per_node = config.workers // rv.nnodes
    first = rv.node_rank * per_node
    plan = [Launch(f"rank {r}", argv, {
        COORDINATOR_ENV: f"{rv.master_addr}:{port}", PROCESSES_ENV: str(config.workers),
        PROCESS_ID_ENV: str(r), "RANK": str(r), "WORLD_SIZE": str(config.workers)})
        for r in range(first, first + per_node)]
    return plan, {"workers": config.workers, "servers": 0, "nnodes": rv.nnodes,
                  "node_rank": rv.node_rank, "master": f"{rv.master_addr}:{port}",
                  "launcher": "jax.distributed", "expected_profiles": per_node}


# ------------------------------------------------------------------ Chainer


def _chainer(config: RecordConfig, argv: list[str],
             env: dict[str, str]) -> tuple[list[Launch], JobPlan]:
    """One process, or ChainerMN's ranks started by ``mpiexec`` on this host."""
    if config.mode == Mode.SINGLE:
        return [Launch("rank 0", argv)], {"workers": 1, "servers": 0, "expected_profiles": 1}
    from opprof.collectors.chainer import mpiexec_argv

    mpi = mpiexec_argv(config.workers, argv)
    return [Launch("mpiexec", mpi, {}, explain=mpiexec_root_cause)], {
        "workers": config.workers, "servers": 0, "launcher": "mpiexec",
        "expected_profiles": config.workers}


def mpiexec_root_cause(child: Child, code: int, statuses: list[Facts]) -> tuple[str, str]:
    """(who, how): the first rank whose status has an error of its own, else mpiexec."""
    failed = sorted((s for s in statuses if s.error), key=lambda s: s.rank or 0)
    if failed:
        return failed[0].label, failed[0].error or describe_exit(code)
    return "mpiexec", describe_exit(code)


_PLANS = {Framework.TORCH: _torch, Framework.MXNET: _mxnet, Framework.TF: _tf,
          Framework.JAX: _jax, Framework.CHAINER: _chainer}


# ------------------------------------------------------------------ `opprof run`


def command_recording(folder: Path, command: str, session: str | None = None) -> Recording:
    """What the processes of a user's command recorded (their statuses in ``folder``; of one
    ``session`` only, when given): the native traces, complete or cut short, and the run's
    metadata. An empty ``native`` when no process reached its profiled steps."""
    facts = [f for f in channel.read_all(folder)
             if session is None or f.extra.get("session") == session]
    profiled = sorted((f for f in facts if f.native),
                      key=lambda f: (f.role != Role.WORKER, f.rank or 0))
    native = [Path(p) for f in profiled for p in f.native if Path(p).exists()]
    native += _collect_servers(folder, facts)
    meta = job_meta(profiled or facts, command=command, launcher="opprof run")
    world = max([int(f.extra.get("world_size", 1)) for f in profiled] + [1])
    kv = str(meta.get("kvstore", ""))
    meta["mode"] = (("ps-async" if "async" in kv else "ps-sync") if kv.startswith("dist") else
                    "allreduce" if world > 1 or meta["workers"] > 1 else "single")
    if kv.startswith("dist"):
        meta["servers"] = sum(f.role == Role.SERVER for f in facts)
        meta["server_traces"] = sum(p.name.endswith("_server.json") for p in native)
    return Recording(native=native, meta=meta, memory=memory_files(folder))


def _collect_servers(folder: Path, facts: list[Facts]) -> list[Path]:
    """Move the traces MXNet's servers wrote into their working directories (``rankK_`` +
    :data:`.mxnet.RUN_SERVER_TRACE`) into the run folder as ``rankK_server.json``, the name
    the MXNet normalizer knows."""
    from opprof.collectors.mxnet import RUN_SERVER_TRACE

    out = []
    started = min((f.stat().st_mtime for f in folder.rglob("*.status")), default=0.0)
    for cwd in sorted({f.extra["cwd"] for f in facts if f.extra.get("cwd")}):
        for path in sorted(Path(cwd).glob(f"rank*_{RUN_SERVER_TRACE}")):
            if path.stat().st_mtime < started:
                continue  # left by an earlier job
            target = folder / path.name.replace(RUN_SERVER_TRACE, "server.json")
            shutil.move(str(path), target)
            out.append(target)
    return out


def record_meta(config: RecordConfig, facts: list[Facts], order: list[Facts],
                job: JobPlan) -> dict[str, Any]:
    """A built-in model's recording's metadata: the job's (:func:`job_meta`) with the model,
    data, mode, device and the profiled steps and memory sampling asked for."""
    meta = job_meta(facts, model=canonical_name(config.model), dataset=config.dataset,
                    batch_size=config.batch_size, mode=str(config.mode),
                    device=order[0].extra.get("device", str(config.device)), seed=config.seed,
                    command=config.command, **job)
    meta["profiled_steps"] = config.steps
    meta["memory_interval_s"] = config.memory_interval_s
    return meta
