"""Bad input gets one clear line naming the file and the problem, exit code 2, no traceback,
and no output file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli, shared_trace


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = shared_trace("cpu-only-gloo-rank34.json.gz").read_bytes()
    (tmp / "empty.json").write_bytes(b"")
    (tmp / "truncated.json.gz").write_bytes(good[: len(good) // 2])
    (tmp / "notjson.json").write_text("this is not json at all\n")
    (tmp / "cut.json").write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    (tmp / "foreign.json").write_text('{"hello": "world", "items": [1, 2]}')
    with gzip.open(tmp / "foreign.json.gz", "wt") as f:
        f.write("[1, 2, 3]")
    pq.write_table(pa.table({"a": [1]}), tmp / "other.parquet")
    return {
        "missing": (tmp / "nope.trace", "no such file"),
        "empty": (tmp / "empty.json", "empty"),
        "truncated gzip": (tmp / "truncated.json.gz", "truncated or damaged gzip"),
        "not json": (tmp / "notjson.json", "not JSON"),
        "truncated json": (tmp / "cut.json", "truncated JSON"),
        "foreign json": (tmp / "foreign.json", "not a known trace format"),
        "foreign json list": (tmp / "foreign.json.gz", "not a known trace format"),
        "foreign parquet": (tmp / "other.parquet", "not an opprof trace"),
    }


CASES = ["missing", "empty", "truncated gzip", "not json", "truncated json", "foreign json",
         "foreign json list", "foreign parquet"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["report", "import"])
def test_bad_input_is_one_clear_line(case: str, command: str, tmp_path: Path) -> None:
    path, message = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out.trace"
    args = ["report", str(path)] if command == "report" else ["import", str(path), "-o", str(out)]
    res = run_cli(*args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("opprof: error: ")
    assert str(path) in lines[0] and message in lines[0]
    assert "Traceback" not in res.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.trace*"))


def test_diff_names_the_bad_side(tmp_path: Path) -> None:
    good = shared_trace("cpu-only-gloo-rank34.json.gz")
    res = run_cli("diff", str(good), str(tmp_path / "missing.trace"))
    assert res.returncode == 2
    assert "missing.trace: no such file" in res.stderr


def test_export_to_unwritable_place_is_clear(tmp_path: Path) -> None:
    good = shared_trace("cpu-only-gloo-rank34.json.gz")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = run_cli("export", str(good), "--to", "csv", "-o", str(blocker / "sub" / "out.csv"))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr


def test_a_folder_of_native_traces_skips_sidecar_files(tmp_path: Path) -> None:
    from tests.conftest import FIXTURES

    native = tmp_path / "run.native"
    native.mkdir()
    for name in ("lenet5-cpu-2steps.pt.trace.json.gz", "lenet5-cpu-2steps.key_averages.json"):
        (native / name).write_bytes((FIXTURES / "torch" / name).read_bytes())
    res = run_cli("import", str(native), "-o", str(tmp_path / "run.trace"))
    assert res.returncode == 0, res.stderr
    named = run_cli("report", str(native / "lenet5-cpu-2steps.key_averages.json"))
    assert named.returncode == 2 and "not a known trace format" in named.stderr
