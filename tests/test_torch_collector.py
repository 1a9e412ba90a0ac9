"""A real PyTorch recording: trace, phase markers, torch's own aggregate and the run's meta."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from opprof.collectors import RecordConfig, record  # noqa: E402
from opprof.errors import OpprofError  # noqa: E402

PHASES = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("torch-rec")
    config = RecordConfig(fw="torch", model="lenet5", batch_size=8, steps=2, warmup=1,
                          timing_steps=1, command="opprof record --fw torch --model lenet5")
    seen: list[tuple[str, int, int]] = []
    rec = record(config, workdir, lambda *a: seen.append(a))
    return workdir, rec, seen


@pytest.mark.slow
def test_trace_has_steps_and_phases(recorded) -> None:
    workdir, rec, _ = recorded
    assert rec.native == [workdir / "rank0.pt.trace.json"]
    doc = json.loads(rec.native[0].read_text())
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    names = Counter(e["name"] for e in events)
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert len(steps) == 2 and sum(names[n] for n in steps) == 2
    for phase in PHASES:
        assert names[phase] == 2, phase
    assert any(n.startswith("aten::") for n in names)
    assert any("DataLoader" in n for n in names)  # loading is real and inside the trace


@pytest.mark.slow
def test_phases_nest_in_steps_in_order(recorded) -> None:
    _, rec, _ = recorded
    events = [e for e in json.loads(rec.native[0].read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    for step in (e for e in events if e["name"].startswith("ProfilerStep#")):
        end = step["ts"] + step["dur"]
        inside = sorted((e for e in events if e["name"] in PHASES
                         and step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end),
                        key=lambda e: e["ts"])
        assert [e["name"] for e in inside] == list(PHASES)


@pytest.mark.slow
def test_key_averages(recorded) -> None:
    workdir, _, _ = recorded
    rows = json.loads((workdir / "rank0.key_averages.json").read_text())
    assert rows and {"name", "count", "cpu_time_total_us", "self_cpu_time_total_us"} <= set(rows[0])
    by_name = {r["name"]: r for r in rows}
    assert by_name["ProfilerStep*"]["count"] == 2
    for phase in PHASES:
        assert by_name[phase]["count"] == 2
        assert by_name[phase]["cpu_time_total_us"] >= by_name[phase]["self_cpu_time_total_us"]


@pytest.mark.slow
def test_meta(recorded) -> None:
    _, rec, seen = recorded
    m = rec.meta
    assert m["framework"] == "torch" and m["framework_version"] == torch.__version__
    assert (m["model"], m["dataset"], m["batch_size"]) == ("lenet5", "synthetic-cifar10", 8)
    assert (m["workers"], m["servers"], m["mode"], m["device"]) == (1, 0, "single", "cpu")
    assert (m["warmup_steps"], m["timing_steps"], m["profiled_steps"]) == (1, 1, 2)
    assert m["params"] == 62_006 and m["input_size"] == 32 and m["num_classes"] == 10
    assert m["unprofiled_step_ns"] > 0 and m["profiled_wall_ns"] > 0
    assert m["samples_per_s"] == pytest.approx(8 / (m["unprofiled_step_ns"] / 1e9))
    assert m["command"] == "opprof record --fw torch --model lenet5"
    assert m["seed"] == 0 and len(m["hosts"]) == 1
    json.dumps(m)  # goes into the .trace metadata as JSON
    assert ("warmup", 1, 1) in seen and ("timing", 1, 1) in seen and ("profile", 2, 2) in seen


@pytest.mark.parametrize("changes, message", [
    ({"workers": 2}, "single runs one worker"),
    ({"workers": 2, "mode": "ps-sync"}, "no parameter-server mode"),
])
def test_unsupported_modes(tmp_path: Path, changes: dict, message: str) -> None:
    config = RecordConfig(fw="torch", model="lenet5", **changes)
    with pytest.raises(OpprofError, match=message):
        record(config, tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu(tmp_path: Path) -> None:
    config = RecordConfig(fw="torch", model="lenet5", device="cuda")
    with pytest.raises(OpprofError, match="no CUDA GPU"):
        record(config, tmp_path)
