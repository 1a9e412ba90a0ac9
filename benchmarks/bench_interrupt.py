"""How fast an interrupted run ends: Ctrl-C (SIGINT) or SIGTERM sent to `opprof record` and
`opprof run` once a profiled step is done, as a user or a scheduler would; the time until
opprof has exited and until every process it started is gone (the issue's bound: 5 s).

    python benchmarks/bench_interrupt.py               # every scenario once
    python benchmarks/bench_interrupt.py --repeat 3    # each three times (median, max)
    python benchmarks/bench_interrupt.py --only run    # scenarios whose name holds "run"

Each run happens in a fresh temporary folder, opprof in a session of its own (the signal
reaches opprof alone, as `kill` sends it); a process counts as the run's while its working
directory is inside that folder. The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "scripts"
SMALL = ["--batch-size", "4", "--warmup", "1", "--timing-steps", "1", "--timeout", "300"]

#: name, signal, opprof's arguments (after ``opprof``).
SCENARIOS = [
    ("record torch single", signal.SIGINT,
     ["record", "--fw", "torch", "--model", "resnet18", "--steps", "12", *SMALL]),
    ("record torch allreduce x2", signal.SIGTERM,
     ["record", "--fw", "torch", "--model", "resnet18", "--steps", "12", "--workers", "2",
      "--mode", "allreduce", *SMALL]),
    ("record mxnet ps-sync x2", signal.SIGTERM,
     ["record", "--fw", "mxnet", "--model", "resnet18", "--steps", "12", "--workers", "2",
      "--mode", "ps-sync", *SMALL]),
    ("record tf allreduce x2", signal.SIGTERM,
     ["record", "--fw", "tf", "--model", "resnet18", "--steps", "10", "--workers", "2",
      "--mode", "allreduce", *SMALL]),
    ("run python loop", signal.SIGINT,
     ["run", "--warmup", "1", "--timing-steps", "1", "--steps", "30", "--",
      sys.executable, str(SCRIPTS / "torch_loop.py"), "--steps", "500"]),
    ("run torchrun x2", signal.SIGTERM,
     ["run", "--warmup", "1", "--timing-steps", "1", "--steps", "30", "--", sys.executable,
      "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPTS / "torch_ddp.py"),
      "--steps", "500"]),
]


def profiled(folder: Path) -> bool:
    """Whether some process of the run has finished a profiled step."""
    for path in folder.rglob("procs/*.status"):
        try:
            if json.loads(path.read_text()).get("profiled_steps", 0) >= 1:
                return True
        except (OSError, ValueError):
            continue
    return False


def processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory is inside ``folder``."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd == str(folder) or cwd.startswith(f"{folder}/")):
            out.append(int(entry.name))
    return out


def once(args: list[str], sig: int) -> tuple[float, float, int, str]:
    """(s to opprof's exit, s until every process is gone, exit code, opprof's last line)."""
    with tempfile.TemporaryDirectory(prefix="opprof-int-") as tmp:
        folder = Path(tmp).resolve()
        err = folder / "opprof.err"
        with open(err, "wb") as e:
            proc = subprocess.Popen([sys.executable, "-m", "opprof", *args, "-o",
                                     str(folder / "run.trace")] if args[0] == "record" else
                                    [sys.executable, "-m", "opprof", args[0], "-o",
                                     str(folder / "run.trace"), *args[1:]],
                                    cwd=folder, stdout=subprocess.DEVNULL, stderr=e,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            end = time.monotonic() + 600
            while not profiled(folder):
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"no profiled step: {err.read_text()[-2000:]}")
                time.sleep(0.1)
            sent = time.monotonic()
            os.kill(proc.pid, sig)
            code = proc.wait(120)
            exited = time.monotonic() - sent
            while processes_in(folder) and time.monotonic() - sent < 60:
                time.sleep(0.02)
            gone = time.monotonic() - sent
        finally:
            for pid in processes_in(folder):  # leave nothing behind, whatever happened
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        lines = [ln for ln in err.read_text(errors="replace").splitlines()
                 if ln.startswith("opprof:")]
        return exited, gone, code, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default="", help="run the scenarios whose name holds this")
    ap.add_argument("--lines", action="store_true", help="print opprof's last line each time")
    opts = ap.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores")
    print(f"{'scenario':28} {'signal':8} {'exit s':>8} {'all gone s':>11} {'max gone':>9} code")
    for name, sig, args in SCENARIOS:
        if opts.only not in name:
            continue
        results = []
        for _ in range(opts.repeat):
            exited, gone, code, line = once(args, sig)
            results.append((exited, gone, code))
            if opts.lines:
                print(f"  {line}")
        codes = sorted({c for _, _, c in results})
        print(f"{name:28} {signal.Signals(sig).name:8} "
              f"{statistics.median(r[0] for r in results):8.2f} "
              f"{statistics.median(r[1] for r in results):11.2f} "
              f"{max(r[1] for r in results):9.2f} {','.join(map(str, codes))}", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} after")


if __name__ == "__main__":
    main()
