"""The HTML reports (`report`/`diff --format html -o`, bench.html) opened in real headless
Chromium: no script error, every chart rendered, a screenshot that is not blank, no network
request; and the file is self-contained and sized by aggregates, not events."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests import browser
from tests.conftest import REPO, bench_from_fixtures, run_cli, shared_trace
from tests.procs import needs  # (before the imports it guards)

needs("plotly")

FIX = REPO / "fixtures"
needs_chromium = pytest.mark.skipif(
    browser.chromium() is None,
    reason="Chromium not found (apt-get install chromium; .ci/run installs it) — "
           "the HTML pages cannot be opened in a browser here")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each kind of page, made as a user would (the CLI) from real recordings."""
    out = tmp_path_factory.mktemp("html")
    made = {}

    def cli(name: str, *args: str) -> None:
        res = run_cli(*args, "--format", "html", "-o", str(out / f"{name}.html"), timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        assert res.stdout == "" and f"wrote {out / name}.html" in res.stderr
        made[name] = out / f"{name}.html"

    cli("ddp", "report", str(FIX / "torch-ddp"))                      # 2 ranks: heatmap
    cli("memory", "report", str(FIX / "memory" / "mxnet-ps-sync"))     # memory per rank
    cli("gpu", "report", str(shared_trace("nccl-2rank-rank0.json.gz")))  # GPU devices
    cli("diff", "diff", str(FIX / "memory" / "tf-lenet5"), str(FIX / "memory" / "torch-lenet5"),
        "--whatif")
    made["bench"] = bench_from_fixtures(out / "bench") / "bench.html"
    return made


#: Sections each page must have (ids), and texts its rendered charts must show.
EXPECTED = {
    "ddp": (["summary", "steps", "ops", "ranks", "metadata"],
            ["straggler (slowest rank)", "wait for others", "forward", "backward"]),
    "memory": (["summary", "steps", "ops", "ranks", "memory"],
               ["peak resident", "resident before profiling", "comm"]),
    "gpu": (["summary", "steps", "ops", "device-ops", "devices"],
            ["compute", "memcpy", "idle", "forward"]),
    "diff": (["summary", "phases", "ops", "whatif", "memory", "metadata"],
             ["A: tf lenet5", "B: torch", "rest of the step"]),
    "bench": (["runs", "phases", "ops", "scaling", "memory", "config"],
              ["mxnet ps-sync ×2", "ideal", "torch allreduce · lenet5 measured"]),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_page_is_one_self_contained_file(pages: dict[str, Path], name: str) -> None:
    from plotly.offline import get_plotlyjs

    text = pages[name].read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert get_plotlyjs() in text  # plotly.js inlined, not fetched
    rest = text.replace(get_plotlyjs(), "")
    assert not re.search(r"<script[^>]*\bsrc=", rest), "an external script"
    assert not re.search(r"<link\b", rest), "an external style sheet or resource"
    assert not re.search(r"https?://", rest), "an address outside the file"
    for sid in EXPECTED[name][0]:
        assert f'<section id="{sid}">' in text, sid


@needs_chromium
@pytest.mark.parametrize("name", list(EXPECTED))
def test_page_renders_in_chromium(pages: dict[str, Path], name: str, tmp_path: Path) -> None:
    net = tmp_path / "net.json"
    dom = browser.dump_dom(pages[name], net_log=net)
    assert dom.count("<body") == 1, "chromium returned no page"
    assert 'id="opprof-script-error"' not in dom, re.search(
        r'id="opprof-script-error">(.*?)<', dom, re.S)
    assert 'data-charts="true"' in dom  # the page's last script ran and saw charts
    charts = re.findall(r'<div id="(chart\d+)" class="plotly-graph-div', dom)
    assert charts
    for cid in charts:  # every chart div was drawn into by plotly.js
        div = re.search(rf'<div id="{cid}" class="([^"]*)"', dom).group(1)
        assert "js-plotly-plot" in div, cid
    assert dom.count('class="main-svg"') >= 2 * len(charts)
    shown = set(re.findall(r'data-unformatted="([^"]*)"', dom))
    shown |= set(re.findall(r">([^<>]+)</text>", dom))
    for label in EXPECTED[name][1]:
        assert any(label in s.replace("&amp;", "&") for s in shown), (label, sorted(shown)[:60])
    assert browser.page_requests(net) == []


@needs_chromium
@pytest.mark.parametrize("name", list(EXPECTED))
def test_page_screenshot_is_not_blank(pages: dict[str, Path], name: str,
                                      tmp_path: Path) -> None:
    png = browser.screenshot(pages[name], tmp_path / f"{name}.png")
    keep = Path(__import__("os").environ.get("OPPROF_KEEP_SCREENSHOTS", ""))
    if keep.name:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, keep / png.name)
    # Phase colours, text anti-aliasing and greys: hundreds of colours; a blank or
    # error page has a handful.
    assert browser.distinct_colours(png) > 200


@needs_chromium
def test_the_browser_checks_catch_a_request_and_a_script_error(tmp_path: Path) -> None:
    """The checks above can fail: a page that fetches and throws is caught by both."""
    from opprof.render import html

    bad = html.page("bad", "", [("x", "x", '<img src="http://example.invalid/x.png">'
                                            "<script>undefinedFunction();</script>")])
    path = tmp_path / "bad.html"
    path.write_text(bad)
    net = tmp_path / "net.json"
    dom = browser.dump_dom(path, net_log=net)
    assert 'id="opprof-script-error"' in dom and "undefinedFunction" in dom
    assert browser.page_requests(net) == ["http://example.invalid/x.png"]


def test_page_size_does_not_grow_with_events(pages: dict[str, Path]) -> None:
    """Charts are made from aggregates: a 40k-event GPU trace's page is plotly.js plus some
    tens of kB, like a few-thousand-event fixture's."""
    from plotly.offline import get_plotlyjs

    js = len(get_plotlyjs())
    for name, path in pages.items():
        extra = path.stat().st_size - js
        assert 0 < extra < 400_000, (name, extra)


def test_html_needs_an_output_file() -> None:
    res = run_cli("report", str(FIX / "torch-ddp"), "--format", "html")
    assert res.returncode == 2
    assert res.stderr.strip() == "opprof: error: --format html writes a file: give -o FILE.html"


def test_text_formats_can_go_to_a_file_too(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = run_cli("report", str(FIX / "torch-ddp"), "--format", "md", "-o", str(out))
    assert res.returncode == 0 and res.stdout == ""
    assert out.read_text().startswith("## opprof report") and "| forward |" in out.read_text()


def test_pages_are_made_without_plotly_figure_objects() -> None:
    """The charts are plain plotly.js specs: making a report's and a diff's page (in a fresh
    process) loads neither plotly.graph_objects nor plotly's validators, and the specs'
    numbers are plotly.js typed arrays holding the report's values (the ranks heatmap is the
    rank × step matrix of own time)."""
    script = f"""
import base64, json, sys
import numpy as np
from pathlib import Path
from opprof.analysis.diff import diff_reports
from opprof.analysis.report import build_report
from opprof.loader import load
from opprof.render import html, plotdata
from benchmarks.html_charts import charts

rep = build_report(load(Path({str(FIX / "torch-ddp")!r})))
page = html.report(rep)
other = build_report(load(Path({str(FIX / "memory" / "torch-lenet5")!r})))
html.diff(diff_reports(rep, other))
loaded = sorted(m for m in sys.modules
                if m.startswith(("plotly.graph_objects", "plotly.validators")))
heat = next(t for c in charts(page) for t in c[1] if t["type"] == "heatmap")
z = np.frombuffer(base64.b64decode(heat["z"]["bdata"]), heat["z"]["dtype"])
want = plotdata.rank_step_matrix(rep).to_numpy(float)
print(json.dumps({{"loaded": loaded, "shape": heat["z"]["shape"],
                   "same": bool(np.array_equal(z.reshape(want.shape), want, equal_nan=True)),
                   "want": list(want.shape)}}))
"""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    assert got["shape"] == ", ".join(map(str, got["want"])) and got["same"]
