"""`opprof diff` between a real PyTorch recording and a real MXNet one: per-op ratios over the
common taxonomy, the same model on both sides."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.procs import needs  # (before the imports it guards)

needs("torch")

from opprof.analysis.diff import diff  # noqa: E402
from opprof.loader import load  # noqa: E402
from opprof.render.verdicts import diff_sentence  # noqa: E402
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
    assert diff_sentence(d).endswith(".") and "explains most of it" in diff_sentence(d)


def test_diff_command_compares_torch_with_mxnet(torch_trace: Path) -> None:
    res = run_cli("diff", str(torch_trace), str(MXNET_LENET5), "--format", "json", "--top", "50")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["a"] == "torch lenet5" and doc["b"].startswith("mxnet")
    assert {r["op"] for r in doc["ops"]} >= set(COMMON)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def test_diff_prints_unprofiled_step_times_and_bases_the_headline_on_them(
        torch_trace: Path, tmp_path: Path) -> None:
    other = tmp_path / "again.trace"
    shutil.copy(torch_trace, other)
    meta = load(torch_trace).meta
    res = run_cli("diff", str(torch_trace), str(other))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    u = meta["unprofiled_step_ns"]
    assert f"step, unprofiled: A {_ms(u)} ms, B {_ms(u)} ms → A/B 1.00x (the headline)" in out
    assert "step, profiled:" in out and "profiler overhead: A profiled/unprofiled" in out
    # the same model on both sides: the runs are named by their files
    assert "A = lenet5-torch.trace  ·  B = again.trace" in out
    assert "0.00x" not in out and "∞" not in out
    doc = json.loads(run_cli("diff", str(torch_trace), str(MXNET_LENET5), "--format",
                             "json").stdout)
    # the MXNet fixture has no unprofiled timing: the headline is on profiled steps, said so
    assert doc["basis"] == "profiled" and doc["a_unprofiled_step_ns"] == u
    assert doc["b_unprofiled_step_ns"] is None
    assert doc["headline_ratio"] == pytest.approx(doc["a_step_ns"] / doc["b_step_ns"])
    # batch 8 on both, the same device and workers: no warning
    assert doc["mismatches"] == []


def test_sentence_says_when_the_profiler_turns_the_ranking_round(torch_trace: Path) -> None:
    """The headline is on the unprofiled steps, the operators are all profiled: where the
    profiler's overhead turns the ranking round, the sentence says so and names whose
    profiled gap the operator explains, instead of setting it under the headline."""
    d = diff(load(torch_trace), load(MXNET_LENET5), "torch", "mxnet")
    a_slower = d.a_step_ns > d.b_step_ns
    slower = d.a_label if a_slower else d.b_label
    agree = (2e6, 1e6) if a_slower else (1e6, 2e6)
    for ua, ub in (agree, agree[::-1]):
        text = diff_sentence(replace(d, a_unprofiled_ns=ua, b_unprofiled_ns=ub))
        turned = (ua, ub) != agree
        assert ("rank them the other way round" in text) == turned
        assert (f"of the profiled gap ({slower} slower), " in text) == turned
        assert "explains most of it" in text and "-0%" not in text


def test_importing_the_native_folder_gives_rank_0_and_the_runs_metadata(
        torch_trace: Path, tmp_path: Path) -> None:
    native = torch_trace.with_name("lenet5-torch.native")
    out = tmp_path / "again.trace"
    res = run_cli("import", str(native), "-o", str(out))
    assert res.returncode == 0, res.stderr
    recorded, imported = load(torch_trace), load(out)
    assert sorted(imported.events["rank"].unique()) == [0]
    for key in ("model", "dataset", "unprofiled_step_ns", "command", "opprof_version",
                "framework_version", "batch_size", "workers"):
        assert imported.meta.get(key) is not None and \
            imported.meta[key] == recorded.meta[key], key
    rep = run_cli("report", str(out)).stdout
    assert f"unprofiled: {_ms(recorded.meta['unprofiled_step_ns'])} ms/step" in rep
    assert "torch  ·  lenet5" in rep


#: A byte count in decimal units (rates, MB/s, are decimal and allowed).
DECIMAL_BYTES = re.compile(r"\d (?:kB|KB|MB|GB|TB)(?!/s)")


def test_console_output_uses_binary_units_for_bytes(torch_trace: Path) -> None:
    for args in (("diff", str(torch_trace), str(MXNET_LENET5)),
                 ("report", str(torch_trace), "--by", "memory"),
                 ("model", str(torch_trace), "--workers", "2,4")):
        res = run_cli(*args)
        assert res.returncode == 0, res.stderr
        assert not DECIMAL_BYTES.search(res.stdout), (args, DECIMAL_BYTES.search(res.stdout))
        assert "MiB" in res.stdout or "KiB" in res.stdout, args
