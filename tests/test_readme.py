"""The README's quick-start commands run as written, in a fresh folder, so they cannot rot."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_TRACES, run_cli


def quick_start_commands() -> list[str]:
    """The command lines of the README blocks marked as tested, in order."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"<!-- tested:.*?-->\s*```\n(.*?)```\s*<!-- end tested -->", text,
                        re.S)
    assert blocks, "README has no tested quick-start block"
    return [ln.strip() for block in blocks for ln in block.splitlines()
            if ln.strip().startswith(("opprof ", "python "))]


def test_readme_has_the_two_setup_commands() -> None:
    text = (REPO / "README.md").read_text()
    setup = re.search(r"## Set up\s*```\n(.*?)```", text, re.S)
    assert setup and setup.group(1).split("\n")[:2] == [
        'pip install -e ".[all]" -c constraints.txt'
        ' && pip install --no-deps tf-keras==2.21.0', "pytest"]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("pytest")


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    if not (SHARED_TRACES / "kineto-gpu").exists():
        pytest.skip("../shared/traces is not present")
    commands = quick_start_commands()
    assert any(c.startswith("opprof record") for c in commands)
    for line in commands:
        line = line.replace("../shared/traces", str(SHARED_TRACES))
        line = re.sub(r"(?<![\w./])fixtures/", f"{REPO / 'fixtures'}/", line)
        line = line.replace("tests/scripts/", f"{REPO}/tests/scripts/")
        args = [sys.executable if a == "python" else a for a in shlex.split(line)]
        if args[0] == "opprof":
            res = run_cli(*args[1:], cwd=tmp_path, timeout=900)
        else:
            res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True,
                                 timeout=900)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
        assert "Traceback" not in res.stderr
        if line.startswith("opprof report") and "--format json" in line:
            assert {"meta", "steps", "phases", "ops"} <= set(json.loads(res.stdout))
        if line.startswith("opprof model") and "--format json" in line:
            doc = json.loads(res.stdout)
            assert doc["network"]["source"] == "calibrate" and len(doc["predictions"]) == 2
        if line.startswith("opprof diff") and " -o " not in line:
            assert "explains most of it" in " ".join(res.stdout.split())
        if "--format html" in line:
            out = tmp_path / shlex.split(line)[shlex.split(line).index("-o") + 1]
            assert out.read_text().rstrip().endswith("</html>")
    for name in ("resnet18-mxnet.trace", "resnet18-torch.trace", "lenet5-torch.trace",
                 "nccl.trace", "resnet18.pftrace", "mine.trace", "ddp.trace", "api.trace",
                 "net.json", "nccl.html", "ddp.html", "diff.html", "phases.svg", "ranks.pdf"):
        assert (tmp_path / name).exists(), name
