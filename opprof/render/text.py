"""Rich renderables printed to plain text: what the console renderer and the tables beside it
return."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType


def render(*items: RenderableType, width: int = 120) -> str:
    """``items`` as the text a terminal ``width`` columns wide shows, without colour."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(Group(*items))
    return buf.getvalue()
