"""Record a user's training script under its framework's own profiler, with no opprof marker.

This is how the unmarked fixtures (``fixtures/unmarked/``) are made, and how the slow tests
re-record them live: the script in ``tests/scripts/`` runs unchanged (``runpy``), and the
framework's native profiler is switched on from outside after ``--warmup`` training steps
and off when the script ends, the way a user profiles their own job. Nothing here imports
opprof, and no marker (step, phase or clock) is added to the trace:

* torch: ``torch.profiler.profile`` started from the global optimizer step post-hook after
  the warm-up steps; the trace is exported as ``rank{R}.pt.trace.json.gz`` (R = ``RANK``
  under torchrun), with torch's own ``key_averages()`` beside it;
* TensorFlow: ``tf.profiler.experimental.start(logdir)`` before the first batch after the
  warm-up — for ``model.fit`` from a callback's ``on_train_batch_begin`` (what Keras'
  TensorBoard callback does with ``profile_batch``), for a custom loop from the
  ``tf.data`` iterator's ``__next__`` — and ``stop()`` at the end; the logdir is
  ``[workerK/]plugins/profile/<run>/<host>.xplane.pb``;
* MXNet: ``mx.profiler.set_config(profile_all=True, aggregate_stats=True)`` and
  ``set_state("run")`` after ``gluon.Trainer.step`` of the last warm-up step (after
  ``mx.nd.waitall()``, as MXNet's profiler guide does), ``stop`` and ``dump`` at the end;
  the trace is ``rank{R}_worker.json.gz`` with ``mx.profiler.dumps()`` beside it. With
  ``--workers N`` the script runs as a ``dist_sync`` parameter-server job on loopback (one
  scheduler, one server, N workers: the DMLC roles MXNet's own launcher sets).

Usage::

    python -m tests.unmarked torch tests/scripts/torch_loop.py -o fixtures/unmarked/torch-loop
    python -m tests.unmarked torch tests/scripts/torch_ddp.py --workers 2 -o OUT
    python -m tests.unmarked tf tests/scripts/tf_keras_fit.py -o OUT --warmup 2 --steps 3
    python -m tests.unmarked mxnet tests/scripts/mxnet_gluon.py --workers 2 -o OUT
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import runpy
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"


def record(fw: str, script: Path, out: Path, *, warmup: int = 2, steps: int = 3,
           batch_size: int = 4, workers: int = 1, timeout: float = 300) -> Path:
    """Run ``script`` for ``warmup + steps`` training steps with ``fw``'s profiler on for the
    last ``steps``; write the native traces into ``out`` (replaced) and return it."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    child = [sys.executable, "-m", "tests.unmarked", "_child", fw, str(Path(script).resolve()),
             str(out.resolve()), str(warmup), str(steps), "--", "--steps",
             str(warmup + steps), "--batch-size", str(batch_size)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TF_CPP_MIN_LOG_LEVEL": "2"}
    if workers == 1:
        _run([child], [env], timeout, out)
    elif fw == "torch":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                    str(workers), "--master-addr", "127.0.0.1", "--master-port",
                    str(_free_port())]
        _run([launcher + child[1:]], [env], timeout, out)
    elif fw == "mxnet":
        port = _free_port()
        dmlc = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(workers),
                "DMLC_NODE_HOST": "127.0.0.1", "PS_VERBOSE": "0"}
        roles = ["scheduler", "server"] + ["worker"] * workers
        dist = child + ["--kvstore", "dist_sync"]
        _run([dist] * len(roles), [{**env, **dmlc, "DMLC_ROLE": r} for r in roles], timeout,
             out)
    else:
        raise SystemExit(f"--workers {workers}: only torch (torchrun) and mxnet (dist_sync)")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmds: list[list[str]], envs: list[dict], timeout: float, out: Path) -> None:
    """Start every process, wait for all; on a failure or the timeout stop them all and say
    which one failed and how, with the end of its log."""
    logs = [out / f"process{i}.log" for i in range(len(cmds))]
    procs = []
    for cmd, env, log in zip(cmds, envs, logs, strict=True):
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=f,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if bad or time.monotonic() > deadline:
                failed = bad[0] if bad else None
                break
            time.sleep(0.2)
        else:
            bad = [i for i, p in enumerate(procs) if p.returncode != 0]
            failed = bad[0] if bad else None
            if failed is None:
                for log in logs:
                    log.unlink()
                return
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    what = (f"process {failed} exited with {procs[failed].returncode}" if failed is not None
            else f"timed out after {timeout:g}s")
    tail = logs[failed if failed is not None else 0].read_text()[-3000:]
    raise RuntimeError(f"recording {cmds[0]} {what}:\n{tail}")


