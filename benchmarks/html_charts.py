"""Extract every chart the HTML pages embed (each ``Plotly.newPlot(id, data, layout,
config)`` call's JSON) and compare two extractions: a check that a change to
opprof.render.html leaves the charts as they were.

    python benchmarks/html_charts.py capture /tmp/charts-old     # on the old code
    python benchmarks/html_charts.py capture /tmp/charts-new     # on the new code
    python benchmarks/html_charts.py compare /tmp/charts-old /tmp/charts-new

``capture`` makes the pages as a user does (``opprof report|diff … --format html``, one
process each, from the fixtures) and a bench page in-process (the fixtures' bench of
tests/conftest.py with synthetic convergence curves, so its every chart is drawn), and
writes NAME.html and NAME.json (the list of [id, data, layout, config]) per page.
``compare`` decodes plotly's typed arrays (``{"dtype", "bdata", "shape"}``) to lists, then
compares the parsed JSON, numbers to 1e-12 relative; it also says how many charts are
byte-for-byte the same JSON, and compares the pages with their chart scripts and the date
taken out.
"""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "fixtures"
KINETO = FIX / "shared" / "kineto-gpu"
BIG = Path("/tmp/opprof-bench/nccl-x5.json.gz")

#: name → the CLI's arguments (before ``--format html -o FILE``).
PAGES: dict[str, list[str]] = {
    "ddp": ["report", str(FIX / "torch-ddp")],
    "mem-mxnet-ps": ["report", str(FIX / "memory" / "mxnet-ps-sync")],
    "mem-torch": ["report", str(FIX / "memory" / "torch-lenet5")],
    "mem-tf": ["report", str(FIX / "memory" / "tf-lenet5")],
    "nccl-2rank": ["report", str(KINETO / "nccl-2rank-rank0.json.gz")],
    "nccl-128rank-2files": ["report", str(KINETO / "sampled-128rank-rank0.json.gz"),
                            str(KINETO / "sampled-128rank-rank1.json.gz")],
    "alexnet-gpu": ["report", str(KINETO / "alexnet-1gpu.json.gz")],
    "resnet18-cuda": ["report", str(FIX / "gpu" / "resnet18-cuda.trace")],
    "tp": ["report", str(FIX / "torch-parallel" / "tp")],
    "fsdp-tp": ["report", str(FIX / "torch-parallel" / "fsdp-tp")],
    "pp-1f1b": ["report", str(FIX / "torch-parallel" / "pp-1f1b")],
    "moe": ["report", str(FIX / "torch-parallel" / "moe")],
    "advise-pipeline": ["report", str(FIX / "advise" / "pipeline.trace")],
    "advise-ddp": ["report", str(FIX / "advise" / "ddp.trace")],
    "advise-input": ["report", str(FIX / "advise" / "input-bound.trace"), "--top", "5"],
    "tf-ps": ["report", str(FIX / "tf" / "lenet5-ps-async-2w1s")],
    "diff-mem-whatif": ["diff", str(FIX / "memory" / "tf-lenet5"),
                        str(FIX / "memory" / "torch-lenet5"), "--whatif"],
    "diff-gate": ["diff", str(FIX / "gate" / "base-a.trace"), str(FIX / "gate" / "slow.trace"),
                  "--fail-above", "5%"],
    "diff-colocation": ["diff", str(FIX / "colocation" / "torch-lenet5-ddp2.trace"),
                        str(FIX / "colocation" / "torch-lenet5-base.trace"), "--top", "8"],
}
if BIG.exists():
    PAGES["nccl-x5"] = ["report", str(BIG)]

_NEWPLOT = "Plotly.newPlot("
_DATE = re.compile(r"on \d{4}-\d\d-\d\d \d\d:\d\d \S*\.")


def charts(page: str) -> list[list[Any]]:
    """Each ``Plotly.newPlot(id, data, layout, config)`` call's arguments, parsed."""
    dec = json.JSONDecoder()
    out = []
    at = page.find(_NEWPLOT)
    while at >= 0:
        i = at + len(_NEWPLOT)
        args = []
        for _ in range(4):
            while page[i] in " \t\r\n,":
                i += 1
            value, i = dec.raw_decode(page, i)
            args.append(value)
        out.append(args)
        at = page.find(_NEWPLOT, i)
    return out


