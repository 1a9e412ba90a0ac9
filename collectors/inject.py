"""`opprof run`'s zero-code injection: the environment that makes every Python process of a
command load opprof's startup hook, and what the hook does in each process.

**How it gets in.** ``opprof run`` writes a ``sitecustomize.py`` (:mod:`.startup`) into
``<run>.native/inject/`` and puts that folder first on ``PYTHONPATH``; Python imports
``sitecustomize`` at start-up, so every Python process the command starts — the script,
torchrun's workers, TF tasks, MXNet workers, multiprocessing children — runs the hook before
the user's code (as coverage.py measures subprocesses). The hook then runs any
``sitecustomize`` that was already there. ``$OPPROF_RUN`` carries the run (folder, framework,
protocol); a process without it, or started with ``python -E``/``-I``/``-S``, is not
profiled.

**The loss.** A framework's hook may give the runner a :class:`~.runner.LossLog`
(``runner.loss_log``): the loss of every step, written to the process's status at exit
(``$OPPROF_LOSS=0`` turns it off).

**What the hook does.** Nothing until a framework is imported: it only adds a finder to
``sys.meta_path`` that waits for the module defining a framework's optimizer step
(``torch.optim.optimizer``, ``keras.src.optimizers.base_optimizer``, Keras 2's
``tf_keras.src.optimizers.optimizer``; ``mxnet`` itself, which imports its Trainer and
Module) and then lets that framework's adapter install its step hook (see each adapter's
docstring); Keras 3 is TensorFlow's, or torch's when its backend is torch (``KERAS_BACKEND=torch``).
The first optimizer step creates the process's :class:`~.runner.Runner`; one framework per
process (the first to step). At exit — normal, an uncaught exception, or SIGTERM (when the
script left SIGTERM's default action) — a runner that has not finished writes what it
profiled and says why it ended. A forked child starts with no runner of its own.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import FrameType, ModuleType, TracebackType

from opprof.collectors.channel import watch_faults
from opprof.collectors.config import Framework, Protocol, keras_backend
from opprof.collectors.runner import Runner, writing
from opprof.kinds import framework_info

RUN_ENV = "OPPROF_RUN"
PATHS_ENV = "OPPROF_PATHS"
INJECT_DIR = "inject"
#: Makes torch.compile's CPU kernels visible to the profiler (an inductor option; set by
#: ``opprof run`` unless the command's environment sets it).
KERNEL_PROFILE_ENV = "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"
#: The module whose import means a framework's optimizer step can be hooked.
TRIGGERS = {"torch.optim.optimizer": Framework.TORCH,
            "keras.src.optimizers.base_optimizer": Framework.TF,
            "tf_keras.src.optimizers.optimizer": Framework.TF,  # Keras 2
            "tf_keras.src.optimizers.legacy.optimizer_v2": Framework.TF,
            # the whole package: ``import mxnet`` imports its Trainer and Module before it
            # has ``mx.nd`` (through ``mxnet.contrib``), too early to hook
            "mxnet": Framework.MXNET,
            # JAX: its jit / pmap / grad once jax is imported; optax's apply_updates after
            "jax": Framework.JAX, "optax": Framework.JAX,
            # Chainer: its optimizers, links and function hooks (chainer imports them all)
            "chainer": Framework.CHAINER}
#: Keras 3's optimizers: TensorFlow's adapter hooks them, or torch's on the torch backend.
KERAS_TRIGGER = "keras.src.optimizers.base_optimizer"

@dataclass
class _Process:
    """This process's recording: its runner (and the pid that made it: a fork has none),
    whether ``opprof.profile()`` took it over, the error that ends it."""

    runner: Runner | None = None
    pid: int | None = None
    explicit: bool = False
    error: str | None = None


_state = _Process()


# ------------------------------------------------------------------ in `opprof run`


def _package_dir(name: str) -> str:
    """The folder an installed package ``name`` is imported from."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not an importable package")
    return str(list(spec.submodule_search_locations)[0])


