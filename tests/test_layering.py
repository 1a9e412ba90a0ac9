"""The house's rooms and contracts: the core imports no analysis, model, renderer, command,
exporter or collector (an AST scan of every import, top-level or inside a function); the
analyses import no model, and the model nothing that records, renders or runs a command; the
registries return their protocols (a renderer offers exactly the views it says, an exporter
writes its file type, every native format is one Format) and their modules never import them
back; `import opprof` and `opprof --help` stay light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Rooms above the core.
UPPER = ("opprof.analysis", "opprof.model", "opprof.render", "opprof.commands",
         "opprof.export", "opprof.collectors", "opprof.pipeline", "opprof.advice")
#: The CLI, the package's face and the orchestration (reading a job rank by rank, the pool,
#: opening any TRACE) may call upward; every other core module may not.
ORCHESTRATION = {"cli.py", "__init__.py", "job.py", "parallel.py", "loader.py"}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


CORE = sorted(p for p in (REPO / "opprof").glob("*.py") if p.name not in ORCHESTRATION)


@pytest.mark.parametrize("path", CORE, ids=[p.name for p in CORE])
def test_the_core_imports_nothing_above_it(path: Path) -> None:
    upward = sorted(m for m in imported(path) if m.startswith(UPPER))
    assert upward == [], f"{path.name} imports {upward}"


def test_the_normalizers_import_no_analysis_renderer_or_command() -> None:
    for path in sorted((REPO / "normalizers").glob("*.py")):
        upward = sorted(m for m in imported(path)
                        if m.startswith(UPPER) and not m.startswith("opprof.normalizers"))
        assert upward == [], f"normalizers/{path.name} imports {upward}"


def test_analyses_never_parse_record_render_or_run_commands() -> None:
    """(Their verdicts in words are the renderers': opprof.render.verdicts.)"""
    for path in sorted((REPO / "opprof" / "analysis").glob("*.py")):
        bad = sorted(m for m in imported(path) if m.startswith(
            ("opprof.commands", "opprof.export", "opprof.collectors", "opprof.pipeline",
             "opprof.normalizers", "opprof.model", "opprof.advice", "opprof.render")))
        assert bad == [], f"analysis/{path.name} imports {bad}"


def test_the_model_is_a_room_above_the_analyses() -> None:
    """The model reads traces and the analyses' results; it never parses, records, renders
    or runs a command (a verdict in words is the renderers': opprof.render.verdicts)."""
    paths = sorted((REPO / "opprof" / "model").glob("*.py"))
    assert {p.stem for p in paths} >= {"terms", "gradients", "commmodel", "simulate",
                                       "sharded", "predict", "interference", "whatif", "step"}
    for path in paths:
        bad = sorted(m for m in imported(path) if m.startswith(
            ("opprof.commands", "opprof.export", "opprof.collectors", "opprof.pipeline",
             "opprof.normalizers", "opprof.render")))
        assert bad == [], f"model/{path.name} imports {bad}"


def test_advice_rules_read_analyses_and_never_render_record_or_run_commands() -> None:
    """The advice package sits on the analyses and the model: its rules return typed advice
    and never reach the renderers, commands, pipelines or collectors."""
    for path in sorted((REPO / "opprof" / "advice").glob("*.py")):
        bad = sorted(m for m in imported(path) if m.startswith(
            ("opprof.commands", "opprof.export", "opprof.collectors", "opprof.pipeline",
             "opprof.normalizers", "opprof.render")))
        assert bad == [], f"advice/{path.name} imports {bad}"


def test_renderers_offer_exactly_the_views_they_say() -> None:
    from opprof.render import ALL_VIEWS, FORMATS, PAGE_VIEWS, page_renderer, renderer

    for fmt in FORMATS:
        r = renderer(fmt)
        assert r.VIEWS == ALL_VIEWS and r.EXTENSION.startswith(".")
        assert all(callable(getattr(r, v.value)) for v in r.VIEWS)
    html = page_renderer("html")
    assert html.VIEWS == PAGE_VIEWS and html.EXTENSION == ".html"
    assert not any(hasattr(html, v.value) for v in ALL_VIEWS - PAGE_VIEWS)


def test_exporters_and_formats_are_registered_protocols() -> None:
    from opprof.export import TARGETS, exporter
    from opprof.normalizers.formats import FORMATS, RankFormat

    assert {exporter(t).EXTENSION for t in TARGETS} == {".pftrace", ".json", ".csv"}
    assert sorted(f.name for f in FORMATS) == ["chainer", "kineto", "mxnet", "nsys", "nvprof",
                                               "xplane"]
    assert [f.name for f in FORMATS if isinstance(f, RankFormat)] == ["kineto"]


LIGHT = """
import json, sys
import opprof
from opprof import kinds, errors, invocation
print(json.dumps(sorted(m for m in ("pandas", "numpy", "pyarrow", "msgspec", "torch")
                        if m in sys.modules)))
"""


def test_import_opprof_and_help_stay_light() -> None:
    res = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []
    probe = ("import runpy, sys, json; sys.argv = ['opprof', '--help']\n"
             "try:\n    runpy.run_module('opprof', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(json.dumps(sorted(m for m in ('pandas', 'pyarrow', 'numpy') "
             "if m in sys.modules)))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


def test_formats_never_import_the_registry_that_lists_them() -> None:
    """The registries import their modules by name from a table; a format module imports the
    protocols and shared helpers from their own modules (render.views, export.tracks), never
    a name of the registry's ``__init__``."""
    from opprof import export, render

    for registry, table in (("opprof.render", {**render.MODULES, **render.PAGE_MODULES}),
                            ("opprof.export", export.MODULES)):
        folder = REPO / registry.replace(".", "/")
        for module in table.values():
            path = REPO / (module.replace(".", "/") + ".py")
            back = []
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    back += [a.name for a in node.names if a.name == registry]
                elif isinstance(node, ast.ImportFrom) and node.module == registry:
                    back += [f"{registry}.{a.name}" for a in node.names
                             if not (folder / f"{a.name}.py").exists()]
            assert back == [], f"{module} imports its registry: {back}"


#: The analysis commands and the pipeline each calls.
ANALYSIS_COMMANDS = ("report", "diff", "model", "whatif", "export", "plot", "advise")


@pytest.mark.parametrize("name", ANALYSIS_COMMANDS)
def test_an_analysis_command_is_options_then_its_pipeline_then_a_renderer(name: str) -> None:
    """A command parses its options, calls its pipeline (which reads and computes) and hands
    the one result to a renderer: it reads no trace and computes nothing itself."""
    path = REPO / "opprof" / "commands" / f"{name}.py"
    mods = imported(path)
    assert f"opprof.pipeline.{name}" in mods, f"commands/{name}.py calls no pipeline"
    bad = sorted(m for m in mods if m.startswith(
        ("opprof.analysis", "opprof.model", "opprof.loader", "opprof.job",
         "opprof.normalizers", "opprof.trace")))
    assert bad == [], f"commands/{name}.py reads or computes itself: {bad}"
