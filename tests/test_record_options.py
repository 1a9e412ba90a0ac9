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
])
def test_unsupported_combinations_are_refused_clearly(args: list[str], message: str,
                                                      tmp_path: Path) -> None:
    res = run_cli("record", *args, "--steps", "1", cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no trace, no empty .native folder
