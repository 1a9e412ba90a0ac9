"""Rich renderables laid out as plain text (what the console renderer and the tables beside it
print), so that a module drawing rich tables needs no import of the console renderer."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType


def render(*items: RenderableType, width: int = 120) -> str:
    """``items`` one under the other, laid out ``width`` columns wide, without colour."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(Group(*items))
    return buf.getvalue()
