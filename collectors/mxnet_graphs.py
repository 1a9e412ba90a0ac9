"""MXNet's compiled graphs for the profiled steps: bulk execution off, so that the profiler
sees every operator of a hybridized Gluon block's CachedOp and of a Module's executor.

MXNet runs a static graph in *bulk segments*: up to 15 operators (``MXNET_EXEC_BULK_EXEC_
MAX_NODE_TRAIN_FWD`` / ``_BWD``) pushed to the engine as one operator, which the profiler
records once under the comma-joined names of its operators. A Gluon block hybridized with
``static_alloc`` / ``static_shape`` plans its segments once, when its CachedOp first runs (a
``Adam`` step of a small CNN was then one backward "operator", 81% of the step); a Module's
executor plans them when it is bound (``MXNET_EXEC_BULK_EXEC_TRAIN``, read at bind). So for
the profiled steps only:

* **Gluon**: every hybridized block with a CachedOp gets the CachedOp flags
  ``forward_bulk_size=0`` and ``backward_bulk_size=0`` (Gluon's own ``hybridize`` options)
  and its CachedOp is dropped; the next call builds it again, one operator per segment;
* **Module**: each executor is replaced by ``Executor.reshape`` to the same shapes, bound
  with ``MXNET_EXEC_BULK_EXEC_TRAIN=0`` — it shares every array (weights, gradients, data)
  with the one it replaces.

:meth:`StaticGraphs.unbulk` does this at the profile boundary; the profiler then starts
after the adapter's ``profiler_warmup`` unprofiled steps: one in which a dropped CachedOp is
built again (it plans and allocates there), and one that runs as the profiled steps will,
without the profiler, timed (``unbulked_step_ns``: what bulk execution off costs by itself,
which the report sets against the unprofiled step time). :meth:`StaticGraphs.restore` puts
everything back after the profile: the Module's own executors at once, the blocks' own
flags for a CachedOp built again in the next step (which the runner leaves out of the
timing: the adapter's ``settle_after``). The profiled steps pay what bulking saves: one
engine push per operator instead of one per segment.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

BULK_ENV = "MXNET_EXEC_BULK_EXEC_TRAIN"
_UNBULKED = (("forward_bulk_size", 0), ("backward_bulk_size", 0))
#: Hybridized Gluon blocks that have built a CachedOp in this process.
_BLOCKS: weakref.WeakSet[Any] = weakref.WeakSet()  # (Gluon's HybridBlock: untyped)


def track_blocks(hybrid_block: Any) -> None:
    """Remember every ``HybridBlock`` that builds a CachedOp (wraps ``_build_cache``)."""
    build = hybrid_block._build_cache
    if getattr(build, "_opprof", False):
        return

    def _build_cache(self: Any, *args: Any) -> Any:
        _BLOCKS.add(self)
        # the input shapes the graph is built for: its nodes' shapes (collectors.mxnet_shapes)
        self._opprof_shapes = [getattr(a, "shape", None) for a in args]
        return build(self, *args)

    _build_cache._opprof = True  # type: ignore[attr-defined]
    hybrid_block._build_cache = _build_cache


class StaticGraphs:
    """The compiled graphs of one training step's owner (a Gluon Trainer or a Module)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.blocks: list[tuple[Any, list[tuple[str, Any]]]] = []  # (block, its own flags)
        self.execs: list[tuple[Any, list[Any]]] = []  # (executor group, its own executors)
        self.settle_after = 0

    @property
    def rebuilds(self) -> int:
        """Steps that build a CachedOp again after :meth:`unbulk`: one when a Gluon block's
        was dropped."""
        return 1 if self.blocks else 0

    def unbulk(self) -> dict[str, Any]:
        """Bulk execution off for the compiled graphs there are; what was switched (empty
        when there is none)."""
        group = getattr(self.owner, "_exec_group", None)
        if group is not None and getattr(group, "execs", None):
            self._unbulk_executors(group)
        for block in list(_BLOCKS):
            if block._cached_op is None or not block._active:
                continue
            flags = list(block._flags)
            self.blocks.append((block, flags))
            block._flags = [f for f in flags if f[0] not in dict(_UNBULKED)] + list(_UNBULKED)
            block._clear_cached_op()
        if not (self.blocks or self.execs):
            return {}
        what = []
        if self.blocks:
            static = sum(1 for _, f in self.blocks if dict(f).get("static_shape"))
            what.append(f"{len(self.blocks)} hybridized Gluon block(s) ({static} with "
                        "static_shape): CachedOp flags forward_bulk_size=0, "
                        "backward_bulk_size=0 (CachedOp built again)")
        if self.execs:
            what.append(f"{sum(len(e) for _, e in self.execs)} Module executor(s): reshaped "
                        f"to the same shapes with {BULK_ENV}=0")
        return {"switched": "bulk execution off for the profiled steps: " + "; ".join(what)}

    def _unbulk_executors(self, group: Any) -> None:
        own = list(group.execs)
        before = os.environ.get(BULK_ENV)
        os.environ[BULK_ENV] = "0"  # read when an executor is bound (GraphExecutor::Init)
        try:
            inputs = set(group.data_names) | set(getattr(group, "label_names", None) or [])
            fresh = [exe.reshape(allow_up_sizing=True, **{
                name: arr.shape for name, arr in exe.arg_dict.items() if name in inputs})
                for exe in own]
        finally:
            if before is None:
                os.environ.pop(BULK_ENV, None)
            else:
                os.environ[BULK_ENV] = before
        group.execs = fresh
        group._collect_arrays()
        self.execs.append((group, own))

    def restore(self) -> None:
        """Put back what :meth:`unbulk` changed (the user's later steps run as before)."""
        for group, own in self.execs:
            group.execs = own
            group._collect_arrays()
        for block, flags in self.blocks:
            block._flags = flags
            block._clear_cached_op()
        self.settle_after = 1 if self.blocks else 0
        self.blocks, self.execs = [], []
