"""`opprof run` on the training loops users run instead of their own: Lightning's `fit` (automatic
optimization, whose forward and backward run inside the optimizer's closure; manual
optimization; its own DDP, launched and spawned; its ModelParallelStrategy; both import
names), the Hugging Face `Trainer` and Accelerate (one process and `accelerate launch`), each
a real script of tests/scripts/ that does not import opprof.

On each: every process is recorded, exits 0, one step per optimizer step (a step spans its
accumulated micro-batches), the phases sum to each step, forward and backward are found in
every step, update holds only the optimizer's own work (no forward or backward operator is
update), and operator `other` is at most 10% of the step."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from opprof.collectors.torch import CLOSURE
from opprof.loader import load
from opprof.normalizers import closures
from opprof.taxonomy import mapping_table
from tests.conftest import REPO, run_cli
from tests.procs import needs
from tests.test_run import check_steps, opprof_run

SCRIPTS = REPO / "tests" / "scripts"
STEPS = 3  # profiled steps per process (tests.test_run.PROTOCOL)
#: Nothing is downloaded: the models are built from configs.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
#: Two processes on the CPU: `--multi_gpu` starts them with torchrun (gloo where there is no
#: GPU); `--cpu --num_processes 2` would start one (Accelerate's CPU jobs need `mpirun`).
ACCELERATE_LAUNCH = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no")


@dataclass(frozen=True)
class Loop:
    """A script run under `opprof run`: its command (``python`` or ``accelerate`` first; a
    script named by its file in tests/scripts), the modules it needs,
    its processes, forward passes (loss calls) and optimizer steps per training step, and
    whether its optimizer is given a closure."""

    command: tuple[str, ...]
    modules: tuple[str, ...]
    ranks: int = 1
    losses: int = 1
    optimizer_steps: int = 1
    closure: bool = False
    mode: str | None = None  # the job's, where not data parallel
    replicas: bool = False  # several processes that run no collective


LOOPS = {
    # automatic optimization, AdamW + a per-step LR scheduler, gradients clipped
    "lightning-fit": Loop(("python", "lightning_fit.py", "--steps", "8", "--clip", "1.0"),
                          ("lightning",), closure=True),
    # accumulate_grad_batches=2: the first micro-batch outside optimizer.step, the second in it
    "lightning-accumulate": Loop(("python", "lightning_fit.py", "--steps", "8", "--accumulate",
                                  "2"), ("lightning",), losses=2, closure=True),
    # pytorch_lightning, manual optimization: two optimizers (a GAN), manual_backward; one
    # step runs the generator's loss and the next batch's discriminator's two
    "lightning-manual": Loop(("python", "lightning_manual.py", "--steps", "8"),
                             ("pytorch_lightning",), losses=3, optimizer_steps=2, closure=True),
    "lightning-ddp": Loop(("python", "lightning_fit.py", "--steps", "8", "--devices", "2",
                           "--strategy", "ddp"), ("lightning",), ranks=2, closure=True),
    # ModelParallelStrategy: DTensor tensor parallel on a mesh whose data-parallel groups
    # hold one rank each (it broadcasts over them)
    "lightning-tp": Loop(("python", "lightning_tp.py", "--steps", "8"), ("lightning",),
                         ranks=2, closure=True, mode="tp"),
    "hf-trainer-gpt2": Loop(("python", "hf_trainer.py", "--steps", "8"), ("transformers",)),
    "hf-trainer-bert-accumulate": Loop(("python", "hf_trainer.py", "--steps", "8", "--model",
                                        "bert", "--accumulate", "2"), ("transformers",),
                                       losses=2),
    "accelerate-accumulate": Loop(("python", "accelerate_loop.py", "--steps", "8",
                                   "--accumulate", "2"), ("accelerate",), losses=2),
    "accelerate-launch": Loop((*ACCELERATE_LAUNCH, "accelerate_loop.py", "--steps", "8"),
                              ("accelerate",), ranks=2),
    # a plain Accelerator() on a host without a GPU stays non-distributed: two replicas
    # that never communicate, launched as a data-parallel job
    "accelerate-launch-plain": Loop((*ACCELERATE_LAUNCH, "accelerate_loop.py", "--steps", "8",
                                     "--plain"), ("accelerate",), ranks=2, replicas=True),
}


@dataclass
class Run:
    """One loop's `opprof run`: its folder, result, JSON report and trace."""

    tmp: Path
    res: object
    report: dict
    events: pd.DataFrame


