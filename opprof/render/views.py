"""What a renderer renders (:class:`View`) and the two protocols a format module follows
(:class:`PageRenderer`, :class:`Renderer`). The format modules import these from here, never
from the registry (``opprof.render``) that lists them."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # names only: `report --format json` imports no model or diff code
    from opprof.advice.base import AdviseResult, Advisory
    from opprof.analysis.diff import Diff
    from opprof.analysis.report import Report
    from opprof.model.commmodel import Network
    from opprof.model.predict import ModelResult
    from opprof.model.whatif import WhatIf


class View(str, Enum):
    """What a renderer renders."""

    REPORT = "report"
    DIFF = "diff"
    MODEL = "model"
    WHATIF = "whatif"
    CALIBRATION = "calibration"
    ADVICE = "advice"


#: The views of a page (every format) and those only the text formats render.
PAGE_VIEWS = frozenset({View.REPORT, View.DIFF})
ALL_VIEWS = frozenset(View)


class PageRenderer(Protocol):
    """A format that renders a report and a diff."""

    VIEWS: frozenset[View]
    EXTENSION: str  # the suffix of a file of this format (``-o``)

    def report(self, rep: Report, by: str = "phase", top: int | None = None,
               advice: Advisory | None = None) -> str:
        """One view (``by``) of a trace's report (``advice``: its advice, shown first)."""
        ...

    def diff(self, d: Diff, top: int | None = None) -> str:
        """What explains the step-time gap between two traces."""
        ...


class Renderer(PageRenderer, Protocol):
    """A text format: also the model's prediction, a what-if, a network calibration and
    `opprof advise`."""

    def model(self, result: ModelResult) -> str:
        ...

    def whatif(self, w: WhatIf) -> str:
        ...

    def calibration(self, net: Network) -> str:
        ...

    def advice(self, result: AdviseResult) -> str:
        ...
