"""Recognize sharded data parallelism in a trace from its native names: PyTorch FSDP (FSDP1
``FullyShardedDataParallel``, FSDP2 ``fully_shard``) and ZeRO (``ZeroRedundancyOptimizer``).

* ``fsdp``: FSDP's own ranges — FSDP2's ``FSDP::pre_forward``, ``FSDP::all_gather (3)``,
  ``FSDP::post_backward_reduce (2)``, ``fsdp::all_gather_copy_in`` …; FSDP1's
  ``FullyShardedDataParallel.forward``, ``FullyShardedDataParallel._pre_forward`` …;
* ``zero``: the optimizer step of torch's ``ZeroRedundancyOptimizer``
  (``Optimizer.step#ZeroRedundancyOptimizer.step``): DDP's all-reduce, the optimizer on each
  rank's shard of the parameters, a broadcast of the updated shards.

One test per distinct name, never per event.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from opprof.kinds import Mode

FSDP_NAME = re.compile(r"(?:FSDP::|fsdp::|FullyShardedDataParallel\.)")
ZERO_NAME = re.compile(r".*ZeroRedundancyOptimizer")
#: The modes a trace's names can reveal, and the modes they refine (what a run is recorded
#: as before its names are read).
REFINES = (None, "", Mode.ALLREDUCE, Mode.SINGLE)


def sharded_mode(names: Iterable[str]) -> str | None:
    """``fsdp``, ``zero`` or None for the distinct native names of a trace."""
    zero = False
    for name in names:
        name = str(name)
        if FSDP_NAME.match(name):
            return Mode.FSDP
        zero = zero or bool(ZERO_NAME.match(name))
    return Mode.ZERO if zero else None


def refine_mode(meta: dict[str, Any], sharded: str | None) -> dict[str, Any]:
    """``meta`` with ``mode`` set to ``sharded`` (``fsdp`` / ``zero``, from
    :func:`sharded_mode`) where the mode recorded is a data-parallel one (``allreduce``,
    ``single``) or none; a mode a recording asked for otherwise stays."""
    if sharded is not None and meta.get("mode") in REFINES:
        meta["mode"] = sharded
    return meta
