"""Collective microbenchmarks for `opprof calibrate`: time each framework's gradient collective
over message sizes, through the framework's own backend, on processes started on this host.

- **torch**: ``torch.distributed.all_reduce`` of a float32 tensor over the gloo backend (as
  DistributedDataParallel uses on CPU), one process per rank, rendezvous over loopback TCP;
  for ``--mode fsdp``, what FSDP2 does instead, the way it does it in training: a unit's
  all-gather with its copy-in and copy-out, and its reduce-scatter with the gradients' copy,
  each after a stretch of compute on every rank (``kind``: ``all_gather``,
  ``reduce_scatter``; each call's ``enter`` and ``exit`` on the host's clock).
  Then a compute loop timed alone and beside the all-reduce (``kind`` ``alone``, ``beside``):
  how much compute slows while gloo reduces on the same cores (the model's interference).
  Then the **in-step calls** (:func:`_in_step`): tensor parallel's functional all-reduce and
  a pipeline's send/recv, each after a burst of compute on every rank, as a model-parallel
  step calls them (``kind``: ``in_step_all_reduce``, ``in_step_p2p``; ``bytes``,
  ``burst_ns``, ``enter``, ``exit``), and a synthetic two-stage pipeline whose transfers
  happen while both ranks compute (``in_step_pipeline``: :func:`_in_step_pipeline`), under
  the recorder's profiler settings.
- **mxnet**: ``kvstore.pushpull`` of one key per size on a ``dist_sync`` kvstore, with a
  scheduler, S servers and N workers started with MXNet's DMLC environment on loopback (the
  servers only aggregate: no optimizer runs on them, so the time is communication alone);
  then the same pushpull after a burst of compute on every worker (:func:`_in_step_dp`).
- **tf**: ``ReplicaContext.all_reduce`` (TF's CollectiveReduceV2, ring implementation) under
  ``MultiWorkerMirroredStrategy``, one task per worker configured by ``TF_CONFIG``; and the
  packing the strategy does around it in training (the gradients concatenated into one tensor
  and split back: ``kind: pack`` samples); and the all-reduce after a burst of compute on
  every worker (:func:`_in_step_dp`: ``kind: in_step_all_reduce``, as torch's); after the
  co-location loop, the loop's step fed through the strategy's distributed dataset and by the
  plain one (:func:`_tf_input`: ``kind: input``).

Every size is warmed up once, then timed ``repeat`` times, each call after a barrier so the
workers start it together (FSDP's: after compute, as in training); every worker writes its
per-call times to ``rankR.json``.

Then, with two or more workers, **co-location** (``job.extra["colocation"]``): every worker
builds the framework's own training step of a small built-in model (as `opprof record` builds
it, on its threads, no profiler; :func:`train_step`) and this process conducts them over a
loopback socket (:class:`Conductor`): in each round, one worker computes alone, then k workers
at once for every k up to N (the order reversed every other round), each for
:data:`PHASE_S` seconds of back-to-back steps; the workers' step times (wall, and the
process's CPU time) come back as ``kind: coloc`` samples (``round``, ``k``, ``index`` of the
step in its phase, ``ns``, ``cpu_ns``). The job's other
processes (gloo's, TensorFlow's and MXNet's servers and scheduler) stay up meanwhile, as in
training; a worker waiting for its turn sleeps in the socket.

The processes are started by :func:`launch`, the one place that starts, watches and stops
them (free loopback ports, children that die with the launcher, process groups stopped on the
first failure or at the deadline, the failure in one line).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opprof.collectors.supervisor import LOOPBACK, Supervisor, free_port, free_ports, log_name
from opprof.errors import OpprofError
from opprof.kinds import FRAMEWORKS

#: Message sizes (bytes) timed by default: 4 KiB … 64 MiB in steps of 4.
DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(1, 9))
#: Pieces a TF gradient pack is made of in the packing benchmark.
PACK_PIECES = 16
#: ``--mode fsdp``: the compute each rank does before every FSDP collective it times (ns), as
#: a unit's forward or backward precedes the collective in training.
FSDP_GAP_NS = 10_000_000
#: ``--mode fsdp``: one FSDP unit's parameters as fractions of its bytes (a residual block:
#: two convolutions' weights and four normalisation vectors).
UNIT_PIECES = (0.4995, 0.0005, 0.0005, 0.4985, 0.0005, 0.0005)
#: Co-location: seconds of back-to-back training steps per phase of a round (alone, or k
#: workers at once), at least :data:`PHASE_STEPS` steps.
PHASE_S = 0.6
PHASE_STEPS = 3
#: TensorFlow's distributed dataset (:func:`_tf_input`): rounds of each way of feeding the
#: step, each as long as a co-location phase.
INPUT_ROUNDS = 4


@dataclass
class Job:
    """What to measure."""

    fw: str
    workers: int
    servers: int = 1
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeat: int = 5
    threads: int | None = None
    timeout_s: float = 600.0
    master: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def default_threads(fw: str, workers: int, servers: int) -> int:
    """The threads a recording would give each worker on this host (the collectors' rule)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    procs = workers + (servers if fw == "mxnet" else 0)
    return max(1, cpus // max(procs, 1))


def run(job: Job, workdir: Path) -> list[dict[str, Any]]:
    """Run the benchmark; return every worker's samples (``rank``, ``bytes``, ``ns``)."""
    if job.fw not in FRAMEWORKS:
        raise OpprofError(f"--fw {job.fw}: choose torch, mxnet or tf")
    if job.workers < (1 if job.fw == "mxnet" else 2):
        raise OpprofError(f"--fw {job.fw} --workers {job.workers}: an all-reduce needs at "
                          "least 2 workers")
    workdir.mkdir(parents=True, exist_ok=True)
    threads = job.threads or default_threads(job.fw, job.workers, job.servers)
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "TF_CPP_MIN_LOG_LEVEL": "2", "GLOO_SOCKET_IFNAME": "lo"})
    job = Job(**{**asdict(job), "threads": threads})
    conductor = None
    coloc = job.extra.get("colocation")
    if coloc and job.workers > 1:
        conductor = Conductor(job.workers, int(coloc.get("rounds", 8)),
                              float(coloc.get("seconds", PHASE_S)), job.timeout_s)
        job.extra = {**job.extra, "colocation": {**coloc, "port": conductor.port}}
    elif coloc:
        job.extra = {k: v for k, v in job.extra.items() if k != "colocation"}
    me = [sys.executable, "-m", "opprof.collectors.netbench"]
    plan: list[tuple[str, list[str], dict[str, str], bool]] = []
    if job.fw == "torch":
        job.master = f"{LOOPBACK}:{free_port()}"
        spec = json.dumps(asdict(job))
        plan = [(f"rank{r}", [*me, "torch", spec, str(r), str(workdir)], env, True)
                for r in range(job.workers)]
    elif job.fw == "tf":
        ports = free_ports(job.workers)
        cluster = {"worker": [f"{LOOPBACK}:{p}" for p in ports]}
        spec = json.dumps(asdict(job))
        for r in range(job.workers):
            e = {**env, "TF_CONFIG": json.dumps({"cluster": cluster,
                                                 "task": {"type": "worker", "index": r}})}
            plan.append((f"worker{r}", [*me, "tf", spec, str(r), str(workdir)], e, True))
    else:
        dmlc = {**env, "DMLC_PS_ROOT_URI": LOOPBACK, "DMLC_PS_ROOT_PORT": str(free_port()),
                "DMLC_NUM_SERVER": str(job.servers), "DMLC_NUM_WORKER": str(job.workers),
                "DMLC_NODE_HOST": LOOPBACK}
        spec = json.dumps(asdict(job))
        plan.append(("scheduler", [*me, "mxnet-node"], {**dmlc, "DMLC_ROLE": "scheduler"},
                     False))
        plan += [(f"server{i}", [*me, "mxnet-node"], {**dmlc, "DMLC_ROLE": "server"}, False)
                 for i in range(job.servers)]
        plan += [(f"worker{i}", [*me, "mxnet", spec, str(i), str(workdir)],
                  {**dmlc, "DMLC_ROLE": "worker"}, True) for i in range(job.workers)]
    if conductor is not None:
        conductor.start()
    try:
        launch(plan, workdir, job.timeout_s, f"calibrate {job.fw}")
    finally:
        if conductor is not None:
            conductor.close()
    out = []
    for path in sorted(workdir.glob("rank*.json")):
        out.extend(json.loads(path.read_text())["samples"])
    if not out:
        raise OpprofError(f"calibrate {job.fw}: no worker wrote its timings into {workdir}")
    if conductor is not None:
        out.extend(conductor.result(f"calibrate {job.fw}"))
    return out


