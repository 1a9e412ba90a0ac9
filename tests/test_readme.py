"""The README's quick-start commands (and the tested blocks of docs/*.md) run as written,
from the root of a fresh copy of the repository (no ../shared beside it), so they cannot
rot."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_pages
from tests.conftest import REPO


def quick_start_commands() -> list[str]:
    """The command lines of the blocks marked as tested, README.md's first, then the docs
    pages', in order."""
    blocks = docs_pages.tested_blocks()
    assert blocks, "README has no tested quick-start block"
    return [ln.strip() for block in blocks for ln in block.splitlines()
            if ln.strip().startswith(("opprof ", "python "))]


def test_readme_has_the_two_setup_commands() -> None:
    text = (REPO / "README.md").read_text()
    setup = re.search(r"## Set up\s*```\n(.*?)```", text, re.S)
    assert setup and setup.group(1).split("\n")[:2] == [
        'pip install -e ".[all]" -c constraints.txt'
        ' && pip install --no-deps tf-keras==2.21.0'
        ' && PIP_CONSTRAINT=build-constraints.txt pip install --no-deps --use-pep517'
        ' chainer==7.8.1', "pytest"]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("pytest")


def fresh_clone(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked, and new ones not ignored:
    no virtual environment, no build outputs), copied to ``dest/opprof`` with no sibling
    ``shared/`` folder."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    root = dest / "opprof"
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name)
    return root


def test_quick_start_uses_only_the_repository() -> None:
    """Every path a quick-start line names is inside the repository (no ../shared)."""
    for line in quick_start_commands():
        for arg in shlex.split(line):
            assert not arg.startswith(("../", "/", "~")), f"{line}: {arg} is outside the clone"
            if "/" in arg and not arg.startswith("-"):
                assert (REPO / arg).exists(), f"{line}: {arg} is not in the repository"


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    """Every quick-start line runs as printed, from the root of a fresh copy of the
    repository with no ../shared beside it (the installed `opprof` command, as a user who
    ran the install command has it)."""
    root = fresh_clone(tmp_path)
    assert not (root.parent / "shared").exists()
    commands = quick_start_commands()
    assert any(c.startswith("opprof record") for c in commands)
    script = Path(sys.executable).with_name("opprof")
    for line in commands:
        args = [sys.executable if a == "python" else a for a in shlex.split(line)]
        if args[0] == "opprof" and script.exists():
            args[0] = str(script)
        elif args[0] == "opprof":
            args = [sys.executable, "-m", "opprof", *args[1:]]
        res = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
        assert "Traceback" not in res.stderr
        if line.startswith("opprof report") and "--format json" in line:
            assert {"meta", "steps", "phases", "ops"} <= set(json.loads(res.stdout))
        if line.startswith("opprof model") and "--format json" in line:
            doc = json.loads(res.stdout)
            assert doc["network"]["source"] == "calibrate" and len(doc["predictions"]) == 2
        if line.startswith("opprof diff") and " -o " not in line:
            assert "explains most of it" in " ".join(res.stdout.split())
            assert re.search(r"step, (unprofiled|profiled):", res.stdout)
        if "--format html" in line:
            out = root / shlex.split(line)[shlex.split(line).index("-o") + 1]
            assert out.read_text().rstrip().endswith("</html>")
    for name in ("resnet18-mxnet.trace", "resnet18-torch.trace", "lenet5-torch.trace",
                 "nccl.trace", "resnet18.pftrace", "mine.trace", "ddp.trace", "api.trace",
                 "net.json", "nccl.html", "ddp.html", "diff.html", "phases.svg", "ranks.pdf"):
        assert (root / name).exists(), name