@pytest.fixture(scope="module", params=list(LOOPS))
def run(request, tmp_path_factory) -> tuple[Loop, Run]:
    loop = LOOPS[request.param]
    needs(*loop.modules)
    tmp = tmp_path_factory.mktemp(request.param)
    res, report = opprof_run(tmp, *_argv(loop.command), env=OFFLINE)
    assert res.returncode == 0, res.stderr[-3000:]
    return loop, Run(tmp, res, report, load(tmp / "run.trace").events)


def _argv(command: tuple[str, ...]) -> list[str]:
    """The command as a user types it: ``python`` this Python, ``accelerate`` the one on PATH
    (else its module), scripts from tests/scripts."""
    head = {"python": [sys.executable],
            "accelerate": ([shutil.which("accelerate")] if shutil.which("accelerate") else
                           [sys.executable, "-m", "accelerate.commands.accelerate_cli"])}
    return [*head[command[0]], *(str(SCRIPTS / a) if a.endswith(".py") else a
                                 for a in command[1:])]


def _profiled(ev: pd.DataFrame) -> pd.DataFrame:
    return ev[(ev["step"] >= 0) & ev["counted"] & (ev["device"] == "cpu")]


@pytest.mark.slow
def test_every_process_is_recorded_and_each_step_sums_up(run) -> None:
    loop, r = run
    assert "startup hook failed" not in r.res.stderr and "cannot hook" not in r.res.stderr
    check_steps(r.report, list(range(loop.ranks)), STEPS)
    for s in r.report["steps"]:
        assert s["phases"]["forward"] > 0, s
    m = r.report["meta"]
    assert m["workers"] == loop.ranks
    assert m["mode"] == (loop.mode or ("allreduce" if loop.ranks > 1 else "single"))


@pytest.mark.slow
def test_workers_that_never_communicate_are_told_apart_from_data_parallel(run) -> None:
    """Several processes launched as a data-parallel job that run no collective (Accelerate's
    plain ``Accelerator()`` on a CPU) keep the launcher's mode, and the report says in one
    line that each trained a replica of its own; a job that communicates is not warned."""
    loop, r = run
    if loop.ranks < 2:
        pytest.skip("one process: nothing to communicate with")
    res = run_cli("report", str(r.tmp / "run.trace"))
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stdout.splitlines() if "no collective" in line]
    assert bool(warned) == loop.replicas, res.stdout[:2000]
    if loop.replicas:
        assert warned[0].startswith("⚠ no collective: the 2 workers ran no communication")
        assert not r.events["kind"].astype(str).eq("comm").any()


@pytest.mark.slow
def test_operator_other_is_small(run) -> None:
    _, r = run
    step_ns = sum(s["dur_ns"] for s in r.report["steps"]) / len(r.report["steps"])
    other = sum(o["ns_per_step"] for o in r.report["ops"] if o["op"] == "other")
    assert other <= 0.10 * step_ns, [o for o in r.report["ops"] if o["op"] == "other"]


@pytest.mark.slow
def test_forward_and_backward_operators_are_never_update(run) -> None:
    """Every operator whose own row is forward (a convolution, a linear layer, the loss) is
    forward, every autograd function backward, and update holds none of them: only the
    optimizer's step, its zero_grad and what runs between backward and the step (clipping)."""
    _, r = run
    ev = _profiled(r.events)
    names = ev["name"].astype(str)
    row = mapping_table("kineto").classify(names.unique())["phase"]
    own = names.map(row).fillna("")
    phase = ev["phase"].astype(str)
    assert (phase[own == "forward"] == "forward").all(), \
        names[(own == "forward") & (phase != "forward")].value_counts().head().to_dict()
    assert (phase[own == "backward"] == "backward").all(), \
        names[(own == "backward") & (phase != "backward")].value_counts().head().to_dict()
    update = ev[phase == "update"]
    assert not update["op"].astype(str).str.endswith("_backward").any()
    assert not update["op"].astype(str).isin(
        ["convolution", "fully_connected", "loss", "attention", "embedding",
         "normalization", "batch_norm", "activation", "pooling", "dropout"]).any(), \
        update[["name", "op"]].drop_duplicates().head().to_dict("records")
    assert (update["op"].astype(str) == "weights_update").any()


