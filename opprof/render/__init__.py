"""Renderers: turn analysis results into text. They never parse or compute.

A renderer is one output format, a module offering the views it renders: every format
renders a report and a diff (:class:`PageRenderer`); the text formats also render the
model's results (:class:`Renderer`: model, what-if, calibration). Each module says which
views it offers (``VIEWS``) and the file type it writes (``EXTENSION``); :func:`renderer`
and :func:`page_renderer` return the module for a ``--format`` value, typed.

This registry names the format modules in a table (:data:`MODULES`) and imports the one asked
for by name; a format module imports its views and protocols from :mod:`opprof.render.views`,
never this registry (``opprof.render.conformance`` has mypy check each module against its
protocol).
"""

from __future__ import annotations

import importlib
from typing import cast

from opprof.render.views import ALL_VIEWS as ALL_VIEWS
from opprof.render.views import PAGE_VIEWS as PAGE_VIEWS
from opprof.render.views import PageRenderer as PageRenderer
from opprof.render.views import Renderer as Renderer
from opprof.render.views import View as View

#: ``--format`` → the module that renders it (the text formats: every view).
MODULES = {"rich": "opprof.render.console", "json": "opprof.render.jsonfmt",
           "csv": "opprof.render.csvfmt", "md": "opprof.render.mdfmt"}
#: `report` and `diff` also render one self-contained HTML page (needs the ``plot`` extra),
#: written with ``-o``.
PAGE_MODULES = {"html": "opprof.render.html"}
FORMATS = tuple(MODULES)
REPORT_FORMATS = (*FORMATS, *PAGE_MODULES)


def renderer(fmt: str) -> Renderer:
    """The renderer of a text ``--format`` (rich, json, csv, md)."""
    if fmt not in MODULES:
        from opprof.errors import OpprofError

        raise OpprofError(f"--format {fmt}: choose from {', '.join(FORMATS)}")
    return cast(Renderer, importlib.import_module(MODULES[fmt]))


def page_renderer(fmt: str) -> PageRenderer:
    """The renderer of a report's or diff's ``--format`` (the text formats, and html)."""
    if fmt not in PAGE_MODULES:
        return renderer(fmt)
    try:
        module = importlib.import_module(PAGE_MODULES[fmt])
    except ImportError as exc:
        from opprof.errors import OpprofError

        raise OpprofError(f"--format {fmt} needs plotly ({exc}): pip install "
                          "'opprof[plot]' -c constraints.txt") from None
    return cast(PageRenderer, module)
