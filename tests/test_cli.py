"""The command line on real traces: import, report in every format, diff, export."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from opprof import load
from opprof.taxonomy import PHASES
from tests.conftest import run_cli, shared_trace

NCCL = "nccl-2rank-rank0.json.gz"


@pytest.fixture(scope="module")
def nccl_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "nccl.trace"
    res = run_cli("import", str(shared_trace(NCCL)), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and "1 rank(s)" in res.stdout
    return out


def test_import_writes_a_loadable_trace(nccl_trace: Path) -> None:
    tr = load(nccl_trace)
    assert len(tr.events) > 20_000
    assert tr.meta["source_formats"] == ["kineto"]


def test_rich_report_shows_phases_and_operators(nccl_trace: Path) -> None:
    res = run_cli("report", str(nccl_trace))
    assert res.returncode == 0, res.stderr
    for word in ("Step breakdown", "forward", "backward", "comm", "Top host operators",
                 "convolution_backward", "Top GPU operators"):
        assert word in res.stdout


def test_json_report_has_the_documented_schema(nccl_trace: Path) -> None:
    res = run_cli("report", str(nccl_trace), "--format", "json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert {"meta", "steps", "phases", "ops"} <= set(rep)
    for s in rep["steps"]:
        assert {"rank", "step", "dur_ns", "phases"} <= set(s)
        assert sum(s["phases"].values()) == s["dur_ns"]
    assert set(rep["phases"]) == set(PHASES)
    assert sum(p["share"] for p in rep["phases"].values()) == pytest.approx(1.0)
    op = rep["ops"][0]
    assert {"op", "phase", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns",
            "share_of_phase"} <= set(op)
    by_phase: dict[str, float] = {}
    for o in rep["ops"]:
        by_phase[o["phase"]] = by_phase.get(o["phase"], 0) + o["share_of_phase"]
    assert all(v == pytest.approx(1.0) for v in by_phase.values())


@pytest.mark.parametrize("by", ["phase", "op", "rank", "step", "device", "comm"])
def test_csv_and_markdown_views(nccl_trace: Path, by: str) -> None:
    res = run_cli("report", str(nccl_trace), "--by", by, "--format", "csv", "--top", "5")
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert rows
    md = run_cli("report", str(nccl_trace), "--by", by, "--format", "md")
    assert md.returncode == 0
    assert sum(ln.startswith("|---") for ln in md.stdout.splitlines()) == 1


def test_report_reads_native_traces_on_the_fly() -> None:
    res = run_cli("report", str(shared_trace("sampled-128rank-rank0.json.gz")),
                  str(shared_trace("sampled-128rank-rank1.json.gz")), "--by", "rank")
    assert res.returncode == 0, res.stderr
    assert "Per rank" in res.stdout


def test_diff_json_schema_and_sentence(nccl_trace: Path) -> None:
    other = shared_trace("sampled-128rank-rank0.json.gz")
    res = run_cli("diff", str(nccl_trace), str(other), "--format", "json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert {"step_ratio", "phases", "ops", "summary"} <= set(d)
    assert {"op", "a_ns_per_step", "b_ns_per_step", "ratio", "delta_ns",
            "share_of_gap"} <= set(d["ops"][0])
    gap = d["a_step_ns"] - d["b_step_ns"]
    assert sum(p["delta_ns"] for p in d["phases"]) == pytest.approx(gap, rel=1e-9)
    assert sum(p["share_of_gap"] for p in d["phases"]) == pytest.approx(1.0)
    shares = [abs(o["delta_ns"]) for o in d["ops"]]
    assert shares == sorted(shares, reverse=True)
    assert "explains most of it" in d["summary"]
    rich = run_cli("diff", str(nccl_trace), str(other))
    assert rich.returncode == 0 and "share of gap" in rich.stdout


@pytest.mark.parametrize("target", ["chrome", "csv", "perfetto"])
def test_export(nccl_trace: Path, tmp_path: Path, target: str) -> None:
    out = tmp_path / f"out.{target}"
    res = run_cli("export", str(nccl_trace), "--to", target, "-o", str(out))
    assert res.returncode == 0, res.stderr
    n = len(load(nccl_trace).events)
    if target == "chrome":
        doc = json.loads(out.read_text())
        assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == n
    elif target == "csv":
        assert sum(1 for _ in out.open()) == n + 1
    else:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PTrace

        t = PTrace()
        t.ParseFromString(out.read_bytes())
        assert sum(p.HasField("track_event") for p in t.packet) == 2 * n


def test_help_has_an_example_for_every_command() -> None:
    for cmd in ("record", "import", "report", "diff", "export"):
        res = run_cli(cmd, "--help")
        assert res.returncode == 0 and "Example" in res.stdout, cmd
