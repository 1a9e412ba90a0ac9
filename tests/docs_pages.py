"""The project's documentation as the tests read it: README.md and every docs/*.md page, and
the blocks in them that the tests run ("tested" quick-start blocks, the scale examples)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO


def doc_paths() -> list[Path]:
    """README.md first, then docs/*.md in name order."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def doc_text() -> str:
    """README.md and every docs page, one after the other."""
    return "\n".join(p.read_text() for p in doc_paths())


def tested_blocks(tag: str = "tested") -> list[str]:
    """The code blocks marked ``<!-- TAG: … -->`` … ``<!-- end TAG -->`` in README.md and the
    docs pages, in that order."""
    pattern = rf"<!-- {re.escape(tag)}:.*?-->\s*```\n(.*?)```\s*<!-- end {re.escape(tag)} -->"
    return [block for p in doc_paths() for block in re.findall(pattern, p.read_text(), re.S)]
