"""The FLOPs model: every row of every operator table costs its example as written; torch's
real operators, profiled with their shapes, cost what FlopCounterMode counts for them; nested
events are counted once; unknown shapes stay unknown."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from opprof.flops.families import Call, Spec, Tensor, conv_backward, gemm
from opprof.flops.table import (
    COMPOSITE_KIND,
    COSTED,
    FORWARD,
    UNMODELED,
    kineto_cost,
    operator_table,
    parse_example,
    parse_expect,
)

TABLES = sorted(p.name.removesuffix(".csv")
                for p in resources.files("opprof.flops").joinpath("maps").iterdir()
                if p.name.endswith(".csv"))
ROWS = [(t, r) for t in TABLES for r in operator_table(t).rows]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize(("table", "row"), ROWS, ids=[f"{t}:{r.line}:{r.pattern[:40]}"
                                                       for t, r in ROWS])
def test_row_costs_its_example(table: str, row) -> None:
    assert row.example and row.expect, f"{table} line {row.line} has no example or expect"
    got = row.cost(parse_example(row.example))
    flops, model, nbytes = parse_expect(row.expect)
    if got is None:
        assert math.isnan(flops) and math.isnan(model) and math.isnan(nbytes)
        return
    assert _same(got.flops, flops), f"hardware FLOPs {got.flops} != {flops}"
    assert _same(got.model_flops, model), f"model FLOPs {got.model_flops} != {model}"
    assert _same(got.bytes, nbytes), f"bytes {got.bytes} != {nbytes}"
    assert got.model_flops <= got.flops or math.isnan(got.flops)


@pytest.mark.parametrize(("table", "row"), ROWS, ids=[f"{t}:{r.line}:{r.name}" for t, r in ROWS])
def test_row_is_the_first_to_match_its_name(table: str, row) -> None:
    assert row.name, f"{table} line {row.line} has no name"
    assert operator_table(table).row(row.name) is row, (
        f"{row.name!r} is taken by line {operator_table(table).row(row.name).line}")


def test_gemm_counts_a_multiply_add_as_two_and_broadcasts() -> None:
    spec = Spec({"a": 0, "b": 1})
    cost = gemm(Call((Tensor((7, 3, 5), "fp32"), Tensor((5, 11), "fp32"))), spec)
    assert cost is not None and cost.model_flops == 2 * 7 * 3 * 5 * 11
    assert gemm(Call((Tensor((3, 5), "fp32"), Tensor((4, 11), "fp32"))), spec) is None


def test_grouped_convolution_weight_gradient_costs_the_forward() -> None:
    """dW[co, ci, k] = Σ x·dy over batch and positions: as many multiply-adds as the
    forward, whatever the groups (FlopCounterMode of torch 2.13 counts it ``groups`` times)."""
    spec = Spec({"gy": 0, "x": 1, "w": 2, "mask": 10})
    n, c, hw, groups = 4, 32, 16, 8
    gy, x = Tensor((n, c, hw, hw), "fp32"), Tensor((n, c, hw, hw), "fp32")
    w = Tensor((c, c // groups, 3, 3), "fp32")
    scalars = ("", "", "", "[32]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]",
               str(groups), "[False, True, False]")
    cost = conv_backward(Call((gy, x, w), scalars), spec)
    macs = n * c * hw * hw * (c // groups) * 9  # one per (output element, input tap)
    assert cost is not None and cost.model_flops == 2 * macs


def test_unknown_shapes_are_unknown_never_guessed() -> None:
    flops, model, nbytes, prec, kind = kineto_cost("aten::mm", [[], []], ["", ""], ["", ""])
    assert math.isnan(flops) and math.isnan(model) and kind == COSTED
    assert kineto_cost("mylib::custom", [[4, 4]], ["float"], [""])[4] == UNMODELED
    assert kineto_cost("aten::einsum", [[], [[4, 5], [5, 6]], []], ["", "TensorList", ""],
                       ["", "", ""])[4] == COMPOSITE_KIND
    assert kineto_cost("aten::linear", [[4, 8], [3, 8], [3]], ["float"] * 3,
                       ["", "", ""])[4] == FORWARD


# ------------------------------------------------------------------ real torch operators


def _profile(fn, tmp_path: Path) -> dict:
    """(name, flops) of every costed call in a torch.profiler trace of ``fn()`` (record_shapes)
    and FlopCounterMode's count of the same calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    del torch
    return {"trace": path, "flop_counter": counter.get_total_flops()}


