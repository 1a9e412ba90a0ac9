"""opprof's startup hook for `opprof run`, copied as ``sitecustomize.py`` into the run folder
(see :mod:`opprof.collectors.inject`): activates opprof in this process, then runs the
``sitecustomize`` that was there before, if any. Never stops the process it runs in: a
failure is one line on stderr and the process runs unprofiled.

As a module of opprof (``opprof.collectors.startup``) it does nothing.
"""

import os
import sys


class _Parent:
    """A finder for opprof's own packages, from where the ``opprof run`` that started this
    process has them (``$OPPROF_PATHS``): whatever opprof this Python has installed, or none,
    the hook is the one of the run."""

    def __init__(self, packages):
        self.packages = packages

    def find_spec(self, fullname, path=None, target=None):
        import importlib.util

        folder = self.packages.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def _import_opprof():
    import json

    packages = json.loads(os.environ.get("OPPROF_PATHS") or "{}").get("packages") or {}
    if packages and "opprof" not in sys.modules:
        sys.meta_path.insert(0, _Parent(packages))
    from opprof.collectors import inject

    return inject


def _chain():
    """Run the next ``sitecustomize`` on sys.path (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _main():
    try:
        if os.environ.get("OPPROF_RUN"):
            _import_opprof().activate()
    except Exception as exc:  # noqa: BLE001 - never break the user's process
        print(f"opprof: the startup hook failed in {sys.executable} ({type(exc).__name__}: "
              f"{exc}); this process is not profiled", file=sys.stderr)
    try:
        _chain()
    except Exception as exc:  # noqa: BLE001
        print(f"opprof: the original sitecustomize failed ({type(exc).__name__}: {exc})",
              file=sys.stderr)


if __name__ == "sitecustomize":
    _main()