def environment(folder: Path, fw: str, protocol: Protocol,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a command run under ``opprof run`` (writes the hook into
    ``folder/inject``)."""
    hook = Path(folder) / INJECT_DIR
    hook.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("startup.py"), hook / "sitecustomize.py")
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(hook), *filter(None, [env.get("PYTHONPATH")])])
    # inductor's C++ kernels on the CPU record themselves (cpp_fused_…) only when asked
    env.setdefault(KERNEL_PROFILE_ENV, "1")
    # Chainer 7 imports only with setuptools' own distutils shim off (read at start-up)
    if fw == Framework.CHAINER or (fw == "auto" and sys.version_info < (3, 12)
                                   and importlib.util.find_spec("chainer") is not None):
        for key, value in framework_info(Framework.CHAINER).env:
            env.setdefault(key, value)
    env[RUN_ENV] = json.dumps({"folder": str(Path(folder).resolve()), "fw": fw,
                               "steps": protocol.steps, "warmup": protocol.warmup,
                               "timing_steps": protocol.timing_steps,
                               "timing_after": protocol.timing_after,
                               "profile_memory": protocol.profile_memory})
    # Where this opprof's packages are, so that every child runs this very hook whatever
    # opprof (if any) its own Python has installed.
    env[PATHS_ENV] = json.dumps({"packages": {
        name: _package_dir(name) for name in ("opprof", "opprof.collectors",
                                               "opprof.normalizers")}})
    return env


# ------------------------------------------------------------------ in each process


def activate() -> None:
    """The startup hook (called by the injected ``sitecustomize``): watch for frameworks."""
    spec = os.environ.get(RUN_ENV)
    if not spec or any(isinstance(f, _Watcher) for f in sys.meta_path):
        return
    run = json.loads(spec)
    wanted = {Framework(run["fw"])} if run.get("fw", "auto") != "auto" else set(Framework)
    protocol = Protocol(int(run["steps"]), int(run["warmup"]), int(run["timing_steps"]),
                        timing_after=int(run.get("timing_after", 0)),
                        profile_memory=bool(run.get("profile_memory", True)))
    folder = Path(run["folder"])
    if os.environ.get("DMLC_ROLE") == "server" and Framework.MXNET in wanted:
        _announce_server(folder)
    triggers = {m: fw for m, fw in TRIGGERS.items()
                if fw in wanted or (m == KERAS_TRIGGER and Framework.TORCH in wanted)}
    sys.meta_path.insert(0, _Watcher(triggers,
                                     lambda fw: _install(fw, protocol, folder, wanted)))
    os.register_at_fork(after_in_child=_forget)


def _announce_server(folder: Path) -> None:
    """An MXNet parameter server runs inside ``import mxnet`` and never reaches a step: it
    says where it is, so that ``opprof run`` finds the trace worker 0 makes it write into its
    working directory (:data:`.mxnet.SERVER_TRACE`)."""
    import socket

    from opprof.collectors.channel import Reporter
    from opprof.collectors.config import Facts, Role

    Reporter(folder, Facts(pid=os.getpid(), host=socket.gethostname(),
                           label="server", role=Role.SERVER,
                           framework="mxnet", stage="serving",
                           extra={"cwd": os.getcwd()})).update()


def run_folder() -> Path | None:
    """The run folder when this process runs under ``opprof run``."""
    spec = os.environ.get(RUN_ENV)
    return Path(json.loads(spec)["folder"]) if spec else None


def claim(runner: Runner) -> bool:
    """Make ``runner`` this process's runner, unless it already has one (one framework and
    one runner per process); arm the exit handlers."""
    current = _state.runner
    if _state.explicit or (current is not None and _state.pid == os.getpid()):
        return False
    _state.runner, _state.pid = runner, os.getpid()
    atexit.register(_at_exit)
    _wrap_excepthook()
    _handle_sigterm()
    watch_faults(runner.folder)
    return True


def explicit(runner: Runner) -> None:
    """``opprof.profile()`` takes this process over: a hook's runner that has not started
    profiling is dropped, and the hooks count nothing more here."""
    current = _state.runner
    if current is not None and _state.pid == os.getpid() and not current.profiling:
        current.finished = True
        (current.reporter.folder / f"{current.facts.pid}.status").unlink(missing_ok=True)
    _state.runner = None
    claim(runner)
    _state.explicit = True


def _install(fw: Framework, protocol: Protocol, folder: Path,
             wanted: set[Framework]) -> None:
    hook = "install_hook"
    if fw is Framework.TF and keras_backend() == "torch":
        # Keras 3 on the torch backend: its optimizer's apply is the step, under torch.profiler
        fw, hook = Framework.TORCH, "install_keras_hook"
    if fw in wanted:
        getattr(importlib.import_module(f"opprof.collectors.{fw}"), hook)(
            protocol, folder, claim)


def _forget() -> None:
    _state.runner, _state.pid = None, None


def _at_exit() -> None:
    runner = _state.runner
    if runner is None or _state.pid != os.getpid():
        return
    log = runner.loss_log
    if log is not None and log.steps:  # the loss of every step (a framework's hook)
        try:
            runner.reporter.update(convergence=log.rows())
        except Exception as exc:  # noqa: BLE001 - never break the user's exit
            print(f"opprof: the loss per step was not kept ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
    if runner.finished:
        return
    runner.close(_state.error or "the process ended")


def _wrap_excepthook() -> None:
    if getattr(sys.excepthook, "_opprof", False):
        return
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException,
                   tb: TracebackType | None) -> None:
        lines = str(value).strip().splitlines()
        _state.error = f"{kind.__name__}: {lines[0]}" if lines else kind.__name__
        previous(kind, value, tb)

    excepthook._opprof = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def _handle_sigterm() -> None:
    """Keep the profile of a process ended by SIGTERM (torchrun stops the other ranks so
    when one fails): only if the script left SIGTERM's default action, and from the main
    thread; the process then still ends by SIGTERM. A SIGTERM that arrives while the trace is
    being written (at exit, or after an earlier one) lets the write finish, as does one that
    arrives while an earlier one's handler runs (torchrun's own, after the supervisor's)."""
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        handling: list[int] = []

        def on_sigterm(sig: int, frame: FrameType | None) -> None:
            if writing() or handling:
                return
            handling.append(sig)
            _state.error = "terminated by SIGTERM"
            _at_exit()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        pass


class _Watcher(importlib.abc.MetaPathFinder):
    """Runs ``install(fw)`` right after the trigger module of ``fw`` has been imported."""

    def __init__(self, triggers: dict[str, Framework],
                 install: Callable[[Framework], None]) -> None:
        self.triggers, self.install = dict(triggers), install

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        fw = self.triggers.get(fullname)
        if fw is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.triggers[fullname]
        install, framework = self.install, fw
        found: importlib.abc.Loader = loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: ModuleSpec) -> ModuleType | None:
                return found.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                found.exec_module(module)
                try:
                    install(framework)
                except Exception as exc:  # noqa: BLE001 - never break the user's import
                    print(f"opprof: cannot hook {fw} ({type(exc).__name__}: {exc}); this "
                          "process is not profiled", file=sys.stderr)

        spec.loader = Loader()
        return spec
