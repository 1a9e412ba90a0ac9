"""The language models (`--model lstm`, `--model transformer`) recorded as a user records
them, in every framework: the step's phases sum to it, the taxonomy leaves at most 10% of the
step as op ``other``, and the recurrent or attention ops and their backward twins are there.
(tests/test_model_parity.py checks that the three frameworks build the same networks.)"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.procs import needs

NEEDS = {"torch": "torch", "mxnet": "mxnet", "tf": "tensorflow"}
TINY = ["--batch-size", "8", "--steps", "2", "--warmup", "1", "--timing-steps", "1",
        "--threads", "1", "--format", "json"]
#: The canonical op each model's own layers map to.
KIND = {"lstm": "recurrent", "transformer": "attention"}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(KIND))
@pytest.mark.parametrize("fw", sorted(NEEDS))
def test_record_maps_the_language_model(fw: str, model: str, tmp_path: Path) -> None:
    needs(NEEDS[fw])
    out = tmp_path / "run.trace"
    res = run_cli("record", "--fw", fw, "--model", model, *TINY, "-o", str(out), timeout=600)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    steps = report["steps"]
    assert steps and all(sum(s["phases"].values()) == s["dur_ns"] for s in steps)
    by_op: dict[str, float] = defaultdict(float)
    for row in report["ops"]:
        by_op[row["op"]] += row["total_ns"]
    total = sum(s["dur_ns"] for s in steps)
    kind = KIND[model]
    assert by_op[kind] > 0 and by_op[f"{kind}_backward"] > 0, dict(by_op)
    # a gradient made of forward operators (MXNet's batch_dot's) is the backward twin too
    in_backward = {r["op"] for r in report["ops"] if r["phase"] == "backward"}
    assert kind not in in_backward, in_backward
    assert by_op["other"] <= 0.10 * total, f"op other {by_op['other'] / total:.1%} of the step"
    assert report["meta"]["layers"][kind] == 2
    assert report["meta"]["num_classes"] == 64  # the token vocabulary


def test_torch_transformer_learns_the_tokens_and_counts_next_token_accuracy() -> None:
    """The training step and the convergence run's accuracy of `--model transformer`, in
    process: 40 steps lower the next-token loss from about ln(64), and the held-out next-token
    accuracy is a share of every predicted position."""
    import torch

    from opprof.collectors.config import RecordConfig
    from opprof.collectors.torch import build_training

    torch.set_num_threads(1)
    config = RecordConfig(fw="torch", model="transformer", batch_size=16, converge=40)
    step, facts, convergence = build_training(config, torch.device("cpu"))
    assert facts["num_classes"] == 64 and facts["input_size"] == 32
    assert convergence is not None
    losses = [convergence.loss(step()) for _ in range(40)]
    assert losses[0] == pytest.approx(4.16, abs=0.4)  # ln(64): the untrained guess
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5
    train, test = convergence.accuracy()
    assert 1 / 64 < test <= 1 and 0 <= train <= 1
