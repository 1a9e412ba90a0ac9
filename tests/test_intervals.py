"""The interval toolkit against plain brute-force definitions, on random intervals."""

from __future__ import annotations

import numpy as np
import pytest

from opprof.intervals import Sweep, containing, label_points, merge, nest, union_length


def _random(rng: np.random.Generator, n: int, span: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    s = rng.integers(0, span, n)
    return s, s + rng.integers(0, 60, n)


def _covered_set(starts, ends) -> set[int]:
    return {t for s, e in zip(starts.tolist(), ends.tolist(), strict=True) for t in range(s, e)}


@pytest.mark.parametrize("seed", range(5))
def test_union_and_merge_equal_the_set_of_covered_ticks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s, e = _random(rng, 200)
    assert union_length(s, e) == len(_covered_set(s, e))
    ms, me = merge(s, e)
    assert (ms[1:] > me[:-1]).all() and _covered_set(ms, me) == _covered_set(s, e)


@pytest.mark.parametrize("seed", range(5))
def test_sweep_cover_minus_and_bins(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s, e = _random(rng, 100)
    ks, ke = _random(rng, 20)
    bins_s = np.array([0, 300, 700])
    bins_e = np.array([250, 650, 900])
    sweep = Sweep(s, e, ks, ke, bins_s, bins_e)
    cov = sweep.covered(s, e, (ks, ke))
    # brute force: tick t is covered when more intervals hold it than blocked ones do
    def count(a, b, t):
        return int(((a <= t) & (t < b)).sum())
    want = {t for t in range(0, 1100) if count(s, e, t) - count(ks, ke, t) > 0}
    got = _covered_set(sweep.start[cov], sweep.start[cov] + sweep.length[cov])
    assert got == want
    per_bin = sweep.total(cov, sweep.bins(bins_s, bins_e), 3)
    for i in range(3):
        assert per_bin[i] == len({t for t in want if bins_s[i] <= t < bins_e[i]})
    assert sweep.total(cov) == len(want)


def test_label_points_takes_the_covering_interval_of_the_same_group() -> None:
    group = np.array([0, 0, 1, 1, 1])
    t = np.array([5, 15, 5, 25, 40])
    out = label_points(group, t, np.array([0, 1, 1]), np.array([0, 0, 20]),
                       np.array([10, 10, 30]), np.array([7, 8, 9]), default=-1)
    assert out.tolist() == [7, -1, 8, 9, -1]


def test_containing_and_nesting() -> None:
    lane = np.array([0, 0, 0, 1, 1])
    s = np.array([0, 2, 20, 0, 5])
    e = np.array([10, 5, 25, 30, 6])
    outer = np.array([True, False, True, True, False])
    pos = containing(lane[~outer], s[~outer], e[~outer], lane[outer], s[outer], e[outer])
    assert pos.tolist() == [0, 2]  # positions among the outer intervals
    depth, anc = nest(lane, s, e, outer)
    assert depth.tolist() == [0, 1, 0, 0, 1]
    assert anc.tolist() == [0, 0, 2, 3, 3]
