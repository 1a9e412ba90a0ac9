"""Renderers: turn analysis results into text. They never parse or compute.

A renderer is one output format, a module offering the views it renders: every format
renders a report and a diff (:class:`PageRenderer`); the text formats also render the
model's results (:class:`Renderer`: model, what-if, calibration). Each module says which
views it offers (``VIEWS``) and the file type it writes (``EXTENSION``); :func:`renderer`
and :func:`page_renderer` return the module for a ``--format`` value, typed.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # names only: `report --format json` imports no model or diff code
    from opprof.analysis.diff import Diff
    from opprof.analysis.report import Report
    from opprof.model.commmodel import Network
    from opprof.model.predict import ModelResult
    from opprof.model.whatif import WhatIf

FORMATS = ("rich", "json", "csv", "md")
#: `report` and `diff` also render one self-contained HTML page (opprof.render.html; needs
#: the ``plot`` extra), written with ``-o``.
REPORT_FORMATS = (*FORMATS, "html")


class View(str, Enum):
    """What a renderer renders."""

    REPORT = "report"
    DIFF = "diff"
    MODEL = "model"
    WHATIF = "whatif"
    CALIBRATION = "calibration"


#: The views of a page (every format) and those only the text formats render.
PAGE_VIEWS = frozenset({View.REPORT, View.DIFF})
ALL_VIEWS = frozenset(View)


class PageRenderer(Protocol):
    """A format that renders a report and a diff."""

    VIEWS: frozenset[View]
    EXTENSION: str  # the suffix of a file of this format (``-o``)

    def report(self, rep: Report, by: str = "phase", top: int | None = None) -> str:
        """One view (``by``) of a trace's report."""
        ...

    def diff(self, d: Diff, top: int | None = None) -> str:
        """What explains the step-time gap between two traces."""
        ...


class Renderer(PageRenderer, Protocol):
    """A text format: also the model's prediction, a what-if and a network calibration."""

    def model(self, result: ModelResult) -> str:
        ...

    def whatif(self, w: WhatIf) -> str:
        ...

    def calibration(self, net: Network) -> str:
        ...


def renderer(fmt: str) -> Renderer:
    """The renderer of a text ``--format`` (rich, json, csv, md)."""
    if fmt == "rich":
        from opprof.render import console

        return console
    if fmt == "json":
        from opprof.render import jsonfmt

        return jsonfmt
    if fmt == "csv":
        from opprof.render import csvfmt

        return csvfmt
    if fmt == "md":
        from opprof.render import mdfmt

        return mdfmt
    from opprof.errors import OpprofError

    raise OpprofError(f"--format {fmt}: choose from {', '.join(FORMATS)}")


def page_renderer(fmt: str) -> PageRenderer:
    """The renderer of a report's or diff's ``--format`` (the text formats, and html)."""
    if fmt != "html":
        return renderer(fmt)
    try:
        from opprof.render import html
    except ImportError as exc:
        from opprof.errors import OpprofError

        raise OpprofError(f"--format html needs plotly ({exc}): pip install "
                          "'opprof[plot]' -c constraints.txt") from None
    return html