CASES = {
    "mm": lambda t: t.mm(t.randn(6, 5), t.randn(5, 7)),
    "addmm": lambda t: t.addmm(t.randn(7), t.randn(6, 5), t.randn(5, 7)),
    "bmm": lambda t: t.bmm(t.randn(3, 6, 5), t.randn(3, 5, 7)),
    "baddbmm": lambda t: t.baddbmm(t.randn(3, 6, 7), t.randn(3, 6, 5), t.randn(3, 5, 7)),
    "matmul broadcast": lambda t: t.matmul(t.randn(2, 1, 6, 5), t.randn(3, 5, 7)),
    "linear 3-D": lambda t: t.nn.functional.linear(t.randn(2, 6, 5), t.randn(7, 5), t.randn(7)),
    "conv1d": lambda t: t.nn.functional.conv1d(t.randn(2, 4, 17), t.randn(6, 4, 3), stride=2),
    "conv2d dilated": lambda t: t.nn.functional.conv2d(t.randn(2, 4, 13, 11),
                                                       t.randn(8, 2, 3, 3), padding=2,
                                                       dilation=2, groups=2),
    "conv3d": lambda t: t.nn.functional.conv3d(t.randn(1, 2, 6, 6, 6), t.randn(4, 2, 3, 3, 3)),
    "conv_transpose2d": lambda t: t.nn.functional.conv_transpose2d(
        t.randn(2, 6, 5, 5), t.randn(6, 4, 3, 3), stride=2, padding=1, output_padding=1),
    "einsum": lambda t: t.einsum("bij,bjk->bik", t.randn(3, 6, 5), t.randn(3, 5, 7)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_profiled_operator_costs_what_flop_counter_mode_counts(case: str,
                                                                 tmp_path: Path) -> None:
    import torch

    from opprof.loader import load

    got = _profile(lambda: CASES[case](torch), tmp_path)
    ev = load([got["trace"]]).events
    counted = ev[ev["counted"] & (ev["device"] == "cpu")]
    assert counted["model_flops"].sum() == got["flop_counter"] > 0


def test_convolution_backward_costs_what_flop_counter_mode_counts(tmp_path: Path) -> None:
    """Forward and backward of a strided, padded convolution whose input needs no gradient
    (the output mask leaves the input's gradient out) and a linear layer."""
    import torch

    from opprof.loader import load

    conv = torch.nn.Conv2d(3, 8, 5, stride=2, padding=1)
    fc = torch.nn.Linear(8 * 15 * 15, 10)
    x = torch.randn(4, 3, 32, 32)

    def step() -> None:
        fc(torch.relu(conv(x)).flatten(1)).sum().backward()

    got = _profile(step, tmp_path)
    ev = load([got["trace"]]).events
    counted = ev[ev["counted"] & (ev["device"] == "cpu")]
    assert counted["model_flops"].sum() == got["flop_counter"]


def test_nested_events_are_counted_once_at_the_outermost_costed_operator(
        tmp_path: Path) -> None:
    """``aten::linear > aten::addmm``: the addmm's FLOPs are the linear's, once; the addmm
    event itself (not counted) carries none."""
    import torch

    from opprof.loader import load

    got = _profile(lambda: torch.nn.functional.linear(torch.randn(4, 16), torch.randn(8, 16),
                                                      torch.randn(8)), tmp_path)
    ev = load([got["trace"]]).events
    linear = ev[ev["name"] == "aten::linear"]
    addmm = ev[ev["name"] == "aten::addmm"]
    assert len(linear) == 1 and len(addmm) == 1
    assert linear["model_flops"].iloc[0] == 2 * 4 * 16 * 8
    assert np.isnan(addmm["model_flops"].iloc[0]) and not addmm["counted"].iloc[0]
    assert ev.loc[ev["counted"], "model_flops"].sum() == 2 * 4 * 16 * 8


def test_a_trace_without_shapes_has_unknown_costs(tmp_path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from opprof.loader import load

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    ev = load([tmp_path / "t.json"]).events
    assert ev["flops"].isna().all() and ev["model_flops"].isna().all()


def test_the_kineto_reader_keeps_costs_without_detail(tmp_path: Path) -> None:
    """A report reads traces without their detail text: the costs are taken anyway."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from opprof.normalizers import read_native

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(torch.randn(8, 4), torch.randn(4, 2))
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    got = read_native(path, {}, detail=False)
    assert got.trace is not None
    ev = got.trace.events
    assert ev.loc[ev["name"] == "aten::mm", "model_flops"].tolist() == [2 * 8 * 4 * 2]
    assert json.loads(json.dumps(float(ev["model_flops"].sum()))) == 128.0
