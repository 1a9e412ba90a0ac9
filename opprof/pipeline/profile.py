"""The profile pipeline, ``opprof.profile()``: the runner under a script's own control — the
script says where each training step ends (``prof.step()``), opprof does the rest (warm-up,
timing, profiled steps, native trace, `.trace`).

::

    with opprof.profile(steps=5, warmup=2, output="mine.trace") as prof:
        for batch in loader:
            ...train...
            prof.step()

The framework is the one the script imported (``fw=`` when it imported several). The native
trace goes to ``OUTPUT-STEM.native/`` and, when the block ends, ``output`` is written and one
line says so. In a job of several processes (``WORLD_SIZE`` > 1) every rank writes its native
trace there and rank 0 merges those that finished into ``output``. Under ``opprof run`` the
script's ``prof.step()`` replaces the automatic step counting in that process, and ``opprof
run`` writes the `.trace` of the whole command.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from opprof.collectors import channel, inject
from opprof.collectors.config import Framework, Protocol
from opprof.collectors.runner import Adapter, Runner
from opprof.errors import OpprofError, first_line
from opprof.kinds import FRAMEWORK_INFO
from opprof.pipeline import native_folder

if TYPE_CHECKING:
    from opprof.trace import Trace

MERGE_WAIT_S = 60.0  # how long rank 0 waits for the other ranks' traces


class profile:  # noqa: N801 - used like a function: ``with opprof.profile(...)``
    """Profile the steps a script marks with :meth:`step` (see the module docstring)."""

    def __init__(self, steps: int = 5, warmup: int = 2,
                 output: str | os.PathLike[str] = "profile.trace", *, timing_steps: int = 3,
                 fw: str = "auto", profile_memory: bool = True) -> None:
        self.protocol = Protocol(steps, warmup, timing_steps, profile_memory=profile_memory)
        self.protocol.check()
        self.output = Path(output)
        self.fw = fw
        self.runner: Runner | None = None
        self.trace: Trace | None = None  # the written Trace, when this process wrote one

    @property
    def native(self) -> Path:
        """The folder of the native traces."""
        folder = inject.run_folder()
        return folder if folder is not None else native_folder(self.output)

    def __enter__(self) -> profile:
        fw = _framework(self.fw)
        folder = self.native
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if inject.run_folder() is None and world <= 1 and folder.exists():
            shutil.rmtree(folder)
        self.runner = Runner(_adapter(fw, self.protocol), self.protocol, folder,
                             extra={"api": "opprof.profile", "session": _session()})
        if inject.run_folder() is not None:
            inject.explicit(self.runner)
        self.runner.begin()
        return self

    def step(self) -> None:
        """A training step just ended."""
        if self.runner is None:
            raise OpprofError("prof.step() outside `with opprof.profile(...) as prof:`")
        self.runner.step()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        runner = self.runner
        assert runner is not None
        if not runner.finished:
            why = (f"{kind.__name__}: {first_line(value)}" if kind is not None and value
                   else "the profiled block ended")
            runner.close(why)
        if inject.run_folder() is None and (runner.facts.rank or 0) == 0:
            self._merge(runner)

    def _merge(self, runner: Runner) -> None:
        """Write ``output`` from the native traces of this session's processes."""
        from opprof.collectors.launch import command_recording
        from opprof.pipeline import save_recording

        folder = self.native
        session = runner.facts.extra.get("session")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        end = time.monotonic() + MERGE_WAIT_S
        while world > 1 and time.monotonic() < end:
            mine = [s for s in channel.read_all(folder) if s.extra.get("session") == session]
            if len(mine) >= world and all(s.stage == "done" or s.ended for s in mine):
                break
            time.sleep(0.2)
        rec = command_recording(folder, shlex.join([sys.executable, *sys.argv]), session)
        if not rec.native:
            print(f"opprof: the profiled steps were not reached ({runner.facts.ended}); "
                  f"nothing written to {self.output}", file=sys.stderr)
            return
        meta = {**rec.meta, "native_dir": str(folder)}
        self.trace = save_recording(rec.native, meta, folder, self.output)
        print(f"opprof: wrote {self.output} ({len(self.trace.ranks)} rank(s), "
              f"{runner.facts.profiled_steps} profiled step(s)); see `opprof report "
              f"{self.output}`", file=sys.stderr)


def _framework(fw: str) -> Framework:
    if fw != "auto":
        return Framework(fw)
    loaded = [f for f, info in FRAMEWORK_INFO.items() if info.module in sys.modules]
    if Framework.JAX in loaded and len(loaded) > 1:
        # TensorFlow imports jax itself (and Keras 3 may): JAX trains only on Keras' jax backend
        config = sys.modules.get("keras.src.backend.config")
        if config is None or str(config.backend()) != "jax":
            loaded.remove(Framework.JAX)
    if len(loaded) != 1:
        raise OpprofError(
            "opprof.profile(): import the framework you train with first" if not loaded else
            f"opprof.profile(): {', '.join(map(str, loaded))} are all imported; say which "
            "one trains with fw=")
    return loaded[0]


def _adapter(fw: Framework, protocol: Protocol) -> Adapter:
    if fw == Framework.TORCH:
        import torch

        from opprof.collectors.torch import TorchAdapter

        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # (torch's)
        device = "cuda" if torch.cuda.is_available() and initialized else "cpu"
        return TorchAdapter(protocol.steps, device, profile_memory=protocol.profile_memory)
    if fw == Framework.TF:
        from opprof.collectors.tf import TFAdapter

        return TFAdapter()
    if fw == Framework.JAX:  # (JAX dispatches asynchronously: block on your step's results
        from opprof.collectors.jax import JAXAdapter  # before prof.step() to time it whole)

        return JAXAdapter()
    if fw == Framework.CHAINER:
        from opprof.collectors.chainer import ChainerAdapter, Events, hook_calls

        events = Events()
        hook_calls(events)
        return ChainerAdapter(events)
    from opprof.collectors.mxnet import MXNetAdapter

    return MXNetAdapter(profile_memory=protocol.profile_memory)


def _session() -> str:
    """What the processes of one job share (torchrun's run id, the rendezvous address)."""
    return (os.environ.get("TORCHELASTIC_RUN_ID")
            or f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
            if os.environ.get("WORLD_SIZE", "1") != "1" else str(os.getpid()))
