"""Text columns as Python strings while a report is made (not pandas 3's Arrow-backed
``str``): the scope every report runs in, whichever entry point made it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def plain_strings() -> Iterator[None]:
    """Within it, pandas makes text columns object arrays of Python strings, as pandas 2
    did. A report's tables have their names made, compared, mapped and turned back into
    Python strings over and over; with Arrow-backed strings each of those is a conversion
    to or from Arrow (a quarter of a report's time on some traces), the report the same.
    Scoped: the option is restored after, whatever it was; a pandas without it is left as
    it is."""
    import pandas as pd

    try:
        ctx = pd.option_context("future.infer_string", False)
    except (KeyError, pd.errors.OptionError):
        yield
        return
    with ctx:
        yield
