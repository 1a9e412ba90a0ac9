"""`opprof advise`: each rule's advice from real traces (the recordings of the scripts in
tests/scripts, the GPU fixtures), ranked by the saving the model or the replay predicts; the
model's knobs keep their identities; the advice section of `report`; bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, run_cli, shared_trace

ADVISE = FIXTURES / "advise"
GPU = FIXTURES / "gpu"


def advisory(path: Path):
    from opprof.pipeline.advise import advise_trace

    return advise_trace([path])[2]


def advise_json(*args: str, cwd: Path | None = None) -> dict:
    res = run_cli("advise", *args, "--format", "json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def training(a) -> list:
    return [x for x in a.advice if x.kind == "training"]


# ------------------------------------------------------------------ the contract


def test_advice_json_has_the_contract_keys_ranked_by_saving() -> None:
    doc = advise_json(str(ADVISE / "ddp.trace"))
    assert doc["advice"], doc
    for a in doc["advice"]:
        assert {"finding", "action", "saving_ns", "saving_share", "confidence",
                "evidence"} <= set(a)
        assert a["confidence"] in ("high", "medium", "low")
        assert isinstance(a["evidence"], dict) and a["evidence"]
    savings = [a["saving_ns"] for a in doc["advice"] if a["kind"] == "training"]
    assert savings == sorted(savings, reverse=True)
    step = doc["step_ns"]
    for a in doc["advice"]:
        assert 0 <= a["saving_ns"] <= step
        assert a["saving_share"] == pytest.approx(a["saving_ns"] / step, rel=1e-6)


def test_rules_whose_analysis_is_missing_say_why_they_did_not_run() -> None:
    a = advisory(ADVISE / "input-bound.trace")
    assert "launch-bound" in a.not_checked and "GPU" in a.not_checked["launch-bound"]
    assert "stragglers" in a.not_checked  # one rank
    for rule in ("pipeline-bubble", "low-efficiency"):
        assert rule in a.not_checked or rule in a.checked
    assert set(a.checked).isdisjoint(a.not_checked)


def test_a_healthy_step_says_so() -> None:
    """The committed lenet5 recording: loading is 0.4% of the step and nothing else is
    advisable: no advice, the step called healthy with what bounds it."""
    a = advisory(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    assert a.healthy and not training(a)
    assert all(x.saving_share < 0.02 for x in a.minor)
    assert "backward" in a.bound
    res = run_cli("advise", str(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"))
    assert res.returncode == 0, res.stderr
    assert "healthy" in res.stdout


# ------------------------------------------------------------------ the rules on real jobs


def test_input_bound_loop_first_advice_is_loader_workers() -> None:
    """tests/scripts/torch_slow_loader.py (a Dataset that sleeps in __getitem__,
    num_workers=0) under `opprof run`: the first advice names the loader, with the saving
    the prefetch model gives (all the exposed loading, the workers keep up)."""
    a = advisory(ADVISE / "input-bound.trace")
    first = training(a)[0]
    assert first.rule == "input-bound"
    assert "num_workers=" in first.action
    assert first.evidence["loader_workers"] == 0
    load = float(first.evidence["load_ns_per_step"])  # type: ignore[arg-type]
    assert first.saving_ns == pytest.approx(load, rel=0.01)
    assert first.knob is not None and first.knob.option == "--loader-workers"


def test_ddp_job_first_advice_is_the_exposed_gradient_allreduce() -> None:
    """tests/scripts/torch_ddp.py under torchrun (gloo): the step waits for the gradients'
    all-reduce; the saving never exceeds the exposed transfer (the wait for the slower rank
    is left), and the alternatives are priced."""
    a = advisory(ADVISE / "ddp.trace")
    first = training(a)[0]
    assert first.rule == "exposed-communication"
    ev = first.evidence
    assert ev["mode"] == "allreduce" and ev["workers"] == 2
    assert first.saving_ns <= float(ev["transfer_ns_per_step"]) + 1  # type: ignore[arg-type]
    assert ev["alternatives"]
    assert ("bucket_cap_mb" in first.action or "no_sync" in first.action
            or "broadcast_buffers" in first.action)


def test_tensor_parallel_collectives_are_never_told_to_accumulate_gradients() -> None:
    """A vLLM decode on 8-way tensor parallel (B200, no backward): its exposed all-reduces
    serve the ``tp`` dimension, so the advice is sequence parallel / async TP / a lower TP
    degree, never a gradient knob (there are no gradients)."""
    a = advisory(FIXTURES / "gpu-public" / "gpt-oss-vllm-b200.json.gz")
    comm = [x for x in training(a) if x.rule == "exposed-communication"]
    assert len(comm) == 1
    assert comm[0].evidence["tp_share"] >= 0.5  # type: ignore[operator]
    assert "SequenceParallel" in comm[0].action and "TP degree" in comm[0].action
    assert "gradients" not in comm[0].action and "bucket" not in comm[0].action


def test_pipeline_job_first_advice_names_the_stages_waiting() -> None:
    """tests/scripts/torch_pipeline.py (torch.distributed.pipelining, GPipe, 2 stages): the
    stages idle while the pipeline fills and drains (the bubble of ``--by pipeline``); the
    advice is more micro-batches or another schedule (not DDP's buckets), and no rank is
    called a straggler (stages differ by design)."""
    a = advisory(ADVISE / "pipeline.trace")
    first = training(a)[0]
    assert first.rule == "pipeline-bubble"
    assert "micro-batches" in first.action and "bucket" not in first.action
    assert "pipeline bubble" in first.finding and "gpipe" in first.finding
    assert not any(x.rule == "stragglers" for x in a.advice + a.minor)


@pytest.mark.parametrize("name", ["resnet18-cuda.trace", "compiled-adamw.pt.trace.json.gz",
                                  "run-compiled.trace"])
def test_launch_bound_gpu_steps_are_told_to_capture_cuda_graphs(name: str) -> None:
    """The real H200 recordings: the GPU idles while the host launches small kernels; the
    first advice is CUDA graphs / torch.compile, its saving from the graph replay bounded by
    the device's own work per step."""
    a = advisory(GPU / name)
    first = training(a)[0]
    assert first.rule == "launch-bound"
    assert "CUDA graphs" in first.action
    ev = first.evidence
    assert float(ev["launch_share"]) >= 0.2  # type: ignore[arg-type]
    busy = float(ev["device_busy_ns_per_step"])  # type: ignore[arg-type]
    assert 0 < first.saving_ns <= a.step_ns - busy
    assert first.saving_ns <= float(ev["replay_saving_ns"]) + 1  # type: ignore[arg-type]


def test_a_step_already_in_cuda_graphs_is_told_so_with_its_own_graph_gap() -> None:
    a = advisory(GPU / "compiled-cudagraphs.pt.trace.json.gz")
    first = training(a)[0]
    assert first.rule == "launch-bound"
    assert first.evidence["cuda_graphs"] is True
    assert first.evidence["graph_kernel_gap_source"] == "this trace's graph launches"
    assert "already replays CUDA graphs" in first.action


def test_the_nccl_trace_is_launch_bound_before_its_communication() -> None:
    a = advisory(shared_trace("nccl-2rank-rank0.json.gz"))
    rules = [x.rule for x in training(a)]
    assert rules[0] == "launch-bound" and "exposed-communication" in rules


# ------------------------------------------------------------------ the model's knobs


def test_knobs_that_change_nothing_predict_the_measured_step() -> None:
    """The identities the predictions rest on: one batch × 1, prefetching with workers that
    keep up = loading hidden, DDP's own buckets = the measurement."""
    from opprof.loader import load
    from opprof.model import knobs
    from opprof.model.whatif import context

    ctx = context(load(ADVISE / "ddp.trace"))
    base = ctx.base.step_ns
    assert knobs.batched(ctx, 1).step_ns == pytest.approx(base, rel=1e-9)
    assert knobs.accumulated(ctx, 1).step_ns == pytest.approx(base, rel=1e-9)
    ddp = knobs.buckets(ctx, 25 * 2 ** 20)  # the first bucket becomes 25 MiB too: same plan
    assert ddp.step_ns == pytest.approx(base, rel=1e-6)
    single = context(load(ADVISE / "input-bound.trace"))
    hidden = knobs.io_hidden(single)
    assert knobs.prefetch(single, 64).step_ns == pytest.approx(hidden.step_ns)
    one = knobs.prefetch(single, 1)  # one worker: loading shows where it exceeds the rest
    assert one.step_ns >= hidden.step_ns


def test_a_larger_batch_amortizes_only_the_update_and_fixed_costs() -> None:
    from opprof.loader import load
    from opprof.model import knobs
    from opprof.model.whatif import context

    ctx = context(load(ADVISE / "input-bound.trace"))
    ph = ctx.base.phases
    pred = knobs.batched(ctx, 2)
    assert pred.saving_ns == pytest.approx((ph["update"] + ph["other"]) / 2, rel=0.05)


# ------------------------------------------------------------------ the commands


def test_report_shows_the_advice_first_and_no_advice_drops_it() -> None:
    trace = str(ADVISE / "input-bound.trace")
    res = run_cli("report", trace)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.index("Advice") < out.index("Step breakdown")
    assert "num_workers" in out
    res = run_cli("report", trace, "--no-advice")
    assert res.returncode == 0 and "Advice" not in res.stdout


def test_html_report_has_an_advice_section(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    out = tmp_path / "r.html"
    res = run_cli("report", str(ADVISE / "ddp.trace"), "--format", "html", "-o", str(out))
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    assert 'id="advice"' in page and page.index('id="advice"') < page.index('id="summary"')
    assert "exposed communication" in page


def test_advise_renders_every_text_format() -> None:
    trace = str(ADVISE / "ddp.trace")
    for fmt in ("rich", "md", "csv"):
        res = run_cli("advise", trace, "--format", fmt)
        assert res.returncode == 0, res.stderr
        assert "exposed" in res.stdout
    csv = run_cli("advise", trace, "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("rank,rule,kind,saving_ns,saving_share,confidence")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = run_cli("advise", str(tmp_path / "missing.trace"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "missing.trace" in res.stderr
    junk = tmp_path / "junk.trace"
    junk.write_text("not a trace")
    res = run_cli("advise", str(junk))
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_verify_refuses_a_trace_record_did_not_make() -> None:
    res = run_cli("advise", str(ADVISE / "input-bound.trace"), "--verify")
    assert res.returncode == 2
    assert "reruns `opprof record` runs" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_verification_commands_keep_the_options_and_swap_the_knob() -> None:
    from opprof.advice.base import Knob
    from opprof.pipeline.advise import _command

    line = "opprof record --fw torch --model lenet5 --loader-workers 0 -o a.trace --steps 3"
    out = _command(line, Knob("--loader-workers", "loader_workers", 2), Path("v/b.trace"))
    assert out == ("opprof record --fw torch --model lenet5 --steps 3 --loader-workers 2 "
                   "-o v/b.trace")


# ------------------------------------------------------------------ live runs


@pytest.mark.slow
def test_input_bound_script_under_run_is_advised_live(folder: Path) -> None:
    """A fresh `opprof run` of the slow-loader script: the first advice is the loader."""
    res = run_cli("run", "-o", "slow.trace", "--", "python",
                  str(REPO / "tests" / "scripts" / "torch_slow_loader.py"), "--steps", "14",
                  "--decode-ms", "4", cwd=folder)
    assert res.returncode == 0, res.stderr
    doc = advise_json("slow.trace", cwd=folder)
    first = doc["advice"][0]
    assert first["rule"] == "input-bound" and first["saving_ns"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["accumulate", "by-hand"])
def test_gradient_advice_fits_the_loop(folder: Path, how: str) -> None:
    """A DDP loop that accumulates 2 micro-batches a step is told to accumulate more of them
    (it was told "accumulate over 2 batches", which it did already); a loop that all-reduces
    its gradients by hand, without DDP, is never told DDP's knobs (``no_sync``,
    ``bucket_cap_mb``, ``broadcast_buffers``)."""
    args = ["--accumulate", "2"] if how == "accumulate" else ["--by-hand"]
    res = run_cli("run", "--steps", "3", "--warmup", "1", "--timing-steps", "1", "-o",
                  f"{how}.trace", "--", sys.executable, "-m", "torch.distributed.run",
                  "--nproc-per-node", "2", str(REPO / "tests" / "scripts" / "torch_ddp.py"),
                  "--steps", "9", *args, cwd=folder, timeout=400)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = advise_json(f"{how}.trace", cwd=folder)
    comm = next(a for a in doc["advice"] if a["rule"] == "exposed-communication")
    said = " ".join([comm["action"], *comm["evidence"].get("alternatives", [])])
    if how == "accumulate":
        assert comm["evidence"]["micro_batches"] == 2
        # the accumulation it is told — the action or, where the timing of the run ranks
        # another knob of DDP first (bucket_cap_mb, broadcast_buffers), an alternative — is
        # more micro-batches than the 2 it accumulates
        assert "micro-batches, not 2" in said
        assert "accumulate gradients over 2 batches" not in said
    else:
        assert comm["evidence"]["micro_batches"] == 1
        assert not any(k in said for k in ("no_sync", "bucket_cap_mb", "broadcast_buffers"))


@pytest.mark.slow
def test_verify_records_the_action_and_reports_predicted_and_achieved(folder: Path) -> None:
    """`advise --verify` on a built-in run: the baseline recorded again, the first action
    applied by its record option, predicted and achieved saving side by side."""
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "-o", "l5.trace", cwd=folder)
    assert res.returncode == 0, res.stderr
    doc = advise_json("l5.trace", "--verify", "--actions", "1", cwd=folder)
    ver = doc["verify"]
    assert len(ver["actions"]) == 1, ver
    act = ver["actions"][0]
    assert {"predicted_saving_share", "achieved_saving_share", "error", "knob"} <= set(act)
    assert Path(folder / act["trace"]).exists() or Path(act["trace"]).exists()
    assert act["base_step_ns"] > 0 and act["new_step_ns"] > 0
    from opprof.loader import load

    new = load(Path(act["trace"]) if Path(act["trace"]).is_absolute()
               else folder / act["trace"])
    option = act["knob"]["option"]
    assert option in new.meta["command"]


def test_a_kineto_trace_keeps_its_gpus_memory_for_the_headroom_rule() -> None:
    """The device properties' totalGlobalMem of the H200 recording, as the trace's
    ``gpu_memory_bytes`` (what memory-headroom weighs a larger batch against)."""
    import gzip

    from opprof.loader import load

    path = GPU / "compiled-adamw.pt.trace.json.gz"
    with gzip.open(path, "rt") as f:
        props = json.load(f)["deviceProperties"]
    assert load(path).meta["gpu_memory_bytes"] == min(p["totalGlobalMem"] for p in props)
    a = advisory(path)  # no memory samples in this user's trace: the rule says so
    assert "memory-headroom" in a.not_checked
