"""The README's quick-start commands run as written, in a fresh folder, so they cannot rot."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_TRACES, run_cli


def quick_start_commands() -> list[str]:
    """The command lines of the README block marked as tested."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- tested:.*?-->\s*```\n(.*?)```\s*<!-- end tested -->", text, re.S)
    assert block, "README has no tested quick-start block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip().startswith("opprof ")]


def test_readme_has_the_two_setup_commands() -> None:
    text = (REPO / "README.md").read_text()
    setup = re.search(r"## Set up\s*```\n(.*?)```", text, re.S)
    assert setup and setup.group(1).split("\n")[:2] == [
        'pip install -e ".[all]" -c constraints.txt', "pytest"]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("pytest")


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    if not (SHARED_TRACES / "kineto-gpu").exists():
        pytest.skip("../shared/traces is not present")
    commands = quick_start_commands()
    assert any(c.startswith("opprof record") for c in commands)
    for line in commands:
        line = line.replace("../shared/traces", str(SHARED_TRACES))
        res = run_cli(*shlex.split(line)[1:], cwd=tmp_path, timeout=900)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
        assert "Traceback" not in res.stderr
        if line.startswith("opprof report") and "--format json" in line:
            assert {"meta", "steps", "phases", "ops"} <= set(json.loads(res.stdout))
        if line.startswith("opprof model") and "--format json" in line:
            doc = json.loads(res.stdout)
            assert doc["network"]["source"] == "calibrate" and len(doc["predictions"]) == 2
        if line.startswith("opprof diff"):
            assert "explains most of it" in " ".join(res.stdout.split())
    for name in ("resnet18-mxnet.trace", "resnet18-torch.trace", "lenet5-torch.trace",
                 "nccl.trace", "resnet18.pftrace", "net.json"):
        assert (tmp_path / name).exists(), name
