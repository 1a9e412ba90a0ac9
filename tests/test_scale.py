"""A job analyzed rank by rank — serially, in a local process pool, or on a real Dask cluster
on loopback — gives exactly what analyzing all its ranks at once gives; the `.trace` holds
one row group per rank and old one-row-group files still read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bigtraces import build_job, shift_ns
from opprof import job, load, parallel
from opprof.analysis.report import build_report
from opprof.pipeline.imports import import_
from opprof.trace import META_KEY, TraceFile, conform
from tests.conftest import REPO, run_cli, shared_trace
from tests.procs import needs

FRAMES = ("steps", "phases", "ops", "device_ops", "ranks", "devices", "stragglers",
          "rank_steps")


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    """Six ranks, each a real trace of a 128-rank NCCL job (the two shared ones in turn),
    rank rewritten and clock shifted."""
    sources = [shared_trace("sampled-128rank-rank0.json.gz"),
               shared_trace("sampled-128rank-rank1.json.gz")]
    out = tmp_path_factory.mktemp("job")
    build_job(6, out, sources)
    return out


def assert_same_report(a, b) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name).reset_index(drop=True),
                                      getattr(b, name).reset_index(drop=True),
                                      check_exact=True, check_dtype=False)
    assert a.comm_overlap == b.comm_overlap


def test_job_builder_rewrites_rank_and_shifts_the_clock(job_dir: Path) -> None:
    tr = load(job_dir)
    assert sorted(tr.events["rank"].unique()) == list(range(6))
    first = tr.events.groupby("rank")["ts"].min()
    # ranks 0 and 2 are the same real trace, rank 2's clock shifted by shift_ns(2)
    assert first[2] - first[0] == shift_ns(2) - shift_ns(0)


@pytest.mark.parametrize("jobs", [1, 2])
def test_rank_by_rank_report_equals_the_whole_job_report(job_dir: Path, jobs: int) -> None:
    whole = build_report(load(job_dir))
    by_rank = job.report([job_dir], jobs=jobs)
    assert_same_report(by_rank, whole)
    assert len(by_rank.ranks) == 6 and by_rank.stragglers["ranks"].eq(6).all()
    assert by_rank.meta["workers"] == 6 and by_rank.meta["sources"] == whole.meta["sources"]


def test_import_writes_one_row_group_per_rank_and_reads_one_rank_alone(job_dir: Path,
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "job.trace"
    done = import_([job_dir], out, jobs=2)
    whole = load(job_dir)
    assert done.ranks == 6 and done.events == len(whole.events)
    pf = pq.ParquetFile(out)
    assert pf.num_row_groups == 6
    meta = json.loads(pf.schema_arrow.metadata[META_KEY])
    assert meta["row_groups"] == {str(r): [r] for r in range(6)}
    back = load(out)
    pd.testing.assert_frame_equal(back.events, whole.events)
    assert back.meta["step_bounds"] == whole.meta["step_bounds"]
    tf = TraceFile(out)
    three = tf.read_rank(3).events
    pd.testing.assert_frame_equal(three.reset_index(drop=True),
                                  conform(whole.events[whole.events["rank"] == 3]
                                          .reset_index(drop=True)),
                                  check_dtype=False, check_categorical=False)
    # the report of the file, rank by rank in a pool, equals the whole-job one
    assert_same_report(job.report([out], jobs=2), build_report(whole))


def test_the_file_stays_readable_by_pandas_duckdb_and_polars(job_dir: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "job.trace"
    import_([job_dir], out)
    n = len(load(out).events)
    df = pd.read_parquet(out)
    assert len(df) == n and isinstance(df["name"].dtype, pd.CategoricalDtype)
    import duckdb
    rows = duckdb.sql(f"SELECT rank, count(*) FROM read_parquet('{out}') GROUP BY rank "
                      "ORDER BY rank").fetchall()
    assert [r for r, _ in rows] == list(range(6)) and sum(c for _, c in rows) == n
    import polars
    assert polars.read_parquet(out).filter(polars.col("rank") == 2).height == (
        df["rank"] == 2).sum()


def test_old_single_row_group_files_still_read_and_report(job_dir: Path,
                                                           tmp_path: Path) -> None:
    """A file as opprof wrote it before the per-rank layout: every rank in one row group,
    written by pandas."""
    whole = load(job_dir)
    table = pa.Table.from_pandas(conform(whole.events), preserve_index=False)
    meta = {k: v for k, v in whole.meta.items()}
    meta["format_version"] = 1
    table = table.replace_schema_metadata({**table.schema.metadata,
                                           META_KEY: json.dumps(meta).encode()})
    old = tmp_path / "old.trace"
    pq.write_table(table, old, compression="zstd")
    assert pq.ParquetFile(old).num_row_groups == 1
    assert not TraceFile(old).by_rank
    back = load(old)
    pd.testing.assert_frame_equal(back.events, whole.events)
    assert_same_report(job.report([old], jobs=2), build_report(whole))


def test_engine_is_serial_for_one_core_one_task_or_tiny_input(monkeypatch) -> None:
    monkeypatch.delenv(parallel.SCHEDULER_ENV, raising=False)
    monkeypatch.delenv(parallel.JOBS_ENV, raising=False)
    assert parallel.choose(1, 1 << 40).kind == "serial"
    assert parallel.choose(64, 1000).kind == "serial"
    assert parallel.choose(64, 1 << 40, jobs=1).kind == "serial"
    monkeypatch.setattr(parallel, "usable_cores", lambda: 1)
    assert parallel.choose(64, 1 << 40).kind == "serial"
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    assert parallel.choose(64, 1 << 40) == parallel.Engine("local", 2)
    monkeypatch.setenv(parallel.SCHEDULER_ENV, "tcp://127.0.0.1:1")
    assert parallel.choose(64, 0).kind == "dask"


def test_an_error_in_a_worker_is_one_line(tmp_path: Path) -> None:
    good = shared_trace("sampled-128rank-rank0.json.gz")
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": "soon"}], '
                   '"schemaVersion": 1}')
    res = run_cli("report", str(good), str(bad), "--jobs", "2")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"opprof: error: {bad}: Kineto trace with no usable events (1 events skipped: "
        "timestamp missing, not a number or out of range)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dask_cluster():
    """A real Dask cluster on loopback: a scheduler and two single-threaded worker
    processes, stopped afterwards."""
    needs("distributed")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    common = ["--no-dashboard"]
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", str(port), *common],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host",
                 "127.0.0.1", "--nthreads", "1", "--nworkers", "1", *common],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(address, timeout="5s", set_as_default=False) as c:
                    if len(c.nthreads()) == 2:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the local Dask cluster did not start")
            time.sleep(0.5)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_dask_cluster_gives_the_local_results(job_dir: Path, tmp_path: Path,
                                                dask_cluster: str) -> None:
    local = run_cli("report", str(job_dir), "--by", "rank", "--format", "json", "--jobs", "1")
    remote = run_cli("report", str(job_dir), "--by", "rank", "--format", "json",
                     "--scheduler", dask_cluster)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    # import on the cluster, given by the environment variable as Nsight recipes take it
    out = tmp_path / "job.trace"
    res = subprocess.run([sys.executable, "-m", "opprof", "import", str(job_dir), "-o", str(out)],
                         env={**os.environ, parallel.SCHEDULER_ENV: dask_cluster},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    pd.testing.assert_frame_equal(load(out).events, load(job_dir).events)


def test_report_import_and_diff_never_import_a_framework(tmp_path: Path) -> None:
    src = shared_trace("alexnet-1gpu.json.gz")
    out = tmp_path / "a.trace"
    heavy = ("torch", "tensorflow", "mxnet", "xprof", "dask", "distributed")
    for args in (["import", str(src), "-o", str(out)], ["report", str(out)],
                 ["report", str(src), "--by", "device"], ["diff", str(out), str(src)]):
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "opprof", *args],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()
                    if line.startswith("import time:")}
        assert not imported & set(heavy), (args, imported & set(heavy))


def test_readme_scale_examples_run_as_written(job_dir: Path, tmp_path: Path) -> None:
    import shlex

    from tests.docs_pages import tested_blocks

    blocks = tested_blocks("tested-scale")
    assert blocks, "docs/scale.md has no tested-scale block"
    lines = [ln.strip() for ln in blocks[0].splitlines() if ln.startswith("opprof ")]
    assert len(lines) >= 3
    for line in lines:
        res = run_cli(*shlex.split(line.replace("JOB_DIR", str(job_dir)))[1:], cwd=tmp_path)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
    assert json.loads(res.stdout)["ranks"][5]["rank"] == 5


def test_two_files_of_one_rank_get_ranks_as_a_whole_import_gives(tmp_path: Path) -> None:
    src = shared_trace("sampled-128rank-rank0.json.gz")
    other = shared_trace("sampled-128rank-rank1.json.gz")
    folder = tmp_path / "dup"
    folder.mkdir()
    for name, f in (("a", src), ("b", src), ("c", other)):  # ranks 0, 0, 1
        (folder / f"{name}.json.gz").write_bytes(f.read_bytes())
    whole = load(folder)
    assert sorted(whole.events["rank"].unique()) == [0, 1, 2]
    out = tmp_path / "dup.trace"
    import_([folder], out, jobs=2)
    pd.testing.assert_frame_equal(load(out).events, whole.events)
    assert_same_report(job.report([folder], jobs=2), build_report(whole))
