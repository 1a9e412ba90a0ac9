"""opprof: operator-level profiler and trace analyzer for distributed deep-learning training."""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from opprof.errors import OpprofError

if TYPE_CHECKING:
    from opprof.loader import load
    from opprof.trace import Trace, save

__all__ = ["OpprofError", "Trace", "__version__", "load", "save"]
_LAZY = {"load": "opprof.loader", "Trace": "opprof.trace", "save": "opprof.trace"}


def __getattr__(name: str) -> Any:
    """``load``, ``save`` and ``Trace`` are imported on first use (they bring in pandas and
    pyarrow, which ``opprof --help`` and the workers' start do not need)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opprof' has no attribute {name!r}")
