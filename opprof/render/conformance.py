"""For the type checker only: every format module :mod:`opprof.render` lists is the protocol
its table promises (mypy checks the assignments below). The registry imports its formats by
name, so it cannot be checked there; nothing imports this module at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.render import console, csvfmt, html, jsonfmt, mdfmt
    from opprof.render.views import PageRenderer, Renderer

    RICH: Renderer = console
    JSON: Renderer = jsonfmt
    CSV: Renderer = csvfmt
    MD: Renderer = mdfmt
    HTML: PageRenderer = html
