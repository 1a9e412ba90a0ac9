"""opprof: operator-level profiler and trace analyzer for distributed deep-learning training.

``import opprof`` is light (no pandas, no framework): the startup hook of ``opprof run`` imports
it in every Python process a command starts. ``load``, ``save`` and ``Trace`` load the trace
model on first use; ``profile`` is the explicit-control recording API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opprof.errors import OpprofError
from opprof.version import __version__

if TYPE_CHECKING:
    from opprof.loader import load
    from opprof.pipeline.profile import profile
    from opprof.trace import Trace, save

__all__ = ["OpprofError", "Trace", "__version__", "load", "profile", "save"]
_LAZY = {"load": "opprof.loader", "Trace": "opprof.trace", "save": "opprof.trace",
         "profile": "opprof.pipeline.profile"}


def __getattr__(name: str) -> Any:
    """``load``, ``save``, ``Trace`` and ``profile`` are imported on first use (they bring in
    pandas and pyarrow, which ``opprof --help`` and the workers' start do not need)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opprof' has no attribute {name!r}")