def _bench_page() -> str:
    """bench.html of the fixtures' bench, with two repetitions of a curve per run."""
    sys.path.insert(0, str(REPO))
    import tempfile

    from opprof.pipeline.bench import read_bench
    from opprof.render import html
    from tests.conftest import bench_from_fixtures

    folder = bench_from_fixtures(Path(tempfile.mkdtemp(prefix="html-charts-")) / "bench")
    b = read_bench(folder)
    for k, (_, row) in enumerate(b.table.iterrows()):
        name = f"{row['model']}-{row['fw']}-w{int(row['workers'])}-{row['mode']}"
        curves = []
        for rep in range(2):
            steps = list(range(0, 50, 5))
            curves.append({"step": steps,
                           "time_ns": [int(s * (3e7 + 1e6 * k) + rep * 1e6) for s in steps],
                           "loss": [2.3 / (1 + 0.1 * s + 0.01 * k + 0.02 * rep) for s in steps],
                           "train_accuracy": [None] * len(steps),
                           "test_accuracy": [min(0.99, 0.1 + 0.02 * s) if s % 10 == 0
                                             else None for s in steps]})
        b.curves[name] = curves  # type: ignore[assignment]
    return html.bench(b)


def capture(out: Path) -> None:
    """The pages and their charts into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, args in PAGES.items():
        path = out / f"{name}.html"
        res = subprocess.run([sys.executable, "-m", "opprof", *args, "--format", "html", "-o",
                              str(path)], capture_output=True, text=True, cwd=REPO)
        if res.returncode != 0 and f"wrote {path}" not in res.stderr:  # (a failed gate: 1)
            print(f"{name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
            continue
        _save(out, name, path.read_text(encoding="utf-8"))
    _save(out, "bench", _bench_page())


def _save(out: Path, name: str, page: str) -> None:
    (out / f"{name}.html").write_text(page, encoding="utf-8")
    found = charts(page)
    (out / f"{name}.json").write_text(json.dumps(found), encoding="utf-8")
    print(f"{name}: {len(found)} charts")


def decoded(v: Any) -> Any:
    """``v`` with plotly's typed arrays as (nested) lists of numbers."""
    if isinstance(v, dict):
        if set(v) >= {"dtype", "bdata"} and set(v) <= {"dtype", "bdata", "shape"}:
            import numpy as np

            a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
            if "shape" in v:
                a = a.reshape([int(x) for x in str(v["shape"]).split(",")])
            return a.tolist()
        return {k: decoded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decoded(x) for x in v]
    return v


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (numbers to 1e-12 relative; NaN equals NaN)."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        if a == b or (math.isnan(a) and math.isnan(b)) or \
                math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0):
            return []
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in {'old' if k in a else 'new'}"
               for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} != {b!r}"]


def _rest(page: str) -> str:
    """The page without its chart scripts and its date."""
    page = _DATE.sub("on DATE.", page)
    return re.sub(r"Plotly\.newPlot\(.*?\n", "Plotly.newPlot(…)\n", page, flags=re.S)


def compare(old: Path, new: Path) -> int:
    """Compare two captures; the number of differing charts (and pages)."""
    bad = n_pages = n_charts = same_bytes = bad_pages = 0
    for f in sorted(old.glob("*.json")):
        g = new / f.name
        if not g.exists():
            print(f"{f.stem}: missing in {new}")
            bad += 1
            continue
        a, b = json.loads(f.read_text()), json.loads(g.read_text())
        n_pages += 1
        if len(a) != len(b):
            print(f"{f.stem}: {len(a)} charts != {len(b)}")
            bad += 1
            continue
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            n_charts += 1
            same_bytes += json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)
            d = differences(decoded(x), decoded(y), f"{f.stem}#{i + 1}")
            if d:
                bad += 1
                print("\n".join(d[:10]) + (f"\n… {len(d) - 10} more" if len(d) > 10 else ""))
        ha, hb = (_rest((p / f"{f.stem}.html").read_text()) for p in (old, new))
        if ha != hb:
            bad_pages += 1
            print(f"{f.stem}: the page outside its charts differs")
    print(f"{n_pages} pages, {n_charts} charts compared: {n_charts - bad} equal, "
          f"{same_bytes} with the same JSON (keys sorted), {bad} differ; "
          f"{n_pages - bad_pages} pages the same outside their charts")
    return bad + bad_pages


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "capture":
        capture(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(1 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
