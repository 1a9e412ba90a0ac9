"""Entry point of every process `record` starts: ``python -m opprof.collectors.worker CONFIG
FOLDER`` trains the built-in model of CONFIG (a RecordConfig as JSON) under the runner, as
whatever the launcher made it (torchrun's rank, a DMLC role, a TF_CONFIG task, or alone).

The process writes its output to ``<its label>.log`` in FOLDER, dies with its parent, and a
failure becomes one line in its status (the supervisor names it) besides the traceback in
its log. SIGTERM (the supervisor stopping an interrupted run, torchrun stopping the other
ranks) ends it as an exception, so that the runner first writes the profiled steps that
completed; the process then ends by SIGTERM. MXNet's servers and scheduler, which run inside
MXNet's C++ code and never return to Python, keep SIGTERM's default action.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from opprof.collectors.channel import Reporter, report_error, status_dir, watch_faults
from opprof.collectors.config import Facts, Framework, RecordConfig
from opprof.collectors.runner import env_identity, fault_point, pend, pending, writing
from opprof.collectors.supervisor import STACKS_SIGNAL, die_with_parent, log_name
from opprof.errors import Interrupted, OpprofError, first_line


def main(argv: list[str]) -> int:
    """Run one process of a recording (see the module docstring)."""
    if len(argv) != 2:
        print("usage: python -m opprof.collectors.worker CONFIG FOLDER", file=sys.stderr)
        return 2
    config_path, folder = Path(argv[0]), Path(argv[1])
    role, rank, label = env_identity()
    _log_to(folder / log_name(label))
    faulthandler.register(STACKS_SIGNAL, all_threads=True)  # the supervisor's dump_stacks
    die_with_parent()
    me = Facts(pid=os.getpid(), host=socket.gethostname(), label=label, role=role, rank=rank)
    Reporter(folder, me).update()  # known to the supervisor from the start
    watch_faults(folder)
    if os.environ.get("DMLC_ROLE") not in ("server", "scheduler"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        config = RecordConfig.from_json(config_path.read_text())
        fault_point(label, "setup")
        adapter = importlib.import_module(f"opprof.collectors.{config.fw}")
        adapter.record_worker(config, folder)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line for the parent
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        if isinstance(exc, Interrupted):
            _end_by(exc.sig, folder, me, str(exc))
        # This process is failing on its own: a launcher's SIGTERM now (torchrun stops the
        # other ranks when one dies) must not cut the report short, or this rank would read
        # as interrupted with no error of its own.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        traceback.print_exc()
        message = f"{type(exc).__name__}: {first_line(exc)}"
        report_error(folder, me, message)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2 if isinstance(exc, OpprofError) else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    if config.fw in (Framework.TF, Framework.TORCH):
        # Everything is written: skip the interpreter's teardown, where TF's gRPC and
        # collective threads are slow to stop and a gloo thread still joinable when torch's
        # statics are destroyed aborts the rank ("terminate called without an active
        # exception", SIGABRT), now and then, under load.
        os._exit(0)
    return 0  # a normal exit: MXNet's kvstore tells the scheduler this worker is done


_STOPPING: list[int] = []  # pids that have begun to stop on a SIGTERM


def _on_sigterm(sig: int, frame: Any) -> None:
    """Stop on the first SIGTERM only: a second one (torchrun stops the remaining ranks as
    soon as one has ended, and the supervisor signals them too) must not cut short the
    writing of the profiled steps that the first began (CI, stop 46: rank 0 came out of its
    collective on the first, was keeping its steps when torchrun's arrived, and wrote none).
    Unless the first never took effect: raised inside an object's ``__del__`` (MXNet freeing
    an NDArray) Python only printed it, and a parameter-server worker whose peer has stopped
    may never reach the next step, where it would be raised again (local CI: worker 1 of an
    interrupted ps-sync run waited in the kvstore until it was killed, its trace unkept) — a
    later SIGTERM raises it again."""
    if os.getpid() in _STOPPING:
        again = pending()
        if again is not None and not writing():
            raise again
        return
    stop = Interrupted(sig, "terminated by SIGTERM")
    pend(stop)  # raised again after the step if Python swallows it here
    if writing():
        return  # the trace being written is finished first
    _STOPPING.append(os.getpid())
    raise stop


def _end_by(sig: int, folder: Path, me: Facts, reason: str) -> None:
    """End this process by signal ``sig`` (its exit status says so), its status saying why
    unless the runner already did."""
    try:
        facts = Facts.from_json((status_dir(folder) / f"{me.pid}.status").read_text())
    except (OSError, ValueError, TypeError):
        facts = me
    if facts.ended is None:
        Reporter(folder, facts).update(ended=reason)
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _log_to(log: Path) -> None:
    """Send this process's stdout and stderr (the file descriptors: native libraries too)
    to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Interrupted as stop:  # a SIGTERM in the instant before main's failure path ignores it
        _end_by(stop.sig, Path(sys.argv[2]), Facts(pid=os.getpid(), host=socket.gethostname(),
                label=env_identity()[2]), str(stop))
