"""Collectors: one runner plus small framework adapters, recording training under each
framework's native profiler into native traces. A collector never analyzes: it returns the
native files and the run's metadata, and the matching normalizer turns them into a Trace.

* :mod:`.runner` — the protocol every profiled process follows: ``warmup`` unprofiled steps,
  ``timing_steps`` unprofiled timed steps (their mean is ``meta["unprofiled_step_ns"]``, so
  the profiler's own overhead is known), then ``steps`` profiled steps between step markers;
  progress and facts go to the run folder (:mod:`.channel`);
* :mod:`.supervisor` — starts, watches and stops every process, names who died or hung;
* :mod:`.memory` — samples the resident memory of every process of a run from outside
  (``memory/<pid>.memory.csv`` in the run folder);
* :mod:`.torch`, :mod:`.tf`, :mod:`.mxnet` — the adapters: only framework calls (profiler
  start/stop/markers, barrier, facts, the built-in models' step, the hook of `run`);
* :mod:`.jobs` — `record`: the processes a built-in model's job starts (torchrun, DMLC roles,
  TF_CONFIG tasks), each running :mod:`.worker`;
* :mod:`.inject` — `run`: the startup hook injected into every Python process of a command;
  ``opprof.profile()`` (:mod:`opprof.pipeline.profile`) runs the same runner under a
  script's own control;
* :mod:`.config` — typed configuration and facts; imports no framework (nor does importing
  any collector module: frameworks are imported when a recording runs).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from opprof.collectors.config import (
    FRAMEWORKS,
    MODELS,
    MODES,
    Device,
    Framework,
    Mode,
    Protocol,
    RecordConfig,
    Rendezvous,
    Role,
    require_installed,
)
from opprof.collectors.launch import Recording, check, record
from opprof.collectors.supervisor import Progress, no_progress
from opprof.errors import OpprofError
from opprof.kinds import framework_info

__all__ = ["FRAMEWORKS", "MODELS", "MODES", "Device", "Framework", "Mode", "Progress",
           "Protocol", "RecordConfig", "Recording", "Rendezvous", "Role", "adapter", "check",
           "no_progress", "record"]

def adapter(fw: str | Framework) -> ModuleType:
    """The adapter module of a framework, with a clear error when the framework is not
    installed (checked without importing the framework)."""
    try:
        fw = Framework(fw)
    except ValueError:
        raise OpprofError(
            f"unknown framework {fw!r}; choose from {', '.join(FRAMEWORKS)}") from None
    require_installed(fw)
    return importlib.import_module(framework_info(fw).adapter)
