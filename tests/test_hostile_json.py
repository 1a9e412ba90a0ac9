"""Hostile chrome-trace JSON through the typed decoders: every file is either read (odd but
valid values coerced as pandas would) or refused with one line naming it — never a
traceback, a RecursionError or a hang."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.conftest import run_cli

GOOD_EVENT = '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, ' \
             '"ts": 10, "dur": 5}'
REFUSED = {
    "deep nesting": ('{"traceEvents": [' + GOOD_EVENT + '], "schemaVersion": 1, "x": '
                     + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    "deep nesting in args": ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "args": '
                             '{"Input Dims": ' + "[" * 50_000 + "]" * 50_000 + "}}]}",
                             "nested too deeply"),
    "events not a list": ('{"traceEvents": 5, "schemaVersion": 1}', "not a valid"),
    "event not an object": ('{"traceEvents": [1, 2], "schemaVersion": 1}', "not a valid"),
    "args not an object": ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": 1, '
                           '"args": [1]}]}', "not a valid"),
    "NaN literal": ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": NaN}]}',
                    "malformed JSON"),
    "timestamp an object": ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", '
                            '"ts": {"a": 1}, "dur": 1}]}', "without a numeric timestamp"),
    "timestamp huge": ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", '
                       '"ts": 1e300, "dur": 1}]}', "times out of range"),
    "no complete events": ('{"schemaVersion": 1, "traceEvents": [{"ph": "i", "ts": 1}]}',
                           "no complete events"),
    "invalid utf-8": (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "\xff\xfe", '
                      b'"ts": 1}]}', "JSON"),
    "bare number": ("12", "not a known trace format"),
}
READ = {
    "name a list, pid text, tid a float, huge pid": (
        '{"schemaVersion": 1, "traceEvents": [' + GOOD_EVENT + ', {"ph": "X", "cat": "cpu_op", '
        '"name": ["a", 1], "pid": "Spans", "tid": 2.5, "ts": 20, "dur": 1}, {"ph": "X", '
        '"cat": "kernel", "name": "k", "pid": 1180591620717411303424, "tid": 7, "ts": 30, '
        '"dur": 2, "args": {"correlation": "x", "device": [0]}}]}'),
    "duplicate keys, base time text": (
        '{"schemaVersion": 1, "baseTimeNanoseconds": "soon", "distributedInfo": '
        '{"rank": "zero"}, "traceEvents": [' + GOOD_EVENT + ', ' + GOOD_EVENT.replace(
            '"ts": 10', '"ts": 10, "ts": 12') + ']}'),
}


def _write(tmp: Path, name: str, text: str | bytes, gz: bool = False) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path = tmp / (name.replace(" ", "_").replace(",", "") + (".json.gz" if gz else ".json"))
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_file_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    text, message = REFUSED[case]
    path = _write(tmp_path, case, text, gz=case.startswith("deep"))
    res = run_cli("report", str(path), timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"opprof: error: {path}"), res.stderr
    assert message in lines[0] and "Traceback" not in res.stderr


@pytest.mark.parametrize("case", sorted(READ))
def test_odd_but_valid_values_are_read(case: str, tmp_path: Path) -> None:
    path = _write(tmp_path, case, READ[case])
    res = run_cli("import", str(path), "-o", str(tmp_path / "out.trace"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout
