"""The collectors' clean edges: importing any collector module imports no framework and
changes no global state; `--fw tf` records where torch cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import needs

MODULES = ["opprof.collectors", "opprof.collectors.config", "opprof.collectors.runner",
           "opprof.collectors.supervisor", "opprof.collectors.channel", "opprof.collectors.launch",
           "opprof.collectors.worker", "opprof.collectors.inject", "opprof.pipeline.profile",
           "opprof.collectors.torch", "opprof.collectors.tf", "opprof.collectors.mxnet",
           "opprof.collectors.startup", "opprof"]

PROBE = """
import json, os, signal, sys
before = (dict(os.environ), list(sys.meta_path), signal.getsignal(signal.SIGTERM),
          sys.excepthook, hasattr(__import__('numpy'), 'bool'))
import importlib
importlib.import_module(sys.argv[1])
after = (dict(os.environ), list(sys.meta_path), signal.getsignal(signal.SIGTERM),
         sys.excepthook, hasattr(__import__('numpy'), 'bool'))
print(json.dumps({"frameworks": sorted(m for m in ("torch", "tensorflow", "keras", "mxnet")
                                       if m in sys.modules),
                  "same": before == after}))
"""


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_collector_imports_no_framework_and_changes_nothing(module: str) -> None:
    res = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr  # each imports on its own: no import cycle
    got = json.loads(res.stdout)
    assert got == {"frameworks": [], "same": True}


@pytest.mark.slow
def test_fw_tf_records_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    needs("tensorflow", "xprof")
    blocked = tmp_path / "blocked" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('torch is blocked by this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(blocked.parent), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "opprof", "record", "--fw", "tf", "--model",
                          "lenet5", "--batch-size", "8", "--steps", "2", "--warmup", "1",
                          "--timing-steps", "1", "--format", "json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["meta"]["framework"] == "tf"
    assert "torch is blocked" not in (tmp_path / "lenet5-tf.native" / "worker0.log").read_text()
