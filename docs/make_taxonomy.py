"""Regenerate docs/taxonomy.md from the mapping tables (tests fail when it is stale)."""

from pathlib import Path

from opprof.taxonomy import tables_markdown

if __name__ == "__main__":
    out = Path(__file__).with_name("taxonomy.md")
    out.write_text(tables_markdown())
    print(f"wrote {out}")
