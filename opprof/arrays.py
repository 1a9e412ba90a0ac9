"""Type names for numpy arrays in annotations (numpy's own ``NDArray``, of any dtype)."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

#: A numpy array of any dtype and shape.
Array = npt.NDArray[Any]
