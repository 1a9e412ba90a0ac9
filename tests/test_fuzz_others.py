"""The fuzzer on traces recorded by others (``benchmarks/fuzz_reader.py --source``), and
what it found there, each on a real trace from elsewhere kept in ``fixtures/`` (HTA's
sampled 128-rank NCCL job, Pipit's-style nsys export lacking a table), mutated here as the
fuzzer did."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

from tests.fuzzing import FAILURES, check, fingerprint, source_cases

ROOT = Path(__file__).resolve().parents[1]
SAMPLED = ROOT / "fixtures" / "shared" / "kineto-gpu" / "sampled-128rank-rank1.json.gz"
CPU_ONLY = ROOT / "fixtures" / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
NSYS = ROOT / "fixtures" / "shared" / "nsys" / "saxpy-mpi-cuda.sqlite"
NO_RANK = "traces with collectives but no rank in distributedInfo (file order used)"


def _without_distributed_info(src: Path, out: Path) -> Path:
    with gzip.open(src, "rb") as f:
        doc = json.load(f)
    doc.pop("distributedInfo", None)
    out.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return out


def test_ranked_job_without_distributed_info_says_the_rank_is_taken_from_file_order(
        tmp_path: Path) -> None:
    """HTA's rank 1 of a 128-rank NCCL job with ``distributedInfo`` removed was read as
    rank 0 without a word: its steps moved to another rank (found by the fuzzer on
    others' traces). Now it is read with one ⚠ line; its durations and operators are
    unchanged."""
    from opprof.job import report

    whole = report([str(SAMPLED)], jobs=1)
    cut = report([str(_without_distributed_info(SAMPLED, tmp_path / "rank1.json.gz"))],
                 jobs=1)
    assert not whole.meta.get("read_warnings")
    assert cut.meta["read_warnings"] == {NO_RANK: 1}
    assert set(whole.steps["rank"]) == {1} and set(cut.steps["rank"]) == {0}
    assert fingerprint(cut)[1:] == fingerprint(whole)[1:]  # operators, device operators
    assert cut.steps["dur_ns"].tolist() == whole.steps["dur_ns"].tolist()


def test_single_process_trace_without_distributed_info_reads_without_a_warning(
        tmp_path: Path) -> None:
    """A trace with no collectives has no rank to lose: no ⚠ line."""
    from opprof.job import report

    rep = report([str(_without_distributed_info(CPU_ONLY, tmp_path / "cpu.json.gz"))],
                 jobs=1)
    assert NO_RANK not in (rep.meta.get("read_warnings") or {})


def test_fuzzer_takes_a_trace_from_elsewhere_and_finds_no_failure(tmp_path: Path) -> None:
    """``source_cases``: the fuzzer's mutation families on any Kineto trace given."""
    baselines: dict = {}
    results = [check(c, baselines=baselines)
               for c in source_cases(SAMPLED, tmp_path, seed=1, values=3, damage=3)]
    assert len(results) >= 30
    assert {r.outcome for r in results} <= {"ok", "refused"}, [
        f"{r.outcome}: {r.case.name}: {r.detail[-300:]}" for r in results
        if r.outcome in FAILURES]
    owed = [r for r in results if r.case.must_warn]
    assert owed and all(r.outcome == "refused" or r.warnings for r in owed)


def test_fuzzer_mutates_only_the_tables_an_nsys_export_has(tmp_path: Path) -> None:
    """An nsys export from elsewhere may lack a table (Pipit's CloverLeaf export has no
    ``NVTX_EVENTS``): the fuzzer mutates what it has instead of failing."""
    src = tmp_path / "src" / "no-nvtx.sqlite"
    src.parent.mkdir()
    shutil.copyfile(NSYS, src)
    with sqlite3.connect(src) as con:
        con.execute("DROP TABLE NVTX_EVENTS")
    cases = list(source_cases(src, tmp_path / "out", seed=1, values=4, damage=4))
    names = [c.name for c in cases]
    assert not any("NVTX" in n for n in names), names
    assert "nsys: CUPTI_ACTIVITY_KIND_RUNTIME dropped" in names
    baselines: dict = {}
    outcomes = {check(c, baselines=baselines).outcome for c in cases}
    assert outcomes <= {"ok", "refused"}, outcomes
