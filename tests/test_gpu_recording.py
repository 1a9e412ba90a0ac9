"""Asking to record on a GPU where there is none, or under nsys without nsys, is one clear
line and exit code 2, before anything is run or written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opprof.collectors.gpu import require_cuda, require_nsys
from opprof.errors import OpprofError
from tests.conftest import run_cli


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_cuda(), reason="this machine has a CUDA GPU")
def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "run.trace"
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--device", "cuda",
                  "-o", str(out))
    assert res.returncode == 2
    assert "--device cuda but torch" in res.stderr and "sees no CUDA GPU" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "run.native").exists()
    with pytest.raises(OpprofError, match="use --device cpu"):
        require_cuda("torch")


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
def test_nsys_flag_without_nsys_is_a_clear_error(tmp_path: Path) -> None:
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--nsys",
                  "-o", str(tmp_path / "run.trace"))
    assert res.returncode == 2
    assert "--nsys needs nsys on PATH" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run.native").exists()
    with pytest.raises(OpprofError, match="--nsys needs nsys on PATH"):
        require_nsys()


def test_unknown_framework_is_refused() -> None:
    with pytest.raises(OpprofError, match="unknown framework"):
        require_cuda("caffe")


def test_more_torch_workers_than_gpus_is_refused_before_anything_runs() -> None:
    from opprof.collectors.gpu import require_gpu_per_rank

    with pytest.raises(OpprofError, match=r"2 workers on this machine, but it has 1 GPU\(s\) "
                                          r"\(NVIDIA H200\) and NCCL runs one rank per GPU"):
        require_gpu_per_rank("torch", 2, ["NVIDIA H200"])
    require_gpu_per_rank("torch", 2, ["NVIDIA H200", "NVIDIA H200"])
