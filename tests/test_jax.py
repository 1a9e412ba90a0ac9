"""JAX in the taxonomy: a profile folder as jax.profiler writes it (XPlane and its
.trace.json.gz twin), read as framework jax with forward / backward / update from the JAX
names of the XLA operations, its totals equal to JAX's own chrome-trace export of the same
profile; a default-level profile (no operation events) says so; `opprof run` of JAX scripts
written as users write them; `record --fw jax`, one process and two over jax.distributed."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opprof.loader import load
from opprof.taxonomy import PHASES
from tests.conftest import REPO, run_cli
from tests.procs import needs

SCRIPTS = REPO / "tests" / "scripts"
PROTOCOL = ["--warmup", "1", "--timing-steps", "1", "--steps", "3"]

pytestmark = pytest.mark.slow


def _profile(tmp: Path, level: int) -> Path:
    needs("jax", "optax", "xprof")
    logdir = tmp / f"jax-profile-{level}"
    res = subprocess.run([sys.executable, str(SCRIPTS / "jax_profiled.py"), "--steps", "6",
                          "--logdir", str(logdir), "--host-tracer-level", str(level)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return logdir


@pytest.fixture(scope="module")
def level2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile(tmp_path_factory.mktemp("jaxprof"), 2)


def _json_report(*paths: Path) -> dict:
    res = run_cli("report", *map(str, paths), "--format", "json")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def _check(report: dict, steps: int | None = None) -> None:
    """Framework jax; each step's phases add up to it, forward/backward/update all there;
    `other` (phase and operator) at most 10%."""
    assert report["meta"]["framework"] == "jax"
    if steps is not None:
        assert len(report["steps"]) == steps
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
    for phase in ("forward", "backward", "update"):
        assert report["phases"][phase]["ns_per_step"] > 0, phase
    assert report["phases"]["other"]["share"] <= 0.10
    total = sum(o["ns_per_step"] for o in report["ops"])
    other = sum(o["ns_per_step"] for o in report["ops"] if o["op"] == "other")
    assert other <= 0.10 * total


def test_a_jax_profile_folder_as_the_profiler_writes_it_reads_as_jax(level2: Path) -> None:
    files = sorted(p.name for p in level2.rglob("*") if p.is_file())
    assert any(f.endswith(".xplane.pb") for f in files)
    assert any(f.endswith(".trace.json.gz") for f in files)  # the twin is left out
    report = _json_report(level2)
    _check(report, steps=6)
    ops = {o["op"] for o in report["ops"]}
    assert {"convolution", "convolution_backward", "pooling", "pooling_backward",
            "weights_update"} <= ops


def test_reading_a_jax_profile_keeps_tensorflows_import_logs_off_the_terminal(
        level2: Path) -> None:
    """The XLA programs' HLO proto module comes from TensorFlow, whose import logs (absl,
    oneDNN, CPU features) to descriptor 2: none of it reaches the user's terminal."""
    res = run_cli("report", str(level2))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Step breakdown" in res.stdout
    for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard"):
        assert noise not in res.stderr, res.stderr[-2000:]


def test_jax_operation_totals_equal_jaxs_own_trace_export(level2: Path) -> None:
    """Per HLO operation, count and time equal those of the .trace.json.gz JAX wrote beside
    the XPlane (its own converter of the same profile)."""
    trace = load(level2)
    ev = trace.events
    xla = ev[ev["detail"].astype(str).str.contains(" @ jit_", regex=False)]
    ours = xla.groupby(xla["name"].astype(str))["dur"].agg(["size", "sum"])
    twin = next(level2.rglob("*.trace.json.gz"))
    doc = json.loads(gzip.decompress(twin.read_bytes()))
    theirs: dict[str, list[float]] = {}
    for e in doc["traceEvents"]:
        hlo = (e.get("args") or {}).get("hlo_op")
        if e.get("ph") == "X" and hlo and (e["args"].get("hlo_module") or "").startswith("jit_"):
            theirs.setdefault(e["name"], []).append(float(e["dur"]))
    assert set(theirs) == set(ours.index)
    names = sorted(theirs)
    np.testing.assert_array_equal([len(theirs[n]) for n in names], ours.loc[names, "size"])
    np.testing.assert_allclose([sum(theirs[n]) * 1000 for n in names], ours.loc[names, "sum"],
                               rtol=1e-3, atol=2)


