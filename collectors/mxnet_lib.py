"""MXNet itself, imported the one way that works here: :func:`import_mxnet` (the MXNet adapter,
the Gluon models, the GPU probe and calibrate's collectives all import it so). Importing this
module imports no MXNet."""

from __future__ import annotations

import warnings
from types import ModuleType

import numpy as np


def import_mxnet() -> ModuleType:
    """Import and return ``mxnet``, restoring ``np.bool`` first when numpy lacks it (MXNet
    1.9 still uses the alias numpy 1.24 removed).

    With ``DMLC_ROLE=server`` or ``scheduler`` in the environment the import itself runs the
    parameter-server node until the job ends and then exits the process (MXNet's own design).
    """
    if "bool" not in np.__dict__:
        np.bool = bool  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        # mxnet.numpy aliases numpy functions removed long ago (NEP 32) and says so on import
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet

    module: ModuleType = mxnet  # (MXNet ships no types)
    return module
