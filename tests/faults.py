"""Test-only faults: make one process of a recording fail when it reaches a stage. The
runner reads the fault from ``$OPPROF_TEST_FAULT`` in every process it runs
(:func:`opprof.collectors.runner.fault_point`); :func:`injected` sets it for the duration of
a recording started from the test's process (its processes inherit it)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from opprof.collectors.runner import FAULT_ACTIONS, FAULT_ENV


@dataclass(frozen=True)
class Fault:
    """Make the process labelled ``who`` (``rank 1``, ``worker 1``, ``server 0``,
    ``scheduler``) do ``action`` (one of :data:`~opprof.collectors.runner.FAULT_ACTIONS`:
    exit with code 3, hang, pause 30 s, be killed, be stopped, or be killed by the kernel
    while writing its trace) when it reaches stage ``at`` (``setup``, ``warmup``, ``timing``,
    ``profile``, ``write``)."""

    who: str
    at: str = "warmup"
    action: str = "exit"

    def __post_init__(self) -> None:
        assert self.action in FAULT_ACTIONS, self.action


@contextmanager
def injected(fault: Fault | None) -> Iterator[None]:
    """``$OPPROF_TEST_FAULT`` set to ``fault`` inside the block (nothing for None)."""
    before = os.environ.get(FAULT_ENV)
    if fault is not None:
        os.environ[FAULT_ENV] = json.dumps(asdict(fault))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FAULT_ENV, None)
        else:
            os.environ[FAULT_ENV] = before
