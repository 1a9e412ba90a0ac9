"""The one place opprof imports MXNet: MXNet 1.9 still uses ``np.bool``, gone since numpy 1.24."""

from __future__ import annotations

import warnings
from types import ModuleType


def import_mxnet() -> ModuleType:
    """Import and return ``mxnet``, restoring ``np.bool`` first when numpy lacks it.

    With ``DMLC_ROLE=server`` or ``scheduler`` in the environment the import itself runs the
    parameter-server node until the job ends and then exits the process (MXNet's own design).
    """
    import numpy as np

    if "bool" not in np.__dict__:
        np.bool = bool  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        # mxnet.numpy aliases numpy functions removed long ago (NEP 32) and says so on import
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet

    return mxnet