class Conductor:
    """This process's side of the co-location loop (see the module docstring): listens on a
    free loopback port; once every worker has connected, runs the rounds, each phase's workers
    told at once to compute for ``seconds`` and their step times read back; then tells every
    worker to go on. Runs on its own thread while the supervisor watches the job; a worker that
    dies or hangs ends it (the supervisor names the worker)."""

    def __init__(self, workers: int, rounds: int, seconds: float, timeout_s: float) -> None:
        self.workers, self.rounds, self.seconds = workers, max(1, rounds), seconds
        self.sock = socket.create_server((LOOPBACK, 0))
        self.sock.settimeout(timeout_s)
        self.port = int(self.sock.getsockname()[1])
        self.timeout_s = timeout_s
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self.done = False
        self._thread = threading.Thread(target=self._run, name="opprof-colocation",
                                        daemon=True)

    def start(self) -> None:
        """Start conducting (on its own thread)."""
        self._thread.start()

    def schedule(self) -> list[tuple[int, list[int]]]:
        """(round, the ranks that compute at once) of every phase, in order: per round one
        rank alone, then 2 … N at once, the order reversed every other round, the ranks
        rotated so that every rank takes its turn alone."""
        out = []
        for rnd in range(self.rounds):
            counts = list(range(1, self.workers + 1))
            for k in counts[::-1] if rnd % 2 else counts:
                out.append((rnd, [(rnd + i) % self.workers for i in range(k)]))
        return out

    def _run(self) -> None:
        files: dict[int, Any] = {}
        try:
            while len(files) < self.workers:
                conn, _ = self.sock.accept()
                conn.settimeout(self.timeout_s)
                f = conn.makefile("rw", encoding="utf-8")
                files[int(json.loads(f.readline())["rank"])] = f
            for rnd, ranks in self.schedule():
                for r in ranks:
                    files[r].write(json.dumps({"seconds": self.seconds}) + "\n")
                    files[r].flush()
                for r in ranks:
                    line = files[r].readline()
                    if not line:
                        raise OSError(f"worker {r} closed the connection")
                    reply = json.loads(line)
                    for i, (ns, cpu) in enumerate(zip(reply["ns"], reply["cpu_ns"],
                                                      strict=True)):
                        self.samples.append({"rank": r, "kind": "coloc", "round": rnd,
                                             "k": len(ranks), "index": i, "ns": int(ns),
                                             "cpu_ns": int(cpu), "bytes": 0})
            for f in files.values():
                f.write(json.dumps({"seconds": 0}) + "\n")
                f.flush()
            self.done = True
        except (OSError, ValueError, KeyError) as exc:
            self.error = str(exc) or type(exc).__name__
        finally:
            for f in files.values():
                with contextlib.suppress(OSError):
                    f.close()

    def close(self) -> None:
        """Stop listening (the thread ends with its sockets)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def result(self, what: str) -> list[dict[str, Any]]:
        """The ``coloc`` samples (one line naming the failure when the loop did not end)."""
        if not self.done:
            raise OpprofError(f"{what}: the co-location loop did not finish "
                              f"({self.error or 'no worker connected'})")
        return self.samples


def launch(plan: list[tuple[str, list[str], dict[str, str], bool]], workdir: Path,
           timeout_s: float, what: str) -> None:
    """Start every process of ``plan`` (label, command, environment, must finish) under the
    one supervisor (:class:`opprof.collectors.supervisor.Supervisor`): each in its own
    process group, dying with this one; wait until those that must finish have exited
    cleanly; the first failure or the deadline stops all of them with one line."""
    with Supervisor(workdir, what, timeout_s=timeout_s) as sup:
        must = [sup.start(label, cmd, env=env, cwd=workdir, log=workdir / log_name(label))
                for label, cmd, env, _ in plan]
        must = [c for c, (_, _, _, m) in zip(must, plan, strict=True) if m]
        sup.wait(lambda _: all(c.code == 0 for c in must))


# --------------------------------------------------------------------------- the bodies


def _timed(call: Any, barrier: Any, job: Job, rank: int, wait: Any = None) -> list[dict]:
    """Warm up and time ``call(nbytes)`` for every size; ``wait(result)`` blocks until done."""
    samples = []
    for n in job.sizes:
        res = call(n)
        if wait:
            wait(res)
        for _ in range(job.repeat):
            barrier()
            t0 = time.perf_counter_ns()
            res = call(n)
            if wait:
                wait(res)
            samples.append({"rank": rank, "bytes": int(n), "ns": time.perf_counter_ns() - t0})
    return samples


def _beside(collective: Any, nbytes: int, barrier: Any, job: Job, rank: int) -> list[dict]:
    """A compute loop (a convolution's forward and backward on the worker's threads) timed
    alone, then while another thread runs the collective (the largest size, back to back) as
    DDP's gloo does beside backward: ``kind`` ``alone`` / ``beside`` samples, ns per chunk,
    and the collective's calls beside the loop (``collective_beside``, ns per call)."""
    import threading

    import torch

    x = torch.ones(8, 64, 28, 28, requires_grad=True)
    w = torch.ones(64, 64, 3, 3, requires_grad=True)

    def chunk() -> int:  # a convolution's forward and backward, as in training
        t0 = time.perf_counter_ns()
        torch.nn.functional.conv2d(x, w, padding=1).sum().backward()
        return time.perf_counter_ns() - t0

    for _ in range(5):
        chunk()
    out = []
    barrier()
    end = time.perf_counter_ns() + 300_000_000
    while time.perf_counter_ns() < end:
        out.append({"rank": rank, "bytes": 0, "ns": chunk(), "kind": "alone"})
    barrier()
    calls = max(3, job.repeat)
    timed: list[dict] = []

    def reduce() -> None:
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            collective()
            timed.append({"rank": rank, "bytes": int(nbytes), "ns": time.perf_counter_ns() - t0,
                          "kind": "collective_beside"})

    thread = threading.Thread(target=reduce)
    thread.start()
    while thread.is_alive():
        out.append({"rank": rank, "bytes": 0, "ns": chunk(), "kind": "beside"})
    thread.join()
    return out + timed


