"""Paper figures (`opprof plot`, bench's figures/): each file opens and has the expected
series — SVG legend and tick texts and phase colours, PNG pixels of every phase colour,
PDF structure, one page, embedded fonts and the phase colours in its drawing."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest

from tests.conftest import REPO, bench_from_fixtures, run_cli, shared_trace
from tests.procs import needs  # (before the imports it guards)

needs("matplotlib")
from opprof.render.palette import DEVICE_COLORS, PHASE_COLORS  # noqa: E402

FIX = REPO / "fixtures"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bench_from_fixtures(tmp_path_factory.mktemp("fig") / "bench")


def hexcolour(r: int, g: int, b: int) -> str:
    return f"#{int(r):02X}{int(g):02X}{int(b):02X}"


def svg_texts(path: Path) -> set[str]:
    """Every text in an SVG (matplotlib keeps text as text: svg.fonttype none)."""
    root = ElementTree.parse(path).getroot()
    return {"".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")}


def svg_fills(path: Path) -> set[str]:
    return {c.upper() for c in re.findall(r"fill: ?(#[0-9a-fA-F]{6})", path.read_text())}


def png_colours(path: Path) -> set[str]:
    from matplotlib import image

    img = image.imread(path)
    rgb = (img[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    return {hexcolour(*c) for c in np.unique(rgb, axis=0)}


def pdf_colours(path: Path) -> tuple[bytes, set[str]]:
    """(the file, the RGB fill colours its content streams set)."""
    data = path.read_bytes()
    cols = set()
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            body = zlib.decompress(m.group(1))
        except zlib.error:
            continue
        for r, g, b in re.findall(rb"([\d.]+) ([\d.]+) ([\d.]+) rg", body):
            cols.add(hexcolour(*(round(float(x) * 255) for x in (r, g, b))))
    return data, cols


def plot(*args: str) -> None:
    res = run_cli("plot", *args, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "wrote " in res.stderr


def test_bench_writes_every_figure_as_svg_and_png(bench: Path) -> None:
    for name in ("phases", "ops", "scaling", "memory"):
        for suffix in (".svg", ".png"):
            assert (bench / "figures" / f"{name}{suffix}").stat().st_size > 5_000, name


def test_phases_figure_has_every_run_and_phase(bench: Path, tmp_path: Path) -> None:
    svg = bench / "figures" / "phases.svg"
    texts = svg_texts(svg)
    phases = {"load", "forward", "backward", "update", "comm", "other"}
    assert phases <= texts  # the legend
    assert {"torch", "mxnet", "tf", "torch allreduce ×2", "mxnet ps-sync ×2",
            "tf allreduce ×2", "ms per step", "lenet5"} <= texts
    assert {PHASE_COLORS[p] for p in phases} <= svg_fills(svg)
    assert {PHASE_COLORS[p] for p in phases} <= png_colours(bench / "figures" / "phases.png")
    pdf = tmp_path / "phases.pdf"
    plot(str(bench), "--figure", "phases", "-o", str(pdf))
    data, cols = pdf_colours(pdf)
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page\b", data)) == 1
    assert b"/FontFile2" in data  # TrueType embedded (pdf.fonttype 42): editable text
    assert {PHASE_COLORS[p] for p in phases - {"other"}} <= cols  # grey is set as a gray


def test_scaling_figure_has_measured_predicted_and_ideal(bench: Path) -> None:
    texts = svg_texts(bench / "figures" / "scaling.svg")
    assert "ideal" in texts and "workers" in texts
    for fw, mode in (("torch", "allreduce"), ("mxnet", "ps-sync"), ("tf", "allreduce")):
        assert f"{fw} {mode} · lenet5 measured" in texts
    assert "torch allreduce · lenet5 predicted" in texts  # the one the model could predict


def test_ops_and_memory_figures(bench: Path) -> None:
    import json

    doc = json.loads((bench / "bench.json").read_text())
    texts = " ".join(svg_texts(bench / "figures" / "ops.svg"))
    for r in doc["op_ratios"]:
        assert f"{r['ratio']:.2f}x" in texts and r["op"] in texts
    texts = svg_texts(bench / "figures" / "memory.svg")
    assert {"peak resident", "resident before profiling"} <= texts
    assert texts & {"MiB", "MiB (log scale)"}


def test_trace_figures(tmp_path: Path) -> None:
    ddp = FIX / "torch-ddp"
    plot(str(ddp), "--figure", "steps", "-o", str(tmp_path / "steps.svg"))
    assert {"step", "forward", "backward", "comm"} <= svg_texts(tmp_path / "steps.svg")
    plot(str(ddp), "--figure", "ranks", "-o", str(tmp_path / "ranks.svg"))
    texts = svg_texts(tmp_path / "ranks.svg")
    assert {"straggler (slowest rank)", "wait for others", "transfer", "rank"} <= texts
    gpu = shared_trace("nccl-2rank-rank0.json.gz")
    plot(str(gpu), "--figure", "devices", "-o", str(tmp_path / "devices.png"))
    assert set(DEVICE_COLORS.values()) <= png_colours(tmp_path / "devices.png")
    a, b = FIX / "mxnet" / "lenet5-single", FIX / "memory" / "torch-lenet5"
    plot(str(a), str(b), "--figure", "ops", "-o", str(tmp_path / "ops.svg"))
    texts = svg_texts(tmp_path / "ops.svg")
    assert {"mxnet lenet5", "torch", "convolution", "host ms per step"} <= texts
    plot(str(a), str(b), "--figure", "phases", "-o", str(tmp_path / "phases.svg"))
    assert {"mxnet lenet5", "torch", "forward"} <= svg_texts(tmp_path / "phases.svg")
    plot(str(FIX / "memory" / "mxnet-ps-sync"), "--figure", "memory", "-o",
         str(tmp_path / "memory.svg"))
    texts = svg_texts(tmp_path / "memory.svg")
    assert {"rank 0 (worker)", "rank 2 (server)", "peak resident", "allocator allocated",
            "parameters", "MiB (log scale)"} <= texts  # 270 MiB resident beside 0.4 MiB


@pytest.mark.parametrize(("args", "message"), [
    (["fixtures/torch-ddp", "--figure", "scaling", "-o", "x.svg"],
     "--figure scaling needs a bench folder"),
    (["fixtures/torch-ddp", "--figure", "devices", "-o", "x.svg"],
     "nothing to plot: torch x2 has no GPU kernels or copies"),
    (["fixtures/torch-ddp", "-o", "x.jpg"], "x.jpg: a figure is written as .svg, .png or .pdf"),
    (["fixtures/torch-ddp", "fixtures/memory/torch-lenet5", "--figure", "ranks", "-o", "x.svg"],
     "--figure ranks shows one trace; give one"),
])
def test_plot_errors_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    args = [str(REPO / a) if a.startswith("fixtures/") else a for a in args]
    res = run_cli("plot", *args, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith(f"opprof: error: {message}")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_cli_offers_every_figure() -> None:
    from opprof.commands.plot import FIGURE_NAMES
    from opprof.render.figures import FIGURES, MAKERS

    assert FIGURE_NAMES == tuple(FIGURES)
    assert set(MAKERS) == {(name, kind) for name, (_, kinds) in FIGURES.items() for kind in kinds}


def test_plot_of_a_folder_without_bench_json(tmp_path: Path) -> None:
    (tmp_path / "bench.json").write_text("{not json")
    res = run_cli("plot", str(tmp_path / "bench.json"), "-o", str(tmp_path / "x.svg"))
    assert res.returncode == 2 and "not a bench.json written by `opprof bench`" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
