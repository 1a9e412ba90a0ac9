"""Renderers: turn analysis results into text. They never parse or compute.

Each renderer module offers ``report(report, by, top) -> str`` and ``diff(diff, top) -> str``.
"""

from __future__ import annotations

import importlib
from typing import Any

FORMATS = ("rich", "json", "csv", "md")
#: `report` and `diff` also render one self-contained HTML page (opprof.render.html; needs
#: the ``plot`` extra), written with ``-o``.
REPORT_FORMATS = (*FORMATS, "html")


def renderer(fmt: str) -> Any:
    """The renderer module for a --format value."""
    if fmt == "html":
        try:
            return importlib.import_module("opprof.render.html")
        except ImportError as exc:
            from opprof.errors import OpprofError

            raise OpprofError(f"--format html needs plotly ({exc}): pip install "
                              "'opprof[plot]' -c constraints.txt") from None
    return importlib.import_module(f"opprof.render.{'console' if fmt == 'rich' else fmt + 'fmt'}")