def _loop_config(fw: str, job: Job) -> Any:
    """The :class:`RecordConfig` of the co-location loop's model (``job.extra
    ["colocation"]``: ``model``, ``batch_size``) on this job's threads."""
    from opprof.collectors.config import RecordConfig
    from opprof.kinds import Framework

    spec = job.extra["colocation"]
    return RecordConfig(fw=Framework(fw), model=str(spec["model"]),
                        batch_size=int(spec["batch_size"]), threads=job.threads)


def train_step(fw: str, job: Job) -> Callable[[], object]:
    """The framework's own training step of the co-location loop's model, as `opprof record`
    builds it for one worker, on the built-in synthetic data, without the profiler."""
    config = _loop_config(fw, job)
    if fw == "torch":
        import torch

        from opprof.collectors.torch import build_training

        step, _, _ = build_training(config, torch.device("cpu"))
        return step
    if fw == "tf":
        from opprof.collectors.tf import local_step

        return local_step(config)
    from opprof.collectors.mxnet import local_step as mxnet_step

    return mxnet_step(config)


def colocation(fw: str, job: Job, rank: int) -> None:
    """This worker's part of the co-location loop (see the module docstring; nothing without
    ``job.extra["colocation"]``): build the step, warm it up, then compute when the conductor
    says so, for its seconds, and send back each step's wall time (ns)."""
    spec = job.extra.get("colocation")
    if not spec or not spec.get("port"):
        return
    step = train_step(fw, job)
    for _ in range(2):  # warm-up: graphs traced, buffers allocated
        step()
    with socket.create_connection((LOOPBACK, int(spec["port"])), timeout=job.timeout_s) as conn:
        f = conn.makefile("rw", encoding="utf-8")
        f.write(json.dumps({"rank": rank}) + "\n")
        f.flush()
        for line in f:
            seconds = float(json.loads(line).get("seconds") or 0.0)
            if seconds <= 0:
                break
            times: list[int] = []
            cpu: list[int] = []
            end = time.perf_counter_ns() + int(seconds * 1e9)
            while len(times) < PHASE_STEPS or time.perf_counter_ns() < end:
                t0, c0 = time.perf_counter_ns(), time.process_time_ns()
                step()
                times.append(time.perf_counter_ns() - t0)
                cpu.append(time.process_time_ns() - c0)
            f.write(json.dumps({"ns": times, "cpu_ns": cpu}) + "\n")
            f.flush()


