"""What users install is what the repository holds: the wheel (what `pip install .` or a
release installs) holds every module and data file of the source tree under its installed
name, and a non-editable install of it records a run from outside the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Source folder → the package it installs as.
ROOTS = {"opprof": "opprof", "collectors": "opprof/collectors",
         "normalizers": "opprof/normalizers"}
#: What the build reads besides the source folders.
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")


def source_files() -> set[str]:
    """Every file of the source folders (no bytecode, no hidden file), by installed path."""
    out = set()
    for folder, installed in ROOTS.items():
        for path in (REPO / folder).rglob("*"):
            rel = path.relative_to(REPO / folder)
            if (path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc"
                    and not any(p.startswith(".") for p in rel.parts)):
                out.add(f"{installed}/{rel.as_posix()}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a clean copy of the source tree (an in-tree build would reuse
    build/lib, where a module deleted since stays)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in BUILD_FILES:
        shutil.copy2(REPO / name, tree / name)
    for folder in ROOTS:
        shutil.copytree(REPO / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(out), str(tree)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (built,) = out.glob("opprof-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {n for n in names if ".dist-info/" not in n}
    expected = source_files()
    assert {n for n in expected if n.endswith(".py")} >= {
        "opprof/model/predict.py", "opprof/pipeline/record.py",
        "opprof/collectors/worker.py", "opprof/normalizers/kineto.py"}
    assert "opprof/normalizers/maps/kineto.csv" in expected
    assert sorted(expected - packaged) == [], "left out of the wheel"
    assert sorted(packaged - expected) == [], "in the wheel, not in the tree"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "opprof = opprof.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
def test_an_installed_wheel_records_a_run_outside_the_repository(
        wheel: Path, tmp_path: Path) -> None:
    """`pip install` of the wheel (no editable install, no repository on the path) into a
    fresh venv, then the quick start's `opprof record` from a folder outside the repo."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    py, opprof = venv / "bin" / "python", venv / "bin" / "opprof"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr
    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run(
        [str(py), "-c", "import opprof, opprof.collectors.worker as w, opprof.model.predict as p;"
         " print(opprof.__file__); print(w.__file__); print(p.__file__)"],
        cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert where.returncode == 0, where.stderr
    site = (venv / "lib").resolve()
    for line in where.stdout.split():  # the wheel's modules run, not a checkout's
        assert Path(line).resolve().is_relative_to(site), line
    res = subprocess.run([str(opprof), "record", "--fw", "torch", "--model", "lenet5",
                          "--steps", "1", "--warmup", "1", "--batch-size", "4",
                          "-o", "lenet5.trace"],
                         cwd=work, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "convolution" in res.stdout  # the report of the run
    check = subprocess.run(
        [str(py), "-c", "from opprof.loader import load; t = load('lenet5.trace'); "
         "print(t.meta['framework'], int((t.events['op'] == 'convolution').sum()))"],
        cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert check.returncode == 0, check.stderr
    fw, convs = check.stdout.split()
    assert fw == "torch" and int(convs) > 0
