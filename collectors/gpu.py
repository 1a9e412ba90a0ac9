"""GPU checks shared by the collectors: does a framework see a CUDA GPU, is nsys there.

``require_cuda(fw)`` is called before a ``--device cuda`` recording starts, so a machine
without a GPU (or a CPU-only framework build) gets one clear line and exit code 2 instead of
a framework traceback half-way through; ``require_gpu_per_rank`` refuses more torch workers
on a machine than it has GPUs (NCCL's one rank per GPU); ``require_nsys()`` does the same for
``--nsys``.
"""

from __future__ import annotations

import importlib
import shutil
from types import ModuleType

from opprof.errors import OpprofError
from opprof.kinds import FRAMEWORKS, framework_info


def require_cuda(fw: str) -> list[str]:
    """The names of the CUDA GPUs framework ``fw`` sees; an OpprofError when it sees none."""
    if fw not in FRAMEWORKS:
        raise OpprofError(f"unknown framework {fw!r}; choose from {', '.join(FRAMEWORKS)}")
    try:
        if fw == "mxnet":
            from opprof.collectors.mxnet_lib import import_mxnet

            mod = import_mxnet()
        else:
            mod = importlib.import_module(framework_info(fw).module)
    except ModuleNotFoundError as exc:
        raise OpprofError(
            f"--fw {fw} needs {exc.name}, which is not installed: "
            f"pip install -e '.[{fw}]' -c constraints.txt") from None
    version = getattr(mod, "__version__", "")
    names, why = _gpus(fw, mod)
    if not names:
        raise OpprofError(f"--device cuda but {fw} {version} sees no CUDA GPU ({why}); "
                          "use --device cpu")
    return names


def require_gpu_per_rank(fw: str, workers_here: int, gpus: list[str]) -> None:
    """An OpprofError when torch would put two ranks on one GPU: NCCL refuses that ("Duplicate
    GPU detected") at the first collective, after every worker has loaded."""
    if fw == "torch" and workers_here > len(gpus):
        raise OpprofError(
            f"--device cuda with {workers_here} workers on this machine, but it has "
            f"{len(gpus)} GPU(s) ({', '.join(gpus)}) and NCCL runs one rank per GPU; use "
            f"--workers {len(gpus)} (or fewer), or --device cpu")


def _gpus(fw: str, mod: ModuleType) -> tuple[list[str], str]:
    """(GPU names, why there are none) as the framework itself reports them."""
    if fw == "torch":
        if getattr(mod.version, "cuda", None) is None:
            return [], "CPU-only build"
        if not mod.cuda.is_available():
            return [], "no GPU or driver visible"
        return [mod.cuda.get_device_name(i) for i in range(mod.cuda.device_count())], ""
    if fw == "tf":
        if not mod.test.is_built_with_cuda():
            return [], "CPU-only build"
        gpus = mod.config.list_physical_devices("GPU")
        return [d.name for d in gpus], "no GPU or driver visible"
    if fw == "jax":
        try:
            gpus = mod.devices("gpu")
        except RuntimeError as exc:  # no GPU backend: CPU-only jaxlib, or no driver
            return [], f"CPU-only build or no driver: {str(exc).strip().splitlines()[0]}"
        return [str(getattr(d, "device_kind", d)) for d in gpus], "no GPU or driver visible"
    if fw == "chainer":
        cuda = mod.backends.cuda
        if not cuda.available:
            return [], "CuPy is not installed or sees no GPU"
        count = int(cuda.cupy.cuda.runtime.getDeviceCount())
        return [f"@cupy:{i}" for i in range(count)], "no GPU or driver visible"
    try:
        if not mod.runtime.Features().is_enabled("CUDA"):
            return [], "CPU-only build"
        count = int(mod.context.num_gpus())
    except Exception as exc:  # noqa: BLE001  (mxnet raises its own MXNetError without CUDA)
        return [], f"CPU-only build or no driver: {str(exc).strip().splitlines()[0]}"
    return [f"gpu({i})" for i in range(count)], "no GPU or driver visible"


def require_nsys() -> str:
    """The path of the nsys CLI; an OpprofError when it is not on PATH."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise OpprofError("--nsys needs nsys on PATH (the NVIDIA Nsight Systems CLI); "
                          "install it or leave out --nsys")
    return nsys
