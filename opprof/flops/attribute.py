"""Each event's cost counted once: what runs inside an operator is that operator's.

A normalizer gives every event its own cost (hardware FLOPs, model FLOPs, bytes, precision)
and its *kind* (:mod:`opprof.flops.table`: unmodeled, composite, or costed). Along the nesting
of the events on their lane:

* the outermost *costed* event stands for everything inside it (``aten::linear`` is costed, so
  the ``aten::addmm`` and ``aten::t`` it runs are not counted again; ``aten::conv2d`` for the
  ``mkldnn_convolution`` three levels down);
* a *composite* event (``aten::einsum``, ``aten::lstm``: no cost of its own that the trace can
  tell) lets the costed events inside it count;
* every counted contribution goes to the outermost operator around it — the event whose time
  the operator tables count — so an operator's FLOPs and its time are the same events';
* a forward-only operator (a convolution, ``linear``, attention's forward) run inside a backward
  operator is recomputation (activation checkpointing): its FLOPs are hardware FLOPs, not the
  model's;
* an operator with no costed or composite event inside it, or with one whose shapes are missing,
  has an unknown cost (NaN), never zero;
* a device event (kernel, copy) gets a share of its launching operator's cost, in proportion to
  its duration among that operator's device events.

Vectorized over events (one nesting pass, a few bincounts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opprof.flops.table import COMPOSITE_KIND, COSTED, FORWARD

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.intervals import Nesting

#: The cost columns a normalizer adds to its raw frame (per event, its own cost).
RAW_COLUMNS = ("flops", "model_flops", "mem_bytes", "precision", "cost_kind")
#: The cost columns of the events table (per counted event, what it ran).
COLUMNS = ("flops", "model_flops", "mem_bytes", "precision")


def _sum_by(target: Array, values: Array, n: int, has: Array) -> Array:
    """Per index of ``n``: the sum of ``values`` whose target it is (NaN propagates: an
    unknown contribution makes the total unknown); NaN where ``has`` is False."""
    out = np.full(n, np.nan)
    if len(target):
        out[has] = np.bincount(target, weights=values, minlength=n)[has]
    return out


def attribute(flops: Array, model: Array, nbytes: Array, precision: Array, kind: Array,
              nesting: Nesting, is_op: Array, anc: Array, rank: Array, link: Array,
              is_device: Array, dur: Array, backward: Array | None = None,
              comm: Array | None = None) -> dict[str, Array]:
    """The events table's cost columns (:data:`COLUMNS`) from the events' own costs.

    ``anc``: each event's outermost enclosing operator on its lane (itself when outermost, -1
    for none; a device event its own); ``link``: the correlation id tying a device event to the
    runtime call that launched it; ``backward``: per event, whether its own row says backward
    (a forward-only operator inside a backward one is recomputation: hardware FLOPs, not the
    model's); ``comm``: the communication events (a collective's kernel takes no share of the
    compute operator whose hook launched it)."""
    n = len(flops)
    idx = np.arange(n)
    costed = is_op & ((kind == COSTED) | (kind == FORWARD))
    _, outer_costed = nesting.nest(costed)
    keep = ((costed & (outer_costed == idx))
            | (is_op & (kind == COMPOSITE_KIND) & (outer_costed < 0))) & (anc >= 0) & ~is_device
    target = anc[keep]
    if backward is not None and len(target):
        recomputed = (kind[keep] == FORWARD) & backward[target] & (target != idx[keep])
        if recomputed.any():
            model = model.copy()
            model[np.flatnonzero(keep)[recomputed]] = 0.0
    has = np.zeros(n, bool)
    has[target] = True
    cols = {
        "flops": _sum_by(target, flops[keep], n, has),
        "model_flops": _sum_by(target, model[keep], n, has),
        "mem_bytes": _sum_by(target, nbytes[keep], n, has),
    }
    # the precision of an operator's FLOPs: that of its contribution with the most model
    # FLOPs (else the most FLOPs)
    prec = np.full(n, -1, np.int8)
    if len(target):
        weight = np.nan_to_num(model[keep]) * 4.0 + np.nan_to_num(flops[keep]) * 1e-9
        order = np.lexsort((-weight, target))
        first = np.r_[True, target[order][1:] != target[order][:-1]]
        prec[target[order][first]] = precision[keep][order][first]
    cols["precision"] = prec
    _device_shares(cols, rank, link, is_device & ~(comm if comm is not None else False), is_op,
                   anc, dur)
    return cols


def _device_shares(cols: dict[str, Array], rank: Array, link: Array, is_device: Array,
                   is_op: Array, anc: Array, dur: Array) -> None:
    """Give device events (in place) their launching operator's cost, split by duration."""
    dev = np.flatnonzero(is_device & (link >= 0))
    if not len(dev):
        return
    host = np.flatnonzero(~is_device & is_op & (link >= 0))
    if not len(host):
        return
    key_host = rank[host].astype(np.int64) * (1 << 40) + link[host]
    order = np.argsort(key_host, kind="stable")
    key_sorted = key_host[order]
    key_dev = rank[dev].astype(np.int64) * (1 << 40) + link[dev]
    pos = np.searchsorted(key_sorted, key_dev)
    pos = np.minimum(pos, len(key_sorted) - 1)
    found = key_sorted[pos] == key_dev
    dev, launcher = dev[found], anc[host[order[pos[found]]]]
    ok = launcher >= 0
    dev, launcher = dev[ok], launcher[ok]
    if not len(dev):
        return
    n = len(dur)
    d = np.maximum(dur[dev], 0).astype(np.float64)
    total = np.bincount(launcher, weights=d, minlength=n)[launcher]
    count = np.bincount(launcher, minlength=n)[launcher]
    share = np.where(total > 0, d / np.where(total > 0, total, 1), 1.0 / count)
    for col in ("flops", "model_flops", "mem_bytes"):
        cols[col][dev] = cols[col][launcher] * share
    cols["precision"][dev] = cols["precision"][launcher]