def test_a_default_level_profile_says_it_holds_no_operations(tmp_path: Path) -> None:
    logdir = _profile(tmp_path, 0)
    report = _json_report(logdir)
    assert report["meta"]["framework"] == "jax"
    assert "host_tracer_level 2" in report["meta"]["graphs"]
    assert len(report["steps"]) == 6
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"]


def _run(tmp: Path, *command: str) -> dict:
    res = run_cli("run", *PROTOCOL, "-o", str(tmp / "run.trace"), "--format", "json", "--",
                  *command, cwd=tmp, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_opprof_run_of_a_jitted_jax_training_loop(tmp_path: Path) -> None:
    needs("jax", "optax")
    report = _run(tmp_path, sys.executable, str(SCRIPTS / "jax_loop.py"), "--steps", "8")
    _check(report, steps=3)
    losses = [r["loss"] for r in report["convergence"] if r["loss"] is not None]
    assert len(losses) == 8  # one loss per call of the jitted step


def test_opprof_run_where_the_script_marks_and_profiles_its_own_steps(tmp_path: Path) -> None:
    needs("jax", "optax")
    res = run_cli("run", *PROTOCOL, "-o", str(tmp_path / "run.trace"), "--format", "json",
                  "--", sys.executable, str(SCRIPTS / "jax_profiled.py"), "--steps", "8",
                  "--logdir", str(tmp_path / "own"), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "own jax.profiler trace is not started" in res.stderr
    report = json.loads(res.stdout)
    _check(report, steps=3)


def test_record_jax_lenet5_then_diff_against_chainer(tmp_path: Path) -> None:
    needs("jax", "optax", "chainer")
    for fw in ("jax", "chainer"):
        res = run_cli("record", "--fw", fw, "--model", "lenet5", "--batch-size", "8",
                      "--steps", "2", "--warmup", "1", "--timing-steps", "1",
                      "-o", str(tmp_path / f"{fw}.trace"), cwd=tmp_path, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    report = _json_report(tmp_path / "jax.trace")
    _check(report, steps=2)
    assert report["meta"]["model"] == "lenet5" and report["meta"]["params"] == 62006
    for fw, name in (("jax", "JAX"), ("chainer", "Chainer")):  # no FLOPs model: said so
        res = run_cli("report", str(tmp_path / f"{fw}.trace"), "--no-advice")
        assert f"opprof counts no FLOPs of {name} traces yet" in res.stdout, res.stdout[:2000]
    res = run_cli("diff", str(tmp_path / "jax.trace"), str(tmp_path / "chainer.trace"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "jax lenet5" in res.stdout and "chainer lenet5" in res.stdout
    assert "no FLOPs model for JAX traces" in res.stdout
    assert "no FLOPs model for Chainer traces" in res.stdout


def test_record_jax_two_workers_over_jax_distributed(tmp_path: Path) -> None:
    needs("jax", "optax")
    res = run_cli("record", "--fw", "jax", "--model", "lenet5", "--workers", "2", "--mode",
                  "allreduce", "--batch-size", "8", "--steps", "2", "--warmup", "1",
                  "--timing-steps", "1", "-o", str(tmp_path / "jd.trace"), cwd=tmp_path,
                  timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = _json_report(tmp_path / "jd.trace")
    assert report["meta"]["framework"] == "jax" and report["meta"]["workers"] == 2
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    assert any(o["op"] == "all_reduce" and o["phase"] == "comm" for o in report["ops"])


def test_opprof_run_of_a_flax_linen_train_state_script(tmp_path: Path) -> None:
    needs("jax", "optax", "flax")
    report = _run(tmp_path, sys.executable, str(SCRIPTS / "jax_flax.py"), "--steps", "8")
    _check(report, steps=3)
    ops = {o["op"] for o in report["ops"]}
    # Flax's module scopes (Conv_0, BatchNorm_0, Dense_0) name the layers
    assert {"convolution", "batch_norm", "batch_norm_backward", "fully_connected_backward",
            "weights_update"} <= ops
