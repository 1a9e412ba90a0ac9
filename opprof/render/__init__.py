"""Renderers: turn analysis results into text. They never parse or compute.

Each renderer module offers ``report(report, by, top) -> str`` and ``diff(diff, top) -> str``.
"""

from __future__ import annotations

import importlib
from typing import Any

FORMATS = ("rich", "json", "csv", "md")


def renderer(fmt: str) -> Any:
    """The renderer module for a --format value."""
    return importlib.import_module(f"opprof.render.{'console' if fmt == 'rich' else fmt + 'fmt'}")