def _tf_input(job: Job, rank: int, strategy: Any, barrier: Callable[[], object]) -> list[dict]:
    """What TensorFlow's distributed dataset costs a step (nothing without the co-location
    loop's model): MultiWorkerMirroredStrategy draws every batch through it — each worker's
    shard, its prefetching iterator — where a one-worker run iterates the dataset itself. The
    loop's step fed one way and the other (:func:`opprof.collectors.tf.local_step`), on every
    worker at once as in training, each for :data:`PHASE_S` seconds (at least
    :data:`PHASE_STEPS` steps), in :data:`INPUT_ROUNDS` rounds whose order alternates
    (``kind: input``, ``variant``: ``plain`` / ``distributed``, ``round``)."""
    if not job.extra.get("colocation"):
        return []
    from opprof.collectors.tf import local_step

    config = _loop_config("tf", job)
    steps = {"plain": local_step(config), "distributed": local_step(config, strategy)}
    for step in steps.values():  # functions traced, the iterators' prefetch started
        for _ in range(2):
            step()
    out: list[dict] = []
    for r in range(INPUT_ROUNDS):
        for variant in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            barrier()
            end, n = time.perf_counter_ns() + int(PHASE_S * 1e9), 0
            while n < PHASE_STEPS or time.perf_counter_ns() < end:
                t0 = time.perf_counter_ns()
                steps[variant]()
                out.append({"rank": rank, "bytes": 0, "ns": time.perf_counter_ns() - t0,
                            "kind": "input", "variant": variant, "round": r})
                n += 1
    return out