@pytest.mark.slow
def test_a_step_is_one_optimizer_step_over_its_micro_batches(run) -> None:
    """Per profiled step and process: the loop's forward passes (its loss calls; two with
    gradient accumulation) and its optimizer steps, counted in torch's own trace."""
    loop, r = run
    ev = _profiled(r.events)
    losses = ev[(ev["op"] == "loss") & (ev["phase"] == "forward")]
    assert set(losses.groupby(["rank", "step"]).size()) == {loop.losses}
    assert losses.groupby(["rank", "step"]).ngroups == loop.ranks * STEPS
    for rank in range(loop.ranks):
        native = json.loads((r.tmp / "run.native" / f"rank{rank}.pt.trace.json").read_text())
        x = [e for e in native["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in x if re.fullmatch(r"ProfilerStep#\d+", e["name"])]
        assert len(steps) == STEPS
        opt = [e for e in x if re.fullmatch(closures.STEP, e["name"])]
        per_step = Counter(next(s["name"] for s in steps
                                if s["ts"] <= o["ts"] < s["ts"] + s["dur"]) for o in opt)
        assert sorted(per_step.values()) == [loop.optimizer_steps] * STEPS, per_step


@pytest.mark.slow
def test_the_closure_is_taken_out_of_the_optimizer_step(run) -> None:
    """Where the optimizer is given a closure, opprof marks each call, and the step's pieces
    outside it plus the closure's calls are exactly torch's own total for the step."""
    loop, r = run
    ev = r.events
    names = ev["name"].astype(str)
    marked = ev[names.str.fullmatch(closures.CLOSURE)]
    pieces = ev[ev["detail"] == closures.PIECE]
    if not loop.closure:
        assert marked.empty and pieces.empty
        return
    assert len(marked) and len(pieces)
    for rank in range(loop.ranks):
        kavg = {a["name"]: a for a in json.loads(
            (r.tmp / "run.native" / f"rank{rank}.key_averages.json").read_text())}
        for name in set(pieces.loc[pieces["rank"] == rank, "name"].astype(str)):
            closure = CLOSURE + name.split("#", 1)[1].rsplit(".", 1)[0]  # its optimizer's
            own = ev.loc[(ev["rank"] == rank) & (names == name), "dur"].sum()
            inner = ev.loc[(ev["rank"] == rank) & (names == closure), "dur"].sum()
            assert (own + inner) / 1000 == pytest.approx(kavg[name]["cpu_time_total_us"],
                                                         rel=0.01, abs=2.0)


# --------------------------------------------------------------------------- the rules


def _finished(*events: tuple[str, int, int, int]):
    """Kineto events (name, tid, start µs, end µs) of one rank, read as the Kineto reader
    reads them: closures taken out of the optimizer steps, then finished."""
    from opprof.normalizers.closures import split_closures
    from opprof.normalizers.events import finish

    raw = pd.DataFrame([{"rank": 0, "role": "worker", "pid": 1, "tid": tid, "device": "cpu",
                         "ts": s * 1000, "dur": (e - s) * 1000, "name": n,
                         "kind": "marker" if n.startswith(("opprof.", "ProfilerStep",
                                                           "Optimizer.")) else "cpu_op",
                         "bytes": 0, "detail": None, "link": -1, "collective": None}
                        for n, tid, s, e in events])
    raw["name"] = raw["name"].astype("category")
    raw["device"] = raw["device"].astype("category")
    table = mapping_table("kineto")
    return finish(split_closures(raw, table), table, {}).events


def _of(ev: pd.DataFrame, name: str) -> list[tuple[str, str, int, int]]:
    rows = ev[ev["name"].astype(str) == name].sort_values("ts")
    return [(str(o), str(p), int(t) // 1000, int(t + d) // 1000)
            for o, p, t, d in zip(rows["op"], rows["phase"], rows["ts"], rows["dur"],
                                  strict=True)]


ADDMM_BWD = "autograd::engine::evaluate_function: AddmmBackward0"


def test_a_marked_closure_is_not_the_optimizers() -> None:
    ev = _finished(("ProfilerStep#1", 1, 0, 100), ("Optimizer.step#SGD.step", 1, 10, 90),
                   ("opprof.closure#SGD", 1, 12, 70), ("aten::linear", 1, 15, 30),
                   (ADDMM_BWD, 1, 40, 60), ("aten::add_", 1, 75, 85))
    assert _of(ev, "Optimizer.step#SGD.step") == [("weights_update", "update", 10, 12),
                                                  ("weights_update", "update", 70, 90)]
    assert (ev.loc[ev["name"] == "Optimizer.step#SGD.step", "detail"] == closures.PIECE).all()
    assert _of(ev, "aten::linear") == [("fully_connected", "forward", 15, 30)]
    assert _of(ev, ADDMM_BWD) == [("fully_connected_backward", "backward", 40, 60)]
    assert _of(ev, "aten::add_") == [("weights_update", "update", 75, 85)]
    counted = ev[ev["counted"]]
    assert counted["dur"].sum() == (2 + 20 + 15 + 20) * 1000  # each instant counted once


def test_every_call_of_the_closure_is_taken_out() -> None:
    """LBFGS calls its closure several times: the optimizer's work between the calls is its."""
    ev = _finished(("Optimizer.step#LBFGS.step", 1, 0, 100),
                   ("opprof.closure#LBFGS", 1, 5, 30), (ADDMM_BWD, 1, 10, 25),
                   ("aten::dot", 1, 32, 38),
                   ("opprof.closure#LBFGS", 1, 40, 70), (ADDMM_BWD, 1, 45, 65))
    assert [p[2:] for p in _of(ev, "Optimizer.step#LBFGS.step")] == [(0, 5), (30, 40),
                                                                     (70, 100)]
    assert _of(ev, "aten::dot")[0][:2] == ("weights_update", "update")


def test_an_optimizer_wrapping_another_has_both_steps_split() -> None:
    ev = _finished(("Optimizer.step#ZeroRedundancyOptimizer.step", 1, 0, 100),
                   ("Optimizer.step#SGD.step", 1, 5, 95),
                   ("opprof.closure#ZeroRedundancyOptimizer", 1, 10, 60),
                   (ADDMM_BWD, 1, 20, 50))
    assert [p[2:] for p in _of(ev, "Optimizer.step#ZeroRedundancyOptimizer.step")] == [
        (0, 10), (60, 100)]
    assert [p[2:] for p in _of(ev, "Optimizer.step#SGD.step")] == [(5, 10), (60, 95)]
    assert _of(ev, ADDMM_BWD)[0][:2] == ("fully_connected_backward", "backward")


def test_an_unmarked_closure_ends_with_the_steps_last_backward_operator() -> None:
    """A trace of your own: the step ran its closure from its start to its last backward."""
    ev = _finished(("Optimizer.step#AdamW.step", 1, 0, 100), ("aten::linear", 1, 5, 20),
                   (ADDMM_BWD, 1, 30, 60), ("aten::_foreach_norm", 1, 62, 66),
                   ("aten::_foreach_add_", 1, 70, 95))
    assert _of(ev, "Optimizer.step#AdamW.step") == [("weights_update", "update", 60, 100)]
    assert _of(ev, "aten::linear")[0][:2] == ("fully_connected", "forward")
    assert _of(ev, "aten::_foreach_norm")[0][:2] == ("weights_update", "update")


def test_an_optimizer_that_multiplies_matrices_keeps_its_step() -> None:
    """No closure and no backward inside (Muon's Newton–Schulz matmuls): all the step's."""
    ev = _finished(("aten::linear", 1, 0, 10), (ADDMM_BWD, 1, 12, 20),
                   ("Optimizer.step#Muon.step", 1, 25, 60), ("aten::mm", 1, 30, 40))
    assert _of(ev, "Optimizer.step#Muon.step") == [("weights_update", "update", 25, 60)]
    assert _of(ev, "aten::mm")[0][:2] == ("weights_update", "update")
    assert (ev["detail"] != closures.PIECE).all()
