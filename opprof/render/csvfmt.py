"""CSV output: the table of the chosen `--by` view."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.model.commmodel import Network
from opprof.model.predict import ModelResult
from opprof.model.whatif import WhatIf
from opprof.render.tables import advice_table, diff_table, report_table
from opprof.render.views import ALL_VIEWS

if TYPE_CHECKING:
    from opprof.advice.base import AdviseResult, Advisory

#: The views this format renders (all views) and its file type.
VIEWS = ALL_VIEWS
EXTENSION = ".csv"


def report(rep: Report, by: str = "phase", top: int | None = None,
           advice: Advisory | None = None) -> str:
    """One CSV table (the view's; `opprof advise --format csv` gives the advice's)."""
    text: str = report_table(rep, by, top).to_csv(index=False)
    return text


def diff(d: Diff, top: int | None = None) -> str:
    """Phases, ops and memory of the diff as one CSV table (``level`` phase / op / memory;
    times in the ``*_ns`` columns, memory in the ``*_bytes`` ones); with --whatif: the
    what-if table."""
    if d.whatif is not None:
        swaps: str = (d.whatif if top is None else d.whatif.head(top)).to_csv(index=False)
        return swaps
    table = diff_table(d, top)
    if len(d.memory):
        mem = d.memory.rename(columns={"metric": "name"}).assign(level="memory")
        table = pd.concat([table, mem], ignore_index=True)
    text: str = table.to_csv(index=False)
    return text


def model(result: ModelResult) -> str:
    """The predictions, one row per worker count (with --check: the check's rows instead)."""
    from opprof.render.modeltables import check_table, predictions_table

    t = check_table(result) if result.check is not None else predictions_table(result)
    text: str = t.to_csv(index=False)
    return text


def whatif(w: WhatIf) -> str:
    """Phases measured and re-simulated, then the step."""
    from opprof.render.modeltables import whatif_table

    text: str = whatif_table(w).to_csv(index=False)
    return text


def calibration(net: Network) -> str:
    """The measured sizes with the fit's predictions."""
    from opprof.render.modeltables import samples_table

    text: str = samples_table(net).to_csv(index=False)
    return text


def advice(result: AdviseResult) -> str:
    """One row per piece of advice (and, with --verify, its predicted and achieved saving)."""
    text: str = advice_table(result).to_csv(index=False)
    return text
