"""`opprof record` option checks that end before any training starts, with one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize(("args", "message"), [
    (["--fw", "tf", "--model", "lenet5", "--workers", "2", "--mode", "allreduce",
      "--nnodes", "2", "--node-rank", "0"], "--cluster HOST:PORT"),
    (["--fw", "tf", "--model", "lenet5", "--workers", "2", "--mode", "ps-sync"],
     "asynchronous by design"),
    (["--fw", "torch", "--model", "lenet5", "--workers", "2", "--mode", "ps-sync"],
     "no parameter-server mode"),
    (["--fw", "mxnet", "--model", "lenet5", "--workers", "2", "--mode", "allreduce"],
     "allreduce"),
    (["--fw", "torch", "--model", "lenet5", "--workers", "2", "--mode", "single"],
     "--mode single runs one worker"),
    (["--fw", "tf", "--model", "lenet5", "--loader-workers", "2"], "tf.data"),
    (["--fw", "torch", "--model", "lenet5", "--bucket-mb", "5"], "--bucket-mb"),
    (["--fw", "torch", "--model", "lenet5", "--workers", "2", "--mode", "fsdp",
      "--bucket-mb", "5"], "--mode allreduce or zero"),
])
def test_unsupported_combinations_are_refused_clearly(args: list[str], message: str,
                                                      tmp_path: Path) -> None:
    res = run_cli("record", *args, "--steps", "1", cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no trace, no empty .native folder


@pytest.mark.slow
def test_loader_workers_and_bucket_size_reach_the_run(tmp_path: Path) -> None:
    """`--loader-workers` and `--bucket-mb` are applied (DataLoader workers, DDP's
    bucket_cap_mb) and kept in the trace's metadata."""
    from opprof.loader import load

    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "1", "--workers", "2",
                  "--mode", "allreduce", "--threads", "1", "--loader-workers", "1",
                  "--bucket-mb", "0.1", "-o", "k.trace", cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr
    meta = load(tmp_path / "k.trace").meta
    assert meta["loader_workers"] == 1 and meta["bucket_mb"] == 0.1
    assert meta["host_memory"]["total_bytes"] > 0
    t = load(tmp_path / "k.trace")
    assert t.events["name"].astype(str).str.contains("_MultiProcessingDataLoaderIter").any()