def _torch_main(job: Job, rank: int, workdir: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(job.threads or 1)
    dist.init_process_group("gloo", init_method=f"tcp://{job.master}", rank=rank,
                            world_size=job.workers,
                            timeout=datetime.timedelta(seconds=job.timeout_s))
    if job.extra.get("mode") == "fsdp":
        samples = _torch_fsdp(job, rank)
    else:
        tensors = {n: torch.ones(max(1, n // 4), dtype=torch.float32) for n in job.sizes}
        samples = _timed(lambda n: dist.all_reduce(tensors[n]), dist.barrier, job, rank)
        big = tensors[max(job.sizes)]
        samples += _beside(lambda: dist.all_reduce(big), max(job.sizes), dist.barrier, job,
                           rank)
        if job.extra.get("in_step", True):
            samples += _in_step(job, rank)
    colocation("torch", job, rank)
    _write(workdir, rank, job, samples, {"torch": torch.__version__})
    dist.destroy_process_group()


def _torch_fsdp(job: Job, rank: int) -> list[dict]:
    """FSDP's collectives for every size (the unit's unsharded bytes), called the way FSDP2
    calls them in training (``kind``: ``all_gather``, ``reduce_scatter``):

    - each call follows a stretch of compute on every rank (:data:`FSDP_GAP_NS`, a
      convolution's forward and backward), as a unit's forward or backward precedes it in
      training, not a barrier: the ranks arrive apart, the first one sleeps in the call and
      must be woken, and the buffers are cold;
    - an all-gather is FSDP's copy-in of the unit's parameter shards into a new flat buffer,
      the all-gather (async, then waited for) and the copy-out into newly allocated unsharded
      parameters; a reduce-scatter is the gradients' ``chunk_cat`` into a new buffer, the
      reduce-scatter (average) and the copy of this rank's shard;
    - every sample holds the call's ``enter`` and ``exit`` on the host's monotonic clock
      (every rank runs on this host), so the wait for the last rank to enter can be told
      from what the call costs after it (:func:`opprof.pipeline.calibrate.fsdp_network`)."""
    import importlib

    import torch
    import torch.distributed as dist

    importlib.import_module("torch.distributed.fsdp")  # registers FSDP2's torch.ops.fsdp
    fsdp = torch.ops.fsdp
    n_ranks = job.workers
    compute = _compute_for(FSDP_GAP_NS)

    def pieces(n: int) -> list[int]:  # numel of each parameter, each divisible by N
        numel = max(n // 4, n_ranks * len(UNIT_PIECES))
        return [max(n_ranks, int(numel * f) // n_ranks * n_ranks) for f in UNIT_PIECES]

    units = {n: pieces(n) for n in job.sizes}
    shards = {n: [torch.randn(k // n_ranks) for k in units[n]] for n in job.sizes}

    def all_gather(n: int) -> None:
        split = [k // n_ranks for k in units[n]]
        numel = sum(split)
        gathered = torch.empty(numel * n_ranks)
        inp, gathered = fsdp.all_gather_copy_in(shards[n], gathered, split, numel, rank)
        dist.all_gather_single(gathered, inp, async_op=True).wait()
        params = [torch.empty(k).view(n_ranks, -1) for k in units[n]]
        fsdp.split_with_sizes_copy(gathered.view(n_ranks, -1), split, dim=1, out=params)

    grads: dict[int, list[Any]] = {}

    def reduce_scatter(n: int) -> None:
        numel = sum(units[n])
        flat = torch.empty(numel)
        fsdp.chunk_cat(grads.pop(n), dim=0, num_chunks=n_ranks, out=flat.view(n_ranks, -1))
        shard = torch.empty(numel // n_ranks)
        dist.reduce_scatter_single(shard, flat, op=dist.ReduceOp.AVG)
        torch.empty_like(shard).copy_(shard)

    def new_grads(n: int) -> None:  # written by the backward just before, as in training
        grads[n] = [torch.full((k,), 1.0) for k in units[n]]

    out = []
    for n in job.sizes:
        all_gather(n)  # warm-up
        new_grads(n)
        reduce_scatter(n)
        for _ in range(job.repeat):
            for kind, call in (("all_gather", all_gather), ("reduce_scatter", reduce_scatter)):
                if kind == "reduce_scatter":
                    new_grads(n)
                compute()
                enter = time.monotonic_ns()
                call(n)
                done = time.monotonic_ns()
                out.append({"rank": rank, "bytes": int(n), "ns": done - enter, "kind": kind,
                            "enter": enter, "exit": done})
    return out + _sharded_ops(job, rank, units[max(job.sizes)])


#: The optimizer's in-place calls on one parameter of FSDP's shards (SGD with momentum's
#: ``mul_``, ``add_``, ``add_``), each timed :data:`SHARDED_OP_ROUNDS` times over a unit.
SHARDED_OP_ROUNDS = 40


def _sharded_ops(job: Job, rank: int, pieces: list[int]) -> list[dict]:
    """What an optimizer's call costs on FSDP2's sharded parameters (``DTensor``s) beyond
    the same call on their local shards (``kind`` ``sharded_op`` and ``local_op``, ``ns`` per
    call): a unit's parameters and gradients, sharded on dim 0 over the workers' mesh, each
    updated as SGD with momentum does (``mul_``, ``add_``, ``add_``), under the profiler with
    the recorder's settings (record_shapes, profile_memory: the run's steps are profiled, and
    a call on a ``DTensor`` records more) — alternately, so both see the same host."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.profiler import ProfilerActivity, profile

    mesh = init_device_mesh("cpu", (job.workers,))
    sharded = [(distribute_tensor(torch.randn(k), mesh, [Shard(0)]),
                distribute_tensor(torch.randn(k), mesh, [Shard(0)])) for k in pieces]
    local = [(p.to_local(), g.to_local()) for p, g in sharded]

    def update(params: list[tuple[Any, Any]]) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(SHARDED_OP_ROUNDS):
            for p, g in params:
                p.mul_(0.9)
                p.add_(g)
                p.add_(g, alpha=-0.01)
        return (time.perf_counter_ns() - t0) / (SHARDED_OP_ROUNDS * 3 * len(params))

    update(sharded), update(local)  # warm-up: DTensor caches each call's sharding
    out = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True):
        for _ in range(max(3, job.repeat // 3)):
            out.append({"rank": rank, "kind": "sharded_op", "ns": update(sharded), "bytes": 0})
            out.append({"rank": rank, "kind": "local_op", "ns": update(local), "bytes": 0})
    return out


#: In-step calls: the message sizes (bytes), the compute bursts before each call (ns) and
#: the timed calls per (kind, size, burst) — a tensor-parallel step's activations and a
#: pipeline's micro-batch activations are tens of KiB to a few MiB, the compute between
#: two of its collectives one to tens of milliseconds.
IN_STEP_SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
IN_STEP_BURSTS_NS = (1_000_000, 4_000_000, 12_000_000)
IN_STEP_CALLS = 8


def _in_step_spec(job: Job, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...],
                                                             int] | None:
    """(sizes, bursts, calls) of the in-step calls: ``job.extra["in_step"]``'s (a dict may
    name ``sizes``, ``bursts_ns`` and ``calls``) else the defaults, ``sizes`` the kind's;
    None where it is ``False`` (no in-step calls)."""
    spec = job.extra.get("in_step", True)
    if spec is False:
        return None
    spec = spec if isinstance(spec, dict) else {}
    return (tuple(int(n) for n in spec.get("sizes") or sizes),
            tuple(int(b) for b in spec.get("bursts_ns") or IN_STEP_BURSTS_NS),
            int(spec.get("calls") or IN_STEP_CALLS))


def _timed_call(call: Callable[[int], Any], rank: int, kind: str, nbytes: int, burst: int,
                index: int) -> dict[str, Any]:
    """``call(nbytes)`` timed on the host's monotonic clock: one in-step sample (``enter``,
    ``exit``, ``ns``; ``call`` its index among its size's and burst's)."""
    enter = time.monotonic_ns()
    call(nbytes)
    done = time.monotonic_ns()
    return {"rank": rank, "kind": kind, "bytes": int(nbytes), "burst_ns": burst,
            "ns": done - enter, "enter": enter, "exit": done, "call": index}


def _in_step(job: Job, rank: int) -> list[dict]:
    """Each collective a model-parallel step blocks in, called as the step calls it: after a
    burst of compute on every rank (:func:`_compute_for`, the same work on each, so the
    ranks arrive apart only as the host makes them), per size of :data:`IN_STEP_SIZES`
    and burst of :data:`IN_STEP_BURSTS_NS`, :data:`IN_STEP_CALLS` times (after one warm-up;
    ``job.extra["in_step"]``, a dict, may name other ``sizes``, ``bursts_ns`` and ``calls``,
    ``False`` leaves the calls out):

    - ``in_step_all_reduce``: tensor parallel's — DTensor's functional all-reduce
      (``_functional_collectives.all_reduce``: a copy of the input, the call queued on
      gloo's thread) and its ``wait_tensor``;
    - ``in_step_p2p``: a pipeline's — rank 0 ``isend``s, rank 1 ``irecv``s and waits (the
      direction alternates with each call: activations forward, gradients back); the other
      ranks (more than 2 workers) pair up the same way;
    - ``in_step_pipeline``: then a pipeline's steps themselves (:func:`_in_step_pipeline`).

    Every sample holds ``bytes``, ``burst_ns``, ``enter`` and ``exit`` on the host's monotonic
    clock (all ranks are on this host): :func:`opprof.model.instep.fit_in_step` tells the
    wait for the last rank from what the call costs after it. The calls run under the
    profiler with the recorder's settings, as the recorded steps the model predicts do."""
    import torch.distributed as dist

    spec = _in_step_spec(job, IN_STEP_SIZES)
    if spec is None:
        return []
    sizes, bursts, calls = spec
    group = dist.group.WORLD
    peer = rank ^ 1 if (rank ^ 1) < job.workers else -1
    out: list[dict] = []
    for burst in bursts:
        compute = _compute_for(burst)
        with _profiled(job):  # each burst's calls in one session: its events stay few
            out += _in_step_calls(compute, burst, sizes, calls, rank, peer, group)
    if peer >= 0 and (rounds := _pipeline_rounds(job)):
        with _profiled(job):
            out += _in_step_pipeline(rank, peer, rounds)
    return out


def _profiled(job: Job) -> Any:
    """The profiler with the recorder's settings, as the recorded steps that the model
    predicts run (``job.extra["in_step_profiled"]`` False: none)."""
    from torch.profiler import ProfilerActivity, profile

    if not job.extra.get("in_step_profiled", True):
        return contextlib.nullcontext()
    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True)


def _in_step_calls(compute: Callable[[], None], burst: int, sizes: tuple[int, ...],
                   calls: int, rank: int, peer: int, group: Any) -> list[dict]:
    """One burst's in-step calls (:func:`_in_step`): round after round, every size's
    all-reduce, then (with a partner) every size's send/recv, so that a passing burst of the
    host's load falls on all sizes alike, not on one; the first round a warm-up."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as fc

    xs = {n: torch.ones(max(1, n // 4)) for n in sizes}
    bufs = {n: torch.empty_like(x) for n, x in xs.items()}
    out: list[dict] = []
    for i in range(calls + 1):
        for n in sizes:
            compute()
            got = _timed_call(lambda m: fc.wait_tensor(fc.all_reduce(xs[m], "sum", group)),
                              rank, "in_step_all_reduce", n, burst, i - 1)
            if i:
                out.append(got)
        if peer < 0:
            continue
        sender = (i % 2) == (rank % 2)  # activations forward, gradients back

        def p2p(n: int, sender: bool = sender) -> None:
            _done(dist.isend(xs[n], peer) if sender else dist.irecv(bufs[n], peer))

        for n in sizes:
            compute()
            got = _timed_call(p2p, rank, "in_step_p2p", n, burst, i - 1)
            if i:
                out.append({**got, "pair": min(rank, peer),
                            "role": "send" if sender else "recv"})
    dist.barrier()
    return out


#: The synthetic pipeline of the in-step calls (:func:`_in_step_pipeline`): micro-batches per
#: step; each stage's forward and backward per micro-batch, one pair per setting (a small
#: model's micro-batch computes for a fraction of a millisecond to a few); the activation's
#: bytes; and the steps timed per setting after one warm-up.
PIPELINE_MICROBATCHES = 4
PIPELINE_BURSTS_NS = ((250_000, 500_000), (1_000_000, 2_000_000), (3_000_000, 6_000_000))
PIPELINE_BYTES = 64 << 10
PIPELINE_ROUNDS = 24


def _pipeline_rounds(job: Job) -> int:
    """The synthetic pipeline's timed steps: ``job.extra["in_step"]["pipeline_rounds"]`` (0:
    none) else :data:`PIPELINE_ROUNDS`."""
    spec = job.extra.get("in_step", True)
    if spec is False:
        return 0
    rounds = spec.get("pipeline_rounds") if isinstance(spec, dict) else None
    return PIPELINE_ROUNDS if rounds is None else int(rounds)


def _in_step_pipeline(rank: int, peer: int, rounds: int) -> list[dict]:
    """A pipeline's hand-offs as a pipeline makes them: per setting of
    :data:`PIPELINE_BURSTS_NS` the pair runs a GPipe step of two stages back to back,
    ``rounds`` times after a warm-up — the lower rank (stage 0) computes
    each micro-batch's forward and ``isend``s its activation *and goes on computing*, the
    other ``irecv``s it, waits and computes; then the backwards the other way — so a transfer
    happens while both ranks compute, as in a pipeline (not after a barrier, as the p2p calls
    above). One sample per rank, setting and step (``kind: in_step_pipeline``): ``exit``
    (the step's end on the host's monotonic clock), the stage, the setting's forward
    ``burst_ns``, the micro-batches, and the mean
    ``forward_ns`` / ``backward_ns`` its bursts took: :func:`opprof.model.instep.fit_in_step`
    finds the hand-off cost that makes the schedule of those bursts last as long."""
    import torch

    m = PIPELINE_MICROBATCHES
    acts = [torch.ones(PIPELINE_BYTES // 4) for _ in range(m)]
    bufs = [torch.empty_like(a) for a in acts]
    first = rank < peer
    out: list[dict] = []
    for f_burst, b_burst in PIPELINE_BURSTS_NS:
        forward, backward = _layers_for(f_burst), _layers_for(b_burst)
        for k, row in enumerate(_pipeline_steps(forward, backward, acts, bufs, first, peer,
                                                rounds)):
            out.append({"rank": rank, "kind": "in_step_pipeline", "pair": min(rank, peer),
                        "stage": 0 if first else 1, "burst_ns": f_burst, "round": k,
                        "microbatches": m, "bytes": PIPELINE_BYTES, **row})
    return out


def _pipeline_steps(forward: Callable[[], None], backward: Callable[[], None], acts: list,
                    bufs: list, first: bool, peer: int, rounds: int) -> list[dict]:
    """``rounds`` GPipe steps of one stage after a warm-up (:func:`_in_step_pipeline`): per
    step its end (``exit``) and its bursts' mean ``forward_ns`` / ``backward_ns``."""
    import torch.distributed as dist

    m = len(acts)

    def timed(fn: Callable[[], None]) -> int:
        t0 = time.monotonic_ns()
        fn()
        return time.monotonic_ns() - t0

    out: list[dict] = []
    dist.barrier()
    for k in range(rounds + 1):
        f_ns: list[int] = []
        b_ns: list[int] = []
        sends: list[Any] = []
        for i in range(m):
            if not first:
                _done(dist.irecv(bufs[i], peer))
            f_ns.append(timed(forward))
            if first:
                sends.append(dist.isend(acts[i], peer))
        for i in range(m):
            if first:
                _done(dist.irecv(bufs[i], peer))
            b_ns.append(timed(backward))
            if not first:
                sends.append(dist.isend(acts[i], peer))
        for work in sends:
            _done(work)
        if k:
            out.append({"exit": time.monotonic_ns(), "forward_ns": sum(f_ns) / m,
                        "backward_ns": sum(b_ns) / m})
    dist.barrier()
    return out


def _done(work: Any) -> None:
    """Wait for a point-to-point call's work (None: nothing to wait for)."""
    if work is not None:
        work.wait()


def _layers_for(ns: int) -> Callable[[], None]:
    """A function that computes for about ``ns`` in small operators, as a micro-batch of a
    small model does (a 2-layer perceptron's forward and backward on a few rows, repeated):
    the profiler's cost per operator included as in a recorded step."""
    import torch

    x = torch.ones(64, 128)
    w1 = torch.ones(128, 128, requires_grad=True)
    w2 = torch.ones(128, 128, requires_grad=True)

    def chunk() -> None:
        torch.relu(x @ w1).matmul(w2).sum().backward()

    return _repeated(chunk, ns)


def _compute_for(ns: int) -> Any:
    """A function that computes for about ``ns`` on this worker's threads (a small
    convolution's forward and backward, repeated; the count fixed once, so later calls do
    the same work however busy the host is)."""
    import torch

    x = torch.ones(4, 32, 28, 28, requires_grad=True)
    w = torch.ones(32, 32, 3, 3, requires_grad=True)

    def chunk() -> None:
        torch.nn.functional.conv2d(x, w, padding=1).sum().backward()

    return _repeated(chunk, ns)


def _repeated(chunk: Callable[[], Any], ns: int) -> Callable[[], None]:
    """``chunk`` repeated for about ``ns`` (the count taken once from its second-fastest of
    four runs, so later calls do the same work however busy the host is)."""
    times = []
    for _ in range(4):
        t0 = time.perf_counter_ns()
        chunk()
        times.append(time.perf_counter_ns() - t0)
    reps = max(1, round(ns / max(sorted(times)[1], 1)))

    def compute() -> None:
        for _ in range(reps):
            chunk()

    return compute


#: The data-parallel in-step calls of MXNet and TensorFlow (:func:`_in_step_dp`): a step's
#: gradients are tens of KiB to tens of MiB, the compute before their collective the step's.
DP_IN_STEP_SIZES = (16 << 10, 256 << 10, 4 << 20)


def _in_step_dp(call: Callable[[int], Any], wait: Callable[[Any], Any], job: Job,
                rank: int, barrier: Callable[[], Any]) -> list[dict]:
    """MXNet's and TensorFlow's gradient collective (``call(nbytes)``, then ``wait`` on its
    result) called as a training step calls it: after a burst of compute on every rank
    (:func:`_numpy_burst`, the same work on each), per size of :data:`DP_IN_STEP_SIZES` and
    burst of :data:`IN_STEP_BURSTS_NS`, :data:`IN_STEP_CALLS` times after one warm-up —
    ``kind: in_step_all_reduce`` samples with ``enter`` and ``exit`` on the host's clock, as
    torch's (:func:`_in_step`; ``job.extra["in_step"]`` as there). No profiler runs: the
    frameworks' own profilers are not a per-call setting here."""
    spec = _in_step_spec(job, DP_IN_STEP_SIZES)
    if spec is None:
        return []
    sizes, bursts, calls = spec
    out: list[dict] = []
    for burst in bursts:
        compute = _numpy_burst(burst)
        barrier()
        for i in range(calls + 1):
            for n in sizes:
                compute()
                got = _timed_call(lambda m: wait(call(m)), rank, "in_step_all_reduce", n,
                                  burst, i - 1)
                if i:
                    out.append(got)
    return out


def _numpy_burst(ns: int) -> Callable[[], None]:
    """A function that computes for about ``ns`` on this process's threads (a matrix
    product, repeated; the count fixed once, as :func:`_compute_for`'s) — any framework's."""
    import numpy as np

    a = np.ones((128, 128), dtype=np.float32)
    return _repeated(lambda: a @ a, ns)


def _mxnet_main(job: Job, rank: int, workdir: Path) -> None:
    from opprof.collectors.mxnet_lib import import_mxnet

    mx = import_mxnet()
    kv = mx.kv.create("dist_sync")
    arrays = {}
    spec = _in_step_spec(job, DP_IN_STEP_SIZES)
    in_step = spec[0] if spec is not None else ()
    for key, n in enumerate(dict.fromkeys((*job.sizes, *in_step))):
        a = mx.nd.ones((max(1, n // 4),), dtype="float32")
        kv.init(key, a)
        arrays[n] = (key, a, mx.nd.zeros_like(a))
    mx.nd.waitall()

    def call(n: int) -> Any:
        key, a, out = arrays[n]
        kv.pushpull(key, a, out=out)
        return out

    samples = _timed(call, kv._barrier, job, kv.rank, lambda out: out.wait_to_read())
    samples += _in_step_dp(call, lambda out: out.wait_to_read(), job, kv.rank, kv._barrier)
    colocation("mxnet", job, kv.rank)
    _write(workdir, kv.rank, job, samples, {"mxnet": mx.__version__})


def _tf_main(job: Job, rank: int, workdir: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if job.threads:
        tf.config.threading.set_intra_op_parallelism_threads(job.threads)
        tf.config.threading.set_inter_op_parallelism_threads(job.threads)
    impl = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=impl))

    def replica(x: Any) -> Any:
        # A function input carries no device; the all-reduce needs its destinations.
        x = tf.identity(x)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)

    @tf.function
    def reduce(x: Any) -> Any:
        return strategy.run(replica, args=(x,))

    pieces = int(job.extra.get("pieces", 1))
    spec = _in_step_spec(job, DP_IN_STEP_SIZES)
    in_step = spec[0] if spec is not None else ()
    tensors = {n: [tf.ones([max(1, n // 4 // pieces)], tf.float32) for _ in range(pieces)]
               for n in dict.fromkeys((*job.sizes, *in_step))}
    small = [tf.ones([1], tf.float32)]

    def done(res: Any) -> list:
        return [strategy.experimental_local_results(r)[0].numpy() for r in res]

    samples = _timed(lambda n: reduce(tensors[n]), lambda: reduce(small), job, rank, done)
    for n in in_step:  # each size's function traced before the timed calls
        done(reduce(tensors[n]))
    samples += _in_step_dp(lambda n: reduce(tensors[n]), done, job, rank,
                           lambda: done(reduce(small)))
    # MultiWorkerMirroredStrategy packs the gradients into one tensor before the all-reduce
    # and splits the result (ConcatV2 / SplitV in the update): time that copy alone too.
    parts = [tf.ones([max(1, n // 4 // PACK_PIECES)], tf.float32) for n in job.sizes
             for _ in range(PACK_PIECES)]
    by_size = {n: parts[i * PACK_PIECES:(i + 1) * PACK_PIECES] for i, n in
               enumerate(job.sizes)}

    @tf.function
    def pack(xs: list) -> Any:
        flat = tf.concat([tf.reshape(x, [-1]) for x in xs], 0)
        return tf.split(flat, [int(x.shape[0]) for x in xs])

    for n in job.sizes:
        pack(by_size[n])[0].numpy()
        for _ in range(job.repeat):
            t0 = time.perf_counter_ns()
            pack(by_size[n])[-1].numpy()
            samples.append({"rank": rank, "bytes": int(n), "ns": time.perf_counter_ns() - t0,
                            "kind": "pack"})
    colocation("tf", job, rank)
    samples += _tf_input(job, rank, strategy, lambda: done(reduce(small)))
    _write(workdir, rank, job, samples, {"tensorflow": tf.__version__})
    sys.stdout.flush()
    os._exit(0)  # TF's collective and gRPC threads make a normal exit slow


def _write(workdir: Path, rank: int, job: Job, samples: list[dict], versions: dict) -> None:
    doc = {"rank": rank, "threads": job.threads, "versions": versions, "samples": samples}
    tmp = workdir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(workdir / f"rank{rank}.json")


def main(argv: list[str]) -> int:
    """Entry point of every benchmark process (``python -m opprof.collectors.netbench``)."""
    if argv[:1] == ["mxnet-node"]:
        from opprof.collectors.mxnet_lib import import_mxnet

        import_mxnet()  # a scheduler or server runs inside the import until the job ends
        return 0
    if len(argv) == 4 and argv[0] in ("torch", "mxnet", "tf"):
        job = Job(**{**json.loads(argv[1])})
        job.sizes = tuple(job.sizes)
        body = {"torch": _torch_main, "mxnet": _mxnet_main, "tf": _tf_main}[argv[0]]
        body(job, int(argv[2]), Path(argv[3]))
        return 0
    print("usage: python -m opprof.collectors.netbench torch|mxnet|tf JOB RANK WORKDIR",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
