"""What the first touch of new memory costs on this host, per 4 KiB page, as the memory a
process holds grows — the cost FSDP pays each time its calls write a buffer on pages the
process did not have (docs/model.md, *Sharded data parallel*: the late steps of a run).

A guest VM whose host takes freed memory back (virtio-balloon free page reporting) faults in
pages it used recently at the guest's own cost (~1.3 µs a page here) and the others at the
host's as well (~10 µs): the chunks held first come from memory the guest freed lately, the
later ones from memory the host had taken back. ``--pause`` frees what it held, waits, and
holds it again: the pages the host took back meanwhile are slow again.

    python benchmarks/bench_page_faults.py --mib 4096 --chunk 256 --pause 20
"""

from __future__ import annotations

import argparse
import mmap
import os
import time

import numpy as np


def hold(mib: int, chunk: int) -> list[float]:
    """Touch ``mib`` MiB, ``chunk`` MiB at a time, keeping it all: µs per page of each chunk."""
    kept, cost = [], []
    for _ in range(mib // chunk):
        t0 = time.perf_counter()
        # an anonymous mapping of its own (as malloc makes one for a large buffer), no
        # huge-page advice (NumPy's own arrays ask for huge pages; PyTorch's do not)
        m = mmap.mmap(-1, chunk << 20)
        np.frombuffer(m, np.uint8).fill(1)  # the first touch: every page faults in here
        cost.append((time.perf_counter() - t0) * 1e6 / (chunk << 8))
        kept.append(m)
    for m in kept:
        m.close()
    return cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=4096, help="memory to hold in all (MiB)")
    ap.add_argument("--chunk", type=int, default=256, help="MiB touched at a time")
    ap.add_argument("--pause", type=float, default=20.0,
                    help="seconds between freeing it all and holding it again (0: once)")
    args = ap.parse_args()
    print("load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    rounds = [("first", 0.0), ("right after freeing it", 0.05)]
    if args.pause > 0:
        rounds.append((f"{args.pause:g} s after freeing it", args.pause))
    for label, pause in rounds:
        time.sleep(pause)
        cost = hold(args.mib, args.chunk)
        held = np.arange(1, len(cost) + 1) * args.chunk
        print(f"{label}: µs per 4 KiB page of each {args.chunk} MiB, by MiB held")
        print("  " + "  ".join(f"{h}:{c:.1f}" for h, c in zip(held, cost, strict=True)))


if __name__ == "__main__":
    main()
