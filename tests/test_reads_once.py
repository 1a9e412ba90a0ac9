"""Each analysis command reads each trace once: `report` in every view and format (the HTML
page and ``--by critical`` included), `diff` (plain, ``--whatif``, html), `model --check`,
`whatif` (with another trace's operator), `plot` and `export` — on a Kineto job of two rank
files, a `.trace` of two ranks (one row group each), a TensorFlow job (whole-job XPlane) and an
MXNet job (JSON, read whole).

Every view and format of `report` on the Kineto job; every view, and every format of the
views that read differently, on the others. Every read of a trace's events goes through one
of three places, which the test wraps and counts per file: a native JSON file's decoding
(``opprof.normalizers.read_doc``: Kineto, MXNet, …), a whole-job binary format's reader
(``Format.read`` of XPlane, nsys, nvprof, on the files themselves), and a `.trace`'s row
groups (``TraceFile._read``: one rank's, or the whole file). Sniffing a file's first bytes or
a `.trace`'s footer is no read. The commands run in this process (``-j 1``: every read is
seen here), as the CLI runs them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from opprof import normalizers
from opprof.cli import cli
from opprof.normalizers.formats import FILE_FORMATS
from opprof.trace import TraceFile
from tests.conftest import FIXTURES, fixture_file

KINETO_JOB = FIXTURES / "torch-ddp"  # two rank files
TRACE_JOB = FIXTURES / "colocation" / "torch-lenet5-ddp2.trace"  # two ranks, a row group each
TF_JOB = FIXTURES / "tf" / "lenet5-allreduce-2w"  # XPlane, a whole-job format
MXNET_JOB = FIXTURES / "mxnet" / "lenet5-ps-sync"  # MXNet JSON, read whole
SINGLE = FIXTURES / "memory" / "torch-lenet5"  # a one-worker Kineto trace
VIEWS = ("phase", "op", "rank", "step", "device", "memory", "comm", "critical")
FORMATS = ("rich", "json", "md", "csv", "html")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[tuple[str, Any]]]:
    """Counts of every read of a trace's events, by (file, what of it)."""
    seen: Counter[tuple[str, Any]] = Counter()
    read_doc = normalizers.read_doc

    def counted_doc(path: Path, *args: Any, **kwargs: Any) -> Any:
        seen[str(Path(path).resolve()), "json"] += 1
        return read_doc(path, *args, **kwargs)

    monkeypatch.setattr(normalizers, "read_doc", counted_doc)
    row_groups = TraceFile._read

    def counted_rows(self: TraceFile, *args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("row_groups")
        seen[str(Path(self.path).resolve()), "rows " + repr(group)] += 1
        return row_groups(self, *args, **kwargs)

    monkeypatch.setattr(TraceFile, "_read", counted_rows)
    for fmt in FILE_FORMATS:
        cls = type(fmt)
        own = cls.read

        def counted_read(self: Any, sources: Any, meta: Any, _own: Any = own) -> Any:
            for path, doc in sources:
                if doc is None:  # the format reads the file itself
                    seen[str(Path(path).resolve()), "file"] += 1
            return _own(self, sources, meta)

        monkeypatch.setattr(cls, "read", counted_read)
    monkeypatch.setenv("OPPROF_READAHEAD", "0")  # in-process: no second process
    monkeypatch.setenv("COLUMNS", "200")
    yield seen


def _run(tmp_path: Path, *args: str) -> None:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _files(job: Path) -> set[str]:
    """The trace files of a job (a folder's candidates, or the file)."""
    if job.is_file():
        return {str(fixture_file(job).resolve())}
    found = {str(f.resolve()) for f in job.rglob("*")
             if f.is_file() and f.name.endswith((".json.gz", ".xplane.pb"))}
    assert found, f"{job} holds no trace files"
    return found


def _assert_once(seen: Counter[tuple[str, Any]], *jobs: Path) -> None:
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"read more than once: {twice}"
    read = {path for path, _ in seen}
    for job in jobs:
        files = _files(job)
        assert files & read, f"{job} was not read at all: {sorted(read)}"
        if job.suffix == ".trace":  # a .trace: each rank's row group once, or the whole once
            what = {w for p, w in seen if p in files}
            assert what == {"rows None"} or "rows None" not in what, what


@pytest.mark.parametrize("by", VIEWS)
def test_report_reads_each_trace_once_in_every_view_and_format(
        reads: Counter[tuple[str, Any]], tmp_path: Path, by: str) -> None:
    for fmt in FORMATS:
        reads.clear()
        out = ["-o", str(tmp_path / "r.html")] if fmt == "html" else []
        _run(tmp_path, "report", str(KINETO_JOB), "--by", by, "--format", fmt, "-j", "1", *out)
        _assert_once(reads, KINETO_JOB)


@pytest.mark.parametrize("job", [TRACE_JOB, TF_JOB, MXNET_JOB], ids=["dottrace", "tf", "mxnet"])
def test_report_of_other_formats_reads_each_trace_once(
        reads: Counter[tuple[str, Any]], tmp_path: Path, job: Path) -> None:
    """Every view in one format, every format in the views that read differently (the
    critical path's, the plain one's)."""
    runs = [(by, "json") for by in VIEWS] + [(by, fmt) for by in ("phase", "critical")
                                              for fmt in FORMATS if fmt != "json"]
    for by, fmt in runs:
        reads.clear()
        out = ["-o", str(tmp_path / "r.html")] if fmt == "html" else []
        _run(tmp_path, "report", str(job), "--by", by, "--format", fmt, "-j", "1", *out)
        _assert_once(reads, job)


@pytest.mark.parametrize("fmt", ["json", "html"])
@pytest.mark.parametrize("whatif", [False, True], ids=["plain", "whatif"])
def test_diff_reads_each_trace_once(reads: Counter[tuple[str, Any]], tmp_path: Path,
                                    fmt: str, whatif: bool) -> None:
    for a, b in ((KINETO_JOB, MXNET_JOB), (TRACE_JOB, TF_JOB), (SINGLE, SINGLE)):
        reads.clear()
        out = ["-o", str(tmp_path / "d.html")] if fmt == "html" else []
        _run(tmp_path, "diff", str(a), str(b), "--format", fmt, "-j", "1", *out,
             *(["--whatif"] if whatif else []))
        _assert_once(reads, a, b)


def test_model_check_reads_each_trace_once(reads: Counter[tuple[str, Any]],
                                           tmp_path: Path) -> None:
    _run(tmp_path, "model", str(SINGLE), "--workers", "2", "--check", str(KINETO_JOB),
         "--format", "json")
    _assert_once(reads, SINGLE, KINETO_JOB)
    reads.clear()
    _run(tmp_path, "model", str(TRACE_JOB), "--workers", "1,2", "--check", str(TRACE_JOB))
    _assert_once(reads, TRACE_JOB)


def test_whatif_reads_each_trace_once(reads: Counter[tuple[str, Any]],
                                      tmp_path: Path) -> None:
    _run(tmp_path, "whatif", str(KINETO_JOB), "--op", f"convolution={SINGLE}",
         "--op", f"pooling={SINGLE}", "--comm", "hidden", "--format", "json")
    _assert_once(reads, KINETO_JOB, SINGLE)
    reads.clear()
    _run(tmp_path, "whatif", str(TRACE_JOB), "--op", f"convolution={TRACE_JOB}",
         "--workers", "4")
    _assert_once(reads, TRACE_JOB)


def test_plot_and_export_read_each_trace_once(reads: Counter[tuple[str, Any]],
                                              tmp_path: Path) -> None:
    _run(tmp_path, "plot", str(KINETO_JOB), str(TF_JOB), str(KINETO_JOB), "--figure", "ops",
         "-o", str(tmp_path / "ops.svg"), "-j", "1")
    _assert_once(reads, KINETO_JOB, TF_JOB)
    for target in ("perfetto", "chrome", "csv"):
        reads.clear()
        _run(tmp_path, "export", str(TRACE_JOB), "--to", target, "-o", str(tmp_path / "x"))
        _assert_once(reads, TRACE_JOB)
