"""The reader under deterministic fuzzing: a few hundred mutations of real traces (Kineto,
MXNet, nsys SQLite, opprof `.trace`; XPlane in the slow tier), each read as ``opprof report``
reads it, in this process. No traceback, hang, memory without bound or multi-line error;
every mutation that made a value unusable gives a ⚠ read warning or a one-line refusal
naming the file. And through the real CLI: non-regular files refused at once, a newline in
a file name kept on one line, ⚠ lines on stderr beside JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.fuzzing import (
    FAILURES,
    XPLANE_SOURCE,
    Result,
    all_cases,
    check,
    peak_rss_bytes,
    xplane_cases,
)

SEED = 24
MEMORY_LIMIT = 2 << 30


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[Result]:
    out = tmp_path_factory.mktemp("fuzz")
    baselines: dict = {}
    return [check(case, baselines=baselines)
            for case in all_cases(out, SEED, values=16, damage=12)]


def _failures(results: list[Result], kinds: tuple[str, ...]) -> list[str]:
    return [f"{r.outcome}: {r.case.name} ({r.case.paths[0].name}): {r.detail[-400:]}"
            for r in results if r.outcome in kinds]


def test_fuzz_covers_a_few_hundred_cases_of_every_format(results: list[Result]) -> None:
    names = Counter(r.case.paths[0].suffix for r in results)
    assert len(results) >= 150, len(results)
    assert {".gz", ".json", ".sqlite", ".trace"} <= set(names), names
    outcomes = Counter(r.outcome for r in results)
    assert outcomes["ok"] and outcomes["refused"], outcomes


def test_no_traceback_hang_blow_up_or_multi_line_error(results: list[Result]) -> None:
    assert not _failures(results, ("traceback", "hang", "blow-up", "multi-line", "unnamed"))


def test_numbers_never_change_without_a_warning(results: list[Result]) -> None:
    """A mutation that changed more than a valid value (a field removed or retyped, an
    event duplicated, a table dropped) either leaves the report's numbers as the unmutated
    input gives them or says why they changed."""
    assert not _failures(results, ("changed",))


def test_every_unusable_value_is_said(results: list[Result]) -> None:
    """A mutation that made a value unusable is read with a ⚠ warning or refused."""
    owed = [r for r in results if r.case.must_warn]
    assert len(owed) >= 80
    assert not _failures(results, ("silent",))
    warned = [r for r in owed if r.outcome == "ok"]
    assert warned and all(sum(r.warnings.values()) >= 1 for r in warned)


def test_memory_stays_bounded(results: list[Result]) -> None:
    assert peak_rss_bytes() < MEMORY_LIMIT


@pytest.mark.slow
def test_xplane_negative_durations_are_said(tmp_path: Path) -> None:
    import random

    assert XPLANE_SOURCE is not None, "the XPlane fixture is missing from the repository"
    baselines: dict = {}
    res = [check(c, baselines=baselines)
           for c in xplane_cases(XPLANE_SOURCE, tmp_path, random.Random(SEED), 2)]
    assert not _failures(res, FAILURES)
    assert all(r.outcome == "ok" and r.warnings for r in res if r.case.must_warn)


# ------------------------------------------------------------------- through the CLI

def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opprof", *args], cwd=cwd, text=True,
                          errors="replace", capture_output=True, timeout=120)


def assert_one_line_refusal(res: subprocess.CompletedProcess, says: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and says in lines[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-urandom"])
def test_cli_refuses_what_is_not_a_regular_file_at_once(kind: str, tmp_path: Path) -> None:
    name = {"fifo": "x.json", "dev-zero": "zero.json", "dev-urandom": "rnd.json.gz"}[kind]
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero" if kind == "dev-zero" else "/dev/urandom")
    res = cli("report", name, cwd=tmp_path)  # a hang or a blow-up ends in the timeout
    assert_one_line_refusal(res, f"{name}: a ")
    assert "not a regular file" in res.stderr


def test_cli_keeps_a_newline_in_a_file_name_on_one_line(tmp_path: Path) -> None:
    (tmp_path / "a\nb.json").write_text("{}")
    res = cli("report", "a\nb.json", cwd=tmp_path)
    assert_one_line_refusal(res, "a\\nb.json: JSON but not a known trace format")


def test_cli_usage_error_is_one_line(tmp_path: Path) -> None:
    res = cli("report", "--by", "nothing", "x.json", cwd=tmp_path)
    assert_one_line_refusal(res, "opprof report --help")


def test_cli_warns_on_stderr_beside_json_on_stdout(tmp_path: Path) -> None:
    from tests.fuzzing import KINETO_SOURCES, _load_json

    doc = _load_json(KINETO_SOURCES[0])
    xs = [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X"]
    for i in xs[10:13]:
        doc["traceEvents"][i]["dur"] = -5
    doc["traceEvents"][xs[20]]["dur"] = "abc"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    res = cli("report", "bad.json", "--format", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)  # stdout is JSON alone
    assert report["meta"]["read_warnings"] == {
        "events skipped: negative duration": 3,
        "events skipped: duration missing, not a number or out of range": 1}
    assert res.stderr.splitlines() == [
        "opprof: ⚠ 1 events skipped: duration missing, not a number or out of range",
        "opprof: ⚠ 3 events skipped: negative duration"]
