"""`opprof diff` between a real PyTorch recording and a real MXNet one: per-op ratios over the
common taxonomy, the same model on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from opprof.analysis.diff import diff  # noqa: E402
from opprof.loader import load  # noqa: E402
from tests.conftest import FIXTURES, run_cli  # noqa: E402

MXNET_LENET5 = FIXTURES / "mxnet" / "lenet5-single"
# what both frameworks' LeNet-5 training steps are made of, in the common taxonomy
COMMON = ("convolution", "convolution_backward", "fully_connected", "fully_connected_backward",
          "activation", "pooling", "loss", "loss_backward", "weights_update", "data_load")


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch") / "lenet5-torch.trace"
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "1", "-o", str(out))
    assert res.returncode == 0, res.stderr
    return out


def test_per_op_ratios_over_the_common_taxonomy(torch_trace: Path) -> None:
    d = diff(load(torch_trace), load(MXNET_LENET5), "torch", "mxnet")
    assert (d.a_label, d.b_label) == ("torch lenet5", "mxnet lenet5")
    ops = d.ops.set_index("op")
    for op in COMMON:
        assert ops.loc[op, "a_ns_per_step"] > 0 and ops.loc[op, "b_ns_per_step"] > 0, op
        assert np.isfinite(ops.loc[op, "ratio"]), op
        assert ops.loc[op, "ratio"] == pytest.approx(
            ops.loc[op, "a_ns_per_step"] / ops.loc[op, "b_ns_per_step"])
    phases = d.phases.set_index("phase")
    assert phases.loc[["forward", "backward", "update"], "ratio"].notna().all()
    assert d.summary


def test_diff_command_compares_torch_with_mxnet(torch_trace: Path) -> None:
    res = run_cli("diff", str(torch_trace), str(MXNET_LENET5), "--format", "json", "--top", "50")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["a"] == "torch lenet5" and doc["b"].startswith("mxnet")
    assert {r["op"] for r in doc["ops"]} >= set(COMMON)
