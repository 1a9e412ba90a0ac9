"""The language models (`--model lstm`, `--model transformer`) recorded as a user records
them, in every framework: the step's phases sum to it, the taxonomy leaves at most 10% of the
step as op ``other``, and the recurrent or attention ops and their backward twins are there.
(tests/test_model_parity.py checks that the three frameworks build the same networks.)"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_cli

NEEDS = {"torch": "torch", "mxnet": "mxnet", "tf": "tensorflow"}
TINY = ["--batch-size", "8", "--steps", "2", "--warmup", "1", "--timing-steps", "1",
        "--threads", "1", "--format", "json"]
#: The canonical op each model's own layers map to.
KIND = {"lstm": "recurrent", "transformer": "attention"}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(KIND))
@pytest.mark.parametrize("fw", sorted(NEEDS))
def test_record_maps_the_language_model(fw: str, model: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(NEEDS[fw]) is None:
        pytest.skip(f"{fw} needs {NEEDS[fw]}, which is not installed")
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
    assert by_op["other"] <= 0.10 * total, f"op other {by_op['other'] / total:.1%} of the step"
    assert report["meta"]["layers"][kind] == 2
    assert report["meta"]["num_classes"] == 64  # the token vocabulary
