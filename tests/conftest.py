"""Shared test fixtures: paths to the real traces and a helper to run the real CLI."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("OPPROF_SHARED_TRACES", REPO.parent / "shared" / "traces"))
KINETO_GPU = SHARED_TRACES / "kineto-gpu"
FIXTURES = REPO / "fixtures"


def shared_trace(name: str) -> Path:
    """A trace from ../shared/traces/kineto-gpu (skip when the shared folder is absent)."""
    path = KINETO_GPU / name
    if not path.exists():
        pytest.skip(f"shared trace {path} not present")
    return path


def native_x_events(path: Path) -> list[dict]:
    """The complete events of a Kineto file, read independently of opprof."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def run_cli(*args: str, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the installed `opprof` command line as a user would."""
    return subprocess.run([sys.executable, "-m", "opprof", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
