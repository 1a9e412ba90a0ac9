"""opprof: operator-level profiler and trace analyzer for distributed deep-learning training."""

from __future__ import annotations

__version__ = "0.1.0"

from opprof.errors import OpprofError
from opprof.loader import load
from opprof.trace import Trace, save

__all__ = ["OpprofError", "Trace", "__version__", "load", "save"]
