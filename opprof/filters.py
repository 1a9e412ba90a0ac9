"""Named filters over the events table: the masks the analyses write again and again, each a
boolean Series aligned with the table, composed with ``&``, ``|`` and ``~``::

    ops = ev[workers(ev) & counted(ev) & in_steps(ev)]

(in the spirit of Holistic Trace Analysis' ``trace_filter``). Vectorized, on the categorical
columns as stored; no copy of the table.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from opprof.kinds import Role
from opprof.taxonomy import COMM_OPS, DEVICE_KINDS, MEMORY_KIND

HOST = "cpu"  # the device column of host (CPU) events


def workers(ev: pd.DataFrame) -> pd.Series:
    """Events of worker ranks (not parameter servers or schedulers)."""
    return ev["role"] == Role.WORKER.value


def counted(ev: pd.DataFrame) -> pd.Series:
    """Events summed in operator totals (the outermost operator on its lane, every
    kernel and copy, communication wherever issued)."""
    return ev["counted"]


def in_steps(ev: pd.DataFrame) -> pd.Series:
    """Events inside a profiled step (``step`` is -1 outside steps)."""
    return ev["step"] >= 0


def on_host(ev: pd.DataFrame) -> pd.Series:
    """Events of host threads (device ``cpu``)."""
    return ev["device"] == HOST


def on_device(ev: pd.DataFrame) -> pd.Series:
    """Events on a device's timeline (``cuda:0``, …): not the host's."""
    return ev["device"] != HOST


def device_work(ev: pd.DataFrame) -> pd.Series:
    """Kernels, copies and memsets that ran on a device."""
    return ev["kind"].isin(DEVICE_KINDS) & on_device(ev)


def kernels(ev: pd.DataFrame) -> pd.Series:
    """Device kernels (compute and communication)."""
    return (ev["kind"] == "kernel") & on_device(ev)


def markers(ev: pd.DataFrame) -> pd.Series:
    """Host phase and step markers (``opprof.forward``, ``ProfilerStep#3``, …)."""
    return (ev["kind"] == "marker") & on_host(ev)


def communication(ev: pd.DataFrame) -> pd.Series:
    """Communication events, by their canonical op (every collective, push/pull)."""
    return ev["op"].isin(COMM_OPS)


def memory(ev: pd.DataFrame) -> pd.Series:
    """Rows of the memory table (samples of a memory series)."""
    return ev["kind"] == MEMORY_KIND


def step_work(ev: pd.DataFrame) -> pd.Series:
    """What the steps' analyses look at: worker events inside a step."""
    return workers(ev) & in_steps(ev)


def names_where(ev: pd.DataFrame, test: Callable[[str], bool]) -> pd.Series:
    """Events whose name's text passes ``test``, tested once per distinct name (on the
    categories, not row by row). A missing name is what ``astype(str)`` makes of it: the
    text ``"nan"`` with plain strings (:func:`opprof.strings.plain_strings`), else still
    missing, which no test passes."""
    names = ev["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):  # its distinct texts, once each
        codes, texts = pd.factorize(names.astype(str))
        hit = np.array([isinstance(t, str) and bool(test(t)) for t in texts] + [False], bool)
        return pd.Series(hit[codes], index=ev.index)  # code -1 (still missing): the last
    missing = pd.Series(pd.Categorical([None])).astype(str).iloc[0]
    hit = np.array([bool(test(c)) for c in names.cat.categories.astype(str)]
                   + [isinstance(missing, str) and bool(test(missing))], bool)
    return pd.Series(hit[names.cat.codes.to_numpy()], index=ev.index)  # code -1: the last
