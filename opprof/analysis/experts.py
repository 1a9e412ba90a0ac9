"""Expert parallelism: what each all-to-all of a mixture of experts sent to and received from
each peer, per step, and how unevenly the tokens went to the experts.

The bytes per peer come from the all-to-all's split sizes as the trace records them (the
normalizer writes them into the call's ``detail`` as ``a2a_send_bytes=…`` /
``a2a_recv_bytes=…``, one figure per peer in group order): NCCL's ``record_param_comms``
(``In split size`` / ``Out split size`` × the bytes of a row), ``c10d::alltoall_base_``'s and
``all_to_all_single``'s split arguments (``Concrete Inputs``: torch records them with
``record_shapes``, which ``opprof run`` and ``record`` turn on). An all-to-all without split
sizes (an even split) has none and is counted in ``calls`` only.

- per (rank, step) (:data:`COLUMNS`): the all-to-alls, their bytes sent and received in all,
  per peer (``send_bytes_per_peer``, ``recv_bytes_per_peer``) and ``peer_imbalance``, the
  largest peer's bytes sent over the mean;
- per (step, call) (:data:`LOAD_COLUMNS`): the ``call``-th all-to-all of the step on every
  rank (matched by order, as collectives are), the bytes each rank received
  (``recv_bytes_per_rank``: with one expert group per rank, the tokens its experts got) and
  ``imbalance`` = max / mean over the ranks — 1.0 when the router spread the tokens evenly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import on_host, workers
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array

COLUMNS = ["rank", "step", "calls", "bytes_sent", "bytes_received", "send_bytes_per_peer",
           "recv_bytes_per_peer", "peer_imbalance"]
LOAD_COLUMNS = ["step", "call", "ranks", "recv_bytes_per_rank", "imbalance"]
_SEND = r"a2a_send_bytes=([\d,]+)"
_RECV = r"a2a_recv_bytes=([\d,]+)"


def expert_part(trace: Trace) -> pd.DataFrame:
    """Every all-to-all call of the ranks of ``trace`` in their steps: rank, step, ts, and the
    bytes per peer it sent and received (lists; empty without split sizes)."""
    ev = trace.events
    cols = ["rank", "step", "pid", "tid", "ts", "dur"]
    if "detail" not in ev:
        return pd.DataFrame(columns=[*cols, "send", "recv"])
    a2a = workers(ev) & on_host(ev) & (ev["op"] == "all_to_all") & (ev["step"] >= 0)
    calls = ev.loc[a2a, [*cols, "detail"]]
    text = calls["detail"].astype(object).where(calls["detail"].notna(), "").astype(str)
    has = text.str.contains("a2a_send_bytes=", regex=False).to_numpy()
    calls, text = calls[has], text[has]
    if calls.empty:
        return pd.DataFrame(columns=[*cols, "send", "recv"])
    # one figure per call: an all-to-all recorded at two levels (c10d's call and NCCL's
    # record_param_comms inside it) counts once, at the outer one
    calls = calls.assign(send=text.str.extract(_SEND)[0], recv=text.str.extract(_RECV)[0])
    calls = calls.sort_values(["rank", "pid", "tid", "ts"], kind="stable")
    lane = calls.groupby(["rank", "pid", "tid"], sort=False).ngroup().to_numpy()
    end = pd.Series((calls["ts"] + calls["dur"]).to_numpy(np.int64))
    reach = end.groupby(lane).cummax().groupby(lane).shift(1).to_numpy(float)
    calls = calls[~(calls["ts"].to_numpy(np.int64) < np.nan_to_num(reach, nan=-np.inf))]
    out = calls[cols].copy()
    out["send"] = [[int(x) for x in s.split(",")] for s in calls["send"]]
    out["recv"] = [[int(x) for x in s.split(",")] for s in calls["recv"]]
    return out.reset_index(drop=True)


def combine_experts(parts: list[pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per (rank, step) table and the per (step, call) load table from every rank's
    :func:`expert_part`."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=LOAD_COLUMNS)
    df = pd.concat(parts, ignore_index=True).sort_values(["rank", "step", "ts"], kind="stable")
    rows = []
    for (rank, step), g in df.groupby(["rank", "step"], sort=True):
        send = _summed(g["send"])
        recv = _summed(g["recv"])
        mean = send.mean() if len(send) else 0.0
        rows.append({"rank": int(rank), "step": int(step), "calls": len(g),
                     "bytes_sent": int(send.sum()), "bytes_received": int(recv.sum()),
                     "send_bytes_per_peer": [int(x) for x in send],
                     "recv_bytes_per_peer": [int(x) for x in recv],
                     "peer_imbalance": float(send.max() / mean) if mean > 0 else None})
    df["call"] = df.groupby(["rank", "step"]).cumcount()
    df["received"] = [int(sum(r)) for r in df["recv"]]
    load = []
    for (step, call), g in df.groupby(["step", "call"], sort=True):
        got = g.sort_values("rank")["received"].to_numpy(np.int64)
        mean = got.mean() if len(got) else 0.0
        load.append({"step": int(step), "call": int(call),
                     "ranks": [int(r) for r in sorted(g["rank"])],
                     "recv_bytes_per_rank": [int(x) for x in got],
                     "imbalance": float(got.max() / mean) if mean > 0 else None})
    return pd.DataFrame(rows, columns=COLUMNS), pd.DataFrame(load, columns=LOAD_COLUMNS)


def _summed(lists: pd.Series) -> Array:
    """Element-wise sum of lists of per-peer bytes (of one length; a shorter one padded)."""
    width = max((len(x) for x in lists), default=0)
    out = np.zeros(width, np.int64)
    for x in lists:
        out[:len(x)] += np.asarray(x, np.int64)
    return out