# --------------------------------------------------------------------------- in the child


def _child(fw: str, script: str, out: str, warmup: int, steps: int, argv: list[str]) -> None:
    out_dir = Path(out)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))
    if fw == "torch":
        stop = _torch(out_dir, warmup)
    elif fw == "tf":
        stop = _tf(out_dir, warmup)
    elif fw == "mxnet":
        stop = _mxnet(out_dir, warmup)
    else:
        raise SystemExit(f"unknown framework {fw!r}")
    runpy.run_path(script, run_name="__main__")
    stop()


def _torch(out: Path, warmup: int):
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    rank = int(os.environ.get("RANK", "0"))
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True)
    done = [0]

    def after_step(optimizer, args, kwargs) -> None:
        done[0] += 1
        if done[0] == warmup:
            prof.start()

    register_optimizer_step_post_hook(after_step)
    if warmup == 0:
        prof.start()

    def stop() -> None:
        prof.stop()
        prof.export_chrome_trace(str(out / f"rank{rank}.pt.trace.json.gz"))
        rows = [{"name": e.key, "count": e.count, "cpu_time_total_us": e.cpu_time_total,
                 "self_cpu_time_total_us": e.self_cpu_time_total}
                for e in prof.key_averages()]
        (out / f"rank{rank}.key_averages.json").write_text(json.dumps(rows, indent=0))

    return stop


def _tf(out: Path, warmup: int):
    import keras
    import tensorflow as tf
    from tensorflow.python.data.ops import iterator_ops

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task")
    logdir = out / (f"{task['type']}{task['index']}" if task else "")
    state = {"batches": 0, "on": False}

    def start() -> None:
        if not state["on"]:
            state["on"] = True
            tf.profiler.experimental.start(str(logdir))

    # A custom loop takes each batch from the tf.data iterator in Python.
    next_batch = iterator_ops.OwnedIterator.__next__

    def counted_next(self):
        state["batches"] += 1
        if state["batches"] == warmup + 1:
            start()
        return next_batch(self)

    iterator_ops.OwnedIterator.__next__ = counted_next

    # model.fit runs its own loop: a callback, as Keras' TensorBoard(profile_batch=…) does.
    class StartAfterWarmup(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                start()

    fit = keras.Model.fit

    def fit_with_profile(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StartAfterWarmup()]
        return fit(self, *args, **kwargs)

    keras.Model.fit = fit_with_profile
    if warmup == 0:
        start()

    def stop() -> None:
        if state["on"]:
            tf.profiler.experimental.stop()

    return stop


def _mxnet(out: Path, warmup: int):
    import numpy as np

    np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
    import mxnet as mx
    from mxnet import gluon

    state = {"steps": 0, "trace": None, "rank": 0}

    def start(trainer=None) -> None:
        # A dist kvstore numbers the workers once the trainer has made it (the first step).
        kv = getattr(trainer, "_kvstore", None)
        state["rank"] = kv.rank if kv is not None and "dist" in kv.type else 0
        state["trace"] = out / f"rank{state['rank']}_worker.json"
        mx.nd.waitall()
        mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                               filename=str(state["trace"]))
        mx.profiler.set_state("run")

    step = gluon.Trainer.step

    def counted_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        state["steps"] += 1
        if state["steps"] == warmup:
            start(self)
        return result

    gluon.Trainer.step = counted_step
    if warmup == 0:
        start()

    def stop() -> None:
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        trace = state["trace"]
        (out / f"rank{state['rank']}_worker.dumps.txt").write_text(mx.profiler.dumps())
        mx.profiler.dump()
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()

    return stop


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        fw, script, out, warmup, steps = argv[1:6]
        rest = argv[argv.index("--") + 1:]
        _child(fw, script, out, int(warmup), int(steps), rest)
        return
    p = argparse.ArgumentParser(prog="python -m tests.unmarked", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("fw", choices=["torch", "tf", "mxnet"])
    p.add_argument("script", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args(argv)
    print(record(a.fw, a.script, a.out, warmup=a.warmup, steps=a.steps,
                 batch_size=a.batch_size, workers=a.workers))


if __name__ == "__main__":
    main()
