"""`opprof model BASE --mode tp|pp` from a one-worker trace (opprof.model.fromsingle, tpsplit,
ppsplit): the plan the built-in transformer and a user's own loop are split by, the model's
identities (degree 1 is the measured step, the terms sum to the step, what goes and what
stays), DTensor's measured costs row by row, --check against the real 2-worker runs, and the
command line. Real recordings in fixtures/parallel-model/ (fixtures/README.md); no timings
asserted."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.loader import load
from opprof.model.baseops import base_ops
from opprof.model.fromsingle import check_from_single, predict_from_single
from opprof.model.ppsplit import ideal_bubble_share, pp_stages
from opprof.model.terms import terms_from_steps
from opprof.model.tpsplit import dtensor_costs, measure_dtensor, tp_plan
from opprof.pipeline.calibrate import read_network
from opprof.trace import Trace
from tests.conftest import FIXTURES, run_cli

MODEL = FIXTURES / "parallel-model"
ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "opprof" / "model" / "dtensor_costs.csv"


@pytest.fixture(scope="module")
def single() -> Trace:
    return load(MODEL / "single.trace")


@pytest.fixture(scope="module")
def users_blocks() -> Trace:
    return load(MODEL / "users-blocks.trace")


@pytest.fixture(scope="module")
def users_mlp() -> Trace:
    return load(MODEL / "users-mlp.trace")


# ------------------------------------------------------------------ the base's typical operators


def test_a_pause_in_half_the_steps_does_not_enter_the_typical_time() -> None:
    # the one-worker transformer's optimizer step paused 2.3-4.5 ms in two of four steps on
    # several recordings; the plain median of four averaged half the pause into its typical
    # time (and the pipeline model split that pause over the stages' parameters)
    trace = load(MODEL / "single-default-threads.trace")
    ev = trace.events
    sgd = ev.index[ev["name"].astype(str) == "Optimizer.step#SGD.step"]
    assert len(sgd) == 4  # an even number of profiled steps
    before = base_ops(trace).of("update")
    usual = float(before.loc[before["name"] == "Optimizer.step#SGD.step", "dur_ns"].iloc[0])
    slowest = ev.loc[sgd, "dur"].nlargest(2).index  # the pause falls on the two slowest
    paused = ev.copy()
    paused.loc[slowest, "dur"] += 4_000_000
    after = base_ops(Trace(paused, trace.meta)).of("update")
    typical = float(after.loc[after["name"] == "Optimizer.step#SGD.step", "dur_ns"].iloc[0])
    assert typical == usual
    assert typical in set(ev.loc[sgd, "dur"].astype(float))  # a measured step's, not a mean


# ------------------------------------------------------------------ tensor parallel


def test_builtin_transformer_plan_shards_each_feed_forward_block(single: Trace) -> None:
    base = base_ops(single, "single.trace")
    plan = tp_plan(base, single.meta)
    layers = 2  # the built-in transformer's encoder layers
    assert plan.builtin and plan.pairs == layers
    assert "built-in transformer" in plan.source
    assert plan.activation_ndim == 3
    # the row-wise layer's output: batch × sequence × model width, 4-byte floats
    assert plan.activation_bytes == [plan.activation_bytes[0]] * layers
    assert plan.activation_bytes[0] > 0 and plan.activation_bytes[0] % 4 == 0
    # each pair: two weights and two biases are DTensors
    assert plan.dtensor_params == 4 * layers
    assert len(plan.forward_cuts) == len(plan.backward_cuts) == layers
    fwd, bwd = base.of("forward"), base.of("backward")
    assert plan.forward.shape == (len(fwd),) and plan.backward.shape == (len(bwd),)
    # the sharded windows hold linear layers, never a normalization or the loss
    assert (fwd["op"].to_numpy()[plan.forward] == "fully_connected").sum() == 2 * layers
    assert not np.isin(fwd["op"].to_numpy()[plan.forward], ["normalization", "loss"]).any()
    # each collective follows the row-wise layer that ends its window
    for cut in plan.forward_cuts:
        assert plan.forward[cut] and fwd["op"].iloc[cut] == "fully_connected"


def test_tensor_parallel_at_degree_one_is_the_measured_step(single: Trace) -> None:
    result = predict_from_single(single, "tp", [1], label="single.trace")
    one = result.predictions[0]
    assert one.step_ns == pytest.approx(result.base.step_ns)
    assert one.step_ns == pytest.approx(step_breakdown(single)["dur_ns"].mean())
    for piece in ("forward_dtensor_ns", "backward_dtensor_ns", "update_dtensor_ns",
                  "allreduce_ns", "wait_ns"):
        assert one.parts[piece] == 0.0
    assert one.terms["t_coloc"] == 0.0 and one.speedup == pytest.approx(1.0)


def test_tensor_parallel_terms_sum_to_the_step(single: Trace) -> None:
    result = predict_from_single(single, "tp", [1, 2, 4])
    for p in result.predictions:
        assert sum(p.terms.values()) == pytest.approx(p.step_ns)
        assert all(v >= 0 for k, v in p.terms.items() if k != "other")


def test_sharded_operators_shrink_and_replicated_stay(single: Trace) -> None:
    one, two, four = predict_from_single(single, "tp", [1, 2, 4]).predictions
    for phase in ("forward", "backward"):
        assert one.parts[f"{phase}_sharded_ns"] > two.parts[f"{phase}_sharded_ns"] > \
            four.parts[f"{phase}_sharded_ns"] > 0
        assert one.parts[f"{phase}_replicated_ns"] == two.parts[f"{phase}_replicated_ns"] \
            == four.parts[f"{phase}_replicated_ns"]
        # DTensor's work is per sharded pair, whatever the degree
        assert two.parts[f"{phase}_dtensor_ns"] == four.parts[f"{phase}_dtensor_ns"] > 0
    # a ring all-reduce among 4 carries more than among 2
    assert four.parts["allreduce_ns"] > two.parts["allreduce_ns"] > 0
    # the blocking all-reduces are exposed: comm at 2 holds them and the wait
    base_comm = predict_from_single(single, "tp", [1]).predictions[0].terms["t_comm"]
    assert two.terms["t_comm"] >= base_comm + two.parts["allreduce_ns"] + two.parts["wait_ns"] \
        - 1.0


def test_the_network_file_prices_the_all_reduces(single: Trace) -> None:
    net = read_network(MODEL / "net.json")
    assert net is not None
    assumed = predict_from_single(single, "tp", [2]).predictions[0]
    given = predict_from_single(single, "tp", [2], network=net)
    assert given.network.source != "assumed" and "assumed" not in given.network_note
    expected = sum(2.0 * float(np.asarray(net.cost_ns(float(n), 2)).reshape(-1)[0])
                   for n in given.model.tp.activation_bytes)  # type: ignore[union-attr]
    assert given.predictions[0].parts["allreduce_ns"] == pytest.approx(expected)
    assert assumed.parts["allreduce_ns"] != pytest.approx(expected)


def test_a_users_own_loop_gets_the_assumed_megatron_plan(users_blocks: Trace) -> None:
    base = base_ops(users_blocks, "users-blocks.trace")
    plan = tp_plan(base, users_blocks.meta)
    # torch_blocks.py --blocks 2: each block's up/down projection a pair, the head whole
    assert not plan.builtin and plan.source.startswith("assumed")
    assert plan.pairs == 2 and plan.activation_ndim == 2
    fc = base.of("forward")["op"].to_numpy() == "fully_connected"
    assert fc.sum() == 5 and not plan.forward[np.flatnonzero(fc)[-1]]
    result = predict_from_single(users_blocks, "tp", [2])
    assert "Megatron-LM" in result.plan
    assert any("2-D activations" in a for a in result.assumptions)


# ------------------------------------------------------------------ DTensor's costs


def _csv_rows() -> list[dict[str, str]]:
    text = CSV.read_text()
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("# ")))


@pytest.mark.parametrize("row", range(len(_csv_rows())))
def test_dtensor_cost_row_is_what_its_trace_measures(row: int) -> None:
    r = _csv_rows()[row]
    measured = measure_dtensor(load(ROOT / r["source"]))
    got = {"forward": measured.forward_ns, "backward": measured.backward_ns,
           "update": measured.update_call_ns}[r["phase"]]
    assert float(r["ns"]) == pytest.approx(got, abs=1.0)
    assert dtensor_costs()[int(r["activations"])].source == r["source"]


# ------------------------------------------------------------------ pipeline parallel


def test_builtin_transformer_stages_are_its_encoder_layers(single: Trace) -> None:
    base = base_ops(single)
    stages = pp_stages(base, single.meta, 2)
    assert stages.builtin and "2 encoder layers" in stages.source
    fwd, bwd = base.of("forward"), base.of("backward")
    assert set(np.unique(stages.forward)) == {0, 1} == set(np.unique(stages.backward))
    # consecutive: stage 0 runs the first operators of the forward, the last of the backward
    assert (np.diff(stages.forward) >= 0).all() and (np.diff(stages.backward) <= 0).all()
    assert len(stages.forward) == len(fwd) and len(stages.backward) == len(bwd)
    assert stages.update_share.sum() == pytest.approx(1.0)
    assert len(stages.boundary_bytes) == 1 and stages.boundary_bytes[0] > 0


def test_pipeline_of_one_stage_and_one_microbatch_is_the_measured_step(single: Trace) -> None:
    one = predict_from_single(single, "pp", [1], microbatches=1).predictions[0]
    assert one.step_ns == pytest.approx(step_breakdown(single)["dur_ns"].mean())
    assert one.parts["bubble_ns"] == 0.0 and one.parts["transfer_ns"] == 0.0


def test_pipeline_terms_sum_and_every_stage_waits(single: Trace) -> None:
    result = predict_from_single(single, "pp", [2, 4], microbatches=4)
    assert result.predictions[0].microbatches == 4
    for p in result.predictions:
        assert sum(p.terms.values()) == pytest.approx(p.step_ns)
        assert p.stages is not None and len(p.stages) == p.degree
        assert (p.stages["comm_ns"] > 0).all()  # every stage waits for a neighbour
        assert p.stages["forward_ops"].sum() == len(result.base.of("forward"))
        assert p.parts["bubble_ns"] > 0 and p.parts["transfer_ns"] > 0
        assert p.parts["ideal_bubble_share"] == pytest.approx(
            ideal_bubble_share(p.degree, 4)) == pytest.approx((p.degree - 1) / (4 + p.degree - 1))


def test_more_microbatches_shrink_the_bubble(single: Trace) -> None:
    one, four = (predict_from_single(single, "pp", [2], microbatches=m).predictions[0]
                 for m in (1, 4))
    assert four.parts["bubble_ns"] < one.parts["bubble_ns"]
    assert four.parts["ideal_bubble_share"] < one.parts["ideal_bubble_share"]
    # the comm term is the bubble and what the transfers add to it
    for pred in (one, four):
        assert pred.terms["t_comm"] == pytest.approx(pred.parts["bubble_ns"]
                                                     + pred.parts["transfer_ns"])
        assert pred.parts["transfer_ns"] >= 0


def test_default_microbatches_are_record_mode_pps(single: Trace, users_mlp: Trace) -> None:
    assert predict_from_single(single, "pp", [2]).predictions[0].microbatches == 4  # batch 8
    # a user's loop names no batch size: one micro-batch
    assert predict_from_single(users_mlp, "pp", [2]).predictions[0].microbatches == 1


def test_one_f_one_b_schedule(single: Trace) -> None:
    p = predict_from_single(single, "pp", [2], microbatches=4, schedule="1f1b").predictions[0]
    assert p.schedule == "1f1b" and sum(p.terms.values()) == pytest.approx(p.step_ns)


def test_a_users_own_loop_is_balanced_by_measured_time(users_mlp: Trace) -> None:
    base = base_ops(users_mlp)
    stages = pp_stages(base, users_mlp.meta, 2)
    assert not stages.builtin and stages.source.startswith("balanced by measured time")
    fwd = base.of("forward")["dur_ns"].to_numpy()
    share = fwd[stages.forward == 0].sum() / fwd.sum()
    assert 0.2 < share < 0.8  # both stages get a real part of the forward


# ------------------------------------------------------------------ --check


def test_tensor_parallel_check_takes_the_measured_runs_layout(single: Trace) -> None:
    measured = load(MODEL / "tp.trace")
    result = predict_from_single(single, "tp", [2], label="single.trace")
    chk = check_from_single(result, measured, "tp.trace")
    assert chk.degree == 2 and chk.microbatches == 1
    assert chk.measured_ns == pytest.approx(terms_from_steps(step_breakdown(measured)).step_ns)
    rows = chk.terms.set_index("term")
    # the measured terms (co-location split off its compute) sum to its step
    parts = rows.drop(index="step")
    assert parts["measured_ns"].sum() == pytest.approx(chk.measured_ns, rel=1e-6)
    assert parts["predicted_ns"].sum() == pytest.approx(chk.predicted_ns, rel=1e-6)
    assert rows.loc["step", "error"] == pytest.approx(chk.error)
    assert set(chk.noise) == {"base", "measured"} and chk.noise["measured"] > 0
    doc = json.loads(json.dumps(chk.to_dict(), allow_nan=False))
    assert doc["degree"] == 2 and [t["term"] for t in doc["terms"]][-1] == "step"


def test_pipeline_check_takes_the_measured_microbatches_and_schedule(single: Trace) -> None:
    measured = load(MODEL / "pp.trace")
    result = predict_from_single(single, "pp", [2], microbatches=1)
    chk = check_from_single(result, measured, "pp.trace")
    assert (chk.degree, chk.microbatches, chk.schedule) == (2, 4, "gpipe")
    # a term the run spent nothing on has no relative error, and the JSON stays JSON
    doc = json.loads(json.dumps(chk.to_dict(), allow_nan=False))
    for t in doc["terms"]:
        assert t["error"] is None or np.isfinite(t["error"])


def test_check_against_another_dimension_is_refused(single: Trace) -> None:
    from opprof.errors import OpprofError

    result = predict_from_single(single, "tp", [2])
    with pytest.raises(OpprofError, match="ran --mode pp; the prediction is for tp"):
        check_from_single(result, load(MODEL / "pp.trace"), "pp.trace")


def test_check_refuses_workers_with_other_threads_and_names_the_fix() -> None:
    from opprof.errors import OpprofError

    # the transformer on torch's default threads (2 on the 2-CPU host) against workers of 1
    base = load(MODEL / "single-default-threads.trace")
    assert base.meta.get("threads") == 2
    result = predict_from_single(base, "tp", [2])
    with pytest.raises(OpprofError, match=r"2 vs 1 threads per worker.*--threads 1"):
        check_from_single(result, load(MODEL / "tp.trace"), "tp.trace")


def test_check_against_another_model_is_refused(single: Trace) -> None:
    from opprof.errors import OpprofError

    # the built-in transformer against a user's own TP script (torch_tp.py's MLP blocks)
    result = predict_from_single(single, "tp", [2])
    with pytest.raises(OpprofError, match="a user's script, the modelled trace the built-in"):
        check_from_single(result, load(FIXTURES / "torch-parallel" / "tp"), "tp")


def test_a_framework_other_than_torch_is_one_line() -> None:
    res = run_cli("model", str(FIXTURES / "memory" / "tf-lenet5"), "--mode", "tp",
                  "--workers", "2")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "tf run" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ the command line


def test_model_command_predicts_tp_from_one_worker() -> None:
    res = run_cli("model", str(MODEL / "single.trace"), "--mode", "tp", "--workers", "2")
    assert res.returncode == 0, res.stderr
    assert "Predicted step by tp degree from one worker" in res.stdout
    assert "the built-in transformer's plan" in res.stdout


def test_model_command_predicts_pp_from_one_worker_as_json() -> None:
    res = run_cli("model", str(MODEL / "single.trace"), "--mode", "pp", "--workers", "2,4",
                  "--microbatches", "8", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["dimension"] == "pp" and doc["from"] == "one worker"
    assert doc["base"]["workers"] == 1 and doc["base"]["model"] == "transformer"
    assert [(p["degree"], p["microbatches"]) for p in doc["predictions"]] == [(2, 8), (4, 8)]
    for p in doc["predictions"]:
        assert sum(p["terms"].values()) == pytest.approx(p["step_ns"])
        assert len(p["stages"]) == p["degree"]


def test_model_command_checks_against_the_measured_run() -> None:
    res = run_cli("model", str(MODEL / "single.trace"), "--mode", "tp", "--workers", "2",
                  "--network", str(MODEL / "net.json"), "--check", str(MODEL / "tp.trace"),
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    chk = json.loads(res.stdout)["check"]
    assert chk["label"] == "tp.trace" and chk["degree"] == 2
    assert {"predicted_ns", "measured_ns", "error", "terms", "spread", "colocation",
            "noise"} <= set(chk)
    text = run_cli("model", str(MODEL / "single.trace"), "--mode", "pp", "--workers", "2",
                   "--check", str(MODEL / "pp.trace"))
    assert text.returncode == 0, text.stderr
    assert "check (pp.trace)" in text.stdout and "4 micro-batches, gpipe" in text.stdout


def test_expert_parallel_from_one_worker_is_one_line() -> None:
    res = run_cli("model", str(MODEL / "single.trace"), "--mode", "ep", "--workers", "2")
    assert res.returncode != 0
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_users_loop_recorded_now_is_split_by_the_model(tmp_path: Path) -> None:
    """A user's one-process loop under `opprof run`, then `opprof model --mode tp` and `pp`."""
    out = tmp_path / "mine.trace"
    res = run_cli("run", "--steps", "3", "--warmup", "1", "--timing-steps", "1", "-o", str(out),
                  "--", "python", str(ROOT / "tests" / "scripts" / "torch_blocks.py"),
                  "--kind", "blocks", "--blocks", "2", "--width", "32", "--steps", "6",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for mode in ("tp", "pp"):
        res = run_cli("model", str(out), "--mode", mode, "--workers", "1,2", "--format", "json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["dimension"] == mode and doc["base"]["workers"] == 1
        one, two = doc["predictions"]
        assert one["step_ns"] == pytest.approx(doc["base"]["step_ns"])
        for p in (one, two):
            assert sum(p["terms"].values()) == pytest.approx(p["step_ns"])
    assert "Megatron-LM" in json.loads(run_cli("model", str(out), "--mode", "tp", "--workers",
                                               "2", "--format", "json").stdout)["plan"]
