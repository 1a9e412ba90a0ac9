"""One unit system: bytes in binary units, rates in decimal ones, factors that say what they
divide, and diff cells that never read 0.00x or ∞; calibrate's fit flag."""

from __future__ import annotations

import pandas as pd

from opprof.model.commmodel import FIT_LIMIT, fit, fit_errors
from opprof.render.units import ab_ratio, mib, rate, ratio, size
from opprof.render.verdicts import fit_warning


def test_bytes_are_binary() -> None:
    assert [size(n) for n in (512, 64 * 2**10, 2**20, 16 * 2**20, 3 * 2**30)] == [
        "512 B", "64.0 KiB", "1.00 MiB", "16.0 MiB", "3.00 GiB"]
    assert mib(44.7e6) == "42.6 MiB" and mib(12 * 2**30) == "12.00 GiB"
    assert size(None) == "-" and mib(float("nan")) == "-"


def test_rates_are_decimal() -> None:
    assert rate(1.64e9) == "1.64 GB/s" and rate(812.81e6) == "812.81 MB/s"


def test_factors_say_what_they_divide() -> None:
    assert ratio(1.047, "profiled/unprofiled") == "profiled/unprofiled 1.05x"
    assert ratio(float("inf")) == "-"


def test_diff_cells_never_read_zero_or_infinity() -> None:
    assert ab_ratio(2.0, 0.0) == "only in A" and ab_ratio(0, 5) == "only in B"
    assert ab_ratio(0, 0) == "-" and ab_ratio(3.0, 2.0) == "1.50x"
    assert ab_ratio(0.0029, 1.0) == "0.0029x"  # small, not 0.00x


def test_calibrate_flags_a_size_the_fit_misses() -> None:
    # α = 100 µs, β = 1 ns/B on 2 workers, with the 1 MiB point measured 60% too slow
    sizes = [64 * 2**10, 2**20, 16 * 2**20]
    ns = [100e3 * 2 + s for s in sizes]
    ns[1] *= 1.6
    net = fit(pd.DataFrame({"bytes": sizes, "ns": ns}), "allreduce", 2)
    errors = dict(fit_errors(net))
    assert set(errors) == set(sizes)
    bad = [n for n, e in errors.items() if abs(e) > FIT_LIMIT]
    assert 2**20 in bad
    warning = fit_warning(net)
    assert warning is not None and warning.startswith("⚠ poor α–β fit:")
    assert "at 1.00 MiB" in warning
    good = fit(pd.DataFrame({"bytes": sizes, "ns": [100e3 * 2 + s for s in sizes]}),
               "allreduce", 2)
    assert fit_warning(good) is None
