"""MFU, HFU and the roofline in reports: a user's FlopCounterMode count and opprof's count from
the trace of the same script agree; real GPU traces are measured against their device's peak;
the peak's source is always named; recomputation is hardware FLOPs only."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "scripts" / "torch_flops.py"
PUBLIC = REPO / "fixtures" / "gpu-public"
CONTRACT = {"flops_per_step", "bytes_per_step", "achieved_flops_per_s", "peak_flops_per_s",
            "peak_source", "mfu", "hfu"}
ROOFLINE = {"op", "phase", "flops", "bytes", "intensity", "achieved_flops_per_s",
            "achieved_bytes_per_s", "roofline_share", "bound"}


def opprof(*args: str, cwd: Path | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opprof", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def report_json(trace: Path | str, *extra: str) -> dict:
    res = opprof("report", str(trace), "--format", "json", *extra)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def flop_counter(model: str, *extra: str) -> int:
    res = subprocess.run([sys.executable, str(SCRIPT), "--model", model, "--count-flops",
                          *extra], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return int(json.loads(res.stdout)["flops_per_step"])


# ------------------------------------------------------------------ a user's own script


@pytest.mark.parametrize(("model", "run_args", "count_args"), [
    ("convnet", (), ()),
    ("transformer", (), ()),
    # an LSTM on oneDNN runs as one mkldnn_rnn_layer per layer, which FlopCounterMode has no
    # formula for: its count is taken of the same model run as matmuls (no oneDNN)
    ("lstm", (), ("--no-mkldnn",)),
    ("lstm", ("--no-mkldnn",), ("--no-mkldnn",)),
    ("gru", (), ()),
], ids=["convnet", "transformer-sdpa", "lstm-onednn", "lstm-matmuls", "gru"])
def test_opprof_run_counts_what_flop_counter_mode_counts(model: str, run_args: tuple,
                                                        count_args: tuple,
                                                        tmp_path: Path) -> None:
    want = flop_counter(model, *count_args)
    trace = tmp_path / f"{model}.trace"
    res = opprof("run", "--steps", "2", "--warmup", "1", "--timing-steps", "1", "-o",
                 str(trace), "--", sys.executable, str(SCRIPT), "--model", model,
                 "--steps", "6", *run_args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    eff = report_json(trace)["efficiency"]
    assert set(eff) == CONTRACT
    assert eff["flops_per_step"] == pytest.approx(want, rel=0.05)
    assert eff["achieved_flops_per_s"] > 0 and eff["bytes_per_step"] > 0


# ------------------------------------------------------------------ real GPU traces


def test_an_llm_forward_on_h100_is_measured_against_the_h100_bf16_peak() -> None:
    """Qwen1.5-0.5B, bf16, a batch of 16 × 559 tokens on an H100 SXM (TraceLens' test trace):
    the model FLOPs are the transformer's, by hand — 2 · tokens · (non-embedding weights) for
    the layers' GEMMs, the LM head on each sequence's last token, 4 · B · L² · d per layer of
    attention — and MFU is against the H100's dense BF16 rate, named."""
    doc = report_json(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz")
    eff, detail = doc["efficiency"], doc["efficiency_detail"]
    b, seq, d, layers, ffn, vocab = 16, 559, 1024, 24, 2816, 151936
    tokens = b * seq
    per_layer = 4 * d * d + 3 * d * ffn  # q, k, v, o; gate, up, down
    by_hand = 2 * tokens * per_layer * layers + 2 * b * d * vocab + 4 * b * seq ** 2 * d * layers
    assert eff["flops_per_step"] == pytest.approx(by_hand, rel=0.02)
    assert eff["peak_flops_per_s"] == 989.4e12
    assert "H100 SXM" in eff["peak_source"] and "bf16" in eff["peak_source"]
    assert detail["precision"] == "bf16"
    assert eff["mfu"] == pytest.approx(eff["achieved_flops_per_s"] / 989.4e12)
    assert 0.05 < eff["mfu"] < 0.5


def test_recomputed_forward_is_hardware_flops_only() -> None:
    """ResNet with activation checkpointing under DDP on an MI300X: the convolutions run again
    inside the backward (``aten::conv2d`` under ``ReluBackward0``) count in HFU, not MFU."""
    eff = report_json(PUBLIC / "resnet-checkpoint-ddp-mi300x.json.gz")["efficiency"]
    assert "MI300X" in eff["peak_source"]
    assert eff["hfu"] > eff["mfu"] * 1.2 > 0


@pytest.mark.parametrize("name", ["qwen1.5-0.5b-forward-h100.json.gz",
                                  "gpt-oss-vllm-b200.json.gz",
                                  "resnet-checkpoint-ddp-mi300x.json.gz"])
def test_modern_gpu_traces_leave_little_to_other(name: str) -> None:
    """Flash attention, cuBLAS/nvjet/hipBLASLt GEMMs, RMSNorm, rotary, SwiGLU, vLLM's custom
    operators, NCCL/RCCL: op ``other`` is at most 10% of host and of GPU operator time."""
    doc = report_json(PUBLIC / name)
    for key in ("ops", "device_ops"):
        rows = doc[key]
        total = sum(r["total_ns"] for r in rows)
        other = sum(r["total_ns"] for r in rows if r["op"] == "other")
        assert total > 0 and other <= 0.10 * total, (key, other / total)


def test_roofline_rows_have_the_contract_keys_and_a_bound() -> None:
    doc = report_json(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz")
    rows = doc["roofline"]
    assert rows and all(ROOFLINE <= set(r) for r in rows)
    fc = next(r for r in rows if r["op"] == "fully_connected")
    assert fc["bound"] in ("compute", "memory", "latency-overhead")
    assert fc["intensity"] == pytest.approx(fc["flops"] / fc["bytes"])
    assert 0 < fc["roofline_share"] <= 1.0
    assert doc["roofline_kernels"] and all("kernel" in r for r in doc["roofline_kernels"])


def test_report_starts_with_mfu_against_a_named_peak() -> None:
    res = opprof("report", str(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz"))
    assert res.returncode == 0, res.stderr
    head = res.stdout.splitlines()[1]
    assert head.startswith("efficiency: MFU ") and "H100 SXM" in head


def test_roofline_view_and_its_csv() -> None:
    res = opprof("report", str(PUBLIC / "resnet-checkpoint-ddp-mi300x.json.gz"), "--by",
                 "roofline", "--format", "csv")
    assert res.returncode == 0, res.stderr
    header = res.stdout.splitlines()[0].split(",")
    assert {"kernel", "op", "phase", "intensity", "roofline_share", "bound"} <= set(header)
    res = opprof("report", str(PUBLIC / "resnet-checkpoint-ddp-mi300x.json.gz"), "--by",
                 "roofline")
    assert res.returncode == 0 and "Roofline by operator" in res.stdout


# ------------------------------------------------------------------ the peak


def test_gpu_names_find_their_rows() -> None:
    from opprof.flops.peaks import gpu_peak

    cases = {("NVIDIA H100 80GB HBM3", None): "H100 SXM", ("NVIDIA H100 PCIe", None): "H100 PCIe",
             ("NVIDIA H200", None): "H200 SXM", ("NVIDIA A100-PG509-200", None): "A100 40GB SXM",
             ("NVIDIA A100-SXM4-80GB", None): "A100 80GB SXM", ("NVIDIA B200", None): "B200",
             ("AMD Instinct MI300X VF", None): "MI300X", ("Tesla V100-SXM2-16GB", None):
             "V100 SXM2", ("AMD Radeon Graphics", 104): "MI250 (one GCD) or MI210",
             ("NVIDIA L4", None): "L4", ("NVIDIA L40S", None): "L40S"}
    for (name, units), device in cases.items():
        peak = gpu_peak(name, units)
        assert peak is not None and peak.device == device, name
    assert gpu_peak("AMD Radeon Graphics", None) is None  # a family name alone says nothing
    assert gpu_peak("NVIDIA H100 80GB HBM3").flops["bf16"] == 989.4e12


def test_the_users_peak_wins_and_is_named() -> None:
    eff = report_json(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz", "--peak-flops", "500T",
                      "--peak-bandwidth", "2T")["efficiency"]
    assert eff["peak_flops_per_s"] == 500e12 and eff["peak_source"].startswith("--peak-flops")
    assert eff["mfu"] == pytest.approx(eff["achieved_flops_per_s"] / 500e12)


def test_a_bad_peak_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = opprof("report", str(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz"), "--peak-flops",
                 "fast")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "fast" in res.stderr
    bogus = tmp_path / "peak.json"
    bogus.write_text("{}")
    res = opprof("report", str(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz"), "--peak-file",
                 str(bogus))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert str(bogus) in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_cpu_trace_uses_this_hosts_measured_peak(tmp_path: Path) -> None:
    """`calibrate --peak` measures a GEMM and a bandwidth loop; a CPU trace's MFU is against
    it, the calibration named; without one, MFU is unknown and the line says how to get it."""
    from opprof.pipeline.peak import PeakCalibrateOptions, measure, write

    doc = measure(PeakCalibrateOptions(threads=(1,), gemm_n=256, stream_elements=1 << 20,
                                       repeat=1))
    row = doc["threads"][0]
    assert row["threads"] == 1 and row["flops"]["fp32"] > 0 and row["bandwidth"] > 0
    peak = tmp_path / "peak.json"
    write(doc, peak)
    trace = REPO / "fixtures" / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
    eff = report_json(trace, "--peak-file", str(peak))["efficiency"]
    assert "calibrate --peak" in eff["peak_source"]
    assert eff["mfu"] == pytest.approx(eff["achieved_flops_per_s"] / row["flops"]["fp32"])
    res = subprocess.run([sys.executable, "-m", "opprof", "report", str(trace)],
                         capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ,
                              "OPPROF_PEAK_FILE": str(tmp_path / "none.json")})
    assert res.returncode == 0
    assert "MFU unknown: no peak for this CPU: run opprof calibrate --peak" in res.stdout


def test_a_trace_without_shapes_says_so() -> None:
    trace = REPO / "examples" / "traces" / "nccl-2rank-rank0.json.gz"
    doc = report_json(trace)
    assert doc["efficiency"]["mfu"] is None and doc["efficiency"]["flops_per_step"] is None
    res = opprof("report", str(trace))
    assert "efficiency: unknown" in res.stdout


def test_lenet5_recorded_by_opprof_has_its_flops_by_hand() -> None:
    """The built-in LeNet-5 (3×32×32 input, conv 6@5×5, pool, conv 16@5×5, pool, 120, 84, 10)
    at batch 8: forward 2·8·(6·75·784 + 16·150·100 + 400·120 + 120·84 + 84·10) FLOPs; backward
    twice that but for the first convolution's input gradient, which no one needs."""
    trace = REPO / "fixtures" / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
    eff = report_json(trace)["efficiency"]
    conv1, conv2 = 6 * 75 * 28 * 28, 16 * 150 * 10 * 10
    fc = 400 * 120 + 120 * 84 + 84 * 10
    forward = 2 * 8 * (conv1 + conv2 + fc)
    assert eff["flops_per_step"] == pytest.approx(3 * forward - 2 * 8 * conv1)
    assert not math.isnan(eff["bytes_per_step"])


# ------------------------------------------------------------------ across frameworks


@pytest.mark.slow
@pytest.mark.parametrize(("model", "batch"), [("lenet5", 8), ("resnet18", 2)])
def test_a_built_in_model_has_the_same_flops_in_every_framework(model: str, batch: int,
                                                                tmp_path: Path) -> None:
    """torch from Kineto's shapes, TensorFlow from its graphs' shapes beside the XPlane, MXNet
    from its symbol's inferred shapes beside the dump: the same model at the same batch size
    does the same model FLOPs per step (within 5%; here exactly)."""
    got = {}
    for fw in ("torch", "tf", "mxnet"):
        trace = tmp_path / f"{model}-{fw}.trace"
        res = opprof("record", "--fw", fw, "--model", model, "--steps", "1", "--warmup", "1",
                     "--timing-steps", "1", "--batch-size", str(batch), "-o", str(trace),
                     cwd=tmp_path, timeout=1500)
        assert res.returncode == 0, res.stderr
        doc = report_json(trace)
        got[fw] = doc["efficiency"]["flops_per_step"]
        assert doc["efficiency_detail"]["coverage"] > 0.5, (fw, doc["efficiency_detail"])
    assert got["tf"] == pytest.approx(got["torch"], rel=0.05), got
    assert got["mxnet"] == pytest.approx(got["torch"], rel=0.05), got


@pytest.mark.slow
@pytest.mark.parametrize("script", ["tf_keras_fit.py", "mxnet_hybrid_static.py"])
def test_opprof_run_counts_a_keras_or_gluon_users_flops(script: str, tmp_path: Path) -> None:
    """The same small CNN in a user's Keras ``fit`` script and a user's hybridized Gluon loop
    (batch 16: 3→16 and 16→32 3×3 same convolutions at 32² and 16², dense 2048→64→10): forward
    2·16·(32²·16·27 + 16²·32·144 + 2048·64 + 64·10) FLOPs, backward twice that but for the first
    convolution's input gradient — from the graphs' shapes opprof's adapters keep (Keras'
    function inlined under ``StatefulPartitionedCall/``; the Gluon block's cached graph)."""
    trace = tmp_path / "run.trace"
    res = opprof("run", "--steps", "2", "--warmup", "2", "-o", str(trace), "--",
                 sys.executable, str(REPO / "tests" / "scripts" / script), "--steps", "10",
                 cwd=tmp_path, timeout=1500)
    assert res.returncode == 0, res.stderr
    doc = report_json(trace)
    conv1, conv2 = 32 * 32 * 16 * 27, 16 * 16 * 32 * 144
    forward = 2 * 16 * (conv1 + conv2 + 2048 * 64 + 64 * 10)
    assert doc["efficiency"]["flops_per_step"] == pytest.approx(3 * forward - 2 * 16 * conv1)
    assert doc["efficiency_detail"]["coverage"] > 0.8


def test_diff_says_which_run_uses_its_machine_better() -> None:
    res = opprof("diff", str(PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz"),
                 str(PUBLIC / "resnet-checkpoint-ddp-mi300x.json.gz"), "--format", "json")
    assert res.returncode == 0, res.stderr
    eff = json.loads(res.stdout)["efficiency"]
    assert eff["better"] == "A" and set(eff["a"]) == CONTRACT
    assert eff["a"]["mfu"] > eff["b"]["mfu"]
    assert "uses its machine better" in eff["summary"]
    assert eff["ops"] and {"op", "a_peak_share", "b_peak_share", "share_of_gap"} <= set(
        eff["ops"][0])


def test_html_report_and_plot_draw_the_roofline(tmp_path: Path) -> None:
    trace = PUBLIC / "qwen1.5-0.5b-forward-h100.json.gz"
    res = opprof("report", str(trace), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'id="efficiency"' in page and "arithmetic intensity" in page and "MFU" in page
    res = opprof("plot", str(trace), "--figure", "roofline", "-o", str(tmp_path / "r.svg"))
    assert res.returncode == 0, res.stderr
    assert "arithmetic intensity" in (tmp_path / "r.svg").read_text()


def test_nsys_ranges_with_shapes_give_gemm_flops_and_unknown_bytes() -> None:
    """torch's ``emit_nvtx(record_shapes=True)`` ranges carry ``sizes = [[…]]`` and no dtypes
    or scalars: a matmul's FLOPs are known, its bytes and a convolution's FLOPs are not."""
    import pandas as pd

    from opprof.normalizers.cupti import nvtx_costs, split_nvtx

    text = pd.Series(["aten::mm, seq = 3, op_id = 5, sizes = [[4, 8], [8, 3]], "
                      "input_op_ids = [(1, 0), (2, 0)]",
                      "aten::conv2d, seq = 4, op_id = 6, sizes = [[1, 3, 8, 8], [6, 3, 3, 3], "
                      "[6], [], [], [], []]", "my_range"])
    name, detail, _ = split_nvtx(text)
    got = nvtx_costs(pd.Series(name), pd.Series(detail))
    assert got["model_flops"][0] == 2 * 4 * 8 * 3 and math.isnan(got["mem_bytes"][0])
    assert math.isnan(got["flops"][1]) and math.isnan(got["flops"][2])
