"""The README is a short guide and the reference lives in docs/: the README stays under its
length, every relative link in README.md and docs/*.md reaches a file (and a heading, for
`page.md#anchor`), every docs page is linked from the README, and the taxonomy page states
every canonical operator."""

from __future__ import annotations

import re
from pathlib import Path

from opprof.taxonomy import CANONICAL_OPS
from tests.conftest import REPO
from tests.docs_pages import doc_paths

#: Pages other branches of this round add; the README links them already. Until they are
#: merged, a link to one of them is not checked (only these, and only while missing).
FROM_OTHER_BRANCHES = {"docs/model.md", "docs/reader.md"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(path: Path) -> str:
    """A markdown file without its fenced code blocks (links there are not links)."""
    return FENCE.sub("", path.read_text())


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes for a markdown file: lower case, punctuation other
    than hyphens and underscores dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: …


def test_readme_is_a_short_guide() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 450, f"README.md has {len(lines)} lines (at most 450)"


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    broken = []
    checked = 0
    for page in doc_paths():
        for target in relative_links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
            if not dest.exists():
                if rel not in FROM_OTHER_BRANCHES:
                    broken.append(f"{page.name}: {target} (no such file)")
                continue
            checked += 1
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert checked > 30
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve()
              for t in relative_links(REPO / "README.md")}
    pages = set((REPO / "docs").glob("*.md"))
    assert pages, "no docs pages"
    missing = sorted(p.name for p in pages if p.resolve() not in linked)
    assert not missing, f"docs pages the README does not link: {missing}"
    for rel in FROM_OTHER_BRANCHES:
        assert (REPO / rel).resolve() in linked, rel


def test_the_docs_name_every_canonical_operator() -> None:
    """docs/ops.md explains every canonical operator (recurrent, guard and compile too), and
    the generated docs/taxonomy.md lists them all."""
    ops = (REPO / "docs" / "ops.md").read_text()
    taxonomy = (REPO / "docs" / "taxonomy.md").read_text()
    for op in CANONICAL_OPS:
        if op.endswith("_backward") and op != "fused_backward":
            assert "`<op>_backward`" in ops
        else:
            assert f"`{op}`" in ops, op
        assert f"`{op}`" in taxonomy, op
